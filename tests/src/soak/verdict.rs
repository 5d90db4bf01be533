//! Weighs the soak's verdict: every observer ran through the Redis restart, every misrouted push
//! was alerted exactly once, nothing grew beyond what the load explains, and nothing was left once
//! the load stopped. The first failing criterion is the verdict's one line.

use crate::soak::alerts::AlertCounts;
use crate::soak::nodes::NodeSample;

/// Bounds resident memory's growth: it may end this much above its first steady intervals (KiB)
/// before the soak calls it growth, on top of [`RSS_GROWTH_FRACTION`]. The allocator (mimalloc)
/// keeps pages it freed and returns them lazily, the Redis outage queues facts (a few hundred bytes
/// each, a few thousand of them at the default churn: under 2 MiB) whose buffers may stay, and
/// pages of the 8 MiB ring become resident as records first reach them; none of that grows with
/// time. A leak of one 500-byte placement per reconnect grows by 28 MiB an hour at the default
/// churn (16 reconnects a second), well past it.
pub const RSS_GROWTH_SLACK_KIB: u64 = 8 * 1024;
/// Bounds the share of the first steady intervals' resident memory that may come on top (the
/// allocator's segments are sized by what is live, so its slack scales with it).
pub const RSS_GROWTH_FRACTION: f64 = 0.10;
/// Bounds the share of the first steady intervals' table entries (kernel tables, the engine's
/// connections) that may come on top, with [`entry_slack`]: a sample may fall while the sockets of
/// the batch that just reconnected are still closing.
pub const ENTRY_GROWTH_FRACTION: f64 = 0.10;

/// Counts the entries the load explains on top of the first steady intervals: the closing sockets
/// of one reconnect batch (both ends of its gateway connections, `2 × batch`), and for each gateway
/// added since, push's kept connection to it (both ends, 2 each).
pub fn entry_slack(batch: usize, gateways_added: usize) -> f64 {
    (2 * batch + 2 * gateways_added) as f64
}

/// Holds one row of the table: the cluster at one moment.
#[derive(Clone, Debug)]
pub struct Row {
    /// Seconds since the load started.
    pub at_secs: f64,
    pub phase: &'static str,
    pub nodes: Vec<NodeSample>,
    /// `DBSIZE` and `used_memory`; `None` while Redis is down.
    pub redis: Option<(u64, u64)>,
    pub alerts: AlertCounts,
    pub pushes: usize,
    pub reconnects: usize,
    pub gateways: usize,
}

/// Records what the end of the soak found in Redis.
#[derive(Clone, Copy, Debug, Default)]
pub struct RedisEnd {
    /// Placement hashes (`{u:USER}:placements`) and node indexes (`{n:NODE}:connections`)
    /// left, all of which must at least expire.
    pub placement_keys: usize,
    /// Keys with no TTL.
    pub without_ttl: usize,
}

/// Holds everything the verdict weighs.
pub struct Evidence<'a> {
    pub node_names: &'a [String],
    /// The rows taken while the load ran.
    pub load_rows: &'a [Row],
    /// The last sample after the load stopped.
    pub end: &'a Row,
    pub redis_end: RedisEnd,
    pub alerts: AlertCounts,
    pub alert_examples: String,
    /// Nodes that never said `shared_state_unreachable` `degraded`, then `recovered`.
    pub restart_unseen: Vec<String>,
    /// Nodes whose observer exited before the soak stopped it, or failed to stop.
    pub exited: Vec<String>,
    pub batch: usize,
}

/// Returns the first failing criterion, or `None` on a pass.
pub fn verdict(evidence: &Evidence<'_>) -> Option<String> {
    if let Some(node) = evidence.exited.first() {
        return Some(format!(
            "{node}'s observer exited or failed during the soak"
        ));
    }
    if let Some(node) = evidence.restart_unseen.first() {
        return Some(format!(
            "{node} did not report shared_state_unreachable degraded then recovered around the \
            Redis restart"
        ));
    }
    alert_failure(evidence)
        .or_else(|| growth_failure(evidence))
        .or_else(|| leftover_failure(evidence))
}

