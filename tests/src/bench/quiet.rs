//! Says whether the machine is quiet enough for a segment to start.

use std::time::{Duration, Instant};

use anyhow::Context;

/// Sets the share of all CPU time over one sample that must be idle for the machine to count as
/// quiet.
const QUIET_IDLE_SHARE: f64 = 0.85;
const QUIET_SAMPLE: Duration = Duration::from_millis(500);
/// Bounds the wait for quiet: past this a segment starts anyway and its round is flagged noisy.
const QUIET_WAIT: Duration = Duration::from_secs(20);

/// Records what the idle check before a segment saw.
#[derive(Clone, Copy, Debug)]
pub(super) struct Quiet {
    pub(super) reached: bool,
    /// Idle share of all CPU time in the last sample.
    pub(super) idle_share: f64,
    pub(super) waited: Duration,
}

/// Returns the idle and total jiffies over all CPUs, from the first line of /proc/stat.
fn cpu_jiffies() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .filter_map(|field| field.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    let idle = fields.get(3)? + fields.get(4).copied().unwrap_or(0);
    let total = fields.iter().take(8).sum();
    Some((idle, total))
}

/// Waits, at most `QUIET_WAIT`, until one sample of `QUIET_SAMPLE` is mostly idle. Blocking:
/// run it off the async threads.
fn wait_until_quiet() -> Quiet {
    let started = Instant::now();
    loop {
        let before = cpu_jiffies();
        std::thread::sleep(QUIET_SAMPLE);
        let idle_share = match (before, cpu_jiffies()) {
            (Some((idle0, total0)), Some((idle1, total1))) if total1 > total0 => {
                (idle1 - idle0) as f64 / (total1 - total0) as f64
            }
            // /proc/stat unreadable: nothing to wait on, and nothing known.
            _ => f64::NAN,
        };
        let reached = idle_share.is_nan() || idle_share >= QUIET_IDLE_SHARE;
        if reached || started.elapsed() >= QUIET_WAIT {
            return Quiet {
                reached,
                idle_share,
                waited: started.elapsed(),
            };
        }
    }
}

/// Waits until the machine is quiet, as `wait_until_quiet` does, off the async threads; says so on
/// stderr when it stayed busy.
///
/// # Errors
///
/// Fails when the blocking task panics or is cancelled.
pub(super) async fn wait_until_quiet_async() -> anyhow::Result<Quiet> {
    let quiet = tokio::task::spawn_blocking(wait_until_quiet)
        .await
        .context("idle check task")?;
    if !quiet.reached {
        eprintln!(
            "bench:   machine still busy after {} s ({:.0}% idle): this round is flagged noisy",
            quiet.waited.as_secs(),
            100.0 * quiet.idle_share
        );
    }
    Ok(quiet)
}
