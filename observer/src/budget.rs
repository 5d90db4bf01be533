//! Bounds in one memory budget everything the daemon keeps per connection, user, call and alert.
//!
//! Every table and buffer is accounted in estimated bytes against `--memory-budget`: a fixed
//! cost per entry (the `*_BYTES` constants, measured with the benchmark's 100k-user run) plus,
//! for decoders, the bytes their buffers actually hold. Entry caps follow from the budget, and
//! when the total passes it the engine sheds the least useful state first: the buffers of
//! connections that never decoded anything, then those of the connections idle longest, and
//! only then the users placed longest ago. A full table evicts its least recently useful
//! entries instead of refusing new ones. Everything shed is counted (`MemoryCounters`).

/// Sets the default budget: the shipped DaemonSet's 256 MiB limit minus the binary and libraries
/// (~30 MiB), the default 8 MiB ring and allocator slack. docs/install.md#sizing gives the rule.
pub const DEFAULT_MEMORY_BUDGET: usize = 160 << 20;

/// Estimates the bytes of one decoded connection: its table entry, the boxed decoder with both
/// directions' state and HPACK decoders, before any buffered byte.
pub const CONNECTION_BYTES: usize = 1024;
/// Estimates the bytes of one upgraded WebSocket kept only by its id until it closes.
pub const UPGRADED_CONNECTION_BYTES: usize = 48;
/// Estimates the bytes of one user with a live placement: its id, placement (gateway, `Host`,
/// proxy), the index by connection and the hash tables' slack; about 1.3 KB measured.
pub const USER_BYTES: usize = 1300;
/// Estimates the bytes of one push call waiting for its answer, recipients included.
pub const PENDING_CALL_BYTES: usize = 1024;
/// Estimates the bytes of one open fold window: its key and the summary alert it holds.
pub const FOLD_WINDOW_BYTES: usize = 2048;

/// Divides the budget into the shares that bound each table's entries (the rest is buffers and
/// users).
const CONNECTIONS_SHARE: usize = 4;
const PENDING_CALLS_SHARE: usize = 16;
const FOLD_WINDOWS_SHARE: usize = 8;

/// Sets the fraction of its entries a full table evicts at once, so eviction's scan of the table
/// costs O(1) per insert on average.
const EVICTION_BATCH_DIVISOR: usize = 64;

/// Holds the memory budget (`--memory-budget`), in bytes, and the entry caps that follow from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryBudget {
    pub bytes: usize,
}

impl Default for MemoryBudget {
    fn default() -> Self {
        Self {
            bytes: DEFAULT_MEMORY_BUDGET,
        }
    }
}

impl MemoryBudget {
    /// Builds a budget of `bytes`.
    pub fn new(bytes: usize) -> Self {
        Self { bytes }
    }

    /// Counts the connections decoded at once that the budget allows (at least one).
    pub fn max_connections(&self) -> usize {
        (self.bytes / CONNECTIONS_SHARE / CONNECTION_BYTES).max(1)
    }

    /// Counts the push calls waiting for their answer that the budget allows (at least one).
    pub fn max_pending_calls(&self) -> usize {
        (self.bytes / PENDING_CALLS_SHARE / PENDING_CALL_BYTES).max(1)
    }

    /// Counts the open fold windows the budget allows (at least one).
    pub fn max_fold_windows(&self) -> usize {
        (self.bytes / FOLD_WINDOWS_SHARE / FOLD_WINDOW_BYTES).max(1)
    }

    /// Counts the users the budget holds if nothing else used it.
    pub fn max_users(&self) -> usize {
        (self.bytes / USER_BYTES).max(1)
    }
}

/// Counts what the budget holds and what was shed to keep to it; on `/metrics` and in the final
/// report.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryCounters {
    pub budget_bytes: usize,
    /// Estimated bytes held now, by table.
    pub decoder_buffer_bytes: usize,
    pub connection_bytes: usize,
    pub user_bytes: usize,
    pub pending_call_bytes: usize,
    pub fold_window_bytes: usize,
    /// Decoders dropped for memory: of connections that had decoded nothing yet, and of
    /// connections that had (idle longest first).
    pub shed_undecoded_decoders: u64,
    pub shed_decoders: u64,
    /// Users dropped for memory, placed longest ago first.
    pub shed_users: u64,
}

impl MemoryCounters {
    /// Sums the estimated bytes held now, over every table.
    pub fn accounted_bytes(&self) -> usize {
        self.decoder_buffer_bytes
            + self.connection_bytes
            + self.user_bytes
            + self.pending_call_bytes
            + self.fold_window_bytes
    }

    /// Counts everything shed for memory so far.
    pub fn shed(&self) -> u64 {
        self.shed_undecoded_decoders + self.shed_decoders + self.shed_users
    }
}

/// Counts the entries a full table of `capacity` evicts at once.
pub fn eviction_batch(capacity: usize) -> usize {
    (capacity / EVICTION_BATCH_DIVISOR).max(1)
}

/// Returns the keys of the `count` entries of a table with the lowest `rank` (least recently useful
/// first).
pub fn least_useful<'a, K: Clone + 'a, V: 'a, R: Ord + Copy>(
    entries: impl Iterator<Item = (&'a K, &'a V)>,
    count: usize,
    rank: impl Fn(&V) -> R,
) -> Vec<K> {
    if count == 0 {
        return Vec::new();
    }
    let mut ranked: Vec<(R, &K)> = entries.map(|(key, value)| (rank(value), key)).collect();
    let count = count.min(ranked.len());
    if count < ranked.len() {
        ranked.select_nth_unstable_by_key(count - 1, |(rank, _)| *rank);
        ranked.truncate(count);
    }
    ranked.into_iter().map(|(_, key)| key.clone()).collect()
}

/// Reads the peak and current resident memory of this process from /proc/self/status, in bytes;
/// `None` where there is no procfs.
pub fn resident_memory() -> Option<ResidentMemory> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| {
        status.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(':')?;
            let kib: u64 = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
            Some(kib * 1024)
        })
    };
    Some(ResidentMemory {
        peak_bytes: field("VmHWM")?,
        current_bytes: field("VmRSS")?,
    })
}

/// Holds the peak and current resident memory of the process, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ResidentMemory {
    pub peak_bytes: u64,
    pub current_bytes: u64,
}

#[cfg(test)]
mod tests;
