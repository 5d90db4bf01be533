//! Measures what watching costs the push flood, measured within one flood (`openim-lab bench`,
//! after the push flood's rounds): one observer stays attached throughout, and the bench switches
//! its watching on and off by writing its `WATCHED_PORTS` map (the gateway ports' bits, or none)
//! between short phases of the same lab's flood, in pairs whose order alternates.
//!
//! Why besides the rounds of separate segments: a segment pair compares two starts of the
//! observer and two stretches of the machine seconds apart, and their ratios spread by ±10%
//! and more on this project's VMs, wider than the cost to be found. Phases of 1.5 s, side by
//! side and with nothing started or stopped between them, spread by about ±8% a pair, and 40
//! pairs give the cost to about ±2.5% (95%). What it leaves out is what attaching costs (every
//! program running and turning everything away), which an observer watching nothing measures
//! (`--grpc-port 9999 --ws-port 9998`): ×1.00 on the VMs here.
//!
//! After the pairs, a few more phases say what the observer's CPU a push is, watching and not:
//! its programs' time as the kernel accounts it (BPF run-time statistics, switched on for
//! these phases only, since they cost every program run two clock reads), which the lab's own
//! processes pay inside their syscalls and softirqs, and its daemon's time from /proc.
//!
//! Then the yardstick: as many pairs again, the observer watching nothing in both phases and a
//! thread of the bench burning, in one phase of each pair, the CPU that watching added (its
//! share of one CPU at the watched phases' pace, in bursts every 3 ms as the daemon reads).
//! What that costs the flood is what any process using the observer's CPU would cost it; if
//! watching costs about the same, its cost is its CPU, and only less CPU lowers it.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use aya::maps::{Array, Map, MapData, loaded_maps};
use aya::programs::loaded_programs;
use aya::sys::{Stats, enable_stats};

use crate::Lab;
use crate::bench::median;
use crate::lab::truth::FloodReport;

/// Sets the length of one phase of the flood, watching or not.
const PHASE: Duration = Duration::from_millis(1500);
/// Counts the phases timed for the observer's CPU, half of them watching.
const TIMED_PHASES: usize = 4;
/// Sets the time left to the daemon after a timed phase, so that the work of that phase's last
/// records counts in it, not in the next. Timed by hand in 50 ms steps after watching stopped in
/// the middle of the flood: 100–240 µs of daemon CPU in each of the first three steps (the last
/// records, the last connections' ends), then the pattern of a daemon with nothing to watch (about
/// 80 µs every 250 ms: its quiet drains and the counters' tick).
const TIMED_PHASE_SETTLE: Duration = Duration::from_millis(300);
/// Sets how far apart the yardstick's burner works in bursts: how often the daemon reads the ring
/// under sustained traffic (`observer::capture::read_pacing::BUSY_READ_FOLLOW_UP`).
const BURN_PERIOD: Duration = Duration::from_millis(3);
/// Names the observer's map of watched ports (`observer-ebpf/src/maps.rs`), as the kernel names it.
const WATCHED_PORTS: &str = "WATCHED_PORTS";

/// Lists the `WATCHED_PORTS` maps loaded now: taken before the observer starts, so that its own is
/// the one not among them.
///
/// # Errors
///
/// Fails when the loaded BPF maps cannot be listed.
pub fn watched_port_maps() -> anyhow::Result<Vec<u32>> {
    let mut ids = Vec::new();
    for info in loaded_maps() {
        let info = info.context("list the loaded BPF maps")?;
        if info.name_as_str() == Some(WATCHED_PORTS) {
            ids.push(info.id());
        }
    }
    Ok(ids)
}

/// Switches one observer's watching: its `WATCHED_PORTS` words as it set them, or zero.
pub struct WatchSwitch {
    /// The map's id, by which the observer's programs name it.
    id: u32,
    map: Array<MapData, u64>,
    /// The words the observer set (index, bits): the watched ports.
    watched: Vec<(u32, u64)>,
}

