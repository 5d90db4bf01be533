//! Runs benchmark 1, the push flood: rounds of segments under each watcher, and their report.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::lab::truth::FloodReport;
use crate::watching_cost::{self, WatchSwitch, WatchingCost};
use crate::{Lab, LabConfig};

use super::quiet::{Quiet, wait_until_quiet_async};
use super::statistics::{median, noise_verdict, ratio_summary, verdict};
use super::watchers::{WatcherCounts, WatcherProcess, start_watcher, stop_watcher};
use super::{BenchConfig, TARGET_LOSS_PERCENT, Tools, Watcher};

/// Lists the gateways' ports, watched by default by the observer: gRPC (push) and WebSocket
/// (proxy).
const GATEWAY_PORTS: [u16; 2] = [88, 80];
const WARM_UP: Duration = Duration::from_secs(2);
/// Bounds the p99 push latency the observer may add (issue 13).
const TARGET_P99_PERCENT: f64 = 5.0;

/// Records one watcher's segment of a push flood round.
pub(super) struct FloodRound {
    report: FloodReport,
    counts: WatcherCounts,
    /// The idle check before the segment started: false when the machine never went quiet.
    quiet: Quiet,
}

/// Measures the push flood's `rounds`, then (with a packet hook and `watching_pairs`) watching's
/// cost within one flood of the same lab.
///
/// # Errors
///
/// Fails when the lab does not start, a flood fails, a watcher does not start or stop, or the
/// observer's watched-port map cannot be found or switched.
pub(super) async fn measure_pushes(
    config: &BenchConfig,
    tools: &Tools,
    rounds: usize,
) -> anyhow::Result<(BTreeMap<Watcher, Vec<FloodRound>>, Option<WatchingCost>)> {
    let mut lab = Lab::start(LabConfig {
        replicas_initial: config.replicas,
        replicas_final: config.replicas,
        users: config.users,
        progress: true,
        ..LabConfig::default()
    })
    .await?;
    lab.connect_users(0..config.users, false).await;
    eprintln!("bench: warming up ({} s of push flood)", WARM_UP.as_secs());
    lab.push_flood(WARM_UP).await?;
    let mut floods: BTreeMap<Watcher, Vec<FloodRound>> = BTreeMap::new();
    for round in 0..rounds {
        for watcher in tools.order(round, true) {
            eprintln!(
                "bench: push flood, round {}/{}, {} ({} s)",
                round + 1,
                rounds,
                watcher.label(),
                config.seconds
            );
            // The previous watcher has exited (stop reaps it); its teardown and output must
            // also be over before this segment's clock starts.
            let quiet = wait_until_quiet_async().await?;
            let process =
                start_watcher(watcher, config, tools, GATEWAY_PORTS.to_vec(), None).await?;
            let report = lab.push_flood(Duration::from_secs(config.seconds)).await?;
            let counts = stop_watcher(process).await?;
            eprintln!(
                "bench:   {:.0} pushes/s, p50 {} us, p99 {} us, {} errors",
                report.pushes_per_second, report.p50_us, report.p99_us, report.errors
            );
            floods.entry(watcher).or_default().push(FloodRound {
                report,
                counts,
                quiet,
            });
        }
    }
    if config.watching_pairs == 0 || tools.cgroup2_root.is_none() {
        return Ok((floods, None));
    }
    // Only for the last segment's watcher to be gone: pairs side by side within one flood
    // need no quiet machine, drift on it reaches both phases of a pair alike.
    wait_until_quiet_async().await?;
    let before = watching_cost::watched_port_maps()?;
    let process = start_watcher(
        Watcher::PacketHook,
        config,
        tools,
        GATEWAY_PORTS.to_vec(),
        None,
    )
    .await?;
    let daemon_cpu = || process.as_ref().map_or(0.0, WatcherProcess::cpu_seconds);
    // Stopped whatever the measurement's outcome.
    let cost = async {
        let mut switch = WatchSwitch::find(&before)?;
        watching_cost::measure(&mut lab, &mut switch, config.watching_pairs, &daemon_cpu).await
    }
    .await;
    stop_watcher(process).await?;
    Ok((floods, Some(cost?)))
}