fn alert_failure(evidence: &Evidence<'_>) -> Option<String> {
    let alerts = evidence.alerts;
    if alerts.expected == 0 {
        return Some("the load misrouted no push: alerts went untested".to_owned());
    }
    (alerts.missed > 0 || alerts.doubled > 0 || alerts.unexpected > 0).then(|| {
        format!(
            "alerts: {} expected, {} missed, {} doubled, {} unexpected ({})",
            alerts.expected,
            alerts.missed,
            alerts.doubled,
            alerts.unexpected,
            evidence.alert_examples
        )
    })
}

/// Returns how many rows each end of the load the growth check averages: a sixth of them, 1 to 5.
pub fn growth_window(rows: usize) -> usize {
    (rows / 6).clamp(1, 5)
}

/// Names one figure of a node's sample, as the growth check reads it.
type Measure = fn(&NodeSample) -> f64;

fn growth_failure(evidence: &Evidence<'_>) -> Option<String> {
    let rows = evidence.load_rows;
    // The first row holds the start-up; the baseline is the steady rows after it.
    if rows.len() < 3 {
        return Some(format!(
            "{} rows under load: too few to judge growth (raise --minutes or lower \
            --interval-secs)",
            rows.len()
        ));
    }
    let window = growth_window(rows.len() - 1);
    let first = &rows[1..1 + window];
    let last = &rows[rows.len() - window..];
    let most = last.iter().map(|row| row.gateways).max().unwrap_or(0);
    let fewest = first.iter().map(|row| row.gateways).min().unwrap_or(0);
    let gateways_added = most.saturating_sub(fewest);
    let slack = entry_slack(evidence.batch, gateways_added);
    for (index, node) in evidence.node_names.iter().enumerate() {
        let mean = |rows: &[Row], value: Measure| {
            rows.iter().map(|row| value(&row.nodes[index])).sum::<f64>() / rows.len() as f64
        };
        let checks: [(&str, Measure, f64, f64); 3] = [
            (
                "RSS (KiB)",
                |s| s.rss_kib as f64,
                RSS_GROWTH_FRACTION,
                RSS_GROWTH_SLACK_KIB as f64,
            ),
            (
                "kernel table entries",
                |s| s.kernel_entries as f64,
                ENTRY_GROWTH_FRACTION,
                slack,
            ),
            (
                "connections tracked",
                |s| s.connections,
                ENTRY_GROWTH_FRACTION,
                slack,
            ),
        ];
        for (what, value, fraction, allowed) in checks {
            let (before, after) = (mean(first, value), mean(last, value));
            let limit = before * (1.0 + fraction) + allowed;
            if after > limit {
                return Some(format!(
                    "{node}: {what} grew from {before:.0} to {after:.0}, above the {limit:.0} the \
                    load explains"
                ));
            }
        }
    }
    None
}

fn leftover_failure(evidence: &Evidence<'_>) -> Option<String> {
    for (node, sample) in evidence.node_names.iter().zip(&evidence.end.nodes) {
        let left: Vec<String> = sample
            .kernel_by_table
            .iter()
            .filter(|(_, count)| *count > 0)
            .map(|(table, count)| format!("{table} {count}"))
            .collect();
        if sample.connections != 0.0 || sample.users != 0.0 || !left.is_empty() {
            return Some(format!(
                "{node}: left after the load stopped: {} connections, {} users, kernel entries \
                [{}]",
                sample.connections,
                sample.users,
                left.join(", ")
            ));
        }
    }
    let redis = evidence.redis_end;
    (redis.without_ttl > 0).then(|| {
        format!(
            "Redis: {} keys without a TTL after the load stopped ({} placement keys left)",
            redis.without_ttl, redis.placement_keys
        )
    })
}

#[cfg(test)]
mod tests;
