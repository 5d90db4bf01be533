//! Adopts the connections to watched ports that were established before the programs were
//! attached, when starting on a live node: they are found in the kernel's socket tables and each
//! process's descriptors, and handed to the programs as if they had been seen connecting.
//!
//! The kernel programs learn a connection at `connect` (its `struct sock` address, which
//! `/proc` does not show), so an adopted connection is keyed by
//! `observer_records::adopted_connection_id` (from its socket inode) instead. Its descriptors
//! get a `SOCKETS` entry with stream positions counted from the adoption: the bytes before it
//! were never seen, which the decoders know from the id (`is_adopted_connection`).
//!
//! The kernel removes a connection's `CONNECTIONS` entry when it reaches TCP_CLOSE, found by
//! its socket address: an adopted one is removed by `reconcile` instead, once its inode has
//! left the socket tables.

use std::{
    collections::HashMap,
    fs,
    net::{IpAddr, SocketAddr},
    os::unix::fs::MetadataExt,
    path::{Component, Path, PathBuf},
};

use observer_records::{AF_INET, AF_INET6, Budget, Connection, SocketKey, SocketState};

use super::{
    cgroup_scope::ScopeMembership,
    socket_tables::{TableSocket, table_sockets},
};
use crate::model::{Event, PortClass};

/// Records what `KernelCapture::adopt_established` found and did: how many connections of each
/// class it adopted, and the events that announce those watched at once.
#[derive(Debug, Default)]
pub struct Adoption {
    pub events: Vec<Event>,
    pub grpc: usize,
    pub websocket: usize,
    /// Left alone: their process is outside `--cgroup-scope`, or its cgroup could not be
    /// placed under the hierarchy.
    pub outside_scope: usize,
}

/// Describes a connection found established at start, with every descriptor that holds it.
#[derive(Clone, Debug)]
pub struct FoundConnection {
    pub inode: u64,
    /// As the socket table spells it (the connecting process's end first).
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub port_class: PortClass,
    /// `(tgid, fd)` of each descriptor; the first names the owner.
    pub descriptors: Vec<(u32, u32)>,
    pub comm: String,
    pub cgroup_id: u64,
}

impl FoundConnection {
    /// Builds the `CONNECTIONS` value the programs would have made at `connect`.
    pub fn kernel_connection(&self) -> Connection {
        // As the programs record them: an IPv4-mapped address is the IPv4 endpoint it maps.
        let (family, saddr) = address_bytes(self.local.ip().to_canonical());
        let (_, daddr) = address_bytes(self.remote.ip().to_canonical());
        let mut comm = [0u8; 16];
        let name = self.comm.as_bytes();
        let len = name.len().min(comm.len() - 1);
        comm[..len].copy_from_slice(&name[..len]);
        Connection {
            cgroup_id: self.cgroup_id,
            tgid: self.descriptors.first().map_or(0, |(tgid, _)| *tgid),
            sport: self.local.port(),
            dport: self.remote.port(),
            family,
            port_class: kernel_class(self.port_class),
            _reserved: [0; 5],
            saddr,
            daddr,
            comm,
        }
    }

    /// Builds the `SOCKETS` value of each of its descriptors. A WebSocket joined after its upgrade
    /// has nothing left that the capture policy wants (the rest is chat), so none of it is
    /// copied.
    pub fn socket_state(&self, id: u64) -> SocketState {
        let websocket = u8::from(self.port_class == PortClass::WebSocket);
        SocketState {
            sock: id,
            sent: 0,
            received: 0,
            send_budget: Budget::default(),
            receive_budget: Budget::default(),
            conn: self.kernel_connection(),
            port_class: kernel_class(self.port_class),
            ws_sent_done: websocket,
            ws_received_done: websocket,
            _reserved: [0; 5],
        }
    }

    /// Returns the `SOCKETS` key of each of its descriptors.
    pub fn socket_keys(&self) -> impl Iterator<Item = SocketKey> + '_ {
        self.descriptors
            .iter()
            .map(|&(tgid, fd)| SocketKey { tgid, fd })
    }
}

fn kernel_class(class: PortClass) -> u8 {
    match class {
        PortClass::Grpc => observer_records::PortClass::Grpc as u8,
        PortClass::WebSocket => observer_records::PortClass::WebSocket as u8,
    }
}

