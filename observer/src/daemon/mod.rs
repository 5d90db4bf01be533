//! `observer run` (live, needs the kernel programs) and `observer replay` (a recording, no
//! root): both turn events into output lines on stdout. `args` holds their flags, `sink` the
//! path from an event to the lines it prints.

mod args;
mod sink;

pub use args::{EngineArgs, ReplayArgs, RunArgs, usage_error_line};
use sink::EventSink;

use std::{
    fs::File,
    io::{self, BufRead, BufReader, BufWriter},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use thiserror::Error;
use tokio::signal::unix::{SignalKind, signal};

use crate::{
    alert::SCHEMA_VERSION,
    capture::{
        cgroup_scope,
        kernel::{CaptureError, Drained, KernelCapture},
        kernel_counters::KernelCounters,
        read_pacing::{self, ReadPacing},
        recording::{self, RecordingError},
        reorder::ReorderCounters,
    },
    cluster::{
        ClusterError, ClusterLink, SharedState, StoreMetrics, link::Done, store::StoreError,
    },
    correlate::{
        Engine,
        blindness::{BlindnessLimits, CaptureHealth},
    },
    identity::{self, CgroupIndex, IdentityError, PodDirectory},
    lines::{BoundedLines, LineError},
    metrics::{self, Metrics, MetricsError},
    model::{Event, rfc3339},
    openim::diagnosis::CaptureSettings,
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

/// The next answer of the shared state; never, without one.
async fn next_done(cluster: &mut Option<ClusterLink>) -> Done {
    match cluster {
        Some(link) => link.next().await,
        None => std::future::pending().await,
    }
}

/// Hands the memory freed since the last round back to the node. mimalloc, the binary's
/// allocator, keeps freed pages for reuse until allocation activity purges them, so a quiet
/// observer held what its start had freed (BTF, program loading): 49 MB resident idle, 27 MB
/// with this call each reconciliation round (as with glibc's malloc, which trims on free).
fn release_freed_memory() {
    // SAFETY: `mi_collect` takes no pointer; it walks and purges mimalloc's own state, and is
    // safe to call from any thread at any time.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

/// How often the engine's connections are checked against the kernel's (`Engine::reconcile`):
/// state whose close was lost (a full ring drops records) ends within this long of its socket.
pub const RECONCILE_INTERVAL: Duration = Duration::from_secs(5);

/// A miss in the cgroup index rescans the hierarchy at most this often.
const CGROUP_RESCAN_INTERVAL: Duration = Duration::from_secs(10);

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
    // With `--kube`, `/readyz` also waits for the pod lists: the index and its scopes.
    let mut pod_lists = None;
    let pod_watch = if args.kube {
        let client = identity::connect().await?;
        let pods = args.pod_index();
        // On a hybrid node the kernel's cgroup ids are those of the v2 hierarchy at `unified`.
        let cgroups = CgroupIndex::new(
            cgroup_scope::hierarchy_path(&args.cgroup_root),
            CGROUP_RESCAN_INTERVAL,
        );
        sink.pods = Some(PodDirectory::new(Arc::clone(&pods), cgroups));
        let namespaces = args.kube_namespaces.clone();
        pod_lists = Some((Arc::clone(&pods), namespaces.len().max(1)));
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
            if let Some((pods, scopes)) = pod_lists {
                let readiness = metrics.readiness();
                readiness.set_waiting_for_pods(true);
                tokio::spawn(wait_for_pod_lists(readiness, pods, scopes));
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
    let (adopted_grpc, adopted_websockets) = (adopted.grpc, adopted.websocket);
    let mut interrupt = signal(SignalKind::interrupt()).map_err(CaptureError::Read)?;
    let mut terminate = signal(SignalKind::terminate()).map_err(CaptureError::Read)?;
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
        "adopted_connections": {"grpc": adopted_grpc, "websocket": adopted_websockets},
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
    for event in &adopted.events {
        sink.consume(event)?;
    }
    tracing::info!(
        grpc_ports = ?options.grpc_ports,
        ws_ports = ?options.websocket_ports,
        adopted_grpc,
        adopted_websockets,
        not_adopted_outside_scope = adopted.outside_scope,
        capture_hook = capture.capture_hook().name(),
        capture_hook_reason = capture.capture_hook_reason(),
        "observer attached; adopted {} existing connection(s)",
        adopted_grpc + adopted_websockets
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
    // Drains without a wakeup: soon after reading anything (how soon: `pacing`), telling the
    // programs it polls so that records need not wake it; once a drain finds nothing it says
    // it waits for wakeups, drains once more (a record made before that word reached the
    // programs woke no one), and then drains only now and then, less and less often while
    // nothing comes (`ReadPacing::quiet`).
    let drain_timer = tokio::time::sleep(read_pacing::FIRST_QUIET_DRAIN);
    tokio::pin!(drain_timer);
    let mut pacing = ReadPacing::new(std::time::Instant::now());
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
                    let now = tokio::time::Instant::now();
                    let follow_up = keep_polling(&mut capture, &mut pacing, drained.records);
                    drain_timer.as_mut().reset(now + follow_up);
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
                let now = tokio::time::Instant::now();
                let next = if drained.records > 0 {
                    keep_polling(&mut capture, &mut pacing, drained.records)
                } else {
                    pacing.quiet(capture.holds_records())
                };
                drain_timer.as_mut().reset(now + next);
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
                    if let Some(reorder) = capture.reorder_counters() {
                        metrics.update_reorder(&reorder);
                    }
                    if let Some(health) = &sink.health {
                        metrics.capture_health(&health.health());
                    }
                }
            }
            _ = reconcile_timer.tick() => {
                // The records already made first, so a close that did arrive is seen as one.
                let drained =
                    consume_ready(&mut capture, &mut sink, &mut batch, MAX_BATCHES_BEFORE_RECONCILE)?;
                malformed_records += drained.malformed;
                let alive = capture.reconcile();
                sink.engine.reconcile(&alive, unix_now_ns(), &mut sink.alerts);
                sink.flush()?;
                release_freed_memory();
                // A read like any other: a record that woke the reader may be among those just
                // read, and the programs count on a poll for the ones after it; records the
                // reconciliation released wait for the next drain.
                let now = tokio::time::Instant::now();
                if drained.records > 0 {
                    let follow_up = keep_polling(&mut capture, &mut pacing, drained.records);
                    drain_timer.as_mut().reset(now + follow_up);
                } else if capture.holds_records() {
                    drain_timer.as_mut().reset(now + read_pacing::FIRST_QUIET_DRAIN);
                }
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
    capture.release_held(&mut batch);
    sink.consume_batch(&mut batch)?;
    let kernel = capture.counters()?;
    let reorder = capture.reorder_counters();
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
        reorder,
        sink.cluster.as_ref().map(ClusterLink::state),
    );
    Ok(())
}

/// A read found `records`: the reader drains again within the pacing's follow-up, and tells
/// the programs so (records until then need not wake it). Returns the follow-up.
fn keep_polling(capture: &mut KernelCapture, pacing: &mut ReadPacing, records: usize) -> Duration {
    let follow_up = pacing.follow_up(records, std::time::Instant::now());
    capture.reader_polls(follow_up);
    follow_up
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
    reorder: Option<ReorderCounters>,
    shared_state: Option<&SharedState>,
) {
    let mut line = serde_json::json!({
        "kind": "observer_stopped",
        "malformed_records": malformed_records,
        "kernel": kernel,
        "engine": engine.counters(),
        "resident_memory": crate::budget::resident_memory(),
    });
    if let Some(reorder) = reorder {
        line["reorder"] = serde_json::json!(reorder);
    }
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

/// How often the readiness looks at the pod watch until every pod list has loaded.
const POD_LISTS_POLL: Duration = Duration::from_millis(200);

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

pub fn replay(args: ReplayArgs) -> Result<(), DaemonError> {
    let file = File::open(&args.file).map_err(|source| DaemonError::File {
        path: args.file.clone(),
        source,
    })?;
    let mut sink = EventSink::new(args.events, &args.engine, None);
    let replayed = replay_lines(&args.file, BufReader::new(file), &mut sink);
    // The lines before a bad one (a recording cut by a crash or a full disk) are judged to the
    // end, as a whole recording is: fold windows closed, pending calls and rings judged.
    sink.finish();
    sink.flush()?;
    replayed?;
    report_stop(&sink.engine, 0, None, None, None);
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
