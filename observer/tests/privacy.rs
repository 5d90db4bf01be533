//! Privacy canaries: credentials and message bodies put into synthetic OpenIM traffic must not
//! come out of any observer output: alerts, counters, decoder facts, recordings (after the
//! capture layer's redaction and the content scrubber) and `observer replay`.

use std::collections::HashMap;
use std::process::Command;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use observer::alert::Alert;
use observer::capture::recording::{self, PrivateLines};
use observer::correlate::{Engine, EngineConfig};
use observer::decode::{GrpcConnectionDecoder, Limits, WebSocketDecoder};
use observer::model::{Direction, Event, EventKind, PortClass};
use observer::privacy::redact_secrets;
use openim_test_kit::synthetic;

const TOKEN_CANARY: &str = "CANARY-TOKEN-5b1e";
const AUTH_CANARY: &str = "CANARY-AUTH-90cd";
const CONTENT_CANARY: &str = "CANARY-CONTENT-e27a";
const CANARIES: [&str; 3] = [TOKEN_CANARY, AUTH_CANARY, CONTENT_CANARY];

fn canary_traffic() -> synthetic::Traffic {
    synthetic::generate(&synthetic::Scenario {
        gateways: 3,
        users: 60,
        misrouted_share: 0.6,
        push_calls: 40,
        recipients_per_call: 8,
        content: format!("{CONTENT_CANARY} private body of message {{seq}}"),
        token: format!("{TOKEN_CANARY}-{{user}}"),
        authorization: Some(format!("Bearer {AUTH_CANARY}")),
        // Small chunks split canaries across events, the hard case for scrubbing.
        max_chunk: 61,
        ..synthetic::Scenario::default()
    })
}

/// What `observer run --record` writes: WebSocket payloads redacted by the capture layer
/// (ring_records.rs does it before events exist), then every event through `PrivateLines`, the
/// daemon's writer, which scrubs gRPC payloads.
fn recordable(events: &[Event]) -> Vec<Event> {
    let mut writer = PrivateLines::new(1024);
    events
        .iter()
        .enumerate()
        .map(|(index, event)| {
            let mut event = event.clone();
            if let EventKind::Data { payload, .. } = &mut event.kind
                && event.port_class == PortClass::WebSocket
            {
                let mut bytes = payload.to_vec();
                redact_secrets(&mut bytes);
                *payload = bytes.into();
            }
            recording::from_json_line(&writer.line(&event), index + 1).expect("our own line")
        })
        .collect()
}

/// Writes `events` as a capture file and runs `observer replay --events` on it.
fn replay_events<'a>(name: &str, events: impl Iterator<Item = &'a Event>) -> std::process::Output {
    let path = std::env::temp_dir().join(format!("observer-{name}-{}.jsonl", std::process::id()));
    let lines: Vec<String> = events.map(recording::to_json_line).collect();
    std::fs::write(&path, lines.join("\n") + "\n").expect("temp folder is writable");
    let output = Command::new(env!("CARGO_BIN_EXE_observer"))
        .args(["replay", "--events"])
        .arg(&path)
        .output()
        .expect("the observer binary runs");
    let _ = std::fs::remove_file(&path);
    output
}

fn assert_no_canary(what: &str, text: &str) {
    for canary in CANARIES {
        assert!(!text.contains(canary), "{what} leaks {canary}");
    }
    // Each canary's first bytes too, in case a leak is cut at a chunk boundary.
    assert!(!text.contains("CANARY-"), "{what} leaks part of a canary");
}

fn run_engine(events: &[Event]) -> (Vec<Alert>, Engine) {
    let mut engine = Engine::new(EngineConfig::default());
    let mut alerts = Vec::new();
    for event in events {
        engine.on_event(event, &mut alerts);
    }
    engine.finish(&mut alerts);
    (alerts, engine)
}

