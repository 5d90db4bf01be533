//! Defines, in one place, every record, map value, enum and constant shared by the kernel programs
//! (`observer-ebpf`, built for `bpfel-unknown-none`) and the userspace daemon (`observer`, which
//! enables the `user` feature to read them as `aya::Pod`). Userspace converts these enums into its
//! own types; it never numbers them again.
//!
//! Every type is `#[repr(C)]` with its fields ordered so that there is no implicit padding:
//! the kernel copies them byte for byte and the verifier rejects reads of uninitialised
//! padding on the stack. The `const` assertions at the bottom keep it that way.
#![cfg_attr(not(test), no_std)]

/// Declares a fieldless enum with the numbers the kernel and userspace exchange, written once: the
/// variants' discriminants, `ALL` in that order, and `from_repr` back from the number.
macro_rules! numbered_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident: $repr:ty {
            $($(#[$variant_meta:meta])* $variant:ident = $value:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[repr($repr)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$variant_meta])* $variant = $value,)+
        }

        impl $name {
            /// Lists every variant, in declaration order.
            pub const ALL: [Self; [$($name::$variant),+].len()] = [$(Self::$variant),+];

            /// Returns the variant numbered `value`, if there is one.
            pub fn from_repr(value: $repr) -> Option<Self> {
                Self::ALL.into_iter().find(|variant| *variant as $repr == value)
            }
        }
    };
}

/// Bounds the payload bytes one ring-buffer record carries. Larger transfers are split into several
/// records, each with its own stream offset.
pub const CHUNK_SIZE: usize = 4096;

/// Bounds the chunks of one syscall's transfer: a longer transfer is cut there (the remainder is
/// counted in `Counter::CallsCutAtChunkLimit` and the last record is marked truncated).
pub const MAX_CHUNKS_PER_CALL: u32 = 32;

/// Bounds the iovec entries followed per `readv`/`writev`/`sendmsg`/`recvmsg`: the kernel's own
/// limit (`UIO_MAXIOV`), which refuses calls with more. gRPC C-core writes each HTTP/2 frame header
/// and payload as entries of their own, up to about 260 per `sendmsg`.
pub const IOV_MAX: u32 = 1024;

/// Counts the steps of the copy walk that follow any call to its end: a step loads an iovec entry
/// and copies what fits of it into the chunk being filled, or sends a full chunk and continues in
/// the same entry. Small entries share chunks, so a call needs at most one step per entry plus one
/// per chunk, plus the last send.
pub const MAX_COPY_STEPS: u32 = IOV_MAX + MAX_CHUNKS_PER_CALL + 1;

/// Holds the default of `CaptureConfig::grpc_budget_refill`: bytes per second each direction's
/// budget regains. A long-lived HTTP/2 connection carrying a few hundred pushes a second (about
/// 1.5 KiB each) stays inside it; a bulk transfer is copied at this rate at most.
pub const DEFAULT_GRPC_BUDGET_REFILL: u32 = 1 << 20;

/// Caps `--grpc-budget-refill`, which keeps the kernel's refill arithmetic within 64 bits.
pub const MAX_GRPC_BUDGET_REFILL: u32 = 1 << 30;

/// Bounds the ports watched at once per class (`WATCHED_PORTS` holds their union).
pub const MAX_WATCHED_PORTS: u32 = 64;

/// Counts the bits of `WATCHED_PORTS` a port takes: its `PortClass`, 0 when it is not watched.
const WATCHED_PORT_BITS: u32 = 2;

/// Counts the ports one `WATCHED_PORTS` word holds.
const PORTS_PER_WORD: u32 = u64::BITS / WATCHED_PORT_BITS;

/// Counts the words of `WATCHED_PORTS`: every port, 16 KiB in all.
pub const WATCHED_PORT_WORDS: u32 = (1 << 16) / PORTS_PER_WORD;

