use super::*;
use crate::model::ConnectionKey;

fn socket(local: &str, remote: &str, inode: u64) -> TableSocket {
    TableSocket {
        key: ConnectionKey {
            local: local.parse().unwrap(),
            remote: remote.parse().unwrap(),
        },
        established: true,
        inode,
    }
}

fn tuple(local: &str, sport: u16, remote: &str) -> EntryTuple {
    EntryTuple {
        local: local.parse().unwrap(),
        sport,
        remote: remote.parse().unwrap(),
    }
}

#[test]
fn an_entry_without_a_held_socket_at_two_sweeps_in_a_row_is_gone() {
    let listener = socket("0.0.0.0:88", "0.0.0.0:0", 7);
    let live = socket("[::ffff:10.0.0.1]:40000", "[::ffff:10.0.0.2]:88", 8);
    let time_wait = socket("10.0.0.1:40001", "10.0.0.2:88", 0);
    let sockets = [listener, live, time_wait];
    let entries = [
        (1, tuple("10.0.0.1", 40000, "10.0.0.2:88")),
        (2, tuple("10.0.0.1", 40001, "10.0.0.2:88")),
        // Connecting, its source port not yet recorded.
        (3, tuple("10.0.0.1", 0, "10.0.0.2:88")),
        (4, tuple("10.0.0.1", 0, "10.0.0.3:88")),
    ];
    let mut stale = StaleEntries::new(true);
    assert!(stale.sweep(entries, &sockets).is_empty());
    let mut gone = stale.sweep(entries, &sockets);
    gone.sort_by_key(|(key, _)| *key);
    assert_eq!(gone, [entries[1], entries[3]]);
    // Found once more without a socket: still gone (the caller failed to remove it).
    assert_eq!(
        stale.sweep(entries[1..2].iter().copied(), &sockets).len(),
        1
    );
}

#[test]
fn an_entry_replaced_or_seen_alive_in_between_is_not_gone() {
    let sockets = [socket("10.0.0.1:1", "10.0.0.9:9", 5)];
    let mut stale = StaleEntries::new(true);
    stale.sweep([(1, tuple("10.0.0.1", 40000, "10.0.0.2:88"))], &sockets);
    // The same key now names another connection (the address reused).
    let gone = stale.sweep([(1, tuple("10.0.0.1", 40002, "10.0.0.2:88"))], &sockets);
    assert!(gone.is_empty());
}

#[test]
fn unreadable_tables_remove_nothing() {
    let entry = (1, tuple("10.0.0.1", 40000, "10.0.0.2:88"));
    let mut stale = StaleEntries::new(true);
    for _ in 0..3 {
        assert!(stale.sweep([entry], &[]).is_empty());
    }
}

#[test]
fn a_process_outside_the_initial_pid_namespace_never_sweeps() {
    let mut stale = StaleEntries::new(false);
    assert!((0..4).all(|_| !stale.due()));
}

#[test]
fn every_other_reconciliation_sweeps() {
    let mut stale = StaleEntries::new(true);
    let due: Vec<bool> = (0..4).map(|_| stale.due()).collect();
    assert_eq!(due, [false, true, false, true]);
}
