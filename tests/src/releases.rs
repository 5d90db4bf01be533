//! Checks what the observer must say on each OpenIM release and routing, checked against the lab's
//! ground truth: where push hashes over a ring, every user who missed a message alerted and no
//! other, each with the lab's cause, and one `ring_divergence` exactly where the rings are spelled
//! differently; where push broadcasts, no routing alert of any kind and a `push_routing` line that
//! says so. `cargo xtask demo` prints these checks; `tests/tests/releases.rs` asserts them.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use crate::lab::release::{Discovery, OpenImRelease, PushRouting};
use crate::lab::truth::GroundTruth;
use crate::observed::Score;
use crate::{LabConfig, ProxyMode};

/// Records one thing the observer had to get right, and whether it did.
#[derive(Clone, Debug)]
pub struct Check {
    pub passed: bool,
    /// What was checked and what was found, in one line.
    pub line: String,
}

impl Check {
    fn new(passed: bool, line: String) -> Self {
        Self { passed, line }
    }
}

/// Scores how each `route_mismatch` alert's `cause` compares with the lab's cause for its user.
#[derive(Debug, Default)]
pub struct CauseScore {
    /// Users who missed a message, by the cause the lab knows (`ring_spelling`, …).
    pub true_causes: BTreeMap<String, usize>,
    /// Alerts about users who did miss a message whose `cause` is the lab's.
    pub right: usize,
    /// The others: (user, the alert's cause, the lab's cause), one per alert.
    pub wrong: Vec<(String, String, String)>,
}

impl CauseScore {
    /// Scores the `route_mismatch` alerts' causes against `truth`.
    pub fn new(truth: &GroundTruth, alerts: &[Value]) -> Self {
        let true_cause: BTreeMap<&str, &str> = truth
            .users
            .iter()
            .filter_map(|user| Some((user.user_id.as_str(), user.miss_cause?.as_str())))
            .collect();
        let mut score = Self::default();
        for cause in true_cause.values() {
            *score.true_causes.entry((*cause).to_owned()).or_insert(0) += 1;
        }
        for alert in alerts
            .iter()
            .filter(|alert| alert["kind"] == "route_mismatch")
        {
            let Some(user) = alert["user"].as_str() else {
                continue;
            };
            let Some(truth) = true_cause.get(user) else {
                continue;
            };
            let said = alert["cause"].as_str().unwrap_or("(none)");
            if said == *truth {
                score.right += 1;
            } else {
                score
                    .wrong
                    .push((user.to_owned(), said.to_owned(), (*truth).to_owned()));
            }
        }
        score
    }
}

/// Returns a small run of `release` with `discovery`: 5 gateways, 40 users on mixed platforms (iOS,
/// Android, Windows, OSX, Web in turn), 3 group messages, the proxy as shipped.
pub fn scenario(release: OpenImRelease, discovery: Discovery) -> LabConfig {
    LabConfig {
        mode: ProxyMode::V351,
        openim: release,
        discovery,
        replicas_initial: 5,
        replicas_final: 5,
        users: 40,
        messages_per_user: 3,
        realtime_timeout: Duration::from_secs(2),
        ..LabConfig::default()
    }
}

/// Returns the `ring_divergence` lines that open an incident (not those that close one).
fn divergences(alerts: &[Value]) -> Vec<&Value> {
    alerts
        .iter()
        .filter(|alert| alert["kind"] == "ring_divergence" && alert["state"] != "resolved")
        .collect()
}

/// Counts the `ring_divergence` incidents the run must raise: one where push's ring exists and the
/// proxy spells its members differently over more than one gateway, else none.
fn expected_divergences(truth: &GroundTruth) -> usize {
    let spelled_apart = truth.mode == ProxyMode::V351.as_str();
    usize::from(truth.routing == PushRouting::Ring && spelled_apart && truth.replicas_final > 1)
}

