//! Runs `openim-lab soak` (`cargo xtask soak --minutes N`): the lab at a steady mixed load for
//! minutes, in cluster mode with three simulated nodes (one observer each, sharing one real
//! `redis-server` that is killed and restarted once, halfway), a table of what each observer and
//! Redis hold per interval, and a verdict ([`verdict`]).
//!
//! The load ([`load`]): users reconnect in batches and receive group messages in batches, every
//! tick (a second); the proxy and push agree on the ring (`correct` mode) and push keeps one
//! connection per gateway (3.5.1's push leaks one per call, growth without bound that says
//! nothing about the observer), so what misroutes is the scale-outs: at a tenth of the run and
//! every `scale_every` after, one gateway more, and the users placed before it that the new ring
//! moves miss their pushes until they reconnect. Pushes pause while Redis is down and until
//! every observer said it recovered (meanwhile each node judges alone, as documented).

pub mod alerts;
pub mod load;
pub mod nodes;
pub mod verdict;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::lab::MAX_REPLICAS;
use crate::redis_server::RedisServer;
use crate::soak::alerts::{AlertTally, JUDGE_GRACE};
use crate::soak::load::Load;
use crate::soak::nodes::{NodeObserver, NodeSample};
use crate::soak::verdict::{Evidence, RedisEnd, Row};
use crate::{Lab, LabConfig, ProxyMode};

const NODES: usize = 3;
/// Counts the gateways before the first scale-out: one per node.
const FIRST_REPLICAS: usize = 3;
const TICK: Duration = Duration::from_secs(1);
/// Bounds the wait for the nodes to notice Redis's loss or return, which they do within a few
/// seconds (reconnects back off).
const DEGRADED_PATIENCE: Duration = Duration::from_secs(30);
/// Sets the wait after every node said `recovered`: its placements rewritten and the queue flushed.
const RECOVERY_SETTLE: Duration = Duration::from_secs(3);
/// Bounds the drain after the load stops: the sweeps of the kernel tables (every 10 s) and a
/// reconciliation have passed twice over.
const DRAIN_PATIENCE: Duration = Duration::from_secs(60);
const DRAIN_POLL: Duration = Duration::from_secs(2);

/// Holds what `openim-lab soak` runs.
#[derive(Clone, Debug)]
pub struct SoakConfig {
    pub observer: PathBuf,
    /// How long the load runs (the setup and the drain after come on top).
    pub load: Duration,
    /// One row of the table per interval.
    pub interval: Duration,
    pub users: usize,
    /// Users reconnected, and recipients of the one group message, per tick.
    pub batch: usize,
    /// A scale-out at a tenth of the load, then one every this long.
    pub scale_every: Duration,
    /// Where the observers' stderr is kept.
    pub out_dir: PathBuf,
}

/// Tracks the Redis restart's progress; pushes run only `Before` and `Over`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Outage {
    Before,
    Down(Instant),
    Restarted(Instant),
    Settling(Instant),
    Over,
}

/// Holds the soak's moving parts while the load runs.
struct Soak {
    config: SoakConfig,
    redis: RedisServer,
    nodes: Vec<NodeObserver>,
    names: Vec<String>,
    tally: AlertTally,
    rows: Vec<Row>,
    outage: Outage,
    last_sample: Instant,
    started: Instant,
}

