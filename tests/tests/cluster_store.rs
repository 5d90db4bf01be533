//! Cluster mode's shared state against a real `redis-server` (no root needed): what one node
//! writes another reads, every key expires, Redis faults are survived and the queue is bounded.

use std::{
    future::Future,
    net::IpAddr,
    time::{Duration, Instant},
};

use observer::{
    cluster::{
        ClusterArgs, ClusterConfig, ConnectionKey, RingSide, SharedPlacement, SharedState,
        StoreMetrics, keys::DEFAULT_PREFIX, store::Fact,
    },
    metrics::Metrics,
};
use tests::privileges::{Needs, can_run};
use tests::redis_server::{AclUser, OBSERVER_ACL_COMMANDS, RedisServer, free_port};
use tests::redis_topology::RedisCluster;

/// Probe and writer act within seconds; this bounds every wait.
const PATIENCE: Duration = Duration::from_secs(10);

fn config(url: &str, node: &str, queue: usize) -> ClusterConfig {
    ClusterArgs {
        redis_url: Some(url.to_owned()),
        redis_prefix: DEFAULT_PREFIX.to_owned(),
        node_name: Some(node.to_owned()),
        redis_queue: queue,
        ..ClusterArgs::default()
    }
    .resolve()
    .expect("valid cluster flags")
    .expect("cluster mode")
}

fn placement(user: &str, node: &str, source_port: u16, gateway: &str) -> SharedPlacement {
    let gateway_ip: IpAddr = gateway.parse().unwrap();
    SharedPlacement {
        user: user.to_owned(),
        node: node.to_owned(),
        connection: ConnectionKey {
            local: format!("10.244.0.5:{source_port}").parse().unwrap(),
            remote: (gateway_ip, 80).into(),
        },
        gateway_ip,
        gateway_port: 80,
        gateway_name: Some(format!("gw.{gateway}.svc")),
        platform: Some(1),
        since_ns: 1_700_000_000_000_000_000,
        proxy_pid: 4242,
        proxy_comm: "msggw-proxy".to_owned(),
    }
}

async fn until<F: Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < PATIENCE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn seen_up(state: &SharedState, what: &str) {
    let health = state.health();
    until(what, || {
        let up = health.is_up();
        async move { up }
    })
    .await;
}

async fn written(state: &SharedState, facts: u64) {
    let health = state.health();
    until(&format!("{facts} facts written"), || {
        let done = health.counters().facts_written >= facts;
        async move { done }
    })
    .await;
}

/// Writes every kind of fact on one node and reads each back on another.
///
/// Longer than 100 lines on purpose: one scenario told in order, start to end; its steps
/// depend on the ones before.
#[tokio::test]
async fn what_one_node_writes_another_reads() {
    if !can_run(Needs::RedisServer) {
        return;
    }
    let redis = RedisServer::start().unwrap();
    let proxy_node = SharedState::start(&config(&redis.url(), "node-a", 1024)).unwrap();
    let push_node = SharedState::start(&config(&redis.url(), "node-b", 1024)).unwrap();
    let first = placement("1001", "node-a", 40001, "10.244.0.11");
    let second = placement("1001", "node-a", 40002, "10.244.0.12");
    let other = placement("1002", "node-a", 40003, "10.244.0.12");
    for fact in [
        Fact::Placed(first.clone()),
        Fact::Placed(second.clone()),
        Fact::Placed(other.clone()),
        Fact::RingMember {
            side: RingSide::Proxy,
            member: "gw-0.gw-headless".to_owned(),
            ip: first.gateway_ip,
        },
        Fact::RingMember {
            side: RingSide::Push,
            member: "gw-0.gw-headless:88".to_owned(),
            ip: first.gateway_ip,
        },
    ] {
        proxy_node.record(fact);
    }
    written(&proxy_node, 5).await;

    let users = ["1001".to_owned(), "1002".to_owned(), "1003".to_owned()];
    let found = push_node.placements_of(&users).await.unwrap();
    assert_eq!(found.len(), 2, "user 1003 was never placed: {found:?}");
    let mut of_first = found["1001"].clone();
    of_first.sort_by_key(|placement| placement.connection);
    assert_eq!(of_first, vec![first.clone(), second.clone()]);
    assert_eq!(found["1002"], vec![other.clone()]);

    let evidence = push_node.ring_evidence().await.unwrap();
    assert_eq!(evidence.proxy["gw-0.gw-headless"].ip, first.gateway_ip);
    assert_eq!(evidence.proxy["gw-0.gw-headless"].node, "node-a");
    assert!(evidence.push.contains_key("gw-0.gw-headless:88"));
    assert_eq!(evidence.placements.len(), 3);
    assert_eq!(
        evidence.placements[0],
        ("1002".to_owned(), other.gateway_ip)
    );

    // A restarted observer on node-a finds its own placements; node-b has none.
    let restarted = SharedState::start(&config(&redis.url(), "node-a", 1024)).unwrap();
    assert_eq!(
        restarted.own_placements().await.unwrap(),
        vec![first.clone(), second.clone(), other.clone()]
    );
    assert!(push_node.own_placements().await.unwrap().is_empty());

    proxy_node.record(Fact::Unplaced {
        user: "1001".to_owned(),
        connection: first.connection,
    });
    written(&proxy_node, 6).await;
    let found = push_node.placements_of(&users[..1]).await.unwrap();
    assert_eq!(found["1001"], vec![second]);

    // One claimant wins a dedup key until it expires.
    let key = proxy_node
        .keys()
        .mismatch_claim("1001", &[first.gateway_ip], outcome_gateway());
    assert!(
        push_node
            .claims(&[(&key, Duration::from_millis(300))])
            .await
            .unwrap()[0]
    );
    assert!(
        !proxy_node
            .claims(&[(&key, Duration::from_millis(300))])
            .await
            .unwrap()[0]
    );
    assert!(
        !push_node
            .claims(&[(&key, Duration::from_millis(300))])
            .await
            .unwrap()[0]
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        proxy_node
            .claims(&[(&key, Duration::from_millis(300))])
            .await
            .unwrap()[0]
    );
}

