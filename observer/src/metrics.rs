//! Exports Prometheus metrics on `--metrics-addr`: what the observer read, dropped, failed to
//! decode, tracks and alerted, and how long traffic takes to become an alert.
//!
//! Counters mirror the kernel's and the engine's own totals: `update` adds what grew since the
//! last snapshot, so the exported series are monotonic like Prometheus expects.
//!
//! This file registers the series and counts alerts; `totals` brings the series up to the
//! kernel's and the engine's totals, `server` answers `/metrics` and the probes, and
//! `readiness` says when `/readyz` turns ready.

mod exposition;
mod misrouted;
mod process;
mod readiness;
pub mod reference;
mod server;
mod totals;

use std::{
    collections::HashMap,
    sync::{Arc, atomic::AtomicU64},
    time::{Duration, Instant},
};

use prometheus_client::{
    encoding::text::{encode_eof, encode_registry},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use thiserror::Error;

pub use exposition::Format;
use misrouted::MisroutedUsers;
pub use process::ProcessMetrics;
pub use readiness::Readiness;
pub use server::{bind, serve};

use crate::{
    alert::{Alert, AlertBody},
    capture::{kernel_counters::KernelCounters, reorder::ReorderCounters},
    correlate::EngineCounters,
};

type Labels = [(&'static str, &'static str); 1];
/// Labels a gateway by its address, as alerts name it.
type GatewayLabels = [(&'static str, String); 1];
/// Names `build_info`'s labels: version, commit, capture hook.
type BuildLabels = [(&'static str, &'static str); 3];
/// Labels the service push calls and its routing, learned from the wire.
type RoutingLabels = [(&'static str, String); 2];

/// Describes why the metrics endpoint cannot be served.
#[derive(Debug, Error)]
pub enum MetricsError {
    #[error("cannot serve metrics on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
}

/// Holds the totals last exported, to turn snapshots into counter increments.
#[derive(Default)]
struct Exported {
    kernel: KernelCounters,
    engine: EngineCounters,
    reorder: ReorderCounters,
    /// `capture_health`'s totals by reason: episodes and losses.
    capture: HashMap<&'static str, (u64, u64)>,
}

/// Lists every kind of alert (`Alert::kind`), exported from 0.
const ALERT_KINDS: [&str; 6] = [
    "route_mismatch",
    "ring_divergence",
    "ws_upgrade_on_grpc_port",
    "push_connection_churn",
    "push_routing",
    "capture_degraded",
];

/// Bounds the distinct gateway labels `misrouted_recipients_total` keeps; later gateways count as
/// `other`, so a flood of addresses cannot grow the registry without bound.
const MAX_GATEWAY_LABELS: usize = 256;

/// Names the commit the binary was built from, when the build said (`OPENIM_OBSERVER_COMMIT`).
pub const COMMIT: &str = match option_env!("OPENIM_OBSERVER_COMMIT") {
    Some(commit) => commit,
    None => "unknown",
};

/// Sets the upper bounds of the `kernel_to_alert_seconds` buckets: ×1.5–2 steps from 100 µs to
/// 100 ms, where alerts land (the 5 ms goal and the first safety drain, 10 ms on, each fall on a
/// bound), then two coarse bounds for alerts that waited on a gateway's answer or a window.
const KERNEL_TO_ALERT_BUCKETS: [f64; 20] = [
    0.0001, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01,
    0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 1.0, 10.0,
];

/// Holds the observer's metric families and the registries `/metrics` renders.
pub struct Metrics {
    registry: Registry,
    /// Series without the `openim_observer_` prefix (`process_*`).
    unprefixed: Registry,
    readiness: Arc<Readiness>,
    build_info: Family<BuildLabels, Gauge>,
    events: Counter,
    /// `kernel_total{kind="ring_full_drops"}`: the name the lab tests read (a name of its own,
    /// `kernel_records_dropped_total`, would be clearer; see the report).
    records_dropped: Family<Labels, Counter>,
    bytes_not_captured: Counter,
    bytes_over_budget: Counter,
    kernel_failures: Family<Labels, Counter>,
    calls_cut: Family<Labels, Counter>,
    segments: Family<Labels, Counter>,
    runs_skipped: Counter,
    program_runs: Counter,
    program_seconds: Counter<f64, AtomicU64>,
    decode_failures: Family<Labels, Counter>,
    evictions: Family<Labels, Counter>,
    alerts: Family<Labels, Counter>,
    misrouted_recipients: Family<GatewayLabels, Counter>,
    misrouted_users: Gauge,
    misrouted: MisroutedUsers,
    push_calls: Counter,
    push_answers: Counter,
    push_recipients_judged: Counter,
    connections_tracked: Gauge,
    users_tracked: Gauge,
    kernel_to_alert_seconds: Histogram,
    accept_errors: Counter,
    memory_budget: Gauge,
    memory_accounted: Family<Labels, Gauge>,
    memory_shed: Family<Labels, Counter>,
    resident_memory: Family<Labels, Gauge>,
    capture_degraded: Family<Labels, Gauge>,
    capture_degraded_episodes: Family<Labels, Counter>,
    capture_losses: Family<Labels, Counter>,
    packet_reorder: Family<Labels, Counter>,
    push_routing: Family<RoutingLabels, Gauge>,
    exported: Exported,
}

/// Registers a new metric of type `M` under `name` and hands it back.
fn register<M>(registry: &mut Registry, name: &str, help: &str) -> M
where
    M: Default + Clone + prometheus_client::registry::Metric,
{
    let metric = M::default();
    registry.register(name, help, metric.clone());
    metric
}

impl Default for Metrics {
    /// Registers every series, with its help, in the order the metrics reference lists them.
    ///
    /// Over 100 lines on purpose: one registration per series, and a list split in parts would
    /// no longer read as the reference's order.
    fn default() -> Self {
        let mut registry = Registry::with_prefix("openim_observer");
        let mut unprefixed = Registry::default();
        unprefixed.register_collector(Box::new(ProcessMetrics));
        let kernel_to_alert_seconds = Histogram::new(KERNEL_TO_ALERT_BUCKETS.iter().copied());
        let mut metrics = Self {
            build_info: register(
                &mut registry,
                "build_info",
                "1, labelled with the observer's version, the commit it was built from and the \
                capture hook in use",
            ),
            events: register(
                &mut registry,
                "events",
                "Capture events read from the kernel",
            ),
            records_dropped: register(
                &mut registry,
                "kernel",
                "Records the kernel programs dropped, by kind: ring_full_drops (the ring buffer \
                was full)",
            ),
            bytes_not_captured: register(
                &mut registry,
                "kernel_bytes_not_captured",
                "Payload bytes a syscall or segment moved that were not copied, whatever the cause \
                (budget, chunk limit, unreadable memory, WebSocket policy)",
            ),
            bytes_over_budget: register(
                &mut registry,
                "kernel_bytes_over_budget",
                "gRPC bytes not copied because the connection's budget was spent (part of \
                kernel_bytes_not_captured)",
            ),
            kernel_failures: register(
                &mut registry,
                "kernel_failures",
                "Kernel-side failures by kind: inserts into a bounded map, copies from user memory",
            ),
            calls_cut: register(
                &mut registry,
                "kernel_calls_cut",
                "Calls whose tail was not copied, by reason: chunk limit, step limit, unreadable \
                user memory",
            ),
            segments: register(
                &mut registry,
                "kernel_segments",
                "Packet hook: segments that arrived out of order (copied at their place), and \
                segments left out because they held only HTTP/2 frames the decoder does not read \
                (not a loss)",
            ),
            runs_skipped: register(
                &mut registry,
                "kernel_program_runs_skipped",
                "Runs of the observer's programs the kernel skipped (recursion), where the kernel \
                counts them",
            ),
            program_runs: register(
                &mut registry,
                "kernel_program_runs",
                "Runs of the observer's programs the kernel timed: only while \
                kernel.bpf_stats_enabled is 1, which the observer leaves as it is",
            ),
            program_seconds: register(
                &mut registry,
                "kernel_program_seconds",
                "CPU time of those runs: the observer's CPU outside its own process, paid inside \
                other processes' syscalls and softirqs",
            ),
            decode_failures: register(
                &mut registry,
                "decode_failures",
                "Decoding failures and undecodable streams by layer or reason",
            ),
            evictions: register(
                &mut registry,
                "evictions",
                "Entries a bounded table turned away, by table",
            ),
            alerts: register(&mut registry, "alerts", "Alerts printed, by kind"),
            misrouted_recipients: register(
                &mut registry,
                "misrouted_recipients",
                "Recipients whose message missed real time, by the gateway push sent the message \
                to: one per route_mismatch alert printed, and a fold window's summary adds the \
                repeats it stands for",
            ),
            misrouted_users: register(
                &mut registry,
                "misrouted_users",
                "Users with a route_mismatch alert printed within its fold window: misrouted right \
                now",
            ),
            misrouted: MisroutedUsers::default(),
            push_calls: register(
                &mut registry,
                "push_calls",
                "Push calls to a gateway seen (one call carries one or more recipients)",
            ),
            push_answers: register(
                &mut registry,
                "push_answers",
                "Answers to those push calls seen",
            ),
            push_recipients_judged: register(
                &mut registry,
                "push_recipients_judged",
                "Recipients of push calls checked against the gateways they are placed on, \
                misrouted or not (those without a known placement are not): \
                misrouted_recipients_total's denominator",
            ),
            connections_tracked: register(
                &mut registry,
                "connections_tracked",
                "Connections being decoded",
            ),
            users_tracked: register(
                &mut registry,
                "users_tracked",
                "Users with a live WebSocket placement",
            ),
            kernel_to_alert_seconds: kernel_to_alert_seconds.clone(),
            accept_errors: register(
                &mut registry,
                "metrics_accept_errors",
                "Connections to this endpoint that could not be accepted (e.g. out of file \
                descriptors)",
            ),
            memory_budget: register(
                &mut registry,
                "memory_budget_bytes",
                "--memory-budget: what every table and buffer together may hold",
            ),
            memory_accounted: register(
                &mut registry,
                "memory_accounted_bytes",
                "Estimated bytes held against the memory budget, by table",
            ),
            memory_shed: register(
                &mut registry,
                "memory_shed",
                "State dropped to keep to the memory budget, by what (least useful first)",
            ),
            resident_memory: register(
                &mut registry,
                "resident_memory_bytes",
                "The process's resident memory from /proc/self/status, now and at its peak",
            ),
            capture_degraded: register(
                &mut registry,
                "capture_degraded",
                "1 while capture is degraded for this reason (a capture_degraded episode is open)",
            ),
            capture_degraded_episodes: register(
                &mut registry,
                "capture_degraded_episodes",
                "capture_degraded episodes raised since start, by reason",
            ),
            capture_losses: register(
                &mut registry,
                "capture_losses",
                "Losses counted toward capture_degraded since start, by reason (records, \
                connections or entries)",
            ),
            packet_reorder: register(
                &mut registry,
                "packet_reorder",
                "--capture-hook packets: records held behind a gap in a stream, gaps filled while \
                they waited, gaps given up on (too long or too much held)",
            ),
            push_routing: register(
                &mut registry,
                "push_routing",
                "1 for the gateway service push calls and how it routes a message (ring: one \
                gateway per recipient; broadcast: every recipient to every gateway), once learned \
                from its calls",
            ),
            registry,
            unprefixed,
            readiness: Arc::default(),
            exported: Exported::default(),
        };
        metrics.registry.register(
            "kernel_to_alert_seconds",
            "From the traffic that raised an alert to the alert's line on stdout",
            kernel_to_alert_seconds,
        );
        metrics.set_capture_hook("unknown");
        // Every kind from 0, so that a rule's `increase` sees the first alert of a kind.
        for kind in ALERT_KINDS {
            metrics.alerts.get_or_create(&[("kind", kind)]).inc_by(0);
        }
        metrics
    }
}

impl Metrics {
    /// Counts an alert of `kind` printed `kernel_to_alert_seconds` after its traffic.
    pub fn alert(&self, kind: &'static str, kernel_to_alert_seconds: f64) {
        self.alerts.get_or_create(&[("kind", kind)]).inc();
        self.kernel_to_alert_seconds
            .observe(kernel_to_alert_seconds.max(0.0));
    }

    /// Counts a printed alert as `alert` does, and a route_mismatch's recipients by gateway
    /// and among the users misrouted now.
    ///
    /// A window's first alert counts one recipient; its summary, whose count includes that
    /// first one, counts the repeats it folded. So `misrouted_recipients_total` counts every
    /// misrouted recipient, like `push_recipients_judged_total` counts every judged one.
    pub fn alert_printed(&mut self, alert: &Alert, kernel_to_alert_seconds: f64) {
        self.alert(alert.kind(), kernel_to_alert_seconds);
        let AlertBody::RouteMismatch(mismatch) = &*alert.body else {
            return;
        };
        let recipients = if mismatch.count < 2 {
            1
        } else {
            mismatch.count - 1
        };
        let gateway = mismatch.pushed_to.gateway.gateway.ip.to_string();
        let labels = [("gateway", gateway)];
        let family = &self.misrouted_recipients;
        let known = family.get(&labels).is_some();
        if known || self.misrouted.gateway_labels < MAX_GATEWAY_LABELS {
            self.misrouted.gateway_labels += usize::from(!known);
            family.get_or_create(&labels).inc_by(recipients);
        } else {
            family
                .get_or_create(&[("gateway", "other".to_owned())])
                .inc_by(recipients);
        }
        let now = Instant::now();
        let window = Duration::from_secs(mismatch.window_secs.max(1));
        self.misrouted.seen(&mismatch.user, now + window);
        self.misrouted_users
            .set(i64::try_from(self.misrouted.count(now)).unwrap_or(i64::MAX));
    }

    /// Names the capture hook in use in `build_info`.
    pub fn set_capture_hook(&self, hook: &'static str) {
        self.build_info.clear();
        self.build_info
            .get_or_create(&[
                ("version", env!("CARGO_PKG_VERSION")),
                ("commit", COMMIT),
                ("capture_hook", hook),
            ])
            .set(1);
    }

    /// Returns what `/readyz` answers from, shared with the daemon that sets it.
    pub fn readiness(&self) -> Arc<Readiness> {
        Arc::clone(&self.readiness)
    }

    /// Adds series read at each scrape (cluster mode's Redis health).
    pub fn register_collector(
        &mut self,
        collector: Box<dyn prometheus_client::collector::Collector>,
    ) {
        self.registry.register_collector(collector);
    }

    /// Renders the exposition in `format`.
    pub fn render_as(&self, format: Format) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = encode_registry(&mut text, &self.registry);
        let _ = encode_registry(&mut text, &self.unprefixed);
        let _ = encode_eof(&mut text);
        match format {
            Format::OpenMetrics => text,
            Format::Text => exposition::to_text_format(&text),
        }
    }

    /// Renders the OpenMetrics exposition.
    pub fn render(&self) -> String {
        self.render_as(Format::OpenMetrics)
    }
}

#[cfg(test)]
mod tests;
