use super::*;

#[test]
fn a_mismatch_reads_as_who_where_and_why() {
    let value = serde_json::json!({
        "schema_version": 1, "ts": "2026-01-01T00:00:00Z", "kind": "route_mismatch",
        "user": "u1",
        "placed_on": [{"gateway": {"ip": "10.0.0.1", "port": 10001,
            "pod": {"namespace": "chat", "name": "gw-0"}}}],
        "pushed_to": {"gateway": {"ip": "fd00::2", "port": 10001}},
        "count": 1, "cause": "ring_split",
        "diagnosis": "User u1 is placed on gw-0. Push sent the message elsewhere.",
        "node": "n1"
    });
    assert_eq!(
        text_of(&value),
        "2026-01-01T00:00:00Z route_mismatch user=u1 cause=ring_split count=1 node=n1 \
             placed_on=10.0.0.1:10001(chat/gw-0) pushed_to=[fd00::2]:10001 \
             — User u1 is placed on gw-0."
    );
}

#[test]
fn the_start_line_names_the_hook_and_ports() {
    let value = serde_json::json!({
        "kind": "observer_started", "ts": "2026-01-01T00:00:00Z", "capture_hook": "packets",
        "version": "0.1.0", "grpc_ports": [88, 10088], "ws_ports": [80]
    });
    assert_eq!(
        text_of(&value),
        "2026-01-01T00:00:00Z observer_started capture_hook=packets version=0.1.0 \
             grpc_ports=88,10088 ws_ports=80"
    );
}

#[test]
fn a_long_diagnosis_is_cut() {
    let long = "word ".repeat(100);
    let text = shortened(&long);
    assert_eq!(text.chars().count(), DIAGNOSIS_CHARS);
    assert!(text.ends_with('…'));
}
