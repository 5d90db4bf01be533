//! Brings the series up to the kernel's, the engine's and the capture's totals: each counter
//! grows by what its total grew since the last snapshot.

use std::time::Instant;

use super::Metrics;
use crate::{
    budget::MemoryCounters,
    capture::{kernel_counters::KernelCounters, reorder::ReorderCounters},
    correlate::{EngineCounters, blindness::ReasonHealth},
};

impl Metrics {
    /// Brings every series up to the given totals.
    pub fn update(&mut self, kernel: &KernelCounters, engine: &EngineCounters) {
        let previous = &self.exported;
        self.events
            .inc_by(engine.events.saturating_sub(previous.engine.events));
        self.update_kernel(kernel);
        self.program_runs
            .inc_by(kernel.runs_timed.saturating_sub(previous.kernel.runs_timed));
        self.program_seconds.inc_by(
            kernel
                .run_time_ns
                .saturating_sub(previous.kernel.run_time_ns) as f64
                / 1e9,
        );
        self.update_decode(engine, &previous.engine);
        self.update_evictions(engine, &previous.engine);
        let (routes, routes_before) = (&engine.routes, &previous.engine.routes);
        self.push_calls
            .inc_by(routes.push_calls.saturating_sub(routes_before.push_calls));
        self.push_answers.inc_by(
            routes
                .push_answers
                .saturating_sub(routes_before.push_answers),
        );
        self.push_recipients_judged.inc_by(
            routes
                .push_recipients_judged
                .saturating_sub(routes_before.push_recipients_judged),
        );
        self.misrouted_users
            .set(i64::try_from(self.misrouted.count(Instant::now())).unwrap_or(i64::MAX));
        self.connections_tracked
            .set(i64::try_from(engine.connections.tracked).unwrap_or(i64::MAX));
        self.users_tracked
            .set(i64::try_from(engine.users_tracked).unwrap_or(i64::MAX));
        self.update_memory(&engine.memory, &previous.engine.memory);
        if let Some(routing) = routes.push_routing
            && (routes.push_routing != routes_before.push_routing
                || routes.push_service != routes_before.push_service)
        {
            self.push_routing.clear();
            let service = routes.push_service.clone().unwrap_or_default();
            self.push_routing
                .get_or_create(&[("service", service), ("routing", routing.to_owned())])
                .set(1);
        }
        self.exported.kernel = kernel.clone();
        self.exported.engine = engine.clone();
    }

    /// Brings `decode_failures_total` up to the decoders' totals, by layer or reason.
    fn update_decode(&self, engine: &EngineCounters, previous: &EngineCounters) {
        let (decode, decode_before) = (&engine.connections.decode, &previous.connections.decode);
        for (layer, now, before) in [
            ("http1", decode.http1_failures, decode_before.http1_failures),
            ("http2", decode.http2_failures, decode_before.http2_failures),
            ("hpack", decode.hpack_failures, decode_before.hpack_failures),
            ("grpc", decode.grpc_failures, decode_before.grpc_failures),
            (
                "protobuf",
                decode.protobuf_failures,
                decode_before.protobuf_failures,
            ),
            (
                "joined_mid_stream",
                decode.undecodable_joined_mid_stream,
                decode_before.undecodable_joined_mid_stream,
            ),
            (
                "no_client_preface",
                decode.undecodable_no_client_preface,
                decode_before.undecodable_no_client_preface,
            ),
            (
                "capture_gap",
                decode.lost_sync_gap,
                decode_before.lost_sync_gap,
            ),
            (
                "buffer_overflow",
                decode.buffer_overflow,
                decode_before.buffer_overflow,
            ),
            (
                "truncated_call",
                decode.truncated_calls,
                decode_before.truncated_calls,
            ),
        ] {
            self.decode_failures
                .get_or_create(&[("layer", layer)])
                .inc_by(now.saturating_sub(before));
        }
    }

    /// Brings `evictions_total` up to the bounded tables' totals, by table.
    fn update_evictions(&self, engine: &EngineCounters, previous: &EngineCounters) {
        let (routes, routes_before) = (&engine.routes, &previous.routes);
        for (table, now, before) in [
            (
                "connections",
                engine.connections.evicted,
                previous.connections.evicted,
            ),
            ("users", routes.users_evicted, routes_before.users_evicted),
            (
                "placements",
                routes.placements_evicted,
                routes_before.placements_evicted,
            ),
            (
                "pending_calls",
                routes.pending_calls_evicted,
                routes_before.pending_calls_evicted,
            ),
            (
                "route_connections",
                routes.connections_evicted,
                routes_before.connections_evicted,
            ),
            (
                "alert_folds",
                routes.fold_keys_evicted,
                routes_before.fold_keys_evicted,
            ),
            (
                "message_routes",
                routes.routing.messages_evicted,
                routes_before.routing.messages_evicted,
            ),
            (
                "held_misses",
                routes.routing.misses_judged_early,
                routes_before.routing.misses_judged_early,
            ),
        ] {
            self.evictions
                .get_or_create(&[("table", table)])
                .inc_by(now.saturating_sub(before));
        }
    }

