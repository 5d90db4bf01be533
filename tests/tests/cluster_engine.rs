//! Cluster mode at the engine: two or three engines ("nodes") sharing one real `redis-server`,
//! each fed only the traffic its node's kernel would show (the proxy's WebSockets on one, push's
//! gRPC calls on another), linked exactly as `observer run --redis-url` links them
//! ([`tests::cluster_node::Node`]). No kernel and no root needed. The oracle is one single-node
//! engine fed all of the traffic.

use std::{
    collections::{BTreeMap, HashSet},
    net::IpAddr,
    time::Duration,
};

use observer::{
    alert::{Alert, AlertBody, DegradedState, RouteMismatch},
    correlate::{Engine, EngineConfig},
    model::{ConnectionKey, Event, EventKind, PortClass, TcpState},
};
use openim_test_kit::synthetic::{Scenario, Traffic, generate};
use tests::cluster_node::Node;
use tests::privileges::{Needs, can_run};
use tests::redis_server::{AclUser, RedisServer};

const TOKEN_CANARY: &str = "TOKENCANARY";
const CONTENT_CANARY: &str = "CONTENTCANARY";
const PATIENCE: Duration = Duration::from_secs(10);

fn traffic() -> Traffic {
    generate(&Scenario {
        gateways: 3,
        users: 120,
        misrouted_share: 0.5,
        push_calls: 60,
        recipients_per_call: 8,
        token: format!("{TOKEN_CANARY}-{{user}}"),
        content: format!("{CONTENT_CANARY} {{seq}}"),
        ..Scenario::default()
    })
}

type MismatchKey = (String, Vec<IpAddr>, IpAddr);

/// First alerts of `route_mismatch` (not window summaries), by what they are about.
fn mismatches(alerts: &[Alert]) -> BTreeMap<MismatchKey, Vec<&Alert>> {
    let mut found: BTreeMap<MismatchKey, Vec<&Alert>> = BTreeMap::new();
    for alert in alerts {
        if let AlertBody::RouteMismatch(RouteMismatch {
            user,
            placed_on,
            pushed_to,
            count: 1,
            ..
        }) = &*alert.body
        {
            let placed = placed_on
                .iter()
                .map(|info| info.gateway.gateway.ip)
                .collect();
            found
                .entry((user.to_string(), placed, pushed_to.gateway.gateway.ip))
                .or_default()
                .push(alert);
        }
    }
    found
}

/// What one engine seeing all of the traffic concludes.
fn oracle(traffic: &Traffic) -> Vec<MismatchKey> {
    let mut engine = Engine::new(EngineConfig::default());
    let mut alerts = Vec::new();
    for event in &traffic.events {
        engine.on_event(event, &mut alerts);
    }
    engine.finish(&mut alerts);
    mismatches(&alerts).into_keys().collect()
}

fn websocket(traffic: &Traffic) -> impl Iterator<Item = &Event> {
    traffic
        .events
        .iter()
        .filter(|event| event.port_class == PortClass::WebSocket)
}

fn grpc(traffic: &Traffic) -> impl Iterator<Item = &Event> {
    traffic
        .events
        .iter()
        .filter(|event| event.port_class == PortClass::Grpc)
}

/// Starts a proxy node fed the WebSockets and a push node fed the gRPC calls of `traffic`, and lets
/// a few seconds pass on both: ring evidence merged, verdicts settled, and the misses held for
/// their messages' other calls judged.
async fn placed_here_pushed_there(redis: &RedisServer, traffic: &Traffic) -> (Node, Node) {
    let mut proxy_node = Node::start(&redis.url(), "node-a").await;
    let mut push_node = Node::start(&redis.url(), "node-b").await;
    proxy_node.feed(websocket(traffic));
    proxy_node.written().await;
    push_node.feed(grpc(traffic));
    push_node.settle().await;
    for _ in 0..6 {
        proxy_node.pass(1).await;
        push_node.pass(1).await;
    }
    (proxy_node, push_node)
}

fn kinds(alerts: &[Alert]) -> Vec<&'static str> {
    alerts.iter().map(Alert::kind).collect()
}

