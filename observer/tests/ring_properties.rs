//! Properties of the consistent-hash ring over many generated member sets and keys, with a
//! fixed-seed generator so that any failure reproduces exactly.

use std::collections::HashMap;

use observer::openim::hashring::{
    MemberTemplate, POINTS_PER_MEMBER, PROXY_MEMBER_TEMPLATE, PUSH_MEMBER_TEMPLATE, Ring,
};

/// SplitMix64: tiny, fast and good enough to spread test inputs; no dependency needed.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut mixed = self.0;
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        mixed ^ (mixed >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }

    /// Ids shaped like OpenIM's numeric user ids, plus some free-form ones.
    fn user_id(&mut self) -> String {
        if self.below(4) == 0 {
            format!("user_{:x}", self.next())
        } else {
            (1_000_000_000 + self.below(9_000_000_000)).to_string()
        }
    }

    fn users(&mut self, count: usize) -> Vec<String> {
        (0..count).map(|_| self.user_id()).collect()
    }

    /// Distinct member names, as a deployment's gateway addresses are.
    fn members(&mut self, count: usize) -> Vec<String> {
        let salt = self.next();
        (0..count)
            .map(|index| format!("gw-{index}-{salt:x}.ns.svc:{}", self.below(65536)))
            .collect()
    }
}

/// A direct transcription of the Go library's data structure (a map from point hash to member,
/// then a sorted list of hashes) to compare the optimised `Ring` against.
struct ReferenceRing<'a> {
    circle: HashMap<u32, &'a str>,
    sorted_hashes: Vec<u32>,
}

impl<'a> ReferenceRing<'a> {
    fn new(members_in_add_order: &'a [String]) -> Self {
        let mut circle = HashMap::new();
        for member in members_in_add_order {
            for point in 0..POINTS_PER_MEMBER {
                circle.insert(
                    crc32fast::hash(format!("{point}{member}").as_bytes()),
                    member.as_str(),
                );
            }
        }
        let mut sorted_hashes: Vec<u32> = circle.keys().copied().collect();
        sorted_hashes.sort_unstable();
        Self {
            circle,
            sorted_hashes,
        }
    }

    fn get(&self, key: &str) -> &'a str {
        let key_hash = crc32fast::hash(key.as_bytes());
        let first_greater = self
            .sorted_hashes
            .iter()
            .position(|&point| point > key_hash)
            .unwrap_or(0);
        self.circle[&self.sorted_hashes[first_greater]]
    }
}

#[test]
fn ring_agrees_with_a_literal_port_of_the_go_library() {
    let mut rng = SplitMix64(1);
    for _ in 0..100 {
        let member_count = 1 + rng.below(12) as usize;
        let members = rng.members(member_count);
        let ring = Ring::new(members.iter().map(String::as_str));
        let reference = ReferenceRing::new(&members);
        for key in rng.users(200) {
            assert_eq!(ring.get(&key).unwrap(), reference.get(&key), "{key}");
        }
    }
}

#[test]
fn one_member_takes_every_key() {
    let mut rng = SplitMix64(2);
    for _ in 0..50 {
        let members = rng.members(1);
        let ring = Ring::new(members.iter().map(String::as_str));
        for key in rng.users(200) {
            assert_eq!(ring.get_index(&key).unwrap(), 0);
            assert_eq!(ring.get(&key).unwrap(), members[0]);
        }
    }
}

#[test]
fn adding_a_member_only_moves_keys_to_it() {
    let mut rng = SplitMix64(3);
    for _ in 0..100 {
        let member_count = 2 + rng.below(10) as usize;
        let mut members = rng.members(member_count);
        let newcomer = members.pop().expect("at least two members");
        let before = Ring::new(members.iter().map(String::as_str));
        let after = Ring::new(
            members
                .iter()
                .map(String::as_str)
                .chain([newcomer.as_str()]),
        );
        let mut moved = 0;
        for key in rng.users(500) {
            let old_pick = before.get(&key).unwrap();
            let new_pick = after.get(&key).unwrap();
            if new_pick != old_pick {
                assert_eq!(new_pick, newcomer, "{key} moved between old members");
                moved += 1;
            }
        }
        // The newcomer owns roughly 1/n of the circle; none at all would mean it never joined.
        assert!(moved > 0, "no key moved to {newcomer}");
    }
}

