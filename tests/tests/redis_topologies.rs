//! Cluster mode on the other Redis topologies, end to end: the three-node lab of
//! cluster_end_to_end.rs with its observers on a Redis Cluster (three primaries, three
//! replicas) or a Sentinel-managed primary, and a primary killed as the pushes start: the first
//! round of messages is pushed while its replica is not promoted yet, the observers say
//! `capture_degraded` (`shared_state_unreachable`) if they noticed, then `recovered`, none exits,
//! and once the failover is over the rounds pushed after it make the alerts exact.
//!
//! Needs root, eBPF programs and `redis-server`; without them the tests skip (see
//! `tests::privileges`). Tests take `SERIAL`: every observer sees every lab's traffic.

use std::sync::Mutex;

use tests::privileges::{Needs, can_run};
use tests::redis_lab::{
    assert_exact, assert_nothing_secret_in_redis, lab, observe_cluster, observe_cluster_steps,
    wait_not_degraded,
};
use tests::redis_topology::{RedisCluster, RedisSentinels, SharedRedis};
use tests::{LabConfig, ProxyMode, ScenarioStep};

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

/// Returns the lab of these tests with one more round of messages: the first is pushed during
/// the failover, the others after it.
fn lab_pushing_through_a_failover() -> LabConfig {
    LabConfig {
        messages_per_user: 3,
        ..lab(ProxyMode::V351)
    }
}

#[test]
fn a_cluster_primary_failing_over_while_pushing_keeps_observers_up_and_alerts_exact() {
    if !can_run(Needs::RootAndPrograms) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    let cluster = RedisCluster::start().expect("a Redis Cluster forms");
    // The primary holding the first user's keys.
    let key = format!("{{u:{}}}", tests::Lab::user_id(0));
    let slot = cluster.slot_of(&key).expect("CLUSTER KEYSLOT");
    let mut killed = None;
    let run = observe_cluster_steps(
        SharedRedis::Cluster(cluster),
        lab_pushing_through_a_failover(),
        |lab_cluster, step| {
            let SharedRedis::Cluster(redis) = &mut lab_cluster.redis else {
                unreachable!("a Redis Cluster");
            };
            match step {
                ScenarioStep::Connected => {
                    killed = Some(redis.kill_primary(slot).expect("the primary is killed"));
                }
                ScenarioStep::Pushed { round: 0 } => {
                    let killed = killed.expect("killed before the pushes");
                    redis
                        .wait_failed_over(slot, killed)
                        .expect("the replica is promoted");
                    wait_not_degraded(lab_cluster);
                }
                ScenarioStep::Pushed { .. } => {}
            }
        },
    );
    assert_exact(&run);
}

#[test]
fn a_sentinel_failover_while_pushing_keeps_observers_up_and_alerts_exact() {
    if !can_run(Needs::RootAndPrograms) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    let sentinels = RedisSentinels::start().expect("sentinels watch a primary");
    let mut killed = None;
    let run = observe_cluster_steps(
        SharedRedis::Sentinel(sentinels),
        lab_pushing_through_a_failover(),
        |lab_cluster, step| {
            let SharedRedis::Sentinel(redis) = &mut lab_cluster.redis else {
                unreachable!("Sentinel");
            };
            match step {
                ScenarioStep::Connected => {
                    killed = Some(redis.kill_primary().expect("the primary is killed"));
                }
                ScenarioStep::Pushed { round: 0 } => {
                    let killed = killed.expect("killed before the pushes");
                    redis
                        .wait_failed_over(killed)
                        .expect("the sentinels promote the replica");
                    wait_not_degraded(lab_cluster);
                }
                ScenarioStep::Pushed { .. } => {}
            }
        },
    );
    assert_exact(&run);
    assert_nothing_secret_in_redis(&run);
}