    /// Brings the kernel's series up to its totals, each counter under its own name.
    fn update_kernel(&self, kernel: &KernelCounters) {
        use observer_records::Counter as Kernel;
        let before = &self.exported.kernel;
        let grown = |counter: Kernel| kernel[counter].saturating_sub(before[counter]);
        self.records_dropped
            .get_or_create(&[("kind", "ring_full_drops")])
            .inc_by(grown(Kernel::RingFullDrops));
        self.bytes_not_captured
            .inc_by(grown(Kernel::BytesNotCaptured));
        self.bytes_over_budget
            .inc_by(grown(Kernel::BytesOverBudget));
        for (family, label, counter) in [
            (
                &self.kernel_failures,
                ("kind", "map_insert"),
                Kernel::MapInsertFailures,
            ),
            (
                &self.kernel_failures,
                ("kind", "user_read"),
                Kernel::UserReadFailures,
            ),
            (
                &self.calls_cut,
                ("reason", "chunk_limit"),
                Kernel::CallsCutAtChunkLimit,
            ),
            (
                &self.calls_cut,
                ("reason", "step_limit"),
                Kernel::CallsCutAtStepLimit,
            ),
            (
                &self.calls_cut,
                ("reason", "unreadable"),
                Kernel::CallsCutUnreadable,
            ),
            (
                &self.segments,
                ("what", "out_of_order"),
                Kernel::SegmentsOutOfOrder,
            ),
            (
                &self.segments,
                ("what", "left_out"),
                Kernel::SegmentsLeftOut,
            ),
        ] {
            family.get_or_create(&[label]).inc_by(grown(counter));
        }
        if let Some(skipped) = kernel.runs_skipped {
            self.runs_skipped
                .inc_by(skipped.saturating_sub(before.runs_skipped.unwrap_or(0)));
        }
    }

    /// Brings the packet hook's reordering series up to its totals.
    pub fn update_reorder(&mut self, reorder: &ReorderCounters) {
        let before = &self.exported.reorder;
        for (what, now, was) in [
            ("records_held", reorder.records_held, before.records_held),
            ("gaps_filled", reorder.gaps_filled, before.gaps_filled),
            ("gaps_released", reorder.gaps_released, before.gaps_released),
        ] {
            self.packet_reorder
                .get_or_create(&[("what", what)])
                .inc_by(now.saturating_sub(was));
        }
        self.exported.reorder = *reorder;
    }

    fn update_memory(&self, memory: &MemoryCounters, before: &MemoryCounters) {
        let gauge = |bytes: usize| i64::try_from(bytes).unwrap_or(i64::MAX);
        self.memory_budget.set(gauge(memory.budget_bytes));
        for (table, bytes) in [
            ("decoder_buffers", memory.decoder_buffer_bytes),
            ("connections", memory.connection_bytes),
            ("users", memory.user_bytes),
            ("pending_calls", memory.pending_call_bytes),
            ("fold_windows", memory.fold_window_bytes),
        ] {
            self.memory_accounted
                .get_or_create(&[("table", table)])
                .set(gauge(bytes));
        }
        for (what, now, was) in [
            (
                "undecoded_decoders",
                memory.shed_undecoded_decoders,
                before.shed_undecoded_decoders,
            ),
            ("decoders", memory.shed_decoders, before.shed_decoders),
            ("users", memory.shed_users, before.shed_users),
        ] {
            self.memory_shed
                .get_or_create(&[("what", what)])
                .inc_by(now.saturating_sub(was));
        }
        if let Some(resident) = crate::budget::resident_memory() {
            for (which, bytes) in [
                ("current", resident.current_bytes),
                ("peak", resident.peak_bytes),
            ] {
                self.resident_memory
                    .get_or_create(&[("which", which)])
                    .set(i64::try_from(bytes).unwrap_or(i64::MAX));
            }
        }
    }

    /// Sets where each capture reason of `capture_degraded` stands, and its totals since start.
    pub fn capture_health(&mut self, health: &[ReasonHealth]) {
        for reason in health {
            let name = reason.reason.name();
            let labels = [("reason", name)];
            self.capture_degraded
                .get_or_create(&labels)
                .set(i64::from(reason.degraded));
            let (episodes, losses) = self.exported.capture.entry(name).or_default();
            self.capture_degraded_episodes
                .get_or_create(&labels)
                .inc_by(reason.episodes.saturating_sub(*episodes));
            self.capture_losses
                .get_or_create(&labels)
                .inc_by(reason.events.saturating_sub(*losses));
            (*episodes, *losses) = (reason.episodes, reason.events);
        }
    }
}

#[cfg(test)]
mod tests;
