use super::*;

#[test]
fn only_mismatch_lines_count_and_their_latency_runs_from_ts() {
    let raised = humantime::parse_rfc3339("2026-12-01T10:00:00.000000Z").unwrap();
    let line = r#"{"schema_version":1,"ts":"2026-12-01T10:00:00.000000Z","kind":"route_mismatch"}"#;
    let latency = mismatch_latency_us(raised + Duration::from_micros(2_500), line).unwrap();
    assert!((latency - 2_500.0).abs() < 1.0);
    let other = r#"{"ts":"2026-12-01T10:00:00.000000Z","kind":"ring_divergence"}"#;
    assert!(mismatch_latency_us(raised, other).is_none());
}

#[test]
fn percentiles_come_from_the_sorted_latencies() {
    let mut latencies: Vec<f64> = (1..=100).rev().map(|ms| f64::from(ms) * 1e3).collect();
    let text = render(&mut latencies, "packets (auto: …)");
    assert!(text.contains("capture hook packets (auto: …);"), "{text}");
    assert!(text.contains("p50 50.00 ms"), "{text}");
    assert!(text.contains("p99 99.00 ms, max 100.00 ms"), "{text}");
}