/// Runs the soak, printing the table on stdout as it goes; returns the failing criterion, or
/// `None` when the verdict is clean.
///
/// # Errors
///
/// Fails when the output directory, Redis, the lab, an observer or the load cannot be set up, or
/// the run fails before the verdict.
pub async fn run(config: SoakConfig) -> anyhow::Result<Option<String>> {
    std::fs::create_dir_all(&config.out_dir)
        .with_context(|| format!("creating {}", config.out_dir.display()))?;
    let redis = RedisServer::start().context("start the soak's redis-server")?;
    let mut lab = Lab::start(LabConfig {
        mode: ProxyMode::Correct,
        replicas_initial: FIRST_REPLICAS,
        replicas_final: FIRST_REPLICAS,
        users: config.users,
        nodes: NODES,
        push_reuses_connections: true,
        ..LabConfig::default()
    })
    .await?;
    let mut load = Load::new(config.users, config.batch)?;
    // Each misrouted push prints its own line when the fold window closes before the user's
    // next push, a rotation later.
    let fold_window = (load.rotation_ticks() / 3).max(1).to_string();
    let mut nodes = Vec::new();
    for node in 0..NODES {
        nodes.push(NodeObserver::start(
            &config.observer,
            &lab,
            node,
            &redis.url(),
            &["--fold-window", &fold_window],
            &config.out_dir,
        )?);
    }
    lab.connect_users(0..config.users, false).await;
    eprintln!(
        "openim-lab: soak: lab {}, {} users connected, observers {:?} (fold window {fold_window} \
        s), load for {} s",
        lab.prefix(),
        lab.connected_users(),
        nodes.iter().map(|node| node.pid).collect::<Vec<_>>(),
        config.load.as_secs()
    );
    let mut soak = Soak {
        names: nodes.iter().map(|node| node.name.clone()).collect(),
        config,
        redis,
        nodes,
        tally: AlertTally::default(),
        rows: Vec::new(),
        outage: Outage::Before,
        last_sample: Instant::now(),
        started: Instant::now(),
    };
    println!("{}", table_header());
    soak.run_load(&mut lab, &mut load).await?;
    let gateways = lab.replicas();
    // The load stops: every pod goes, with its sockets.
    drop(lab);
    let end = soak.drain(gateways, &load).await;
    let summary = format!(
        "load: {} group messages, {} reconnects ({} failed), {} push calls failed, {gateways} \
        gateways at the end",
        load.pushes, load.reconnects, load.reconnect_failures, load.push_errors
    );
    soak.finish(end, summary, load.batch())
}

impl Soak {
    async fn run_load(&mut self, lab: &mut Lab, load: &mut Load) -> anyhow::Result<()> {
        let load_time = self.config.load;
        let mut next_scale = self.started + load_time / 10;
        let restart_at = self.started + load_time / 2;
        let mut next_row = self.started + self.config.interval;
        let end = self.started + load_time;
        let mut next_tick = self.started;
        while Instant::now() < end {
            let now = Instant::now();
            if now >= next_scale && lab.replicas() < MAX_REPLICAS {
                lab.scale_to(lab.replicas() + 1).await?;
                next_scale += self.config.scale_every;
            }
            self.step_outage(now, restart_at)?;
            let push = matches!(self.outage, Outage::Before | Outage::Over);
            load.tick(lab, &mut self.tally, push).await?;
            self.read_lines();
            if Instant::now() >= next_row {
                let phase = if push { "load" } else { "redis restart" };
                let done = (load.pushes, load.reconnects);
                let row = self.sample(phase, done, lab.replicas()).await;
                println!("{}", table_row(&self.names, &row));
                self.rows.push(row);
                next_row += self.config.interval;
            }
            next_tick += TICK;
            tokio::time::sleep_until(next_tick.max(Instant::now()).into()).await;
        }
        Ok(())
    }

    /// Kills Redis at `restart_at`, restarts it once every node said it is degraded, and
    /// resumes pushes once every node said it recovered.
    fn step_outage(&mut self, now: Instant, restart_at: Instant) -> anyhow::Result<()> {
        let all = |state| self.tally.nodes_in_state(&self.names, state).len() == self.names.len();
        self.outage = match self.outage {
            Outage::Before if now >= restart_at => {
                eprintln!("openim-lab: soak: Redis killed");
                self.redis.kill();
                Outage::Down(now)
            }
            Outage::Down(since) if all("degraded") || now - since > DEGRADED_PATIENCE => {
                self.redis.restart().context("redis-server restarts")?;
                eprintln!("openim-lab: soak: Redis restarted, empty");
                Outage::Restarted(now)
            }
            Outage::Restarted(since) if all("recovered") || now - since > DEGRADED_PATIENCE => {
                Outage::Settling(now + RECOVERY_SETTLE)
            }
            Outage::Settling(until) if now >= until => Outage::Over,
            unchanged => unchanged,
        };
        Ok(())
    }