fn address_bytes(ip: IpAddr) -> (u16, [u8; 16]) {
    let mut bytes = [0u8; 16];
    match ip {
        IpAddr::V4(v4) => {
            bytes[..4].copy_from_slice(&v4.octets());
            (AF_INET, bytes)
        }
        IpAddr::V6(v6) => (AF_INET6, v6.octets()),
    }
}

/// Finds every established connection of this node whose remote port is watched and whose owner
/// `scope` admits (the programs test `--cgroup-scope` as they see a connection being made, and
/// they saw none of these), with the descriptors that hold it; and how many `scope` left out.
/// Sockets no process holds (being torn down) are left out too.
pub fn find_established(
    grpc_ports: &[u16],
    websocket_ports: &[u16],
    scope: &ScopeMembership,
) -> (Vec<FoundConnection>, usize) {
    let class_of = |port: u16| {
        if grpc_ports.contains(&port) {
            Some(PortClass::Grpc)
        } else if websocket_ports.contains(&port) {
            Some(PortClass::WebSocket)
        } else {
            None
        }
    };
    let mut by_inode: HashMap<u64, (TableSocket, PortClass)> = HashMap::new();
    for socket in table_sockets() {
        if !socket.established || socket.inode == 0 {
            continue;
        }
        if let Some(class) = class_of(socket.key.remote.port()) {
            by_inode.insert(socket.inode, (socket, class));
        }
    }
    if by_inode.is_empty() {
        return (Vec::new(), 0);
    }
    let mut descriptors: HashMap<u64, Vec<(u32, u32)>> = HashMap::new();
    for_each_socket_descriptor(Path::new("/proc"), |tgid, fd, inode| {
        if by_inode.contains_key(&inode) {
            descriptors.entry(inode).or_default().push((tgid, fd));
        }
    });
    let namespace_root = namespace_root(scope.hierarchy());
    let mut outside_scope = 0;
    let mut found: Vec<FoundConnection> = descriptors
        .into_iter()
        .filter_map(|(inode, mut held_by)| {
            let (socket, port_class) = by_inode.get(&inode)?;
            held_by.sort_unstable();
            let owner = held_by.first()?.0;
            let process = PathBuf::from(format!("/proc/{owner}"));
            let cgroup = namespace_root.as_deref().and_then(|namespace_root| {
                cgroup_directory(scope.hierarchy(), namespace_root, &process)
            });
            if !scope.admits(cgroup.as_deref()) {
                outside_scope += 1;
                return None;
            }
            Some(FoundConnection {
                inode,
                local: socket.key.local,
                remote: socket.key.remote,
                port_class: *port_class,
                descriptors: held_by,
                comm: fs::read_to_string(process.join("comm"))
                    .map(|comm| comm.trim_end().to_owned())
                    .unwrap_or_default(),
                cgroup_id: cgroup
                    .and_then(|directory| fs::metadata(directory).ok())
                    .map_or(0, |metadata| metadata.ino()),
            })
        })
        .collect();
    found.sort_by_key(|connection| connection.inode);
    (found, outside_scope)
}

