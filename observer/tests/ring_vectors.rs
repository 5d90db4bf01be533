//! Checks `Ring` against vectors produced by the original Go library (stathat.com/c/consistent
//! v1.0.0): every pick of every line must match, since one mismatch means the observer would
//! predict a gateway OpenIM never chooses. `ring-vectors-large.jsonl` (10 to 64 members in index
//! order, and a set with a colliding point) goes through the rings the engine rebuilds from the
//! wire too: `correlate::ring_verdicts`' tests.

use std::collections::BTreeMap;
use std::path::PathBuf;

use observer::openim::hashring::Ring;
use serde::Deserialize;

/// One line of `ring-vectors.jsonl` or `ring-vectors-large.jsonl`.
#[derive(Deserialize)]
struct Vector {
    members: Vec<String>,
    picks: BTreeMap<String, String>,
    /// Says which members' points collide, on the collision set.
    #[serde(default)]
    note: Option<String>,
}

/// The shared folder sits beside the repository checkout; `OPENIM_SHARED_DIR` points elsewhere.
fn vectors_path(file: &str) -> PathBuf {
    let shared_dir = std::env::var_os("OPENIM_SHARED_DIR").map_or_else(
        || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/openim")),
        PathBuf::from,
    );
    shared_dir.join(file)
}

#[test]
fn ring_matches_every_go_pick() {
    check_every_pick("ring-vectors.jsonl");
}

#[test]
fn ring_matches_every_go_pick_of_the_large_rings() {
    check_every_pick("ring-vectors-large.jsonl");
}

/// Members added in text order (`…-29` before `…-4`) give the collision set's shared point to
/// the other member: the order the engine rebuilds must be the index order.
#[test]
fn text_order_loses_the_collision_sets_picks() {
    let path = vectors_path("ring-vectors-large.jsonl");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()));
    let collision: Vector = text
        .lines()
        .filter_map(|line| serde_json::from_str::<Vector>(line).ok())
        .find(|vector| vector.note.is_some())
        .expect("the collision set");
    let mut text_order = collision.members.clone();
    text_order.sort();
    let ring = Ring::new(text_order.iter().map(String::as_str));
    let differing = collision
        .picks
        .iter()
        .filter(|(user, expected)| ring.get(user).unwrap() != expected.as_str())
        .count();
    assert_eq!(differing, 5, "{:?}", collision.note);
}

fn check_every_pick(file: &str) {
    let path = vectors_path(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|error| {
        panic!(
            "cannot read the Go ring vectors at {}: {error}. They live in the shared OpenIM \
             folder beside the checkout; set OPENIM_SHARED_DIR to the folder holding \
             ring-vectors.jsonl",
            path.display()
        )
    });

    let mut lines_checked = 0;
    let mut picks_checked = 0;
    let mut mismatches = Vec::new();
    for (line_index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let line_number = line_index + 1;
        let vector: Vector = serde_json::from_str(line)
            .unwrap_or_else(|error| panic!("{}:{line_number}: {error}", path.display()));
        assert!(
            !vector.picks.is_empty(),
            "{}:{line_number} has no picks to check",
            path.display()
        );
        let ring = Ring::new(vector.members.iter().map(String::as_str));
        for (user, expected) in &vector.picks {
            let actual = ring
                .get(user)
                .unwrap_or_else(|error| panic!("line {line_number}, user {user}: {error}"));
            if actual != expected {
                mismatches.push(format!(
                    "line {line_number} ({} members), user {user}: Go picks {expected}, Ring picks \
                    {actual}",
                    vector.members.len()
                ));
            }
            picks_checked += 1;
        }
        lines_checked += 1;
    }

    assert!(lines_checked > 0, "{} holds no vectors", path.display());
    assert!(
        mismatches.is_empty(),
        "{} of {picks_checked} picks differ from Go:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
    println!("{picks_checked} picks over {lines_checked} rings match the Go library");
}