    /// Files every line the observers printed since the last call.
    fn read_lines(&mut self) {
        for node in &mut self.nodes {
            for (_, line) in node.process.timed_lines_until(Instant::now()) {
                self.tally.add_line(&node.name, &line);
            }
        }
    }

    /// Samples every observer and Redis; `done` is (pushes, reconnects) so far.
    async fn sample(&mut self, phase: &'static str, done: (usize, usize), gateways: usize) -> Row {
        let since_last = self.last_sample.elapsed();
        self.last_sample = Instant::now();
        let mut nodes = Vec::new();
        for node in &mut self.nodes {
            nodes.push(node.sample(since_last).await);
        }
        Row {
            at_secs: self.started.elapsed().as_secs_f64(),
            phase,
            nodes,
            redis: redis_sample(&self.redis),
            alerts: self.tally.counts(Instant::now()),
            pushes: done.0,
            reconnects: done.1,
            gateways,
        }
    }
}

impl Soak {
    /// Samples until every observer holds nothing, Redis no placement and the last pushes'
    /// [`JUDGE_GRACE`] passed, or [`DRAIN_PATIENCE`] did; prints and returns the last sample.
    async fn drain(&mut self, gateways: usize, load: &Load) -> Row {
        let stopped = Instant::now();
        let mut emptied = None;
        loop {
            tokio::time::sleep(DRAIN_POLL).await;
            self.read_lines();
            let mut row = self
                .sample("after load", (load.pushes, load.reconnects), gateways)
                .await;
            let redis = redis_end(&self.redis);
            let empty = redis.placement_keys == 0
                && row.nodes.iter().all(|node| {
                    node.connections == 0.0 && node.users == 0.0 && node.kernel_entries == 0
                });
            if !empty {
                emptied = None;
            } else if emptied.is_none() {
                emptied = Some(stopped.elapsed());
            }
            // The last pushes' lines are judged missing only once their grace has passed.
            let judged = stopped.elapsed() >= JUDGE_GRACE;
            if (empty && judged) || stopped.elapsed() > DRAIN_PATIENCE {
                row.phase = "after load";
                println!("{}", table_row(&self.names, &row));
                let emptied = emptied.map_or("not within the drain".to_owned(), |at| {
                    format!("{:.0} s after the load stopped", at.as_secs_f64())
                });
                println!(
                    "observers and Redis placements empty: {emptied}; Redis placement keys left \
                    {}, keys without TTL {}",
                    redis.placement_keys, redis.without_ttl
                );
                return row;
            }
        }
    }

    /// Stops the observers and weighs the evidence: prints the summary and the verdict line.
    fn finish(mut self, end: Row, summary: String, batch: usize) -> anyhow::Result<Option<String>> {
        self.read_lines();
        let redis_end = redis_end(&self.redis);
        let mut exited = Vec::new();
        for mut node in std::mem::take(&mut self.nodes) {
            let name = node.name.clone();
            let running = node.process.is_running();
            if let Err(error) = node.stop() {
                eprintln!("openim-lab: soak: {error:#}");
                exited.push(name);
            } else if !running {
                exited.push(name);
            }
        }
        let restart_unseen = self
            .names
            .iter()
            .filter(|node| {
                let states = self.tally.shared_state.get(*node);
                let degraded = states.and_then(|s| s.iter().position(|state| state == "degraded"));
                !degraded.is_some_and(|at| {
                    states.is_some_and(|s| s[at..].iter().any(|state| state == "recovered"))
                })
            })
            .cloned()
            .collect();
        let now = Instant::now();
        let alerts = self.tally.counts(now);
        println!("{summary}");
        println!(
            "alerts: route_mismatch expected {}, printed {}, missed {}, doubled {}, unexpected {}; \
            window summaries {}; other kinds {:?}",
            alerts.expected,
            alerts.printed,
            alerts.missed,
            alerts.doubled,
            alerts.unexpected,
            self.tally.summaries,
            self.tally.other
        );
        let failure = verdict::verdict(&Evidence {
            node_names: &self.names,
            load_rows: &self.rows,
            end: &end,
            redis_end,
            alerts,
            alert_examples: self.tally.examples(now),
            restart_unseen,
            exited,
            batch,
        });
        match &failure {
            None => println!("verdict: pass"),
            Some(criterion) => println!("verdict: FAIL: {criterion}"),
        }
        Ok(failure)
    }
}

