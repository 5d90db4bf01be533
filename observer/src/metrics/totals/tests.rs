use super::*;
use crate::metrics::KERNEL_TO_ALERT_BUCKETS;

#[test]
fn counters_follow_the_totals() {
    let mut metrics = Metrics::default();
    let mut engine = EngineCounters {
        events: 10,
        ..EngineCounters::default()
    };
    engine.connections.decode.hpack_failures = 2;
    let mut kernel = KernelCounters::default();
    kernel[observer_records::Counter::RingFullDrops] = 3;
    metrics.update(&kernel, &engine);
    engine.events = 25;
    // Not counted at the first read, then 4 and 6: all of it is exported.
    kernel.runs_skipped = Some(4);
    metrics.update(&kernel, &engine);
    kernel.runs_skipped = Some(6);
    // The programs' time, once the kernel's statistics are on: 3 runs of 0.5 ms.
    kernel.runs_timed = 3;
    kernel.run_time_ns = 1_500_000;
    metrics.update(&kernel, &engine);
    metrics.alert("route_mismatch", 0.002);
    let text = metrics.render();
    assert!(text.contains("openim_observer_events_total 25"), "{text}");
    assert!(
        text.contains("openim_observer_kernel_total{kind=\"ring_full_drops\"} 3"),
        "{text}"
    );
    assert!(
        text.contains("openim_observer_kernel_program_runs_skipped_total 6"),
        "{text}"
    );
    assert!(
        text.contains("openim_observer_kernel_program_runs_total 3"),
        "{text}"
    );
    assert!(
        text.contains("openim_observer_kernel_program_seconds_total 0.0015"),
        "{text}"
    );
    assert!(
        text.contains("openim_observer_decode_failures_total{layer=\"hpack\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("openim_observer_alerts_total{kind=\"route_mismatch\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("openim_observer_kernel_to_alert_seconds_count 1"),
        "{text}"
    );
    // 2 ms falls in the 2 ms bucket (bounds are inclusive), not in the one below it.
    assert!(
        text.contains("openim_observer_kernel_to_alert_seconds_bucket{le=\"0.0015\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("openim_observer_kernel_to_alert_seconds_bucket{le=\"0.002\"} 1"),
        "{text}"
    );
    let buckets = text.matches("kernel_to_alert_seconds_bucket{").count();
    assert_eq!(buckets, KERNEL_TO_ALERT_BUCKETS.len() + 1, "{text}");
}

#[test]
fn memory_and_capture_health_are_exported() {
    use crate::{alert::DegradedReason, correlate::blindness::ReasonHealth};
    let mut metrics = Metrics::default();
    let mut engine = EngineCounters::default();
    engine.memory.budget_bytes = 1 << 20;
    engine.memory.decoder_buffer_bytes = 4096;
    engine.memory.shed_undecoded_decoders = 7;
    metrics.update(&KernelCounters::default(), &engine);
    metrics.capture_health(&[ReasonHealth {
        reason: DegradedReason::RingFull,
        degraded: true,
        episodes: 1,
        events: 42,
    }]);
    let text = metrics.render();
    for expected in [
        "openim_observer_memory_budget_bytes 1048576",
        "openim_observer_memory_accounted_bytes{table=\"decoder_buffers\"} 4096",
        "openim_observer_memory_shed_total{what=\"undecoded_decoders\"} 7",
        "openim_observer_resident_memory_bytes{which=\"peak\"}",
        "openim_observer_capture_degraded{reason=\"ring_full\"} 1",
        "openim_observer_capture_degraded_episodes_total{reason=\"ring_full\"} 1",
        "openim_observer_capture_losses_total{reason=\"ring_full\"} 42",
    ] {
        assert!(text.contains(expected), "{expected} missing: {text}");
    }
}

#[test]
fn packet_reorder_counters_follow_the_totals() {
    let mut metrics = Metrics::default();
    let mut reorder = ReorderCounters {
        records_held: 5,
        gaps_filled: 2,
        gaps_released: 0,
    };
    metrics.update_reorder(&reorder);
    reorder.records_held = 9;
    reorder.gaps_released = 1;
    metrics.update_reorder(&reorder);
    let text = metrics.render();
    for expected in [
        "openim_observer_packet_reorder_total{what=\"records_held\"} 9",
        "openim_observer_packet_reorder_total{what=\"gaps_filled\"} 2",
        "openim_observer_packet_reorder_total{what=\"gaps_released\"} 1",
    ] {
        assert!(text.contains(expected), "{expected} missing: {text}");
    }
}
