//! Folds repeats of one alert: the first of a key is emitted at once, its repeats within the
//! window are counted and emitted as one alert with the count when the window ends. Generic
//! over what makes two alerts "the same"; every table is bounded.

use std::{
    collections::VecDeque,
    hash::{BuildHasher, Hash},
    sync::Arc,
};

use hashbrown::{DefaultHashBuilder, Equivalent, HashTable};

use super::{Alert, AlertBody};
use crate::{
    model::{NANOS_PER_SEC, prefetch_bucket},
    table_memory::HugePageTables,
};

/// Counts how many windows ahead of the one closing its bucket is prefetched.
const CLOSE_PREFETCH_AHEAD: usize = 4;

#[derive(Debug)]
struct Fold<K> {
    key: K,
    window_start_ns: u64,
    /// The latest repeat, the summary's time.
    last_ns: u64,
    count: u64,
    /// The body of the window's first alert, shared with it; repeats only update the count and
    /// time beside it and its merged lists, so a repeat costs a lookup, not a new alert text.
    /// Only the body: the envelope's time is `window_start_ns` and its node is named when
    /// alerts leave the engine, so a bucket holds 40 bytes fewer (152 → 112 for a mismatch's).
    summary: Arc<AlertBody>,
}

/// Holds the open windows, at most `max_keys`: a key that finds the table full is emitted unfolded,
/// and counted in `keys_evicted`.
#[derive(Debug)]
pub struct FoldWindows<K> {
    window_secs: u64,
    max_keys: usize,
    /// By key, hashed by `hasher`. A table rather than a map so that a key's bucket can be
    /// found, and prefetched, before it is read (`prefetch`); on huge pages once it is large.
    folds: HashTable<Fold<K>, HugePageTables>,
    hasher: DefaultHashBuilder,
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
    /// Builds an empty set of windows of `window_secs` each, at most `max_keys` open at once.
    pub fn new(window_secs: u64, max_keys: usize) -> Self {
        Self {
            window_secs,
            max_keys,
            folds: HashTable::new_in(HugePageTables),
            hasher: DefaultHashBuilder::default(),
            opened: VecDeque::new(),
            keys_evicted: 0,
        }
    }

    /// Returns the length of one window, in seconds.
    pub fn window_secs(&self) -> u64 {
        self.window_secs
    }

    /// Counts the keys emitted unfolded because the table was full.
    pub fn keys_evicted(&self) -> u64 {
        self.keys_evicted
    }

    /// Counts the windows open now.
    pub fn open_windows(&self) -> usize {
        self.folds.len()
    }

    fn find_mut<Q: Hash + Equivalent<K> + ?Sized>(&mut self, key: &Q) -> Option<&mut Fold<K>> {
        self.folds
            .find_mut(self.hasher.hash_one(key), |fold| key.equivalent(&fold.key))
    }

    fn remove<Q: Hash + Equivalent<K> + ?Sized>(&mut self, key: &Q) -> Option<Fold<K>> {
        let entry = self
            .folds
            .find_entry(self.hasher.hash_one(key), |fold| key.equivalent(&fold.key))
            .ok()?;
        Some(entry.remove().0)
    }

    /// Starts loading the bucket `repeat(key)` will read.
    pub fn prefetch<Q: Hash + ?Sized>(&self, key: &Q) {
        prefetch_bucket(&self.folds, self.hasher.hash_one(key));
    }

    /// Counts a repeat of `key` inside its open window; false when `key` has no open window,
    /// and the caller emits a first alert with `first`. A repeat whose details belong in the
    /// summary adds them through `summary_mut`.
    pub fn repeat<Q: Hash + Equivalent<K> + ?Sized>(&mut self, key: &Q, ts_ns: u64) -> bool {
        let window = self.window_secs * NANOS_PER_SEC;
        let Some(fold) = self.find_mut(key) else {
            return false;
        };
        if ts_ns.saturating_sub(fold.window_start_ns) >= window {
            return false;
        }
        fold.count += 1;
        fold.last_ns = ts_ns;
        true
    }

    /// Returns the summary `key`'s window will emit, for details learnt after its first alert.
    pub fn summary_mut<Q: Hash + Equivalent<K> + ?Sized>(
        &mut self,
        key: &Q,
    ) -> Option<&mut AlertBody> {
        self.find_mut(key)
            .map(|fold| Arc::make_mut(&mut fold.summary))
    }

    /// Emits the first alert of a window for `key` and opens the window. Windows that ended
    /// by then are closed first, this key's earlier one among them.
    pub fn first(&mut self, key: K, alert: Alert, alerts: &mut Vec<Alert>) {
        let window_start_ns = alert.ts_ns;
        self.close(window_start_ns, false, alerts);
        if let Some(expired) = self.remove(&key) {
            // Only when alerts come out of time order (a cluster join judges an older call).
            emit_summary(expired, alerts);
        }
        let summary = Arc::clone(&alert.body);
        alerts.push(alert);
        if self.folds.len() >= self.max_keys {
            // Unfolded: repeats of this key will each be emitted.
            self.keys_evicted += 1;
            return;
        }
        self.opened.push_back((window_start_ns, key.clone()));
        let hasher = &self.hasher;
        self.folds.insert_unique(
            hasher.hash_one(&key),
            Fold {
                key,
                window_start_ns,
                last_ns: window_start_ns,
                count: 1,
                summary,
            },
            |fold| hasher.hash_one(&fold.key),
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
            // Windows end in bursts (those a push call's recipients opened together), and each
            // closing reads a bucket untouched for a minute: the ones a few ahead load meanwhile.
            if let Some((_, ahead)) = self.opened.get(CLOSE_PREFETCH_AHEAD) {
                self.prefetch(ahead);
            }
            let Some((start_ns, key)) = self.opened.pop_front() else {
                break;
            };
            if let Ok(entry) = self.folds.find_entry(self.hasher.hash_one(&key), |fold| {
                fold.key == key && fold.window_start_ns == start_ns
            }) {
                emit_summary(entry.remove().0, alerts);
            }
        }
    }
}

/// Emits a window's repeats as one alert with their count and the time of the last one; a key seen
/// once was already emitted.
fn emit_summary<K>(fold: Fold<K>, alerts: &mut Vec<Alert>) {
    if fold.count < 2 {
        return;
    }
    let mut summary = Alert::shared(fold.last_ns, fold.summary);
    if let Some(count) = summary.body_mut().fold_count_mut() {
        *count = fold.count;
    }
    alerts.push(summary);
}

#[cfg(test)]
mod tests;
