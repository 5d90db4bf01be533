use std::collections::BTreeMap;

use super::super::detectors::testing::*;
use super::*;
use crate::openim::hashring::Ring;

fn ip(index: usize) -> IpAddr {
    IpAddr::from([10, 244, 1, index as u8])
}

fn push_name(index: usize) -> String {
    format!("{}:88", proxy_name(index as u8))
}

fn users(from: u64, count: u64) -> impl Iterator<Item = String> {
    (from..from + count).map(|number| (4_000_000_000 + number * 7_777).to_string())
}

/// Places `users` with a ring over `hashed(0..replicas)`, the proxy sending its own
/// spelling as `Host`.
fn place_with(
    verdicts: &mut RingVerdicts,
    hashed: fn(usize) -> String,
    replicas: usize,
    users: impl Iterator<Item = String>,
    ts: u64,
) -> Vec<(String, usize)> {
    let ring = Ring::new((0..replicas).map(hashed));
    users
        .map(|user| {
            let index = ring.get_index(&user).unwrap();
            verdicts.placement(Some(&proxy_name(index as u8)), ip(index), &user, ts);
            (user, index)
        })
        .collect()
}

fn push_dials(verdicts: &mut RingVerdicts, gateways: std::ops::Range<usize>, ts: u64) {
    for index in gateways {
        verdicts.push_call(Some(&push_name(index)), ip(index), ts);
    }
}

/// The causes of every user that push's ring over `push_replicas` gateways sends away from
/// where it sits.
fn causes(
    verdicts: &mut RingVerdicts,
    placed: &[(String, usize)],
    push_replicas: usize,
) -> BTreeMap<&'static str, usize> {
    let push_ring = Ring::new((0..push_replicas).map(push_name));
    let mut causes = BTreeMap::new();
    for (user, on) in placed {
        let pushed = push_ring.get_index(user).unwrap();
        if pushed != *on {
            let cause = verdicts.cause(user, &[ip(*on)], ip(pushed));
            *causes.entry(cause.name()).or_default() += 1;
        }
    }
    causes
}

fn proxy_spelled(index: usize) -> String {
    proxy_name(index as u8)
}

#[test]
fn as_shipped_scale_out_misses_are_the_spelling() {
    let mut verdicts = RingVerdicts::new(3);
    push_dials(&mut verdicts, 0..1, SEC);
    place_with(&mut verdicts, proxy_spelled, 1, users(0, 20), SEC);
    push_dials(&mut verdicts, 0..5, 30 * SEC);
    let placed = place_with(&mut verdicts, proxy_spelled, 5, users(100, 60), 31 * SEC);
    let causes = causes(&mut verdicts, &placed, 5);
    assert_eq!(causes.keys().collect::<Vec<_>>(), [&"ring_spelling"]);
    assert!(causes[&"ring_spelling"] > 20, "{causes:?}");
}

#[test]
fn the_correct_fix_leaves_only_stale_placements() {
    let mut verdicts = RingVerdicts::new(3);
    push_dials(&mut verdicts, 0..1, SEC);
    let before = place_with(&mut verdicts, push_name, 1, users(0, 40), SEC);
    push_dials(&mut verdicts, 0..5, 30 * SEC);
    let after = place_with(&mut verdicts, push_name, 5, users(100, 60), 31 * SEC);
    assert!(causes(&mut verdicts, &after, 5).is_empty());
    let causes = causes(&mut verdicts, &before, 5);
    assert_eq!(causes.keys().collect::<Vec<_>>(), [&"stale_placement"]);
    assert!(causes[&"stale_placement"] > 20, "{causes:?}");
}

#[test]
fn placements_made_before_a_scale_out_are_stale() {
    let mut verdicts = RingVerdicts::new(3);
    push_dials(&mut verdicts, 0..1, SEC);
    let before = place_with(&mut verdicts, push_name, 1, users(0, 40), SEC);
    push_dials(&mut verdicts, 0..5, 30 * SEC);
    place_with(&mut verdicts, push_name, 5, users(1000, 40), 31 * SEC);
    let causes = causes(&mut verdicts, &before, 5);
    assert_eq!(causes.keys().collect::<Vec<_>>(), [&"stale_placement"]);
}

#[test]
fn push_knowing_three_of_five_gateways_lags() {
    let mut verdicts = RingVerdicts::new(3);
    push_dials(&mut verdicts, 0..3, SEC);
    let placed = place_with(&mut verdicts, push_name, 5, users(0, 80), 2 * SEC);
    let causes = causes(&mut verdicts, &placed, 3);
    assert_eq!(causes.keys().collect::<Vec<_>>(), [&"push_ring_lags"]);
}

