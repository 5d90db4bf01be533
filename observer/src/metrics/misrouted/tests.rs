use std::time::Duration;

use super::*;

#[test]
fn users_count_until_their_window_closes() {
    let mut users = MisroutedUsers::default();
    let start = Instant::now();
    let minute = Duration::from_secs(60);
    users.seen(&"alice".into(), start + minute);
    users.seen(&"bob".into(), start + minute);
    users.seen(&"alice".into(), start + 2 * minute);
    assert_eq!(users.count(start), 2);
    assert_eq!(users.count(start + minute), 1);
    assert_eq!(users.count(start + 2 * minute), 0);
}