/// Returns where a port's class sits in `WATCHED_PORTS`: the word's index and the shift to its
/// bits. The kernel reads it, userspace writes it: both must agree.
pub const fn watched_port_slot(port: u16) -> (u32, u32) {
    let port = port as u32;
    (
        port / PORTS_PER_WORD,
        (port % PORTS_PER_WORD) * WATCHED_PORT_BITS,
    )
}

/// Returns the class a `WATCHED_PORTS` word holds at `shift` (0: not watched).
pub const fn watched_port_class(word: u64, shift: u32) -> u8 {
    ((word >> shift) & ((1 << WATCHED_PORT_BITS) - 1)) as u8
}

/// Bounds the cgroup v2 directories a capture can be scoped to (`--cgroup-scope`, the
/// `CGROUP_SCOPE` array). Each costs one helper call per watched connect and per I/O on a watched
/// socket.
pub const MAX_CGROUP_SCOPES: u32 = 16;

/// Holds the default of `CaptureConfig::grpc_budget`: bytes captured per direction of a gRPC
/// connection in a burst (the budget refills over time, `DEFAULT_GRPC_BUDGET_REFILL`).
pub const DEFAULT_GRPC_BUDGET: u32 = 256 * 1024;

/// Holds the default size of the kernel's tables of watched connections and descriptors
/// (`--max-watched-connections`).
pub const DEFAULT_MAX_WATCHED_CONNECTIONS: u32 = 16_384;

/// Counts the slots of the `WATCHING` map, by tgid: a set slot means a process whose tgid falls
/// there may own a watched descriptor (see `watching_slot`).
pub const WATCHING_SLOTS: u32 = 1 << 14;

/// Returns the `WATCHING` slot of a process: kernel and userspace (adoption) must agree on it.
pub const fn watching_slot(tgid: u32) -> u32 {
    tgid & (WATCHING_SLOTS - 1)
}

numbered_enum! {
    /// Names what a watched port carries, which decides the kernel's capture policy
    /// (`WATCHED_PORTS` values, `RecordHeader::port_class`).
    pub enum PortClass: u8 {
        /// gRPC over cleartext HTTP/2: both directions, up to the budget.
        Grpc = 1,
        /// WebSocket: the upgrade request and its answer only, never the frames after them.
        WebSocket = 2,
    }
}

numbered_enum! {
    /// Names the kind of a ring-buffer record (`RecordHeader::kind`).
    pub enum RecordKind: u8 {
        /// A watched socket entered SYN_SENT inside `connect`: the connecting process is current.
        TcpConnect = 1,
        /// A watched socket became ESTABLISHED (syscall hook only, or an adopted connection
        /// announced) or CLOSE; the changes between them are not sent.
        TcpState = 2,
        /// Payload bytes moved by a syscall on a watched socket.
        Data = 3,
        /// The process closed its descriptor of a watched socket.
        Close = 4,
    }
}

numbered_enum! {
    /// Names the direction of a data record (`RecordHeader::direction`), seen from the process that
    /// connected.
    pub enum Direction: u8 {
        /// The connecting process wrote.
        Send = 0,
        /// The connecting process read.
        Recv = 1,
    }
}

/// Marks in `RecordHeader::flags` that this record's bytes stop short of what the syscall moved
/// (chunk, iovec or budget bound); the rest was counted, not copied.
pub const FLAG_TRUNCATED: u8 = 1;

numbered_enum! {
    /// Numbers the Linux TCP states as `inet_sock_set_state` reports them
    /// (include/net/tcp_states.h; `RecordHeader::old_state` and `new_state`).
    pub enum TcpState: u32 {
        Established = 1,
        SynSent = 2,
        SynRecv = 3,
        FinWait1 = 4,
        FinWait2 = 5,
        TimeWait = 6,
        Close = 7,
        CloseWait = 8,
        LastAck = 9,
        Listen = 10,
        Closing = 11,
        NewSynRecv = 12,
    }
}

/// Numbers the IPv4 address family, as the kernel numbers address families.
pub const AF_INET: u16 = 2;
/// Numbers the IPv6 address family.
pub const AF_INET6: u16 = 10;

