use hashbrown::HashMap;

use super::*;

#[test]
fn least_useful_picks_the_lowest_ranks() {
    let map: HashMap<u32, u64> = (0..100).map(|key| (key, u64::from(99 - key))).collect();
    let mut keys = least_useful(map.iter(), 3, |rank| *rank);
    keys.sort_unstable();
    assert_eq!(keys, vec![97, 98, 99]);
    assert_eq!(least_useful(map.iter(), 1000, |rank| *rank).len(), 100);
    assert!(least_useful(map.iter(), 0, |rank| *rank).is_empty());
}

#[test]
fn the_default_budget_bounds_every_table() {
    let budget = MemoryBudget::default();
    assert!(budget.max_connections() * CONNECTION_BYTES <= budget.bytes / 4);
    assert!(budget.max_fold_windows() * FOLD_WINDOW_BYTES <= budget.bytes / 8);
    assert!(budget.max_pending_calls() >= 1024);
}

#[test]
fn resident_memory_is_read_from_procfs() {
    let memory = resident_memory().expect("procfs");
    assert!(memory.peak_bytes >= memory.current_bytes);
    assert!(memory.current_bytes > 0);
}
