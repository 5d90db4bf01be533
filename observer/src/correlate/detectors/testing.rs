//! Drives `Detectors` with observations as the decoders would make them.

pub(crate) use std::net::IpAddr;

pub(crate) use super::{Detectors, RouteLimits};
pub(crate) use crate::correlate::Observation;
pub(crate) use crate::{
    alert::{Alert, AlertBody, RouteMismatch},
    model::{
        ConnectionKey, Gateway, GatewayAnswer, MessageIds, NANOS_PER_SEC, PlatformResult, Process,
        UserResult,
    },
};

pub(crate) const SEC: u64 = NANOS_PER_SEC;

pub(crate) fn gateway(index: u8, port: u16, name: Option<String>) -> Gateway {
    Gateway {
        ip: IpAddr::from([10, 244, 0, 10 + index]),
        port,
        name: name.map(Into::into),
    }
}

pub(crate) fn proxy_name(index: u8) -> String {
    format!("demo-openim-msggateway-{index}.demo-openim-msggateway-headless.chat.svc.cluster.local")
}

pub(crate) fn process(pid: u32, comm: &str) -> Process {
    Process {
        pid,
        comm: comm.into(),
        cgroup_id: 0,
    }
}

/// Builds the ends of a connection: a distinct source port per connection, towards gateway `on`'s
/// WebSocket port.
pub(crate) fn endpoints(connection: u64, on: u8) -> ConnectionKey {
    ConnectionKey {
        local: (IpAddr::from([10, 244, 9, 1]), 30_000 + connection as u16).into(),
        remote: (gateway(on, 80, None).ip, 80).into(),
    }
}

pub(crate) fn place(table: &mut Detectors, connection: u64, user: &str, on: u8, ts: u64) {
    table.observe(
        Observation::UpgradeRequested {
            connection,
            endpoints: endpoints(connection, on),
            ts_ns: ts,
            user: user.into(),
            platform: Some(2),
            gateway: gateway(on, 80, Some(proxy_name(on))),
            proxy: process(10, "msggw-proxy"),
        },
        &mut Vec::new(),
    );
    table.observe(
        Observation::UpgradeAnswered {
            connection,
            ts_ns: ts,
            status: 101,
        },
        &mut Vec::new(),
    );
}

pub(crate) fn push(
    table: &mut Detectors,
    connection: u64,
    users: &[&str],
    to: u8,
    ts: u64,
    answer_online: bool,
) -> Vec<Alert> {
    let mut alerts = Vec::new();
    table.observe(
        Observation::GrpcConnectionOpened {
            connection,
            ts_ns: ts,
            pusher: process(20, "openim-push"),
        },
        &mut alerts,
    );
    table.observe(
        Observation::PushCalled {
            connection,
            stream_id: 1,
            ts_ns: ts,
            method: "SuperGroupOnlineBatchPushOneMsg".into(),
            service: None,
            gateway: gateway(to, 88, Some(format!("{}:88", proxy_name(to)))),
            pusher: process(20, "openim-push"),
            // One message per call: calls of one message to two gateways with the same
            // recipients would teach broadcast routing.
            message: MessageIds {
                client_msg_id: Some("c1".into()),
                seq: i64::try_from(connection).ok(),
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
            online_push: answer_online,
            platforms: if answer_online {
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
            connection,
            stream_id: 1,
            ts_ns: ts,
            results,
        },
        &mut alerts,
    );
    // Misses held for the message's other calls are due once its window has passed.
    let window = table.routes.window_ns();
    table.release_held(ts + window, false, &mut alerts);
    alerts
}

pub(crate) fn kinds(alerts: &[Alert]) -> Vec<&'static str> {
    alerts.iter().map(Alert::kind).collect()
}
