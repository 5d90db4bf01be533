//! Declares every map of the programs, with the kernel-only values they hold. Every one is bounded;
//! the tables of connections, descriptors, connects in progress and calls in flight are plain hash
//! maps that say when they are full (`CONNECTIONS`, `SOCKETS`, `PENDING_CONNECTS`, `IN_FLIGHT`),
//! never LRU maps that would forget an entry silently.

use core::intrinsics::{AtomicOrdering, atomic_xadd};

use aya_ebpf::{
    bindings::BPF_F_MMAPABLE,
    macros::map,
    maps::{Array, CgroupArray, HashMap, PerCpuArray, ProgramArray, RingBuf},
};
pub use observer_records::{
    Budget, Connection, ConnectionTuple, NO_HOLE, PacketDirection, PacketStream, STREAM_HEAD_TAKEN,
    STREAM_JOINED, STREAM_SEQ_KNOWN, SocketKey, SocketState,
};
use observer_records::{
    CHUNK_SIZE, COUNTER_COUNT, CaptureConfig, CaptureHook, Counter,
    DEFAULT_MAX_WATCHED_CONNECTIONS, DataRecord, Direction, MAX_CGROUP_SCOPES, WATCHED_PORT_WORDS,
    WATCHING_SLOTS, watched_port_class, watched_port_slot, watching_slot,
};

use crate::copy_state::CopyState;

/// Carries the records for userspace. Size set by userspace (`--ring-bytes`); a full ring is
/// counted in `Counter::RingFullDrops`, never silent.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(8 << 20, 0);

/// Maps a remote port to its `PortClass`, two bits a port (`watched_port_slot`), written by
/// userspace before attaching. Every packet of every socket and every TCP state change asks it
/// first, so it is one array read (a lookup the verifier inlines), not the hash lookup it was: with
/// that, the packet programs' turn-away ran 64–79 ns a packet under the lab's push flood. Bound:
/// every port, `WATCHED_PORT_WORDS` words (16 KiB).
#[map]
pub static WATCHED_PORTS: Array<u64> = Array::with_max_entries(WATCHED_PORT_WORDS, 0);

/// Returns the `PortClass` of a watched port, `None` for any other.
pub fn watched_port(port: u16) -> Option<u8> {
    let (index, shift) = watched_port_slot(port);
    let class = watched_port_class(*WATCHED_PORTS.get(index)?, shift);
    (class != 0).then_some(class)
}

/// Flags with non-zero the slots (`watching_slot`) where a process whose tgid falls there may own a
/// watched descriptor: set when `SOCKETS` gains one (connect here, adoption in userspace), never
/// cleared, so a stale slot only costs its processes the `SOCKETS` lookup that it spares every
/// other process's reads, writes and closes. Bound: `WATCHING_SLOTS`.
#[map]
pub static WATCHING: Array<u8> = Array::with_max_entries(WATCHING_SLOTS, 0);

/// Counts the calls claimed at syscall entry (`IN_FLIGHT`) and not yet finished at exit, per
/// thread-id slot (`claim_slot`): the exit of every read and write nobody claimed stops at this one
/// array read instead of an `IN_FLIGHT` lookup. Counts, not flags, so two threads sharing a slot
/// cannot hide each other's claim; a call whose claim `IN_FLIGHT` could not hold is not counted.
/// Bound: `CLAIM_SLOTS`.
#[map]
pub static CLAIMS: Array<u64> = Array::with_max_entries(CLAIM_SLOTS, 0);

/// Counts the slots of `CLAIMS`, by thread id (`claim_slot`).
pub const CLAIM_SLOTS: u32 = 1 << 14;

/// Holds at index 0 the `CaptureConfig` userspace wrote. One entry.
#[map]
pub static CONFIG: Array<CaptureConfig> = Array::with_max_entries(1, 0);

