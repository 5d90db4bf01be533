//! Maps `READER_AWAKE`'s one slot into the observer (the map is `BPF_F_MMAPABLE`): the reader
//! stamps it at every read of the ring while records keep coming, up to a thousand times a
//! second, and a bpf() syscall for each stamp was 5% of the daemon's CPU under the lab's push
//! flood. A stamp is now one store into memory the programs read.

use std::{
    io,
    os::fd::{AsFd, AsRawFd},
    ptr::NonNull,
    sync::atomic::{AtomicU64, Ordering},
};

use aya::maps::MapData;

/// Holds `READER_AWAKE`'s slot, mapped into this process.
pub(super) struct ReaderAwake {
    slot: NonNull<AtomicU64>,
    mapped_bytes: usize,
    /// Held, not used: the programs are loaded after this is made, and their instructions
    /// name the map by this descriptor.
    _map: MapData,
}

impl ReaderAwake {
    /// Maps the first page of `map`, an array of `u64` created with `BPF_F_MMAPABLE`.
    ///
    /// # Errors
    ///
    /// Fails with the system call's error when `mmap` fails, or when it returns a null address.
    pub(super) fn map(map: MapData, page_size: usize) -> io::Result<Self> {
        // SAFETY: a new shared mapping chosen by the kernel, of the map's value area, which
        // starts at offset 0 and spans at least one page; nothing else in this process aliases
        // it.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page_size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if address == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let slot = NonNull::new(address.cast::<AtomicU64>())
            .ok_or_else(|| io::Error::other("mmap returned a null address"))?;
        Ok(Self {
            slot,
            mapped_bytes: page_size,
            _map: map,
        })
    }

    /// Writes the slot. The programs read it without synchronisation; a stale read only costs
    /// a wakeup too many or a timer's delay.
    pub(super) fn stamp(&self, value: u64) {
        // SAFETY: mapped until `drop`, page-aligned (so aligned for an `AtomicU64`), and only
        // accessed atomically from this side.
        unsafe { self.slot.as_ref() }.store(value, Ordering::Relaxed);
    }
}

impl Drop for ReaderAwake {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `map` made; `slot` is not used after this.
        unsafe { libc::munmap(self.slot.as_ptr().cast(), self.mapped_bytes) };
    }
}

#[cfg(test)]
mod tests;
