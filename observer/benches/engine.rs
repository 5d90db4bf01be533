//! Engine throughput over a large synthetic capture: events/s, per-event latency, and the
//! `observer replay` path (JSON line parsing + engine). Prints figures; asserts nothing about
//! speed. The target is 1M events/s on one core for the engine alone.
//!
//! Run with `cargo bench -p observer --bench engine`; `ENGINE_BENCH_SCALE=0.1` runs a tenth,
//! `ENGINE_BENCH_MISROUTED=0` a healthy cluster (no alerts), `ENGINE_BENCH_ROUNDS=5` more
//! rounds (default 3), `ENGINE_BENCH_THROUGHPUT_ONLY=1` stops after the throughput rounds (for
//! a profiler or an instruction count: docs/benchmarks.md has the `valgrind` line),
//! `ENGINE_BENCH_TIME_SCALE=0.004` the same traffic 250 times denser in time. Alerts fold per
//! window of traffic time, so the capture's own pace (printed first, in events/s of traffic)
//! decides how many alerts each event raises: at the lab's pace (scale 1) the capture spans
//! minutes and each misrouted user prints its alert again in every 60 s window. Throughput is per
//! core (events over this thread's CPU time); latency percentiles come from one histogram over
//! all rounds, then by kind of event, with each kind's share of the events slower than p99;
//! every alert is rendered as its JSON line.

use std::hint::black_box;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use observer::alert::{Alert, LineWriter};
use observer::budget::MemoryBudget;
use observer::capture::recording;
use observer::correlate::{Engine, EngineConfig, RouteLimits};
use observer::model::{Direction, Event, EventKind};
use openim_test_kit::synthetic;

/// The allocator the `observer` binary ships with (see its `main.rs`).
#[global_allocator]
static ALLOCATOR: observer::allocator::Mimalloc = observer::allocator::Mimalloc;

/// The proxy keeps one upstream WebSocket per online user open, so 100k users need more than
/// the default 65,536 decoded connections (`--max-connections`); sized as the daemon sizes
/// the detectors from that flag.
fn engine_config() -> EngineConfig {
    let max_connections = 262_144;
    let defaults = EngineConfig::default();
    EngineConfig {
        max_connections,
        // Measures the detectors, not shedding: the budget holds every user.
        memory: MemoryBudget::new(4 << 30),
        routes: RouteLimits {
            max_tracked_connections: max_connections * 4,
            ..defaults.routes
        },
        ..defaults
    }
}

