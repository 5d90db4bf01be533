//! Builds the JSON Schema of the alert lines, one per `SCHEMA_VERSION`, field by field
//! from the alert types (docs/schema/ ships it; `observer schema` prints it), a validator of
//! the part of JSON Schema it uses, and the check that a change of it within one version only
//! adds.
//!
//! Every object is closed (`additionalProperties: false`), so a field added to an alert type
//! fails the alert tests until it is added here; the shipped file is held to this one by a
//! test; and a change that removes, retypes or newly requires a field of a shipped version
//! fails a test until `SCHEMA_VERSION` is raised.

use serde_json::{Map, Value, json};
use thiserror::Error;

use super::SCHEMA_VERSION;

/// Describes a line that does not fit the schema, or a schema change that breaks its version.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SchemaError {
    #[error("{path}: {reason}")]
    Invalid { path: String, reason: String },
}

/// Returns the file name the schema of `version` is shipped as in docs/schema/.
pub fn file_name(version: u32) -> String {
    format!("alerts-v{version}.schema.json")
}

/// Returns the schema of the current `SCHEMA_VERSION` as shipped: pretty JSON and a newline.
pub fn schema_text() -> String {
    let mut text = serde_json::to_string_pretty(&schema()).unwrap_or_default();
    text.push('\n');
    text
}

fn string() -> Value {
    json!({"type": "string"})
}

fn integer() -> Value {
    json!({"type": "integer"})
}

fn count() -> Value {
    json!({"type": "integer", "minimum": 0})
}

fn boolean() -> Value {
    json!({"type": "boolean"})
}

fn time() -> Value {
    json!({"type": "string", "format": "date-time"})
}

fn one_of(names: &[&str]) -> Value {
    json!({"type": "string", "enum": names})
}

fn array(items: Value) -> Value {
    json!({"type": "array", "items": items})
}

fn reference(name: &str) -> Value {
    json!({"$ref": format!("#/$defs/{name}")})
}

/// Builds a closed object: `required` fields, then optional ones.
fn object(required: &[(&str, Value)], optional: &[(&str, Value)]) -> Value {
    let mut properties = Map::new();
    for (name, schema) in required.iter().chain(optional) {
        properties.insert((*name).to_owned(), schema.clone());
    }
    let names: Vec<&str> = required.iter().map(|(name, _)| *name).collect();
    json!({
        "type": "object",
        "properties": properties,
        "required": names,
        "additionalProperties": false,
    })
}

/// Builds an alert kind: the envelope (`schema_version`, `ts`, `kind`, `node`) and its own fields.
fn kind(name: &str, required: &[(&str, Value)], optional: &[(&str, Value)]) -> Value {
    let mut all = vec![
        ("schema_version", json!({"const": SCHEMA_VERSION})),
        ("ts", time()),
        ("kind", json!({"const": name})),
        ("node", string()),
    ];
    all.extend(required.iter().cloned());
    object(&all, optional)
}

/// Builds the shared parts: gateways, processes, pods and what push calls carry.
fn definitions() -> Map<String, Value> {
    let pod = object(
        &[("namespace", string()), ("name", string())],
        &[
            ("container", string()),
            (
                "workload",
                object(&[("kind", string()), ("name", string())], &[]),
            ),
            (
                "labels",
                json!({"type": "object", "additionalProperties": {"type": "string"}}),
            ),
        ],
    );
    let gateway = object(
        &[("ip", string()), ("port", count())],
        &[("name", string()), ("pod", reference("pod"))],
    );
    let process = object(
        &[("pid", count()), ("comm", string())],
        &[("pod", reference("pod"))],
    );
    let placement = object(
        &[
            ("gateway", reference("gateway")),
            ("platforms", array(integer())),
            ("since", time()),
            ("proxy", reference("process")),
        ],
        &[("node", string())],
    );
    let message = object(
        &[],
        &[
            ("client_msg_id", string()),
            ("server_msg_id", string()),
            ("seq", integer()),
            ("session_type", integer()),
        ],
    );
    let platform_result = object(
        &[("platform_id", integer()), ("result_code", integer())],
        &[],
    );
    let push = object(
        &[
            ("gateway", reference("gateway")),
            ("method", string()),
            ("message", message),
            ("pusher", reference("process")),
            (
                "answer",
                one_of(&["delivered", "empty_entry", "delivery_failed", "unknown"]),
            ),
        ],
        &[
            ("answer_platforms", array(platform_result)),
            ("node", string()),
        ],
    );
    let mut definitions = Map::new();
    for (name, schema) in [
        ("pod", pod),
        ("gateway", gateway),
        ("process", process),
        ("placement", placement),
        ("push", push),
    ] {
        definitions.insert(name.to_owned(), schema);
    }
    definitions
}

