//! Cluster mode against single-node mode (issue 11), on the same synthetic misrouting: one
//! engine fed all of the traffic, against a proxy node and a push node sharing one real
//! `redis-server`, each fed only its node's share and linked exactly as `observer run
//! --redis-url` links them ([`Node`]). Prints figures; asserts nothing about speed.
//!
//! Each mode runs twice, placements (flat out) then push calls at one of two paces, each time on
//! fresh engines and a fresh Redis:
//! - flat out: batches of [`BATCH`] events as fast as the engine takes them, to measure its
//!   throughput. The push node waits for answers when [`MAX_OUTSTANDING`] lookups and claims are
//!   in flight: the daemon does not wait, but the link answers lookups beyond its queue with
//!   nothing, so this is the fastest rate at which every push is still judged.
//! - on the capture's timeline, sped up `CLUSTER_BENCH_SPEED` times (default 4), each event fed
//!   when due: a steady push rate, to measure the detection latency without queueing.
//!
//! Counted: round trips are the push node's `redis_round_trips` counter (every pipeline or
//! command its link sent: placement lookups, ring-member writes, dedup claims, ring-evidence
//! reads, and the once-a-second PING probe, shown apart); commands are what Redis executed
//! (`INFO commandstats`, zeroed before the push phase, the proxy node stopped by then), by name.
//! A push call is one gRPC `SuperGroupOnlineBatchPushOneMsg` request, what the engine judges. The
//! detection latency runs from the arrival at the push node's engine of the batch holding the
//! call's answer (which the judgment waits for) to its first `route_mismatch` being printed
//! (rendered as its JSON line), after the placement lookup and the dedup claim; in both modes it
//! includes the message window that holds a miss for the message's other calls. What cluster
//! mode adds is therefore also measured mismatch by mismatch on the timeline: both modes are fed
//! the same events at the same offsets from their start, so the difference between their print
//! times is the lookup and the claim ([`added_latency`]).
//!
//! Run with `cargo bench -p tests --bench cluster`. Needs `redis-server` (skipped without);
//! no root and no eBPF.

use std::{
    collections::{BTreeMap, HashMap},
    hint::black_box,
    net::IpAddr,
    time::{Duration, Instant},
};

use futures_util::FutureExt;
use hdrhistogram::Histogram;
use observer::{
    alert::{Alert, AlertBody, RouteMismatch},
    correlate::{Engine, EngineConfig},
    model::{Event, NANOS_PER_SEC, PortClass},
};
use openim_test_kit::synthetic::{Scenario, generate};
use tests::{
    cluster_node::Node,
    privileges::{Needs, can_run},
    redis_server::RedisServer,
};

/// Events per batch when feeding flat out (the capture hands the engine batches of up to
/// 4,096 records; smaller ones keep the single-node latency figure near one event's cost).
const BATCH: usize = 256;
/// Lookups and claims in flight at most when feeding flat out: half of the link's job queue
/// (4,096), past which it answers lookups with nothing.
const MAX_OUTSTANDING: usize = 2_048;
/// Messages pushed; each reaches up to 5 gateways, one push call each.
const PUSHED_MESSAGES: usize = 5_000;
/// Redis commands that are this benchmark's own (reading and zeroing the statistics).
const OWN_COMMANDS: [&str; 2] = ["info", "config|resetstat"];

#[derive(Clone, Copy)]
enum Pace {
    FlatOut,
    /// The capture's timeline, `speed` times faster.
    Timeline {
        speed: f64,
    },
}

/// What a replay drives: one engine alone (single-node mode) or one node of a cluster.
trait Observer {
    fn feed(&mut self, events: &[Event]);
    fn tick(&mut self, now_ns: u64);
    fn printed(&self) -> &[Alert];
    /// Lookups and claims sent and not answered yet.
    fn outstanding(&self) -> usize;
    /// Applies the shared state's next answer (cancel-safe); never ready for an engine alone.
    async fn answer(&mut self);
    /// Waits for every answer still due.
    async fn settle(&mut self);
}

/// Single-node mode: the engine prints what it raises at once.
struct Alone {
    engine: Engine,
    printed: Vec<Alert>,
}