#[tokio::test]
async fn a_placement_on_one_node_and_a_push_on_another_make_one_mismatch() {
    if !can_run(Needs::RedisServer) {
        return;
    }
    let redis = RedisServer::start().unwrap();
    let traffic = traffic();
    let expected = oracle(&traffic);
    assert!(
        expected.len() > 10,
        "the scenario misroutes: {}",
        expected.len()
    );

    let (proxy_node, push_node) = placed_here_pushed_there(&redis, &traffic).await;

    assert!(
        !kinds(&proxy_node.printed).contains(&"route_mismatch"),
        "the proxy's node never sees a push: {:?}",
        kinds(&proxy_node.printed)
    );
    let found = mismatches(&push_node.printed);
    assert_eq!(
        found.keys().cloned().collect::<Vec<_>>(),
        expected,
        "precision and recall against the single-node oracle"
    );
    for (key, alerts) in &found {
        assert_eq!(alerts.len(), 1, "{key:?} printed once");
        let json: serde_json::Value = serde_json::from_str(&alerts[0].to_json_line()).unwrap();
        assert_eq!(json["node"], "node-b", "{json}");
        assert_eq!(json["pushed_to"]["node"], "node-b", "{json}");
        assert_eq!(json["placed_on"][0]["node"], "node-a", "{json}");
    }
    let divergences: Vec<&Alert> = proxy_node
        .printed
        .iter()
        .chain(&push_node.printed)
        .filter(|alert| alert.kind() == "ring_divergence")
        .collect();
    assert_eq!(divergences.len(), 1, "one ring_divergence cluster-wide");
    let AlertBody::RingDivergence { difference, .. } = &*divergences[0].body else {
        unreachable!()
    };
    assert_eq!(difference, "push members carry ':88', proxy members do not");

    // Nothing stored holds a token or message content.
    let dump = redis.dump().unwrap();
    assert!(dump.len() > 5, "{dump:?}");
    for stored in &dump {
        for canary in [TOKEN_CANARY, CONTENT_CANARY] {
            assert!(
                !stored.key.contains(canary) && !stored.content.contains(canary),
                "{canary} stored in {}",
                stored.key
            );
        }
    }
}

/// With the ACL user docs/install.md gives (limited to the prefix and to the commands the
/// observer sends), the lookups, claims and change log work: the same mismatches as one engine
/// seeing everything, and no request refused.
#[tokio::test]
async fn the_documented_acl_user_is_enough_for_every_join() {
    if !can_run(Needs::RedisServer) {
        return;
    }
    let redis = RedisServer::start_with(Some(AclUser {
        name: "observer".to_owned(),
        password: "canary-redis-password".to_owned(),
        prefix: observer::cluster::keys::DEFAULT_PREFIX.to_owned(),
    }))
    .unwrap();
    let traffic = traffic();
    let (proxy_node, push_node) = placed_here_pushed_there(&redis, &traffic).await;
    assert_eq!(
        mismatches(&push_node.printed)
            .into_keys()
            .collect::<Vec<_>>(),
        oracle(&traffic)
    );
    for node in [&proxy_node, &push_node] {
        let counters = node.link.state().health().counters();
        assert_eq!(counters.lookups_failed + counters.claims_failed, 0);
        assert_eq!(counters.facts_lost + counters.probe_failures, 0);
    }
}

