use super::super::detectors::testing::*;
use crate::alert::{AlertBody, PushRoutingMode};

/// Push calls gateway `to` for message `id` with `users`, on a long-lived connection (one
/// stream per call), and the gateway answers each user with an empty entry.
fn call(table: &mut Detectors, id: &str, users: &[&str], to: u8, ts: u64) -> Vec<Alert> {
    let mut alerts = Vec::new();
    let stream_id = u32::from(to) * 2 + 1;
    table.observe(
        Observation::PushCalled {
            connection: 900 + u64::from(to),
            stream_id,
            ts_ns: ts,
            method: "SuperGroupOnlineBatchPushOneMsg".into(),
            service: Some("openim.msggateway.msgGateway".into()),
            gateway: gateway(to, 88, Some(format!("{}:88", proxy_name(to)))),
            pusher: process(20, "openim-push"),
            message: MessageIds {
                client_msg_id: Some(id.into()),
                ..MessageIds::default()
            },
            recipients: users.iter().map(|&user| user.into()).collect(),
        },
        &mut alerts,
    );
    let results = users
        .iter()
        .map(|user| UserResult {
            user_id: (*user).into(),
            ..UserResult::default()
        })
        .collect();
    table.observe(
        Observation::PushAnswered {
            connection: 900 + u64::from(to),
            stream_id,
            ts_ns: ts,
            results,
        },
        &mut alerts,
    );
    alerts
}

fn routing_lines(alerts: &[Alert]) -> Vec<(String, PushRoutingMode)> {
    alerts
        .iter()
        .filter_map(|alert| match &*alert.body {
            AlertBody::PushRouting {
                service, routing, ..
            } => Some((service.clone(), *routing)),
            _ => None,
        })
        .collect()
}

fn mismatched_users(alerts: &[Alert]) -> Vec<String> {
    alerts
        .iter()
        .filter_map(|alert| match &*alert.body {
            AlertBody::RouteMismatch(mismatch) => Some(mismatch.user.to_string()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_message_sent_to_every_gateway_is_no_miss() {
    let mut table = Detectors::new(RouteLimits::default());
    place(&mut table, 1, "u1", 0, SEC);
    place(&mut table, 2, "u2", 1, SEC);
    let mut alerts = Vec::new();
    for to in 0..3 {
        alerts.extend(call(&mut table, "m1", &["u1", "u2"], to, 2 * SEC));
    }
    table.tick(10 * SEC, &mut alerts);
    table.finish(11 * SEC, &mut alerts);
    assert_eq!(mismatched_users(&alerts), Vec::<String>::new());
    assert_eq!(
        routing_lines(&alerts),
        [(
            "openim.msggateway.msgGateway".to_owned(),
            PushRoutingMode::Broadcast
        )]
    );
    let counters = table.counters().routing;
    assert_eq!(
        counters.misses_held, 4,
        "u1 on gateways 1 and 2, u2 on 0 and 2"
    );
    assert_eq!(counters.misses_covered_by_broadcast, 4);
    assert!(
        !alerts.iter().any(|alert| alert.kind() == "ring_divergence"),
        "no push ring exists to diverge from"
    );
}

#[test]
fn a_broadcast_that_misses_the_users_gateway_is_a_miss() {
    let mut table = Detectors::new(RouteLimits::default());
    place(&mut table, 1, "u1", 4, SEC);
    let mut alerts = Vec::new();
    for to in 0..3 {
        alerts.extend(call(&mut table, "m1", &["u1"], to, 2 * SEC));
    }
    table.tick(4 * SEC, &mut alerts);
    assert_eq!(
        mismatched_users(&alerts),
        ["u1"],
        "one line, not one per gateway"
    );
}

#[test]
fn a_split_message_teaches_the_ring_and_later_misses_are_judged_at_once() {
    let mut table = Detectors::new(RouteLimits::default());
    place(&mut table, 1, "u1", 0, SEC);
    place(&mut table, 2, "u2", 0, SEC);
    let mut alerts = call(&mut table, "m1", &["u1"], 0, 2 * SEC);
    alerts.extend(call(&mut table, "m1", &["u2"], 1, 2 * SEC));
    assert!(mismatched_users(&alerts).is_empty(), "held for the window");
    table.tick(4 * SEC, &mut alerts);
    assert_eq!(mismatched_users(&alerts), ["u2"]);
    assert_eq!(
        routing_lines(&alerts).len(),
        1,
        "learned once the window passed"
    );
    assert_eq!(routing_lines(&alerts)[0].1, PushRoutingMode::Ring);
    let later = call(&mut table, "m2", &["u1"], 2, 21 * SEC);
    assert_eq!(mismatched_users(&later), ["u1"], "judged at once");
}

#[test]
fn calls_without_ids_are_not_judged_under_broadcast() {
    let mut table = Detectors::new(RouteLimits::default());
    place(&mut table, 1, "u1", 0, SEC);
    let mut alerts = Vec::new();
    for to in 0..2 {
        alerts.extend(call(&mut table, "m1", &["u1"], to, 2 * SEC));
    }
    let mut anonymous = Vec::new();
    table.observe(
        Observation::PushCalled {
            connection: 950,
            stream_id: 1,
            ts_ns: 3 * SEC,
            method: "SuperGroupOnlineBatchPushOneMsg".into(),
            service: Some("openim.msggateway.msgGateway".into()),
            gateway: gateway(1, 88, None),
            pusher: process(20, "openim-push"),
            message: MessageIds::default(),
            recipients: vec!["u1".into()],
        },
        &mut anonymous,
    );
    table.finish(10 * SEC, &mut alerts);
    assert!(mismatched_users(&alerts).is_empty());
    assert_eq!(table.counters().routing.calls_unjudged_without_ids, 1);
}
