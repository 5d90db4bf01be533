//! End-to-end lab scenarios. They need root (network namespaces, veth, bridge; without it they
//! skip, see `tests::privileges`) and take turns (a lock below);
//! `cargo test -p tests --test lab -- --test-threads=1` keeps their output tidy.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use tests::lab::netns::leftovers;
use tests::privileges::{Needs, can_run};
use tests::{GroundTruth, Lab, LabConfig, ProxyMode};

/// Every scenario stops by itself well within this.
const TEST_TIMEOUT: Duration = Duration::from_secs(90);

fn config(mode: ProxyMode, replicas: usize, users: usize) -> LabConfig {
    LabConfig {
        mode,
        replicas_initial: replicas,
        replicas_final: replicas,
        users,
        lab_binary: Some(PathBuf::from(env!("CARGO_BIN_EXE_openim-lab"))),
        ..LabConfig::default()
    }
}

/// Labs run one at a time even without `--test-threads=1`: two cores, and timing matters.
static ONE_LAB_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn bounded<T>(work: impl Future<Output = anyhow::Result<T>>) -> T {
    let _turn = ONE_LAB_AT_A_TIME.lock().await;
    match tokio::time::timeout(TEST_TIMEOUT, work).await {
        Ok(Ok(value)) => value,
        Ok(Err(error)) => panic!("lab failed: {error:#}"),
        Err(_) => panic!("lab scenario did not finish within {TEST_TIMEOUT:?}"),
    }
}

async fn scenario(config: LabConfig) -> GroundTruth {
    bounded(async {
        let mut lab = Lab::start(config).await?;
        let truth = lab.run_scenario().await?;
        let prefix = lab.prefix().to_owned();
        drop(lab);
        assert_eq!(
            leftovers(&prefix)?,
            Vec::<String>::new(),
            "lab left things behind"
        );
        Ok(truth)
    })
    .await
}

