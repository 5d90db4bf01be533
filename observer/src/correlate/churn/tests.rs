use super::super::detectors::testing::*;

#[test]
fn one_connection_per_call_is_churn() {
    let mut table = Detectors::new(RouteLimits::default());
    let mut alerts = Vec::new();
    for call in 0..30u64 {
        alerts.extend(push(
            &mut table,
            1000 + call,
            &[],
            0,
            SEC + call * SEC / 10,
            true,
        ));
    }
    table.tick(5 * SEC, &mut alerts);
    assert_eq!(kinds(&alerts), ["push_connection_churn"]);
    let AlertBody::PushConnectionChurn {
        open_connections,
        calls_per_connection,
        ..
    } = &*alerts[0].body
    else {
        unreachable!()
    };
    // Raised as the 20th connection opens, before its call.
    assert_eq!(*open_connections, 20);
    assert!(
        (*calls_per_connection - 0.95).abs() < 0.01,
        "{calls_per_connection}"
    );
    table.tick(6 * SEC, &mut alerts);
    assert_eq!(alerts.len(), 1, "not repeated within the window");
}

#[test]
fn a_reused_connection_is_not_churn() {
    let mut table = Detectors::new(RouteLimits::default());
    let mut alerts = Vec::new();
    table.observe(
        Observation::GrpcConnectionOpened {
            connection: 1,
            ts_ns: SEC,
            pusher: process(20, "push"),
        },
        &mut alerts,
    );
    for call in 0..100u32 {
        table.observe(
            Observation::PushCalled {
                connection: 1,
                stream_id: call * 2 + 1,
                ts_ns: SEC + u64::from(call),
                method: "m".into(),
                service: None,
                gateway: gateway(0, 88, None),
                pusher: process(20, "push"),
                message: MessageIds::default(),
                recipients: Vec::new(),
            },
            &mut alerts,
        );
    }
    table.tick(5 * SEC, &mut alerts);
    assert!(alerts.is_empty());
}