#[test]
fn picks_depend_only_on_the_member_set_when_no_points_collide() {
    let mut rng = SplitMix64(4);
    for _ in 0..100 {
        let member_count = 1 + rng.below(12) as usize;
        let members = rng.members(member_count);
        let mut shuffled = members.clone();
        for index in (1..shuffled.len()).rev() {
            shuffled.swap(index, rng.below(index as u64 + 1) as usize);
        }
        let ring = Ring::new(members.iter().map(String::as_str));
        let same_members_reordered = Ring::new(shuffled.iter().map(String::as_str));
        let rebuilt = Ring::new(members.iter().map(String::as_str));
        for key in rng.users(200) {
            let pick = ring.get(&key).unwrap();
            assert_eq!(same_members_reordered.get(&key).unwrap(), pick);
            assert_eq!(rebuilt.get(&key).unwrap(), pick);
            assert_eq!(ring.members()[ring.get_index(&key).unwrap()], pick);
        }
    }
}

/// Two member names of equal length whose point 0 hashes alike, found once by a birthday search
/// over random hex names. CRC-32 is linear, so equal-length names that collide on one point
/// collide on all twenty: whichever was added last owns the whole shared circle.
const COLLIDING_MEMBERS: (&str, &str) = ("gw-a3f44cefdebd019c", "gw-c4f472c42f00fd51");

#[test]
fn on_a_collision_the_member_added_last_owns_the_point() {
    let (first, second) = COLLIDING_MEMBERS;
    assert_eq!(
        crc32fast::hash(format!("0{first}").as_bytes()),
        crc32fast::hash(format!("0{second}").as_bytes())
    );
    let first_then_second = Ring::new([first, second]);
    let second_then_first = Ring::new([second, first]);
    // Re-adding a member re-stamps its points, as Go's map assignment does, but keeps its index.
    let first_second_first = Ring::new([first, second, first]);
    assert_eq!(first_second_first.members(), [first, second]);

    let mut rng = SplitMix64(5);
    let key_on_shared_point = (0..1_000_000)
        .map(|_| rng.user_id())
        .find(|key| first_then_second.get(key).unwrap() != second_then_first.get(key).unwrap())
        .expect("some key lands on the shared point");
    assert_eq!(first_then_second.get(&key_on_shared_point).unwrap(), second);
    assert_eq!(second_then_first.get(&key_on_shared_point).unwrap(), first);
    assert_eq!(first_second_first.get(&key_on_shared_point).unwrap(), first);
}

/// OpenIM's proxy ring spells gateways without a port and its push ring with `:88`, so the two
/// place users independently: about 1 - 1/n of them end up on different gateways. That is an
/// average over deployments: with 20 points per member, one deployment's arcs are uneven and its
/// share can sit 10+ points off (demo/chat splits 62% at 2 replicas, 81% at 3). OpenIM's Go code
/// splits 46%, 57%, 72%, 78%, 86% for 2, 3, 4, 5, 8 replicas over 300 ids.
#[test]
fn proxy_and_push_rings_split_about_one_minus_one_over_n_of_users() {
    let proxy = MemberTemplate::parse(PROXY_MEMBER_TEMPLATE).unwrap();
    let push = MemberTemplate::parse(PUSH_MEMBER_TEMPLATE).unwrap();
    let users = SplitMix64(6).users(1_000);
    let instances: Vec<String> = (0..40).map(|index| format!("inst{index}")).collect();
    for replicas in [1, 2, 3, 4, 5, 8] {
        let expected = 1.0 - 1.0 / replicas as f64;
        let mut share_sum = 0.0;
        for instance in &instances {
            let proxy_ring = Ring::new(proxy.members(instance, "chat", replicas));
            let push_ring = Ring::new(push.members(instance, "chat", replicas));
            let split = users
                .iter()
                .filter(|user| {
                    proxy_ring.get_index(user).unwrap() != push_ring.get_index(user).unwrap()
                })
                .count();
            if replicas == 1 {
                assert_eq!(split, 0, "a single gateway cannot disagree with itself");
            }
            let share = split as f64 / users.len() as f64;
            assert!(
                (share - expected).abs() <= 0.25,
                "{instance}, {replicas} replicas: {:.1}% split, expected about {:.1}%",
                share * 100.0,
                expected * 100.0
            );
            share_sum += share;
        }
        let mean_share = share_sum / instances.len() as f64;
        assert!(
            (mean_share - expected).abs() <= 0.05,
            "{replicas} replicas: {:.1}% split on average, expected about {:.1}%",
            mean_share * 100.0,
            expected * 100.0
        );
    }
}
