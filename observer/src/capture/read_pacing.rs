//! Decides how soon the reader reads the ring again after a read that found records.
//!
//! While records keep coming the reader polls instead of being woken (`KernelCapture::
//! reader_polls`): each poll is a timer wakeup of the daemon, about a thousand a second at a
//! one-millisecond follow-up, whatever the traffic. At low load that millisecond is most of an
//! alert's delay (a push's answer arrives within a millisecond of its request, and waits for
//! the next read), so it stays short there. Under sustained traffic a wakeup per millisecond
//! is a quarter of the daemon's CPU (the lab's push flood: about 22 records a millisecond,
//! so a read handles about twenty), while a few milliseconds more per alert cost nobody
//! anything: past `BUSY_RECORDS_PER_SECOND`, measured over `BUSY_WINDOW`, the follow-up is
//! `BUSY_READ_FOLLOW_UP`. Measured by hand on the push flood (release observer, packet hook,
//! alternating runs of 8 s): wakeups per push 0.28–0.55 → 0.16–0.34, the daemon's CPU over a
//! run 460–490 ms → 380–420; the bench's CPU per 1,000 pushes 47.2 → 29.6 ms. Alert latency at
//! low load is unchanged (p99 1.9–4.1 ms either way, alternating).
//!
//! And how soon it drains the ring anyway once quiet. The first record after a quiet spell
//! wakes the reader, so a quiet drain only catches what a wakeup cannot: a program that read
//! the reader's stamp just before it went quiet (so did not wake it) and submitted just after
//! its last drain. Such a program has finished within microseconds, so the first quiet drain,
//! 10 ms on, catches every such record; later ones only release what the packet hook's
//! reordering held for a gap (`capture/reorder.rs`, which waits on drains) and are a safety
//! net. They back off, doubling up to a quarter of a second: a drain every 10 ms while idle
//! was 100 wakeups a second, about 1% of a core on this VM for an observer with nothing to
//! observe. Every read that finds records counts as one (`follow_up`), the reconciliation's
//! too: the programs count on a poll after a record that woke the reader.

use std::time::{Duration, Instant};

/// Sets the follow-up at low load: an alert waits about this long for the read that finds it.
pub const READ_FOLLOW_UP: Duration = Duration::from_millis(1);
/// Sets the follow-up under sustained traffic.
pub const BUSY_READ_FOLLOW_UP: Duration = Duration::from_millis(3);
/// Sets the traffic that counts as sustained: records a second, over at least `BUSY_WINDOW`. A
/// single push's burst (about 15 records within a millisecond) is far below it over the
/// window, the lab's push flood (20,000–30,000 a second) far above.
pub const BUSY_RECORDS_PER_SECOND: f64 = 5_000.0;
/// Sets the shortest window over which traffic counts as sustained.
pub const BUSY_WINDOW: Duration = Duration::from_millis(50);
/// Sets the delay of the first drain after a drain found nothing.
pub const FIRST_QUIET_DRAIN: Duration = Duration::from_millis(10);
/// Bounds the wait between drains while nothing comes.
pub const LONGEST_QUIET_DRAIN: Duration = Duration::from_millis(250);

/// Tracks the records read since `window_start`, whether the last full window was busy, and the
/// next quiet drain's delay.
#[derive(Debug)]
pub struct ReadPacing {
    window_start: Instant,
    window_records: usize,
    busy: bool,
    quiet_drain: Duration,
}

impl ReadPacing {
    /// Starts pacing at `now`, at low load.
    pub fn new(now: Instant) -> Self {
        Self {
            window_start: now,
            window_records: 0,
            busy: false,
            quiet_drain: FIRST_QUIET_DRAIN,
        }
    }

    /// Returns when to drain again after a drain found nothing. Twice as long as the last time, up
    /// to `LONGEST_QUIET_DRAIN`, unless records wait for a gap to fill (`holding`): their release
    /// waits on drains, so those stay at `FIRST_QUIET_DRAIN`.
    pub fn quiet(&mut self, holding: bool) -> Duration {
        if holding {
            return FIRST_QUIET_DRAIN;
        }
        let next = self.quiet_drain;
        self.quiet_drain = (next * 2).min(LONGEST_QUIET_DRAIN);
        next
    }

    /// Returns when to read again after a read at `now` found `records` (at least one). A window
    /// ends at the first read past `BUSY_WINDOW`, so a quiet spell ends in a window with few
    /// records over a long time, which is not busy.
    pub fn follow_up(&mut self, records: usize, now: Instant) -> Duration {
        self.quiet_drain = FIRST_QUIET_DRAIN;
        self.window_records += records;
        let elapsed = now.saturating_duration_since(self.window_start);
        if elapsed >= BUSY_WINDOW {
            self.busy =
                self.window_records as f64 >= BUSY_RECORDS_PER_SECOND * elapsed.as_secs_f64();
            self.window_start = now;
            self.window_records = 0;
        }
        if self.busy {
            BUSY_READ_FOLLOW_UP
        } else {
            READ_FOLLOW_UP
        }
    }
}

/// Bounds how late a read at `BUSY_READ_FOLLOW_UP` may be before a record wakes the reader. Tokio's
/// timer wheel rounds a sleep up to its next millisecond tick, and under the traffic that makes
/// the reader busy its thread often waits for a CPU as well: with a millisecond of slack, as at
/// low load, records woke the reader 0.1 times a push in the lab's push flood (1,816 times in
/// an 8 s run; 29 with two). Each such wakeup is an interrupt raised inside the traffic's own
/// send or receive (`irq_work`, a self-IPI: on a VM, an exit to the hypervisor), for a read at
/// most a millisecond or so earlier than the timer's.
pub const BUSY_READ_SLACK: Duration = Duration::from_millis(2);

/// Returns what the reader writes to `READER_AWAKE` at `now_ns` when it reads again within
/// `follow_up`. The programs wake the reader once the stamp is `2 × READ_FOLLOW_UP` old: a read
/// at the short follow-up a millisecond late (a timer's usual lateness); a longer follow-up is
/// stamped ahead so that it may be `BUSY_READ_SLACK` late.
pub fn awake_stamp(now_ns: u64, follow_up: Duration) -> u64 {
    let ahead = if follow_up > READ_FOLLOW_UP {
        (follow_up + BUSY_READ_SLACK).saturating_sub(2 * READ_FOLLOW_UP)
    } else {
        Duration::ZERO
    };
    now_ns.saturating_add(u64::try_from(ahead.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests;
