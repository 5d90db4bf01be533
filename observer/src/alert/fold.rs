//! Folding repeats of one alert: the first of a key is emitted at once, its repeats within the
//! window are counted and emitted as one alert with the count when the window ends. Generic
//! over what makes two alerts "the same"; every table is bounded.

use std::hash::Hash;

use hashbrown::{Equivalent, HashMap};

use super::{Alert, AlertBody, rfc3339};
use crate::model::NANOS_PER_SEC;

#[derive(Debug)]
struct Fold {
    window_start_ns: u64,
    /// The latest repeat, the summary's time.
    last_ns: u64,
    count: u64,
    /// The window's first alert; repeats only update the count and time beside it and its
    /// merged lists, so a repeat costs a lookup, not a new alert text. Boxed, so that the
    /// table's buckets stay small: a repeat or a sweep reads the bucket, not the alert.
    summary: Box<Alert>,
}

/// The open windows, at most `max_keys`: a key that finds the table full is emitted unfolded,
/// and counted in `keys_evicted`.
#[derive(Debug)]
pub struct FoldWindows<K> {
    window_secs: u64,
    max_keys: usize,
    folds: HashMap<K, Fold>,
    /// When `folds` was last swept for closed windows.
    swept_ns: u64,
    keys_evicted: u64,
}

impl<K: Clone + Eq + Hash + Ord> FoldWindows<K> {
    pub fn new(window_secs: u64, max_keys: usize) -> Self {
        Self {
            window_secs,
            max_keys,
            folds: HashMap::new(),
            swept_ns: 0,
            keys_evicted: 0,
        }
    }

    pub fn window_secs(&self) -> u64 {
        self.window_secs
    }

    pub fn keys_evicted(&self) -> u64 {
        self.keys_evicted
    }

    pub fn open_windows(&self) -> usize {
        self.folds.len()
    }

    /// Counts a repeat of `key` inside its open window; false when `key` has no open window,
    /// and the caller emits a first alert with `first`. A repeat whose details belong in the
    /// summary adds them through `summary_mut`.
    pub fn repeat<Q: Hash + Equivalent<K> + ?Sized>(&mut self, key: &Q, ts_ns: u64) -> bool {
        let Some(fold) = self.folds.get_mut(key) else {
            return false;
        };
        if ts_ns.saturating_sub(fold.window_start_ns) >= self.window_secs * NANOS_PER_SEC {
            return false;
        }
        fold.count += 1;
        fold.last_ns = ts_ns;
        true
    }

    /// The summary `key`'s window will emit, for details learnt after its first alert.
    pub fn summary_mut<Q: Hash + Equivalent<K> + ?Sized>(
        &mut self,
        key: &Q,
    ) -> Option<&mut AlertBody> {
        self.folds.get_mut(key).map(|fold| fold.summary.body_mut())
    }

    /// Emits the first alert of a window for `key` and opens the window.
    pub fn first(&mut self, key: K, alert: Alert, alerts: &mut Vec<Alert>) {
        if let Some(expired) = self.folds.remove(&key) {
            emit_summary(expired, alerts);
        }
        let window_start_ns = alert.ts_ns;
        alerts.push(alert.clone());
        // A sweep walks the whole table: when it is full of windows still open, sweeping again
        // for every new key made each alert cost O(table) (hundreds of µs at 262,144 keys).
        // Windows expire by the second, so one sweep a second finds all there is to find.
        if self.folds.len() >= self.max_keys
            && window_start_ns.saturating_sub(self.swept_ns) >= NANOS_PER_SEC
        {
            self.close(window_start_ns, false, alerts);
        }
        if self.folds.len() >= self.max_keys {
            // Unfolded: repeats of this key will each be emitted.
            self.keys_evicted += 1;
            return;
        }
        self.folds.insert(
            key,
            Fold {
                window_start_ns,
                last_ns: window_start_ns,
                count: 1,
                summary: Box::new(alert),
            },
        );
    }

    /// Emits the summaries of the windows that ended by `now_ns`, or of all of them.
    pub fn close(&mut self, now_ns: u64, all: bool, alerts: &mut Vec<Alert>) {
        self.swept_ns = now_ns;
        let window = self.window_secs * NANOS_PER_SEC;
        let expired: Vec<K> = self
            .folds
            .iter()
            .filter(|(_, fold)| all || now_ns.saturating_sub(fold.window_start_ns) >= window)
            .map(|(key, _)| key.clone())
            .collect();
        let mut closed: Vec<(K, Fold)> = expired
            .into_iter()
            .filter_map(|key| self.folds.remove_entry(&key))
            .collect();
        // Ordered by key among windows opened at once: a replay prints the same lines in the
        // same order every time, whatever the hash map's order.
        closed.sort_by(|(left_key, left), (right_key, right)| {
            (left.window_start_ns, left_key).cmp(&(right.window_start_ns, right_key))
        });
        for (_, fold) in closed {
            emit_summary(fold, alerts);
        }
    }
}

/// A window's repeats, as one alert with their count and the time of the last one; a key seen
/// once was already emitted.
fn emit_summary(fold: Fold, alerts: &mut Vec<Alert>) {
    if fold.count < 2 {
        return;
    }
    let mut summary = *fold.summary;
    summary.ts_ns = fold.last_ns;
    summary.ts = rfc3339(summary.ts_ns);
    if let Some(count) = summary.body_mut().fold_count_mut() {
        *count = fold.count;
    }
    alerts.push(summary);
}