impl Observer for Alone {
    fn feed(&mut self, events: &[Event]) {
        for event in events {
            self.engine.on_event(event, &mut self.printed);
        }
    }

    fn tick(&mut self, now_ns: u64) {
        self.engine.tick(now_ns, &mut self.printed);
    }

    fn printed(&self) -> &[Alert] {
        &self.printed
    }

    fn outstanding(&self) -> usize {
        0
    }

    async fn answer(&mut self) {
        std::future::pending().await
    }

    async fn settle(&mut self) {}
}

impl Observer for Node {
    fn feed(&mut self, events: &[Event]) {
        Node::feed(self, events);
    }

    fn tick(&mut self, now_ns: u64) {
        Node::tick(self, now_ns);
    }

    fn printed(&self) -> &[Alert] {
        &self.printed
    }

    fn outstanding(&self) -> usize {
        self.link.outstanding()
    }

    async fn answer(&mut self) {
        let done = self.link.next().await;
        self.apply(done);
    }

    async fn settle(&mut self) {
        Node::settle(self).await;
    }
}

/// Names one first `route_mismatch`: its user and the gateway pushed to.
type MismatchKey = (String, IpAddr);

/// When each batch reached the engine, how long each first `route_mismatch` took from the batch
/// that completed its call to being printed, and when it was printed.
struct Detections {
    /// When the replay started.
    started: Instant,
    /// First event time of each batch fed, with its arrival.
    arrivals: Vec<(u64, Instant)>,
    /// Alerts of the observer already looked at.
    seen: usize,
    latency_us: Histogram<u64>,
    /// When each first mismatch was printed, since the replay started.
    printed_at: HashMap<MismatchKey, Duration>,
}

impl Detections {
    fn new(observer: &impl Observer, started: Instant) -> Self {
        Self {
            started,
            arrivals: Vec::new(),
            seen: observer.printed().len(),
            latency_us: histogram(),
            printed_at: HashMap::new(),
        }
    }

    fn arrived(&mut self, batch: &[Event]) {
        self.arrivals.push((batch[0].ts_ns, Instant::now()));
    }

    /// Prints the alerts raised since the last call, timing the mismatches. An alert carries
    /// the time of the event that judged its call, so its batch is the last one that started
    /// at or before it.
    fn print(&mut self, observer: &impl Observer) {
        let printed = observer.printed();
        for alert in &printed[self.seen..] {
            black_box(alert.to_json_line());
            let AlertBody::RouteMismatch(RouteMismatch {
                count: 1,
                user,
                pushed_to,
                ..
            }) = &*alert.body
            else {
                continue;
            };
            self.printed_at
                .entry((user.to_string(), pushed_to.gateway.gateway.ip))
                .or_insert_with(|| self.started.elapsed());
            let batch = self
                .arrivals
                .partition_point(|(first_ns, _)| *first_ns <= alert.ts_ns);
            if let Some((_, arrived)) = batch.checked_sub(1).map(|index| self.arrivals[index]) {
                self.latency_us
                    .saturating_record(arrived.elapsed().as_micros() as u64);
            }
        }
        self.seen = printed.len();
    }
}

struct Replayed {
    elapsed: Duration,
    latency_us: Histogram<u64>,
    printed_at: HashMap<MismatchKey, Duration>,
}

/// Returns an empty histogram of microseconds, up to ten minutes.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3)
        .unwrap_or_else(|error| panic!("histogram bounds are valid: {error}"))
}

