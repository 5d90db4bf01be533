//! Routes events once captured or replayed: to the engine, and optionally stdout and a file;
//! and prints the alerts the engine raises.

use std::{
    fs::File,
    io::{self, BufWriter, Write},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use super::{
    DaemonError,
    args::{EngineArgs, OutputFormat},
    unix_now_ns,
};
use crate::{
    alert::{Alert, LineWriter},
    capture::{kernel_counters::KernelCounters, recording::PrivateLines},
    cluster::{ClusterLink, link::Done},
    correlate::{Engine, blindness::CaptureHealth},
    identity::PodDirectory,
    metrics::Metrics,
    model::Event,
};

/// Bounds the wait, in cluster mode at shutdown, for joins and claims still in flight.
const SETTLE_AT_STOP: Duration = Duration::from_secs(2);
/// Sets how often a stopping observer looks whether the writer has written every fact.
const FACTS_SETTLE_POLL: Duration = Duration::from_millis(2);

/// Holds where events go once captured or replayed: the engine, and optionally stdout and a file.
pub(super) struct EventSink {
    stdout: BufWriter<io::Stdout>,
    /// Writes the alert lines, keeping the JSON of the gateways and processes they name.
    alert_lines: LineWriter,
    /// `--output`: JSON lines, or lines a person reads.
    output: OutputFormat,
    /// The node every alert names: cluster mode's, else `identity::node_name`'s.
    node: String,
    print_events: bool,
    /// `--record`, opened once the capture is attached.
    pub(super) record: Option<(PathBuf, BufWriter<File>)>,
    private_lines: PrivateLines,
    pub(super) engine: Engine,
    pub(super) alerts: Vec<Alert>,
    pub(super) metrics: Option<Arc<Mutex<Metrics>>>,
    /// With `--kube`: names the pods in alerts as they are printed.
    pub(super) pods: Option<PodDirectory>,
    /// Cluster mode: the shared state.
    pub(super) cluster: Option<ClusterLink>,
    /// Live runs: raises `capture_degraded` when capture loses sight of traffic.
    pub(super) health: Option<CaptureHealth>,
}

impl EventSink {
    pub(super) fn new(
        print_events: bool,
        engine: &EngineArgs,
        cluster: Option<ClusterLink>,
    ) -> Self {
        let cluster_node = cluster.as_ref().map(|link| link.node().to_owned());
        let node = cluster_node
            .clone()
            .unwrap_or_else(|| crate::identity::node_name(None));
        Self {
            stdout: BufWriter::new(io::stdout()),
            alert_lines: LineWriter::default(),
            output: engine.output.format(),
            node,
            print_events,
            record: None,
            private_lines: PrivateLines::new(engine.max_connections),
            engine: Engine::new(engine.config(cluster_node)),
            alerts: Vec::new(),
            metrics: None,
            pods: None,
            cluster,
            health: None,
        }
    }

    /// Checks, in live runs once a second, what capture lost since the last check.
    pub(super) fn check_capture(&mut self, now_ns: u64, kernel: &KernelCounters) {
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

    pub(super) fn consume(&mut self, event: &Event) -> Result<(), DaemonError> {
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

    pub(super) fn consume_batch(&mut self, batch: &mut Vec<Event>) -> Result<(), DaemonError> {
        for event in batch.drain(..) {
            self.consume(&event)?;
        }
        Ok(())
    }

    pub(super) fn tick(&mut self, now_ns: u64) {
        self.engine.tick(now_ns, &mut self.alerts);
        if let Some(link) = &mut self.cluster {
            link.tick(now_ns, &mut self.alerts);
        }
    }

    /// Applies, in cluster mode, what the shared state brought back (a join, a claim, ring
    /// evidence).
    pub(super) fn apply(&mut self, done: Done) {
        if let Some(link) = &mut self.cluster {
            link.apply(done, &mut self.engine, &mut self.alerts);
        }
    }

    /// Waits a little, in cluster mode at shutdown, for the joins and claims still in flight, and
    /// for the facts not yet written. A restarted observer recovers this node's placements
    /// from Redis, so one made just before the stop and left on the queue would be a user
    /// whose pushes nobody can judge.
    pub(super) async fn settle(&mut self) -> Result<(), DaemonError> {
        let deadline = tokio::time::Instant::now() + SETTLE_AT_STOP;
        loop {
            self.flush()?;
            let Some(link) = &mut self.cluster else {
                return Ok(());
            };
            if link.outstanding() == 0 {
                if !link.facts_unwritten() || tokio::time::Instant::now() >= deadline {
                    return Ok(());
                }
                // The writer is a task of this runtime: it runs while this one sleeps.
                tokio::time::sleep(FACTS_SETTLE_POLL).await;
                continue;
            }
            match tokio::time::timeout_at(deadline, link.next()).await {
                Ok(done) => self.apply(done),
                Err(_) => return Ok(()),
            }
        }
    }

    pub(super) fn finish(&mut self) {
        self.engine.finish(&mut self.alerts);
    }

    /// Prints the alerts raised so far, then flushes every output.
    pub(super) fn flush(&mut self) -> Result<(), DaemonError> {
        if let Some(link) = &mut self.cluster {
            link.forward(&mut self.engine, &mut self.alerts);
            link.release_won(&mut self.alerts);
        }
        let now_ns = unix_now_ns();
        for mut alert in self.alerts.drain(..) {
            if let Some(pods) = &mut self.pods {
                pods.enrich(&mut alert);
            }
            if alert.node.is_none() {
                alert.node = Some(self.node.clone());
            }
            match self.output {
                OutputFormat::Json => self.alert_lines.write(&alert, &mut self.stdout),
                OutputFormat::Text => {
                    writeln!(self.stdout, "{}", crate::alert::text_line(&alert))
                }
            }
            .map_err(DaemonError::Output)?;
            if let Some(metrics) = &self.metrics
                && let Ok(mut metrics) = metrics.lock()
            {
                let waited_ns = now_ns.saturating_sub(alert.ts_ns);
                metrics.alert_printed(&alert, waited_ns as f64 / 1e9);
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

    pub(super) fn print_json(&mut self, value: &serde_json::Value) -> Result<(), DaemonError> {
        match self.output {
            OutputFormat::Json => writeln!(self.stdout, "{value}"),
            OutputFormat::Text => writeln!(self.stdout, "{}", crate::alert::text_of(value)),
        }
        .map_err(DaemonError::Output)?;
        self.stdout.flush().map_err(DaemonError::Output)
    }
}
