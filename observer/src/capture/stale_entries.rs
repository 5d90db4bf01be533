//! Finds the programs' connection entries whose socket is gone: the backstop for ends the programs
//! never handled.
//!
//! The programs remove a connection's `CONNECTIONS` or `PACKET_STREAMS` entry at its socket's
//! TCP_CLOSE. When the kernel skips that run (a tracepoint firing inside another run of the
//! state program on the same CPU, as an interrupt's state change does; counted as
//! `program_runs_skipped`), the entry stays until a later socket reuses the address, and
//! userspace, which takes the tables' keys for the connections alive, kept tracking the
//! connection: after a burst of 6,219 connections with drops, 3 were still tracked 90 s after
//! every socket had closed. Every `SWEEP_EVERY` reconciliations the entries are matched by
//! their 4-tuple against the sockets that processes hold in every network namespace of the
//! node (`socket_tables`); an entry without one at two sweeps in a row is removed, and counted.
//!
//! Not every reconciliation: on a push node, which makes a connection per call, the tables
//! hold tens of thousands of TIME_WAIT sockets (`adopt::holds_socket`). Two sweeps, so that a
//! connection made between the read of the entries and that of the tables is never taken for
//! gone, and a socket no process holds yet (or any more, closing) is given time to end. Only
//! where the observer sees every process (the initial PID namespace, the DaemonSet's
//! `hostPID`): elsewhere the tables it reads miss other pods' sockets, and it never sweeps.

use std::{
    collections::HashSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
};

use observer_records::{AF_INET, Connection};

use super::socket_tables::TableSocket;

/// Counts the reconciliations (every 5 s) from one sweep to the next: an entry left behind is
/// removed 10 to 20 s after its socket is gone.
pub const SWEEP_EVERY: u32 = 2;

/// Holds a connection entry's endpoints as the programs recorded them: the connecting side first,
/// IPv4 as IPv4; the source port is 0 until the connection's first packet (packet hook) or
/// ESTABLISHED (syscall hook).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EntryTuple {
    pub local: IpAddr,
    pub sport: u16,
    pub remote: SocketAddr,
}

impl EntryTuple {
    /// Reads the endpoints of a `CONNECTIONS` value (or a `PACKET_STREAMS` value's `conn`).
    pub fn of(conn: &Connection) -> Self {
        let ip = |bytes: [u8; 16]| -> IpAddr {
            if conn.family == AF_INET {
                IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))
            } else {
                IpAddr::V6(Ipv6Addr::from(bytes)).to_canonical()
            }
        };
        Self {
            local: ip(conn.saddr),
            sport: conn.sport,
            remote: SocketAddr::new(ip(conn.daddr), conn.dport),
        }
    }
}

/// Names the inode of the initial PID namespace (`PROC_PID_INIT_INO`), the same on every kernel.
const INITIAL_PID_NAMESPACE: &str = "pid:[4026531836]";

/// Says whether this process sees every process of the node (it runs in the initial PID namespace,
/// as the DaemonSet's `hostPID` puts it): only then do the socket tables it reads hold every
/// socket, and an entry without one is really gone.
pub fn sees_every_process() -> bool {
    std::fs::read_link("/proc/self/ns/pid")
        .is_ok_and(|link| link.as_os_str() == INITIAL_PID_NAMESPACE)
}

/// Holds the sweeps' state: when the next is due, and what the last found without a socket.
#[derive(Debug, Default)]
pub struct StaleEntries {
    /// False where the node's sockets cannot all be read (`sees_every_process`): no sweep.
    enabled: bool,
    rounds: u32,
    /// Entries (key and endpoints) the last sweep found no socket for.
    suspects: HashSet<(u64, EntryTuple)>,
    /// Entries removed since start.
    pub removed: u64,
}

impl StaleEntries {
    /// Builds the sweeps' state; `enabled` is false where the node's sockets cannot all be read.
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled,
            ..Self::default()
        }
    }

    /// Counts one reconciliation; true when it sweeps.
    pub fn due(&mut self) -> bool {
        self.rounds = self.rounds.wrapping_add(1);
        self.enabled && self.rounds.is_multiple_of(SWEEP_EVERY)
    }

    /// Returns those of `entries` no socket of `sockets` matches, now and at the last sweep: to be
    /// removed (each counted in `removed` by the caller once it is). Tables without a single
    /// held socket are taken for unreadable rather than empty: nothing is removed then.
    pub fn sweep(
        &mut self,
        entries: impl IntoIterator<Item = (u64, EntryTuple)>,
        sockets: &[TableSocket],
    ) -> Vec<(u64, EntryTuple)> {
        let held = HeldSockets::new(sockets);
        if held.is_empty() {
            return Vec::new();
        }
        let missing: HashSet<(u64, EntryTuple)> = entries
            .into_iter()
            .filter(|(_, tuple)| !held.matches(tuple))
            .collect();
        let gone = missing.intersection(&self.suspects).copied().collect();
        self.suspects = missing;
        gone
    }
}

/// Indexes the sockets a process holds (TIME_WAIT rows and orphans, inode 0, are left out: their
/// socket has reached TCP_CLOSE or will without anyone reading it), by endpoints.
struct HeldSockets {
    exact: HashSet<(IpAddr, u16, SocketAddr)>,
    /// Without the source port, for entries recorded before it was chosen.
    by_remote: HashSet<(IpAddr, SocketAddr)>,
}

impl HeldSockets {
    fn new(sockets: &[TableSocket]) -> Self {
        let mut exact = HashSet::new();
        let mut by_remote = HashSet::new();
        for socket in sockets.iter().filter(|socket| socket.inode != 0) {
            let local = socket.key.local.ip().to_canonical();
            let remote = SocketAddr::new(
                socket.key.remote.ip().to_canonical(),
                socket.key.remote.port(),
            );
            exact.insert((local, socket.key.local.port(), remote));
            by_remote.insert((local, remote));
        }
        Self { exact, by_remote }
    }

    fn is_empty(&self) -> bool {
        self.exact.is_empty()
    }

    fn matches(&self, tuple: &EntryTuple) -> bool {
        if tuple.sport == 0 {
            return self.by_remote.contains(&(tuple.local, tuple.remote));
        }
        self.exact
            .contains(&(tuple.local, tuple.sport, tuple.remote))
    }
}

#[cfg(test)]
mod tests;
