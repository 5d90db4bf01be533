//! `observer run` (live, needs the kernel programs) and `observer replay` (a recording, no
//! root): both turn events into output lines on stdout.

use std::{
    fs::File,
    io::{self, BufRead, BufReader, BufWriter, Write},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use clap::Args;
use thiserror::Error;
use tokio::signal::unix::{SignalKind, signal};

use crate::{
    alert::{Alert, SCHEMA_VERSION},
    budget::MemoryBudget,
    capture::{
        kernel::{
            CaptureError, CaptureOptions, CopyWalk, DRAIN_INTERVAL, Drained, KernelCapture,
            KernelCounters, READ_FOLLOW_UP,
        },
        recording::{self, PrivateLines, RecordingError},
    },
    cluster::{
        ClusterArgs, ClusterError, ClusterLink, SharedState, StoreMetrics, link::Done,
        store::StoreError,
    },
    correlate::{
        Engine, EngineConfig, RouteLimits,
        blindness::{BlindnessLimits, CaptureHealth},
    },
    identity::{self, CgroupIndex, IdentityError, PodDirectory, PodIndex},
    lines::{BoundedLines, LineError},
    metrics::{self, Metrics, MetricsError},
    model::Event,
    openim::diagnosis::CaptureSettings,
    tools::in_range,
};

#[derive(Debug, Error)]
pub enum DaemonError {
    #[error(transparent)]
    Capture(#[from] CaptureError),
    #[error(transparent)]
    Recording(#[from] RecordingError),
    #[error("{path}: {source}")]
    File { path: PathBuf, source: io::Error },
    #[error("{path}: {source}")]
    Input { path: PathBuf, source: LineError },
    #[error("writing output failed: {0}")]
    Output(io::Error),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    SharedState(#[from] StoreError),
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Remote port of the gateways' gRPC server (push → gateway). Repeat for several.
    /// Default: 88.
    #[arg(long = "grpc-port", value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub grpc_ports: Vec<u16>,
    /// Remote port of the gateways' WebSocket server (proxy → gateway). Repeat for several.
    /// Default: 80.
    #[arg(long = "ws-port", value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub websocket_ports: Vec<u16>,
    /// Bytes captured per direction of each gRPC connection in a burst; the budget refills
    /// at --grpc-budget-refill, and what it cuts is counted (`bytes_over_budget`), not copied.
    #[arg(long, value_name = "BYTES", default_value_t = observer_records::DEFAULT_GRPC_BUDGET)]
    pub grpc_budget: u32,
    /// Bytes per second each direction's --grpc-budget regains, so long-lived connections stay
    /// watched while bulk transfers are copied at this rate at most; 0: never (the budget then
    /// counts from a connection's first byte).
    #[arg(long, value_name = "BYTES_PER_SEC", default_value_t = observer_records::DEFAULT_GRPC_BUDGET_REFILL, value_parser = clap::value_parser!(u32).range(0..=i64::from(observer_records::MAX_GRPC_BUDGET_REFILL)))]
    pub grpc_budget_refill: u32,
    /// How the kernel follows a call's iovec entries: `bpf_loop` where the kernel has it
    /// (5.17+), else tail calls. For tests of either on any kernel.
    #[arg(long, value_enum, default_value_t = CopyWalk::Auto, hide = true)]
    pub copy_walk: CopyWalk,
    /// Size of the kernel→userspace ring buffer (power of two, at least a page). Records that
    /// do not fit are counted as dropped.
    #[arg(long, value_name = "BYTES", default_value_t = 8 << 20)]
    pub ring_bytes: u32,
    /// Watched connections (and their descriptors) the kernel's tables hold at once: at least
    /// the WebSockets of the busiest proxy node (one per online user there) plus push's
    /// connections. Each costs about 350 bytes of kernel memory, charged to the pod. A full
    /// table leaves new connections unwatched and says so (`capture_degraded`, `table_full`).
    #[arg(long, value_name = "COUNT", default_value_t = observer_records::DEFAULT_MAX_WATCHED_CONNECTIONS, value_parser = clap::value_parser!(u32).range(64..=(1 << 22)))]
    pub max_watched_connections: u32,
    /// Print every captured record as one JSON object per line (credentials scrubbed).
    #[arg(long)]
    pub events: bool,
    /// Also write every captured record to FILE, for `observer replay FILE` later. Created
    /// mode 0600 once the observer is attached; never through a symbolic link, never over an
    /// existing file unless --overwrite.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// Let --record replace an existing file.
    #[arg(long, requires = "record")]
    pub overwrite: bool,
    /// Stop after this many seconds (default: run until SIGINT/SIGTERM).
    #[arg(long, value_name = "SECS")]
    pub duration: Option<u64>,
    /// Serve Prometheus metrics on this address (`GET /metrics`; `/healthz` for probes).
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<String>,
    /// Name the pods behind gateway IPs and processes in alerts (`"pod":{"namespace","name"}`),
    /// from a watch on the Kubernetes API: the in-cluster service account, else the kubeconfig.
    #[arg(long)]
    pub kube: bool,
    /// Watch only processes inside this cgroup v2 directory (or below it), e.g. the node's
    /// `kubepods`; enforced in the kernel. Repeat for several (at most 16). Default: every
    /// process.
    #[arg(long = "cgroup-scope", value_name = "DIR")]
    pub cgroup_scope: Vec<PathBuf>,
    /// With --kube, the node's cgroup v2 hierarchy, where a process's cgroup leads to its pod.
    #[arg(long, value_name = "DIR", default_value = "/sys/fs/cgroup")]
    pub cgroup_root: PathBuf,
    /// With --kube, pods remembered at most (the Kubernetes limit for one cluster is 150000);
    /// pods beyond it stay unnamed.
    #[arg(long, value_name = "N", default_value_t = 150_000)]
    pub kube_max_pods: usize,
    /// With --kube, watch the pods of this namespace only (repeat for several; default: every
    /// namespace). The namespaces OpenIM runs in are enough, and need only a namespaced Role.
    #[arg(long = "kube-namespace", value_name = "NS", requires = "kube")]
    pub kube_namespaces: Vec<String>,
    /// `capture_degraded`: how much a loss (dropped records, lost or undecodable connections,
    /// evictions, bytes past the capture budget) must grow within one second to be raised.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub degraded_min_events: u64,
    /// `capture_degraded`: seconds without further loss before it is `recovered`.
    #[arg(long, value_name = "SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub degraded_quiet_secs: u64,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Cluster mode, at shutdown: joins and claims still in flight are waited for this long.
const SETTLE_AT_STOP: Duration = Duration::from_secs(2);

/// The next answer of the shared state; never, without one.
async fn next_done(cluster: &mut Option<ClusterLink>) -> Done {
    match cluster {
        Some(link) => link.next().await,
        None => std::future::pending().await,
    }
}

/// How often the engine's connections are checked against the kernel's (`Engine::reconcile`):
/// state whose close was lost (a full ring drops records) ends within this long of its socket.
pub const RECONCILE_INTERVAL: Duration = Duration::from_secs(5);

/// A miss in the cgroup index rescans the hierarchy at most this often.
const CGROUP_RESCAN_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Args, Debug, Clone)]
pub struct ReplayArgs {
    /// A file written by `observer run --record`.
    pub file: PathBuf,
    /// Print the recorded events themselves, one JSON object per line, besides the alerts.
    #[arg(long)]
    pub events: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Bounds and windows of the correlation engine.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// Bytes every table and buffer together may hold (estimated: decoder buffers, connections,
    /// users, pending calls, fold windows). Past it the least useful state is shed and counted.
    /// The default fits the shipped 256 MiB pod limit; deploy/README.md gives the sizing rule.
    #[arg(long, value_name = "BYTES", default_value_t = crate::budget::DEFAULT_MEMORY_BUDGET, value_parser = in_range(1 << 20, 1 << 40))]
    pub memory_budget: usize,
    /// Users with a live WebSocket placement tracked at once (also bounded by
    /// --memory-budget); a full table evicts the users placed longest ago, counted.
    #[arg(long, value_name = "N", default_value_t = 1_000_000, value_parser = in_range(1, 100_000_000))]
    pub max_users: usize,
    /// Connections decoded at once (also bounded by --memory-budget); a full table evicts the
    /// connections idle longest, counted.
    #[arg(long, value_name = "N", default_value_t = 65_536, value_parser = in_range(1, 1 << 24))]
    pub max_connections: usize,
    /// Bytes one connection's decoder buffers per direction at most.
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 20, value_parser = in_range(1 << 10, 1 << 30))]
    pub max_buffered_bytes: usize,
    /// Repeats of one alert (same user and gateways) within this window fold into a count.
    #[arg(long, value_name = "SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub fold_window: u64,
    /// Learned ring membership must hold this long before a divergence is reported.
    #[arg(long, value_name = "SECS", default_value_t = 3, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub ring_settle: u64,
    /// New gRPC connections by one pusher within 10 s that count as churn.
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub churn_min_connections: u64,
}

impl EngineArgs {
    /// `node`: this node's name in cluster mode.
    fn config(&self, node: Option<String>) -> EngineConfig {
        let defaults = EngineConfig::default();
        let memory = MemoryBudget::new(self.memory_budget);
        let max_connections = self.max_connections.min(memory.max_connections());
        EngineConfig {
            routes: RouteLimits {
                max_users: self.max_users.min(memory.max_users()),
                max_tracked_connections: max_connections.saturating_mul(4),
                max_pending_calls: defaults
                    .routes
                    .max_pending_calls
                    .min(memory.max_pending_calls()),
                max_fold_keys: defaults.routes.max_fold_keys.min(memory.max_fold_windows()),
                fold_window_secs: self.fold_window,
                ring_settle_secs: self.ring_settle,
                churn_min_new_connections: self.churn_min_connections,
                ..defaults.routes
            },
            decode: crate::decode::Limits {
                max_buffered_bytes: self.max_buffered_bytes,
                ..defaults.decode
            },
            max_connections,
            memory,
            node,
        }
    }
}

impl RunArgs {
    fn capture_options(&self) -> CaptureOptions {
        let or_default = |ports: &[u16], default: u16| {
            if ports.is_empty() {
                vec![default]
            } else {
                ports.to_vec()
            }
        };
        CaptureOptions {
            grpc_ports: or_default(&self.grpc_ports, 88),
            websocket_ports: or_default(&self.websocket_ports, 80),
            grpc_budget: self.grpc_budget,
            grpc_budget_refill: self.grpc_budget_refill,
            ring_bytes: self.ring_bytes,
            max_watched_connections: self.max_watched_connections,
            cgroup_scope: self.cgroup_scope.clone(),
            copy_walk: self.copy_walk,
        }
    }
}

/// Where events go once captured or replayed: the engine, and optionally stdout and a file.
struct EventSink {
    stdout: BufWriter<io::Stdout>,
    print_events: bool,
    /// `--record`, opened once the capture is attached.
    record: Option<(PathBuf, BufWriter<File>)>,
    private_lines: PrivateLines,
    engine: Engine,
    alerts: Vec<Alert>,
    metrics: Option<Arc<Mutex<Metrics>>>,
    /// With `--kube`: names the pods in alerts as they are printed.
    pods: Option<PodDirectory>,
    /// Cluster mode: the shared state.
    cluster: Option<ClusterLink>,
    /// Live runs: raises `capture_degraded` when capture loses sight of traffic.
    health: Option<CaptureHealth>,
}

impl EventSink {
    fn new(print_events: bool, engine: &EngineArgs, cluster: Option<ClusterLink>) -> Self {
        let node = cluster.as_ref().map(|link| link.node().to_owned());
        Self {
            stdout: BufWriter::new(io::stdout()),
            print_events,
            record: None,
            private_lines: PrivateLines::new(engine.max_connections),
            engine: Engine::new(engine.config(node)),
            alerts: Vec::new(),
            metrics: None,
            pods: None,
            cluster,
            health: None,
        }
    }

    /// Live runs, once a second: what capture lost since the last check.
    fn check_capture(&mut self, now_ns: u64, kernel: &KernelCounters) {
        if let Some(health) = &mut self.health {
            let spots = self.engine.take_blind_spots();
            health.tick(
                now_ns,
                Some(kernel),
                &self.engine.counters(),
                spots,
                &mut self.alerts,
            );
        }
    }

    fn consume(&mut self, event: &Event) -> Result<(), DaemonError> {
        self.engine.on_event(event, &mut self.alerts);
        if self.print_events || self.record.is_some() {
            let line = self.private_lines.line(event);
            if self.print_events {
                writeln!(self.stdout, "{line}").map_err(DaemonError::Output)?;
            }
            if let Some((path, file)) = &mut self.record {
                writeln!(file, "{line}").map_err(|source| DaemonError::File {
                    path: path.clone(),
                    source,
                })?;
            }
        }
        Ok(())
    }

    fn consume_batch(&mut self, batch: &mut Vec<Event>) -> Result<(), DaemonError> {
        for event in batch.drain(..) {
            self.consume(&event)?;
        }
        Ok(())
    }

    fn tick(&mut self, now_ns: u64) {
        self.engine.tick(now_ns, &mut self.alerts);
        if let Some(link) = &mut self.cluster {
            link.tick(now_ns, &mut self.alerts);
        }
    }

    /// Cluster mode: what the shared state brought back (a join, a claim, ring evidence).
    fn apply(&mut self, done: Done) {
        if let Some(link) = &mut self.cluster {
            link.apply(done, &mut self.engine, &mut self.alerts);
        }
    }

    /// Cluster mode, at shutdown: waits a little for the joins and claims still in flight.
    async fn settle(&mut self) -> Result<(), DaemonError> {
        let deadline = tokio::time::Instant::now() + SETTLE_AT_STOP;
        loop {
            self.flush()?;
            let Some(link) = &mut self.cluster else {
                return Ok(());
            };
            if link.outstanding() == 0 {
                return Ok(());
            }
            match tokio::time::timeout_at(deadline, link.next()).await {
                Ok(done) => self.apply(done),
                Err(_) => return Ok(()),
            }
        }
    }

    fn finish(&mut self) {
        self.engine.finish(&mut self.alerts);
    }

    /// Prints the alerts raised so far, then flushes every output.
    fn flush(&mut self) -> Result<(), DaemonError> {
        if let Some(link) = &mut self.cluster {
            link.forward(&mut self.engine, &mut self.alerts);
            link.release_won(&mut self.alerts);
        }
        let now_ns = unix_now_ns();
        for mut alert in self.alerts.drain(..) {
            if let Some(pods) = &mut self.pods {
                pods.enrich(&mut alert);
            }
            alert
                .write_json_line(&mut self.stdout)
                .map_err(DaemonError::Output)?;
            if let Some(metrics) = &self.metrics
                && let Ok(metrics) = metrics.lock()
            {
                let waited_ns = now_ns.saturating_sub(alert.ts_ns);
                metrics.alert(alert.kind(), waited_ns as f64 / 1e9);
            }
        }
        self.stdout.flush().map_err(DaemonError::Output)?;
        if let Some((path, file)) = &mut self.record {
            file.flush().map_err(|source| DaemonError::File {
                path: path.clone(),
                source,
            })?;
        }
        Ok(())
    }

    fn print_json(&mut self, value: &serde_json::Value) -> Result<(), DaemonError> {
        writeln!(self.stdout, "{value}").map_err(DaemonError::Output)?;
        self.stdout.flush().map_err(DaemonError::Output)
    }
}

pub async fn run(args: RunArgs) -> Result<(), DaemonError> {
    let options = args.capture_options();
    // Refused now, created only once attached: a start that fails leaves any file as it was.
    if let Some(path) = &args.record {
        recording::check_target(path, args.overwrite)?;
    }
    let cluster = match args.cluster.resolve()? {
        Some(config) => Some(ClusterLink::start(
            &config,
            Duration::from_secs(args.engine.fold_window),
        )?),
        None => None,
    };
    let mut sink = EventSink::new(args.events, &args.engine, cluster);
    sink.health = Some(CaptureHealth::new(
        BlindnessLimits {
            min_events: args.degraded_min_events,
            quiet_secs: args.degraded_quiet_secs,
            summary_secs: args.engine.fold_window,
        },
        CaptureSettings {
            ring_bytes: options.ring_bytes,
            max_watched_connections: options.max_watched_connections,
            grpc_budget: options.grpc_budget,
            memory_budget: args.engine.memory_budget,
        },
    ));
    let pod_watch = if args.kube {
        let client = identity::connect().await?;
        let pods = PodIndex::shared(args.kube_max_pods);
        let cgroups = CgroupIndex::new(args.cgroup_root.clone(), CGROUP_RESCAN_INTERVAL);
        sink.pods = Some(PodDirectory::new(Arc::clone(&pods), cgroups));
        let namespaces = args.kube_namespaces.clone();
        Some(tokio::spawn(identity::watch_pods(client, pods, namespaces)))
    } else {
        None
    };
    let metrics_server = match &args.metrics_addr {
        Some(addr) => {
            let listener = metrics::bind(addr).await?;
            let mut metrics = Metrics::default();
            if let Some(link) = &sink.cluster {
                metrics.register_collector(Box::new(StoreMetrics(link.state().health())));
            }
            let shared = Arc::new(Mutex::new(metrics));
            sink.metrics = Some(Arc::clone(&shared));
            Some(tokio::spawn(metrics::serve(listener, shared)))
        }
        None => None,
    };
    let mut capture = KernelCapture::start(&options)?;
    if let Some(path) = &args.record {
        let file = recording::create(path, args.overwrite)?;
        sink.record = Some((path.clone(), BufWriter::new(file)));
    }
    // After attaching: a connection made meanwhile is seen connecting, and one that closes
    // meanwhile is found gone by the next reconciliation.
    let adopted = capture.adopt_established(&options);
    let adopted_websockets = adopted
        .iter()
        .filter(|event| event.port_class == crate::model::PortClass::WebSocket)
        .count();
    let adopted_grpc = adopted.len() - adopted_websockets;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(CaptureError::Read)?;
    let mut terminate = signal(SignalKind::terminate()).map_err(CaptureError::Read)?;
    let mut started = serde_json::json!({
        "kind": "observer_started",
        "schema_version": SCHEMA_VERSION,
        "ts": now_rfc3339(),
        "grpc_ports": options.grpc_ports,
        "ws_ports": options.websocket_ports,
        "grpc_budget": options.grpc_budget,
        "grpc_budget_refill": options.grpc_budget_refill,
        "ring_bytes": options.ring_bytes,
        "max_watched_connections": options.max_watched_connections,
        "copy_walk": capture.copy_walk(),
        "memory_budget": args.engine.memory_budget,
        "version": env!("CARGO_PKG_VERSION"),
        "adopted_connections": {"grpc": adopted_grpc, "websocket": adopted_websockets},
    });
    if let Some(link) = &mut sink.cluster {
        started["node"] = link.node().into();
        // After the capture started, so a close racing the recovery is seen.
        started["placements_recovered"] = link.recover(&mut sink.engine).await.into();
    }
    if !options.cgroup_scope.is_empty() {
        started["cgroup_scope"] = serde_json::json!(options.cgroup_scope);
    }
    sink.print_json(&started)?;
    for event in &adopted {
        sink.consume(event)?;
    }
    tracing::info!(
        grpc_ports = ?options.grpc_ports,
        ws_ports = ?options.websocket_ports,
        adopted_grpc,
        adopted_websockets,
        "observer attached; adopted {} existing connection(s)",
        adopted.len()
    );

    let deadline = async {
        match args.duration {
            Some(seconds) => tokio::time::sleep(Duration::from_secs(seconds)).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let mut clock = tokio::time::interval(Duration::from_secs(1));
    let mut reconcile_timer = tokio::time::interval(RECONCILE_INTERVAL);
    reconcile_timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    // Drains without a wakeup: soon after reading anything, telling the programs it polls so
    // that records need not wake it; once a drain finds nothing it says it waits for wakeups,
    // drains once more (a record made before that word reached the programs woke no one), and
    // falls back to the quiet interval.
    let drain_timer = tokio::time::sleep(DRAIN_INTERVAL);
    tokio::pin!(drain_timer);
    let mut batch = Vec::new();
    let mut malformed_records = 0;
    loop {
        tokio::select! {
            read = capture.read_batch(&mut batch) => {
                let drained = read?;
                malformed_records += drained.malformed;
                sink.consume_batch(&mut batch)?;
                sink.flush()?;
                if drained.records > 0 {
                    capture.reader_polls();
                    drain_timer
                        .as_mut()
                        .reset(tokio::time::Instant::now() + READ_FOLLOW_UP);
                }
            }
            () = &mut drain_timer => {
                // One batch: records left beyond it keep the ring readable for the branch above.
                let mut drained = consume_ready(&mut capture, &mut sink, &mut batch, 1)?;
                if drained.records == 0 && capture.reader_waits() {
                    drained = consume_ready(&mut capture, &mut sink, &mut batch, 1)?;
                }
                malformed_records += drained.malformed;
                sink.flush()?;
                let next = if drained.records > 0 {
                    capture.reader_polls();
                    READ_FOLLOW_UP
                } else {
                    DRAIN_INTERVAL
                };
                drain_timer.as_mut().reset(tokio::time::Instant::now() + next);
            }
            _ = clock.tick() => {
                let now_ns = unix_now_ns();
                let kernel = capture.counters()?;
                sink.tick(now_ns);
                sink.check_capture(now_ns, &kernel);
                sink.flush()?;
                if let Some(metrics) = &sink.metrics
                    && let Ok(mut metrics) = metrics.lock()
                {
                    metrics.update(&kernel, &sink.engine.counters());
                    if let Some(health) = &sink.health {
                        metrics.capture_health(&health.health());
                    }
                }
            }
            _ = reconcile_timer.tick() => {
                // The records already made first, so a close that did arrive is seen as one.
                malformed_records +=
                    consume_ready(&mut capture, &mut sink, &mut batch, MAX_BATCHES_BEFORE_RECONCILE)?
                        .malformed;
                let alive = capture.reconcile();
                sink.engine.reconcile(&alive, unix_now_ns(), &mut sink.alerts);
                sink.flush()?;
            }
            done = next_done(&mut sink.cluster) => {
                sink.apply(done);
                sink.flush()?;
            }
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
            () = &mut deadline => break,
        }
    }
    malformed_records +=
        consume_ready(&mut capture, &mut sink, &mut batch, MAX_BATCHES_AT_STOP)?.malformed;
    let kernel = capture.counters()?;
    drop(capture);
    sink.finish();
    sink.settle().await?;
    for task in [metrics_server, pod_watch].into_iter().flatten() {
        task.abort();
    }
    report_stop(
        &sink.engine,
        malformed_records,
        Some(&kernel),
        sink.cluster.as_ref().map(ClusterLink::state),
    );
    Ok(())
}

/// Batches of ring records consumed before a reconciliation (so the closes already made are
/// seen as closes) and at stop (the last records); bounded, since a flood refills the ring as
/// fast as it is read.
const MAX_BATCHES_BEFORE_RECONCILE: usize = 8;
const MAX_BATCHES_AT_STOP: usize = 64;

/// Converts and consumes the records already in the ring, one bounded batch at a time, at most
/// `max_batches` of them; returns what the batches drained, together.
fn consume_ready(
    capture: &mut KernelCapture,
    sink: &mut EventSink,
    batch: &mut Vec<Event>,
    max_batches: usize,
) -> Result<Drained, DaemonError> {
    let mut total = Drained::default();
    for _ in 0..max_batches {
        let drained = capture.drain(batch);
        total.malformed += drained.malformed;
        total.records += drained.records;
        total.more = drained.more;
        sink.consume_batch(batch)?;
        if !drained.more {
            break;
        }
    }
    Ok(total)
}

/// The final counters, on stderr so stdout stays machine-readable.
fn report_stop(
    engine: &Engine,
    malformed_records: usize,
    kernel: Option<&KernelCounters>,
    shared_state: Option<&SharedState>,
) {
    let mut line = serde_json::json!({
        "kind": "observer_stopped",
        "malformed_records": malformed_records,
        "kernel": kernel,
        "engine": engine.counters(),
        "resident_memory": crate::budget::resident_memory(),
    });
    if let Some(state) = shared_state {
        line["shared_state"] = serde_json::json!(state.health().counters());
    }
    eprintln!("{line}");
}

fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
        })
}