/// Feeds `events` to `observer` at `pace`, as the daemon's loop does: a batch, then what it
/// raised printed; the shared state's answers applied as they come; a tick for every second of
/// event time. Ends when every answer has come.
async fn replay(observer: &mut impl Observer, events: &[Event], pace: Pace) -> Replayed {
    let first_ns = events.first().map_or(0, |event| event.ts_ns);
    let started = Instant::now();
    let mut detections = Detections::new(observer, started);
    let due = |event: &Event, speed: f64| {
        started + Duration::from_secs_f64((event.ts_ns - first_ns) as f64 / 1e9 / speed)
    };
    let mut last_tick_s = first_ns / NANOS_PER_SEC;
    let mut next = 0;
    while next < events.len() {
        let end = match pace {
            Pace::FlatOut => {
                while observer.outstanding() > MAX_OUTSTANDING {
                    observer.answer().await;
                    detections.print(observer);
                }
                // Answers already back are applied before the next batch, as the daemon's
                // `select!` would pick them among the branches ready.
                while observer.answer().now_or_never().is_some() {
                    detections.print(observer);
                }
                (next + BATCH).min(events.len())
            }
            Pace::Timeline { speed } => {
                let wake = tokio::time::Instant::from_std(due(&events[next], speed));
                tokio::select! {
                    () = tokio::time::sleep_until(wake) => {}
                    () = observer.answer() => {
                        detections.print(observer);
                        continue;
                    }
                }
                let now = Instant::now();
                next + events[next..].partition_point(|event| due(event, speed) <= now)
            }
        };
        let batch = &events[next..end];
        detections.arrived(batch);
        observer.feed(batch);
        detections.print(observer);
        let now_ns = batch[batch.len() - 1].ts_ns;
        if now_ns / NANOS_PER_SEC > last_tick_s {
            last_tick_s = now_ns / NANOS_PER_SEC;
            observer.tick(now_ns);
            detections.print(observer);
        }
        next = end;
    }
    observer.settle().await;
    detections.print(observer);
    Replayed {
        elapsed: started.elapsed(),
        latency_us: detections.latency_us,
        printed_at: detections.printed_at,
    }
}

/// What the push node sent to Redis during the push phase, and what Redis executed.
struct RedisTraffic {
    /// The push node's `redis_round_trips`: pipelines and commands its link sent.
    round_trips: u64,
    /// Calls per command (`INFO commandstats`), this benchmark's own left out.
    commands: BTreeMap<String, u64>,
    /// Lookups or claims Redis did not answer in time, or the link's queue turned away.
    unanswered: u64,
}

impl RedisTraffic {
    fn probes(&self) -> u64 {
        self.commands.get("ping").copied().unwrap_or(0)
    }

    /// Commands other than the probe's PING.
    fn commands_for_pushes(&self) -> u64 {
        self.commands.values().sum::<u64>() - self.probes()
    }
}

/// One mode's replay of the placements (flat out) and then of the push calls (at `pace`).
struct Run {
    placements: Replayed,
    pushes: Replayed,
    mismatches: usize,
    /// Cluster mode only.
    redis: Option<RedisTraffic>,
}

fn first_mismatches(printed: &[Alert]) -> usize {
    printed
        .iter()
        .filter(|alert| {
            matches!(
                &*alert.body,
                AlertBody::RouteMismatch(RouteMismatch { count: 1, .. })
            )
        })
        .count()
}

async fn single_node(placements: &[Event], pushes: &[Event], pace: Pace) -> Run {
    let mut alone = Alone {
        engine: Engine::new(EngineConfig::default()),
        printed: Vec::new(),
    };
    let placed = replay(&mut alone, placements, Pace::FlatOut).await;
    let pushed = replay(&mut alone, pushes, pace).await;
    Run {
        placements: placed,
        pushes: pushed,
        mismatches: first_mismatches(&alone.printed),
        redis: None,
    }
}

async fn cluster(placements: &[Event], pushes: &[Event], pace: Pace) -> anyhow::Result<Run> {
    let redis = RedisServer::start()?;
    let mut proxy_node = Node::start(&redis.url(), "node-a").await;
    let placed = replay(&mut proxy_node, placements, Pace::FlatOut).await;
    proxy_node.written().await;
    // Its placements stay (15 minutes' TTL); its probes would count among the push node's.
    drop(proxy_node);

    let mut push_node = Node::start(&redis.url(), "node-b").await;
    let health = push_node.link.state().health();
    let before = health.counters();
    redis.reset_stats()?;
    let pushed = replay(&mut push_node, pushes, pace).await;
    let after = health.counters();
    let commands = redis
        .info("commandstats")?
        .into_iter()
        .filter_map(|(name, stats)| {
            let command = name.strip_prefix("cmdstat_")?.to_owned();
            let calls = stats
                .split(',')
                .find_map(|stat| stat.strip_prefix("calls="))?;
            Some((command, calls.parse().ok()?))
        })
        .filter(|(command, _)| !OWN_COMMANDS.contains(&command.as_str()))
        .collect();
    let unanswered = (after.lookups_failed + after.claims_failed)
        - (before.lookups_failed + before.claims_failed);
    Ok(Run {
        placements: placed,
        pushes: pushed,
        mismatches: first_mismatches(&push_node.printed),
        redis: Some(RedisTraffic {
            round_trips: after.round_trips - before.round_trips,
            commands,
            unanswered,
        }),
    })
}

