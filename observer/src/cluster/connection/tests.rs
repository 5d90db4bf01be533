use super::*;

#[test]
fn a_pipeline_splits_per_hash_tag_in_order() {
    let mut pipeline = redis::pipe();
    pipeline
        .hset("p:{u:alice}:placements", "f", "v")
        .ignore()
        .pexpire("p:{u:alice}:placements", 10)
        .ignore()
        .lpush("p:{u:bob}:pushes", "x")
        .cmd("PING")
        .lpush("p:{u:alice}:pushes", "y")
        .cmd("EVAL")
        .arg("return 1")
        .arg(1)
        .arg("p:{u:bob}:x");
    let parts = split_per_slot(&pipeline);
    let positions: Vec<&[usize]> = parts.iter().map(|(at, _)| at.as_slice()).collect();
    assert_eq!(positions, [&[0, 1, 4][..], &[2, 5], &[3]]);
    assert!(parts.iter().all(|(at, part)| part.len() == at.len()));
    assert_eq!(
        slot_of(&redis::cmd("GET").arg("{u:alice}x").clone()),
        Some(Slot::for_key("u:alice"))
    );
}
