//! Runs the real `observer` binary beside a lab and scores its alerts against the lab's ground
//! truth. The observer is not told anything about the lab: it watches the kernel like it would
//! on a node.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;

use crate::lab::truth::GroundTruth;

/// The `observer` binary: `$OBSERVER_BIN`, else the one cargo built beside this executable.
pub fn find_observer_binary() -> anyhow::Result<PathBuf> {
    crate::sibling_binary("observer", "OBSERVER_BIN")
}

/// A live `observer run`, its stdout (JSON lines) collected on a thread.
pub struct ObserverProcess {
    child: Child,
    lines: Receiver<String>,
    stdout: Vec<String>,
}

/// Everything the observer printed.
#[derive(Debug, Default)]
pub struct ObserverOutput {
    /// Alert objects (stdout lines other than `observer_started`).
    pub alerts: Vec<Value>,
    /// The same alerts, verbatim as printed.
    pub alert_lines: Vec<String>,
    /// Every stdout line, verbatim.
    pub stdout: Vec<String>,
    pub stderr: String,
}

impl ObserverProcess {
    /// Starts `observer run ARGS…` and waits until it reports that it is attached.
    pub fn start(binary: &Path, args: &[&str]) -> anyhow::Result<Self> {
        let mut child = Command::new(binary)
            .arg("run")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("start {}", binary.display()))?;
        let stdout = child.stdout.take().context("observer stdout")?;
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let mut observer = Self {
            child,
            lines,
            stdout: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match observer.lines.recv_timeout(left) {
                Ok(line) => {
                    let started = line.contains("\"observer_started\"");
                    observer.stdout.push(line);
                    if started {
                        return Ok(observer);
                    }
                }
                Err(_) => {
                    let output = observer.stop()?;
                    bail!(
                        "the observer did not attach: {}",
                        output.stderr.lines().last().unwrap_or("no output")
                    );
                }
            }
        }
    }

    /// SIGINT (the observer flushes what it holds back and detaches), then collects.
    pub fn stop(mut self) -> anyhow::Result<ObserverOutput> {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
        let status = self.child.wait().context("wait for the observer")?;
        let mut stderr = String::new();
        if let Some(mut pipe) = self.child.stderr.take() {
            pipe.read_to_string(&mut stderr)
                .context("read observer stderr")?;
        }
        while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(500)) {
            self.stdout.push(line);
        }
        if !status.success() {
            bail!(
                "the observer exited with {status}: {}",
                stderr.lines().last().unwrap_or("")
            );
        }
        let (alerts, alert_lines) = self
            .stdout
            .iter()
            .filter_map(|line| Some((serde_json::from_str::<Value>(line).ok()?, line.clone())))
            .filter(|(value, _)| value["kind"] != "observer_started")
            .unzip();
        Ok(ObserverOutput {
            alerts,
            alert_lines,
            stdout: self.stdout,
            stderr,
        })
    }
}

/// How the observer's per-user alerts compare with what really happened.
#[derive(Debug, Default)]
pub struct Score {
    /// Connected users that missed a message in real time (the lab's ground truth).
    pub missed: BTreeSet<String>,
    /// Users with a `route_mismatch` alert.
    pub alerted: BTreeSet<String>,
    pub false_positives: BTreeSet<String>,
    pub false_negatives: BTreeSet<String>,
    /// Alerts by kind.
    pub kinds: BTreeMap<String, usize>,
}

impl Score {
    pub fn new(truth: &GroundTruth, alerts: &[Value]) -> Self {
        let missed: BTreeSet<String> = truth
            .users
            .iter()
            .filter(|user| user.websocket.is_some())
            .filter(|user| user.pushes.iter().any(|push| !push.arrived_in_time))
            .map(|user| user.user_id.clone())
            .collect();
        let alerted: BTreeSet<String> = alerts
            .iter()
            .filter(|alert| alert["kind"] == "route_mismatch")
            .filter_map(|alert| alert["user"].as_str().map(str::to_owned))
            .collect();
        let mut kinds = BTreeMap::new();
        for alert in alerts {
            if let Some(kind) = alert["kind"].as_str() {
                *kinds.entry(kind.to_owned()).or_insert(0) += 1;
            }
        }
        Self {
            false_positives: alerted.difference(&missed).cloned().collect(),
            false_negatives: missed.difference(&alerted).cloned().collect(),
            missed,
            alerted,
            kinds,
        }
    }

    pub fn count(&self, kind: &str) -> usize {
        self.kinds.get(kind).copied().unwrap_or(0)
    }

    /// Share of alerted users that really missed a message (1 when nothing was alerted).
    pub fn precision(&self) -> f64 {
        ratio(
            self.alerted.len() - self.false_positives.len(),
            self.alerted.len(),
        )
    }

    /// Share of users that missed a message and were alerted (1 when nobody missed one).
    pub fn recall(&self) -> f64 {
        ratio(
            self.missed.len() - self.false_negatives.len(),
            self.missed.len(),
        )
    }
}

fn ratio(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        1.0
    } else {
        part as f64 / whole as f64
    }
}
