//! The alert lines' JSON Schema (docs/schema/): the binary prints the shipped file, and a lab
//! run's lines, every kind the misrouting raises, fit it. Every other observer run of the tests
//! is held to it too (`ObserverProcess::stop`).
//!
//! The lab run needs root and an observer built with its eBPF programs; without them it skips
//! (see `tests::privileges`).

use std::path::Path;
use std::time::Duration;

use observer::alert::{SCHEMA_VERSION, schema};
use serde_json::Value;
use tests::observed::{find_observer_binary, observe_lab};
use tests::privileges::{Needs, can_run};
use tests::{LabConfig, ProxyMode};

fn shipped_schema() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/schema")
        .join(schema::file_name(SCHEMA_VERSION));
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

#[test]
fn observer_schema_prints_the_shipped_file() {
    let binary = find_observer_binary().expect("observer binary");
    let output = std::process::Command::new(binary)
        .arg("schema")
        .output()
        .expect("run observer schema");
    assert!(output.status.success(), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stdout) == shipped_schema(),
        "`observer schema` differs from the shipped schema"
    );
}

#[test]
fn a_misrouted_lab_prints_only_lines_that_fit_the_schema() {
    if !can_run(Needs::RootAndPrograms) {
        return;
    }
    let (_, output) = observe_lab(
        LabConfig {
            mode: ProxyMode::V351,
            replicas_initial: 3,
            replicas_final: 3,
            users: 40,
            messages_per_user: 3,
            realtime_timeout: Duration::from_secs(2),
            ..LabConfig::default()
        },
        &[],
    );
    // `stop` has checked every line already; this says which kinds were among them.
    let shipped: Value = serde_json::from_str(&shipped_schema()).expect("shipped schema");
    let mut kinds = std::collections::BTreeSet::new();
    for line in &output.stdout {
        let value: Value = serde_json::from_str(line).expect("a JSON line");
        if let Err(error) = schema::validate(&shipped, &value) {
            panic!("{error}: {line}");
        }
        if value["kind"] != "observer_started" {
            assert!(
                value["node"].is_string(),
                "every alert names its node: {line}"
            );
        }
        kinds.insert(value["kind"].as_str().unwrap_or_default().to_owned());
    }
    for kind in ["observer_started", "route_mismatch", "push_routing"] {
        assert!(kinds.contains(kind), "no {kind} among {kinds:?}");
    }
}
