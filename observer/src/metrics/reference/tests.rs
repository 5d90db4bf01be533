use std::sync::Arc;

use super::*;
use crate::{
    alert::DegradedReason,
    capture::{kernel_counters::KernelCounters, reorder::ReorderCounters},
    cluster::{StoreHealth, StoreMetrics},
    correlate::{EngineCounters, blindness::ReasonHealth},
    metrics::Metrics,
};

/// Metrics with a sample in every family, as a node in cluster mode exports them.
fn every_family() -> Metrics {
    let mut metrics = Metrics::default();
    metrics.register_collector(Box::new(StoreMetrics(Arc::new(StoreHealth::default()))));
    let mut engine = EngineCounters::default();
    engine.routes.push_routing = Some("ring");
    let mut kernel = KernelCounters::default();
    kernel.runs_skipped = Some(0);
    metrics.update(&kernel, &engine);
    metrics.update_reorder(&ReorderCounters::default());
    metrics.capture_health(&[ReasonHealth {
        reason: DegradedReason::RingFull,
        degraded: false,
        episodes: 0,
        events: 0,
    }]);
    metrics.alert("route_mismatch", 0.001);
    metrics
        .misrouted_recipients
        .get_or_create(&[("gateway", "10.0.0.1".to_owned())])
        .inc();
    metrics
}

#[test]
fn metrics_reference_matches_the_registry() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md");
    let doc = std::fs::read_to_string(path).expect("docs/metrics.md");
    let table = table(&every_family().render());
    if std::env::var_os("UPDATE_METRICS_REFERENCE").is_some() {
        let start = doc.find(BEGIN).expect("begin marker") + BEGIN.len();
        let end = start + doc[start..].find(END).expect("end marker");
        let updated = format!("{}\n\n{table}\n{}", &doc[..start], &doc[end..]);
        std::fs::write(path, updated).expect("rewrite docs/metrics.md");
        return;
    }
    let documented = section(&doc).expect("docs/metrics.md has the reference's markers");
    assert_eq!(
        documented,
        table.trim_end(),
        "docs/metrics.md's metrics reference differs from the registry: rerun with \
             UPDATE_METRICS_REFERENCE=1 and review the change"
    );
}

#[test]
fn every_counter_is_named_with_total_and_no_family_is_untyped() {
    let table = table(&every_family().render());
    for row in table.lines().skip(2) {
        let cells: Vec<&str> = row.split(" | ").collect();
        assert!(
            ["counter", "gauge", "histogram"].contains(&cells[1]),
            "{row}"
        );
        assert_eq!(
            cells[1] == "counter",
            cells[0].ends_with("_total`"),
            "{row}"
        );
    }
}
