use std::hash::BuildHasher;

use super::super::detectors::testing::*;
use crate::model::likely_bucket;

#[test]
fn full_tables_evict_the_users_placed_longest_ago_and_count_them() {
    let limits = RouteLimits {
        max_users: 10,
        max_tracked_connections: 15,
        ..RouteLimits::default()
    };
    let mut table = Detectors::new(limits);
    for index in 0..100u64 {
        place(&mut table, index, &format!("user{index}"), 0, SEC + index);
    }
    assert!(table.tracked_users() <= 10);
    assert_eq!(
        table.counters().users_evicted as usize + table.tracked_users(),
        100
    );
    // The newest users stay: a full table evicts the oldest, it does not refuse.
    assert!(table.placements.of("user99").is_some());
    assert!(table.placements.of("user0").is_none());
}

/// A socket whose close went unseen and whose address a new connection took: the new
/// placement replaces the old, and the new connection's close leaves nobody behind.
#[test]
fn a_placement_on_a_reused_socket_address_replaces_the_old_one() {
    let mut table = Detectors::new(RouteLimits::default());
    place(&mut table, 7, "before", 0, SEC);
    place(&mut table, 7, "after", 1, 2 * SEC);
    assert!(table.placements.of("before").is_none());
    assert_eq!(table.placements.of("after").map(<[_]>::len), Some(1));
    assert_eq!(table.placements.counters().placements_replaced, 1);
    assert_eq!(table.counters().placements, 2);
    assert_eq!(table.placements.end(7).as_deref(), Some("after"));
    assert_eq!(table.tracked_users(), 0);
}

/// What `prefetch` loads is, nearly always, the bucket the lookup then reads.
#[test]
fn the_prefetched_bucket_is_nearly_always_the_users_own() {
    let mut table = Detectors::new(RouteLimits::default());
    let users: Vec<String> = (0..10_000).map(|index| format!("{index:010}")).collect();
    for (index, user) in (0u64..).zip(&users) {
        place(&mut table, index + 1, user, 0, SEC);
    }
    let own = users
        .iter()
        .filter(|user| {
            let placements = &table.placements;
            likely_bucket(
                &placements.by_user,
                placements.hasher.hash_one(user.as_str()),
            )
            .is_some_and(|entry| entry.user == user.as_str())
        })
        .count();
    assert!(own >= 9_500, "{own} of 10,000");
}
