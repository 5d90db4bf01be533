//! Cluster mode on the other Redis topologies, end to end: the three-node lab of
//! cluster_end_to_end.rs with its observers on a Redis Cluster (three primaries, three
//! replicas) or a Sentinel-managed primary, and a primary killed after the users connected:
//! its replica is promoted, the observers say `capture_degraded` (`shared_state_unreachable`)
//! if they noticed, then `recovered`, none exits, and the alerts for what is pushed after
//! recovery are exact.
//!
//! Needs root, eBPF programs and `redis-server`; without them the tests skip (see
//! `tests::privileges`). Tests take `SERIAL`: every observer sees every lab's traffic.

use std::sync::Mutex;

use tests::ProxyMode;
use tests::privileges::{Needs, can_run};
use tests::redis_lab::{
    assert_exact, assert_nothing_secret_in_redis, lab, observe_cluster, wait_not_degraded,
};
use tests::redis_topology::{RedisCluster, RedisSentinels, SharedRedis};

static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn three_nodes_on_a_redis_cluster_alert_exactly() {
    if !can_run(Needs::RootAndPrograms) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    let cluster = RedisCluster::start().expect("a Redis Cluster forms");
    let run = observe_cluster(SharedRedis::Cluster(cluster), lab(ProxyMode::V351), |_| {});
    assert_exact(&run);
    assert_nothing_secret_in_redis(&run);
}

#[test]
fn a_cluster_primary_failing_over_keeps_observers_up_and_alerts_exact() {
    if !can_run(Needs::RootAndPrograms) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    let cluster = RedisCluster::start().expect("a Redis Cluster forms");
    let run = observe_cluster(
        SharedRedis::Cluster(cluster),
        lab(ProxyMode::V351),
        |lab_cluster| {
            let SharedRedis::Cluster(redis) = &mut lab_cluster.redis else {
                unreachable!("a Redis Cluster");
            };
            // The primary holding the first user's keys.
            let key = format!("{{u:{}}}", tests::Lab::user_id(0));
            let slot = redis.slot_of(&key).expect("CLUSTER KEYSLOT");
            redis.fail_over(slot).expect("the replica is promoted");
            wait_not_degraded(lab_cluster);
        },
    );
    assert_exact(&run);
}

#[test]
fn a_sentinel_failover_keeps_observers_up_and_alerts_exact() {
    if !can_run(Needs::RootAndPrograms) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    let sentinels = RedisSentinels::start().expect("sentinels watch a primary");
    let run = observe_cluster(
        SharedRedis::Sentinel(sentinels),
        lab(ProxyMode::V351),
        |lab_cluster| {
            let SharedRedis::Sentinel(redis) = &mut lab_cluster.redis else {
                unreachable!("Sentinel");
            };
            redis
                .fail_over()
                .expect("the sentinels promote the replica");
            wait_not_degraded(lab_cluster);
        },
    );
    assert_exact(&run);
    assert_nothing_secret_in_redis(&run);
}
