//! Measures what watching costs (`openim-lab bench`, run by `cargo xtask bench`): figures, never a
//! verdict, since speed on a shared machine is no test.
//!
//! 1. Push throughput and latency of the lab's push loop (a new gRPC connection per call to
//!    gateways on port 88, so every gateway connection is watched) with no watcher, with the real
//!    observer, and with a `bpftrace` script doing comparable work as a peer reference. Rounds
//!    interleave the three and rotate their order, so drift on the machine spreads over all.
//!    Each round is a pair (a watcher against no watcher in the same round): the report gives the
//!    ratio of every pair and their median, never an average of rounds. A segment starts only
//!    once the previous watcher has exited and the CPUs are idle again (bounded wait); a segment
//!    that started on a busy machine is flagged noisy and its pair left out of the ratios.
//!    A second no-watcher segment in every round (the control, at its own place in the order)
//!    pairs with the first as a watcher would: those ratios are what noise alone does to a
//!    pair, and "within noise" means a rank test does not tell a watcher's ratios from them.
//!    Then, in the same lab, watching's cost within one flood (`watching_cost`): one observer
//!    attached throughout, its watching switched on and off between short phases, which spread
//!    far less than separate segments.
//! 2. Nanoseconds per syscall, timed by a small C program (tests/bench/syscall_cost.c, built with
//!    `cc`): `getppid` (not hooked), 64-byte writes to /dev/null (hooked, no socket), and 64-byte
//!    writes on loopback TCP to an unwatched and to a watched port, under each watcher in
//!    alternating rounds; the ratio to no watcher, per round, is what each call pays.
//! 3. From traffic to alert line at low load (`alert_latency`).
//! 4. The observer's peak resident memory under issue 10's garbage flood and with 100k users
//!    placed (`memory_load`).
//!
//! Every watcher runs as a child that is stopped (SIGINT, then SIGKILL) when its handle drops,
//! so an error or Ctrl-C leaves no process and no program loaded.
//!
//! Its parts: the push flood (`floods`), the syscalls (`syscalls`), the watchers they run
//! (`watchers`), the idle check before each segment (`quiet`) and how pairs are judged
//! (`statistics`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::ensure;

mod floods;
mod quiet;
mod statistics;
mod syscalls;
mod watchers;

use floods::{FloodRound, measure_pushes, render_floods};
use quiet::wait_until_quiet_async;
pub(crate) use statistics::median;
use syscalls::{SyscallCosts, measure_syscalls, render_syscalls};
use watchers::find_in_path;

/// Bounds the throughput loss the observer is meant to stay under (issue 4).
const TARGET_LOSS_PERCENT: f64 = 3.0;

/// Holds what `openim-lab bench` measures, and how.
pub struct BenchConfig {
    /// The observer under test (a release build).
    pub observer: PathBuf,
    pub rounds: usize,
    /// Seconds of push flood per watcher and round.
    pub seconds: u64,
    pub replicas: usize,
    pub users: usize,
    /// 64-byte TCP writes per timed syscall loop (the cheaper calls run 5× as many).
    pub writes: usize,
    /// Pairs of phases watched and not within one flood (`watching_cost`); 0 skips them.
    pub watching_pairs: usize,
    /// Only the memory section.
    pub memory_only: bool,
    /// Only the alert latency section.
    pub latency_only: bool,
    /// Only watching's cost within one flood.
    pub watching_only: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Watcher {
    Nothing,
    /// Nothing again, in the push flood only: its pair with `Nothing` measures the noise.
    Control,
    /// The observer with `--capture-hook syscalls`, what it falls back to without CAP_NET_ADMIN
    /// or a cgroup v2 hierarchy.
    SyscallHook,
    /// The observer with `--capture-hook packets`, what `auto` takes where it can.
    PacketHook,
    Bpftrace,
}

impl Watcher {
    const ALL: [Self; 5] = [
        Self::Nothing,
        Self::Control,
        Self::SyscallHook,
        Self::PacketHook,
        Self::Bpftrace,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Nothing => "no observer",
            Self::Control => "no observer (control)",
            Self::SyscallHook => "observer, syscall hook",
            Self::PacketHook => "observer, packet hook",
            Self::Bpftrace => "bpftrace",
        }
    }
}

/// Holds what the watchers other than the observer need from this machine.
#[derive(Clone, Debug)]
struct Tools {
    bpftrace: Option<PathBuf>,
    /// A mounted cgroup v2 hierarchy, for `Watcher::PacketHook`'s `--cgroup-root`.
    cgroup2_root: Option<PathBuf>,
}