/// Holds at index 0 when the reader is known to be reading (`bpf_ktime_get_ns` clock): the last
/// record that woke it, or userspace's own stamp at each read while it polls; 0 once it said it
/// waits for a wakeup. See `CaptureConfig::wakeup_after_ns`. One entry, written by the programs at
/// most once per interval, so CPUs rarely contend for its cache line; two CPUs racing to wake the
/// reader only wake it twice. Mappable (`BPF_F_MMAPABLE`, Linux 5.5): userspace stamps it at every
/// read through its own mapping of the slot, without a bpf() syscall.
#[map]
pub static READER_AWAKE: Array<u64> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// Holds the cgroup v2 directories (written by userspace as directory fds) that bound what is
/// watched: `CaptureConfig::cgroup_scopes` slots from index 0. Bound: `MAX_CGROUP_SCOPES`, the most
/// `--cgroup-scope` flags userspace accepts.
#[map]
pub static CGROUP_SCOPE: CgroupArray = CgroupArray::with_max_entries(MAX_CGROUP_SCOPES, 0);

/// Holds the per-CPU event counters, indexed by `Counter`; userspace sums the CPUs. One entry per
/// counter.
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_COUNT, 0);

/// Holds per-CPU scratch space for the data record being filled: 4 KiB does not fit the 512-byte
/// BPF stack. The syscall hook's programs use entry 0: they run in a syscall, to completion on
/// their CPU (with their tail calls), and nothing that uses it interrupts them. The packet programs
/// use the entry of their nesting level (`PACKET_NESTING`). Bound: `SCRATCH_SLOTS` entries per CPU.
#[map]
pub static SCRATCH: PerCpuArray<ChunkBuffer> = PerCpuArray::with_max_entries(SCRATCH_SLOTS, 0);

/// Counts the packet programs that can be filling a record on one CPU at once. One sending in
/// process context (`connect`, `sendmsg`: bottom halves enabled) can be interrupted by a softirq
/// whose packets run the programs again on the same CPU, before the first one put its record on the
/// ring; with a single slot the inner run overwrote the outer one's record. Softirqs do not
/// interrupt each other, and no packet program runs in a hard interrupt: two levels.
pub const SCRATCH_SLOTS: u32 = 2;

/// Counts, per CPU, the packet programs between taking their scratch slot and giving it back
/// (`packet::try_packet`): the next one's level. A run that interrupts another gives its slot back
/// before the interrupted one resumes. One entry per CPU.
#[map]
pub static PACKET_NESTING: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// Holds the per-CPU state of the payload copy in progress (see `copy`). One entry per CPU.
#[map]
pub static COPY: PerCpuArray<CopyState> = PerCpuArray::with_max_entries(1, 0);

/// Holds at index `COPY_CONTINUE` the program that resumes a copy where the previous one stopped,
/// on kernels without `bpf_loop` (userspace fills it only then). One entry.
#[map]
pub static COPY_PROGRAMS: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// Names the `COPY_PROGRAMS` index of `copy::copy_continue`.
pub const COPY_CONTINUE: u32 = 0;

/// Tracks the threads inside `connect` to a watched port (pid_tgid → pending connect), from syscall
/// entry to exit. Bound: connects in progress at once, sized as the connection tables
/// (`--max-watched-connections`). Not LRU, for the reasons `IN_FLIGHT` gives: an evicted entry left
/// its connection unwatched and nothing counted; full, an insert fails and is counted.
#[map]
pub static PENDING_CONNECTS: HashMap<u64, PendingConnect> =
    HashMap::with_max_entries(DEFAULT_MAX_WATCHED_CONNECTIONS, 0);

/// Holds the watched kernel sockets (sock address → owner and 4-tuple) of the syscall hook, and the
/// connections userspace adopts at start (by `adopted_connection_id`) with either hook; the packet
/// hook keeps its own connections in `PACKET_STREAMS`. Removed at TCP_CLOSE, which every TCP socket
/// reaches. Bound: watched connections alive at once (`--max-watched-connections`, set by
/// userspace). Not LRU: an LRU would silently forget live connections on a node that holds more (a
/// proxy with more online users), and userspace ends what is not here; full, an insert fails and is
/// counted (`MapInsertFailures`, which raises `capture_degraded`).
#[map]
pub static CONNECTIONS: HashMap<u64, Connection> =
    HashMap::with_max_entries(DEFAULT_MAX_WATCHED_CONNECTIONS, 0);

