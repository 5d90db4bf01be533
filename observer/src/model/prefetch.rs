//! Asks the CPU for a table bucket before it is read. Judging a push call looks each
//! recipient up in two tables of up to 100,000 users, and each lookup's bucket is a cache miss:
//! found in order, every miss waits for the one before. Prefetched a few recipients ahead, the
//! misses overlap.

use allocator_api2::alloc::Allocator;
use hashbrown::HashTable;

/// Starts loading the bucket a lookup of `hash` in `table` will read (`likely_bucket`).
pub fn prefetch_bucket<T, A: Allocator>(table: &HashTable<T, A>, hash: u64) {
    if let Some(bucket) = likely_bucket(table, hash) {
        prefetch(bucket);
    }
}

/// Returns the bucket a lookup of `hash` in `table` most likely reads: the first whose control byte
/// matches `hash`, found without reading any bucket (the test accepts every entry). Nearly
/// always the key's own; a wrong guess costs one useless prefetch.
pub fn likely_bucket<T, A: Allocator>(table: &HashTable<T, A>, hash: u64) -> Option<&T> {
    let index = table.find_bucket_index(hash, |_| true)?;
    table.get_bucket(index)
}

/// Starts loading the cache lines that hold `value` (a table bucket spans two to four), without
/// waiting for them and without reading it.
#[cfg(target_arch = "x86_64")]
pub fn prefetch<T>(value: &T) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    const CACHE_LINE: usize = 64;
    let start = std::ptr::from_ref(value).cast::<i8>();
    let size = size_of::<T>();
    // One address in every line: each line's offset from `start`, and the last byte for the
    // line a bucket that starts mid-line ends in. A constant count, unrolled.
    let mut offset = 0;
    while offset < size {
        // SAFETY: a prefetch is a hint that never faults and reads nothing into the program;
        // SSE is part of x86_64's baseline. The address lies within `value`.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(offset)) };
        offset += CACHE_LINE;
    }
    // SAFETY: as above.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(size.saturating_sub(1))) };
}

/// Does nothing elsewhere: the lookup then simply waits for its miss, as it did before.
#[cfg(not(target_arch = "x86_64"))]
pub fn prefetch<T>(_value: &T) {}