fn main() {
    let scale: f64 = std::env::var("ENGINE_BENCH_SCALE")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(1.0);
    // 0.78: the share of users 3.5.1's two rings split with 5 gateways (Go code, 300 ids).
    let misrouted_share: f64 = std::env::var("ENGINE_BENCH_MISROUTED")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(0.78);
    let time_scale: f64 = std::env::var("ENGINE_BENCH_TIME_SCALE")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(1.0);
    let scaled = |count: f64| ((count * scale) as usize).max(1);
    let scenario = synthetic::Scenario {
        gateways: 5,
        users: scaled(100_000.0),
        misrouted_share,
        push_calls: scaled(30_000.0),
        recipients_per_call: 40,
        time_scale,
        ..synthetic::Scenario::default()
    };
    let started = Instant::now();
    let traffic = synthetic::generate(&scenario);
    let events = traffic.events;
    let payload_bytes: usize = events
        .iter()
        .map(|event| match &event.kind {
            EventKind::Data { payload, .. } => payload.len(),
            _ => 0,
        })
        .sum();
    let span_secs = match (events.first(), events.last()) {
        (Some(first), Some(last)) => (last.ts_ns - first.ts_ns) as f64 / 1e9,
        _ => 0.0,
    };
    println!(
        "synthetic capture: {} events ({:.1} MB of payload), {} users ({} misrouted), {} gRPC push \
        requests, generated in {:.2?}",
        events.len(),
        payload_bytes as f64 / 1e6,
        traffic.users.len(),
        traffic.misrouted_users,
        traffic.grpc_requests,
        started.elapsed()
    );
    println!(
        "traffic pace:      {span_secs:.1} s of traffic, {:.0} events/s (time scale {time_scale})",
        events.len() as f64 / span_secs.max(1e-9)
    );

    let rounds: usize = std::env::var("ENGINE_BENCH_ROUNDS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(3)
        .max(1);
    // Per core: events over the CPU time of this thread, so other load on the machine stretches
    // wall time but not the figure (it still slows caches; compare rounds).
    let mut per_core = Vec::new();
    let mut alerts_per_round = 0;
    for _ in 0..rounds {
        let (cpu, alerts) = run_engine(&events);
        per_core.push(events.len() as f64 / cpu.as_secs_f64() / 1e6);
        alerts_per_round = alerts;
    }
    per_core.sort_by(f64::total_cmp);
    println!(
        "engine:            {:>6.2} M events/s per core (median of {rounds} rounds, {:.2}–{:.2}), \
        {} alerts per round, each rendered as its JSON line",
        per_core[per_core.len() / 2],
        per_core[0],
        per_core[per_core.len() - 1],
        alerts_per_round
    );

    if std::env::var_os("ENGINE_BENCH_THROUGHPUT_ONLY").is_some() {
        return;
    }
    // Per-event latency, every round on a fresh engine, all into one histogram (the clock
    // reads add ~20-40 ns to each figure).
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
        .unwrap_or_else(|error| panic!("histogram bounds are valid: {error}"));
    let mut by_class = EventClass::ALL.map(|_| histogram.clone());
    let mut alerts: Vec<Alert> = Vec::new();
    let mut alert_lines = LineWriter::default();
    let mut alert_line = Vec::new();
    for _ in 0..rounds {
        let mut engine = Engine::new(engine_config());
        for event in &events {
            let started = Instant::now();
            engine.on_event(event, &mut alerts);
            let raised = render_alerts(&mut alerts, &mut alert_lines, &mut alert_line);
            let nanos = started.elapsed().as_nanos() as u64;
            histogram.saturating_record(nanos);
            by_class[EventClass::of(event, raised) as usize].saturating_record(nanos);
        }
    }
    let p99 = histogram.value_at_quantile(0.99);
    println!(
        "per-event latency: p50 {} ns, p99 {p99} ns, p99.9 {} ns, max {} ns ({} events over \
        {rounds} rounds, one histogram, alert lines included)",
        histogram.value_at_quantile(0.50),
        histogram.value_at_quantile(0.999),
        histogram.max(),
        histogram.len()
    );
    // Which events make the tail: the share of each kind among the events slower than p99.
    let slower_than_p99 = |kind: &Histogram<u64>| kind.len() - kind.count_between(0, p99);
    let tail = slower_than_p99(&histogram).max(1);
    for (class, recorded) in EventClass::ALL.iter().zip(&by_class) {
        println!(
            "  {:<28} {:>5.1}% of events, p50 {} ns, p99 {} ns; {:>5.1}% of those slower than p99",
            class.label(),
            recorded.len() as f64 * 100.0 / histogram.len().max(1) as f64,
            recorded.value_at_quantile(0.50),
            recorded.value_at_quantile(0.99),
            slower_than_p99(recorded) as f64 * 100.0 / tail as f64,
        );
    }

    // The replay path: what `observer run --record` writes, parsed back and fed.
    let started = Instant::now();
    let lines: Vec<String> = events.iter().map(recording::to_json_line).collect();
    let writing = started.elapsed();
    let line_bytes: usize = lines.iter().map(|line| line.len() + 1).sum();
    let started = Instant::now();
    let cpu_started = thread_cpu_time();
    let mut engine = Engine::new(engine_config());
    let mut alert_count = 0usize;
    let mut alert_lines = LineWriter::default();
    let mut alert_line = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        let event = match recording::from_json_line(line, index + 1) {
            Ok(event) => event,
            Err(error) => panic!("a line this bench wrote must parse: {error}"),
        };
        engine.on_event(&event, &mut alerts);
        alert_count += render_alerts(&mut alerts, &mut alert_lines, &mut alert_line);
    }
    engine.finish(&mut alerts);
    alert_count += render_alerts(&mut alerts, &mut alert_lines, &mut alert_line);
    let replay_cpu = thread_cpu_time().saturating_sub(cpu_started);
    let replay = started.elapsed();
    println!(
        "replay:            {:>6.2} M events/s per core ({:.0} MB of JSON lines), {:.2?} total, {} \
        alerts; writing the lines took {:.2?}",
        lines.len() as f64 / replay_cpu.as_secs_f64() / 1e6,
        line_bytes as f64 / 1e6,
        replay,
        alert_count,
        writing
    );
    println!(
        "counters: {}",
        serde_json::to_string(&engine.counters()).unwrap_or_default()
    );
}