#[tokio::test]
async fn two_pushers_on_two_nodes_still_print_one_mismatch_per_window() {
    if !can_run(Needs::RedisServer) {
        return;
    }
    let redis = RedisServer::start().unwrap();
    let traffic = traffic();
    let expected = oracle(&traffic);

    let mut proxy_node = Node::start(&redis.url(), "node-a").await;
    let mut pushers = [
        Node::start(&redis.url(), "node-b").await,
        Node::start(&redis.url(), "node-c").await,
    ];
    proxy_node.feed(websocket(&traffic));
    proxy_node.written().await;
    for pusher in &mut pushers {
        pusher.feed(grpc(&traffic));
    }
    for pusher in &mut pushers {
        pusher.settle().await;
        // Until push's ring is learned, a miss waits a message window for the message's calls
        // to other gateways (push may broadcast).
        pusher.pass(2).await;
    }
    let printed: Vec<Alert> = pushers
        .iter()
        .flat_map(|pusher| pusher.printed.iter().cloned())
        .collect();
    let found = mismatches(&printed);
    assert_eq!(found.keys().cloned().collect::<Vec<_>>(), expected);
    for (key, alerts) in &found {
        assert_eq!(alerts.len(), 1, "{key:?} printed once cluster-wide");
    }
    let deduplicated: u64 = pushers
        .iter()
        .map(|pusher| {
            pusher
                .link
                .state()
                .health()
                .counters()
                .mismatches_deduplicated
        })
        .sum();
    assert_eq!(
        deduplicated as usize,
        expected.len(),
        "each loser counted it"
    );
}

