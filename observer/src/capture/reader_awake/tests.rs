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