fn rate(events: usize, replayed: &Replayed) -> String {
    format!(
        "{:.0} k events/s",
        events as f64 / replayed.elapsed.as_secs_f64() / 1e3
    )
}

fn latency(replayed: &Replayed) -> String {
    let histogram = &replayed.latency_us;
    format!(
        "p50 {} µs, p99 {} µs",
        histogram.value_at_quantile(0.50),
        histogram.value_at_quantile(0.99)
    )
}

/// Counts the seconds of capture time at the start whose misses wait together: the engine learns
/// how push routes before it judges a miss (ring or broadcast), then judges every miss held
/// meanwhile at once, a burst that both modes print and cluster mode claims one by one.
const START_SECONDS: f64 = 2.0;

/// Compares, mismatch by mismatch, when each mode printed it since its replay started: both were
/// fed the same events at the same offsets, so the difference is the time cluster mode added
/// (the lookup and the claim), whatever held the judgment in both (a message window). The
/// mismatches single-node printed within [`START_SECONDS`] of capture time (at the timeline's
/// `speed`) are shown apart: the start's burst.
fn added_latency(single: &Replayed, cluster: &Replayed, speed: f64) -> String {
    let start = Duration::from_secs_f64(START_SECONDS / speed);
    let (mut at_start, mut after): (Vec<i64>, Vec<i64>) = (Vec::new(), Vec::new());
    for (key, single_at) in &single.printed_at {
        let Some(cluster_at) = cluster.printed_at.get(key) else {
            continue;
        };
        let added = cluster_at.as_micros() as i64 - single_at.as_micros() as i64;
        if *single_at < start {
            at_start.push(added);
        } else {
            after.push(added);
        }
    }
    format!(
        "{}; the start's burst: {}",
        percentiles(&mut after),
        percentiles(&mut at_start)
    )
}

/// Describes the median, 99th percentile and maximum of `added_us`.
fn percentiles(added_us: &mut [i64]) -> String {
    if added_us.is_empty() {
        return "none".to_owned();
    }
    added_us.sort_unstable();
    let at = |quantile: f64| added_us[((added_us.len() - 1) as f64 * quantile).round() as usize];
    format!(
        "p50 {:+} µs, p99 {:+} µs, max {:+} µs ({} mismatches)",
        at(0.50),
        at(0.99),
        at(1.0),
        added_us.len()
    )
}

/// What the figures are divided by.
struct Workload {
    placement_events: usize,
    push_events: usize,
    push_calls: usize,
}

