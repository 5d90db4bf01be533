//! Defines the copy walk's per-CPU state ([`CopyState`]): the `COPY` map's value, declared in
//! `maps` with the others and walked by `copy`.

/// Counts the iovec entries read from user memory at once: one helper call per batch rather than
/// one per entry (a helper call costs as much as a small entry's copy).
pub const IOVEC_BATCH: u64 = 16;

/// Holds the walk's position, and the batch of iovec entries it is going through.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CopyState {
    pub walk: Walk,
    /// Entries `batch_start..batch_start + IOVEC_BATCH` of the call's array (those that exist).
    pub batch: [Iovec; IOVEC_BATCH as usize],
}

/// Records where the walk is: the call's buffers, the current user buffer and bytes left in it,
/// bytes left to capture, the next iovec entry, the stream offset and fill of the record being
/// filled.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Walk {
    pub buffers: u64,
    pub iovec_count: u64,
    pub next_iovec: u64,
    pub base: u64,
    pub left: u64,
    pub remaining: u64,
    pub offset: u64,
    pub fill: u64,
    pub flags: u64,
    /// Index of `CopyState::batch`'s first entry in the call's array.
    pub batch_start: u64,
}

impl Walk {
    /// Reads the walk from map memory, where the verifier does not track it.
    pub fn load(&self) -> Self {
        // SAFETY: `self` is a valid, aligned map value. Volatile: see `copy`'s module comment.
        unsafe { core::ptr::read_volatile(self) }
    }

    /// Writes the walk back to map memory.
    pub fn store(&mut self, value: Self) {
        // SAFETY: as in `load`.
        unsafe { core::ptr::write_volatile(self, value) }
    }
}

/// Mirrors one `struct iovec` of the call's array, as user memory holds it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Iovec {
    pub base: u64,
    pub len: u64,
}