/// Every byte a stream of events carries, per connection and direction, joined.
fn streams(events: &[Event]) -> Vec<Vec<u8>> {
    let mut joined: HashMap<(u64, bool), Vec<u8>> = HashMap::new();
    for event in events {
        if let EventKind::Data {
            direction, payload, ..
        } = &event.kind
        {
            joined
                .entry((event.connection, *direction == Direction::Send))
                .or_default()
                .extend_from_slice(payload);
        }
    }
    joined.into_values().collect()
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

#[test]
fn the_generated_traffic_really_carries_the_canaries() {
    let traffic = canary_traffic();
    let streams = streams(&traffic.events);
    for canary in CANARIES {
        assert!(
            streams.iter().any(|stream| contains(stream, canary)),
            "{canary} missing: the test would prove nothing"
        );
    }
}

#[test]
fn alerts_and_counters_hold_no_canary() {
    let traffic = canary_traffic();
    let (alerts, engine) = run_engine(&traffic.events);
    assert!(
        alerts.iter().any(|alert| alert.kind() == "route_mismatch"),
        "misrouted users must raise alerts"
    );
    for alert in &alerts {
        assert_no_canary("an alert", &alert.to_json_line());
    }
    let counters = serde_json::to_string(&engine.counters()).unwrap_or_default();
    assert_no_canary("the engine counters", &counters);
}

#[test]
fn decoder_facts_hold_no_canary() {
    let traffic = canary_traffic();
    let mut websocket: HashMap<u64, WebSocketDecoder> = HashMap::new();
    let mut grpc: HashMap<u64, GrpcConnectionDecoder> = HashMap::new();
    let mut facts = Vec::new();
    let mut grpc_facts = Vec::new();
    for event in &traffic.events {
        let EventKind::Data {
            direction,
            offset,
            payload,
            ..
        } = &event.kind
        else {
            continue;
        };
        match event.port_class {
            PortClass::WebSocket => {
                let decoder = websocket
                    .entry(event.connection)
                    .or_insert_with(|| WebSocketDecoder::new(Limits::default()));
                facts.extend(
                    decoder
                        .feed(*direction, *offset, payload)
                        .map(|fact| format!("{fact:?}")),
                );
            }
            PortClass::Grpc => {
                let decoder = grpc
                    .entry(event.connection)
                    .or_insert_with(|| GrpcConnectionDecoder::new(Limits::default()));
                decoder.feed(*direction, *offset, payload, &mut grpc_facts);
            }
        }
    }
    for decoder in grpc.values_mut() {
        decoder.finish(&mut grpc_facts);
    }
    facts.extend(grpc_facts.iter().map(|fact| format!("{fact:?}")));
    assert!(facts.iter().any(|fact| fact.starts_with("UpgradeRequest")));
    assert!(facts.iter().any(|fact| fact.starts_with("Request")));
    for fact in &facts {
        assert_no_canary("a decoder fact", fact);
    }
}

#[test]
fn recordings_hold_no_canary_and_still_decode_the_same() {
    let traffic = canary_traffic();
    let recorded = recordable(&traffic.events);
    for event in &recorded {
        let line = recording::to_json_line(event);
        assert_no_canary("a recording line", &line);
        let value: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        if let Some(payload) = value["payload_b64"].as_str() {
            let bytes = BASE64.decode(payload).unwrap_or_default();
            assert_no_canary("a recorded payload", &String::from_utf8_lossy(&bytes));
        }
    }
    // Across chunk boundaries as well.
    for stream in streams(&recorded) {
        assert_no_canary("a recorded stream", &String::from_utf8_lossy(&stream));
    }
    // The scrubbed capture tells the engine exactly what the raw one did.
    let alert_lines = |events: &[Event]| -> Vec<String> {
        run_engine(events)
            .0
            .iter()
            .map(Alert::to_json_line)
            .collect()
    };
    let (scrubbed_alerts, raw_alerts) = (alert_lines(&recorded), alert_lines(&traffic.events));
    assert_eq!(scrubbed_alerts.len(), raw_alerts.len());
    let first_difference = scrubbed_alerts
        .iter()
        .zip(&raw_alerts)
        .find(|(scrubbed, raw)| scrubbed != raw);
    assert!(first_difference.is_none(), "{first_difference:?}");
    let (_, raw_engine) = run_engine(&traffic.events);
    let (_, recorded_engine) = run_engine(&recorded);
    assert_eq!(
        serde_json::to_string(&recorded_engine.counters()).unwrap_or_default(),
        serde_json::to_string(&raw_engine.counters()).unwrap_or_default()
    );
    assert_eq!(
        recorded_engine.counters().routes.push_calls,
        traffic.grpc_requests as u64
    );
}

#[test]
fn observer_replay_prints_no_canary() {
    let traffic = canary_traffic();
    let recorded = recordable(&traffic.events);
    let output = replay_events("privacy", recorded.iter());
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("route_mismatch"), "replay found the alerts");
    assert_no_canary("replay's stdout", &stdout);
    assert_no_canary("replay's stderr", &String::from_utf8_lossy(&output.stderr));
    for line in stdout.lines() {
        let value: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
        if let Some(payload) = value["payload_b64"].as_str() {
            let bytes = BASE64.decode(payload).unwrap_or_default();
            assert_no_canary("a replayed payload", &String::from_utf8_lossy(&bytes));
        }
    }
}

/// `observer replay --events` scrubs too: even a capture written without scrubbing (by an
/// older observer, or by hand) prints no message content.
#[test]
fn replaying_an_unscrubbed_capture_prints_no_content() {
    let traffic = canary_traffic();
    let grpc_events = traffic
        .events
        .iter()
        .filter(|event| event.port_class == PortClass::Grpc);
    let output = replay_events("raw", grpc_events);
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut payloads = 0;
    for line in stdout.lines() {
        let value: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
        if let Some(payload) = value["payload_b64"].as_str() {
            payloads += 1;
            let bytes = BASE64.decode(payload).unwrap_or_default();
            assert!(
                !contains(&bytes, CONTENT_CANARY),
                "content in a replayed payload"
            );
        }
    }
    assert!(payloads > 0);
}

/// The gap the scrubber closes: without it, recordings carry message bodies.
#[test]
fn without_the_scrubber_recordings_would_carry_content() {
    let traffic = canary_traffic();
    let redacted_only: Vec<Event> = traffic
        .events
        .iter()
        .filter(|event| event.port_class == PortClass::Grpc)
        .cloned()
        .collect();
    assert!(
        streams(&redacted_only)
            .iter()
            .any(|stream| contains(stream, CONTENT_CANARY))
    );
}
