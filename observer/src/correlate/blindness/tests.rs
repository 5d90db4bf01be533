use super::*;

const SEC: u64 = NANOS_PER_SEC;

fn kernel(ring_full_drops: u64) -> KernelCounters {
    let mut counters = KernelCounters::default();
    counters[Counter::RingFullDrops] = ring_full_drops;
    counters
}

fn health() -> CaptureHealth {
    CaptureHealth::new(BlindnessLimits::default(), CaptureSettings::default())
}

fn states(alerts: &[Alert]) -> Vec<(DegradedReason, DegradedState)> {
    alerts
        .iter()
        .filter_map(|alert| match &*alert.body {
            AlertBody::CaptureDegraded { reason, state, .. } => Some((*reason, *state)),
            _ => None,
        })
        .collect()
}

#[test]
fn ring_drops_raise_one_episode_and_recover_after_a_quiet_spell() {
    let mut health = health();
    let engine = EngineCounters::default();
    let mut alerts = Vec::new();
    health.tick(
        SEC,
        Some(&kernel(0)),
        &engine,
        BlindSpots::default(),
        &mut alerts,
    );
    assert!(alerts.is_empty());
    for second in 2..=6 {
        health.tick(
            second * SEC,
            Some(&kernel(second * 100)),
            &engine,
            BlindSpots::default(),
            &mut alerts,
        );
    }
    assert_eq!(
        states(&alerts),
        [(DegradedReason::RingFull, DegradedState::Degraded)]
    );
    assert!(health.health()[0].degraded);
    alerts.clear();
    for second in 7..=16 {
        health.tick(
            second * SEC,
            Some(&kernel(600)),
            &engine,
            BlindSpots::default(),
            &mut alerts,
        );
    }
    assert_eq!(
        states(&alerts),
        [(DegradedReason::RingFull, DegradedState::Recovered)]
    );
    let line = alerts[0].to_json_line();
    assert!(line.contains(r#""state":"recovered""#), "{line}");
    assert!(line.contains(r#""records":600"#), "{line}");
    assert!(line.contains("--ring-bytes"), "{line}");
    assert!(!health.health()[0].degraded);
    assert_eq!(health.health()[0].episodes, 1);
}

#[test]
fn decoder_losses_name_the_processes_and_connections() {
    let mut health = health();
    let engine = EngineCounters::default();
    let pusher = Process {
        pid: 42,
        comm: "push".into(),
        cgroup_id: 1,
    };
    let mut spots = BlindSpots::default();
    spots.record(DegradedReason::LostSync, 7, &pusher, 1_000);
    spots.record(DegradedReason::LostSync, 7, &pusher, 500);
    spots.record(DegradedReason::LostSync, 8, &pusher, 0);
    let mut alerts = Vec::new();
    health.tick(SEC, None, &engine, spots, &mut alerts);
    let line = alerts[0].to_json_line();
    assert!(line.contains(r#""reason":"lost_sync""#), "{line}");
    assert!(
        line.contains(r#""processes":[{"pid":42,"comm":"push","connections":2,"bytes":1500}]"#),
        "{line}"
    );
    assert!(line.contains(r#""connections":2,"bytes":1500"#), "{line}");
}

#[test]
fn evictions_and_sheds_are_table_full() {
    let mut health = health();
    let mut engine = EngineCounters::default();
    let mut alerts = Vec::new();
    health.tick(SEC, None, &engine, BlindSpots::default(), &mut alerts);
    engine.memory.shed_undecoded_decoders = 5;
    engine.routes.users_evicted = 2;
    health.tick(2 * SEC, None, &engine, BlindSpots::default(), &mut alerts);
    assert_eq!(
        states(&alerts),
        [(DegradedReason::TableFull, DegradedState::Degraded)]
    );
    let line = alerts[0].to_json_line();
    assert!(line.contains(r#""connections":5,"users":2"#), "{line}");
    assert!(line.contains("--memory-budget"), "{line}");
}

#[test]
fn runs_the_kernel_skipped_are_their_own_reason_and_unknown_counts_raise_nothing() {
    let mut health = health();
    let engine = EngineCounters::default();
    let mut alerts = Vec::new();
    let mut counters = KernelCounters::default();
    health.tick(
        SEC,
        Some(&counters),
        &engine,
        BlindSpots::default(),
        &mut alerts,
    );
    counters.runs_skipped = Some(0);
    health.tick(
        2 * SEC,
        Some(&counters),
        &engine,
        BlindSpots::default(),
        &mut alerts,
    );
    assert!(alerts.is_empty());
    counters.runs_skipped = Some(3);
    health.tick(
        3 * SEC,
        Some(&counters),
        &engine,
        BlindSpots::default(),
        &mut alerts,
    );
    assert_eq!(
        states(&alerts),
        [(DegradedReason::RunsSkipped, DegradedState::Degraded)]
    );
    let line = alerts[0].to_json_line();
    assert!(line.contains(r#""reason":"runs_skipped""#), "{line}");
    assert!(line.contains(r#""affected":{"runs":3}"#), "{line}");
    assert!(line.contains("recursion_misses"), "{line}");
}

#[test]
fn a_long_episode_is_summarised_once_per_window() {
    let mut health = CaptureHealth::new(
        BlindnessLimits {
            summary_secs: 10,
            ..BlindnessLimits::default()
        },
        CaptureSettings::default(),
    );
    let engine = EngineCounters::default();
    let mut alerts = Vec::new();
    for second in 1..=35 {
        health.tick(
            second * SEC,
            Some(&kernel(second)),
            &engine,
            BlindSpots::default(),
            &mut alerts,
        );
    }
    // Raised at 1 s, summaries at 11, 21 and 31 s.
    assert_eq!(alerts.len(), 4);
}