#[tokio::test]
async fn losing_redis_is_said_and_local_detection_continues() {
    if !can_run(Needs::RedisServer) {
        return;
    }
    let mut redis = RedisServer::start().unwrap();
    let traffic = traffic();
    let expected = oracle(&traffic);
    let mut node = Node::start(&redis.url(), "node-a").await;

    redis.kill();
    let lost = std::time::Instant::now();
    while !kinds(&node.printed).contains(&"capture_degraded") {
        assert!(lost.elapsed() < Duration::from_secs(5), "said within 5 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
        node.pass(0).await;
        let mut alerts = Vec::new();
        node.link.tick(node.now_ns, &mut alerts);
        node.printed.append(&mut alerts);
    }
    let json: serde_json::Value =
        serde_json::from_str(&node.printed.last().unwrap().to_json_line()).unwrap();
    assert_eq!(json["kind"], "capture_degraded");
    assert_eq!(json["reason"], "shared_state_unreachable");
    assert_eq!(json["state"], "degraded");
    assert_eq!(json["node"], "node-a");

    // Meanwhile this node still judges what it sees itself.
    node.feed(&traffic.events);
    node.settle().await;
    node.pass(2).await;
    let found = mismatches(&node.printed);
    assert_eq!(found.keys().cloned().collect::<Vec<_>>(), expected);

    redis.restart().unwrap();
    let back = std::time::Instant::now();
    loop {
        let mut alerts = Vec::new();
        node.link.tick(node.now_ns, &mut alerts);
        node.printed.append(&mut alerts);
        if let Some(AlertBody::CaptureDegraded { state, .. }) =
            node.printed.last().map(|alert| &*alert.body)
            && *state == DegradedState::Recovered
        {
            break;
        }
        assert!(back.elapsed() < PATIENCE, "recovered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Its placements are written back to the restarted (empty) Redis.
    let started = std::time::Instant::now();
    while redis.dump().unwrap().len() < 3 {
        assert!(started.elapsed() < PATIENCE, "placements rewritten");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_restarted_observer_adopts_the_placements_still_established() {
    if !can_run(Needs::RedisServer) {
        return;
    }
    let redis = RedisServer::start().unwrap();
    let traffic = traffic();
    let mut before = Node::start(&redis.url(), "node-a").await;
    before.feed(websocket(&traffic));
    before.written().await;
    drop(before);

    // The restarted observer: half of the connections are still established.
    let mut after = Node::start(&redis.url(), "node-a").await;
    let stored = after.link.state().own_placements().await.unwrap();
    assert_eq!(stored.len(), traffic.users.len());
    let established: HashSet<ConnectionKey> = stored
        .iter()
        .step_by(2)
        .map(|placement| placement.connection)
        .collect();
    let kept: HashSet<&str> = stored
        .iter()
        .step_by(2)
        .map(|placement| placement.user.as_str())
        .collect();
    assert_eq!(
        after
            .link
            .adopt(stored.clone(), &established, &mut after.engine),
        established.len()
    );
    // One adopted connection closes: its user is no longer placed.
    let closed = stored[0].clone();
    let mut close = traffic.events[0].clone();
    (close.saddr, close.sport) = (closed.connection.local.ip(), closed.connection.local.port());
    (close.daddr, close.dport) = (
        closed.connection.remote.ip(),
        closed.connection.remote.port(),
    );
    close.connection = 0xdead_0000;
    close.kind = EventKind::TcpState {
        old: TcpState::Established,
        new: TcpState::Close,
    };
    after.feed([&close]);
    after.written().await;

    // Pushes seen on the restarted node itself are judged against the adopted placements.
    after.feed(grpc(&traffic));
    after.settle().await;
    after.pass(2).await;
    let expected: Vec<MismatchKey> = oracle(&traffic)
        .into_iter()
        .filter(|(user, ..)| kept.contains(user.as_str()) && *user != closed.user)
        .collect();
    assert!(!expected.is_empty());
    let found = mismatches(&after.printed);
    assert_eq!(found.keys().cloned().collect::<Vec<_>>(), expected);
    // The ones gone meanwhile (and the closed one) left Redis.
    let left = after.link.state().own_placements().await.unwrap();
    assert_eq!(left.len(), established.len() - 1);
}

/// Events that close every connection `events` opened, one second after the last of them.
fn closing(events: &[&Event]) -> Vec<Event> {
    let end_ns = events.iter().map(|event| event.ts_ns).max().unwrap_or(0) + 1_000_000_000;
    let mut closed = HashSet::new();
    events
        .iter()
        .filter(|event| closed.insert(event.connection))
        .map(|event| {
            let mut close = (*event).clone();
            close.ts_ns = end_ns;
            close.kind = EventKind::TcpState {
                old: TcpState::Established,
                new: TcpState::Close,
            };
            close
        })
        .collect()
}

#[tokio::test]
async fn a_cached_lookup_follows_the_users_closing_on_another_node() {
    if !can_run(Needs::RedisServer) {
        return;
    }
    let redis = RedisServer::start().unwrap();
    let traffic = traffic();
    let expected = oracle(&traffic);
    let mut proxy_node = Node::start(&redis.url(), "node-a").await;
    let mut push_node = Node::start(&redis.url(), "node-b").await;
    let placements: Vec<&Event> = websocket(&traffic).collect();
    proxy_node.feed(placements.iter().copied());
    proxy_node.written().await;
    // The first lookup round anchors the change log; the later ones fill the cache.
    let pushes: Vec<Event> = grpc(&traffic).cloned().collect();
    push_node.feed(&pushes);
    push_node.settle().await;
    push_node.pass(2).await;
    assert_eq!(
        mismatches(&push_node.printed)
            .into_keys()
            .collect::<Vec<_>>(),
        expected
    );

    // Every user's WebSocket closes on the proxy's node: the push node's cached placements
    // are stale, and the change log says so.
    proxy_node.feed(&closing(&placements));
    proxy_node.written().await;
    let users_left = redis
        .dump()
        .unwrap()
        .into_iter()
        .filter(|stored| stored.key.ends_with(":placements") && stored.key.contains("{u:"))
        .count();
    assert_eq!(users_left, 0, "every placement left Redis");

    // The same calls again, two fold windows later: nobody is placed, nothing is judged.
    let printed_before = push_node.printed.len();
    let lookups_before = push_node.engine.counters().cluster.unwrap().lookups;
    let later = 130 * 1_000_000_000;
    let again: Vec<Event> = pushes
        .iter()
        .map(|event| {
            let mut event = event.clone();
            event.ts_ns += later;
            event
        })
        .collect();
    push_node.tick(push_node.now_ns + later);
    push_node.feed(&again);
    push_node.settle().await;
    push_node.pass(2).await;
    assert!(
        push_node.engine.counters().cluster.unwrap().lookups > lookups_before,
        "the calls were looked up again"
    );
    let mismatches_after = mismatches(&push_node.printed[printed_before..]);
    assert!(
        mismatches_after.is_empty(),
        "judged with stale placements: {mismatches_after:?}"
    );
    let counters = push_node.link.state().health().counters();
    assert_eq!(
        counters.mismatches_deduplicated, 0,
        "no mismatch was even raised"
    );
}