fn report(pace: Pace, single: &Run, cluster: &Run, workload: &Workload) {
    let queued = match pace {
        Pace::FlatOut => {
            println!(
                "  placements:        single-node {:>16}   proxy node {:>16}",
                rate(workload.placement_events, &single.placements),
                rate(workload.placement_events, &cluster.placements)
            );
            let calls_per_s = |replayed: &Replayed| {
                workload.push_calls as f64 / replayed.elapsed.as_secs_f64() / 1e3
            };
            println!(
                "  push calls:        single-node {:>16} ({:.0} k calls/s)   push node {:>16} ({:.0} k calls/s): ×{:.2}, until every lookup and claim was answered",
                rate(workload.push_events, &single.pushes),
                calls_per_s(&single.pushes),
                rate(workload.push_events, &cluster.pushes),
                calls_per_s(&cluster.pushes),
                single.pushes.elapsed.as_secs_f64() / cluster.pushes.elapsed.as_secs_f64()
            );
            " (queued behind the calls in flight)"
        }
        // The rate is the timeline's: only the latency says something.
        Pace::Timeline { .. } => "",
    };
    let added_p99_us = cluster.pushes.latency_us.value_at_quantile(0.99) as i64
        - single.pushes.latency_us.value_at_quantile(0.99) as i64;
    println!(
        "  detection latency{queued}: single-node {}; cluster {}; added p99 {added_p99_us:+} µs",
        latency(&single.pushes),
        latency(&cluster.pushes)
    );
    if let Pace::Timeline { speed } = pace {
        println!(
            "  added by cluster mode, mismatch by mismatch, after the start: {}",
            added_latency(&single.pushes, &cluster.pushes, speed)
        );
    }
    println!(
        "  route_mismatch printed: single-node {}, cluster {}",
        single.mismatches, cluster.mismatches
    );
    if single.mismatches != cluster.mismatches {
        eprintln!("  warning: the two modes did not print the same mismatches");
    }
    let Some(redis) = &cluster.redis else {
        return;
    };
    let per_call = |count: u64| count as f64 / workload.push_calls as f64;
    let round_trips = redis.round_trips - redis.probes();
    // On this path a claim is a lone `SET NX` and each ring-evidence read one pipeline with
    // one `LRANGE`: the other round trips are placement lookups and ring-member writes.
    let calls_of = |command: &str| redis.commands.get(command).copied().unwrap_or(0);
    println!(
        "  push node → Redis: {round_trips} round trips = {:.3} per push call ({} dedup claims, {} ring-evidence reads, the rest lookups and writes), besides {} PING probes (one a second)",
        per_call(round_trips),
        calls_of("set"),
        calls_of("lrange"),
        redis.probes(),
    );
    println!(
        "                     {} commands = {:.2} per push call",
        redis.commands_for_pushes(),
        per_call(redis.commands_for_pushes())
    );
    let by_command: Vec<String> = redis
        .commands
        .iter()
        .filter(|(command, _)| *command != "ping")
        .map(|(command, calls)| {
            format!(
                "{} {calls} ({:.3})",
                command.to_uppercase(),
                per_call(*calls)
            )
        })
        .collect();
    println!(
        "  commands by name (per push call): {}",
        by_command.join(", ")
    );
    if redis.unanswered > 0 {
        eprintln!(
            "  warning: {} lookups or claims went unanswered",
            redis.unanswered
        );
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if !can_run(Needs::RedisServer) {
        return Ok(());
    }
    let speed: f64 = std::env::var("CLUSTER_BENCH_SPEED")
        .ok()
        .and_then(|value| value.parse().ok())
        .filter(|speed: &f64| *speed > 0.0)
        .unwrap_or(4.0);
    let traffic = generate(&Scenario {
        gateways: 5,
        users: 5_000,
        misrouted_share: 0.5,
        // About 36 s of event time: within one fold window (60 s), so every mismatch is printed
        // once in both modes (a claim holds for the window in wall time).
        push_calls: PUSHED_MESSAGES,
        recipients_per_call: 8,
        ..Scenario::default()
    });
    let (placements, pushes): (Vec<Event>, Vec<Event>) = traffic
        .events
        .iter()
        .cloned()
        .partition(|event| event.port_class == PortClass::WebSocket);
    let span_s = pushes.last().map_or(0, |event| event.ts_ns)
        - pushes.first().map_or(0, |event| event.ts_ns);
    let span_s = span_s as f64 / 1e9;
    println!(
        "cluster bench: {} users ({} misrouted) placed in {} events; {} pushed messages = {} push calls (gRPC requests) in {} events over {span_s:.1} s of capture time",
        traffic.users.len(),
        traffic.misrouted_users,
        placements.len(),
        PUSHED_MESSAGES,
        traffic.grpc_requests,
        pushes.len(),
    );
    let workload = Workload {
        placement_events: placements.len(),
        push_events: pushes.len(),
        push_calls: traffic.grpc_requests,
    };
    let paces = [
        (
            format!(
                "flat out (batches of {BATCH} events; the push node keeps at most {MAX_OUTSTANDING} lookups and claims in flight):"
            ),
            Pace::FlatOut,
        ),
        (
            format!(
                "capture timeline ×{speed} ({:.0} push calls/s):",
                traffic.grpc_requests as f64 / (span_s / speed)
            ),
            Pace::Timeline { speed },
        ),
    ];
    for (title, pace) in paces {
        println!("{title}");
        let single = single_node(&placements, &pushes, pace).await;
        let cluster = cluster(&placements, &pushes, pace).await?;
        report(pace, &single, &cluster, &workload);
    }
    Ok(())
}
