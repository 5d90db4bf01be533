//! Reads an observer's kernel tables from outside its process, as root: finds its maps by the
//! descriptors it holds (`/proc/PID/fdinfo`) and walks their keys with the bpf syscall.

use std::os::fd::{AsFd, AsRawFd};

use anyhow::Context;
use aya::maps::{MapData, MapInfo};

/// `bpf` command: write one element.
pub const BPF_MAP_UPDATE_ELEM: u32 = 2;
/// `bpf` command: the key after a given one (the first with none).
pub const BPF_MAP_GET_NEXT_KEY: u32 = 4;

/// Opens the maps named in `names` that process `pid` holds, once each, with their info.
///
/// # Errors
///
/// Fails when the process's descriptors cannot be listed or a named map cannot be opened.
pub fn observer_tables(
    pid: u32,
    names: &[&str],
) -> anyhow::Result<Vec<(String, MapData, MapInfo)>> {
    let mut maps: Vec<(String, MapData, MapInfo)> = Vec::new();
    let fdinfo = format!("/proc/{pid}/fdinfo");
    for entry in std::fs::read_dir(&fdinfo)
        .with_context(|| format!("reading {fdinfo}"))?
        .flatten()
    {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let Some(id) = text
            .lines()
            .find_map(|line| line.strip_prefix("map_id:"))
            .and_then(|id| id.trim().parse().ok())
        else {
            continue;
        };
        let Ok(info) = MapInfo::from_id(id) else {
            continue;
        };
        let name = info.name_as_str().unwrap_or_default().to_owned();
        if names.contains(&name.as_str()) && !maps.iter().any(|(known, ..)| *known == name) {
            let map = MapData::from_id(id).with_context(|| format!("map {name}"))?;
            maps.push((name, map, info));
        }
    }
    Ok(maps)
}

/// Returns the keys of `map`, in the kernel's order. A table changing under the walk may
/// restart it, so the walk stops past the table's size.
pub fn keys(map: &MapData, info: &MapInfo) -> Vec<Vec<u8>> {
    let mut keys: Vec<Vec<u8>> = Vec::new();
    while keys.len() <= info.max_entries() as usize {
        let mut next = vec![0u8; info.key_size() as usize];
        let current = keys.last().map_or(std::ptr::null(), |key| key.as_ptr());
        if bpf(map, BPF_MAP_GET_NEXT_KEY, current, next.as_mut_ptr(), 0).is_err() {
            break;
        }
        keys.push(next);
    }
    keys
}

/// Runs one map element command of the bpf syscall.
///
/// # Errors
///
/// Fails with the kernel's error (for [`BPF_MAP_GET_NEXT_KEY`], `ENOENT` after the last key).
pub fn bpf(
    map: &MapData,
    command: u32,
    key: *const u8,
    value: *mut u8,
    flags: u64,
) -> std::io::Result<()> {
    #[repr(C)]
    struct ElemAttr {
        map_fd: u32,
        _pad: u32,
        key: u64,
        value: u64,
        flags: u64,
    }
    let attr = ElemAttr {
        map_fd: map.fd().as_fd().as_raw_fd() as u32,
        _pad: 0,
        key: key as u64,
        value: value as u64,
        flags,
    };
    // SAFETY: the attribute names buffers of the map's key and value sizes, alive for the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            &attr as *const ElemAttr,
            std::mem::size_of::<ElemAttr>(),
        )
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