/// What an event was, for the latency breakdown.
#[derive(Clone, Copy)]
enum EventClass {
    /// A connect, state change or close.
    Connection,
    /// Bytes sent: WebSocket upgrades from the proxy, push requests.
    Sent,
    /// Bytes received that raised no alert: upgrade answers, push answers judged in order.
    ReceivedQuietly,
    /// Bytes whose decoding raised at least one alert (a push answer, nearly always).
    Alerting,
}

impl EventClass {
    const ALL: [Self; 4] = [
        Self::Connection,
        Self::Sent,
        Self::ReceivedQuietly,
        Self::Alerting,
    ];

    fn of(event: &Event, alerts_raised: usize) -> Self {
        match &event.kind {
            _ if alerts_raised > 0 => Self::Alerting,
            EventKind::Data {
                direction: Direction::Send,
                ..
            } => Self::Sent,
            EventKind::Data { .. } => Self::ReceivedQuietly,
            _ => Self::Connection,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Connection => "connects, states, closes:",
            Self::Sent => "data sent:",
            Self::ReceivedQuietly => "data received, no alert:",
            Self::Alerting => "data raising alerts:",
        }
    }
}

/// One pass over the capture on a fresh engine; returns the CPU time this thread spent and the
/// alerts raised. No clock reads inside the loop. Never inlined, so that a profiler can single
/// out a round (`valgrind --tool=callgrind --toggle-collect='engine::run_engine'`).
#[inline(never)]
fn run_engine(events: &[Event]) -> (Duration, usize) {
    let mut engine = Engine::new(engine_config());
    let mut alerts: Vec<Alert> = Vec::new();
    let mut alert_lines = LineWriter::default();
    let mut alert_line = Vec::new();
    let mut alert_count = 0usize;
    let started = thread_cpu_time();
    for event in events {
        engine.on_event(black_box(event), &mut alerts);
        alert_count += render_alerts(&mut alerts, &mut alert_lines, &mut alert_line);
    }
    engine.finish(&mut alerts);
    alert_count += render_alerts(&mut alerts, &mut alert_lines, &mut alert_line);
    (thread_cpu_time().saturating_sub(started), alert_count)
}

/// Renders the alerts as the daemon prints them, into a buffer as its buffered stdout (building
/// the line is part of the cost; writing it to stdout is not), and empties the list; returns how
/// many there were.
fn render_alerts(alerts: &mut Vec<Alert>, lines: &mut LineWriter, out: &mut Vec<u8>) -> usize {
    let count = alerts.len();
    for alert in alerts.drain(..) {
        out.clear();
        if let Err(error) = lines.write(&alert, out) {
            panic!("an alert renders: {error}");
        }
        black_box(&out);
    }
    count
}

/// CPU time this thread has used (user + system).
fn thread_cpu_time() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    let result = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(
        result, 0,
        "CLOCK_THREAD_CPUTIME_ID is always available on Linux"
    );
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}
