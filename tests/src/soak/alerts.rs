//! Tallies the soak's alerts against its ground truth: every push the lab saw misrouted must bring
//! exactly one `route_mismatch` line cluster-wide, naming the user and the message.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Bounds the wait for an alert: a call without an answer is judged 5 s after it; a cluster-wide
/// lookup and the claim add round trips. A misrouted push with no line after this long is missed.
pub const JUDGE_GRACE: Duration = Duration::from_secs(10);

/// Names a delivery: (user, clientMsgID).
type Delivery = (String, String);

/// Tallies what the lab expects and what the observers printed, so far.
#[derive(Debug, Default)]
pub struct AlertTally {
    /// Misrouted deliveries, with when their push was sent.
    expected: HashMap<Delivery, Instant>,
    /// `route_mismatch` first lines (`count` 1) per delivery, over every node.
    printed: HashMap<Delivery, usize>,
    /// `route_mismatch` lines closing a fold window (`count` > 1): repeats within a window,
    /// which the soak's spacing of pushes should never make.
    pub summaries: usize,
    /// Other alerts, by kind (`capture_degraded` included).
    pub other: BTreeMap<String, usize>,
    /// Per node: `capture_degraded` `shared_state_unreachable` states seen, in order.
    pub shared_state: HashMap<String, Vec<String>>,
}

/// Holds the tally's figures at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AlertCounts {
    pub expected: usize,
    /// Expected deliveries with at least one line.
    pub printed: usize,
    /// Expected deliveries older than [`JUDGE_GRACE`] with no line.
    pub missed: usize,
    /// Deliveries with more than one line cluster-wide.
    pub doubled: usize,
    /// Deliveries with a line that the lab did not see misrouted.
    pub unexpected: usize,
}

impl AlertTally {
    /// Notes a push of `client_msg_id` sent at `sent_at` that missed `misrouted` users.
    pub fn expect(&mut self, client_msg_id: &str, sent_at: Instant, misrouted: &[String]) {
        for user in misrouted {
            self.expected
                .insert((user.clone(), client_msg_id.to_owned()), sent_at);
        }
    }

    /// Files one stdout line of `node`'s observer.
    pub fn add_line(&mut self, node: &str, line: &str) {
        let Ok(alert) = serde_json::from_str::<Value>(line) else {
            return;
        };
        let Some(kind) = alert["kind"].as_str() else {
            return;
        };
        match kind {
            "observer_started" => {}
            "route_mismatch" if alert["count"].as_u64().unwrap_or(1) > 1 => self.summaries += 1,
            "route_mismatch" => {
                let user = alert["user"].as_str().unwrap_or_default().to_owned();
                let message = alert["pushed_to"]["message"]["client_msg_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                *self.printed.entry((user, message)).or_default() += 1;
            }
            _ => {
                *self.other.entry(kind.to_owned()).or_default() += 1;
                if kind == "capture_degraded" && alert["reason"] == "shared_state_unreachable" {
                    let state = alert["state"].as_str().unwrap_or("?").to_owned();
                    self.shared_state
                        .entry(node.to_owned())
                        .or_default()
                        .push(state);
                }
            }
        }
    }

    /// Returns the figures now.
    pub fn counts(&self, now: Instant) -> AlertCounts {
        let lines = |delivery: &Delivery| self.printed.get(delivery).copied().unwrap_or(0);
        AlertCounts {
            expected: self.expected.len(),
            printed: self.expected.keys().filter(|d| lines(d) > 0).count(),
            missed: self
                .expected
                .iter()
                .filter(|(d, sent)| lines(d) == 0 && now.duration_since(**sent) > JUDGE_GRACE)
                .count(),
            doubled: self.printed.values().filter(|lines| **lines > 1).count(),
            unexpected: self
                .printed
                .keys()
                .filter(|d| !self.expected.contains_key(*d))
                .count(),
        }
    }

    /// Returns a few of the deliveries behind a failed count, for the verdict's line.
    pub fn examples(&self, now: Instant) -> String {
        let lines = |delivery: &Delivery| self.printed.get(delivery).copied().unwrap_or(0);
        let missed = self
            .expected
            .iter()
            .filter(|(d, sent)| lines(d) == 0 && now.duration_since(**sent) > JUDGE_GRACE)
            .map(|((user, message), _)| format!("missed {user}/{message}"));
        let doubled = self
            .printed
            .iter()
            .filter(|(_, lines)| **lines > 1)
            .map(|((user, message), lines)| format!("{lines} lines for {user}/{message}"));
        let unexpected = self
            .printed
            .keys()
            .filter(|d| !self.expected.contains_key(*d))
            .map(|(user, message)| format!("unexpected {user}/{message}"));
        missed
            .chain(doubled)
            .chain(unexpected)
            .take(5)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Returns the nodes whose last `shared_state_unreachable` state is `state`, among `nodes`.
    pub fn nodes_in_state(&self, nodes: &[String], state: &str) -> HashSet<String> {
        nodes
            .iter()
            .filter(|node| {
                self.shared_state
                    .get(*node)
                    .and_then(|states| states.last())
                    .is_some_and(|last| last == state)
            })
            .cloned()
            .collect()
    }
}
