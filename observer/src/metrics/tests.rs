use super::*;

fn route_mismatch(user: &str, gateway: [u8; 4]) -> Alert {
    use crate::{
        alert::{GatewayInfo, PushInfo, RouteMismatch},
        model::{Gateway, GatewayAnswer, MessageIds, MismatchCause, Process},
    };
    let process = Process {
        pid: 1,
        comm: "push".into(),
        cgroup_id: 0,
    };
    let body = RouteMismatch {
        user: user.into(),
        placed_on: Vec::new(),
        pushed_to: PushInfo {
            gateway: GatewayInfo {
                gateway: Gateway {
                    ip: std::net::IpAddr::from(gateway),
                    port: 10140,
                    name: None,
                },
                pod: None,
            },
            method: "OnlinePushMsg".into(),
            message: MessageIds::default(),
            pusher: process.into(),
            answer: GatewayAnswer::EmptyEntry,
            answer_platforms: Vec::new(),
            node: None,
        },
        count: 1,
        window_secs: 60,
        spelling_difference: None,
        cause: MismatchCause::RingSpelling,
    };
    Alert::new(1, AlertBody::RouteMismatch(body))
}

#[test]
fn route_mismatches_count_recipients_by_gateway_and_users_now() {
    let mut metrics = Metrics::default();
    let mut engine = EngineCounters::default();
    engine.routes.push_recipients_judged = 40;
    metrics.update(&KernelCounters::default(), &engine);
    metrics.alert_printed(&route_mismatch("alice", [10, 0, 0, 2]), 0.001);
    metrics.alert_printed(&route_mismatch("alice", [10, 0, 0, 2]), 0.001);
    metrics.alert_printed(&route_mismatch("bob", [10, 0, 0, 3]), 0.001);
    // Bob's window closes on 5 misses in all: the summary adds the 4 repeats.
    let mut summary = route_mismatch("bob", [10, 0, 0, 3]);
    if let AlertBody::RouteMismatch(body) = summary.body_mut() {
        body.count = 5;
    }
    metrics.alert_printed(&summary, 0.001);
    let text = metrics.render();
    for expected in [
        "openim_observer_misrouted_recipients_total{gateway=\"10.0.0.2\"} 2",
        "openim_observer_misrouted_recipients_total{gateway=\"10.0.0.3\"} 5",
        "openim_observer_push_recipients_judged_total 40",
        "openim_observer_misrouted_users 2",
        "openim_observer_alerts_total{kind=\"route_mismatch\"} 4",
    ] {
        assert!(text.contains(expected), "{expected} missing: {text}");
    }
}

#[test]
fn build_info_and_process_series_are_exported() {
    let metrics = Metrics::default();
    metrics.set_capture_hook("packets");
    let text = metrics.render();
    let build_info = format!(
        "openim_observer_build_info{{version=\"{}\",commit=\"{COMMIT}\",capture_hook=\"packets\"}} \
        1",
        env!("CARGO_PKG_VERSION")
    );
    assert!(text.contains(&build_info), "{text}");
    for series in [
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_virtual_memory_bytes ",
        "process_open_fds ",
        "process_max_fds ",
        "process_start_time_seconds ",
    ] {
        assert!(
            text.lines().any(|line| line.starts_with(series)),
            "{series} missing: {text}"
        );
    }
    assert!(text.ends_with("# EOF\n"), "{text}");
}