/// A recorded event is one data record of at most a few KiB, base64: a longer line is not one.
pub const MAX_RECORDING_LINE_BYTES: usize = 64 << 10;

pub fn replay(args: ReplayArgs) -> Result<(), DaemonError> {
    let file = File::open(&args.file).map_err(|source| DaemonError::File {
        path: args.file.clone(),
        source,
    })?;
    let mut sink = EventSink::new(args.events, &args.engine, None);
    let replayed = replay_lines(&args.file, BufReader::new(file), &mut sink);
    if replayed.is_err() {
        // What the valid lines before the bad one decided is still printed.
        sink.flush()?;
        return replayed;
    }
    sink.finish();
    sink.flush()?;
    report_stop(&sink.engine, 0, None, None);
    Ok(())
}

fn replay_lines(
    path: &Path,
    reader: impl BufRead,
    sink: &mut EventSink,
) -> Result<(), DaemonError> {
    for line in BoundedLines::new(reader, MAX_RECORDING_LINE_BYTES) {
        let (number, line) = line.map_err(|source| DaemonError::Input {
            path: path.to_owned(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let event = recording::from_json_line(&line, number)?;
        sink.consume(&event)?;
        if number % 1024 == 0 {
            sink.flush()?;
        }
    }
    Ok(())
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string()
}