fn outcome_gateway() -> IpAddr {
    "10.244.0.13".parse().unwrap()
}

#[tokio::test]
async fn every_key_expires() {
    if !can_run(Needs::RedisServer) {
        return;
    }
    let redis = RedisServer::start().unwrap();
    let state = SharedState::start(&config(&redis.url(), "node-a", 1024)).unwrap();
    let placed = placement("2001", "node-a", 41000, "10.244.0.11");
    state.record(Fact::Placed(placed.clone()));
    state.record(Fact::Adopted(placement(
        "2002",
        "node-a",
        41001,
        "10.244.0.12",
    )));
    state.record(Fact::RingMember {
        side: RingSide::Push,
        member: "gw-1:88".to_owned(),
        ip: placed.gateway_ip,
    });
    state.record(Fact::RingMember {
        side: RingSide::Proxy,
        member: "gw-1".to_owned(),
        ip: placed.gateway_ip,
    });
    written(&state, 4).await;
    let keys = state.keys().clone();
    // Two claims in one pipeline, each answered in its place.
    let mismatch = keys.mismatch_claim("2001", &[placed.gateway_ip], outcome_gateway());
    let divergence = keys.divergence_claim(&["gw-1".to_owned()], &["gw-1:88".to_owned()]);
    assert_eq!(
        state
            .claims(&[
                (&mismatch, Duration::from_secs(60)),
                (&divergence, Duration::from_secs(3600)),
                (&mismatch, Duration::from_secs(60)),
            ])
            .await
            .unwrap(),
        [true, true, false]
    );
    let dump = redis.dump().unwrap();
    let names: Vec<&str> = dump.iter().map(|key| key.key.as_str()).collect();
    // Two placements, the node index, the ring's members (two sides) and placements, two
    // claims, and the placement change log and its count.
    assert_eq!(dump.len(), 10, "{names:?}");
    for key in &dump {
        assert!(key.key.starts_with(DEFAULT_PREFIX), "{key:?}");
        assert!(key.ttl_ms > 0, "no TTL on {key:?}");
        assert!(key.ttl_ms <= 24 * 3600 * 1000, "{key:?}");
    }
}

