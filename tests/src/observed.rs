//! Runs the real `observer` binary beside a lab and scores its alerts against the lab's ground
//! truth. The observer is not told anything about the lab: it watches the kernel like it would
//! on a node.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::Value;

/// The observer process and what it printed, shared with the observer's own kernel tests.
pub use openim_test_kit::observer_process::{ObserverOutput, ObserverProcess};

use crate::Lab;
use crate::lab::LabConfig;
use crate::lab::truth::GroundTruth;
use crate::redis_server::RedisServer;

/// Finds the `observer` binary: `$OBSERVER_BIN`, else the one cargo built beside this executable.
///
/// # Errors
///
/// Fails when `$OBSERVER_BIN` is not set and cargo built no `observer` beside this executable.
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

/// Scrapes the observer's `/metrics` page at `addr`, whole (status line and headers included).
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

/// Returns the value of the series `name` (with its labels, if any) in a scraped `/metrics` page.
pub fn metric_value(scraped: &str, name: &str) -> f64 {
    scraped
        .lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from:\n{scraped}"))
}

/// Runs one observer per simulated node, the way a DaemonSet runs them: each scoped to its node's
/// cgroup (`--cgroup-scope`, so it sees only that node's pods), named after the node and sharing
/// state through a `redis-server` started for them.
pub struct NodeObservers {
    /// (node name, its observer), in node order.
    observers: Vec<(String, ObserverProcess)>,
    /// Last: outlives the observers that talk to it.
    redis: RedisServer,
}

/// Holds what one node's observer printed.
#[derive(Debug)]
pub struct NodeOutput {
    pub node: String,
    pub output: ObserverOutput,
}

impl NodeObservers {
    /// Starts one observer per node of `lab` (which must have more than one node), each with
    /// `args` besides its scope, name and the Redis URL.
    ///
    /// # Errors
    ///
    /// Fails when the lab's `redis-server` does not start, the lab has a single node, a cgroup path
    /// is not UTF-8, or an observer does not start.
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

    /// Returns the Redis the observers share, for tests that inspect or disturb it.
    pub fn redis(&mut self) -> &mut RedisServer {
        &mut self.redis
    }

    /// Stops every observer (all of them, even after one failed) and returns what each
    /// printed, in node order.
    ///
    /// # Errors
    ///
    /// Fails when an observer exits unsuccessfully; the error names its node.
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

/// Says how the observer's per-user alerts compare with what really happened.
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
    /// Scores the per-user `alerts` against `truth`.
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

    /// Counts the alerts of `kind`.
    pub fn count(&self, kind: &str) -> usize {
        self.kinds.get(kind).copied().unwrap_or(0)
    }

    /// Returns the share of alerted users that really missed a message (1 when nothing was
    /// alerted).
    pub fn precision(&self) -> f64 {
        ratio(
            self.alerted.len() - self.false_positives.len(),
            self.alerted.len(),
        )
    }

    /// Returns the share of users that missed a message and were alerted (1 when nobody missed
    /// one).
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