/// Holds the IP protocol number of TCP (`IPPROTO_TCP`), as IP headers and `inet_sock_set_state`
/// carry it.
pub const IPPROTO_TCP: u8 = 6;

/// Describes the header of every ring-buffer record. Data records are followed by `len` payload
/// bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RecordHeader {
    /// `bpf_ktime_get_ns`: CLOCK_MONOTONIC nanoseconds.
    pub ts_ns: u64,
    /// Kernel address of the `struct sock`: the connection's identity while it lives.
    pub sock: u64,
    /// cgroup v2 id of the process (tcp_connect, data and close records).
    pub cgroup_id: u64,
    /// Data: stream offset, in this direction, of the first payload byte of this record (the
    /// packet hook's gRPC offsets leave out the segments it left out: `PacketDirection`).
    pub offset: u64,
    /// Data: bytes the syscall moved in total (all of this call's records share it).
    pub call_len: u64,
    /// Process (thread group) id; for tcp_state, the connecting process recorded at connect.
    pub tgid: u32,
    /// Data: payload bytes following this header.
    pub len: u32,
    /// TcpState: the states left and entered (`TcpState`).
    pub old_state: u32,
    pub new_state: u32,
    pub sport: u16,
    pub dport: u16,
    pub family: u16,
    /// `RecordKind`.
    pub kind: u8,
    /// Data: `Direction`.
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

/// Holds a data record as it sits in the per-CPU scratch buffer before it is copied to the ring;
/// only `size_of::<RecordHeader>() + header.len` bytes of it are sent.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DataRecord {
    pub header: RecordHeader,
    pub payload: [u8; CHUNK_SIZE],
}

/// Holds the global settings written by userspace before attaching (`CONFIG` array, index 0).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CaptureConfig {
    /// Bytes captured per direction of a connection to a gRPC port in a burst: each direction
    /// holds a bucket of this many bytes, full at connect, drawn by every byte captured.
    pub grpc_budget: u32,
    /// Bytes per second each bucket regains, up to `grpc_budget` (0: never, the budget then
    /// counts from the connection's first byte).
    pub grpc_budget_refill: u32,
    /// Records are submitted without waking the reader until this many bytes wait in the ring,
    /// or `wakeup_after_ns` passed since the last wakeup. A wakeup per record cost a busy pusher
    /// several context switches per call.
    pub wakeup_bytes: u32,
    /// Slots filled in `CGROUP_SCOPE`, from index 0: only tasks inside one of those cgroups
    /// are watched. 0: no scope, every process is.
    pub cgroup_scopes: u32,
    /// A record wakes the reader unless it was known to be reading (woken, or polling: it
    /// stamps `READER_AWAKE` at each read and clears it when it goes quiet) less than this long
    /// ago. The first record after a quiet spell is read at once; while records keep coming
    /// the reader polls and nothing wakes it (0: every record wakes it).
    pub wakeup_after_ns: u64,
    /// `CaptureHook` the programs serve: which programs userspace attached, and so where a
    /// connection becomes watched (a pending `connect`, or SYN_SENT alone).
    pub capture_hook: u32,
    pub _reserved: u32,
    /// Where `struct sock`'s fields are on this kernel, from its BTF, for the raw tracepoint
    /// of connection states (all zero when the formatted tracepoint is attached instead).
    pub sock_layout: SockLayout,
}

