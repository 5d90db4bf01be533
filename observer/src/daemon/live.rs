//! Runs `observer run` in three steps: [`Live::start`] attaches the kernel programs and
//! announces them, [`Live::serve`] turns what they record into lines until a signal or
//! `--duration` ends it, and [`Live::stop`] reads the last records and reports the counters.

use std::{
    io::BufWriter,
    pin::Pin,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{
    signal::unix::{Signal, SignalKind, signal},
    task::AbortHandle,
    time::{Instant, MissedTickBehavior, Sleep},
};

use super::{
    CGROUP_RESCAN_INTERVAL, DaemonError, RECONCILE_INTERVAL, args::RunArgs, report_stop,
    sink::EventSink, unix_now_ns,
};
use crate::{
    alert::SCHEMA_VERSION,
    capture::{
        adopt::Adoption,
        cgroup_scope,
        kernel::{CaptureError, CaptureOptions, Drained, KernelCapture},
        read_pacing::{self, ReadPacing},
        recording,
    },
    cluster::{ClusterLink, StoreMetrics, link::Done},
    correlate::blindness::{BlindnessLimits, CaptureHealth},
    identity::{self, CgroupIndex, PodDirectory},
    metrics::{self, Metrics},
    model::{Event, rfc3339},
    openim::diagnosis::CaptureSettings,
};

/// Bounds the batches of ring records consumed before a reconciliation (so the closes already made
/// are seen as closes) and at stop (the last records); bounded, since a flood refills the ring as
/// fast as it is read.
const MAX_BATCHES_BEFORE_RECONCILE: usize = 8;
const MAX_BATCHES_AT_STOP: usize = 64;

/// Sets how often the readiness looks at the pod watch until every pod list has loaded.
const POD_LISTS_POLL: Duration = Duration::from_millis(200);

/// Holds the attached programs and everything that turns their records into lines.
pub(super) struct Live {
    capture: KernelCapture,
    sink: EventSink,
    /// The metrics server and the pod watch, aborted at stop.
    tasks: Vec<AbortHandle>,
    interrupt: Signal,
    terminate: Signal,
    duration: Option<Duration>,
    batch: Vec<Event>,
    malformed_records: usize,
    pacing: ReadPacing,
    /// Drains without a wakeup: soon after reading anything (how soon: `pacing`), telling the
    /// programs it polls so that records need not wake it; once a drain finds nothing it says
    /// it waits for wakeups, drains once more (a record made before that word reached the
    /// programs woke no one), and then drains only now and then, less and less often while
    /// nothing comes ([`ReadPacing::quiet`]).
    drain_timer: Pin<Box<Sleep>>,
}

impl Live {
    /// Attaches the programs, adopts the connections already established and prints
    /// `observer_started`.
    ///
    /// # Errors
    ///
    /// Fails when a flag's file, the metrics address, Kubernetes, Redis or the kernel programs
    /// cannot be set up; nothing is left attached then.
    pub(super) async fn start(args: RunArgs) -> Result<Self, DaemonError> {
        let options = args.capture_options();
        // Refused now, created only once attached: a start that fails leaves any file as it was.
        if let Some(path) = &args.record {
            recording::check_target(path, args.overwrite)?;
        }
        let mut sink = new_sink(&args, &options)?;
        let mut tasks = Vec::new();
        let pod_lists = watch_pods(&args, &mut sink, &mut tasks).await?;
        if let Some(addr) = &args.metrics_addr {
            let listener = metrics::bind(addr).await?;
            let shared = new_metrics(&sink, pod_lists);
            sink.metrics = Some(Arc::clone(&shared));
            tasks.push(tokio::spawn(metrics::serve(listener, shared)).abort_handle());
        }
        let mut capture = KernelCapture::start(&options)?;
        if let Some(path) = &args.record {
            let file = recording::create(path, args.overwrite)?;
            sink.record = Some((path.clone(), BufWriter::new(file)));
        }
        // After attaching: a connection made meanwhile is seen connecting, and one that closes
        // meanwhile is found gone by the next reconciliation.
        let adopted = capture.adopt_established(&options);
        let interrupt = signal(SignalKind::interrupt()).map_err(CaptureError::Read)?;
        let terminate = signal(SignalKind::terminate()).map_err(CaptureError::Read)?;
        announce(&args, &options, &capture, &adopted, &mut sink).await?;
        for event in &adopted.events {
            sink.consume(event)?;
        }
        Ok(Self {
            capture,
            sink,
            tasks,
            interrupt,
            terminate,
            duration: args.duration.map(Duration::from_secs),
            batch: Vec::new(),
            malformed_records: 0,
            pacing: ReadPacing::new(std::time::Instant::now()),
            drain_timer: Box::pin(tokio::time::sleep(read_pacing::FIRST_QUIET_DRAIN)),
        })
    }

    /// Reads, judges and prints until SIGINT, SIGTERM or `--duration`.
    ///
    /// # Errors
    ///
    /// Fails when the ring buffer cannot be read or stdout cannot be written.
    pub(super) async fn serve(&mut self) -> Result<(), DaemonError> {
        let duration = self.duration;
        let deadline = async {
            match duration {
                Some(duration) => tokio::time::sleep(duration).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(deadline);
        let mut clock = tokio::time::interval(Duration::from_secs(1));
        let mut reconcile_timer = tokio::time::interval(RECONCILE_INTERVAL);
        reconcile_timer.set_missed_tick_behavior(MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                read = self.capture.read_batch(&mut self.batch) => self.on_read(read?)?,
                () = &mut self.drain_timer => self.on_drain_due()?,
                _ = clock.tick() => self.on_second()?,
                _ = reconcile_timer.tick() => self.on_reconcile_due()?,
                done = next_done(&mut self.sink.cluster) => self.on_shared_state(done)?,
                _ = self.interrupt.recv() => break,
                _ = self.terminate.recv() => break,
                () = &mut deadline => break,
            }
        }
        Ok(())
    }

    /// Reads the records left, detaches the programs, judges what is pending and prints
    /// `observer_stopped` on stderr.
    ///
    /// # Errors
    ///
    /// Fails when the last records cannot be read or the last lines cannot be written.
    pub(super) async fn stop(mut self) -> Result<(), DaemonError> {
        let drained = self.consume_ready(MAX_BATCHES_AT_STOP)?;
        self.malformed_records += drained.malformed;
        let Self {
            mut capture,
            mut sink,
            mut batch,
            tasks,
            malformed_records,
            ..
        } = self;
        capture.release_held(&mut batch);
        sink.consume_batch(&mut batch)?;
        let kernel = capture.counters()?;
        let reorder = capture.reorder_counters();
        drop(capture);
        sink.finish();
        sink.settle().await?;
        for task in tasks {
            task.abort();
        }
        report_stop(
            &sink.engine,
            malformed_records,
            Some(&kernel),
            reorder,
            sink.cluster.as_ref().map(ClusterLink::state),
        );
        Ok(())
    }

    /// Consumes what a wakeup read, and drains again soon if it read anything.
    fn on_read(&mut self, drained: Drained) -> Result<(), DaemonError> {
        self.malformed_records += drained.malformed;
        self.sink.consume_batch(&mut self.batch)?;
        self.sink.flush()?;
        if drained.records > 0 {
            self.keep_polling(drained.records);
        }
        Ok(())
    }

    /// Drains one batch without a wakeup; when nothing came, sets the next drain further away.
    fn on_drain_due(&mut self) -> Result<(), DaemonError> {
        // One batch: records left beyond it keep the ring readable for `on_read`.
        let mut drained = self.consume_ready(1)?;
        if drained.records == 0 && self.capture.reader_waits() {
            drained = self.consume_ready(1)?;
        }
        self.malformed_records += drained.malformed;
        self.sink.flush()?;
        if drained.records > 0 {
            self.keep_polling(drained.records);
        } else {
            let now = Instant::now();
            let next = self.pacing.quiet(self.capture.holds_records());
            self.drain_timer.as_mut().reset(now + next);
        }
        Ok(())
    }

    /// Closes the fold windows that are due, checks the capture's health and updates the
    /// metrics, once a second.
    fn on_second(&mut self) -> Result<(), DaemonError> {
        let now_ns = unix_now_ns();
        let kernel = self.capture.counters()?;
        self.sink.tick(now_ns);
        self.sink.check_capture(now_ns, &kernel);
        self.sink.flush()?;
        if let Some(metrics) = &self.sink.metrics
            && let Ok(mut metrics) = metrics.lock()
        {
            metrics.update(&kernel, &self.sink.engine.counters());
            if let Some(reorder) = self.capture.reorder_counters() {
                metrics.update_reorder(&reorder);
            }
            if let Some(health) = &self.sink.health {
                metrics.capture_health(&health.health());
            }
        }
        Ok(())
    }

    /// Ends the engine's connections whose sockets the kernel no longer holds.
    fn on_reconcile_due(&mut self) -> Result<(), DaemonError> {
        // The records already made first, so a close that did arrive is seen as one.
        let drained = self.consume_ready(MAX_BATCHES_BEFORE_RECONCILE)?;
        self.malformed_records += drained.malformed;
        let alive = self.capture.reconcile();
        self.sink
            .engine
            .reconcile(&alive, unix_now_ns(), &mut self.sink.alerts);
        self.sink.flush()?;
        super::release_freed_memory();
        // A read like any other: a record that woke the reader may be among those just read,
        // and the programs count on a poll for the ones after it; records the reconciliation
        // released wait for the next drain.
        if drained.records > 0 {
            self.keep_polling(drained.records);
        } else if self.capture.holds_records() {
            let now = Instant::now();
            self.drain_timer
                .as_mut()
                .reset(now + read_pacing::FIRST_QUIET_DRAIN);
        }
        Ok(())
    }

    /// Applies an answer of the shared state (cluster mode).
    fn on_shared_state(&mut self, done: Done) -> Result<(), DaemonError> {
        self.sink.apply(done);
        self.sink.flush()?;
        Ok(())
    }

    /// Drains again within the pacing's follow-up after a read found `records`, and tells the
    /// programs so (records until then need not wake the reader).
    fn keep_polling(&mut self, records: usize) {
        let now = Instant::now();
        let follow_up = self.pacing.follow_up(records, std::time::Instant::now());
        self.capture.reader_polls(follow_up);
        self.drain_timer.as_mut().reset(now + follow_up);
    }

    /// Converts and consumes the records already in the ring, one bounded batch at a time, at
    /// most `max_batches` of them; returns what the batches drained, together.
    fn consume_ready(&mut self, max_batches: usize) -> Result<Drained, DaemonError> {
        let mut total = Drained::default();
        for _ in 0..max_batches {
            let drained = self.capture.drain(&mut self.batch);
            total.malformed += drained.malformed;
            total.records += drained.records;
            total.more = drained.more;
            self.sink.consume_batch(&mut self.batch)?;
            if !drained.more {
                break;
            }
        }
        Ok(total)
    }
}

/// Creates the sink of `observer run`: cluster mode's link when configured, and the capture's
/// health with the limits it judges by.
fn new_sink(args: &RunArgs, options: &CaptureOptions) -> Result<EventSink, DaemonError> {
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
    Ok(sink)
}

/// Starts the pod watch with `--kube`, giving the sink the directory it fills; returns the
/// pods and how many lists `/readyz` waits for.
async fn watch_pods(
    args: &RunArgs,
    sink: &mut EventSink,
    tasks: &mut Vec<AbortHandle>,
) -> Result<Option<(identity::SharedPods, usize)>, DaemonError> {
    if !args.kube {
        return Ok(None);
    }
    let client = identity::connect().await?;
    let pods = args.pod_index();
    // On a hybrid node the kernel's cgroup ids are those of the v2 hierarchy at `unified`.
    let cgroups = CgroupIndex::new(
        cgroup_scope::hierarchy_path(&args.cgroup_root),
        CGROUP_RESCAN_INTERVAL,
    );
    sink.pods = Some(PodDirectory::new(Arc::clone(&pods), cgroups));
    let namespaces = args.kube_namespaces.clone();
    let scopes = namespaces.len().max(1);
    let watch = identity::watch_pods(client, Arc::clone(&pods), namespaces);
    tasks.push(tokio::spawn(watch).abort_handle());
    Ok(Some((pods, scopes)))
}

/// Creates the metrics: the shared state's health in cluster mode, and a readiness that also
/// waits for the pod lists with `--kube`.
fn new_metrics(
    sink: &EventSink,
    pod_lists: Option<(identity::SharedPods, usize)>,
) -> Arc<Mutex<Metrics>> {
    let mut metrics = Metrics::default();
    if let Some(link) = &sink.cluster {
        metrics.register_collector(Box::new(StoreMetrics(link.state().health())));
    }
    if let Some((pods, scopes)) = pod_lists {
        let readiness = metrics.readiness();
        readiness.set_waiting_for_pods(true);
        tokio::spawn(wait_for_pod_lists(readiness, pods, scopes));
    }
    Arc::new(Mutex::new(metrics))
}

/// Prints `observer_started` (after recovering cluster mode's placements) and turns `/readyz`
/// ready.
async fn announce(
    args: &RunArgs,
    options: &CaptureOptions,
    capture: &KernelCapture,
    adopted: &Adoption,
    sink: &mut EventSink,
) -> Result<(), DaemonError> {
    let mut started = serde_json::json!({
        "kind": "observer_started",
        "schema_version": SCHEMA_VERSION,
        "ts": rfc3339(unix_now_ns()),
        "grpc_ports": options.grpc_ports,
        "ws_ports": options.websocket_ports,
        "grpc_budget": options.grpc_budget,
        "grpc_budget_refill": options.grpc_budget_refill,
        "ring_bytes": options.ring_bytes,
        "max_watched_connections": options.max_watched_connections,
        "capture_hook": capture.capture_hook(),
        "capture_hook_reason": capture.capture_hook_reason(),
        "copy_walk": capture.copy_walk(),
        "state_tracepoint": capture.state_tracepoint(),
        "memory_budget": args.engine.memory_budget,
        "version": env!("CARGO_PKG_VERSION"),
        "adopted_connections": {"grpc": adopted.grpc, "websocket": adopted.websocket},
        "node": identity::node_name(args.cluster.node_name.as_deref()),
    });
    if let Some(link) = &mut sink.cluster {
        started["node"] = link.node().into();
        // After the capture started, so a close racing the recovery is seen.
        started["placements_recovered"] = link.recover(&mut sink.engine).await.into();
    }
    if !options.cgroup_scope.is_empty() {
        started["cgroup_scope"] = serde_json::json!(options.cgroup_scope);
        started["adopted_connections"]["outside_scope"] = adopted.outside_scope.into();
    }
    if let Some(metrics) = &sink.metrics
        && let Ok(metrics) = metrics.lock()
    {
        // Every program is attached: `/readyz` turns ready (with `--kube`, once the pod lists
        // have loaded too), before `observer_started` says so.
        metrics.set_capture_hook(capture.capture_hook().name());
        metrics.readiness().set_attached();
    }
    sink.print_json(&started)?;
    tracing::info!(
        grpc_ports = ?options.grpc_ports,
        ws_ports = ?options.websocket_ports,
        adopted_grpc = adopted.grpc,
        adopted_websockets = adopted.websocket,
        not_adopted_outside_scope = adopted.outside_scope,
        capture_hook = capture.capture_hook().name(),
        capture_hook_reason = capture.capture_hook_reason(),
        "observer attached; adopted {} existing connection(s)",
        adopted.grpc + adopted.websocket
    );
    Ok(())
}

/// Waits for the next answer of the shared state, or forever without cluster mode.
async fn next_done(cluster: &mut Option<ClusterLink>) -> Done {
    match cluster {
        Some(link) => link.next().await,
        None => std::future::pending().await,
    }
}

/// Clears `/readyz`'s wait for the pods once each of the watch's `scopes` has loaded its list.
async fn wait_for_pod_lists(
    readiness: Arc<metrics::Readiness>,
    pods: identity::SharedPods,
    scopes: usize,
) {
    loop {
        // A poisoned lock still holds a count worth reading.
        let loaded = pods
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .lists_loaded();
        if loaded >= scopes {
            readiness.set_waiting_for_pods(false);
            return;
        }
        tokio::time::sleep(POD_LISTS_POLL).await;
    }
}
