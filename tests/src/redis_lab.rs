//! Runs cluster mode's lab: the lab spread over [`NODES`] simulated nodes (proxy on the first, push
//! on the second, gateways over all three), one unmodified `observer run` per node scoped by
//! `--cgroup-scope` to its node's processes, all sharing one Redis of any topology
//! ([`SharedRedis`]). No node sees both halves of a join, so every `route_mismatch` needs Redis.
//! For tests/cluster_end_to_end.rs and tests/redis_topologies.rs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::observed::{ObserverOutput, ObserverProcess, Score, find_observer_binary};
use crate::redis_topology::SharedRedis;
use crate::{GroundTruth, Lab, LabConfig, ProxyMode, ScenarioStep};

/// Counts the simulated nodes, one observer each.
pub const NODES: usize = 3;
/// Holds the lab's message content (`lab message {seq}`): none of it may reach Redis.
const CONTENT_CANARY: &str = "lab message";
/// Bounds the wait for the nodes to notice Redis's loss or return, which they do within a few
/// seconds (reconnects back off).
const DEGRADED_PATIENCE: Duration = Duration::from_secs(30);
/// Bounds a cluster-wide verdict's time: ring evidence merged every second, rings settled
/// after 3 s.
const VERDICT_SETTLE: Duration = Duration::from_secs(6);

/// Returns the lab of these tests: five gateways, 60 users, two messages each, over [`NODES`]
/// nodes.
pub fn lab(mode: ProxyMode) -> LabConfig {
    LabConfig {
        mode,
        replicas_initial: 5,
        replicas_final: 5,
        users: 60,
        messages_per_user: 2,
        realtime_timeout: Duration::from_secs(2),
        nodes: NODES,
        ..LabConfig::default()
    }
}

/// Holds what a cluster run left: the truth, each node's output (a restarted node's runs in order),
/// the client tokens and Redis's whole content at the end.
pub struct ClusterRun {
    pub truth: GroundTruth,
    pub outputs: Vec<ObserverOutput>,
    pub tokens: Vec<String>,
    pub redis_dump: String,
}

impl ClusterRun {
    /// Returns every node's alerts, node by node.
    pub fn alerts(&self) -> Vec<&Value> {
        self.outputs
            .iter()
            .flat_map(|output| &output.alerts)
            .collect()
    }

    /// Returns the alerts of `kind`.
    pub fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.alerts()
            .into_iter()
            .filter(|alert| alert["kind"] == kind)
            .collect()
    }
}

/// Holds Redis, the node scopes and one observer per node, as a scenario's pause sees them.
pub struct Cluster {
    binary: PathBuf,
    pub redis: SharedRedis,
    /// Each node's cgroup directory, which its observer is scoped to.
    scopes: Vec<PathBuf>,
    pub observers: Vec<ObserverProcess>,
    /// Outputs of observers stopped before the end (restarted nodes).
    pub stopped: Vec<ObserverOutput>,
}

impl Cluster {
    /// Starts node `node`'s observer, scoped to it and sharing state through [`Cluster::redis`].
    pub fn start_observer(&self, node: usize) -> ObserverProcess {
        let scope = self.scopes[node].to_string_lossy().into_owned();
        let name = Lab::node_name(node);
        let redis = self.redis.observer_args();
        let mut args = vec![
            "--grpc-port",
            "88",
            "--ws-port",
            "80",
            "--cgroup-scope",
            &scope,
            "--node-name",
            &name,
        ];
        args.extend(redis.iter().map(String::as_str));
        ObserverProcess::start(&self.binary, &args)
            .unwrap_or_else(|error| panic!("{name}'s observer attaches: {error:#}"))
    }
}

/// Starts one observer per node sharing `redis`, runs the lab's scenario with `between` called
/// after the users connected, and stops everything.
pub fn observe_cluster(
    redis: SharedRedis,
    config: LabConfig,
    between: impl FnOnce(&mut Cluster),
) -> ClusterRun {
    let mut between = Some(between);
    observe_cluster_steps(redis, config, |cluster, step| {
        if step == ScenarioStep::Connected
            && let Some(between) = between.take()
        {
            between(cluster);
        }
    })
}

/// Runs [`observe_cluster`] with `at` called at every step of the scenario: after the users
/// connected, and after each round of pushes.
pub fn observe_cluster_steps(
    redis: SharedRedis,
    config: LabConfig,
    mut at: impl FnMut(&mut Cluster, ScenarioStep),
) -> ClusterRun {
    let binary = find_observer_binary().expect("observer binary");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (truth, tokens, mut cluster) = runtime.block_on(async {
        // The lab makes each node's cgroup; its pods are idle until users connect.
        let mut lab = Lab::start(config).await.expect("lab starts");
        let scopes = (0..NODES)
            .map(|node| lab.node_cgroup(node).expect("a cgroup per node").to_owned())
            .collect();
        let mut cluster = Cluster {
            binary,
            redis,
            scopes,
            observers: Vec::new(),
            stopped: Vec::new(),
        };
        cluster.observers = (0..NODES)
            .map(|node| cluster.start_observer(node))
            .collect();
        let truth = lab
            .run_scenario_with(|_, step| {
                tokio::task::block_in_place(|| at(&mut cluster, step));
                Ok(())
            })
            .await
            .expect("scenario runs");
        // Cluster-wide verdicts wait for the shared ring evidence to be merged (every second)
        // and the rings to settle (3 s), as on a cluster that keeps running.
        tokio::time::sleep(VERDICT_SETTLE).await;
        (truth, lab.client_tokens(), cluster)
    });
    for (node, observer) in cluster.observers.iter_mut().enumerate() {
        assert!(observer.is_running(), "node-{}'s observer exited", node + 1);
    }
    let mut outputs = std::mem::take(&mut cluster.stopped);
    for observer in cluster.observers.drain(..) {
        outputs.push(observer.stop().expect("observer stops cleanly"));
    }
    let redis_dump = cluster.redis.dump().expect("Redis dump");
    ClusterRun {
        truth,
        outputs,
        tokens,
        redis_dump,
    }
}

