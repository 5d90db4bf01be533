//! Defines the typed capture events: one per kernel record, with the connection's 4-tuple and
//! process.

use std::{
    fmt,
    net::{IpAddr, SocketAddr},
    str::FromStr,
};

use bytes::Bytes;
use compact_str::CompactString;

/// Names a connection by the kernel socket address: identifies a connection while it lives (the
/// kernel may reuse the address after the connection's `TcpState` to `Close`).
pub type ConnectionId = u64;

/// Says which side moved the bytes, seen from the process that connected to the gateway port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// The connecting process wrote (proxy's upgrade request, push's gRPC request).
    Send,
    /// The connecting process read (the gateway's answer).
    Recv,
}

impl From<observer_records::Direction> for Direction {
    fn from(direction: observer_records::Direction) -> Self {
        match direction {
            observer_records::Direction::Send => Self::Send,
            observer_records::Direction::Recv => Self::Recv,
        }
    }
}

/// Says what the remote port carries, as configured with `--grpc-port` / `--ws-port`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PortClass {
    Grpc,
    #[serde(rename = "websocket")]
    WebSocket,
}

impl From<observer_records::PortClass> for PortClass {
    fn from(class: observer_records::PortClass) -> Self {
        match class {
            observer_records::PortClass::Grpc => Self::Grpc,
            observer_records::PortClass::WebSocket => Self::WebSocket,
        }
    }
}

/// Names the Linux TCP states (include/net/tcp_states.h), as the kernel's records report them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TcpState {
    Established,
    SynSent,
    SynRecv,
    FinWait1,
    FinWait2,
    TimeWait,
    Close,
    CloseWait,
    LastAck,
    Listen,
    Closing,
    NewSynRecv,
    Unknown,
}

impl TcpState {
    /// Reads `value` as the kernel numbers a state (`observer_records::TcpState`); `Unknown` for
    /// a number that names no state.
    pub fn from_kernel(value: u32) -> Self {
        use observer_records::TcpState as Kernel;
        match Kernel::from_repr(value) {
            Some(Kernel::Established) => Self::Established,
            Some(Kernel::SynSent) => Self::SynSent,
            Some(Kernel::SynRecv) => Self::SynRecv,
            Some(Kernel::FinWait1) => Self::FinWait1,
            Some(Kernel::FinWait2) => Self::FinWait2,
            Some(Kernel::TimeWait) => Self::TimeWait,
            Some(Kernel::Close) => Self::Close,
            Some(Kernel::CloseWait) => Self::CloseWait,
            Some(Kernel::LastAck) => Self::LastAck,
            Some(Kernel::Listen) => Self::Listen,
            Some(Kernel::Closing) => Self::Closing,
            Some(Kernel::NewSynRecv) => Self::NewSynRecv,
            None => Self::Unknown,
        }
    }
}

/// Says what happened on a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The process entered SYN_SENT towards a watched port (the source port may still be 0:
    /// the kernel picks it right after).
    TcpConnect,
    /// A later state change of the connection.
    TcpState { old: TcpState, new: TcpState },
    /// Bytes a syscall moved on the connection. `offset` is the stream position of the first
    /// byte in this direction; `call_len` what the whole syscall moved; `truncated` that bytes
    /// of this call after `payload` were not captured.
    Data {
        direction: Direction,
        offset: u64,
        call_len: u64,
        truncated: bool,
        payload: Bytes,
    },
    /// The process closed its descriptor.
    Close,
}

/// Records one thing the capture saw: when, on which connection, by which process, and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Wall-clock time, nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    pub connection: ConnectionId,
    pub pid: u32,
    /// The kernel's 15-byte task name, inline: no allocation per event or per copy.
    pub comm: CompactString,
    pub cgroup_id: u64,
    pub saddr: IpAddr,
    pub sport: u16,
    pub daddr: IpAddr,
    pub dport: u16,
    pub port_class: PortClass,
    pub kind: EventKind,
}

/// Names one TCP connection by its two ends: the connecting process's address and the gateway's.
/// Unlike the kernel's socket address (`ConnectionId`) it survives an observer restart, so
/// cluster mode names placements by it and a restarted observer finds them again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnectionKey {
    pub local: SocketAddr,
    pub remote: SocketAddr,
}

impl ConnectionKey {
    /// Returns the key with IPv4-mapped IPv6 addresses written as IPv4, as `/proc/net/tcp6` and the
    /// kernel's records may spell one connection either way.
    pub fn canonical(self) -> Self {
        let canonical =
            |address: SocketAddr| SocketAddr::new(address.ip().to_canonical(), address.port());
        Self {
            local: canonical(self.local),
            remote: canonical(self.remote),
        }
    }

    /// Returns the connection an event belongs to.
    pub fn of(event: &Event) -> Self {
        Self {
            local: SocketAddr::new(event.saddr, event.sport),
            remote: SocketAddr::new(event.daddr, event.dport),
        }
        .canonical()
    }
}

impl fmt::Display for ConnectionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}>{}", self.local, self.remote)
    }
}

impl FromStr for ConnectionKey {
    type Err = ();

    fn from_str(text: &str) -> Result<Self, ()> {
        let (local, remote) = text.split_once('>').ok_or(())?;
        Ok(Self {
            local: local.parse().map_err(|_| ())?,
            remote: remote.parse().map_err(|_| ())?,
        })
    }
}