/// Holds the byte offsets from the kernel's `struct sock` of the fields the raw tracepoint of
/// `inet_sock_set_state` reads (its arguments are the socket and the two states, not the formatted
/// record), the same fields the formatted record is filled from: some in `struct sock`, some in the
/// `struct inet_sock` that begins with it. They move with the kernel's configuration, so userspace
/// finds them in the kernel's BTF (`/sys/kernel/btf/vmlinux`) before loading.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockLayout {
    /// `sk.__sk_common.skc_family`: u16.
    pub family: u16,
    /// `sk.__sk_common.skc_dport`: the remote port, big-endian u16.
    pub dport: u16,
    /// `inet_sport`: the local port, big-endian u16. Not `skc_num`, which the kernel clears
    /// when it releases the port at TCP_CLOSE, before the tracepoint runs.
    pub sport: u16,
    /// `sk.__sk_common.skc_daddr`: the remote IPv4 address, 4 bytes.
    pub daddr: u16,
    /// `inet_saddr`: the local IPv4 address, 4 bytes.
    pub saddr: u16,
    /// `sk.__sk_common.skc_v6_daddr`: the remote IPv6 address, 16 bytes.
    pub v6_daddr: u16,
    /// `sk.__sk_common.skc_v6_rcv_saddr`: the local IPv6 address, 16 bytes.
    pub v6_rcv_saddr: u16,
    /// `sk.sk_protocol`: u16 (a bitfield before Linux 5.6, which the programs do not support).
    pub protocol: u16,
}

numbered_enum! {
    /// Says where the bytes of watched connections are copied (`CaptureConfig::capture_hook`).
    pub enum CaptureHook: u32 {
        /// The read and write syscalls' tracepoints: every process's reads and writes pay for
        /// the check, a watched one for the copy from its buffers.
        Syscalls = 0,
        /// `cgroup_skb` programs on the packets of watched connections, at a cgroup v2 root: no
        /// syscall pays anything; a watched connection's segments are copied as TCP sends and
        /// receives them, placed in the stream by their sequence numbers.
        Packets = 1,
    }
}

/// Describes a watched connection (`CONNECTIONS` map value, keyed by the kernel's socket address
/// or, for a connection adopted at start, by an `adopted_connection_id`): its owner and 4-tuple.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Connection {
    pub cgroup_id: u64,
    pub tgid: u32,
    pub sport: u16,
    pub dport: u16,
    pub family: u16,
    pub port_class: u8,
    pub _reserved: [u8; 5],
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    pub comm: [u8; 16],
}

/// Names a connection by its endpoints as the programs record them (`Connection`'s fields: the
/// connecting side first, IPv4 as IPv4 even on a dual-stack socket). Key of `ADOPTABLE`: with the
/// packet hook, userspace names there the connections established before it attached, and the
/// packet programs adopt one at its first packet.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnectionTuple {
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    pub sport: u16,
    pub dport: u16,
    pub family: u16,
    pub _reserved: u16,
}

/// Holds the stream offset the packet hook gives the first byte it sees of a connection it adopted
/// established: where that byte really sits is unknown, but not at 0, and every consumer takes a
/// stream first seen past 0 as joined mid-way (the decoders resynchronise, the output whitelist
/// zeroes it). A power of two, so the offsets of the following sequence numbers are plain sums.
pub const JOINED_STREAM_OFFSET: u64 = 1 << 32;

/// Names a process's descriptor (`SOCKETS` map key).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketKey {
    pub tgid: u32,
    pub fd: u32,
}

/// Holds the capture state of one watched descriptor (`SOCKETS` map value).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SocketState {
    /// The `CONNECTIONS` key of its connection.
    pub sock: u64,
    /// Stream positions: bytes moved so far in each direction, captured or not.
    pub sent: u64,
    pub received: u64,
    /// gRPC budget of each direction (see the programs' `io::capture_allowance`).
    pub send_budget: Budget,
    pub receive_budget: Budget,
    /// The connection as last seen in `CONNECTIONS` (copied at connect, refreshed at every read
    /// or write entry): a peer's reset removes the `CONNECTIONS` entry (TCP_CLOSE) while the
    /// process may still return from a write, read what arrived before the reset, and close its
    /// descriptor, and each of those records must still name the connection.
    pub conn: Connection,
    pub port_class: u8,
    /// WebSocket policy: the first send / first receive has been captured.
    pub ws_sent_done: u8,
    pub ws_received_done: u8,
    pub _reserved: [u8; 5],
}

/// Holds a token bucket of bytes: `spent` bytes drawn from a full bucket, repaid over time since
/// `settled_ns`. Zero is a full bucket, which is how a new connection starts.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Budget {
    pub spent: u64,
    pub settled_ns: u64,
}

