use super::super::detectors::testing::*;

#[test]
fn unanswered_calls_are_judged_on_close_and_timeout() {
    let mut table = Detectors::new(RouteLimits::default());
    place(&mut table, 1, "u1", 0, SEC);
    let mut alerts = Vec::new();
    table.observe(
        Observation::PushCalled {
            connection: 2,
            stream_id: 1,
            ts_ns: 2 * SEC,
            method: "OnlinePushMsg".into(),
            service: None,
            gateway: gateway(1, 88, None),
            pusher: process(20, "push"),
            message: MessageIds::default(),
            recipients: vec!["u1".into()],
        },
        &mut alerts,
    );
    assert!(alerts.is_empty());
    table.tick(3 * SEC, &mut alerts);
    assert!(alerts.is_empty(), "still within the answer timeout");
    table.tick(10 * SEC, &mut alerts);
    assert_eq!(kinds(&alerts), ["route_mismatch"]);
    let AlertBody::RouteMismatch(RouteMismatch { pushed_to, .. }) = &*alerts[0].body else {
        unreachable!()
    };
    assert_eq!(pushed_to.answer, GatewayAnswer::Unknown);
}

/// OpenIM's gateway answers in the request's order; answers in another order (or fewer)
/// are still matched by user id.
#[test]
fn each_recipient_is_judged_with_its_own_answer_in_any_order() {
    for answered in [["u1", "u2"], ["u2", "u1"]] {
        let mut table = Detectors::new(RouteLimits::default());
        place(&mut table, 1, "u1", 0, SEC);
        place(&mut table, 2, "u2", 0, SEC);
        let mut alerts = Vec::new();
        table.observe(
            Observation::PushCalled {
                connection: 3,
                stream_id: 1,
                ts_ns: 2 * SEC,
                method: "SuperGroupOnlineBatchPushOneMsg".into(),
                service: None,
                gateway: gateway(1, 88, None),
                pusher: process(20, "push"),
                message: MessageIds::default(),
                recipients: vec!["u1".into(), "u2".into()],
            },
            &mut alerts,
        );
        // u1 is not online on gateway 1; u2 is (a connection the observer did not see).
        let results = answered
            .iter()
            .map(|user| UserResult {
                user_id: (*user).into(),
                online_push: *user == "u2",
                platforms: if *user == "u2" {
                    vec![PlatformResult {
                        platform_id: 2,
                        result_code: 0,
                    }]
                } else {
                    Vec::new()
                },
            })
            .collect();
        table.observe(
            Observation::PushAnswered {
                connection: 3,
                stream_id: 1,
                ts_ns: 2 * SEC,
                results,
            },
            &mut alerts,
        );
        let answers: Vec<(&str, GatewayAnswer)> = alerts
            .iter()
            .filter_map(|alert| match &*alert.body {
                AlertBody::RouteMismatch(RouteMismatch {
                    user, pushed_to, ..
                }) => Some((user.as_str(), pushed_to.answer)),
                _ => None,
            })
            .collect();
        assert_eq!(
            answers,
            [
                ("u1", GatewayAnswer::EmptyEntry),
                ("u2", GatewayAnswer::Delivered)
            ],
            "answered as {answered:?}"
        );
    }
}

#[test]
fn a_full_call_table_judges_its_oldest_calls_rather_than_refusing_new_ones() {
    let mut table = Detectors::new(RouteLimits {
        max_pending_calls: 4,
        ..RouteLimits::default()
    });
    place(&mut table, 1, "u1", 0, SEC);
    let mut alerts = Vec::new();
    for stream_id in 1..=5u32 {
        table.observe(
            Observation::PushCalled {
                connection: 2,
                stream_id,
                ts_ns: 2 * SEC + u64::from(stream_id),
                method: "OnlinePushMsg".into(),
                service: None,
                gateway: gateway(1, 88, None),
                pusher: process(20, "push"),
                message: MessageIds::default(),
                recipients: vec!["u1".into()],
            },
            &mut alerts,
        );
    }
    // The oldest call was judged (u1 sits on gateway 0, the call went to 1) to make room.
    assert_eq!(kinds(&alerts), ["route_mismatch"]);
    assert_eq!(table.counters().pending_calls_evicted, 1);
    assert_eq!(table.push_calls.pending(), 4);
}
