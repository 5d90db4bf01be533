//! Cluster mode end to end: the lab spread over three simulated nodes (proxy on the first, push
//! on the second, gateways over all three), one unmodified `observer run` per node scoped by
//! `--cgroup-scope` to its node's processes, all sharing one real `redis-server`. No node sees
//! both halves of a join, so every `route_mismatch` needs Redis (`tests::redis_lab`; the other
//! topologies are in redis_topologies.rs).
//!
//! Needs root, eBPF programs and `redis-server`; without them the tests skip (see
//! `tests::privileges`). Tests take `SERIAL`: every observer sees every lab's traffic.

use std::sync::Mutex;

use serde_json::Value;
use tests::ProxyMode;
use tests::privileges::{Needs, can_run};
use tests::redis_lab::{
    assert_exact, assert_nothing_secret_in_redis, assert_one_ring_divergence, lab, observe_cluster,
    wait_degraded_state,
};
use tests::redis_server::RedisServer;
use tests::redis_topology::SharedRedis;

static SERIAL: Mutex<()> = Mutex::new(());

fn one_server() -> SharedRedis {
    SharedRedis::Single(RedisServer::start().expect("redis-server starts"))
}

#[test]
fn three_nodes_alert_every_misrouted_user_once_and_store_no_secret() {
    if !can_run(Needs::RootAndPrograms) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    let run = observe_cluster(one_server(), lab(ProxyMode::V351), |_| {});
    assert_exact(&run);
    // The proxy's and push's halves were seen on different nodes and joined through Redis.
    let mismatch = run.of_kind("route_mismatch")[0];
    assert_eq!(mismatch["placed_on"][0]["node"], "node-1", "{mismatch}");
    assert_eq!(mismatch["pushed_to"]["node"], "node-2", "{mismatch}");
    assert_nothing_secret_in_redis(&run);
}

#[test]
fn three_nodes_with_the_correct_fix_raise_no_routing_alert() {
    if !can_run(Needs::RootAndPrograms) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    let run = observe_cluster(one_server(), lab(ProxyMode::Correct), |_| {});
    assert_eq!(
        run.truth.summary.users_missing, 0,
        "{:?}",
        run.truth.summary
    );
    for kind in [
        "route_mismatch",
        "ring_divergence",
        "ws_upgrade_on_grpc_port",
    ] {
        assert_eq!(run.of_kind(kind), Vec::<&Value>::new(), "{kind}");
    }
    assert_nothing_secret_in_redis(&run);
}

#[test]
fn the_proxy_nodes_observer_restarted_after_users_connected_keeps_alerts_exact() {
    if !can_run(Needs::RootAndPrograms) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    let run = observe_cluster(one_server(), lab(ProxyMode::V351), |cluster| {
        // Node 1 holds the proxy: every placement was seen there, before this restart.
        let before = cluster.observers.remove(0);
        let output = before.stop().expect("node-1's observer stops cleanly");
        cluster.stopped.push(output);
        let restarted = cluster.start_observer(0);
        cluster.observers.insert(0, restarted);
    });
    assert_exact(&run);
}

#[test]
fn redis_killed_and_restarted_mid_run_degrades_recovers_and_alerts_stay_exact() {
    if !can_run(Needs::RootAndPrograms) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    let run = observe_cluster(one_server(), lab(ProxyMode::V351), |cluster| {
        cluster.redis.single().kill();
        for (node, observer) in cluster.observers.iter_mut().enumerate() {
            wait_degraded_state(observer, node, "degraded");
        }
        cluster
            .redis
            .single()
            .restart()
            .expect("redis-server restarts, empty");
        for (node, observer) in cluster.observers.iter_mut().enumerate() {
            wait_degraded_state(observer, node, "recovered");
        }
    });
    assert_exact(&run);
    assert_nothing_secret_in_redis(&run);
}

#[test]
fn three_nodes_raise_one_ring_divergence() {
    if !can_run(Needs::RootAndPrograms) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    let run = observe_cluster(one_server(), lab(ProxyMode::V351), |_| {});
    assert_one_ring_divergence(&run);
}
