//! Prometheus metrics on `--metrics-addr`: what the observer read, dropped, failed to decode,
//! tracks and alerted, and how long traffic takes to become an alert.
//!
//! Counters mirror the kernel's and the engine's own totals: `update` adds what grew since the
//! last snapshot, so the exported series are monotonic like Prometheus expects.

use std::{
    fs::File,
    sync::{Arc, Mutex, atomic::AtomicU64},
    time::Duration,
};

use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use thiserror::Error;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::Semaphore,
};

use crate::{
    budget::MemoryCounters,
    capture::{kernel_counters::KernelCounters, reorder::ReorderCounters},
    correlate::{EngineCounters, blindness::ReasonHealth},
};

type Labels = [(&'static str, &'static str); 1];
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
    events: Counter,
    kernel: Family<Labels, Counter>,
    program_runs: Counter,
    program_seconds: Counter<f64, AtomicU64>,
    decode_failures: Family<Labels, Counter>,
    evictions: Family<Labels, Counter>,
    alerts: Family<Labels, Counter>,
    connections_tracked: Gauge,
    users_tracked: Gauge,
    kernel_to_alert_seconds: Histogram,
    accept_errors: Counter,
    memory_budget: Gauge,
    memory_accounted: Family<Labels, Gauge>,
    memory_shed: Family<Labels, Counter>,
    resident_memory: Family<Labels, Gauge>,
    capture_degraded: Family<Labels, Gauge>,
    capture_degraded_episodes: Family<Labels, Gauge>,
    capture_losses: Family<Labels, Gauge>,
    packet_reorder: Family<Labels, Counter>,
    push_routing: Family<RoutingLabels, Gauge>,
    exported: Exported,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("openim_observer");
        let events = Counter::default();
        registry.register(
            "events",
            "Capture events read from the kernel",
            events.clone(),
        );
        let kernel = Family::<Labels, Counter>::default();
        registry.register(
            "kernel",
            "Kernel-side losses by kind: records dropped on a full ring, bytes not captured (budget and policy), map insert and user-memory read failures",
            kernel.clone(),
        );
        let program_runs = Counter::default();
        registry.register(
            "kernel_program_runs",
            "Runs of the observer's programs the kernel timed: only while kernel.bpf_stats_enabled is 1, which the observer leaves as it is",
            program_runs.clone(),
        );
        let program_seconds = Counter::<f64, AtomicU64>::default();
        registry.register(
            "kernel_program_seconds",
            "CPU time of those runs: the observer's CPU outside its own process, paid inside other processes' syscalls and softirqs",
            program_seconds.clone(),
        );
        let decode_failures = Family::<Labels, Counter>::default();
        registry.register(
            "decode_failures",
            "Decoding failures and undecodable streams by layer or reason",
            decode_failures.clone(),
        );
        let evictions = Family::<Labels, Counter>::default();
        registry.register(
            "evictions",
            "Entries a bounded table turned away, by table",
            evictions.clone(),
        );
        let alerts = Family::<Labels, Counter>::default();
        registry.register("alerts", "Alerts printed, by kind", alerts.clone());
        let connections_tracked = Gauge::default();
        registry.register(
            "connections_tracked",
            "Connections being decoded",
            connections_tracked.clone(),
        );
        let users_tracked = Gauge::default();
        registry.register(
            "users_tracked",
            "Users with a live WebSocket placement",
            users_tracked.clone(),
        );
        let kernel_to_alert_seconds = Histogram::new(KERNEL_TO_ALERT_BUCKETS.iter().copied());
        registry.register(
            "kernel_to_alert_seconds",
            "From the traffic that raised an alert to the alert's line on stdout",
            kernel_to_alert_seconds.clone(),
        );
        let accept_errors = Counter::default();
        registry.register(
            "metrics_accept_errors",
            "Connections to this endpoint that could not be accepted (e.g. out of file descriptors)",
            accept_errors.clone(),
        );
        let memory_budget = Gauge::default();
        registry.register(
            "memory_budget_bytes",
            "--memory-budget: what every table and buffer together may hold",
            memory_budget.clone(),
        );
        let memory_accounted = Family::<Labels, Gauge>::default();
        registry.register(
            "memory_accounted_bytes",
            "Estimated bytes held against the memory budget, by table",
            memory_accounted.clone(),
        );
        let memory_shed = Family::<Labels, Counter>::default();
        registry.register(
            "memory_shed",
            "State dropped to keep to the memory budget, by what (least useful first)",
            memory_shed.clone(),
        );
        let resident_memory = Family::<Labels, Gauge>::default();
        registry.register(
            "resident_memory_bytes",
            "The process's resident memory from /proc/self/status, now and at its peak",
            resident_memory.clone(),
        );
        let capture_degraded = Family::<Labels, Gauge>::default();
        registry.register(
            "capture_degraded",
            "1 while capture is degraded for this reason (a capture_degraded episode is open)",
            capture_degraded.clone(),
        );
        let capture_degraded_episodes = Family::<Labels, Gauge>::default();
        registry.register(
            "capture_degraded_episodes",
            "capture_degraded episodes raised since start, by reason",
            capture_degraded_episodes.clone(),
        );
        let capture_losses = Family::<Labels, Gauge>::default();
        registry.register(
            "capture_losses",
            "Losses counted toward capture_degraded since start, by reason (records, connections or entries)",
            capture_losses.clone(),
        );
        let packet_reorder = Family::<Labels, Counter>::default();
        registry.register(
            "packet_reorder",
            "--capture-hook packets: records held behind a gap in a stream, gaps filled while they waited, gaps given up on (too long or too much held)",
            packet_reorder.clone(),
        );
        let push_routing = Family::<RoutingLabels, Gauge>::default();
        registry.register(
            "push_routing",
            "1 for the gateway service push calls and how it routes a message (ring: one gateway per recipient; broadcast: every recipient to every gateway), once learned from its calls",
            push_routing.clone(),
        );
        Self {
            registry,
            packet_reorder,
            push_routing,
            capture_degraded,
            capture_degraded_episodes,
            capture_losses,
            memory_budget,
            memory_accounted,
            memory_shed,
            resident_memory,
            events,
            kernel,
            program_runs,
            program_seconds,
            decode_failures,
            evictions,
            alerts,
            connections_tracked,
            users_tracked,
            kernel_to_alert_seconds,
            accept_errors,
            exported: Exported::default(),
        }
    }
}

