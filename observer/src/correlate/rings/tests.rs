use super::*;
use crate::openim::hashring::{MemberTemplate, PROXY_MEMBER_TEMPLATE, PUSH_MEMBER_TEMPLATE};

fn members(template: &str, replicas: usize) -> Vec<String> {
    MemberTemplate::parse(template)
        .unwrap()
        .members("demo", "chat", replicas)
}

fn ip(index: usize) -> IpAddr {
    IpAddr::from([10, 244, 0, 10 + index as u8])
}

/// A cluster where the proxy hashes over `hashed` and sends `Host: dialled`.
fn cluster(hashed: &[String], dialled: &[String], users: usize) -> LearnedRings {
    let push = members(PUSH_MEMBER_TEMPLATE, hashed.len());
    let mut rings = LearnedRings::default();
    for (index, member) in push.iter().enumerate() {
        rings.learn_push_member(member, ip(index));
    }
    let proxy_ring = Ring::new(hashed.iter().cloned());
    for user in 0..users {
        let user = format!("{}", 4_000_000_000u64 + user as u64 * 7_777);
        let index = proxy_ring.get_index(&user).unwrap();
        rings.learn_proxy_host(&dialled[index], ip(index));
        rings.record_placement(&user, ip(index), 0);
    }
    rings
}

#[test]
fn as_shipped_the_proxy_follows_its_own_spelling() {
    let proxy = members(PROXY_MEMBER_TEMPLATE, 5);
    let Verdict::Diverge {
        divergence,
        complete,
    } = cluster(&proxy, &proxy, 100).verdict()
    else {
        panic!("no divergence");
    };
    assert_eq!(
        divergence.difference,
        "push members carry ':88', proxy members do not"
    );
    assert_eq!(divergence.proxy_members, proxy);
    assert!(divergence.sample_split_share > 0.5);
    assert!(complete);
}

#[test]
fn the_correct_fix_hashes_like_push_whatever_host_it_sends() {
    let push = members(PUSH_MEMBER_TEMPLATE, 5);
    let host = members(PROXY_MEMBER_TEMPLATE, 5);
    assert_eq!(cluster(&push, &host, 100).verdict(), Verdict::Agree);
}

#[test]
fn one_gateway_never_decides() {
    let proxy = members(PROXY_MEMBER_TEMPLATE, 1);
    assert_eq!(
        cluster(&proxy, &proxy, 100).verdict(),
        Verdict::Undetermined
    );
}

#[test]
fn the_same_names_on_both_sides_are_one_ring() {
    let push = members(PUSH_MEMBER_TEMPLATE, 3);
    assert_eq!(cluster(&push, &push, 30).verdict(), Verdict::SameSpelling);
}

#[test]
fn a_gateway_without_placements_gets_the_inferred_spelling() {
    let proxy = members(PROXY_MEMBER_TEMPLATE, 5);
    // Only two users: not every gateway has been seen from the proxy side.
    let mut rings = cluster(&proxy, &proxy, 2);
    assert_eq!(
        rings.verdict(),
        Verdict::Undetermined,
        "too little evidence"
    );
    for user in ["u-a", "u-b", "u-c", "u-d", "u-e", "u-f", "u-g", "u-h"] {
        let index = Ring::new(proxy.clone()).get_index(user).unwrap();
        rings.record_placement(user, ip(index), 0);
    }
    let Verdict::Diverge {
        divergence,
        complete,
    } = rings.verdict()
    else {
        panic!("no divergence");
    };
    assert_eq!(divergence.proxy_members, proxy);
    assert!(!complete, "some gateways were never placed on");
}

#[test]
fn ordinals_are_read_from_the_first_label_only() {
    assert_eq!(
        split_ordinal("demo-openim-msggateway-12.demo-openim-msggateway-headless.chat:88"),
        Some((
            "demo-openim-msggateway-",
            12,
            ".demo-openim-msggateway-headless.chat:88"
        ))
    );
    assert_eq!(split_ordinal("gw-3:88"), Some(("gw-", 3, ":88")));
    assert_eq!(split_ordinal("gw-0"), Some(("gw-", 0, "")));
    for odd in [
        "gw.a-1",
        "gw-01.a",
        "gw-.a",
        "10.0.0.7:88",
        "gw-1x.a",
        "gw-5000.a",
    ] {
        assert_eq!(split_ordinal(odd), None, "{odd}");
    }
}

#[test]
fn rings_are_rebuilt_by_ordinal_with_unseen_gateways_synthesised() {
    let push = members(PUSH_MEMBER_TEMPLATE, 12);
    let proxy = members(PROXY_MEMBER_TEMPLATE, 12);
    let mut rings = LearnedRings::default();
    // Push dialled 11, 2 and 10 only; the proxy 0 and 5.
    for index in [11, 2, 10] {
        rings.learn_push_member(&push[index], ip(index));
    }
    rings.learn_proxy_host(&proxy[5], ip(5));
    assert_eq!(
        rings.learn_proxy_host(&proxy[0], ip(0)),
        Learned::Address,
        "below the highest ordinal: the same members"
    );
    assert_eq!(rings.members(), Some((proxy.clone(), push.clone())));
    assert!(!rings.complete());
    assert_eq!(
        (rings.proxy_replicas(), rings.push_replicas()),
        (Some(6), Some(12))
    );
    let ring = Ring::new(push.clone());
    for user in sample_user_ids(200) {
        let index = ring.get_index(&user).unwrap();
        let pick = rings.pick(Candidate::PushSpelled, &user).unwrap();
        assert_eq!(pick.member, push[index]);
        let known = [0, 2, 5, 10, 11].contains(&index);
        assert_eq!(pick.ip, known.then(|| ip(index)), "{user}");
    }
    assert_eq!(
        rings.learn_push_member(&members(PUSH_MEMBER_TEMPLATE, 13)[12], ip(12)),
        Learned::Membership
    );
    for index in 0..13 {
        rings.learn_push_member(&members(PUSH_MEMBER_TEMPLATE, 13)[index], ip(index));
        rings.learn_proxy_host(&members(PROXY_MEMBER_TEMPLATE, 13)[index], ip(index));
    }
    assert!(rings.complete());
}

#[test]
fn names_without_ordinals_keep_text_order() {
    let mut rings = LearnedRings::default();
    for (index, name) in ["gw-b:88", "gw-a:88", "10.0.0.9:88"].iter().enumerate() {
        rings.learn_push_member(name, ip(index));
    }
    let (_, push) = rings.members().unwrap();
    assert_eq!(push, ["10.0.0.9:88", "gw-a:88", "gw-b:88"]);
    assert!(!rings.complete());
}