/// Lists every kind of line, by its `kind`, with its fields.
///
/// Longer than 100 lines on purpose: a table, one entry a kind, read and reviewed as one.
fn kinds() -> Vec<(&'static str, Value)> {
    let diagnosis = ("diagnosis", string());
    let affected_process = object(
        &[
            ("pid", count()),
            ("comm", string()),
            ("connections", count()),
            ("bytes", count()),
        ],
        &[("pod", reference("pod"))],
    );
    let affected = object(
        &[],
        &[
            ("records", count()),
            ("connections", count()),
            ("bytes", count()),
            ("users", count()),
            ("calls", count()),
            ("runs", count()),
            ("processes", array(affected_process)),
        ],
    );
    let causes = [
        "ring_spelling",
        "stale_placement",
        "push_ring_lags",
        "proxy_ring_lags",
        "undetermined",
    ];
    let reasons = [
        "shared_state_unreachable",
        "joined_mid_stream",
        "ring_full",
        "lost_sync",
        "undecodable",
        "table_full",
        "budget_exhausted",
        "runs_skipped",
    ];
    // serde_json prints a number that is not finite as null.
    let ratio = json!({"type": ["number", "null"]});
    vec![
        (
            "route_mismatch",
            kind(
                "route_mismatch",
                &[
                    ("user", string()),
                    ("placed_on", array(reference("placement"))),
                    ("pushed_to", reference("push")),
                    ("count", count()),
                    ("window_secs", count()),
                    ("cause", one_of(&causes)),
                    diagnosis.clone(),
                ],
                &[],
            ),
        ),
        (
            "ring_divergence",
            kind(
                "ring_divergence",
                &[
                    ("state", one_of(&["diverged", "resolved"])),
                    ("proxy_members", array(string())),
                    ("push_members", array(string())),
                    ("difference", string()),
                    ("ring_complete", boolean()),
                    ("placements_seen", count()),
                    ("placements_split", count()),
                    ("sample_split_share", json!({"type": "number"})),
                    diagnosis.clone(),
                ],
                &[
                    ("lasted_secs", count()),
                    ("placements_checked", count()),
                    ("pushes_checked", count()),
                ],
            ),
        ),
        (
            "ws_upgrade_on_grpc_port",
            kind(
                "ws_upgrade_on_grpc_port",
                &[
                    ("gateway", reference("gateway")),
                    ("users", array(string())),
                    ("proxy", reference("process")),
                    ("count", count()),
                    ("window_secs", count()),
                    diagnosis.clone(),
                ],
                &[("answer_status", count())],
            ),
        ),
        (
            "push_connection_churn",
            kind(
                "push_connection_churn",
                &[
                    ("pusher", reference("process")),
                    ("new_connections", count()),
                    ("window_secs", count()),
                    ("per_second", ratio.clone()),
                    ("open_connections", count()),
                    ("calls_per_connection", ratio),
                    diagnosis.clone(),
                ],
                &[],
            ),
        ),
        (
            "push_routing",
            kind(
                "push_routing",
                &[
                    ("service", string()),
                    ("routing", one_of(&["ring", "broadcast"])),
                    ("gateways", count()),
                    diagnosis.clone(),
                ],
                &[],
            ),
        ),
        (
            "capture_degraded",
            kind(
                "capture_degraded",
                &[
                    ("reason", one_of(&reasons)),
                    ("state", one_of(&["degraded", "recovered"])),
                    ("since", time()),
                    ("affects", string()),
                    diagnosis,
                ],
                &[("affected", affected)],
            ),
        ),
        ("observer_started", observer_started()),
    ]
}

/// Describes the first line of `observer run`: its settings, open to fields a later release adds
/// (it is not an alert, and `docs/alerts/observer_started.md` lists them).
fn observer_started() -> Value {
    json!({
        "type": "object",
        "properties": {
            "schema_version": {"const": SCHEMA_VERSION},
            "ts": time(),
            "kind": {"const": "observer_started"},
            "node": string(),
            "version": string(),
            "capture_hook": string(),
        },
        "required": ["schema_version", "ts", "kind", "capture_hook", "version"],
    })
}

