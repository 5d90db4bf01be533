//! The one definition of every record and map value shared by the kernel programs
//! (`src/main.rs`, built for `bpfel-unknown-none`) and the userspace daemon (`observer`, which
//! enables the `user` feature to read them as `aya::Pod`).
//!
//! Every type is `#[repr(C)]` with its fields ordered so that there is no implicit padding:
//! the kernel copies them byte for byte and the verifier rejects reads of uninitialised
//! padding on the stack. The `const` assertions at the bottom keep it that way.
#![no_std]

/// Bytes of payload one ring-buffer record carries at most. Larger transfers are split into
/// several records, each with its own stream offset.
pub const CHUNK_SIZE: usize = 4096;

/// A transfer longer than this many chunks in one syscall is cut there (the remainder is
/// counted as skipped and the last record is marked truncated). A constant bound is what lets
/// the verifier accept the copy loop on 5.8 kernels, which lack `bpf_loop`.
pub const MAX_CHUNKS_PER_CALL: u32 = 32;

/// iovec entries followed per `readv`/`writev`/`sendmsg`/`recvmsg`; later entries are skipped
/// (and counted). Go, Rust std and gRPC C-core use at most a handful.
pub const MAX_IOVECS: u32 = 8;

/// Ports watched at once per class (`WATCHED_PORTS` holds their union).
pub const MAX_WATCHED_PORTS: u32 = 64;

/// `CaptureConfig::grpc_budget` default: bytes captured per direction of a gRPC connection.
pub const DEFAULT_GRPC_BUDGET: u32 = 256 * 1024;

/// What a watched port carries, which decides the kernel's capture policy.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortClass {
    /// gRPC over cleartext HTTP/2: both directions, up to the budget.
    Grpc = 1,
    /// WebSocket: the upgrade request and its answer only, never the frames after them.
    WebSocket = 2,
}

impl PortClass {
    pub fn from_u8(value: u8) -> Option<Self> {
        match value {
            1 => Some(Self::Grpc),
            2 => Some(Self::WebSocket),
            _ => None,
        }
    }
}

/// Kind of a ring-buffer record (`RecordHeader::kind`).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// A watched socket entered SYN_SENT inside `connect`: the connecting process is current.
    TcpConnect = 1,
    /// Any later TCP state change of a watched socket (ESTABLISHED, CLOSE, …).
    TcpState = 2,
    /// Payload bytes moved by a syscall on a watched socket.
    Data = 3,
    /// The process closed its descriptor of a watched socket.
    Close = 4,
}

impl RecordKind {
    pub fn from_u8(value: u8) -> Option<Self> {
        match value {
            1 => Some(Self::TcpConnect),
            2 => Some(Self::TcpState),
            3 => Some(Self::Data),
            4 => Some(Self::Close),
            _ => None,
        }
    }
}

/// Direction of a data record, seen from the process that connected.
pub const DIRECTION_SEND: u8 = 0;
pub const DIRECTION_RECV: u8 = 1;

/// `RecordHeader::flags`: this record's bytes stop short of what the syscall moved (chunk,
/// iovec or budget bound); the rest was counted, not copied.
pub const FLAG_TRUNCATED: u8 = 1;

/// Linux TCP states as `inet_sock_set_state` reports them.
pub const TCP_ESTABLISHED: u32 = 1;
pub const TCP_SYN_SENT: u32 = 2;
pub const TCP_CLOSE: u32 = 7;

/// Address families as the kernel numbers them.
pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;

/// Header of every ring-buffer record. Data records are followed by `len` payload bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RecordHeader {
    /// `bpf_ktime_get_ns`: CLOCK_MONOTONIC nanoseconds.
    pub ts_ns: u64,
    /// Kernel address of the `struct sock`: the connection's identity while it lives.
    pub sock: u64,
    /// cgroup v2 id of the process (tcp_connect, data and close records).
    pub cgroup_id: u64,
    /// Data: stream offset, in this direction, of the first payload byte of this record.
    pub offset: u64,
    /// Data: bytes the syscall moved in total (all of this call's records share it).
    pub call_len: u64,
    /// Process (thread group) id; for tcp_state, the connecting process recorded at connect.
    pub tgid: u32,
    /// Data: payload bytes following this header.
    pub len: u32,
    /// TcpState: the states left and entered (`TCP_*`).
    pub old_state: u32,
    pub new_state: u32,
    pub sport: u16,
    pub dport: u16,
    pub family: u16,
    pub kind: u8,
    pub direction: u8,
    pub flags: u8,
    /// `PortClass` of the remote port.
    pub port_class: u8,
    pub _reserved: [u8; 6],
    /// IPv4 addresses occupy the first 4 bytes; IPv6 all 16. Network byte order.
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    pub comm: [u8; 16],
}

/// A data record as it sits in the per-CPU scratch buffer before it is copied to the ring;
/// only `size_of::<RecordHeader>() + header.len` bytes of it are sent.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DataRecord {
    pub header: RecordHeader,
    pub payload: [u8; CHUNK_SIZE],
}

/// Global settings written by userspace before attaching (`CONFIG` array, index 0).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CaptureConfig {
    /// Bytes captured per direction of a connection to a gRPC port.
    pub grpc_budget: u32,
    /// Records are submitted without waking the reader until this many bytes wait in the ring;
    /// the reader also drains on a short timer. A wakeup per record cost a busy pusher several
    /// context switches per call.
    pub wakeup_bytes: u32,
}

/// Indexes into the per-CPU `COUNTERS` array; userspace sums the CPUs.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Records lost because the ring buffer was full.
    RingFullDrops = 0,
    /// Payload bytes a syscall moved that were not copied (budget, chunk or iovec bounds,
    /// WebSocket policy).
    BytesNotCaptured = 1,
    /// Inserts into a bounded map that failed.
    MapInsertFailures = 2,
    /// Copies from user memory that failed (page not present, bad pointer).
    UserReadFailures = 3,
}

pub const COUNTER_COUNT: u32 = 4;

impl Counter {
    pub const ALL: [Counter; COUNTER_COUNT as usize] = [
        Counter::RingFullDrops,
        Counter::BytesNotCaptured,
        Counter::MapInsertFailures,
        Counter::UserReadFailures,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Counter::RingFullDrops => "ring_full_drops",
            Counter::BytesNotCaptured => "bytes_not_captured",
            Counter::MapInsertFailures => "map_insert_failures",
            Counter::UserReadFailures => "user_read_failures",
        }
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all three are `repr(C)`, contain only integers and byte arrays, and have no
    // padding (asserted below), so every bit pattern is a valid value.
    unsafe impl aya::Pod for super::RecordHeader {}
    unsafe impl aya::Pod for super::CaptureConfig {}
}

// No implicit padding: each size is the sum of its fields.
const _: () = assert!(core::mem::size_of::<RecordHeader>() == 5 * 8 + 4 * 4 + 3 * 2 + 4 + 6 + 48);
const _: () = assert!(core::mem::size_of::<RecordHeader>().is_multiple_of(8));
const _: () = assert!(
    core::mem::size_of::<DataRecord>() == core::mem::size_of::<RecordHeader>() + CHUNK_SIZE
);
const _: () = assert!(core::mem::size_of::<CaptureConfig>() == 8);