/// Records where one direction of a watched connection stands (`packet`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PacketDirection {
    /// Sequence number of the direction's first payload byte (its SYN's plus one).
    pub first_seq: u32,
    /// `STREAM_SEQ_KNOWN`, `STREAM_HEAD_TAKEN`.
    pub flags: u32,
    /// Stream offset just past the furthest byte seen.
    pub seen_end: u64,
    /// Where bytes before `seen_end` may be missing (a segment came beyond it): from here
    /// they are copied again; `NO_HOLE` when every byte before it was seen.
    pub hole_from: u64,
    /// gRPC budget (see the programs' `io::draw`).
    pub budget: Budget,
    /// gRPC: stream offset of the next HTTP/2 frame header, as far as the programs follow the
    /// frames; `FRAMES_NOT_FOLLOWED` once they cannot (see `http2::CALL_FRAME_TYPES`).
    pub next_frame: u64,
    /// gRPC: bytes before `seen_end` left out because every frame of their segment was of a
    /// type the decoder does not read. A record's offset does not count them, so the stream
    /// userspace receives is the connection's without those segments.
    pub left_out: u64,
}

/// Marks `PacketDirection::next_frame` when the frame boundaries are not known: a connection
/// adopted established, a direction that did not open as HTTP/2 does (the client's with its
/// preface, the server's with SETTINGS), bytes missing before a frame header, a frame header cut by
/// its segment's end, or a segment of more frames than the programs follow.
pub const FRAMES_NOT_FOLLOWED: u64 = u64::MAX;

/// Marks `PacketDirection::hole_from` when nothing before `seen_end` is missing.
pub const NO_HOLE: u64 = u64::MAX;

/// Flags in `PacketDirection::flags` that the direction's SYN was seen, so its bytes can be placed.
pub const STREAM_SEQ_KNOWN: u32 = 1;
/// Flags in `PacketDirection::flags` that a WebSocket direction's first write (its upgrade request
/// or answer) has been copied; nothing after it is.
pub const STREAM_HEAD_TAKEN: u32 = 2;
/// Flags in `PacketDirection::flags` that the connection was adopted established, so the
/// direction's first segment seen is where its stream starts (offset 0), no SYN being to come.
pub const STREAM_JOINED: u32 = 4;

/// Describes a watched connection of the packet hook (`PACKET_STREAMS` map value, keyed by the
/// kernel's socket address): where each direction's stream stands, and the connection as
/// `CONNECTIONS` holds one for the syscall hook. One entry, inserted once at SYN_SENT (or at
/// adoption) and removed once at TCP_CLOSE, is all a connection costs the packet hook's tables.
/// Userspace reads only the keys: which connections are alive.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PacketStream {
    pub send: PacketDirection,
    pub recv: PacketDirection,
    /// Its owner from SYN_SENT, its 4-tuple once its SYN passed the packet programs (the
    /// source port is 0 before).
    pub conn: Connection,
}

impl PacketStream {
    const NEW_DIRECTION: PacketDirection = PacketDirection {
        first_seq: 0,
        flags: 0,
        seen_end: 0,
        hole_from: NO_HOLE,
        budget: Budget {
            spent: 0,
            settled_ns: 0,
        },
        next_frame: 0,
        left_out: 0,
    };

    const NO_CONNECTION: Connection = Connection {
        cgroup_id: 0,
        tgid: 0,
        sport: 0,
        dport: 0,
        family: 0,
        port_class: 0,
        _reserved: [0; 5],
        saddr: [0; 16],
        daddr: [0; 16],
        comm: [0; 16],
    };

    /// Describes a connection whose SYNs have not been seen yet. A gRPC client's first frame
    /// follows its preface; the server's first frame opens its side.
    pub const NEW: Self = Self {
        send: PacketDirection {
            next_frame: http2::CLIENT_PREFACE.len() as u64,
            ..Self::NEW_DIRECTION
        },
        recv: Self::NEW_DIRECTION,
        conn: Self::NO_CONNECTION,
    };

