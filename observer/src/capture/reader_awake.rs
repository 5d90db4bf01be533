//! `READER_AWAKE`'s one slot, mapped into the observer (the map is `BPF_F_MMAPABLE`): the reader
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

pub(super) struct ReaderAwake {
    slot: NonNull<AtomicU64>,
    mapped_bytes: usize,
    /// Held, not used: the programs are loaded after this is made, and their instructions
    /// name the map by this descriptor.
    _map: MapData,
}

impl ReaderAwake {
    /// Maps the first page of `map`, an array of `u64` created with `BPF_F_MMAPABLE`.
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
mod tests {
    use std::os::fd::{FromRawFd, OwnedFd};

    use aya::maps::{Array, Map};

    use super::*;

    /// A stamp through the mapping is what a map lookup (as the programs make) reads. Creates
    /// an mmapable array through bpf(2), so it needs root (CAP_BPF); skipped without.
    #[test]
    fn a_stamp_is_what_the_map_holds() {
        // SAFETY: geteuid(2) has no failure mode.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        const BPF_MAP_CREATE: libc::c_long = 0;
        const BPF_MAP_TYPE_ARRAY: u32 = 2;
        const BPF_F_MMAPABLE: u32 = 1 << 10;
        // bpf_attr's map-create head: type, key size, value size, entries, flags; the kernel
        // requires the rest to be zero.
        let mut attr = [0u32; 32];
        attr[..5].copy_from_slice(&[BPF_MAP_TYPE_ARRAY, 4, 8, 1, BPF_F_MMAPABLE]);
        // SAFETY: `attr` is a zeroed bpf_attr of the size passed.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_CREATE,
                attr.as_ptr(),
                std::mem::size_of_val(&attr),
            )
        };
        assert!(fd >= 0, "BPF_MAP_CREATE: {}", io::Error::last_os_error());
        // SAFETY: bpf(2) just returned this descriptor, owned by nobody else.
        let owned = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let map = MapData::from_fd(owned).unwrap();
        // A second handle on the same map, to read it as the programs do.
        let reader = MapData::from_id(map.info().unwrap().id()).unwrap();
        let page_size = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap();
        let reader_awake = ReaderAwake::map(map, page_size).unwrap();
        let array: Array<MapData, u64> = Array::try_from(Map::Array(reader)).unwrap();
        assert_eq!(array.get(&0, 0).unwrap(), 0);
        reader_awake.stamp(1_234_567_890);
        assert_eq!(array.get(&0, 0).unwrap(), 1_234_567_890);
        reader_awake.stamp(0);
        assert_eq!(array.get(&0, 0).unwrap(), 0);
    }
}
