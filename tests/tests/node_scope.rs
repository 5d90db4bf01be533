//! Simulated nodes on one kernel: each node's pods live in the node's cgroup, and each node's
//! observer (`--cgroup-scope`) sees only those, as a DaemonSet pod sees only its node.
//!
//! Needs root (network namespaces, cgroups, eBPF) and an observer built with its eBPF programs;
//! without them the test skips (see `tests::privileges`).

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;
use tests::observed::{NodeObservers, find_observer_binary};
use tests::privileges::{Needs, can_run};
use tests::{Lab, LabConfig, ProxyMode};

/// Kinds of the per-record lines `--events` prints (the rest are alerts and status lines).
const EVENT_KINDS: [&str; 4] = ["tcp_connect", "tcp_state", "data", "close"];

#[test]
fn each_node_observer_sees_only_its_own_nodes_processes() {
    if !can_run(Needs::RootAndPrograms) {
        return;
    }
    let observer_binary = find_observer_binary().expect("observer binary");
    let config = LabConfig {
        mode: ProxyMode::V351,
        replicas_initial: 3,
        replicas_final: 3,
        users: 20,
        messages_per_user: 1,
        realtime_timeout: Duration::from_secs(2),
        nodes: 3,
        ..LabConfig::default()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (node_pids, cgroup_dirs, outputs) = runtime.block_on(async {
        let mut lab = Lab::start(config).await.expect("lab starts");
        let observers = NodeObservers::start(
            &observer_binary,
            &lab,
            &["--events", "--grpc-port", "88", "--ws-port", "80"],
        )
        .expect("node observers attach");
        lab.run_scenario().await.expect("scenario runs");
        let node_pids: Vec<BTreeSet<u32>> = (0..3)
            .map(|node| {
                let pods: BTreeSet<u32> = lab.node_pids(node).into_iter().collect();
                let in_cgroup: BTreeSet<u32> = lab.node_cgroup_pids(node).into_iter().collect();
                assert!(
                    pods.is_subset(&in_cgroup),
                    "{}: pods {pods:?} are not all in its cgroup {in_cgroup:?}",
                    Lab::node_name(node)
                );
                pods
            })
            .collect();
        let cgroup_dirs: Vec<_> = (0..3)
            .map(|node| lab.node_cgroup(node).expect("node cgroup").to_owned())
            .collect();
        drop(lab);
        let outputs = observers.stop().expect("observers stop cleanly");
        (node_pids, cgroup_dirs, outputs)
    });
    let lab_cgroup = cgroup_dirs[0].parent().expect("the lab's cgroup");
    for dir in cgroup_dirs
        .iter()
        .map(|dir| dir.as_path())
        .chain([lab_cgroup])
    {
        assert!(!dir.exists(), "{} left behind", dir.display());
    }

    let events = |node: usize| -> Vec<Value> {
        outputs[node]
            .output
            .stdout
            .iter()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|line| EVENT_KINDS.iter().any(|kind| line["kind"] == *kind))
            .collect()
    };
    let connects_to = |events: &[Value], port: u16| {
        events
            .iter()
            .filter(|event| event["kind"] == "tcp_connect" && event["dport"] == port)
            .count()
    };
    for (node, output) in outputs.iter().enumerate() {
        assert_eq!(output.node, Lab::node_name(node));
        for event in events(node) {
            let pid = event["pid"].as_u64().expect("event pid");
            assert!(
                u32::try_from(pid).is_ok_and(|pid| node_pids[node].contains(&pid)),
                "{} saw a process of another node: {event}",
                output.node
            );
        }
    }
    // node-1 holds the proxy: its upgrades to the gateways' WebSocket port, no push call.
    let proxy_node = events(0);
    assert!(connects_to(&proxy_node, 80) > 0, "node-1 saw no upgrade");
    assert_eq!(connects_to(&proxy_node, 88), 0, "node-1 saw push calls");
    // node-2 holds push: its gRPC calls, no upgrade.
    let push_node = events(1);
    assert!(connects_to(&push_node, 88) > 0, "node-2 saw no push call");
    assert_eq!(connects_to(&push_node, 80), 0, "node-2 saw upgrades");
    // node-3 holds only a gateway, which accepts and never connects out.
    assert_eq!(events(2), Vec::<Value>::new(), "node-3 saw connections");
}
