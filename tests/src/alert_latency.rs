//! Measures the time from traffic to alert line at low load (issue 13's target: p99 within 5 ms).
//! The lab's 3.5.1 misrouting with the real observer beside it; push sends one message to one user
//! every `PACE`, so each misrouted user raises one `route_mismatch` (the first of its fold window)
//! on an otherwise idle observer: the case where a record waits in the ring for a wakeup or for the
//! reader's timer. An alert's latency is when its line was read from the observer's stdout, minus
//! its `ts`: when the kernel recorded the gateway's answer that decided it.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use serde_json::Value;

use crate::observed::ObserverProcess;
use crate::{Lab, LabConfig};

/// Counts the pushes: one per user, each to its own user.
pub const PUSHES: usize = 200;
const PACE: Duration = Duration::from_millis(50);
/// Bounds the wait for lines still coming after the last push.
const SETTLE: Duration = Duration::from_secs(1);

/// Runs the measurement and returns its report line.
///
/// # Errors
///
/// Fails when the lab or the observer does not start, a push fails, or the observer does not stop
/// cleanly.
pub async fn measure(observer: &Path, replicas: usize) -> anyhow::Result<String> {
    let mut lab = Lab::start(LabConfig {
        replicas_initial: replicas,
        replicas_final: replicas,
        users: PUSHES,
        progress: true,
        ..LabConfig::default()
    })
    .await?;
    // Started first: the users' upgrades are what tell it where each user was placed.
    let mut process = tokio::task::block_in_place(|| ObserverProcess::start(observer, &[]))?;
    let hook = process.capture_hook();
    lab.connect_users(0..PUSHES, false).await;
    eprintln!("bench: alert latency, {PUSHES} pushes, one every {PACE:?}");
    let mut latencies_us = Vec::new();
    let mut record = |lines: Vec<(SystemTime, String)>| {
        latencies_us.extend(
            lines
                .iter()
                .filter_map(|(read_at, line)| mismatch_latency_us(*read_at, line)),
        );
    };
    for user in 0..PUSHES {
        let started = Instant::now();
        lab.push_message(
            &format!("latency-{user}"),
            i64::try_from(user)? + 1,
            vec![Lab::user_id(user)],
        )
        .await?;
        record(tokio::task::block_in_place(|| {
            process.timed_lines_until(started + PACE)
        }));
    }
    record(tokio::task::block_in_place(|| {
        process.timed_lines_until(Instant::now() + SETTLE)
    }));
    tokio::task::block_in_place(|| process.stop()).context("stop the observer")?;
    Ok(render(&mut latencies_us, &hook))
}

/// Returns how long a `route_mismatch` line took, from its `ts` to `read_at`; `None` for other
/// lines.
fn mismatch_latency_us(read_at: SystemTime, line: &str) -> Option<f64> {
    let alert: Value = serde_json::from_str(line).ok()?;
    if alert["kind"] != "route_mismatch" {
        return None;
    }
    let raised_at = humantime::parse_rfc3339(alert["ts"].as_str()?).ok()?;
    Some(read_at.duration_since(raised_at).ok()?.as_secs_f64() * 1e6)
}

/// Renders the report line; `hook` is where the observer copied the bytes, as it said at start.
fn render(latencies_us: &mut [f64], hook: &str) -> String {
    if latencies_us.is_empty() {
        return format!(
            "alert latency at low load: no route_mismatch alert in {PUSHES} pushes (is the lab \
            misrouting?)\n"
        );
    }
    latencies_us.sort_by(f64::total_cmp);
    let at = |quantile: f64| {
        let index = ((latencies_us.len() as f64 * quantile).ceil() as usize).saturating_sub(1);
        latencies_us[index.min(latencies_us.len() - 1)] / 1e3
    };
    format!(
        "alert latency at low load (capture hook {hook}; one push every {} ms, {} route_mismatch \
        alerts, from the answer's kernel timestamp to the line read from stdout): p50 {:.2} ms, \
        p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms\n",
        PACE.as_millis(),
        latencies_us.len(),
        at(0.50),
        at(0.90),
        at(0.99),
        latencies_us[latencies_us.len() - 1] / 1e3
    )
}

#[cfg(test)]
mod tests;
