//! `observer run` (live, needs the kernel programs) and `observer replay` (a recording, no
//! root): both turn events into output lines on stdout.

use std::{
    fs::File,
    io::{self, BufRead, BufReader, BufWriter, Write},
    path::PathBuf,
    time::Duration,
};

use clap::Args;
use thiserror::Error;
use tokio::signal::unix::{SignalKind, signal};

use crate::capture::{
    Event,
    kernel::{CaptureError, CaptureOptions, KernelCapture, KernelCounters},
    recording::{self, RecordingError},
};

/// Version of the JSON objects printed on stdout; bumped when a field changes meaning.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Error)]
pub enum DaemonError {
    #[error(transparent)]
    Capture(#[from] CaptureError),
    #[error(transparent)]
    Recording(#[from] RecordingError),
    #[error("{path}: {source}")]
    File { path: PathBuf, source: io::Error },
    #[error("writing output failed: {0}")]
    Output(io::Error),
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
    /// Bytes captured per direction of each gRPC connection; the rest is counted, not copied.
    #[arg(long, value_name = "BYTES", default_value_t = observer_ebpf::DEFAULT_GRPC_BUDGET)]
    pub grpc_budget: u32,
    /// Size of the kernel→userspace ring buffer (power of two, at least a page). Records that
    /// do not fit are counted as dropped.
    #[arg(long, value_name = "BYTES", default_value_t = 8 << 20)]
    pub ring_bytes: u32,
    /// Print every captured record as one JSON object per line (credentials scrubbed).
    #[arg(long)]
    pub events: bool,
    /// Also write every captured record to FILE, for `observer replay FILE` later.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// Stop after this many seconds (default: run until SIGINT/SIGTERM).
    #[arg(long, value_name = "SECS")]
    pub duration: Option<u64>,
}

#[derive(Args, Debug, Clone)]
pub struct ReplayArgs {
    /// A file written by `observer run --record`.
    pub file: PathBuf,
    /// Print the recorded events themselves, one JSON object per line.
    #[arg(long)]
    pub events: bool,
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
            ring_bytes: self.ring_bytes,
        }
    }
}

/// Where events go once captured or replayed.
struct EventSink {
    stdout: BufWriter<io::Stdout>,
    print_events: bool,
    record: Option<(PathBuf, BufWriter<File>)>,
    events_seen: u64,
}

impl EventSink {
    fn consume(&mut self, event: &Event) -> Result<(), DaemonError> {
        self.events_seen += 1;
        if self.print_events || self.record.is_some() {
            let line = recording::to_json_line(event);
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

    fn flush(&mut self) -> Result<(), DaemonError> {
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
    let record = match &args.record {
        Some(path) => {
            let file = File::create(path).map_err(|source| DaemonError::File {
                path: path.clone(),
                source,
            })?;
            Some((path.clone(), BufWriter::new(file)))
        }
        None => None,
    };
    let mut sink = EventSink {
        stdout: BufWriter::new(io::stdout()),
        print_events: args.events,
        record,
        events_seen: 0,
    };
    let mut capture = KernelCapture::start(&options)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(CaptureError::Read)?;
    let mut terminate = signal(SignalKind::terminate()).map_err(CaptureError::Read)?;
    sink.print_json(&serde_json::json!({
        "kind": "observer_started",
        "schema_version": SCHEMA_VERSION,
        "ts": now_rfc3339(),
        "grpc_ports": options.grpc_ports,
        "ws_ports": options.websocket_ports,
        "grpc_budget": options.grpc_budget,
        "ring_bytes": options.ring_bytes,
        "version": env!("CARGO_PKG_VERSION"),
    }))?;
    tracing::info!(
        grpc_ports = ?options.grpc_ports,
        ws_ports = ?options.websocket_ports,
        "observer attached"
    );

    let deadline = async {
        match args.duration {
            Some(seconds) => tokio::time::sleep(Duration::from_secs(seconds)).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let mut batch = Vec::new();
    let mut malformed_records = 0;
    loop {
        tokio::select! {
            read = capture.read_batch(&mut batch) => {
                malformed_records += read?;
                for event in batch.drain(..) {
                    sink.consume(&event)?;
                }
                sink.flush()?;
            }
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
            () = &mut deadline => break,
        }
    }
    malformed_records += capture.drain(&mut batch);
    for event in batch.drain(..) {
        sink.consume(&event)?;
    }
    let counters = capture.counters()?;
    drop(capture);
    sink.flush()?;
    report_stop(sink.events_seen, malformed_records, &counters);
    Ok(())
}

/// The final counters, on stderr so stdout stays machine-readable.
fn report_stop(events: u64, malformed_records: usize, kernel: &KernelCounters) {
    let line = serde_json::json!({
        "kind": "observer_stopped",
        "events": events,
        "malformed_records": malformed_records,
        "kernel": kernel,
    });
    eprintln!("{line}");
}

pub fn replay(args: ReplayArgs) -> Result<(), DaemonError> {
    let file = File::open(&args.file).map_err(|source| DaemonError::File {
        path: args.file.clone(),
        source,
    })?;
    let mut sink = EventSink {
        stdout: BufWriter::new(io::stdout()),
        print_events: args.events,
        record: None,
        events_seen: 0,
    };
    for (index, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|source| DaemonError::File {
            path: args.file.clone(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let event = recording::from_json_line(&line, index + 1)?;
        sink.consume(&event)?;
    }
    sink.flush()
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string()
}