#[test]
fn a_proxy_still_on_three_of_five_gateways_lags() {
    let mut verdicts = RingVerdicts::new(3);
    push_dials(&mut verdicts, 0..5, SEC);
    let placed = place_with(&mut verdicts, push_name, 3, users(0, 80), 2 * SEC);
    let causes = causes(&mut verdicts, &placed, 5);
    assert_eq!(causes.keys().collect::<Vec<_>>(), [&"proxy_ring_lags"]);
}

#[test]
fn without_a_host_the_proxy_ring_is_not_said_to_lag() {
    let mut verdicts = RingVerdicts::new(3);
    push_dials(&mut verdicts, 0..5, SEC);
    let ring = Ring::new((0..3).map(push_name));
    let placed: Vec<(String, usize)> = users(0, 40)
        .map(|user| {
            let index = ring.get_index(&user).unwrap();
            verdicts.placement(None, ip(index), &user, 2 * SEC);
            (user, index)
        })
        .collect();
    let causes = causes(&mut verdicts, &placed, 5);
    assert!(!causes.contains_key(&"proxy_ring_lags"), "{causes:?}");
}

#[test]
fn no_ring_is_judged_while_push_broadcasts() {
    let mut verdicts = RingVerdicts::new(3);
    push_dials(&mut verdicts, 0..3, SEC);
    let placed = place_with(&mut verdicts, proxy_spelled, 3, users(0, 40), SEC);
    verdicts.push_routing_learned(PushRoutingMode::Broadcast);
    let mut alerts = Vec::new();
    verdicts.evaluate(10 * SEC, false, &mut alerts);
    verdicts.evaluate(20 * SEC, true, &mut alerts);
    assert!(alerts.is_empty(), "{alerts:?}");
    assert_eq!(
        causes(&mut verdicts, &placed, 3).keys().collect::<Vec<_>>(),
        [&"undetermined"]
    );
    verdicts.push_routing_learned(PushRoutingMode::Ring);
    verdicts.evaluate(30 * SEC, false, &mut alerts);
    assert_eq!(kinds(&alerts), ["ring_divergence"]);
    assert_eq!(
        causes(&mut verdicts, &placed, 3).keys().collect::<Vec<_>>(),
        [&"ring_spelling"]
    );
}

#[test]
fn differently_spelled_rings_diverge_once_settled() {
    let mut table = Detectors::new(RouteLimits::default());
    let mut alerts = Vec::new();
    // As shipped: the proxy places with a ring over its own spelling; push learns its
    // members from its calls.
    let place_users = |table: &mut Detectors, replicas: u8, from: u64, ts: u64| {
        let ring = Ring::new((0..replicas).map(proxy_name));
        for number in from..from + 30 {
            let user = (4_000_000_000 + number * 7_777).to_string();
            let index = ring.get_index(&user).unwrap() as u8;
            place(table, 10_000 + number, &user, index, ts);
        }
    };
    for index in 0..3u8 {
        alerts.extend(push(
            &mut table,
            100 + u64::from(index),
            &[],
            index,
            SEC,
            true,
        ));
    }
    place_users(&mut table, 3, 0, SEC);
    table.tick(2 * SEC, &mut alerts);
    assert!(alerts.is_empty(), "not settled yet");
    table.tick(5 * SEC, &mut alerts);
    assert_eq!(kinds(&alerts), ["ring_divergence"]);
    let AlertBody::RingDivergence {
        state,
        difference,
        proxy_members,
        push_members,
        complete,
        sample_split_share,
        lasted_secs,
        ..
    } = &*alerts[0].body
    else {
        unreachable!()
    };
    assert_eq!(*state, RingDivergenceState::Diverged);
    assert_eq!(difference, "push members carry ':88', proxy members do not");
    assert_eq!(proxy_members, &(0..3).map(proxy_name).collect::<Vec<_>>());
    assert_eq!(push_members.len(), 3);
    assert!(*complete);
    assert_eq!(*lasted_secs, None);
    assert!(*sample_split_share > 0.3, "{sample_split_share}");
    let json: serde_json::Value = serde_json::from_str(&alerts[0].to_json_line()).unwrap();
    assert_eq!(json["state"], "diverged");
    assert_eq!(json["ring_complete"], true);
    assert!(json.get("lasted_secs").is_none(), "{json}");
    table.tick(20 * SEC, &mut alerts);
    assert_eq!(alerts.len(), 1, "reported once while membership holds");
    // Scale-out: a fourth gateway appears on both sides.
    push(&mut table, 150, &[], 3, 30 * SEC, true);
    place_users(&mut table, 4, 1000, 30 * SEC);
    table.tick(40 * SEC, &mut alerts);
    assert_eq!(kinds(&alerts), ["ring_divergence", "ring_divergence"]);
}