impl Tools {
    fn find() -> Self {
        let tools = Self {
            bpftrace: find_in_path("bpftrace"),
            cgroup2_root: mounted_cgroup2(),
        };
        if tools.bpftrace.is_none() {
            eprintln!(
                "bench: bpftrace not found (`apt-get install -y bpftrace`): its segments are \
                skipped"
            );
        }
        if tools.cgroup2_root.is_none() {
            eprintln!(
                "bench: no cgroup v2 hierarchy mounted (`mount -t cgroup2 none DIR`): the packet \
                hook's segments are skipped"
            );
        }
        tools
    }

    /// Orders the watchers of round `round`, rotated, so none always goes first; a watcher whose
    /// tool is missing is skipped, and the control unless `control`.
    fn order(&self, round: usize, control: bool) -> impl Iterator<Item = Watcher> + '_ {
        (0..Watcher::ALL.len())
            .map(move |step| Watcher::ALL[(round + step) % Watcher::ALL.len()])
            .filter(move |watcher| match watcher {
                Watcher::Bpftrace => self.bpftrace.is_some(),
                Watcher::PacketHook => self.cgroup2_root.is_some(),
                Watcher::Control => control,
                Watcher::Nothing | Watcher::SyscallHook => true,
            })
    }
}

/// Finds where a cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a
/// hybrid host), from `/proc/self/mounts`.
fn mounted_cgroup2() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let (_source, target, fstype) = (fields.next()?, fields.next()?, fields.next()?);
        (fstype == "cgroup2").then(|| PathBuf::from(target))
    })
}

/// Runs both benchmarks and returns the report to print.
///
/// # Errors
///
/// Fails on zero rounds or writes, without root, when the observer binary is missing, or when a
/// measurement fails.
pub async fn run(config: BenchConfig) -> anyhow::Result<String> {
    ensure!(config.rounds >= 1, "at least one round");
    ensure!(config.writes >= 1, "at least one write per loop");
    crate::lab::netns::require_root()?;
    ensure!(
        config.observer.is_file(),
        "observer binary {} not found: build it with `cargo xtask build --release`",
        config.observer.display()
    );
    if config.memory_only {
        return crate::memory_load::measure(&config.observer).await;
    }
    if config.latency_only {
        return crate::alert_latency::measure(&config.observer, config.replicas).await;
    }
    if config.watching_only {
        ensure!(
            config.watching_pairs >= 1,
            "--watching-only needs --watching-pairs of at least 1"
        );
        // The packet hook's observer is the only watcher here.
        let tools = Tools {
            bpftrace: None,
            cgroup2_root: mounted_cgroup2(),
        };
        ensure!(
            tools.cgroup2_root.is_some(),
            "--watching-only needs a mounted cgroup v2 hierarchy (`mount -t cgroup2 none DIR`) for \
            the packet hook"
        );
        let (_, watching) = measure_pushes(&config, &tools, 0).await?;
        return Ok(watching.map_or_else(String::new, |cost| cost.render(TARGET_LOSS_PERCENT)));
    }
    let tools = Tools::find();
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let (floods, watching) = measure_pushes(&config, &tools, config.rounds).await?;
    let syscalls = measure_syscalls(&config, &tools).await?;
    // The last syscall round's watcher (bpftrace's exit can take seconds) must be gone too.
    let quiet = wait_until_quiet_async().await?;
    let mut latency = crate::alert_latency::measure(&config.observer, config.replicas).await?;
    if !quiet.reached {
        latency.insert_str(
            0,
            &format!(
                "NOISY (the machine was {:.0}% idle when this section started): ",
                100.0 * quiet.idle_share
            ),
        );
    }
    let memory = crate::memory_load::measure(&config.observer).await?;
    let watching = watching.map_or_else(String::new, |cost| cost.render(TARGET_LOSS_PERCENT));
    Ok(render(&config, load_before.trim(), &floods, &syscalls) + &watching + &latency + &memory)
}

fn render(
    config: &BenchConfig,
    load_before: &str,
    floods: &BTreeMap<Watcher, Vec<FloodRound>>,
    syscalls: &SyscallCosts,
) -> String {
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "overhead of watching: {} rounds, watchers interleaved; {cpus} CPUs, load average before: \
        {load_before}",
        config.rounds
    );
    render_floods(&mut out, config, floods);

    render_syscalls(&mut out, config, syscalls);
    out
}