/// Returns the schema of the current `SCHEMA_VERSION`'s lines.
pub fn schema() -> Value {
    let kinds = kinds();
    let mut definitions = definitions();
    let mut branches = Vec::new();
    for (name, schema) in kinds {
        branches.push(reference(name));
        definitions.insert(name.to_owned(), schema);
    }
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": format!("https://github.com/openim-observer/observer/docs/schema/{}", file_name(SCHEMA_VERSION)),
        "title": format!("openim-observer alert lines, schema_version {SCHEMA_VERSION}"),
        "description": "One JSON object per line on the observer's stdout; `kind` says which. \
        docs/alerts/ documents every field.",
        "oneOf": branches,
        "$defs": definitions,
    })
}

/// Checks `value` (one parsed line) against `schema`, in the part of JSON Schema this module
/// writes: `$ref` to `#/$defs/…`, `type`, `const`, `enum`, `minimum`, `properties`,
/// `required`, `additionalProperties`, `items`, `oneOf` (a line goes to the branch its `kind`
/// names) and `format: date-time`.
///
/// # Errors
///
/// Fails with [`SchemaError::Invalid`], naming the path and the reason, at the first part of
/// `value` that does not fit.
pub fn validate(schema: &Value, value: &Value) -> Result<(), SchemaError> {
    Validator { root: schema }.check(schema, value, "$")
}

struct Validator<'a> {
    root: &'a Value,
}

fn invalid(path: &str, reason: impl Into<String>) -> SchemaError {
    SchemaError::Invalid {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

impl Validator<'_> {
    fn resolve(&self, reference: &str, path: &str) -> Result<&Value, SchemaError> {
        reference
            .strip_prefix("#/$defs/")
            .and_then(|name| self.root.get("$defs")?.get(name))
            .ok_or_else(|| invalid(path, format!("the schema has no {reference}")))
    }

    fn check(&self, schema: &Value, value: &Value, path: &str) -> Result<(), SchemaError> {
        if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
            return self.check(self.resolve(reference, path)?, value, path);
        }
        if let Some(types) = schema.get("type") {
            check_type(types, value, path)?;
        }
        if let Some(constant) = schema.get("const")
            && constant != value
        {
            return Err(invalid(path, format!("{value} is not {constant}")));
        }
        if let Some(Value::Array(allowed)) = schema.get("enum")
            && !allowed.contains(value)
        {
            return Err(invalid(path, format!("{value} is none of {allowed:?}")));
        }
        if let (Some(minimum), Some(number)) = (
            schema.get("minimum").and_then(Value::as_f64),
            value.as_f64(),
        ) && number < minimum
        {
            return Err(invalid(path, format!("{number} is below {minimum}")));
        }
        if schema.get("format").and_then(Value::as_str) == Some("date-time")
            && let Some(text) = value.as_str()
            && !is_rfc3339(text)
        {
            return Err(invalid(path, format!("{text:?} is not an RFC 3339 time")));
        }
        if let Some(Value::Array(branches)) = schema.get("oneOf") {
            self.check_one_of(branches, value, path)?;
        }
        if let Some(object) = value.as_object() {
            self.check_object(schema, object, path)?;
        }
        if let (Some(items), Some(array)) = (schema.get("items"), value.as_array()) {
            for (index, item) in array.iter().enumerate() {
                self.check(items, item, &format!("{path}[{index}]"))?;
            }
        }
        Ok(())
    }

    /// Checks the branch the line's `kind` names, where one does; else exactly one branch.
    fn check_one_of(
        &self,
        branches: &[Value],
        value: &Value,
        path: &str,
    ) -> Result<(), SchemaError> {
        if let Some(kind) = value.get("kind").and_then(Value::as_str) {
            let named = format!("#/$defs/{kind}");
            if let Some(branch) = branches
                .iter()
                .find(|branch| branch.get("$ref").and_then(Value::as_str) == Some(&named))
            {
                return self.check(branch, value, path);
            }
        }
        let fitting = branches
            .iter()
            .filter(|branch| self.check(branch, value, path).is_ok())
            .count();
        match fitting {
            1 => Ok(()),
            0 => Err(invalid(path, "fits no kind of line")),
            _ => Err(invalid(path, "fits more than one kind of line")),
        }
    }

    fn check_object(
        &self,
        schema: &Value,
        object: &Map<String, Value>,
        path: &str,
    ) -> Result<(), SchemaError> {
        for name in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if !object.contains_key(name) {
                return Err(invalid(path, format!("no {name:?}")));
            }
        }
        let properties = schema.get("properties").and_then(Value::as_object);
        for (name, field) in object {
            let field_path = format!("{path}.{name}");
            match (
                properties.and_then(|known| known.get(name)),
                schema.get("additionalProperties"),
            ) {
                (Some(known), _) => self.check(known, field, &field_path)?,
                (None, Some(Value::Bool(false))) => {
                    return Err(invalid(&field_path, "not in the schema"));
                }
                (None, Some(other @ Value::Object(_))) => self.check(other, field, &field_path)?,
                (None, _) => {}
            }
        }
        Ok(())
    }
}