#[tokio::test]
async fn redis_restarted_empty_gets_this_nodes_state_back() {
    if !can_run(Needs::RedisServer) {
        return;
    }
    let mut redis = RedisServer::start().unwrap();
    let state = SharedState::start(&config(&redis.url(), "node-a", 1024)).unwrap();
    let health = state.health();
    let before = placement("3001", "node-a", 42000, "10.244.0.11");
    state.record(Fact::Placed(before.clone()));
    written(&state, 1).await;

    redis.kill();
    let killed = Instant::now();
    until("Redis seen down", || {
        let down = !health.is_up();
        async move { down }
    })
    .await;
    assert!(
        killed.elapsed() < Duration::from_secs(5),
        "{:?}",
        killed.elapsed()
    );
    assert!(state.placements_of(&["3001".to_owned()]).await.is_err());
    // Facts made while Redis is down wait in the queue.
    let during = placement("3002", "node-a", 42001, "10.244.0.12");
    state.record(Fact::Placed(during.clone()));

    redis.restart().unwrap();
    let restarted = Instant::now();
    seen_up(&state, "Redis seen up again").await;
    assert!(
        restarted.elapsed() < Duration::from_secs(5),
        "{:?}",
        restarted.elapsed()
    );
    let users = ["3001".to_owned(), "3002".to_owned()];
    until("both placements back in Redis", || {
        let state = &state;
        let users = &users;
        async move {
            state
                .placements_of(users)
                .await
                .is_ok_and(|found| found.len() == 2)
        }
    })
    .await;
    let found = state.placements_of(&users).await.unwrap();
    assert_eq!(found["3001"], vec![before]);
    assert_eq!(found["3002"], vec![during]);
    assert_eq!(health.counters().facts_dropped, 0);
}

/// A stopping observer waits until nothing is unwritten (`EventSink::settle`): a fact counts
/// until Redis took it, not only until the writer took it off the queue.
#[tokio::test]
async fn a_fact_is_unwritten_until_redis_took_it() {
    if !can_run(Needs::RedisServer) {
        return;
    }
    let redis = RedisServer::start().unwrap();
    let state = SharedState::start(&config(&redis.url(), "node-a", 1024)).unwrap();
    let health = state.health();
    seen_up(&state, "Redis seen up").await;
    // Redis holds writes for half a second (the batch deadline is a second), as a busy one
    // would; reads such as the probe's go on.
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(500)
        .arg("WRITE")
        .query(&mut redis.client().unwrap())
        .unwrap();
    state.record(Fact::Placed(placement(
        "5001",
        "node-a",
        45001,
        "10.244.0.11",
    )));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(health.unwritten(), 1, "in the batch Redis holds");
    until("the fact written", || {
        let done = health.unwritten() == 0;
        async move { done }
    })
    .await;
    let found = state.placements_of(&["5001".to_owned()]).await.unwrap();
    assert_eq!(found["5001"].len(), 1);
    assert_eq!(health.counters().facts_written, 1);
}

#[tokio::test]
async fn an_unreachable_redis_bounds_the_queue() {
    let url = format!("redis://127.0.0.1:{}", free_port().unwrap());
    let state = SharedState::start(&config(&url, "node-a", 8)).unwrap();
    for port in 0..100 {
        state.record(Fact::Placed(placement(
            "4001",
            "node-a",
            43000 + port,
            "10.244.0.11",
        )));
    }
    let counters = state.health().counters();
    assert_eq!(counters.facts_dropped, 92);
    assert_eq!(counters.queued, 8);
    let error = state
        .placements_of(&["4001".to_owned()])
        .await
        .unwrap_err()
        .to_string();
    assert!(error.starts_with("Redis at redis://127.0.0.1:"), "{error}");
}

/// The ACL docs/install.md gives is the one the tests' servers grant ([`OBSERVER_ACL_COMMANDS`]).
#[test]
fn the_documented_acl_is_the_tested_one() {
    let install = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/install.md"),
    )
    .unwrap();
    let documented = format!(
        "ACL SETUSER openim-observer on >PASSWORD ~{DEFAULT_PREFIX}* {OBSERVER_ACL_COMMANDS}\n"
    );
    assert!(
        install.contains(&documented),
        "docs/install.md: {documented}"
    );
}

#[tokio::test]
async fn an_acl_user_limited_to_the_prefix_is_enough() {
    let acl = AclUser {
        name: "observer".to_owned(),
        password: "canary-redis-password".to_owned(),
        prefix: DEFAULT_PREFIX.to_owned(),
    };
    if !can_run(Needs::RedisServer) {
        return;
    }
    let redis = RedisServer::start_with(Some(acl.clone())).unwrap();
    let cluster = config(&redis.url(), "node-a", 64);
    assert!(!cluster.redis.to_string().contains(&acl.password));
    assert!(!format!("{cluster:?}").contains(&acl.password));
    let state = SharedState::start(&cluster).unwrap();
    let placed = placement("5001", "node-a", 44000, "10.244.0.11");
    state.record(Fact::Placed(placed.clone()));
    written(&state, 1).await;
    assert_eq!(
        state.placements_of(&["5001".to_owned()]).await.unwrap()["5001"],
        vec![placed]
    );
    // The writer told the change log (`INCRBY` on its count), which readers' caches follow.
    let count_key = state.keys().placement_changes_count();
    until("the placement announced in the change log", || {
        let announced = redis.client().is_ok_and(|mut client| {
            redis::cmd("GET")
                .arg(&count_key)
                .query::<Option<u64>>(&mut client)
                .is_ok_and(|count| count == Some(1))
        });
        async move { announced }
    })
    .await;
    assert_eq!(state.health().counters().facts_lost, 0);
    assert_eq!(
        state
            .claims(&[(
                &state.keys().divergence_claim(&[], &[]),
                Duration::from_secs(5)
            )])
            .await
            .unwrap(),
        [true]
    );

    let wrong = redis.url().replace(&acl.password, "not-the-password");
    let refused = SharedState::start(&config(&wrong, "node-b", 64)).unwrap();
    let error = refused
        .placements_of(&["5001".to_owned()])
        .await
        .unwrap_err()
        .to_string();
    assert!(!error.contains("not-the-password"), "{error}");
    assert!(!refused.health().is_up());
}