/// Holds a process's descriptors of watched sockets ((tgid, fd) → capture state). Removed by
/// `close`; those of a process that exits without closing are removed by userspace once their
/// connection is gone (`KernelCapture::reconcile`). Bound and fullness as `CONNECTIONS`.
#[map]
pub static SOCKETS: HashMap<SocketKey, SocketState> =
    HashMap::with_max_entries(DEFAULT_MAX_WATCHED_CONNECTIONS, 0);

/// Tracks the threads inside a read or write on a watched socket (pid_tgid → the call's arguments),
/// from syscall entry to exit. Bound: calls in flight at once, sized as the connection tables
/// (`--max-watched-connections`). Not LRU: an LRU silently evicted the claims of threads blocked in
/// reads, before it was even full, and their bytes went uncaptured and uncounted; full, an insert
/// fails and is counted (`MapInsertFailures`). Nothing leaks: every syscall whose entry claimed a
/// call reaches the exit tracepoint, a thread killed mid-call included (the interrupted call
/// returns through the syscall exit work before the signal ends the thread; `kernel_capture` pins
/// it), and no entry can claim before its exit is attached: the exits are attached first, and
/// `SOCKETS`, without which nothing is claimed, gains descriptors only from the connect programs,
/// attached last, and from adoption after them (`programs::ATTACHMENTS`).
#[map]
pub static IN_FLIGHT: HashMap<u64, IoCall> =
    HashMap::with_max_entries(DEFAULT_MAX_WATCHED_CONNECTIONS, 0);

/// Holds the packet hook's watched connections (sock address → owner, 4-tuple and where each
/// direction's stream stands), inserted at SYN_SENT and removed at TCP_CLOSE, in
/// `CaptureHook::Packets` only. The one table a connection costs the packet hook: a second
/// (`CONNECTIONS` beside it, as before) doubled the hash inserts and deletes of every connection.
/// Bound and fullness as `CONNECTIONS`.
#[map]
pub static PACKET_STREAMS: HashMap<u64, PacketStream> =
    HashMap::with_max_entries(DEFAULT_MAX_WATCHED_CONNECTIONS, 0);

/// Holds, for the packet hook, the connections established before the programs were attached
/// (4-tuple → owner, as `CONNECTIONS` would hold it), written by userspace at start; the packet
/// programs adopt one at its first packet (`packet::adopt`) and remove it, userspace removes those
/// that end unseen. Bound and fullness as `CONNECTIONS`.
#[map]
pub static ADOPTABLE: HashMap<ConnectionTuple, Connection> =
    HashMap::with_max_entries(DEFAULT_MAX_WATCHED_CONNECTIONS, 0);

/// Holds per-CPU space where SYN_SENT builds a new connection's entry: whole for `PACKET_STREAMS`,
/// its `conn` for `CONNECTIONS`. The 184-byte stream does not fit on the state program's stack
/// beside the record header (Linux 6.1 refused 64 bytes more there: "combined stack size of 3 calls
/// is 544. Too large"). Only SYN_SENT, which runs in `connect` (process context, never nested on
/// its CPU), writes it. One entry per CPU.
#[map]
pub static NEW_CONNECTION: PerCpuArray<PacketStream> = PerCpuArray::with_max_entries(1, 0);

/// Records the per-CPU progress of a packet's copy (`packet::copy_payload`), an entry per nesting
/// level as `SCRATCH`. Bound: `SCRATCH_SLOTS` entries per CPU.
#[map]
pub static PACKET_COPY: PerCpuArray<PacketCopy> = PerCpuArray::with_max_entries(SCRATCH_SLOTS, 0);

// Kernel-only values (never read by userspace, so not in `observer-records`).

/// Records where a packet's copy stands: its next payload byte in the packet, the bytes left to
/// copy, and the stream offset of that byte.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PacketCopy {
    pub position: u32,
    pub left: u32,
    pub offset: u64,
}

impl PacketCopy {
    /// Reads the progress from map memory.
    pub fn load(&self) -> Self {
        // SAFETY: `self` is a valid, aligned map value. Volatile: see `packet::copy_payload`.
        unsafe { core::ptr::read_volatile(self) }
    }

