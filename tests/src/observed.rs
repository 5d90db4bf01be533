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

    /// Waits (bounded) for a stdout line that `accept` takes; the line is kept for
    /// [`ObserverProcess::stop`] like every other.
    pub fn wait_for_line(
        &mut self,
        timeout: Duration,
        accept: impl Fn(&str) -> bool,
    ) -> anyhow::Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(line) = self.lines.recv_timeout(left) else {
                bail!("no such observer line within {timeout:?}");
            };
            self.stdout.push(line.clone());
            if accept(&line) {
                return Ok(line);
            }
        }
    }

    /// Whether the process has not exited.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
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

/// The lab's simulated nodes as the kernel can tell them apart: a private cgroup v2 mount with
/// one directory per node, each node's pod processes moved into its directory, so that
/// `observer run --cgroup-scope DIR` sees only that node. Unmounted and removed when dropped.
pub struct NodeScopes {
    mount: PathBuf,
    nodes: Vec<PathBuf>,
}

impl NodeScopes {
    /// Mounts cgroup2 at a fresh temporary directory and creates `node-1` … `node-N` in it.
    pub fn create(nodes: usize) -> anyhow::Result<Self> {
        let mount = std::env::temp_dir().join(format!("openim-lab-cgroup-{}", std::process::id()));
        std::fs::create_dir_all(&mount).with_context(|| format!("create {}", mount.display()))?;
        let status = Command::new("mount")
            .args(["-t", "cgroup2", "none"])
            .arg(&mount)
            .status()
            .context("run mount")?;
        if !status.success() {
            let _ = std::fs::remove_dir(&mount);
            bail!("mount -t cgroup2 at {} failed: {status}", mount.display());
        }
        let mut scopes = Self {
            mount,
            nodes: Vec::new(),
        };
        for node in 0..nodes {
            let dir = scopes.mount.join(crate::Lab::node_name(node));
            // A directory left by an earlier run that was killed is reused.
            if !dir.is_dir() {
                std::fs::create_dir(&dir).with_context(|| format!("create {}", dir.display()))?;
            }
            scopes.nodes.push(dir);
        }
        Ok(scopes)
    }

    /// The cgroup directory of node `node` (0-based), for `--cgroup-scope`.
    pub fn dir(&self, node: usize) -> &Path {
        &self.nodes[node]
    }

    /// Moves every pod process of every node into its node's directory.
    pub fn place(&self, lab: &crate::Lab) -> anyhow::Result<()> {
        for (node, dir) in self.nodes.iter().enumerate() {
            for pid in lab.node_pids(node) {
                std::fs::write(dir.join("cgroup.procs"), pid.to_string())
                    .with_context(|| format!("move pid {pid} into {}", dir.display()))?;
            }
        }
        Ok(())
    }
}

impl Drop for NodeScopes {
    fn drop(&mut self) {
        // A cgroup with processes cannot be removed: hand any survivor back to the root.
        for dir in &self.nodes {
            if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                for pid in procs.lines() {
                    let _ = std::fs::write(self.mount.join("cgroup.procs"), pid);
                }
            }
            let _ = std::fs::remove_dir(dir);
        }
        let _ = Command::new("umount").arg(&self.mount).status();
        let _ = std::fs::remove_dir(&self.mount);
    }
}