    const JOINED_DIRECTION: PacketDirection = PacketDirection {
        flags: STREAM_JOINED,
        next_frame: FRAMES_NOT_FOLLOWED,
        ..Self::NEW_DIRECTION
    };

    /// Describes a connection adopted established: each direction starts at its first segment seen.
    pub const JOINED: Self = Self {
        send: Self::JOINED_DIRECTION,
        recv: Self::JOINED_DIRECTION,
        conn: Self::NO_CONNECTION,
    };
}

/// Returns the id that keys a connection userspace adopts at start (established before the programs
/// were attached) instead of a kernel socket address: bit 62 set and bit 63 clear, which no kernel
/// pointer has (they live in the top half of the address space), and the socket's inode (unique
/// while the socket lives) below.
pub const fn adopted_connection_id(inode: u64) -> u64 {
    ADOPTED_CONNECTION_BIT | (inode & (ADOPTED_CONNECTION_BIT - 1))
}

/// Marks an id made by `adopted_connection_id` (see there).
pub const ADOPTED_CONNECTION_BIT: u64 = 1 << 62;

/// Says whether a `CONNECTIONS` key was made by `adopted_connection_id`.
pub const fn is_adopted_connection(id: u64) -> bool {
    id & (3 << 62) == ADOPTED_CONNECTION_BIT
}

numbered_enum! {
    /// Names the indexes into the per-CPU `COUNTERS` array; userspace sums the CPUs.
    pub enum Counter: u32 {
        /// Records lost because the ring buffer was full.
        RingFullDrops = 0,
        /// Payload bytes a syscall moved that were not copied, whatever the cause (budget,
        /// chunk limit, unreadable memory, WebSocket policy); the counters below say why.
        BytesNotCaptured = 1,
        /// Inserts into a bounded map that failed.
        MapInsertFailures = 2,
        /// Copies from user memory that failed (page not present, bad pointer).
        UserReadFailures = 3,
        /// Calls that moved more than `MAX_CHUNKS_PER_CALL` chunks: their tail was not copied.
        CallsCutAtChunkLimit = 4,
        /// Calls whose iovec walk ran out of steps before their end (kernels without
        /// `bpf_loop` whose tail calls ran out; never expected, see `MAX_COPY_STEPS`).
        CallsCutAtStepLimit = 5,
        /// Calls cut because their user memory (an iovec array or buffer) could not be read.
        CallsCutUnreadable = 6,
        /// gRPC bytes not copied because the connection's budget was spent (bulk traffic).
        BytesOverBudget = 7,
        /// Packet hook: segments that arrived ahead of bytes not yet seen (reordered in the
        /// network); copied at their place in the stream, the gap before them shows there.
        SegmentsOutOfOrder = 8,
        /// Packet hook, gRPC: segments not copied because they held only HTTP/2 frames the
        /// decoder does not read (SETTINGS and their ACKs, WINDOW_UPDATE, PING, GOAWAY: most
        /// of a short connection's segments). Not a loss.
        SegmentsLeftOut = 9,
    }
}

/// Counts the entries of the `COUNTERS` array: one per `Counter`.
pub const COUNTER_COUNT: u32 = Counter::ALL.len() as u32;

impl Counter {
    /// Returns the counter's name in metrics and in the observer's final report.
    pub fn name(self) -> &'static str {
        match self {
            Counter::RingFullDrops => "ring_full_drops",
            Counter::BytesNotCaptured => "bytes_not_captured",
            Counter::MapInsertFailures => "map_insert_failures",
            Counter::UserReadFailures => "user_read_failures",
            Counter::CallsCutAtChunkLimit => "calls_cut_at_chunk_limit",
            Counter::CallsCutAtStepLimit => "calls_cut_at_step_limit",
            Counter::CallsCutUnreadable => "calls_cut_unreadable",
            Counter::BytesOverBudget => "bytes_over_budget",
            Counter::SegmentsOutOfOrder => "segments_out_of_order",
            Counter::SegmentsLeftOut => "segments_left_out",
        }
    }
}

