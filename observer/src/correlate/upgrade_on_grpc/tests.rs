use super::super::detectors::testing::*;

#[test]
fn an_upgrade_on_the_grpc_port_names_its_users() {
    let mut table = Detectors::new(RouteLimits::default());
    let mut alerts = Vec::new();
    for (connection, user) in [(1, "a"), (2, "b"), (3, "a")] {
        table.observe(
            Observation::UpgradeOnGrpcPort {
                connection,
                ts_ns: SEC,
                user: Some(user.into()),
                gateway: gateway(0, 88, Some(format!("{}:88", proxy_name(0)))),
                proxy: process(10, "msggw-proxy"),
            },
            &mut alerts,
        );
    }
    assert_eq!(kinds(&alerts), ["ws_upgrade_on_grpc_port"]);
    table.finish(2 * SEC, &mut alerts);
    let AlertBody::WsUpgradeOnGrpcPort { users, count, .. } = &*alerts[1].body else {
        panic!("{alerts:?}");
    };
    assert_eq!(users, &["a", "b"]);
    assert_eq!(*count, 3);
}
