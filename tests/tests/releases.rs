//! Every OpenIM release the lab speaks, with the real observer watching (see `tests::releases`
//! for what each must say): where push hashes over the `…:88` ring (3.5 to 3.8 with Kubernetes
//! discovery) every misrouted user alerted, no other, each with the lab's cause, and one
//! `ring_divergence`; where push broadcasts (main, or etcd discovery) no routing alert at all and
//! a `push_routing` line that says so; the correct fix after a scale-out names stale placements.
//! Users are on mixed platforms throughout.
//!
//! Needs root and an observer built with its eBPF programs (see `tests::privileges`). Tests take
//! `SERIAL`: one observer and one lab at a time.

use std::collections::BTreeSet;
use std::sync::Mutex;

use tests::observed::{ObserverOutput, Score, observe_lab};
use tests::privileges::{Needs, can_run};
use tests::releases::{CauseScore, assert_all_pass, checks, scenario};
use tests::{Discovery, GroundTruth, LabConfig, OpenImRelease, ProxyMode, PushRouting};

static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `config` beside the observer and asserts the release's checks; `None` when it cannot
/// run here.
fn observe_release(config: LabConfig) -> Option<(GroundTruth, ObserverOutput, Score)> {
    if !can_run(Needs::RootAndPrograms) {
        return None;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    let (truth, output) = observe_lab(config, &[]);
    assert_eq!(truth.summary.connect_failures, 0, "{:?}", truth.summary);
    assert_eq!(truth.summary.authority_mismatches, 0, "{:?}", truth.summary);
    assert_all_pass(&checks(&truth, &output.alerts));
    let score = Score::new(&truth, &output.alerts);
    Some((truth, output, score))
}

/// The ring runs lose users on every platform, and the lab names the spelling for each.
fn assert_spelling_misses_on_every_platform(truth: &GroundTruth, score: &Score) {
    assert!(score.missed.len() >= 20, "{:?}", truth.summary);
    assert_eq!(
        CauseScore::new(truth, &[])
            .true_causes
            .keys()
            .collect::<Vec<_>>(),
        ["ring_spelling"]
    );
    let platforms: BTreeSet<i32> = truth
        .users
        .iter()
        .filter(|user| score.missed.contains(&user.user_id))
        .map(|user| user.platform_id)
        .collect();
    assert_eq!(platforms.len(), 5, "missed users' platforms: {platforms:?}");
}

#[test]
fn release_3_7_renamed_service_every_misrouted_user_with_the_spelling_cause() {
    let config = scenario(OpenImRelease::V3_7, Discovery::Kubernetes);
    let Some((truth, _, score)) = observe_release(config) else {
        return;
    };
    assert_eq!(truth.routing, PushRouting::Ring);
    assert_spelling_misses_on_every_platform(&truth, &score);
}

#[test]
fn release_3_8_answers_out_of_order_and_every_misrouted_user_is_still_alerted() {
    let config = scenario(OpenImRelease::V3_8, Discovery::Kubernetes);
    let Some((truth, _, score)) = observe_release(config) else {
        return;
    };
    assert!(
        truth.summary.answers_out_of_order > 0,
        "{:?}",
        truth.summary
    );
    assert_spelling_misses_on_every_platform(&truth, &score);
}

/// Every message went to every gateway: 3 messages × 5 gateways calls, nobody missed one.
fn assert_broadcast(truth: &GroundTruth, output: &ObserverOutput) {
    assert_eq!(truth.routing, PushRouting::Broadcast);
    assert_eq!(truth.summary.push_calls, 15, "{:?}", truth.summary);
    assert_eq!(truth.summary.users_missing, 0, "{:?}", truth.summary);
    let routing_alerts: Vec<&String> = output
        .alert_lines
        .iter()
        .filter(|line| {
            [
                "route_mismatch",
                "ring_divergence",
                "ws_upgrade_on_grpc_port",
            ]
            .iter()
            .any(|kind| line.contains(&format!("\"kind\":\"{kind}\"")))
        })
        .collect();
    assert!(routing_alerts.is_empty(), "{routing_alerts:#?}");
}

#[test]
fn main_broadcasts_and_raises_no_routing_alert() {
    let config = scenario(OpenImRelease::Main, Discovery::Kubernetes);
    let Some((truth, output, _)) = observe_release(config) else {
        return;
    };
    assert_broadcast(&truth, &output);
}

#[test]
fn release_3_6_on_etcd_broadcasts_and_raises_no_routing_alert() {
    let config = scenario(OpenImRelease::V3_6, Discovery::Etcd);
    let Some((truth, output, _)) = observe_release(config) else {
        return;
    };
    assert_broadcast(&truth, &output);
}

#[test]
fn correct_fix_after_a_scale_out_names_only_stale_placements() {
    let config = LabConfig {
        mode: ProxyMode::Correct,
        replicas_initial: 1,
        late_users: 20,
        messages_before_scale: 1,
        ..scenario(OpenImRelease::V3_5, Discovery::Kubernetes)
    };
    let Some((truth, _, score)) = observe_release(config) else {
        return;
    };
    let early: BTreeSet<&str> = truth
        .users
        .iter()
        .filter(|user| !user.connected_after_scale)
        .map(|user| user.user_id.as_str())
        .collect();
    assert!(!score.alerted.is_empty(), "{:?}", truth.summary);
    assert!(
        score
            .alerted
            .iter()
            .all(|user| early.contains(user.as_str())),
        "alerted users placed after the scale-out: {:?}",
        score.alerted
    );
    assert_eq!(
        CauseScore::new(&truth, &[])
            .true_causes
            .keys()
            .collect::<Vec<_>>(),
        ["stale_placement"]
    );
}

/// The lab alone (no observer): 3.8's gateways answer out of order over the ring and lose the
/// misrouted users, each for the spelling; 3.6 on etcd broadcasts over kept connections and
/// loses nobody.
#[test]
fn the_lab_speaks_each_release_as_upstream() {
    if !can_run(Needs::Root) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let run = |config: LabConfig| {
        runtime.block_on(async {
            let mut lab = tests::Lab::start(config).await.expect("lab starts");
            lab.run_scenario().await.expect("scenario runs")
        })
    };
    let ring = run(scenario(OpenImRelease::V3_8, Discovery::Kubernetes));
    assert_eq!(ring.summary.authority_mismatches, 0, "{:?}", ring.summary);
    assert!(ring.summary.answers_out_of_order > 0, "{:?}", ring.summary);
    assert!(ring.summary.users_missing >= 20, "{:?}", ring.summary);
    assert!(ring.users.iter().all(|user| {
        user.miss_cause.is_none() == user.pushes.iter().all(|push| push.arrived_in_time)
            && user
                .miss_cause
                .is_none_or(|cause| cause == tests::MissCause::RingSpelling)
    }));
    let broadcast = run(scenario(OpenImRelease::V3_6, Discovery::Etcd));
    assert_eq!(broadcast.summary.push_calls, 15, "{:?}", broadcast.summary);
    assert_eq!(broadcast.summary.authority_mismatches, 0);
    assert_eq!(
        broadcast.summary.users_missing, 0,
        "{:?}",
        broadcast.summary
    );
    assert_eq!(
        broadcast.summary.users_misrouted, 0,
        "{:?}",
        broadcast.summary
    );
}