/// Calls `visit(tgid, fd, inode)` for every descriptor of every process that is a socket.
fn for_each_socket_descriptor(proc_root: &Path, mut visit: impl FnMut(u32, u32, u64)) {
    let Ok(processes) = fs::read_dir(proc_root) else {
        return;
    };
    for process in processes.flatten() {
        let Some(tgid) = process
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        // A process that exited meanwhile has no fd directory left: skipped.
        let Ok(descriptors) = fs::read_dir(process.path().join("fd")) else {
            continue;
        };
        for descriptor in descriptors.flatten() {
            let Some(fd) = descriptor
                .file_name()
                .to_str()
                .and_then(|name| name.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some(inode) = fs::read_link(descriptor.path())
                .ok()
                .as_deref()
                .and_then(socket_inode)
            {
                visit(tgid, fd, inode);
            }
        }
    }
}

/// Reads a socket link's inode: `socket:[12345]` → 12345.
fn socket_inode(link: &Path) -> Option<u64> {
    link.to_str()?
        .strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// Finds where `/proc/<pid>/cgroup` paths start: the root of this observer's cgroup namespace, as a
/// directory under `hierarchy` (the node's cgroup v2 hierarchy). The host's init lives in the
/// hierarchy's root: /proc spells its cgroup `/` when the observer shares the host's namespace,
/// and the namespace root is the hierarchy's. In a namespace of its own (a pod's, on a cgroup
/// v2 node) /proc spells every cgroup from that namespace's root, climbing out of it with `..`
/// (`/../../..` for init); its root is then found from the directory whose `cgroup.procs`
/// lists this process. `None` where neither works. (Init's namespace itself is not compared:
/// reading another process's `ns/cgroup` needs CAP_SYS_PTRACE.)
fn namespace_root(hierarchy: &Path) -> Option<PathBuf> {
    let init = proc_cgroup_path(Path::new("/proc/1"))?;
    if !init.components().any(|part| part == Component::ParentDir) {
        return Some(hierarchy.to_owned());
    }
    let mut root = listing_cgroup(hierarchy, std::process::id(), MAX_CGROUP_DEPTH)?;
    // This process's own path, from its namespace's root: as many levels above its cgroup.
    for _ in proc_cgroup_path(Path::new("/proc/self"))?
        .components()
        .filter(|part| matches!(part, Component::Normal(_)))
    {
        if !root.pop() || !root.starts_with(hierarchy) {
            return None;
        }
    }
    Some(root)
}

/// Bounds how deep `listing_cgroup` looks: a pod's container is four levels down on a Kubernetes
/// node (`kubepods.slice/kubepods-burstable.slice/…-pod….slice/cri-containerd-….scope`).
const MAX_CGROUP_DEPTH: usize = 8;

/// Finds the directory at or below `directory` whose `cgroup.procs` lists `pid`, at most `depth`
/// levels down. Read once at start, when the observer has its own cgroup namespace.
fn listing_cgroup(directory: &Path, pid: u32, depth: usize) -> Option<PathBuf> {
    let listed = fs::read_to_string(directory.join("cgroup.procs")).unwrap_or_default();
    if listed.lines().any(|line| line.parse() == Ok(pid)) {
        return Some(directory.to_owned());
    }
    if depth == 0 {
        return None;
    }
    fs::read_dir(directory)
        .ok()?
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
        .find_map(|entry| listing_cgroup(&entry.path(), pid, depth - 1))
}

/// Reads a process's cgroup v2 path as /proc spells it (from this observer's cgroup namespace).
fn proc_cgroup_path(process: &Path) -> Option<PathBuf> {
    let text = fs::read_to_string(process.join("cgroup")).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(PathBuf::from)
}

/// Finds a process's cgroup v2 directory under `hierarchy`, whose inode is the id
/// `bpf_get_current_cgroup_id` gives: its /proc path followed from `namespace_root`. `None`
/// for a path that would leave the hierarchy.
fn cgroup_directory(hierarchy: &Path, namespace_root: &Path, process: &Path) -> Option<PathBuf> {
    let mut directory = namespace_root.to_owned();
    for part in proc_cgroup_path(process)?.components() {
        match part {
            Component::ParentDir if directory != hierarchy => {
                directory.pop();
            }
            Component::ParentDir => return None,
            Component::Normal(name) => directory.push(name),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Some(directory)
}

/// Says whether one of `descriptors` (`(tgid, fd)`, as adoption found them) still holds the socket
/// `inode`: an adopted connection none of whose descriptors does is gone.
///
/// A readlink per descriptor rather than a read of every namespace's socket table: on a push
/// node that makes a connection per call, those tables hold tens of thousands of TIME_WAIT
/// sockets, and reading them every reconciliation cost the observer more CPU than all its
/// decoding. A descriptor handed to another process after adoption is not followed: the
/// connection then counts as gone and is no longer watched.
pub fn holds_socket(descriptors: &[(u32, u32)], inode: u64) -> bool {
    descriptors.iter().any(|&(tgid, fd)| {
        fs::read_link(format!("/proc/{tgid}/fd/{fd}"))
            .ok()
            .and_then(|link| socket_inode(&link))
            == Some(inode)
    })
}

#[cfg(test)]
mod tests;
