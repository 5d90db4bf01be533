//! Runs one observer of cluster mode at the engine, without a kernel: its engine, its link to a
//! shared `redis-server`, and what it printed, linked exactly as `observer run --redis-url` links
//! them (alerts claimed through the link before printing, the link's answers applied as they come,
//! one tick a second). tests/cluster_engine.rs and benches/cluster.rs run two or three of them
//! ("nodes"), each fed only its node's share of synthetic traffic.
//!
//! A harness for tests and benchmarks: it panics when Redis does not answer in time.

use std::time::{Duration, Instant};

use observer::{
    alert::Alert,
    cluster::{ClusterArgs, ClusterLink, keys::DEFAULT_PREFIX, link::Done},
    correlate::{Engine, EngineConfig},
    model::{Event, NANOS_PER_SEC},
};

/// Bounds how long Redis may take to come up, answer, or take the facts written.
const PATIENCE: Duration = Duration::from_secs(10);

/// Holds the daemon's fold window (`--fold-window`), which one `route_mismatch` claim holds.
const FOLD_WINDOW: Duration = Duration::from_secs(60);

/// Holds one node: its engine, its link, and what it printed.
pub struct Node {
    pub engine: Engine,
    pub link: ClusterLink,
    pub printed: Vec<Alert>,
    /// The engine's clock: the latest event fed, moved on by [`Node::pass`].
    pub now_ns: u64,
}

impl Node {
    /// Starts a node named `name` on the Redis at `url`, once its link reports Redis up.
    pub async fn start(url: &str, name: &str) -> Self {
        let config = ClusterArgs {
            redis_url: Some(url.to_owned()),
            redis_prefix: DEFAULT_PREFIX.to_owned(),
            node_name: Some(name.to_owned()),
            redis_queue: 65_536,
            ..ClusterArgs::default()
        }
        .resolve()
        .expect("valid cluster arguments")
        .expect("a Redis URL is given");
        let link = ClusterLink::start(&config, FOLD_WINDOW).expect("the link starts");
        let node = Self {
            engine: Engine::new(EngineConfig {
                node: Some(name.to_owned()),
                ..EngineConfig::default()
            }),
            link,
            printed: Vec::new(),
            now_ns: 0,
        };
        let started = Instant::now();
        while !node.link.state().health().is_up() {
            assert!(started.elapsed() < PATIENCE, "{name}: Redis never came up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        node
    }

    /// Feeds `events` to the engine, as the daemon does, and prints the alerts they raise.
    pub fn feed<'a>(&mut self, events: impl IntoIterator<Item = &'a Event>) {
        let mut alerts = Vec::new();
        for event in events {
            self.now_ns = self.now_ns.max(event.ts_ns);
            self.engine.on_event(event, &mut alerts);
        }
        self.print(alerts);
    }

    /// Does what the daemon does with alerts before printing them: claims through the link, and the
    /// claims won come back without being claimed again.
    fn print(&mut self, mut alerts: Vec<Alert>) {
        self.link.forward(&mut self.engine, &mut alerts);
        self.link.release_won(&mut alerts);
        self.printed.append(&mut alerts);
    }

    /// Runs the daemon's once-a-second tick, at engine time `now_ns`.
    pub fn tick(&mut self, now_ns: u64) {
        self.now_ns = self.now_ns.max(now_ns);
        let mut alerts = Vec::new();
        self.engine.tick(self.now_ns, &mut alerts);
        self.link.tick(self.now_ns, &mut alerts);
        self.print(alerts);
    }

    /// Lets `seconds` of engine time pass (one tick a second, as the daemon does), answering
    /// every lookup and claim on the way.
    pub async fn pass(&mut self, seconds: u64) {
        for _ in 0..seconds {
            self.tick(self.now_ns + NANOS_PER_SEC);
            self.settle().await;
        }
    }

    /// Feeds one answer of the link (a join, a claim, ring evidence) and prints what it raised.
    pub fn apply(&mut self, done: Done) {
        let mut alerts = Vec::new();
        self.link.apply(done, &mut self.engine, &mut alerts);
        self.print(alerts);
    }

    /// Waits until every lookup and claim sent has been answered and applied.
    pub async fn settle(&mut self) {
        while self.link.outstanding() > 0 {
            let done = tokio::time::timeout(PATIENCE, self.link.next())
                .await
                .expect("the shared state answers");
            self.apply(done);
        }
    }

    /// Waits until the facts queued so far are in Redis.
    pub async fn written(&self) {
        let health = self.link.state().health();
        let started = Instant::now();
        while health.counters().queued > 0 || health.counters().facts_written == 0 {
            assert!(started.elapsed() < PATIENCE, "facts never written");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The last batch may be in flight: one more writer round.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
