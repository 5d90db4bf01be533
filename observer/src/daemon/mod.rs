//! Runs `observer run` (live, needs the kernel programs) and `observer replay` (a recording, no
//! root): both turn events into output lines on stdout. `args` holds their flags, `sink` the
//! path from an event to the lines it prints.

mod args;
mod live;
mod sink;

pub use args::{EngineArgs, ReplayArgs, RunArgs, usage_error_line};
use live::Live;
use sink::EventSink;

use std::{
    fs::File,
    io::{self, BufRead, BufReader},
    path::{Path, PathBuf},
    time::Duration,
};

use thiserror::Error;

use crate::{
    capture::{
        kernel::CaptureError,
        kernel_counters::KernelCounters,
        recording::{self, RecordingError},
        reorder::ReorderCounters,
    },
    cluster::{ClusterError, SharedState, store::StoreError},
    correlate::Engine,
    identity::IdentityError,
    lines::{BoundedLines, LineError},
    metrics::MetricsError,
};

/// Says why `observer run` or `observer replay` stopped early; each text says what to fix.
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

/// Hands the memory freed since the last round back to the node. mimalloc, the binary's
/// allocator, keeps freed pages for reuse until allocation activity purges them, so a quiet
/// observer held what its start had freed (BTF, program loading): 49 MB resident idle, 27 MB
/// with this call each reconciliation round (as with glibc's malloc, which trims on free).
fn release_freed_memory() {
    // SAFETY: `mi_collect` takes no pointer; it walks and purges mimalloc's own state, and is
    // safe to call from any thread at any time.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

/// Sets how often the engine's connections are checked against the kernel's (`Engine::reconcile`):
/// state whose close was lost (a full ring drops records) ends within this long of its socket.
pub const RECONCILE_INTERVAL: Duration = Duration::from_secs(5);

/// Bounds how often a miss in the cgroup index rescans the hierarchy.
const CGROUP_RESCAN_INTERVAL: Duration = Duration::from_secs(10);

/// Runs `observer run`: attaches the kernel programs and prints alert lines until SIGINT,
/// SIGTERM or `--duration`.
///
/// # Errors
///
/// Fails when the programs cannot be set up or read, or stdout cannot be written; see
/// [`DaemonError`].
pub async fn run(args: RunArgs) -> Result<(), DaemonError> {
    let mut live = Live::start(args).await?;
    live.serve().await?;
    live.stop().await
}

/// Prints the final counters, on stderr so stdout stays machine-readable.
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

/// Bounds a recording's lines: a recorded event is one data record of at most a few KiB, base64: a
/// longer line is not one.
pub const MAX_RECORDING_LINE_BYTES: usize = 64 << 10;

/// Runs `observer replay`: reads the recording and prints the alert lines its events raise.
///
/// # Errors
///
/// Fails with [`DaemonError::File`] when the recording cannot be opened,
/// [`DaemonError::Input`] when a line cannot be read, is not UTF-8 or is too long,
/// [`DaemonError::Recording`] when a line is not a recorded event, and [`DaemonError::Output`]
/// when stdout cannot be written.
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