#[test]
fn a_divergence_resolves_once_the_proxy_hashes_like_push() {
    let mut table = Detectors::new(RouteLimits::default());
    let mut alerts = Vec::new();
    let place_users = |table: &mut Detectors, hashed: fn(usize) -> String, ts: u64| {
        let ring = Ring::new((0..3).map(hashed));
        for (connection, user) in users(0, 40).enumerate() {
            let index = ring.get_index(&user).unwrap() as u8;
            place(table, ts / SEC * 100 + connection as u64, &user, index, ts);
        }
    };
    for index in 0..3u8 {
        push(&mut table, 100 + u64::from(index), &[], index, SEC, true);
    }
    place_users(&mut table, proxy_spelled, SEC);
    table.tick(5 * SEC, &mut alerts);
    assert_eq!(kinds(&alerts), ["ring_divergence"]);
    // The correct fix rolls out: every user reconnects through a proxy hashing push's
    // members (still dialling port 80, still sending its own spelling as `Host`).
    place_users(&mut table, push_name, 60 * SEC);
    for index in 0..3u8 {
        push(
            &mut table,
            200 + u64::from(index),
            &[],
            index,
            61 * SEC,
            true,
        );
    }
    table.tick(70 * SEC, &mut alerts);
    assert_eq!(kinds(&alerts), ["ring_divergence", "ring_divergence"]);
    let AlertBody::RingDivergence {
        state,
        proxy_members,
        push_members,
        lasted_secs,
        placements_checked,
        pushes_checked,
        diagnosis,
        ..
    } = &*alerts[1].body
    else {
        unreachable!()
    };
    assert_eq!(*state, RingDivergenceState::Resolved);
    assert_eq!(proxy_members, push_members);
    assert_eq!(*lasted_secs, Some(65));
    assert_eq!(*placements_checked, Some(40));
    assert_eq!(*pushes_checked, Some(3));
    assert!(diagnosis.starts_with("Resolved"), "{diagnosis}");
    let json: serde_json::Value = serde_json::from_str(&alerts[1].to_json_line()).unwrap();
    assert_eq!(json["state"], "resolved");
    assert_eq!(json["lasted_secs"], 65);
    assert_eq!(json["placements_checked"], 40);
    assert_eq!(json["pushes_checked"], 3);
    table.tick(200 * SEC, &mut alerts);
    table.finish(300 * SEC, &mut alerts);
    assert_eq!(alerts.len(), 2, "resolved once");
}

/// One line of `ring-vectors-large.jsonl`.
#[derive(serde::Deserialize)]
struct Vector {
    members: Vec<String>,
    picks: BTreeMap<String, String>,
}

/// The Go library's vectors, found as `observer/tests/ring_vectors.rs` finds them.
fn large_vectors() -> Vec<Vector> {
    let shared_dir = std::env::var_os("OPENIM_SHARED_DIR").map_or_else(
        || std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/openim")),
        std::path::PathBuf::from,
    );
    let path = shared_dir.join("ring-vectors-large.jsonl");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()));
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// `0..len` in a fixed shuffled order.
fn shuffled(len: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..len).collect();
    let mut state = seed | 1;
    for index in (1..len).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        order.swap(index, (state % (index as u64 + 1)) as usize);
    }
    order
}

#[test]
fn the_engines_push_ring_matches_the_large_go_vectors() {
    let vectors = large_vectors();
    assert!(vectors.len() >= 29, "{}", vectors.len());
    for (line, vector) in vectors.iter().enumerate() {
        let mut verdicts = RingVerdicts::new(3);
        for index in shuffled(vector.members.len(), line as u64 + 7) {
            verdicts.push_call(Some(&vector.members[index]), ip(index), SEC);
        }
        for (user, expected) in &vector.picks {
            let index = vector.members.iter().position(|m| m == expected).unwrap();
            assert_eq!(
                verdicts.push_ring_pick(user),
                Some((expected.clone(), Some(ip(index)))),
                "line {}, user {user}",
                line + 1
            );
        }
    }
}