/// Asserts precision and recall 100%, each mismatch printed once cluster-wide by a node that did
/// not see both halves.
pub fn assert_exact(run: &ClusterRun) {
    let alerts: Vec<Value> = run.alerts().into_iter().cloned().collect();
    let score = Score::new(&run.truth, &alerts);
    assert!(
        score.missed.len() > 20,
        "the lab should lose most users with 5 replicas: {:?}",
        run.truth.summary
    );
    assert!(
        score.false_negatives.is_empty(),
        "missed but not alerted: {:?}\nwhat the observers said about recovery: {:#?}\ntheir truth: \
        {:#?}",
        score.false_negatives,
        run.outputs
            .iter()
            .flat_map(|output| output.stderr.lines())
            .filter(|line| line.contains("recover"))
            .collect::<Vec<_>>(),
        run.truth
            .users
            .iter()
            .filter(|user| score.false_negatives.contains(&user.user_id))
            .collect::<Vec<_>>()
    );
    assert!(
        score.false_positives.is_empty(),
        "alerted but fine: {:?}",
        score.false_positives
    );
    // As on one node: a user's first mismatch at once, then at most one summary of its
    // repeats when the window ends (`count` > 1), each printed by one node only.
    let mut printed: BTreeMap<(&str, bool), usize> = BTreeMap::new();
    for alert in run.of_kind("route_mismatch") {
        let summary = alert["count"].as_u64().unwrap_or(1) > 1;
        *printed
            .entry((alert["user"].as_str().unwrap(), summary))
            .or_default() += 1;
        assert!(alert["node"].is_string(), "{alert}");
    }
    let repeated: Vec<_> = printed.iter().filter(|(_, count)| **count != 1).collect();
    assert!(repeated.is_empty(), "printed more than once: {repeated:?}");
    let firsts = printed.keys().filter(|(_, summary)| !summary).count();
    assert_eq!(
        firsts,
        score.alerted.len(),
        "one first alert per alerted user"
    );
}

/// Asserts one `ring_divergence` cluster-wide, with the right diagnosis.
pub fn assert_one_ring_divergence(run: &ClusterRun) {
    let divergences = run.of_kind("ring_divergence");
    assert_eq!(divergences.len(), 1, "{divergences:#?}");
    assert_eq!(
        divergences[0]["difference"],
        "push members carry ':88', proxy members do not"
    );
    assert_eq!(divergences[0]["proxy_members"].as_array().unwrap().len(), 5);
}

/// Asserts that neither a client token nor message content reached Redis.
pub fn assert_nothing_secret_in_redis(run: &ClusterRun) {
    assert!(!run.redis_dump.is_empty(), "the observers shared something");
    assert!(!run.tokens.is_empty());
    for token in &run.tokens {
        assert!(!run.redis_dump.contains(token.as_str()), "a token in Redis");
    }
    assert!(
        !run.redis_dump.contains(CONTENT_CANARY),
        "message content in Redis"
    );
}

/// Waits for node `node`'s `capture_degraded` (`shared_state_unreachable`) in `state`.
pub fn wait_degraded_state(observer: &mut ObserverProcess, node: usize, state: &str) {
    observer
        .wait_for_line(DEGRADED_PATIENCE, |line| {
            serde_json::from_str::<Value>(line).is_ok_and(|alert| {
                alert["kind"] == "capture_degraded"
                    && alert["reason"] == "shared_state_unreachable"
                    && alert["state"] == state
            })
        })
        .unwrap_or_else(|error| panic!("node-{}: no capture_degraded {state}: {error}", node + 1));
}

/// Waits, after a Redis fault, until no observer is degraded. Lines printed within a few seconds
/// are read first; an observer whose last word on the shared state was `degraded` is waited for
/// until it says `recovered`.
pub fn wait_not_degraded(cluster: &mut Cluster) {
    const SETTLE: Duration = Duration::from_secs(3);
    for (node, observer) in cluster.observers.iter_mut().enumerate() {
        let deadline = Instant::now() + SETTLE;
        while observer
            .next_line(deadline.saturating_duration_since(Instant::now()))
            .is_some()
        {}
        let last = observer.lines().iter().rev().find_map(|line| {
            let alert: Value = serde_json::from_str(line).ok()?;
            (alert["kind"] == "capture_degraded" && alert["reason"] == "shared_state_unreachable")
                .then(|| alert["state"].as_str().map(str::to_owned))
                .flatten()
        });
        // Shown in the test's output: whether this fault was noticed.
        eprintln!(
            "node-{}: shared state last said {}",
            node + 1,
            last.as_deref().unwrap_or("nothing")
        );
        if last.as_deref() == Some("degraded") {
            wait_degraded_state(observer, node, "recovered");
        }
    }
}