/// Describes HTTP/2 framing (RFC 9113 §3.4, §4.1, §6), which the decoder and the output whitelist
/// walk and the packet programs follow far enough to leave out what the decoder does not read.
pub mod http2 {
    /// Holds what an HTTP/2 client sends first.
    pub const CLIENT_PREFACE: [u8; 24] = *b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    /// Counts the bytes of a frame header.
    pub const FRAME_HEADER_LEN: usize = 9;
    /// Numbers the DATA frame type.
    pub const FRAME_DATA: u8 = 0x0;
    /// Numbers the HEADERS frame type.
    pub const FRAME_HEADERS: u8 = 0x1;
    /// Numbers the PRIORITY frame type.
    pub const FRAME_PRIORITY: u8 = 0x2;
    /// Numbers the RST_STREAM frame type.
    pub const FRAME_RST_STREAM: u8 = 0x3;
    /// Numbers the SETTINGS frame type.
    pub const FRAME_SETTINGS: u8 = 0x4;
    /// Numbers the PUSH_PROMISE frame type.
    pub const FRAME_PUSH_PROMISE: u8 = 0x5;
    /// Numbers the PING frame type.
    pub const FRAME_PING: u8 = 0x6;
    /// Numbers the GOAWAY frame type.
    pub const FRAME_GOAWAY: u8 = 0x7;
    /// Numbers the WINDOW_UPDATE frame type.
    pub const FRAME_WINDOW_UPDATE: u8 = 0x8;
    /// Numbers the CONTINUATION frame type.
    pub const FRAME_CONTINUATION: u8 = 0x9;
    /// Flags a frame that ends its stream (END_STREAM).
    pub const FLAG_END_STREAM: u8 = 0x1;
    /// Flags a frame that ends its header block (END_HEADERS).
    pub const FLAG_END_HEADERS: u8 = 0x4;
    /// Flags a padded frame (PADDED).
    pub const FLAG_PADDED: u8 = 0x8;
    /// Flags a HEADERS frame that carries priority fields (PRIORITY).
    pub const FLAG_PRIORITY: u8 = 0x20;

    /// Holds the frame types the decoder reads, a bit each: a call's headers and data, a stream's
    /// reset, and what carries HPACK state. SETTINGS, PING, GOAWAY, WINDOW_UPDATE, PRIORITY and
    /// unknown types carry nothing about calls or the HPACK state.
    pub const CALL_FRAME_TYPES: u32 = 1 << FRAME_DATA
        | 1 << FRAME_HEADERS
        | 1 << FRAME_RST_STREAM
        | 1 << FRAME_PUSH_PROMISE
        | 1 << FRAME_CONTINUATION;

    /// Says whether the decoder reads frames of `frame_type`.
    pub const fn is_call_frame(frame_type: u8) -> bool {
        frame_type < 32 && CALL_FRAME_TYPES & (1 << frame_type) != 0
    }
}

/// Says where the programs read their arguments in the tracepoint records (each kernel's
/// `/sys/kernel/tracing/events/<category>/<name>/format`). The programs read these offsets;
/// userspace checks them against the running kernel's tracefs before loading.
pub mod tracepoint {
    /// Locates the first argument of a syscall tracepoint record. Syscall tracepoints: 8 bytes of
    /// common header, the syscall number, then every argument as 8 bytes (`sys_enter_*`), or the
    /// return value (`sys_exit_*`).
    pub const SYSCALL_ARG0: usize = 16;
    /// Locates the second argument of a `sys_enter_*` record.
    pub const SYSCALL_ARG1: usize = 24;
    /// Locates the third argument of a `sys_enter_*` record.
    pub const SYSCALL_ARG2: usize = 32;
    /// Counts the bytes of each syscall argument.
    pub const SYSCALL_ARG_SIZE: usize = 8;
    /// Locates the return value of a `sys_exit_*` record.
    pub const SYSCALL_RET: usize = 16;

