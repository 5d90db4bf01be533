//! Runs benchmark 2, nanoseconds per syscall under each watcher, and their report.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Read;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use anyhow::{Context, bail, ensure};

use super::quiet::wait_until_quiet_async;
use super::statistics::{median, ratio_summary};
use super::watchers::{start_watcher, stop_watcher};
use super::{BenchConfig, Tools, Watcher};

const WRITE_SIZE: usize = 64;

/// Holds the timing program, shipped as source and built with the system's `cc` at run time.
const SYSCALL_COST_SOURCE: &str = include_str!("../../bench/syscall_cost.c");
/// Names the observer's hooks, as the syscall table names them (`ATTACHMENTS` in
/// observer/src/capture/programs.rs).
const HOOK_STRATEGY: &str = "syscall hook: per-syscall tracepoints \
    (syscalls:sys_enter_*/sys_exit_* of connect, close and the read/write family), perf tracepoint \
    path; array filters (WATCHING, CLAIMS) ahead of the hash lookups. packet hook: cgroup_skb \
    egress/ingress at the cgroup v2 root, sock:inet_sock_set_state; no syscall hooked";
/// Sets how many times more calls the cheap syscalls run than a TCP loop, for a similar duration.
const CHEAP_CALLS_FACTOR: usize = 5;

/// Names one timed loop of `syscall_cost`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Syscall {
    /// `getppid`: a syscall the observer does not hook.
    Getppid,
    /// A 64-byte write to /dev/null: hooked, but no socket, let alone a watched one.
    DevNull,
    /// A 64-byte write on loopback TCP to a port nobody watches.
    TcpUnwatched,
    /// The same to a watched port, every byte copied.
    TcpWatched,
}

impl Syscall {
    const ALL: [Self; 4] = [
        Self::Getppid,
        Self::DevNull,
        Self::TcpUnwatched,
        Self::TcpWatched,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Getppid => "getppid (not hooked)",
            Self::DevNull => "write 64 B /dev/null",
            Self::TcpUnwatched => "write 64 B TCP, unwatched port",
            Self::TcpWatched => "write 64 B TCP, watched port",
        }
    }
}