fn check_type(types: &Value, value: &Value, path: &str) -> Result<(), SchemaError> {
    let fits = |name: &str| match name {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        _ => false,
    };
    let fitting = match types {
        Value::String(name) => fits(name),
        Value::Array(names) => names.iter().filter_map(Value::as_str).any(fits),
        _ => false,
    };
    if fitting {
        Ok(())
    } else {
        Err(invalid(path, format!("{value} is not of type {types}")))
    }
}

/// Says whether `text` is `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`, as the observer writes times.
fn is_rfc3339(text: &str) -> bool {
    let bytes = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| {
        bytes
            .get(range)
            .is_some_and(|part| part.iter().all(u8::is_ascii_digit))
    };
    let shape = digits(0..4)
        && bytes.get(4) == Some(&b'-')
        && digits(5..7)
        && bytes.get(7) == Some(&b'-')
        && digits(8..10)
        && matches!(bytes.get(10), Some(b'T' | b't'))
        && digits(11..13)
        && bytes.get(13) == Some(&b':')
        && digits(14..16)
        && bytes.get(16) == Some(&b':')
        && digits(17..19);
    let rest = text.get(19..).unwrap_or("");
    let rest = match rest.strip_prefix('.') {
        Some(fraction) => fraction.trim_start_matches(|c: char| c.is_ascii_digit()),
        None => rest,
    };
    shape && (rest == "Z" || rest == "z" || (rest.len() == 6 && rest.starts_with(['+', '-'])))
}

/// Returns what a change from `shipped` to `current` (two schemas of one `schema_version`)
/// breaks for a reader of the shipped one: a kind or field gone, a field newly required or no
/// longer required, a type, constant or format changed, a value no longer allowed. New kinds,
/// new optional fields and new allowed values break nothing.
pub fn breaking_changes(shipped: &Value, current: &Value) -> Vec<String> {
    let mut found = Vec::new();
    let empty = Map::new();
    let shipped_definitions = shipped
        .get("$defs")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let current_definitions = current
        .get("$defs")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    for (name, before) in shipped_definitions {
        match current_definitions.get(name) {
            Some(after) => compare(before, after, &format!("$defs/{name}"), &mut found),
            None => found.push(format!("$defs/{name}: gone")),
        }
    }
    found
}

fn compare(before: &Value, after: &Value, path: &str, found: &mut Vec<String>) {
    if before == after {
        return;
    }
    for keyword in ["type", "const", "format", "$ref", "minimum"] {
        if before.get(keyword) != after.get(keyword) {
            found.push(format!("{path}: {keyword} changed"));
        }
    }
    if let (Some(Value::Array(was)), Some(Value::Array(is))) =
        (before.get("enum"), after.get("enum"))
    {
        for value in was.iter().filter(|value| !is.contains(value)) {
            found.push(format!("{path}: {value} no longer allowed"));
        }
    }
    let names = |schema: &Value| -> Vec<String> {
        let listed = schema.get("required").and_then(Value::as_array);
        let mut names: Vec<String> = listed
            .into_iter()
            .flatten()
            .filter_map(|name| name.as_str().map(str::to_owned))
            .collect();
        names.sort();
        names
    };
    if names(before) != names(after) {
        found.push(format!("{path}: required fields changed"));
    }
    if let Some(properties) = before.get("properties").and_then(Value::as_object) {
        for (name, field) in properties {
            match after.get("properties").and_then(|known| known.get(name)) {
                Some(now) => compare(field, now, &format!("{path}/{name}"), found),
                None => found.push(format!("{path}/{name}: gone")),
            }
        }
    }
    if let (Some(was), Some(is)) = (before.get("items"), after.get("items")) {
        compare(was, is, &format!("{path}/items"), found);
    }
}

#[cfg(test)]
mod tests;