    /// Locates the socket's address in `sock/inet_sock_set_state`, unchanged since 4.16, as the
    /// constants below locate its other fields.
    pub const SOCK_SKADDR: usize = 8;
    /// Locates the state left.
    pub const SOCK_OLDSTATE: usize = 16;
    /// Locates the state entered.
    pub const SOCK_NEWSTATE: usize = 20;
    /// Locates the local port.
    pub const SOCK_SPORT: usize = 24;
    /// Locates the remote port.
    pub const SOCK_DPORT: usize = 26;
    /// Locates the address family.
    pub const SOCK_FAMILY: usize = 28;
    /// Locates the IP protocol.
    pub const SOCK_PROTOCOL: usize = 30;
    /// Locates the local IPv4 address.
    pub const SOCK_SADDR: usize = 32;
    /// Locates the remote IPv4 address.
    pub const SOCK_DADDR: usize = 36;
    /// Locates the local IPv6 address.
    pub const SOCK_SADDR_V6: usize = 40;
    /// Locates the remote IPv6 address.
    pub const SOCK_DADDR_V6: usize = 56;

    /// Lists the `(field name, offset, size)` of every `inet_sock_set_state` field the programs
    /// read.
    pub const INET_SOCK_SET_STATE_FIELDS: [(&str, usize, usize); 11] = [
        ("skaddr", SOCK_SKADDR, 8),
        ("oldstate", SOCK_OLDSTATE, 4),
        ("newstate", SOCK_NEWSTATE, 4),
        ("sport", SOCK_SPORT, 2),
        ("dport", SOCK_DPORT, 2),
        ("family", SOCK_FAMILY, 2),
        ("protocol", SOCK_PROTOCOL, 2),
        ("saddr", SOCK_SADDR, 4),
        ("daddr", SOCK_DADDR, 4),
        ("saddr_v6", SOCK_SADDR_V6, 16),
        ("daddr_v6", SOCK_DADDR_V6, 16),
    ];
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of them are `repr(C)`, contain only integers and byte arrays, and have no
    // padding (asserted below), so every bit pattern is a valid value.
    unsafe impl aya::Pod for super::RecordHeader {}
    unsafe impl aya::Pod for super::CaptureConfig {}
    unsafe impl aya::Pod for super::Connection {}
    unsafe impl aya::Pod for super::SocketKey {}
    unsafe impl aya::Pod for super::ConnectionTuple {}
    unsafe impl aya::Pod for super::SocketState {}
    unsafe impl aya::Pod for super::PacketStream {}
}

// No implicit padding: each size is the sum of its fields.
const _: () = assert!(core::mem::size_of::<RecordHeader>() == 5 * 8 + 4 * 4 + 3 * 2 + 4 + 6 + 48);
const _: () = assert!(core::mem::size_of::<RecordHeader>().is_multiple_of(8));
const _: () = assert!(
    core::mem::size_of::<DataRecord>() == core::mem::size_of::<RecordHeader>() + CHUNK_SIZE
);
const _: () = assert!(core::mem::size_of::<SockLayout>() == 8 * 2);
const _: () = assert!(
    core::mem::size_of::<CaptureConfig>() == 6 * 4 + 8 + core::mem::size_of::<SockLayout>()
);
const _: () = assert!(core::mem::size_of::<Connection>() == 8 + 4 + 3 * 2 + 1 + 5 + 3 * 16);
const _: () = assert!(core::mem::size_of::<SocketKey>() == 8);
const _: () = assert!(core::mem::size_of::<ConnectionTuple>() == 2 * 16 + 4 * 2);
const _: () = assert!(
    core::mem::size_of::<PacketDirection>() == 4 * 2 + 8 * 4 + core::mem::size_of::<Budget>()
);
const _: () = assert!(
    core::mem::size_of::<PacketStream>()
        == 2 * core::mem::size_of::<PacketDirection>() + core::mem::size_of::<Connection>()
);
const _: () = assert!(
    core::mem::size_of::<SocketState>()
        == 3 * 8 + 2 * core::mem::size_of::<Budget>() + core::mem::size_of::<Connection>() + 3 + 5
);

#[cfg(test)]
mod tests;