/// Checks the observer's `alerts` against `truth` for the run's release and routing.
pub fn checks(truth: &GroundTruth, alerts: &[Value]) -> Vec<Check> {
    let score = Score::new(truth, alerts);
    let mut checks = vec![routing_line(truth, alerts)];
    match truth.routing {
        PushRouting::Ring => {
            checks.push(exactness(&score));
            checks.push(causes(&CauseScore::new(truth, alerts)));
        }
        PushRouting::Broadcast => {
            checks.push(Check::new(
                score.missed.is_empty(),
                format!(
                    "lab: push sent every message to every gateway; {} users missed one",
                    score.missed.len()
                ),
            ));
            checks.push(Check::new(
                score.count("route_mismatch") == 0,
                format!(
                    "route_mismatch: {} (none expected where push broadcasts)",
                    score.count("route_mismatch")
                ),
            ));
        }
    }
    checks.push(divergence(truth, alerts));
    checks
}

/// Checks the `push_routing` line: the routing and service the run used, printed at least once.
fn routing_line(truth: &GroundTruth, alerts: &[Value]) -> Check {
    let routing = truth.routing.as_str();
    let service = truth.openim.service();
    let lines: Vec<&Value> = alerts
        .iter()
        .filter(|alert| alert["kind"] == "push_routing")
        .collect();
    let matching = lines
        .iter()
        .filter(|line| line["routing"] == routing && line["service"] == service)
        .count();
    let said: Vec<String> = lines
        .iter()
        .map(|line| {
            let field = |name: &str| line[name].as_str().unwrap_or("(none)").to_owned();
            format!("{} via {}", field("routing"), field("service"))
        })
        .collect();
    Check::new(
        matching >= 1,
        format!(
            "push_routing: {matching} line(s) saying {routing} via {service} (all said: {})",
            if said.is_empty() {
                "nothing".to_owned()
            } else {
                said.join(", ")
            }
        ),
    )
}

fn exactness(score: &Score) -> Check {
    Check::new(
        score.false_positives.is_empty() && score.false_negatives.is_empty(),
        format!(
            "route_mismatch: precision {:.1}%, recall {:.1}% ({} alerted, {} missed; false alarms \
            {:?}, unalerted {:?})",
            score.precision() * 100.0,
            score.recall() * 100.0,
            score.alerted.len(),
            score.missed.len(),
            score.false_positives,
            score.false_negatives
        ),
    )
}

fn causes(score: &CauseScore) -> Check {
    let scored = score.right + score.wrong.len();
    let first_wrong = score
        .wrong
        .first()
        .map(|(user, said, truth)| format!("; first wrong: user {user} said {said}, truly {truth}"))
        .unwrap_or_default();
    Check::new(
        score.wrong.is_empty(),
        format!(
            "causes: {} of {scored} alerts name the lab's cause (truth by user: {:?}){first_wrong}",
            score.right, score.true_causes
        ),
    )
}

fn divergence(truth: &GroundTruth, alerts: &[Value]) -> Check {
    let opened = divergences(alerts);
    let expected = expected_divergences(truth);
    let states: Vec<String> = opened
        .iter()
        .map(|alert| alert["state"].as_str().unwrap_or("(no state)").to_owned())
        .collect();
    Check::new(
        opened.len() == expected && states.iter().all(|state| state == "diverged"),
        format!(
            "ring_divergence: {} (expected {expected}; states {states:?})",
            opened.len()
        ),
    )
}

/// Panics listing every check, failed ones first, if any failed.
pub fn assert_all_pass(checks: &[Check]) {
    let failed: Vec<&str> = checks
        .iter()
        .filter(|check| !check.passed)
        .map(|check| check.line.as_str())
        .collect();
    let passed: Vec<&str> = checks
        .iter()
        .filter(|check| check.passed)
        .map(|check| check.line.as_str())
        .collect();
    assert!(
        failed.is_empty(),
        "failed:\n  {}\npassed:\n  {}",
        failed.join("\n  "),
        passed.join("\n  ")
    );
}
