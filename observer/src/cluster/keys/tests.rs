use super::*;

/// Returns the part of a key Redis Cluster hashes: the first `{…}` with something inside.
fn hash_tag(key: &str) -> &str {
    let open = key.find('{').unwrap();
    let close = key[open..].find('}').unwrap() + open;
    &key[open + 1..close]
}

#[test]
fn one_users_keys_share_a_slot() {
    let keys = Keys::new(DEFAULT_PREFIX);
    let ip: IpAddr = "10.0.0.7".parse().unwrap();
    let user_keys = [
        keys.user_placements("3355700821"),
        keys.mismatch_claim("3355700821", &[ip], ip),
    ];
    for key in &user_keys {
        assert!(key.starts_with("openim-observer:{u:3355700821}:"), "{key}");
        assert_eq!(hash_tag(key), "u:3355700821");
    }
    assert_eq!(hash_tag(&keys.node_connections("node-a")), "n:node-a");
    assert_eq!(hash_tag(&keys.ring_placements()), "ring");
}

#[test]
fn braces_in_ids_cannot_break_out_of_the_tag() {
    let keys = Keys::new("p:");
    let key = keys.user_placements("a}b{%");
    assert_eq!(key, "p:{u:a%7Db%7B%25}:placements");
    assert_eq!(hash_tag(&key), "u:a%7Db%7B%25");
}

#[test]
fn claims_do_not_depend_on_order() {
    let keys = Keys::new("p:");
    let (a, b, c): (IpAddr, IpAddr, IpAddr) = (
        "10.0.0.1".parse().unwrap(),
        "10.0.0.2".parse().unwrap(),
        "10.0.0.3".parse().unwrap(),
    );
    assert_eq!(
        keys.mismatch_claim("u", &[a, b], c),
        keys.mismatch_claim("u", &[b, a, a], c)
    );
    let members = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    assert_ne!(
        keys.divergence_claim(&members(&["a", "b"]), &members(&["a:88"])),
        keys.divergence_claim(&members(&["a"]), &members(&["b", "a:88"]))
    );
    let (proxy, push) = (members(&["a:88"]), members(&["a:88"]));
    assert_eq!(
        keys.divergence_claim(&proxy, &push),
        "p:{ring}:claim:divergence:1-1-044b385c"
    );
    let resolved = keys.divergence_resolved_claim(&proxy, &push);
    assert_ne!(resolved, keys.divergence_claim(&proxy, &push));
    assert_eq!(hash_tag(&resolved), "ring");
}

#[test]
fn placements_round_trip_and_expire() {
    let placement = SharedPlacement {
        user: "42".into(),
        node: "node-b".into(),
        connection: "[::ffff:10.0.0.9]:41000>10.0.0.7:80".parse().unwrap(),
        gateway_ip: "10.0.0.7".parse().unwrap(),
        gateway_port: 80,
        gateway_name: Some("gw-0.gw-headless".into()),
        platform: Some(1),
        since_ns: 5,
        proxy_pid: 77,
        proxy_comm: "msggw-proxy".into(),
    };
    let (field, value) = (placement.field(), placement.value(2_000));
    assert_eq!(field, "node-b|[::ffff:10.0.0.9]:41000>10.0.0.7:80");
    assert_eq!(
        SharedPlacement::from_stored("42", &field, &value, 1_999),
        Some(placement)
    );
    assert_eq!(
        SharedPlacement::from_stored("42", &field, &value, 2_000),
        None
    );
    assert_eq!(SharedPlacement::from_stored("42", "junk", &value, 0), None);
}