/// Push calls reached the gateways with `:authority` = the push member string, and every
/// upgrade reached its gateway with `Host` = the member string the proxy hashed (no port).
fn assert_wire_names_are_openims(truth: &GroundTruth) {
    assert!(
        truth.summary.push_calls > 0,
        "no push call reached a gateway"
    );
    assert_eq!(truth.summary.authority_mismatches, 0);
    for user in &truth.users {
        if let Some(placement) = &user.websocket {
            // As shipped and in the correct fix the proxy dials the name without port.
            let gateway = &truth.gateways[placement.gateway_index];
            assert_eq!(
                placement.host_header, gateway.proxy_member,
                "user {}",
                user.user_id
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_shipped_five_replicas_most_users_miss_real_time() {
    if !can_run(Needs::Root) {
        return;
    }
    let truth = scenario(config(ProxyMode::V351, 5, 200)).await;
    let summary = &truth.summary;
    assert_eq!(summary.connected, 200, "{summary:?}");
    let missing_share = summary.users_missing as f64 / summary.users as f64;
    // About 1 - 1/5 of users hash differently on the two rings.
    assert!((0.6..0.95).contains(&missing_share), "{summary:?}");
    assert_eq!(
        summary.users_missing, summary.users_misrouted,
        "{summary:?}"
    );
    assert!(truth.gateways[0].proxy_member.starts_with(
        "demo-openim-msggateway-0.demo-openim-msggateway-headless.chat.svc.cluster.local"
    ));
    assert_wire_names_are_openims(&truth);
    for user in &truth.users {
        let placement = user.websocket.as_ref().expect("connected");
        for push in &user.pushes {
            // The gateway that got the push answers `onlinePush` exactly when it holds the user
            // on a push terminal (iOS, Android): a Windows, OSX or Web delivery is not listed.
            let here = push.gateway_index == Some(placement.gateway_index);
            let terminal = [1, 2].contains(&user.platform_id);
            assert_eq!(push.online_push, here && terminal, "user {}", user.user_id);
            assert_eq!(push.arrived_in_time, here, "user {}", user.user_id);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn correct_fix_delivers_every_message_in_real_time() {
    if !can_run(Needs::Root) {
        return;
    }
    let truth = scenario(config(ProxyMode::Correct, 5, 200)).await;
    assert_eq!(truth.summary.connected, 200, "{:?}", truth.summary);
    assert_eq!(truth.summary.realtime_misses, 0, "{:?}", truth.summary);
    assert_wire_names_are_openims(&truth);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_delivers_every_message_in_real_time() {
    if !can_run(Needs::Root) {
        return;
    }
    let truth = scenario(LabConfig {
        messages_per_user: 3,
        ..config(ProxyMode::V351, 1, 50)
    })
    .await;
    assert_eq!(truth.summary.connected, 50, "{:?}", truth.summary);
    assert_eq!(truth.summary.deliveries, 150);
    assert_eq!(truth.summary.realtime_misses, 0, "{:?}", truth.summary);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_fix_sends_upgrades_to_the_grpc_port_and_websockets_fail() {
    if !can_run(Needs::Root) {
        return;
    }
    let truth = scenario(config(ProxyMode::ReportFix, 5, 20)).await;
    assert_eq!(truth.summary.connected, 0, "{:?}", truth.summary);
    assert_eq!(truth.summary.connect_failures, 20);
    for user in &truth.users {
        let error = user.connect_error.as_deref().expect("failed");
        assert!(error.contains("502") && error.contains(":88"), "{error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_out_keeps_websockets_where_they_were_placed() {
    if !can_run(Needs::Root) {
        return;
    }
    let truth = scenario(LabConfig {
        replicas_initial: 1,
        late_users: 50,
        ..config(ProxyMode::V351, 5, 50)
    })
    .await;
    assert_eq!(truth.replicas_final, 5);
    assert_eq!(truth.summary.connected, 100, "{:?}", truth.summary);
    let early: Vec<_> = truth
        .users
        .iter()
        .filter(|user| !user.connected_after_scale)
        .collect();
    for user in &early {
        let placement = user.websocket.as_ref().expect("connected");
        assert_eq!(placement.gateway_index, 0, "user {}", user.user_id);
    }
    // Early users still hear from gateway 0 through the drained proxy's relays.
    assert!(
        early
            .iter()
            .flat_map(|user| &user.pushes)
            .any(|push| push.gateway_index == Some(0) && push.arrived_in_time),
        "no early user received a message after the proxy restart"
    );
    let late_gateways: std::collections::HashSet<usize> = truth
        .users
        .iter()
        .filter(|user| user.connected_after_scale)
        .filter_map(|user| user.websocket.as_ref().map(|at| at.gateway_index))
        .collect();
    assert!(
        late_gateways.len() > 1,
        "late users spread over the new gateways"
    );
    assert!(truth.summary.realtime_misses > 0, "{:?}", truth.summary);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lab_leaves_no_namespace_link_or_process_behind() {
    if !can_run(Needs::Root) {
        return;
    }
    let (prefix, pids) = bounded(async {
        let mut lab = Lab::start(config(ProxyMode::V351, 3, 10)).await?;
        lab.connect_users(0..10, false).await;
        lab.scale_to(4).await?;
        let pids = lab.pod_pids();
        // Pods carry OpenIM's process names, for observers that report comm.
        let mut comms: Vec<String> = pids
            .iter()
            .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).ok())
            .map(|comm| comm.trim().to_owned())
            .collect();
        comms.sort();
        comms.dedup();
        assert_eq!(comms, ["msggateway", "msggw-proxy", "openim-push"]);
        let prefix = lab.prefix().to_owned();
        assert!(!leftovers(&prefix)?.is_empty(), "the lab made namespaces");
        // Dropped mid-scenario, as on an error or Ctrl-C.
        drop(lab);
        Ok((prefix, pids))
    })
    .await;
    assert_eq!(leftovers(&prefix).expect("ip"), Vec::<String>::new());
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "pod process {pid} still exists"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_flood_measures_calls() {
    if !can_run(Needs::Root) {
        return;
    }
    let report = bounded(async {
        let mut lab = Lab::start(config(ProxyMode::Correct, 2, 10)).await?;
        lab.connect_users(0..10, false).await;
        lab.push_flood(Duration::from_secs(1)).await
    })
    .await;
    assert!(report.calls > 0, "{report:?}");
    assert_eq!(report.errors, 0, "{report:?}");
    assert!(
        report.p50_us > 0 && report.p50_us <= report.p99_us,
        "{report:?}"
    );
}

/// A usage error of the lab's command is one line, as the observer's are, with exit code 2;
/// its help still prints in full.
#[test]
fn a_usage_error_is_one_line_with_exit_code_2() {
    let lab = env!("CARGO_BIN_EXE_openim-lab");
    let output = std::process::Command::new(lab)
        .args(["bench", "--rounds", "many"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(
        stderr,
        "openim-lab: invalid value 'many' for '--rounds <ROUNDS>': invalid digit found in string\n"
    );
    let help = std::process::Command::new(lab)
        .args(["bench", "--help"])
        .output()
        .unwrap();
    assert!(help.status.success());
    assert!(
        String::from_utf8(help.stdout)
            .unwrap()
            .contains("Usage: openim-lab bench")
    );
}