    /// Writes the progress back to map memory.
    pub fn store(&mut self, value: Self) {
        // SAFETY: as in `load`.
        unsafe { core::ptr::write_volatile(self, value) }
    }
}

/// Holds a `connect` in progress (`PENDING_CONNECTS` value).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PendingConnect {
    pub sock: u64,
    pub fd: u32,
    pub port_class: u8,
    pub _reserved: [u8; 3],
}

/// Holds the record being filled, and room behind it: the verifier only knows that the fill
/// position and the next copy's length are each below `CHUNK_SIZE`, so it wants a second chunk's
/// space after the payload (never written in practice: the copy stops at the end).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ChunkBuffer {
    pub record: DataRecord,
    pub slack: [u8; CHUNK_SIZE],
}

/// Says how the user buffers of an in-flight call are laid out (`IoCall::layout`): one plain
/// buffer.
pub const BUFFER_PLAIN: u8 = 0;
/// Says the call's buffers are a `struct iovec` array.
pub const BUFFER_IOVEC: u8 = 1;

/// Holds the arguments of a read or write in flight (`IN_FLIGHT` value).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IoCall {
    /// Plain: the buffer. Iovec: the `struct iovec` array.
    pub buffers: u64,
    /// Plain: the buffer's size. Iovec: number of entries.
    pub count: u64,
    pub fd: u32,
    pub direction: Direction,
    pub layout: u8,
    pub _reserved: [u8; 2],
}

/// Says whether userspace attached the packet programs rather than the syscall ones.
pub fn packet_hook() -> bool {
    CONFIG
        .get(0)
        .is_some_and(|config| config.capture_hook == CaptureHook::Packets as u32)
}

/// Passes an insert's result on, its failure counted (`MapInsertFailures`): a full table, never
/// silent.
///
/// # Errors
///
/// Fails with the map's error code when the insert failed.
pub fn insert_or_count(inserted: Result<(), i32>) -> Result<(), i64> {
    inserted.map_err(|err| {
        count(Counter::MapInsertFailures, 1);
        i64::from(err)
    })
}

/// Says whether the process `tgid` may own a watched descriptor (`WATCHING`).
pub fn may_be_watching(tgid: u32) -> bool {
    WATCHING
        .get(watching_slot(tgid))
        .is_some_and(|slot| *slot != 0)
}

/// Marks `tgid`'s slot of `WATCHING` once one of its descriptors is in `SOCKETS`.
pub fn mark_watching(tgid: u32) {
    if let Some(slot) = WATCHING.get_ptr_mut(watching_slot(tgid)) {
        // SAFETY: a live array value; every writer stores the same 1.
        unsafe { *slot = 1 };
    }
}

/// Says whether a thread of `pid_tgid`'s `CLAIMS` slot has a call in flight.
pub fn may_have_claim(pid_tgid: u64) -> bool {
    CLAIMS.get(claim_slot(pid_tgid)).is_some_and(|claims| {
        // SAFETY: a read of a live array value, which other CPUs update atomically.
        unsafe { core::ptr::read_volatile(claims) != 0 }
    })
}

/// Adds `delta` (`u64::MAX` to take one away) to the thread's `CLAIMS` slot, atomically: the
/// threads sharing a slot may run on other CPUs. The result is unused, so LLVM emits the plain
/// atomic add that every kernel since 5.8 verifies (no `BPF_FETCH`, which needs 5.12). The
/// intrinsic, because the BPF target has no compare-and-swap and so no `AtomicU64::fetch_add`.
pub fn add_claims(pid_tgid: u64, delta: u64) {
    if let Some(slot) = CLAIMS.get_ptr_mut(claim_slot(pid_tgid)) {
        // SAFETY: a live, aligned array value.
        let _ = unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(slot, delta) };
    }
}

fn claim_slot(pid_tgid: u64) -> u32 {
    (pid_tgid as u32) & (CLAIM_SLOTS - 1)
}

/// Adds `amount` to this CPU's slot of `counter`.
pub fn count(counter: Counter, amount: u64) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: this CPU's slot of a per-CPU array: no other writer.
        unsafe { *slot += amount };
    }
}
