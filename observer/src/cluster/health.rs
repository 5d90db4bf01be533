//! Holds the health and totals of cluster mode's store, shared by its tasks, the engine's link,
//! `/metrics` (`openim_observer_redis_*`) and the daemon.

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicU64, Ordering},
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
};

/// Holds the health and totals of the store, shared with `/metrics` and the daemon.
#[derive(Debug, Default)]
pub struct StoreHealth {
    pub(super) up: AtomicBool,
    /// Times the probe found Redis answering after it did not (the first answer included): what
    /// Redis holds may have changed meanwhile (restarted empty, failed over).
    pub(super) comebacks: AtomicU64,
    /// Round trip of the last successful probe, in microseconds.
    pub(super) round_trip_us: AtomicU64,
    pub(super) probe_failures: AtomicU64,
    pub(super) round_trips: AtomicU64,
    pub(super) facts_written: AtomicU64,
    /// Turned away by a full queue.
    pub(super) facts_dropped: AtomicU64,
    /// In a batch Redis did not take.
    pub(super) facts_lost: AtomicU64,
    pub(super) placements_not_refreshed: AtomicU64,
    /// Recorded and not yet written (or lost): still on the queue or in the batch in flight.
    pub(super) queued: AtomicU64,
    lookups_failed: AtomicU64,
    claims_failed: AtomicU64,
    mismatches_deduplicated: AtomicU64,
    divergences_deduplicated: AtomicU64,
}

/// Names what the engine's link to the store counts (`cluster::link`).
#[derive(Clone, Copy, Debug)]
pub enum LinkEvent {
    /// A placement lookup Redis did not answer: judged with local placements only.
    LookupFailed,
    /// A dedup claim Redis did not answer: the alert is printed anyway.
    ClaimFailed,
    /// Another node printed this `route_mismatch` (or its window's summary) first.
    MismatchDeduplicated,
    /// Another node printed this `ring_divergence` first.
    DivergenceDeduplicated,
}

/// Holds a snapshot of [`StoreHealth`], e.g. for the `observer_stopped` line.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct StoreCounters {
    pub up: bool,
    pub round_trip_seconds: f64,
    pub probe_failures: u64,
    pub round_trips: u64,
    pub facts_written: u64,
    pub facts_dropped: u64,
    pub facts_lost: u64,
    pub placements_not_refreshed: u64,
    pub queued: u64,
    pub lookups_failed: u64,
    pub claims_failed: u64,
    pub mismatches_deduplicated: u64,
    pub divergences_deduplicated: u64,
}

impl StoreHealth {
    /// Says whether the last probe found Redis answering.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Counts the times Redis came back (or first answered): whoever caches what Redis holds, or
    /// relies on it holding what this node wrote, compares this count between uses.
    pub(super) fn comebacks(&self) -> u64 {
        self.comebacks.load(Ordering::Relaxed)
    }

    /// Counts the requests Redis did not answer so far: lost batches, failed lookups and claims.
    pub(super) fn failed_requests(&self) -> u64 {
        [&self.facts_lost, &self.lookups_failed, &self.claims_failed]
            .iter()
            .map(|counter| counter.load(Ordering::Relaxed))
            .sum()
    }

    /// Counts the facts recorded and not yet written (or lost).
    pub fn unwritten(&self) -> u64 {
        self.queued.load(Ordering::Relaxed)
    }

    /// Counts one `event` of the engine's link.
    pub(crate) fn count(&self, event: LinkEvent) {
        let counter = match event {
            LinkEvent::LookupFailed => &self.lookups_failed,
            LinkEvent::ClaimFailed => &self.claims_failed,
            LinkEvent::MismatchDeduplicated => &self.mismatches_deduplicated,
            LinkEvent::DivergenceDeduplicated => &self.divergences_deduplicated,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Returns a snapshot of the health and totals.
    pub fn counters(&self) -> StoreCounters {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        StoreCounters {
            up: self.is_up(),
            round_trip_seconds: load(&self.round_trip_us) as f64 / 1e6,
            probe_failures: load(&self.probe_failures),
            round_trips: load(&self.round_trips),
            facts_written: load(&self.facts_written),
            facts_dropped: load(&self.facts_dropped),
            facts_lost: load(&self.facts_lost),
            placements_not_refreshed: load(&self.placements_not_refreshed),
            queued: load(&self.queued),
            lookups_failed: load(&self.lookups_failed),
            claims_failed: load(&self.claims_failed),
            mismatches_deduplicated: load(&self.mismatches_deduplicated),
            divergences_deduplicated: load(&self.divergences_deduplicated),
        }
    }
}

/// Writes the store's series for `/metrics` (`openim_observer_redis_*`), read at each scrape.
#[derive(Debug)]
pub struct StoreMetrics(pub Arc<StoreHealth>);

impl Collector for StoreMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counters = self.0.counters();
        let gauges: [(&str, &str, f64); 3] = [
            (
                "redis_up",
                "1 while the shared-state Redis answers the probe",
                f64::from(u8::from(counters.up)),
            ),
            (
                "redis_round_trip_seconds",
                "Round trip of the last Redis probe (PING)",
                counters.round_trip_seconds,
            ),
            (
                "redis_queue_depth",
                "Facts waiting for Redis (queued, or in the batch being written)",
                counters.queued as f64,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        let totals: [(&str, &str, u64); 10] = [
            (
                "redis_round_trips",
                "Round trips to Redis (batches, reads, claims, probes)",
                counters.round_trips,
            ),
            (
                "redis_probe_failures",
                "Redis probes that failed or timed out",
                counters.probe_failures,
            ),
            (
                "redis_facts_written",
                "Facts written to Redis",
                counters.facts_written,
            ),
            (
                "redis_facts_dropped",
                "Facts turned away by a full queue (Redis slow or unreachable)",
                counters.facts_dropped,
            ),
            (
                "redis_facts_lost",
                "Facts in batches Redis did not take",
                counters.facts_lost,
            ),
            (
                "redis_placements_not_refreshed",
                "Own placements beyond the refresh table, left to expire",
                counters.placements_not_refreshed,
            ),
            (
                "redis_lookups_failed",
                "Placement lookups Redis did not answer (judged with local placements only)",
                counters.lookups_failed,
            ),
            (
                "redis_claims_failed",
                "Dedup claims Redis did not answer (the alert was printed anyway)",
                counters.claims_failed,
            ),
            (
                "redis_mismatches_deduplicated",
                "route_mismatch alerts another node printed first, so this one did not",
                counters.mismatches_deduplicated,
            ),
            (
                "redis_divergences_deduplicated",
                "ring_divergence alerts another node printed first, so this one did not",
                counters.divergences_deduplicated,
            ),
        ];
        for (name, help, value) in totals {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        Ok(())
    }
}