/// Builds `syscall_cost` into the temp directory; returns its path.
fn build_syscall_cost() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("openim-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let source = dir.join("syscall_cost.c");
    std::fs::write(&source, SYSCALL_COST_SOURCE)
        .with_context(|| format!("write {}", source.display()))?;
    let binary = dir.join("syscall_cost");
    let output = Command::new("cc")
        .args(["-O2", "-Wall", "-o"])
        .arg(&binary)
        .arg(&source)
        .output()
        .context("run cc (the syscall section builds a small C program): install a C compiler")?;
    ensure!(
        output.status.success(),
        "cc failed on syscall_cost.c: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(binary)
}

/// Runs one timed loop; for TCP, accepts the program's connection on `listener` and drains it so
/// the send buffer never fills and the loop times `write`, not the reader.
fn time_syscall(
    program: &Path,
    syscall: Syscall,
    calls: usize,
    listener: Option<&TcpListener>,
) -> anyhow::Result<f64> {
    let mut command = Command::new(program);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    match (syscall, listener) {
        (Syscall::Getppid, _) => {
            command.args(["getppid", &(calls * CHEAP_CALLS_FACTOR).to_string()])
        }
        (Syscall::DevNull, _) => {
            command.args(["devnull", &(calls * CHEAP_CALLS_FACTOR).to_string()])
        }
        (_, Some(listener)) => command
            .args(["tcp", &calls.to_string()])
            .arg(listener.local_addr()?.port().to_string()),
        (_, None) => bail!("a TCP loop needs a listener"),
    };
    let child = command.spawn().context("start syscall_cost")?;
    if let Some(listener) = listener {
        let (mut accepted, _) = listener
            .accept()
            .context("accept syscall_cost's connection")?;
        let mut buffer = vec![0u8; 1 << 16];
        while matches!(accepted.read(&mut buffer), Ok(read) if read > 0) {}
    }
    let output = child.wait_with_output().context("wait for syscall_cost")?;
    ensure!(
        output.status.success(),
        "syscall_cost {} failed: {}",
        syscall.label(),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .with_context(|| format!("syscall_cost {} printed no figure", syscall.label()))
}

/// Holds the nanoseconds per call of every timed loop, and the rounds that started noisy.
pub(super) struct SyscallCosts {
    /// (watcher, syscall) → ns per call of every timed loop, in round order.
    samples: BTreeMap<(Watcher, Syscall), Vec<f64>>,
    /// Rounds where a segment started on a busy machine.
    noisy_rounds: Vec<usize>,
    /// Ring-full drops the observer reported over its rounds.
    observer_drops: u64,
}

/// Times every syscall loop under each watcher, the watched and the unwatched port alike.
///
/// # Errors
///
/// Fails when `syscall_cost` cannot be built, a loopback port cannot be bound, a loop fails, or a
/// watcher does not start or stop.
pub(super) async fn measure_syscalls(
    config: &BenchConfig,
    tools: &Tools,
) -> anyhow::Result<SyscallCosts> {
    let program = tokio::task::spawn_blocking(build_syscall_cost)
        .await
        .context("cc task")??;
    let watched = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("bind loopback")?;
    let unwatched = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("bind loopback")?;
    let watched_port = watched.local_addr()?.port();
    let listeners = Arc::new((watched, unwatched));
    // A budget covering the whole connection (warm-up included): every watched write is
    // copied, the worst case.
    let budget = u32::try_from(2 * config.writes * WRITE_SIZE).unwrap_or(u32::MAX);
    let mut costs = SyscallCosts {
        samples: BTreeMap::new(),
        noisy_rounds: Vec::new(),
        observer_drops: 0,
    };
    for round in 0..config.rounds {
        // No control: every syscall ratio comes with its range over the rounds.
        for watcher in tools.order(round, false) {
            eprintln!(
                "bench: syscalls, round {}/{}, {}",
                round + 1,
                config.rounds,
                watcher.label()
            );
            let quiet = wait_until_quiet_async().await?;
            if !quiet.reached && !costs.noisy_rounds.contains(&round) {
                costs.noisy_rounds.push(round);
            }
            let process =
                start_watcher(watcher, config, tools, vec![watched_port], Some(budget)).await?;
            let (program, listeners, calls) = (program.clone(), listeners.clone(), config.writes);
            let timed = tokio::task::spawn_blocking(move || {
                Syscall::ALL
                    .into_iter()
                    .map(|syscall| {
                        let listener = match syscall {
                            Syscall::TcpWatched => Some(&listeners.0),
                            Syscall::TcpUnwatched => Some(&listeners.1),
                            _ => None,
                        };
                        Ok((syscall, time_syscall(&program, syscall, calls, listener)?))
                    })
                    .collect::<anyhow::Result<Vec<_>>>()
            })
            .await
            .context("syscall loop task")??;
            let counts = stop_watcher(process).await?;
            costs.observer_drops += counts.ring_full_drops.unwrap_or(0);
            for (syscall, nanos) in timed {
                costs
                    .samples
                    .entry((watcher, syscall))
                    .or_default()
                    .push(nanos);
            }
        }
    }
    if let Some(dir) = program.parent() {
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(costs)
}

/// Returns "median (min–max)" of nanosecond figures.
fn nanos_summary(values: &[f64]) -> String {
    if values.is_empty() {
        return "—".to_owned();
    }
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{:.0} ({min:.0}–{max:.0})", median(values))
}

/// Writes the syscall section of the report.
pub(super) fn render_syscalls(out: &mut String, config: &BenchConfig, costs: &SyscallCosts) {
    let clean: Vec<usize> = (0..config.rounds)
        .filter(|round| !costs.noisy_rounds.contains(round))
        .collect();
    let _ = writeln!(
        out,
        "\nsyscalls: ns per call, median (min–max) over {} clean of {} rounds; {} TCP writes, {} \
        other calls per loop; ratio: median of per-round ratios to no observer (min–max)\nhooks in \
        use: {HOOK_STRATEGY}",
        clean.len(),
        config.rounds,
        config.writes,
        config.writes * CHEAP_CALLS_FACTOR
    );
    let _ = writeln!(
        out,
        "{:<31} {:>18} {:>18} {:>26} {:>18} {:>26} {:>18} {:>26}",
        "call",
        "no observer ns",
        "syscall hook ns",
        "syscall hook ratio",
        "packet hook ns",
        "packet hook ratio",
        "bpftrace ns",
        "bpftrace ratio"
    );
    let clean_samples = |watcher: Watcher, syscall: Syscall| -> Vec<f64> {
        let samples = costs.samples.get(&(watcher, syscall));
        clean
            .iter()
            .filter_map(|&round| samples.and_then(|samples| samples.get(round).copied()))
            .collect()
    };
    for syscall in Syscall::ALL {
        let baseline = clean_samples(Watcher::Nothing, syscall);
        let mut line = format!("{:<31} {:>18}", syscall.label(), nanos_summary(&baseline));
        for watcher in [Watcher::SyscallHook, Watcher::PacketHook, Watcher::Bpftrace] {
            let with = clean_samples(watcher, syscall);
            if with.is_empty() {
                let _ = write!(line, " {:>18} {:>26}", "—", "not run");
                continue;
            }
            let ratios: Vec<f64> = with
                .iter()
                .zip(&baseline)
                .map(|(with, without)| with / without.max(f64::EPSILON))
                .collect();
            let _ = write!(
                line,
                " {:>18} {:>26}",
                nanos_summary(&with),
                ratio_summary(&ratios)
            );
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    let _ = writeln!(
        out,
        "observer ring-full drops during syscall loops (both hooks): {} (a dropped record still \
        paid the copy)",
        costs.observer_drops
    );
}