/// Samples Redis's `DBSIZE` and `used_memory`, or `None` while it does not answer.
fn redis_sample(redis: &RedisServer) -> Option<(u64, u64)> {
    let mut client = redis.client().ok()?;
    let keys: u64 = redis::cmd("DBSIZE").query(&mut client).ok()?;
    let memory = redis.info("memory").ok()?;
    let used = memory.get("used_memory")?.parse().ok()?;
    Some((keys, used))
}

/// Reads what is left in Redis: placement keys, and keys without a TTL.
fn redis_end(redis: &RedisServer) -> RedisEnd {
    let Ok(keys) = redis.dump() else {
        return RedisEnd {
            placement_keys: usize::MAX,
            without_ttl: usize::MAX,
        };
    };
    RedisEnd {
        placement_keys: keys
            .iter()
            .filter(|stored| {
                (stored.key.contains("{u:") && stored.key.ends_with(":placements"))
                    || (stored.key.contains("{n:") && stored.key.ends_with(":connections"))
            })
            .count(),
        without_ttl: keys.iter().filter(|stored| stored.ttl_ms < 0).count(),
    }
}

/// Returns the table's two header lines.
fn table_header() -> String {
    format!(
        "{:>6} {:<7} {:>7} {:>6} {:>6} {:>6} {:>6} {:>5} {:>6} | {:>6} {:>7} | {:>5} {:>5} {:>5} \
        {:>5} {:>5} | {:>6} {:>7} {:>3} {}\n{}",
        "time",
        "node",
        "rss",
        "cpu",
        "kernel",
        "conns",
        "users",
        "ring",
        "facts",
        "redis",
        "redis",
        "exp",
        "print",
        "miss",
        "dbl",
        "unexp",
        "pushes",
        "reconn",
        "gw",
        "phase",
        format_args!(
            "{:>6} {:<7} {:>7} {:>6} {:>6} {:>6} {:>6} {:>5} {:>6} | {:>6} {:>7} | {:>5} {:>5} \
            {:>5} {:>5} {:>5} |",
            "m:ss",
            "",
            "MiB",
            "%core",
            "entr.",
            "",
            "",
            "drops",
            "drops",
            "keys",
            "MiB",
            "",
            "",
            "",
            "",
            ""
        )
    )
}

/// Formats one table row: a line per node, the cluster-wide columns on the first.
fn table_row(names: &[String], row: &Row) -> String {
    let mut text = String::new();
    for (index, (name, node)) in names.iter().zip(&row.nodes).enumerate() {
        let time = if index == 0 {
            let secs = row.at_secs.round() as u64;
            format!("{}:{:02}", secs / 60, secs % 60)
        } else {
            String::new()
        };
        let _ = write!(text, "{time:>6} {name:<7} {}", node_columns(node));
        if index == 0 {
            let (keys, memory) = match row.redis {
                Some((keys, used)) => (keys.to_string(), format!("{:.2}", used as f64 / 1048576.0)),
                None => ("down".to_owned(), "down".to_owned()),
            };
            let a = row.alerts;
            let _ = write!(
                text,
                " | {keys:>6} {memory:>7} | {:>5} {:>5} {:>5} {:>5} {:>5} | {:>6} {:>7} {:>3} {}",
                a.expected,
                a.printed,
                a.missed,
                a.doubled,
                a.unexpected,
                row.pushes,
                row.reconnects,
                row.gateways,
                row.phase
            );
        }
        if index + 1 < names.len() {
            text.push('\n');
        }
    }
    text
}

fn node_columns(node: &NodeSample) -> String {
    let running = if node.running { "" } else { " EXITED" };
    format!(
        "{:>7.1} {:>6.1} {:>6} {:>6} {:>6} {:>5} {:>6}{running}",
        node.rss_kib as f64 / 1024.0,
        node.cpu_percent,
        node.kernel_entries,
        node.connections,
        node.users,
        node.ring_drops,
        node.facts_dropped
    )
}
