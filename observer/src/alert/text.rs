//! Writes alerts as one line a person reads (`--output text`): time, kind, the fields that say what
//! happened to whom, the gateways, and the diagnosis's first sentence. Built from the alert's
//! JSON, so a new kind or field prints without a change here.

use std::fmt::Write;

use serde_json::Value;

use super::Alert;

/// Names the fields printed as `key=value` when an alert has them, in this order.
const SCALARS: &[&str] = &[
    "state",
    "reason",
    "user",
    "cause",
    "service",
    "routing",
    "new_connections",
    "per_second",
    "count",
    "node",
    "capture_hook",
    "version",
];

/// Names the lists printed as `key=a,b` when a line has them (`observer_started`'s ports).
const LISTS: &[&str] = &["grpc_ports", "ws_ports"];

/// Bounds the diagnosis: cut to its first sentence, and at most this many characters.
const DIAGNOSIS_CHARS: usize = 160;

/// Returns `alert` as one line a person reads, without its newline.
pub fn text_line(alert: &Alert) -> String {
    match serde_json::to_value(alert) {
        Ok(value) => text_of(&value),
        Err(error) => format!("{} (unprintable: {error})", alert.kind()),
    }
}

/// Returns a JSON line's object (an alert, `observer_started`) as one line a person reads.
pub fn text_of(value: &Value) -> String {
    let field = |key: &str| value.get(key).and_then(Value::as_str).unwrap_or("-");
    let mut line = format!("{} {}", field("ts"), field("kind"));
    for key in SCALARS {
        match value.get(*key) {
            Some(Value::String(text)) => {
                let _ = write!(line, " {key}={text}");
            }
            Some(number @ Value::Number(_)) => {
                let _ = write!(line, " {key}={number}");
            }
            _ => {}
        }
    }
    for key in LISTS {
        if let Some(Value::Array(items)) = value.get(*key) {
            let items: Vec<String> = items.iter().map(Value::to_string).collect();
            let _ = write!(line, " {key}={}", items.join(","));
        }
    }
    if let Some(Value::Array(users)) = value.get("users") {
        let _ = write!(line, " users={}", users.len());
    }
    gateways(value, &mut line);
    processes(value, &mut line);
    if let Some(diagnosis) = value.get("diagnosis").and_then(Value::as_str) {
        let _ = write!(line, " — {}", shortened(diagnosis));
    }
    line
}

/// Appends the gateways the alert names: where the user was placed, where push sent it, or
/// the one gateway of the kind.
fn gateways(value: &Value, line: &mut String) {
    if let Some(Value::Array(placements)) = value.get("placed_on") {
        let placed: Vec<String> = placements
            .iter()
            .filter_map(|placement| placement.get("gateway"))
            .map(gateway)
            .collect();
        let _ = write!(line, " placed_on={}", placed.join(","));
    }
    if let Some(pushed) = value.get("pushed_to").and_then(|push| push.get("gateway")) {
        let _ = write!(line, " pushed_to={}", gateway(pushed));
    }
    match value.get("gateway") {
        Some(one @ Value::Object(_)) => {
            let _ = write!(line, " gateway={}", gateway(one));
        }
        Some(count @ Value::Number(_)) => {
            let _ = write!(line, " gateways={count}");
        }
        _ => {}
    }
    if let Some(count @ Value::Number(_)) = value.get("gateways") {
        let _ = write!(line, " gateways={count}");
    }
}

/// Appends the pusher or proxy a kind names by itself.
fn processes(value: &Value, line: &mut String) {
    for key in ["pusher", "proxy"] {
        if let Some(process) = value.get(key) {
            let comm = process.get("comm").and_then(Value::as_str).unwrap_or("?");
            let pid = process.get("pid").and_then(Value::as_u64).unwrap_or(0);
            let _ = write!(line, " {key}={comm}[{pid}]{}", pod(process));
        }
    }
}

/// Returns a gateway as `name` (its member string) or `ip:port`, and its pod when named.
fn gateway(gateway: &Value) -> String {
    let address = match gateway.get("name").and_then(Value::as_str) {
        Some(name) => name.to_owned(),
        None => {
            let ip = gateway.get("ip").and_then(Value::as_str).unwrap_or("?");
            let port = gateway.get("port").and_then(Value::as_u64).unwrap_or(0);
            if ip.contains(':') {
                format!("[{ip}]:{port}")
            } else {
                format!("{ip}:{port}")
            }
        }
    };
    address + &pod(gateway)
}

/// Returns ` (namespace/name)` when the value names its pod, else nothing.
fn pod(value: &Value) -> String {
    let Some(pod) = value.get("pod") else {
        return String::new();
    };
    let part = |key: &str| pod.get(key).and_then(Value::as_str).unwrap_or("?");
    format!("({}/{})", part("namespace"), part("name"))
}

/// Returns the diagnosis's first sentence, at most `DIAGNOSIS_CHARS` characters.
fn shortened(diagnosis: &str) -> String {
    let sentence = diagnosis
        .find(". ")
        .map_or(diagnosis, |end| &diagnosis[..=end]);
    if sentence.chars().count() <= DIAGNOSIS_CHARS {
        return sentence.to_owned();
    }
    let cut: String = sentence.chars().take(DIAGNOSIS_CHARS - 1).collect();
    cut + "…"
}

#[cfg(test)]
mod tests;
