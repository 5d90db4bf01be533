//! Reads the kernel's TCP socket tables of every network namespace on this node.
//!
//! Pods live in their own network namespaces, and `/proc/<pid>/net/tcp` shows the namespace of
//! `<pid>`: one process per namespace is read (deduplicated by the inode of
//! `/proc/<pid>/ns/net`), both `tcp` and `tcp6`. A process gone meanwhile is skipped. Used to
//! adopt connections at start (`adopt`), to reconcile adopted ones, and by cluster mode's
//! restart recovery.

use std::{
    collections::HashSet,
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::unix::fs::MetadataExt,
    path::Path,
};

use crate::model::ConnectionKey;

/// Names the `st` of an established socket in `/proc/net/tcp`.
const ESTABLISHED: &str = "01";

/// Holds one row of a `/proc/net/tcp` or `tcp6` table whose socket a descriptor holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TableSocket {
    /// As the table spells it: an IPv4 connection of a dual-stack socket is IPv4-mapped.
    pub key: ConnectionKey,
    pub established: bool,
    /// The socket's inode (`socket:[inode]` in `/proc/<pid>/fd`).
    pub inode: u64,
}

/// Lists every TCP socket a descriptor holds in every network namespace of this node, each once.
pub fn table_sockets() -> Vec<TableSocket> {
    table_sockets_under(Path::new("/proc"))
}

fn table_sockets_under(proc_root: &Path) -> Vec<TableSocket> {
    let mut namespaces = HashSet::new();
    let mut sockets = HashSet::new();
    let Ok(entries) = fs::read_dir(proc_root) else {
        return Vec::new();
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name
            .to_string_lossy()
            .bytes()
            .all(|byte| byte.is_ascii_digit())
        {
            continue;
        }
        let process = entry.path();
        // Without CAP_SYS_PTRACE another process's namespace link cannot be read (the
        // least-privilege pod): its tables are read anyway, which costs time, and the set
        // keeps each socket once, or every process would add its namespace's sockets again.
        if let Ok(namespace) = fs::metadata(process.join("ns/net"))
            && !namespaces.insert((namespace.dev(), namespace.ino()))
        {
            continue;
        }
        for table in ["net/tcp", "net/tcp6"] {
            if let Ok(text) = fs::read_to_string(process.join(table)) {
                sockets.extend(parse_table(&text));
            }
        }
    }
    sockets.into_iter().collect()
}

/// Parses the sockets of one `/proc/net/tcp` or `tcp6` table.
fn parse_table(text: &str) -> impl Iterator<Item = TableSocket> + '_ {
    text.lines().skip(1).filter_map(|line| {
        let mut fields = line.split_whitespace();
        let _slot = fields.next()?;
        let local = parse_address(fields.next()?)?;
        let remote = parse_address(fields.next()?)?;
        let established = fields.next()? == ESTABLISHED;
        // tx_queue:rx_queue, tr:tm->when, retrnsmt, uid, timeout, then the inode.
        let inode = fields
            .nth(5)
            .and_then(|inode| inode.parse().ok())
            .unwrap_or(0);
        // No descriptor holds it (TIME_WAIT, an orphan): no caller wants it, and a node can
        // hold tens of thousands.
        if inode == 0 {
            return None;
        }
        Some(TableSocket {
            key: ConnectionKey { local, remote },
            established,
            inode,
        })
    })
}

/// Parses `0100007F:0050` (IPv4) or 32 hex digits (IPv6): the address as the kernel's 32-bit words
/// in host byte order, the port in plain hex.
fn parse_address(text: &str) -> Option<SocketAddr> {
    let (address, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |index: usize| -> Option<[u8; 4]> {
        let hex = address.get(index * 8..index * 8 + 8)?;
        Some(u32::from_str_radix(hex, 16).ok()?.to_ne_bytes())
    };
    let ip = match address.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for index in 0..4 {
                bytes[index * 4..index * 4 + 4].copy_from_slice(&word(index)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests;
