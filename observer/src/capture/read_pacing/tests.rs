use super::*;

const MS: Duration = Duration::from_millis(1);

#[test]
fn single_pushes_keep_the_short_follow_up() {
    let start = Instant::now();
    let mut pacing = ReadPacing::new(start);
    // One push every 50 ms, its 15 records in two reads a millisecond apart.
    for push in 0..20u32 {
        let at = start + push * 50 * MS;
        assert_eq!(pacing.follow_up(10, at), READ_FOLLOW_UP);
        assert_eq!(pacing.follow_up(5, at + MS), READ_FOLLOW_UP);
    }
}

#[test]
fn sustained_traffic_lengthens_it_and_a_quiet_spell_shortens_it_again() {
    let start = Instant::now();
    let mut pacing = ReadPacing::new(start);
    // 22 records a millisecond: the first window is read at the short follow-up.
    let mut at = start;
    let mut follow_up = READ_FOLLOW_UP;
    let mut reads = 0;
    while at < start + 200 * MS {
        let records = 22 * follow_up.as_millis() as usize;
        follow_up = pacing.follow_up(records, at);
        at += follow_up;
        reads += 1;
        if at > start + BUSY_WINDOW + 2 * MS {
            assert_eq!(follow_up, BUSY_READ_FOLLOW_UP, "after {reads} reads");
        }
    }
    // Silence for a second, then one push: the window that ends is not busy.
    at += 1000 * MS;
    assert_eq!(pacing.follow_up(15, at), READ_FOLLOW_UP);
}

#[test]
fn quiet_drains_back_off_to_a_quarter_second_and_start_over_after_records() {
    let start = Instant::now();
    let mut pacing = ReadPacing::new(start);
    let waits: Vec<u128> = (0..10).map(|_| pacing.quiet(false).as_millis()).collect();
    assert_eq!(waits, [10, 20, 40, 80, 160, 250, 250, 250, 250, 250]);
    // Records held for a gap are released by drains: those stay short, backing off or not.
    assert_eq!(pacing.quiet(true), FIRST_QUIET_DRAIN);
    assert_eq!(pacing.quiet(false), LONGEST_QUIET_DRAIN);
    pacing.follow_up(3, start + 5000 * MS);
    assert_eq!(pacing.quiet(false), FIRST_QUIET_DRAIN);
    assert_eq!(pacing.quiet(false), 2 * FIRST_QUIET_DRAIN);
}

#[test]
fn a_longer_follow_up_is_stamped_ahead_so_it_may_be_later() {
    // Due (2 ms after the stamp) a millisecond after the short follow-up...
    assert_eq!(awake_stamp(1_000, READ_FOLLOW_UP), 1_000);
    // ... and `BUSY_READ_SLACK` after the long one: 3 ms, then 2 ms of slack.
    assert_eq!(awake_stamp(1_000, BUSY_READ_FOLLOW_UP), 1_000 + 3_000_000);
    assert_eq!(awake_stamp(u64::MAX - 1, BUSY_READ_FOLLOW_UP), u64::MAX);
}
