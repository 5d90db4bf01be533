//! Ring lookup and build speed. Prints figures rather than asserting them: the observer does one
//! pick per placement and per push recipient, and aims for at most 30 ns a pick (Go: ~100 ns).
//!
//! Run with `cargo bench -p observer --bench ring`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use observer::openim::hashring::{MemberTemplate, PUSH_MEMBER_TEMPLATE, Ring, sample_user_ids};

const KEY_COUNT: usize = 1_000_000;
const BUILD_ROUNDS: u32 = 2_000;

fn time_picks(ring: &Ring, keys: &[String]) -> Duration {
    let started = Instant::now();
    for key in keys {
        black_box(ring.get_index(black_box(key)).ok());
    }
    started.elapsed()
}

fn main() {
    let keys = sample_user_ids(KEY_COUNT);
    let template = match MemberTemplate::parse(PUSH_MEMBER_TEMPLATE) {
        Ok(template) => template,
        Err(error) => panic!("the built-in push template must parse: {error}"),
    };
    println!("ring benchmark: {KEY_COUNT} numeric user ids, push-style member names");
    for member_count in [5, 50] {
        let members = template.members("demo", "chat", member_count);

        let started = Instant::now();
        for _ in 0..BUILD_ROUNDS {
            black_box(Ring::new(black_box(&members).iter().map(String::as_str)));
        }
        let build = started.elapsed() / BUILD_ROUNDS;

        let ring = Ring::new(members.iter().map(String::as_str));
        // A warm-up pass brings the keys and the ring into cache; the best of three passes is
        // the figure least disturbed by other work on the machine.
        time_picks(&ring, &keys);
        let best = (0..3)
            .map(|_| time_picks(&ring, &keys))
            .min()
            .unwrap_or_default();
        let nanos_per_pick = best.as_nanos() as f64 / KEY_COUNT as f64;
        let picks_per_second = KEY_COUNT as f64 / best.as_secs_f64();
        println!(
            "{member_count:>3} members: {nanos_per_pick:>6.1} ns/pick, {:>6.1} M picks/s, build \
            {:>7.2} µs",
            picks_per_second / 1e6,
            build.as_nanos() as f64 / 1e3
        );
    }
}