/// Writes the push-flood report.
///
/// Longer than 100 lines on purpose: a report written line after line, in the order it prints.
pub(super) fn render_floods(
    out: &mut String,
    config: &BenchConfig,
    floods: &BTreeMap<Watcher, Vec<FloodRound>>,
) {
    let _ = writeln!(
        out,
        "\npush flood: {} s per round, {} gateways, {} users, a new gRPC connection per push (all \
        on watched port 88)",
        config.seconds, config.replicas, config.users
    );
    for round in 0..config.rounds {
        let mut line = format!("round {}:", round + 1);
        for (watcher, rounds) in floods {
            if let Some(r) = rounds.get(round) {
                let _ = write!(
                    line,
                    " {} {:.0}/s p99 {} us (idle before {:.0}%{});",
                    watcher.label(),
                    r.report.pushes_per_second,
                    r.report.p99_us,
                    100.0 * r.quiet.idle_share,
                    if r.quiet.reached { "" } else { ", NOISY" }
                );
            }
        }
        let _ = writeln!(out, "{line}");
    }
    let _ = writeln!(
        out,
        "{:<22} {:>6} {:>10} {:>19} {:>8} {:>8} {:>8} {:>16} {:>13}  stdout lines",
        "watcher",
        "clean",
        "pushes/s",
        "rounds (min–max)",
        "p50 us",
        "p99 us",
        "errors",
        "CPU ms/1k push",
        "wakeups/push"
    );
    for (watcher, rounds) in floods {
        let kept: Vec<&FloodRound> = rounds.iter().filter(|r| r.quiet.reached).collect();
        let per_round: Vec<f64> = kept.iter().map(|r| r.report.pushes_per_second).collect();
        let p50: Vec<f64> = kept.iter().map(|r| r.report.p50_us as f64).collect();
        let p99: Vec<f64> = kept.iter().map(|r| r.report.p99_us as f64).collect();
        let calls = kept.iter().map(|r| r.report.calls).sum::<u64>().max(1) as f64;
        let _ = writeln!(
            out,
            "{:<22} {:>6} {:>10.0} {:>19} {:>8.0} {:>8.0} {:>8} {:>16.1} {:>13.2}  {}",
            watcher.label(),
            format!("{}/{}", kept.len(), rounds.len()),
            median(&per_round),
            format!(
                "{:.0}–{:.0}",
                per_round.iter().copied().fold(f64::INFINITY, f64::min),
                per_round.iter().copied().fold(0.0, f64::max)
            ),
            median(&p50),
            median(&p99),
            kept.iter().map(|r| r.report.errors).sum::<u64>(),
            1e6 * kept.iter().map(|r| r.counts.cpu_seconds).sum::<f64>() / calls,
            kept.iter().map(|r| r.counts.wakeups).sum::<u64>() as f64 / calls,
            kept.iter().map(|r| r.counts.lines).sum::<u64>(),
        );
    }
    let _ = writeln!(
        out,
        "clean: segments that started on a quiet machine; figures are medians over them (NaN: \
        none). p50/p99: each round's hdrhistogram percentile (connect + call);\nCPU ms/1k push: \
        the watcher process's CPU per 1,000 pushes, its threads' time on a CPU (not its programs', \
        paid inside the lab's syscalls and softirqs: the observer's are timed in the watching \
        section below);\nwakeups/push: the watcher's voluntary context switches per push (the \
        kernel waking it to consume records)"
    );
    let Some(baseline) = floods.get(&Watcher::Nothing) else {
        return;
    };
    let noise = floods
        .get(&Watcher::Control)
        .map(|control| PairRatios::new(control, baseline).throughput)
        .unwrap_or_default();
    for (watcher, rounds) in floods.iter().filter(|(w, _)| **w != Watcher::Nothing) {
        let ratios = PairRatios::new(rounds, baseline);
        let _ = writeln!(
            out,
            "{} vs. no observer, per clean pair: throughput {}, p99 {}{}",
            watcher.label(),
            ratio_summary(&ratios.throughput),
            ratio_summary(&ratios.p99),
            if *watcher == Watcher::Control {
                ": what noise alone does to a pair"
            } else {
                ""
            }
        );
        if matches!(watcher, Watcher::SyscallHook | Watcher::PacketHook) {
            let _ = writeln!(
                out,
                "target: throughput within noise: {}; at most {TARGET_LOSS_PERCENT}% throughput \
                loss: {}; p99 at most +{TARGET_P99_PERCENT}%: {}",
                noise_verdict(&ratios.throughput, &noise),
                verdict(&ratios.throughput, |ratio| ratio
                    >= 1.0 - TARGET_LOSS_PERCENT / 100.0),
                verdict(&ratios.p99, |ratio| ratio
                    <= 1.0 + TARGET_P99_PERCENT / 100.0)
            );
        }
    }
    let observer_drops: u64 = [Watcher::SyscallHook, Watcher::PacketHook]
        .iter()
        .filter_map(|watcher| floods.get(watcher))
        .flatten()
        .filter_map(|round| round.counts.ring_full_drops)
        .sum();
    let _ = writeln!(
        out,
        "observer ring-full drops during floods (both hooks): {observer_drops}"
    );
}

/// Compares a watcher's rounds against no watcher's, pair by pair (the same round); a pair counts
/// only when both of its segments started on a quiet machine.
struct PairRatios {
    throughput: Vec<f64>,
    p99: Vec<f64>,
}

impl PairRatios {
    fn new(rounds: &[FloodRound], baseline: &[FloodRound]) -> Self {
        let pairs: Vec<(&FloodRound, &FloodRound)> = rounds
            .iter()
            .zip(baseline)
            .filter(|(with, without)| with.quiet.reached && without.quiet.reached)
            .collect();
        Self {
            throughput: pairs
                .iter()
                .map(|(with, without)| {
                    with.report.pushes_per_second
                        / without.report.pushes_per_second.max(f64::EPSILON)
                })
                .collect(),
            p99: pairs
                .iter()
                .map(|(with, without)| {
                    with.report.p99_us as f64 / without.report.p99_us.max(1) as f64
                })
                .collect(),
        }
    }
}