impl Metrics {
    /// Brings every series up to the given totals.
    pub fn update(&mut self, kernel: &KernelCounters, engine: &EngineCounters) {
        let previous = &self.exported;
        self.events
            .inc_by(engine.events.saturating_sub(previous.engine.events));
        for (kind, now) in kernel.iter() {
            let before = previous
                .kernel
                .iter()
                .find(|&(known, _)| known == kind)
                .map_or(0, |(_, before)| before);
            self.kernel
                .get_or_create(&[("kind", kind)])
                .inc_by(now.saturating_sub(before));
        }
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

    /// Where each capture reason of `capture_degraded` stands.
    pub fn capture_health(&self, health: &[ReasonHealth]) {
        let gauge = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
        for reason in health {
            let labels = [("reason", reason.reason.name())];
            self.capture_degraded
                .get_or_create(&labels)
                .set(i64::from(reason.degraded));
            self.capture_degraded_episodes
                .get_or_create(&labels)
                .set(gauge(reason.episodes));
            self.capture_losses
                .get_or_create(&labels)
                .set(gauge(reason.events));
        }
    }

    pub fn alert(&self, kind: &'static str, kernel_to_alert_seconds: f64) {
        self.alerts.get_or_create(&[("kind", kind)]).inc();
        self.kernel_to_alert_seconds
            .observe(kernel_to_alert_seconds.max(0.0));
    }

    /// Adds series read at each scrape (cluster mode's Redis health).
    pub fn register_collector(
        &mut self,
        collector: Box<dyn prometheus_client::collector::Collector>,
    ) {
        self.registry.register_collector(collector);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
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

/// Serves `GET /metrics` (and `/healthz` for probes) until the task is dropped.
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
    let path = loop {
        let read = stream.read(&mut buffer).await?;
        if read == 0 {
            return Ok(());
        }
        request.extend_from_slice(&buffer[..read]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut parsed = httparse::Request::new(&mut headers);
        match parsed.parse(&request) {
            Ok(httparse::Status::Complete(_)) => {
                break parsed.path.unwrap_or("/").to_owned();
            }
            Ok(httparse::Status::Partial) if request.len() < 8192 => {}
            _ => return respond(&mut stream, "400 Bad Request", "bad request\n").await,
        }
    };
    match path.as_str() {
        "/metrics" => {
            let body = metrics
                .lock()
                .map(|metrics| metrics.render())
                .unwrap_or_default();
            respond(&mut stream, "200 OK", &body).await
        }
        "/healthz" => respond(&mut stream, "200 OK", "ok\n").await,
        _ => respond(&mut stream, "404 Not Found", "try /metrics\n").await,
    }
}

async fn respond(stream: &mut TcpStream, status: &str, body: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
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
            text.contains("openim_observer_kernel_total{kind=\"program_runs_skipped\"} 6"),
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
            "openim_observer_capture_degraded_episodes{reason=\"ring_full\"} 1",
            "openim_observer_capture_losses{reason=\"ring_full\"} 42",
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
}