#[test]
fn the_engines_rings_match_the_large_go_vectors_before_every_gateway_is_dialled() {
    let vectors = large_vectors();
    let mut checked = 0;
    for (line, vector) in vectors.iter().enumerate() {
        let n = vector.members.len();
        let Some(proxy_members) = vector
            .members
            .iter()
            .map(|member| member.strip_suffix(":88").map(str::to_owned))
            .collect::<Option<Vec<_>>>()
        else {
            continue;
        };
        // The same members without the port, hashed by Go too: the proxy's ring.
        let proxy_vector = vectors
            .iter()
            .find(|other| other.members == proxy_members)
            .expect("each :88 line has its line without the port");
        // Push dialled a third of the gateways, the last among them; the proxy another
        // third. Every member is still in the rings, in index order.
        let mut verdicts = RingVerdicts::new(3);
        let order = shuffled(n, line as u64 + 11);
        for &index in order
            .iter()
            .filter(|&&index| index % 3 == 0 || index == n - 1)
        {
            verdicts.push_call(Some(&vector.members[index]), ip(index), SEC);
        }
        for &index in order.iter().filter(|&&index| index % 3 == 1) {
            verdicts.placement(Some(&proxy_members[index]), ip(index), "u", SEC);
        }
        for (user, expected) in &vector.picks {
            let index = vector.members.iter().position(|m| m == expected).unwrap();
            let known = index % 3 != 2 || index == n - 1;
            assert_eq!(
                verdicts.push_ring_pick(user),
                Some((expected.clone(), known.then(|| ip(index)))),
                "line {}, user {user} (a gateway not dialled has no IP)",
                line + 1
            );
        }
        for (user, expected) in &proxy_vector.picks {
            let (member, _) = verdicts.proxy_ring_pick(user).unwrap();
            assert_eq!(member, *expected, "line {}, user {user}", line + 1);
        }
        assert!(!verdicts.rings.complete());
        checked += 1;
    }
    assert!(checked >= 14, "{checked} lines with ':88'");
}

#[test]
fn the_divergence_lists_the_collision_sets_members_in_index_order() {
    let vectors = large_vectors();
    let collision = vectors
        .iter()
        .find(|vector| vector.members.len() > 50 && !vector.members[0].ends_with(":88"))
        .expect("the collision set");
    let hosts = &collision.members;
    let mut table = Detectors::new(RouteLimits::default());
    let mut alerts = Vec::new();
    // The proxy places as shipped (its own spelling); the collision set's picks are among
    // its placements, so its ring decides them as Go did.
    let proxy_ring = Ring::new(hosts.iter().cloned());
    let users = collision.picks.keys().cloned().chain(users(0, 400));
    for (connection, user) in users.enumerate() {
        let index = proxy_ring.get_index(&user).unwrap();
        assert!(
            collision
                .picks
                .get(&user)
                .is_none_or(|pick| *pick == hosts[index])
        );
        let gateway = Gateway {
            ip: ip(index),
            port: 80,
            name: Some(hosts[index].as_str().into()),
        };
        table.observe(
            Observation::UpgradeRequested {
                connection: connection as u64,
                endpoints: endpoints(connection as u64, 0),
                ts_ns: SEC,
                user: user.as_str().into(),
                platform: Some(2),
                gateway,
                proxy: process(10, "msggw-proxy"),
            },
            &mut alerts,
        );
    }
    for index in shuffled(hosts.len(), 3) {
        table.observe(
            Observation::PushCalled {
                connection: 100_000 + index as u64,
                stream_id: 1,
                ts_ns: SEC,
                method: "SuperGroupOnlineBatchPushOneMsg".into(),
                service: None,
                gateway: Gateway {
                    ip: ip(index),
                    port: 88,
                    name: Some(format!("{}:88", hosts[index]).into()),
                },
                pusher: process(20, "openim-push"),
                message: MessageIds::default(),
                recipients: Vec::new(),
            },
            &mut alerts,
        );
    }
    table.tick(10 * SEC, &mut alerts);
    let divergence = alerts
        .iter()
        .find(|alert| alert.kind() == "ring_divergence")
        .expect("a divergence");
    let AlertBody::RingDivergence {
        proxy_members,
        push_members,
        complete,
        ..
    } = &*divergence.body
    else {
        unreachable!()
    };
    assert_eq!(proxy_members, hosts, "index order, not text order");
    let with_port: Vec<String> = hosts.iter().map(|host| format!("{host}:88")).collect();
    assert_eq!(push_members, &with_port);
    assert!(*complete);
}