impl WatchSwitch {
    /// Finds the switch of the observer that started after `before` was taken: its map is the one
    /// `WATCHED_PORTS` map not in `before`.
    ///
    /// # Errors
    ///
    /// Fails when not exactly one new `WATCHED_PORTS` map is loaded, it cannot be opened or read,
    /// or it holds no port.
    pub fn find(before: &[u32]) -> anyhow::Result<Self> {
        let new: Vec<u32> = watched_port_maps()?
            .into_iter()
            .filter(|id| !before.contains(id))
            .collect();
        let [id] = new[..] else {
            bail!(
                "expected one new {WATCHED_PORTS} map after the observer started, found {}",
                new.len()
            );
        };
        let data = MapData::from_id(id).with_context(|| format!("open map {id}"))?;
        let map = Map::from_map_data(data).with_context(|| format!("map {id}"))?;
        let map: Array<MapData, u64> =
            Array::try_from(map).with_context(|| format!("map {id} as an array of u64"))?;
        let mut watched = Vec::new();
        for index in 0..map.len() {
            let word = map
                .get(&index, 0)
                .with_context(|| format!("read word {index}"))?;
            if word != 0 {
                watched.push((index, word));
            }
        }
        if watched.is_empty() {
            bail!("the observer's {WATCHED_PORTS} map holds no port");
        }
        Ok(Self { id, map, watched })
    }

    fn set(&mut self, watching: bool) -> anyhow::Result<()> {
        for &(index, word) in &self.watched {
            self.map
                .set(index, if watching { word } else { 0 }, 0)
                .with_context(|| format!("write word {index} of {WATCHED_PORTS}"))?;
        }
        Ok(())
    }

    /// Returns the time and runs the kernel accounted so far to the observer's programs: those that
    /// use its `WATCHED_PORTS` map, which every program that turns packets or state changes away
    /// does.
    fn program_time(&self) -> anyhow::Result<ProgramTime> {
        let mut time = ProgramTime::default();
        for info in loaded_programs() {
            let info = info.context("list the loaded BPF programs")?;
            let maps = info
                .map_ids()
                .with_context(|| format!("the maps of program {}", info.id()))?
                .context("this kernel does not say which maps a program uses")?;
            if maps.contains(&self.id) {
                time.ns += u64::try_from(info.run_time().as_nanos())?;
                time.runs += info.run_count();
            }
        }
        Ok(time)
    }
}

/// Holds the run time and runs of the observer's programs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct ProgramTime {
    ns: u64,
    runs: u64,
}

/// Sums the observer's CPU over the timed phases of one watching state, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct PhaseCpu {
    pushes: u64,
    /// The phases' flood time.
    seconds: f64,
    program_ns: u64,
    program_runs: u64,
    daemon_seconds: f64,
}

impl PhaseCpu {
    /// Returns, per push, the programs' microseconds and runs, the daemon's microseconds.
    fn per_push(&self) -> (f64, f64, f64) {
        let pushes = self.pushes.max(1) as f64;
        (
            self.program_ns as f64 / 1e3 / pushes,
            self.program_runs as f64 / pushes,
            self.daemon_seconds * 1e6 / pushes,
        )
    }

    fn render(&self, label: &str) -> String {
        let (program_us, runs, daemon_us) = self.per_push();
        let run_ns = self.program_ns as f64 / self.program_runs.max(1) as f64;
        format!(
            "{label}: programs {program_us:.1} µs ({runs:.1} runs of {run_ns:.0} ns), daemon \
            {daemon_us:.1} µs, together {:.1} ms per 1,000 pushes",
            program_us + daemon_us
        )
    }
}

/// Holds the observer's CPU a push, watching and not.
#[derive(Debug)]
struct ObserverCpu {
    watching: PhaseCpu,
    not_watching: PhaseCpu,
}

impl ObserverCpu {
    /// Returns the share of one CPU watching added: its CPU a push beyond not watching's, at the
    /// watched phases' pace.
    fn added_share(&self) -> f64 {
        let (programs, _, daemon) = self.watching.per_push();
        let (programs_idle, _, daemon_idle) = self.not_watching.per_push();
        let added_us = (programs + daemon - programs_idle - daemon_idle).max(0.0);
        let pushes_per_second = self.watching.pushes as f64 / self.watching.seconds.max(1e-9);
        added_us * pushes_per_second / 1e6
    }
}

/// Holds one pair of phases, in either order: the flood with what is measured on (the observer
/// watching, or the yardstick's burner burning) and off.
#[derive(Debug)]
struct Pair {
    on: FloodReport,
    off: FloodReport,
}

