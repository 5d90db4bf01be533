//! Runs the real `observer` binary beside a lab and scores its alerts against the lab's ground
//! truth. The observer is not told anything about the lab: it watches the kernel like it would
//! on a node.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use serde_json::Value;

use crate::Lab;
use crate::lab::LabConfig;
use crate::lab::truth::GroundTruth;
use crate::redis_server::RedisServer;

/// The `observer` binary: `$OBSERVER_BIN`, else the one cargo built beside this executable.
pub fn find_observer_binary() -> anyhow::Result<PathBuf> {
    crate::sibling_binary("observer", "OBSERVER_BIN")
}

/// Starts the observer on the lab's gateway ports (88 and 80) with `flags` added, runs the lab
/// scenario beside it, stops the observer.
pub fn observe_lab(config: LabConfig, flags: &[&str]) -> (GroundTruth, ObserverOutput) {
    let observer_binary = find_observer_binary().expect("observer binary");
    let args = [&["--grpc-port", "88", "--ws-port", "80"][..], flags].concat();
    let observer = ObserverProcess::start(&observer_binary, &args)
        .expect("observer attaches (root with BPF needed)");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let truth = runtime.block_on(async {
        let mut lab = Lab::start(config).await.expect("lab starts");
        lab.run_scenario().await.expect("scenario runs")
    });
    let output = observer.stop().expect("observer stops cleanly");
    (truth, output)
}

/// The observer's `/metrics` page at `addr`, whole (status line and headers included).
pub async fn scrape_metrics(addr: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("metrics port");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: observer\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
    response
}

/// The value of the series `name` (with its labels, if any) in a scraped `/metrics` page.
pub fn metric_value(scraped: &str, name: &str) -> f64 {
    scraped
        .lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from:\n{scraped}"))
}

/// A live `observer run`, its stdout (JSON lines) collected on a thread.
pub struct ObserverProcess {
    child: Child,
    /// Each line with the time the reading thread got it.
    lines: Receiver<(SystemTime, String)>,
    stdout: Vec<String>,
    /// Waited for: nothing left to kill on drop.
    exited: bool,
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

impl ObserverOutput {
    /// The `observer_stopped` line (its counters) from stderr.
    pub fn stopped_line(&self) -> Value {
        self.stderr
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .find(|line| line["kind"] == "observer_stopped")
            .unwrap_or_else(|| panic!("no observer_stopped line in:\n{}", self.stderr))
    }
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
                if sender.send((SystemTime::now(), line)).is_err() {
                    break;
                }
            }
        });
        let mut observer = Self {
            child,
            lines,
            stdout: Vec::new(),
            exited: false,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match observer.lines.recv_timeout(left) {
                Ok((_, line)) => {
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

    /// Where its kernel programs copy the bytes, and why: `observer_started`'s `capture_hook`
    /// and `capture_hook_reason`, as "packets (auto: …)".
    pub fn capture_hook(&self) -> String {
        let started = self
            .stdout
            .iter()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .find(|line| line["kind"] == "observer_started")
            .unwrap_or_default();
        format!(
            "{} ({})",
            started["capture_hook"].as_str().unwrap_or("?"),
            started["capture_hook_reason"].as_str().unwrap_or("?")
        )
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
            let Ok((_, line)) = self.lines.recv_timeout(left) else {
                bail!("no such observer line within {timeout:?}");
            };
            self.stdout.push(line.clone());
            if accept(&line) {
                return Ok(line);
            }
        }
    }

    /// The lines printed until `until`, each with the time it was read (kept for
    /// [`ObserverProcess::stop`] too).
    pub fn timed_lines_until(&mut self, until: Instant) -> Vec<(SystemTime, String)> {
        let mut lines = Vec::new();
        while let Ok((read_at, line)) = self
            .lines
            .recv_timeout(until.saturating_duration_since(Instant::now()))
        {
            self.stdout.push(line.clone());
            lines.push((read_at, line));
        }
        lines
    }

    /// Stops the observer (SIGSTOP) until `resume`, as on a node that gives it no CPU: nothing
    /// reads its ring meanwhile, so the programs drop the records that do not fit.
    pub fn pause(&self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGSTOP) };
    }

    /// Lets a paused observer run again (SIGCONT).
    pub fn resume(&self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGCONT) };
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
        self.exited = true;
        let mut stderr = String::new();
        if let Some(mut pipe) = self.child.stderr.take() {
            pipe.read_to_string(&mut stderr)
                .context("read observer stderr")?;
        }
        while let Ok((_, line)) = self.lines.recv_timeout(Duration::from_millis(500)) {
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
            stdout: std::mem::take(&mut self.stdout),
            stderr,
        })
    }
}

/// An observer dropped without `stop` (a failed start beside it, a test that panicked) must
/// not keep its programs attached under the next test.
impl Drop for ObserverProcess {
    fn drop(&mut self) {
        if !self.exited {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One observer per simulated node, the way a DaemonSet runs them: each scoped to its node's
/// cgroup (`--cgroup-scope`, so it sees only that node's pods), named after the node and
/// sharing state through a `redis-server` started for them.
pub struct NodeObservers {
    /// (node name, its observer), in node order.
    observers: Vec<(String, ObserverProcess)>,
    /// Last: outlives the observers that talk to it.
    redis: RedisServer,
}

/// What one node's observer printed.
#[derive(Debug)]
pub struct NodeOutput {
    pub node: String,
    pub output: ObserverOutput,
}

impl NodeObservers {
    /// Starts one observer per node of `lab` (which must have more than one node), each with
    /// `args` besides its scope, name and the Redis URL.
    pub fn start(binary: &Path, lab: &Lab, args: &[&str]) -> anyhow::Result<Self> {
        let redis = RedisServer::start().context("start the lab's redis-server")?;
        let url = redis.url();
        let mut observers = Vec::new();
        for node in 0..lab.nodes() {
            let name = Lab::node_name(node);
            let scope = lab
                .node_cgroup(node)
                .context("node observers need a lab with more than one node")?
                .to_str()
                .context("cgroup path is not UTF-8")?
                .to_owned();
            let mut node_args = args.to_vec();
            node_args.extend([
                "--cgroup-scope",
                scope.as_str(),
                "--node-name",
                name.as_str(),
                "--redis-url",
                url.as_str(),
            ]);
            let observer = ObserverProcess::start(binary, &node_args)
                .with_context(|| format!("observer of {name}"))?;
            observers.push((name, observer));
        }
        Ok(Self { observers, redis })
    }

    /// The Redis the observers share, for tests that inspect or disturb it.
    pub fn redis(&mut self) -> &mut RedisServer {
        &mut self.redis
    }

    /// Stops every observer (all of them, even after one failed) and returns what each
    /// printed, in node order.
    pub fn stop(self) -> anyhow::Result<Vec<NodeOutput>> {
        let stopped: Vec<anyhow::Result<NodeOutput>> = self
            .observers
            .into_iter()
            .map(|(node, observer)| {
                let output = observer
                    .stop()
                    .with_context(|| format!("observer of {node}"))?;
                Ok(NodeOutput { node, output })
            })
            .collect();
        stopped.into_iter().collect()
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
