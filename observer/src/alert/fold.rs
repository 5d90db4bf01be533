//! Folding repeats of one alert: the first of a key is emitted at once, its repeats within the
//! window are counted and emitted as one alert with the count when the window ends. Generic
//! over what makes two alerts "the same"; every table is bounded.

use std::{collections::VecDeque, hash::Hash};

use hashbrown::{Equivalent, HashMap};

use super::{Alert, AlertBody};
use crate::model::NANOS_PER_SEC;

#[derive(Debug)]
struct Fold {
    window_start_ns: u64,
    /// The latest repeat, the summary's time.
    last_ns: u64,
    count: u64,
    /// The window's first alert; repeats only update the count and time beside it and its
    /// merged lists, so a repeat costs a lookup, not a new alert text. Held in the bucket (an
    /// envelope around its shared body): boxed, it cost an allocation per window and one more
    /// cold read when the window ends.
    summary: Alert,
}

/// The open windows, at most `max_keys`: a key that finds the table full is emitted unfolded,
/// and counted in `keys_evicted`.
#[derive(Debug)]
pub struct FoldWindows<K> {
    window_secs: u64,
    max_keys: usize,
    folds: HashMap<K, Fold>,
    /// Each window's key and start in the order the windows opened, which is the order they
    /// end: closing them pops from the front instead of walking the whole table (a walk a
    /// second over 300,000 open windows was 5% of the engine's instructions). An entry whose key
    /// has been closed and opened again since is skipped: the table holds another start. At
    /// most one entry per open window and per window closed early by its key's next alert,
    /// which `first` pops with everything before it.
    opened: VecDeque<(u64, K)>,
    keys_evicted: u64,
}

impl<K: Clone + Eq + Hash> FoldWindows<K> {
    pub fn new(window_secs: u64, max_keys: usize) -> Self {
        Self {
            window_secs,
            max_keys,
            folds: HashMap::new(),
            opened: VecDeque::new(),
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

    /// Emits the first alert of a window for `key` and opens the window. Windows that ended
    /// by then are closed first, this key's earlier one among them.
    pub fn first(&mut self, key: K, alert: Alert, alerts: &mut Vec<Alert>) {
        let window_start_ns = alert.ts_ns;
        self.close(window_start_ns, false, alerts);
        if let Some(expired) = self.folds.remove(&key) {
            // Only when alerts come out of time order (a cluster join judges an older call).
            emit_summary(expired, alerts);
        }
        alerts.push(alert.clone());
        if self.folds.len() >= self.max_keys {
            // Unfolded: repeats of this key will each be emitted.
            self.keys_evicted += 1;
            return;
        }
        self.opened.push_back((window_start_ns, key.clone()));
        self.folds.insert(
            key,
            Fold {
                window_start_ns,
                last_ns: window_start_ns,
                count: 1,
                summary: alert,
            },
        );
    }

    /// Emits the summaries of the windows that ended by `now_ns`, or of all of them, in the
    /// order they opened (so a replay prints the same lines in the same order every time).
    pub fn close(&mut self, now_ns: u64, all: bool, alerts: &mut Vec<Alert>) {
        let window = self.window_secs * NANOS_PER_SEC;
        while let Some((start_ns, _)) = self.opened.front() {
            if !all && now_ns.saturating_sub(*start_ns) < window {
                break;
            }
            let Some((start_ns, key)) = self.opened.pop_front() else {
                break;
            };
            let still_open = self
                .folds
                .get(&key)
                .is_some_and(|fold| fold.window_start_ns == start_ns);
            if still_open && let Some(fold) = self.folds.remove(&key) {
                emit_summary(fold, alerts);
            }
        }
    }
}

/// A window's repeats, as one alert with their count and the time of the last one; a key seen
/// once was already emitted.
fn emit_summary(fold: Fold, alerts: &mut Vec<Alert>) {
    if fold.count < 2 {
        return;
    }
    let mut summary = fold.summary;
    summary.ts_ns = fold.last_ns;
    if let Some(count) = summary.body_mut().fold_count_mut() {
        *count = fold.count;
    }
    alerts.push(summary);
}
