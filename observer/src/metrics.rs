//! Prometheus metrics on `--metrics-addr`: what the observer read, dropped, failed to decode,
//! tracks and alerted, and how long traffic takes to become an alert.
//!
//! Counters mirror the kernel's and the engine's own totals: `update` adds what grew since the
//! last snapshot, so the exported series are monotonic like Prometheus expects.

mod exposition;
mod misrouted;
mod process;
pub mod reference;

use std::{
    collections::HashMap,
    fs::File,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use prometheus_client::{
    encoding::text::{encode_eof, encode_registry},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use thiserror::Error;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::Semaphore,
};

pub use exposition::Format;
use misrouted::MisroutedUsers;
pub use process::ProcessMetrics;

use crate::{
    alert::{Alert, AlertBody},
    budget::MemoryCounters,
    capture::{kernel_counters::KernelCounters, reorder::ReorderCounters},
    correlate::{EngineCounters, blindness::ReasonHealth},
};

type Labels = [(&'static str, &'static str); 1];
/// A gateway by its address, as alerts name it.
type GatewayLabels = [(&'static str, String); 1];
/// `build_info`'s labels: version, commit, capture hook.
type BuildLabels = [(&'static str, &'static str); 3];
/// The service push calls and its routing, learned from the wire.
type RoutingLabels = [(&'static str, String); 2];

#[derive(Debug, Error)]
pub enum MetricsError {
    #[error("cannot serve metrics on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
}

/// Totals last exported, to turn snapshots into counter increments.
#[derive(Default)]
struct Exported {
    kernel: KernelCounters,
    engine: EngineCounters,
    reorder: ReorderCounters,
    /// `capture_health`'s totals by reason: episodes and losses.
    capture: HashMap<&'static str, (u64, u64)>,
}

/// Every kind of alert (`Alert::kind`), exported from 0.
const ALERT_KINDS: [&str; 6] = [
    "route_mismatch",
    "ring_divergence",
    "ws_upgrade_on_grpc_port",
    "push_connection_churn",
    "push_routing",
    "capture_degraded",
];

/// Distinct gateway labels `misrouted_recipients_total` keeps; later gateways count as
/// `other`, so a flood of addresses cannot grow the registry without bound.
const MAX_GATEWAY_LABELS: usize = 256;

/// The commit the binary was built from, when the build said (`OPENIM_OBSERVER_COMMIT`).
pub const COMMIT: &str = match option_env!("OPENIM_OBSERVER_COMMIT") {
    Some(commit) => commit,
    None => "unknown",
};

/// Whether the observer can see traffic yet: `/readyz` answers 200 only once it can.
#[derive(Debug, Default)]
pub struct Readiness {
    attached: AtomicBool,
    /// With `--kube`: set until the pod list has loaded, then cleared.
    waiting_for_pods: AtomicBool,
}

impl Readiness {
    /// Says that every program is attached.
    pub fn set_attached(&self) {
        self.attached.store(true, Ordering::Release);
    }

    /// Says whether the pod list is still to load (`--kube`).
    pub fn set_waiting_for_pods(&self, waiting: bool) {
        self.waiting_for_pods.store(waiting, Ordering::Release);
    }

    /// Tells whether every program is attached and, with `--kube`, the pod list has loaded.
    pub fn is_ready(&self) -> bool {
        self.attached.load(Ordering::Acquire) && !self.waiting_for_pods.load(Ordering::Acquire)
    }
}

/// Upper bounds of the `kernel_to_alert_seconds` buckets: ×1.5–2 steps from 100 µs to 100 ms,
/// where alerts land (the 5 ms goal and the first safety drain, 10 ms on, each fall on a
/// bound), then two coarse bounds for alerts that waited on a gateway's answer or a window.
const KERNEL_TO_ALERT_BUCKETS: [f64; 20] = [
    0.0001, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01,
    0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 1.0, 10.0,
];

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
    fn default() -> Self {
        let mut registry = Registry::with_prefix("openim_observer");
        let mut unprefixed = Registry::default();
        unprefixed.register_collector(Box::new(ProcessMetrics));
        let kernel_to_alert_seconds = Histogram::new(KERNEL_TO_ALERT_BUCKETS.iter().copied());
        let mut metrics = Self {
            build_info: register(
                &mut registry,
                "build_info",
                "1, labelled with the observer's version, the commit it was built from and the capture hook in use",
            ),
            events: register(
                &mut registry,
                "events",
                "Capture events read from the kernel",
            ),
            records_dropped: register(
                &mut registry,
                "kernel",
                "Records the kernel programs dropped, by kind: ring_full_drops (the ring buffer was full)",
            ),
            bytes_not_captured: register(
                &mut registry,
                "kernel_bytes_not_captured",
                "Payload bytes a syscall or segment moved that were not copied, whatever the cause (budget, chunk limit, unreadable memory, WebSocket policy)",
            ),
            bytes_over_budget: register(
                &mut registry,
                "kernel_bytes_over_budget",
                "gRPC bytes not copied because the connection's budget was spent (part of kernel_bytes_not_captured)",
            ),
            kernel_failures: register(
                &mut registry,
                "kernel_failures",
                "Kernel-side failures by kind: inserts into a bounded map, copies from user memory",
            ),
            calls_cut: register(
                &mut registry,
                "kernel_calls_cut",
                "Calls whose tail was not copied, by reason: chunk limit, step limit, unreadable user memory",
            ),
            segments: register(
                &mut registry,
                "kernel_segments",
                "Packet hook: segments that arrived out of order (copied at their place), and segments left out because they held only HTTP/2 frames the decoder does not read (not a loss)",
            ),
            runs_skipped: register(
                &mut registry,
                "kernel_program_runs_skipped",
                "Runs of the observer's programs the kernel skipped (recursion), where the kernel counts them",
            ),
            program_runs: register(
                &mut registry,
                "kernel_program_runs",
                "Runs of the observer's programs the kernel timed: only while kernel.bpf_stats_enabled is 1, which the observer leaves as it is",
            ),
            program_seconds: register(
                &mut registry,
                "kernel_program_seconds",
                "CPU time of those runs: the observer's CPU outside its own process, paid inside other processes' syscalls and softirqs",
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
                "Recipients whose message missed real time, by the gateway push sent the message to: one per route_mismatch alert printed, and a fold window's summary adds the repeats it stands for",
            ),
            misrouted_users: register(
                &mut registry,
                "misrouted_users",
                "Users with a route_mismatch alert printed within its fold window: misrouted right now",
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
                "Recipients of push calls checked against the gateways they are placed on, misrouted or not (those without a known placement are not): misrouted_recipients_total's denominator",
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
                "Connections to this endpoint that could not be accepted (e.g. out of file descriptors)",
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
                "Losses counted toward capture_degraded since start, by reason (records, connections or entries)",
            ),
            packet_reorder: register(
                &mut registry,
                "packet_reorder",
                "--capture-hook packets: records held behind a gap in a stream, gaps filled while they waited, gaps given up on (too long or too much held)",
            ),
            push_routing: register(
                &mut registry,
                "push_routing",
                "1 for the gateway service push calls and how it routes a message (ring: one gateway per recipient; broadcast: every recipient to every gateway), once learned from its calls",
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
        let (decode, decode_before) = (
            &engine.connections.decode,
            &previous.engine.connections.decode,
        );
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
        let (routes, routes_before) = (&engine.routes, &previous.engine.routes);
        for (table, now, before) in [
            (
                "connections",
                engine.connections.evicted,
                previous.engine.connections.evicted,
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

    /// Where each capture reason of `capture_degraded` stands, and its totals since start.
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

    /// What `/readyz` answers from, shared with the daemon that sets it.
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

    /// The exposition in `format`.
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

    /// The OpenMetrics exposition.
    pub fn render(&self) -> String {
        self.render_as(Format::OpenMetrics)
    }
}

/// Binds the metrics address now, so a bad address is a startup error rather than a silent
/// background failure.
pub async fn bind(addr: &str) -> Result<TcpListener, MetricsError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError::Bind {
            addr: addr.to_owned(),
            source,
        })
}

/// Connections served at once: each holds a descriptor, and the endpoint must not be the way
/// a neighbour exhausts the observer's.
const MAX_CONCURRENT_CONNECTIONS: usize = 64;
/// One connection's whole exchange; a scraper that stalls must not hold its slot longer.
const CONNECTION_DEADLINE: Duration = Duration::from_secs(5);
/// Under descriptor exhaustion, how long the one connection the reserve lets in may take.
const RESERVE_DEADLINE: Duration = Duration::from_millis(500);
/// Pauses after a failed accept, doubling from the first to the last while failures repeat.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));

/// Serves `GET /metrics`, `/healthz` (liveness) and `/readyz` (readiness) until the task is
/// dropped.
///
/// A failed `accept` (no descriptor left, in this process or the system) is counted and
/// followed by a pause, so that it cannot spin a core. One descriptor is held in reserve: on
/// exhaustion it is given up to let one waiting connection in and answer it, so probes are
/// still answered while something else holds every descriptor.
pub async fn serve(listener: TcpListener, metrics: Arc<Mutex<Metrics>>) {
    let slots = Arc::new(Semaphore::new(MAX_CONCURRENT_CONNECTIONS));
    let mut reserve = File::open("/dev/null").ok();
    let mut backoff = ACCEPT_BACKOFF.0;
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((stream, _)) => {
                backoff = ACCEPT_BACKOFF.0;
                let metrics = Arc::clone(&metrics);
                tokio::spawn(async move {
                    let _ =
                        tokio::time::timeout(CONNECTION_DEADLINE, answer(stream, &metrics)).await;
                    drop(slot);
                });
            }
            Err(error) => {
                if let Ok(metrics) = metrics.lock() {
                    metrics.accept_errors.inc();
                }
                tracing::debug!(%error, "metrics endpoint cannot accept a connection");
                let out_of_descriptors =
                    matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
                if out_of_descriptors && reserve.take().is_some() {
                    let answer_one = async {
                        if let Ok((stream, _)) = listener.accept().await {
                            let _ = answer(stream, &metrics).await;
                        }
                    };
                    let _ = tokio::time::timeout(RESERVE_DEADLINE, answer_one).await;
                    reserve = File::open("/dev/null").ok();
                }
                drop(slot);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF.1);
            }
        }
    }
}

async fn answer(mut stream: TcpStream, metrics: &Mutex<Metrics>) -> std::io::Result<()> {
    let mut request = Vec::with_capacity(1024);
    let mut buffer = [0u8; 1024];
    // A request head is small; stop reading at 8 KiB whatever the peer sends.
    let (path, format) = loop {
        let read = stream.read(&mut buffer).await?;
        if read == 0 {
            return Ok(());
        }
        request.extend_from_slice(&buffer[..read]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut parsed = httparse::Request::new(&mut headers);
        match parsed.parse(&request) {
            Ok(httparse::Status::Complete(_)) => {
                let accept = parsed
                    .headers
                    .iter()
                    .find(|header| header.name.eq_ignore_ascii_case("accept"))
                    .and_then(|header| std::str::from_utf8(header.value).ok());
                break (
                    parsed.path.unwrap_or("/").to_owned(),
                    Format::negotiate(accept),
                );
            }
            Ok(httparse::Status::Partial) if request.len() < 8192 => {}
            _ => return respond(&mut stream, "400 Bad Request", PLAIN, "bad request\n").await,
        }
    };
    match path.as_str() {
        "/metrics" => {
            let body = metrics
                .lock()
                .map(|metrics| metrics.render_as(format))
                .unwrap_or_default();
            respond(&mut stream, "200 OK", format.content_type(), &body).await
        }
        "/healthz" => respond(&mut stream, "200 OK", PLAIN, "ok\n").await,
        "/readyz" => {
            let ready = metrics
                .lock()
                .is_ok_and(|metrics| metrics.readiness.is_ready());
            if ready {
                respond(&mut stream, "200 OK", PLAIN, "ready\n").await
            } else {
                let body = "not ready: programs not attached, or the pod list not loaded\n";
                respond(&mut stream, "503 Service Unavailable", PLAIN, body).await
            }
        }
        _ => respond(&mut stream, "404 Not Found", PLAIN, "try /metrics\n").await,
    }
}

/// The content type of the probes' and errors' bodies.
const PLAIN: &str = "text/plain; charset=utf-8";

async fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[tokio::test]
    async fn serves_metrics_over_http() {
        let listener = bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Arc::new(Mutex::new(Metrics::default()));
        let server = tokio::spawn(serve(listener, metrics));
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
        assert!(
            response.contains("openim_observer_events_total"),
            "{response}"
        );
        server.abort();
    }

    fn route_mismatch(user: &str, gateway: [u8; 4]) -> Alert {
        use crate::{
            alert::{GatewayInfo, PushInfo, RouteMismatch},
            model::{Gateway, GatewayAnswer, MessageIds, MismatchCause, Process},
        };
        let process = Process {
            pid: 1,
            comm: "push".into(),
            cgroup_id: 0,
        };
        let body = RouteMismatch {
            user: user.into(),
            placed_on: Vec::new(),
            pushed_to: PushInfo {
                gateway: GatewayInfo {
                    gateway: Gateway {
                        ip: std::net::IpAddr::from(gateway),
                        port: 10140,
                        name: None,
                    },
                    pod: None,
                },
                method: "OnlinePushMsg".into(),
                message: MessageIds::default(),
                pusher: process.into(),
                answer: GatewayAnswer::EmptyEntry,
                answer_platforms: Vec::new(),
                node: None,
            },
            count: 1,
            window_secs: 60,
            spelling_difference: None,
            cause: MismatchCause::RingSpelling,
        };
        Alert::new(1, AlertBody::RouteMismatch(body))
    }

    #[test]
    fn route_mismatches_count_recipients_by_gateway_and_users_now() {
        let mut metrics = Metrics::default();
        let mut engine = EngineCounters::default();
        engine.routes.push_recipients_judged = 40;
        metrics.update(&KernelCounters::default(), &engine);
        metrics.alert_printed(&route_mismatch("alice", [10, 0, 0, 2]), 0.001);
        metrics.alert_printed(&route_mismatch("alice", [10, 0, 0, 2]), 0.001);
        metrics.alert_printed(&route_mismatch("bob", [10, 0, 0, 3]), 0.001);
        // Bob's window closes on 5 misses in all: the summary adds the 4 repeats.
        let mut summary = route_mismatch("bob", [10, 0, 0, 3]);
        if let AlertBody::RouteMismatch(body) = summary.body_mut() {
            body.count = 5;
        }
        metrics.alert_printed(&summary, 0.001);
        let text = metrics.render();
        for expected in [
            "openim_observer_misrouted_recipients_total{gateway=\"10.0.0.2\"} 2",
            "openim_observer_misrouted_recipients_total{gateway=\"10.0.0.3\"} 5",
            "openim_observer_push_recipients_judged_total 40",
            "openim_observer_misrouted_users 2",
            "openim_observer_alerts_total{kind=\"route_mismatch\"} 4",
        ] {
            assert!(text.contains(expected), "{expected} missing: {text}");
        }
    }

    #[test]
    fn build_info_and_process_series_are_exported() {
        let metrics = Metrics::default();
        metrics.set_capture_hook("packets");
        let text = metrics.render();
        let build_info = format!(
            "openim_observer_build_info{{version=\"{}\",commit=\"{COMMIT}\",capture_hook=\"packets\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&build_info), "{text}");
        for series in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(
                text.lines().any(|line| line.starts_with(series)),
                "{series} missing: {text}"
            );
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    async fn get(addr: std::net::SocketAddr, request: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn the_format_follows_accept_and_readyz_waits_for_attachment() {
        let listener = bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Metrics::default();
        let readiness = metrics.readiness();
        let server = tokio::spawn(serve(listener, Arc::new(Mutex::new(metrics))));
        let openmetrics = get(
            addr,
            "GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n\r\n",
        )
        .await;
        assert!(
            openmetrics.contains(
                "Content-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\n"
            ),
            "{openmetrics}"
        );
        assert!(openmetrics.contains("# TYPE openim_observer_events counter\n"));
        assert!(openmetrics.ends_with("# EOF\n"), "{openmetrics}");
        let text = get(addr, "GET /metrics HTTP/1.1\r\n\r\n").await;
        assert!(
            text.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE openim_observer_events_total counter\n"));
        assert!(!text.contains("# EOF"), "{text}");
        let readyz = "GET /readyz HTTP/1.1\r\n\r\n";
        assert!(get(addr, readyz).await.starts_with("HTTP/1.1 503"));
        readiness.set_waiting_for_pods(true);
        readiness.set_attached();
        assert!(get(addr, readyz).await.starts_with("HTTP/1.1 503"));
        readiness.set_waiting_for_pods(false);
        assert!(get(addr, readyz).await.starts_with("HTTP/1.1 200"));
        let healthz = get(addr, "GET /healthz HTTP/1.1\r\n\r\n").await;
        assert!(healthz.starts_with("HTTP/1.1 200"), "{healthz}");
        server.abort();
    }
}
