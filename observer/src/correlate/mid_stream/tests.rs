use super::*;

#[test]
fn degraded_once_while_unseen_placements_are_open_then_recovered() {
    let mut mid_stream = MidStream::default();
    let mut alerts = Vec::new();
    mid_stream.unjudged(3, 1, &mut alerts);
    assert!(alerts.is_empty(), "nothing adopted: nothing unseen");
    mid_stream.websocket_adopted(7);
    mid_stream.websocket_adopted(8);
    mid_stream.unjudged(2, 2, &mut alerts);
    mid_stream.unjudged(1, 3, &mut alerts);
    assert_eq!(alerts.len(), 1);
    let json: serde_json::Value = serde_json::from_str(&alerts[0].to_json_line()).unwrap();
    assert_eq!(json["kind"], "capture_degraded");
    assert_eq!(json["reason"], "joined_mid_stream");
    assert_eq!(json["state"], "degraded");
    mid_stream.closed(7, 4, &mut alerts);
    assert_eq!(alerts.len(), 1, "one still open");
    mid_stream.closed(8, 5, &mut alerts);
    let json: serde_json::Value = serde_json::from_str(&alerts[1].to_json_line()).unwrap();
    assert_eq!(json["state"], "recovered");
    assert!(json["affects"].as_str().unwrap().contains("3 recipient"));
}
