use std::hash::BuildHasher;

use super::*;

#[test]
fn a_borrowed_mismatch_key_hashes_and_compares_as_its_owned_key() {
    let placed = ["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()];
    let borrowed = MismatchKey {
        user: "u1",
        placed: &placed,
        pushed: "10.0.0.3".parse().unwrap(),
    };
    let owned = borrowed.to_owned_key();
    let hasher = hashbrown::DefaultHashBuilder::default();
    assert_eq!(hasher.hash_one(borrowed), hasher.hash_one(&owned));
    assert!(hashbrown::Equivalent::equivalent(&borrowed, &owned));
    let other_user = MismatchKey {
        user: "u2",
        ..borrowed
    };
    assert!(!hashbrown::Equivalent::equivalent(&other_user, &owned));
    // Placed elsewhere: the same hash (the placements are not hashed), another key.
    let placed_elsewhere = MismatchKey {
        placed: &placed[..1],
        ..borrowed
    };
    assert_eq!(hasher.hash_one(placed_elsewhere), hasher.hash_one(&owned));
    assert!(!hashbrown::Equivalent::equivalent(
        &placed_elsewhere,
        &owned
    ));
    let upgrade = FoldKey::UpgradeOnGrpc {
        gateway: placed[0],
        port: 88,
        proxy_pid: 1,
    };
    assert!(!hashbrown::Equivalent::equivalent(&borrowed, &upgrade));
}