/// Holds the yardstick: the flood with a burner of the observer's CPU and without, side by side.
#[derive(Debug)]
struct SameCpu {
    /// The share of one CPU burned.
    share: f64,
    pairs: Vec<Pair>,
}

/// Holds what watching cost within one flood: its pairs of phases and the observer's CPU.
#[derive(Debug)]
pub struct WatchingCost {
    pairs: Vec<Pair>,
    /// Or why it could not be timed (an old kernel, no statistics): the pairs still stand.
    cpu: Result<ObserverCpu, String>,
    /// Measured when the observer's CPU was.
    same_cpu: Option<SameCpu>,
}

/// Runs `pairs` pairs of phases of `lab`'s push flood, one watched by the observer behind
/// `switch` and one not, the order alternating, then the phases that time the observer's CPU
/// (its daemon's CPU seconds so far: `daemon_cpu`); leaves the observer watching.
///
/// # Errors
///
/// Fails when a flood fails, the switch cannot be set, or the programs' run-time statistics cannot
/// be read.
pub async fn measure(
    lab: &mut Lab,
    switch: &mut WatchSwitch,
    pairs: usize,
    daemon_cpu: &dyn Fn() -> f64,
) -> anyhow::Result<WatchingCost> {
    let measured = alternate_pairs(lab, pairs, "watching on and off within one flood", |on| {
        switch.set(on)
    })
    .await?;
    eprintln!("bench: the observer's CPU a push, {TIMED_PHASES} phases timed by the kernel");
    let cpu = measure_cpu(lab, switch, daemon_cpu)
        .await
        .map_err(|err| format!("{err:#}"));
    let same_cpu = match &cpu {
        Ok(cpu) => {
            switch.set(false)?;
            Some(measure_same_cpu(lab, cpu.added_share(), pairs).await?)
        }
        Err(_) => None,
    };
    switch.set(true)?;
    Ok(WatchingCost {
        pairs: measured,
        cpu,
        same_cpu,
    })
}

/// Runs `pairs` pairs of phases of the flood, a thread burning `share` of one CPU in one phase of
/// each and idle in the other, the order alternating.
async fn measure_same_cpu(lab: &mut Lab, share: f64, pairs: usize) -> anyhow::Result<SameCpu> {
    eprintln!(
        "bench: the same CPU burned by a thread ({:.1}% of one CPU) on and off, {pairs} pairs",
        100.0 * share
    );
    let burn_per_period = BURN_PERIOD.mul_f64(share.clamp(0.0, 1.0));
    let burner = Burner::start();
    let measured = alternate_pairs(lab, pairs, "the same CPU burned on and off", |on| {
        burner.burn(if on { burn_per_period } else { Duration::ZERO });
        Ok(())
    })
    .await?;
    Ok(SameCpu {
        share,
        pairs: measured,
    })
}