#[tokio::test]
async fn health_shows_on_metrics() {
    if !can_run(Needs::RedisServer) {
        return;
    }
    let redis = RedisServer::start().unwrap();
    let state = SharedState::start(&config(&redis.url(), "node-a", 64)).unwrap();
    seen_up(&state, "Redis seen up").await;
    let mut metrics = Metrics::default();
    metrics.register_collector(Box::new(StoreMetrics(state.health())));
    let text = metrics.render();
    assert!(text.contains("openim_observer_redis_up 1"), "{text}");
    assert!(
        text.contains("openim_observer_redis_round_trip_seconds "),
        "{text}"
    );
    assert!(
        text.contains("openim_observer_redis_facts_dropped_total 0"),
        "{text}"
    );
}

/// The figures docs/benchmarks.md quotes: Redis memory per placed user (`INFO memory` before and
/// after), and round trips per batch. Run with
/// `cargo test -p tests --test cluster_store -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "a measurement, not a check: prints figures"]
async fn measure_memory_per_placed_user() {
    if !can_run(Needs::RedisServer) {
        return;
    }
    let redis = RedisServer::start().unwrap();
    let used = || -> u64 {
        redis.info("memory").unwrap()["used_memory"]
            .parse()
            .unwrap()
    };
    let node = SharedState::start(&config(&redis.url(), "node-a", 1 << 20)).unwrap();
    let mut placed = 0u64;
    for users in [10_000u64, 100_000] {
        let before = used();
        let round_trips = node.health().counters().round_trips;
        for index in placed..placed + users {
            let mut placement = placement(
                &(3_000_000_000 + index * 7).to_string(),
                "node-a",
                (20_000 + index % 40_000) as u16,
                &format!("10.244.{}.{}", 1 + index % 3, 10 + index % 50),
            );
            placement.connection.local = format!(
                "10.244.0.{}:{}",
                1 + index / 40_000,
                20_000 + index % 40_000
            )
            .parse()
            .unwrap();
            placement.gateway_name = Some(format!(
                "im-openim-msggateway-{}.im-openim-msggateway-headless.openim.svc.cluster.local",
                index % 50
            ));
            node.record(Fact::Placed(placement));
        }
        placed += users;
        written(&node, placed).await;
        let bytes = used() - before;
        println!(
            "{users} placed users: {bytes} bytes, {} bytes per user, {} round trips",
            bytes / users,
            node.health().counters().round_trips - round_trips
        );
    }
}

/// Returns the settings of node `node` on `cluster`.
fn cluster_config(cluster: &RedisCluster, node: &str) -> ClusterConfig {
    ClusterArgs {
        redis_cluster: Some(cluster.seeds()),
        redis_prefix: DEFAULT_PREFIX.to_owned(),
        node_name: Some(node.to_owned()),
        redis_queue: 4096,
        ..ClusterArgs::default()
    }
    .resolve()
    .expect("valid cluster flags")
    .expect("cluster mode")
}