/// Runs `pairs` pairs of phases of `lab`'s flood, what is measured switched on (`turn(true)`) for
/// one phase of each and off for the other, the order alternating; progress on stderr, named
/// `what`, every ten pairs.
async fn alternate_pairs(
    lab: &mut Lab,
    pairs: usize,
    what: &str,
    mut turn: impl FnMut(bool) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Pair>> {
    let mut measured = Vec::with_capacity(pairs);
    for pair in 0..pairs {
        if pair % 10 == 0 {
            eprintln!(
                "bench: {what}, pairs {}–{} of {pairs}",
                pair + 1,
                (pair + 10).min(pairs)
            );
        }
        let on_first = pair % 2 == 0;
        turn(on_first)?;
        let first = lab.push_flood(PHASE).await?;
        turn(!on_first)?;
        let second = lab.push_flood(PHASE).await?;
        let (on, off) = if on_first {
            (first, second)
        } else {
            (second, first)
        };
        measured.push(Pair { on, off });
    }
    Ok(measured)
}

/// Holds a thread that spins for a set time in every `BURN_PERIOD` and sleeps the rest, or, while
/// that time is zero, sleeps until it changes (so that the phases without it have no thread waking
/// every period); it ends with its handle.
struct Burner {
    /// Nanoseconds to spin a period; `u64::MAX` tells the thread to end.
    burn_ns: Arc<AtomicU64>,
    thread: std::thread::Thread,
}

impl Burner {
    fn start() -> Self {
        let burn_ns = Arc::new(AtomicU64::new(0));
        let shared = Arc::clone(&burn_ns);
        let thread = std::thread::spawn(move || {
            loop {
                let burn = shared.load(Ordering::Relaxed);
                match burn {
                    u64::MAX => return,
                    0 => std::thread::park(),
                    _ => {
                        let start = Instant::now();
                        let until = start + Duration::from_nanos(burn);
                        while Instant::now() < until {
                            std::hint::spin_loop();
                        }
                        std::thread::sleep(BURN_PERIOD.saturating_sub(start.elapsed()));
                    }
                }
            }
        })
        .thread()
        .clone();
        Self { burn_ns, thread }
    }

    /// Spins `per_period` (at most `BURN_PERIOD`) of every period from now on.
    fn burn(&self, per_period: Duration) {
        let ns = per_period.min(BURN_PERIOD).as_nanos() as u64;
        self.burn_ns.store(ns, Ordering::Relaxed);
        self.thread.unpark();
    }
}

impl Drop for Burner {
    fn drop(&mut self) {
        self.burn_ns.store(u64::MAX, Ordering::Relaxed);
        self.thread.unpark();
    }
}

/// Runs `TIMED_PHASES` phases of the flood, watching and not in turn, with the kernel's BPF
/// run-time statistics on (Linux 5.8+; off again when the descriptor closes).
async fn measure_cpu(
    lab: &mut Lab,
    switch: &mut WatchSwitch,
    daemon_cpu: &dyn Fn() -> f64,
) -> anyhow::Result<ObserverCpu> {
    let _statistics = enable_stats(Stats::RunTime)
        .context("switch on the kernel's BPF run-time statistics (BPF_ENABLE_STATS)")?;
    let mut cpu = ObserverCpu {
        watching: PhaseCpu::default(),
        not_watching: PhaseCpu::default(),
    };
    for phase in 0..TIMED_PHASES {
        let watching = phase % 2 == 0;
        switch.set(watching)?;
        let (programs_before, daemon_before) = (switch.program_time()?, daemon_cpu());
        let report = lab.push_flood(PHASE).await?;
        tokio::time::sleep(TIMED_PHASE_SETTLE).await;
        let (programs_after, daemon_after) = (switch.program_time()?, daemon_cpu());
        let totals = if watching {
            &mut cpu.watching
        } else {
            &mut cpu.not_watching
        };
        totals.pushes += report.calls;
        totals.seconds += report.seconds;
        totals.program_ns += programs_after.ns.saturating_sub(programs_before.ns);
        totals.program_runs += programs_after.runs.saturating_sub(programs_before.runs);
        totals.daemon_seconds += daemon_after - daemon_before;
    }
    Ok(cpu)
}

/// Returns the two-sided 95% quantile of Student's t with `df` degrees of freedom (table values,
/// the next lower tabulated `df` for the ones between).
fn t_quantile_975(df: usize) -> f64 {
    const TABLE: [(usize, f64); 14] = [
        (1, 12.706),
        (2, 4.303),
        (3, 3.182),
        (4, 2.776),
        (5, 2.571),
        (6, 2.447),
        (7, 2.365),
        (8, 2.306),
        (9, 2.262),
        (10, 2.228),
        (15, 2.131),
        (20, 2.086),
        (30, 2.042),
        (60, 2.000),
    ];
    TABLE
        .iter()
        .rev()
        .find(|(at_least, _)| df >= *at_least)
        .map_or(f64::INFINITY, |(_, t)| *t)
}

/// Returns the geometric mean of `ratios` and its 95% interval (t on the logarithms), or `None` for
/// fewer than two.
fn geometric_interval(ratios: &[f64]) -> Option<(f64, f64, f64)> {
    if ratios.len() < 2 || ratios.iter().any(|ratio| *ratio <= 0.0) {
        return None;
    }
    let logs: Vec<f64> = ratios.iter().map(|ratio| ratio.ln()).collect();
    let n = logs.len() as f64;
    let mean = logs.iter().sum::<f64>() / n;
    let variance = logs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    let half_width = t_quantile_975(logs.len() - 1) * (variance / n).sqrt();
    Some((
        mean.exp(),
        (mean - half_width).exp(),
        (mean + half_width).exp(),
    ))
}

impl WatchingCost {
    /// Renders the section of the bench's report: the ratio of throughput watched to not, its
    /// interval and what the interval says about issue 13's goal (within noise: it holds ×1) and
    /// issue 4's target (at most `target_loss_percent`).
    pub fn render(&self, target_loss_percent: f64) -> String {
        let mut out = String::new();
        let (throughput, p99) = ratios(&self.pairs);
        let below = throughput.iter().filter(|ratio| **ratio < 1.0).count();
        let not_watching: Vec<f64> = self
            .pairs
            .iter()
            .map(|pair| pair.off.pushes_per_second)
            .collect();
        let _ = writeln!(
            out,
            "\nwatching within one flood: the observer (packet hook) attached throughout, its \
            ports watched and not in alternate phases of {:.1} s, {} pairs; not watching {:.0} \
            pushes/s (median)",
            PHASE.as_secs_f64(),
            self.pairs.len(),
            median(&not_watching)
        );
        let Some((ratio, low, high)) = geometric_interval(&throughput) else {
            let _ = writeln!(out, "too few pairs for an interval");
            return out;
        };
        let noise = if high < 1.0 {
            "below noise (the interval is below ×1)"
        } else if low > 1.0 {
            "above noise (the interval is above ×1)"
        } else {
            "within noise (the interval holds ×1)"
        };
        let target = 1.0 - target_loss_percent / 100.0;
        let loss = if low >= target {
            format!("met (the interval is above ×{target:.2})")
        } else if high < target {
            format!("missed (the interval is below ×{target:.2})")
        } else {
            format!("inconclusive (the interval holds ×{target:.2})")
        };
        let _ = writeln!(
            out,
            "throughput watched / not: ×{ratio:.3} (95% interval ×{low:.3}–×{high:.3}, geometric \
            mean of the pairs; {below} of {} pairs below ×1); p99 ×{:.3} (median of the pairs)",
            self.pairs.len(),
            median(&p99)
        );
        let _ = writeln!(
            out,
            "target: throughput within noise: {noise}; at most {target_loss_percent}% throughput \
            loss: {loss}"
        );
        match &self.cpu {
            Ok(cpu) => {
                let _ = writeln!(
                    out,
                    "the observer's CPU a push ({TIMED_PHASES} phases; programs as the kernel \
                    accounts them, paid inside the lab's syscalls and softirqs; daemon from \
                    /proc):\n  {}\n  {}",
                    cpu.watching.render("watching"),
                    cpu.not_watching.render("not watching")
                );
            }
            Err(err) => {
                let _ = writeln!(out, "the observer's CPU a push: not measured: {err}");
            }
        }
        if let Some(same_cpu) = &self.same_cpu {
            same_cpu.render(&mut out, (low, high));
        }
        out
    }
}

/// Returns each pair's ratios, on to off: throughput, and p99 latency.
fn ratios(pairs: &[Pair]) -> (Vec<f64>, Vec<f64>) {
    pairs
        .iter()
        .map(|pair| {
            (
                pair.on.pushes_per_second / pair.off.pushes_per_second,
                pair.on.p99_us as f64 / pair.off.p99_us.max(1) as f64,
            )
        })
        .unzip()
}

impl SameCpu {
    /// Renders its lines of the report, compared with watching's throughput interval.
    fn render(&self, out: &mut String, (watching_low, watching_high): (f64, f64)) {
        let (throughput, p99) = ratios(&self.pairs);
        let _ = write!(
            out,
            "the same CPU burned by a thread of the bench instead ({:.1}% of one CPU, bursts every \
            {} ms), the observer watching nothing, {} pairs: ",
            100.0 * self.share,
            BURN_PERIOD.as_millis(),
            self.pairs.len()
        );
        let Some((ratio, low, high)) = geometric_interval(&throughput) else {
            let _ = writeln!(out, "too few pairs for an interval");
            return;
        };
        let comparison = if watching_high < low {
            "watching costs the flood more than its CPU does (the intervals do not overlap)"
        } else if watching_low > high {
            "watching costs the flood less than its CPU does (the intervals do not overlap)"
        } else {
            "watching costs the flood what its CPU costs it (the intervals overlap)"
        };
        let _ = writeln!(
            out,
            "throughput ×{ratio:.3} (95% interval ×{low:.3}–×{high:.3}), p99 ×{:.3}: {comparison}",
            median(&p99)
        );
    }
}

#[cfg(test)]
mod tests;