/// On a Redis Cluster (three primaries, three replicas): a user's keys share one slot, the
/// users spread over every primary, and what one node writes in pipelines spanning many slots
/// another reads back in one, whole.
#[tokio::test(flavor = "multi_thread")]
async fn keys_spread_over_a_redis_cluster_by_hash_tag() {
    if !can_run(Needs::RedisServer) {
        return;
    }
    let cluster = tokio::task::block_in_place(RedisCluster::start).expect("a Redis Cluster forms");
    let proxy_node = SharedState::start(&cluster_config(&cluster, "node-a")).unwrap();
    let push_node = SharedState::start(&cluster_config(&cluster, "node-b")).unwrap();
    seen_up(&proxy_node, "the cluster up").await;
    let users: Vec<String> = (0..40).map(|user| format!("{}", 2000 + user)).collect();
    let mut placed = Vec::new();
    for (index, user) in users.iter().enumerate() {
        let port = 41_000 + u16::try_from(index).unwrap();
        let placement = placement(user, "node-a", port, "10.244.0.11");
        proxy_node.record(Fact::Placed(placement.clone()));
        placed.push(placement);
    }
    written(&proxy_node, users.len() as u64).await;
    assert_eq!(proxy_node.health().counters().facts_lost, 0);

    let found = push_node.placements_of(&users).await.unwrap();
    for placement in &placed {
        assert_eq!(found[&placement.user], vec![placement.clone()]);
    }
    // One claim a user, in one pipeline spanning every primary: each answered in its place.
    let gateway: IpAddr = "10.244.0.12".parse().unwrap();
    let claims: Vec<String> = placed
        .iter()
        .map(|placement| {
            push_node
                .keys()
                .mismatch_claim(&placement.user, &[placement.gateway_ip], gateway)
        })
        .collect();
    let claims: Vec<(&str, Duration)> = claims
        .iter()
        .map(|key| (key.as_str(), Duration::from_secs(60)))
        .collect();
    assert!(
        push_node
            .claims(&claims)
            .await
            .unwrap()
            .iter()
            .all(|won| *won)
    );

    let keys = tokio::task::block_in_place(|| cluster.keys()).unwrap();
    let mut primaries_used = std::collections::BTreeSet::new();
    for user in &users {
        let tag = format!("{{u:{user}}}");
        let own: Vec<&(u16, u16, String)> = keys
            .iter()
            .filter(|(_, _, key)| key.contains(&tag))
            .collect();
        assert!(own.len() >= 2, "{user}'s placement and claim: {own:?}");
        assert!(
            own.iter()
                .all(|(slot, port, _)| (*slot, *port) == (own[0].0, own[0].1)),
            "{user}'s keys on one slot: {own:?}"
        );
        primaries_used.insert(own[0].1);
    }
    assert_eq!(primaries_used.len(), 3, "40 users over the three primaries");
}

/// A Redis Cluster failover that no request noticed (the client follows the `MOVED`) still makes
/// the node write its state again: a primary killed may have left its replica without its last
/// writes, which nothing else would restore before the next refresh, minutes later. What such a
/// failover loses is played here by deleting the key behind the node's back first.
#[tokio::test(flavor = "multi_thread")]
async fn a_redis_cluster_failover_nobody_noticed_gets_this_nodes_state_back() {
    if !can_run(Needs::RedisServer) {
        return;
    }
    let cluster = tokio::task::block_in_place(RedisCluster::start).expect("a Redis Cluster forms");
    let state = SharedState::start(&cluster_config(&cluster, "node-a")).unwrap();
    seen_up(&state, "the cluster up").await;
    let placed = placement("6001", "node-a", 43000, "10.244.0.11");
    state.record(Fact::Placed(placed.clone()));
    written(&state, 1).await;
    let key = state.keys().user_placements("6001");
    tokio::task::block_in_place(|| cluster.delete(&key)).unwrap();
    let users = ["6001".to_owned()];
    assert!(state.placements_of(&users).await.unwrap().is_empty());

    let slot = cluster.slot_of(&key).unwrap();
    tokio::task::block_in_place(|| cluster.hand_over(slot)).expect("the replica takes over");
    until("the placement written again", || {
        let state = &state;
        let users = &users;
        let placed = &placed;
        async move {
            state
                .placements_of(users)
                .await
                .is_ok_and(|found| found.get("6001") == Some(&vec![placed.clone()]))
        }
    })
    .await;
    assert!(state.health().is_up());
}

/// A batch that has nothing to write (a ring member seen again before its rewrite is due) is
/// written, not lost: no empty pipeline is sent.
#[tokio::test]
async fn a_batch_with_nothing_due_is_not_lost() {
    if !can_run(Needs::RedisServer) {
        return;
    }
    let redis = RedisServer::start().unwrap();
    let state = SharedState::start(&config(&redis.url(), "node-b", 64)).unwrap();
    seen_up(&state, "Redis up").await;
    let member = || Fact::RingMember {
        side: RingSide::Push,
        member: "gw-0.gw-headless:88".to_owned(),
        ip: "10.244.0.11".parse().unwrap(),
    };
    state.record(member());
    written(&state, 1).await;
    state.record(member());
    written(&state, 2).await;
    assert_eq!(state.health().counters().facts_lost, 0);
}
