//! Kernel programs of the OpenIM observer: which TCP connections go to a watched gateway port,
//! and a bounded copy of the bytes their owners write and read.
//!
//! Tracepoints only (no kprobes: not every kernel we run on has CONFIG_KPROBES), all of them
//! present since 4.16, with maps and helpers of 5.8 (ring buffer).
//!
//! How a connection becomes watched:
//! 1. `sys_enter_connect` sees a sockaddr whose port is in `WATCHED_PORTS` and remembers the
//!    thread's (fd, port class) in `PENDING_CONNECTS`.
//! 2. `inet_sock_set_state` → SYN_SENT runs inside that `connect`, so the same thread is
//!    current: it ties the kernel socket to the thread's pending connect, records the owner in
//!    `CONNECTIONS` and emits `tcp_connect`.
//! 3. `sys_exit_connect` (0 or -EINPROGRESS) moves it to `SOCKETS`, keyed by (tgid, fd): from
//!    then on the process's reads and writes on that fd are captured under the port class's
//!    policy. A connect to a watched port over UDP never reaches step 2 and is dropped.
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_ktime_get_ns, bpf_probe_read_user,
        generated::bpf_probe_read_user as probe_read_user_raw,
    },
    macros::{map, tracepoint},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
    programs::TracePointContext,
};
use aya_log_ebpf::debug;
use observer_ebpf::{
    AF_INET, AF_INET6, CHUNK_SIZE, COUNTER_COUNT, CaptureConfig, Counter, DEFAULT_GRPC_BUDGET,
    DIRECTION_RECV, DIRECTION_SEND, DataRecord, FLAG_TRUNCATED, MAX_CHUNKS_PER_CALL, MAX_IOVECS,
    MAX_WATCHED_PORTS, PortClass, RecordHeader, RecordKind, TCP_CLOSE, TCP_SYN_SENT,
};

// ---------------------------------------------------------------------------------------------
// Maps. Every one is bounded; state that a dying process could leave behind lives in LRU maps.
// ---------------------------------------------------------------------------------------------

/// Records for userspace. Size set by userspace (`--ring-bytes`); a full ring is counted in
/// `Counter::RingFullDrops`, never silent.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(8 << 20, 0);

/// Remote port → `PortClass`, written by userspace before attaching. Bound: the number of
/// `--grpc-port`/`--ws-port` flags, at most `MAX_WATCHED_PORTS`.
#[map]
static WATCHED_PORTS: HashMap<u16, u8> = HashMap::with_max_entries(MAX_WATCHED_PORTS, 0);

/// Index 0: the `CaptureConfig` userspace wrote. One entry.
#[map]
static CONFIG: Array<CaptureConfig> = Array::with_max_entries(1, 0);

/// Per-CPU event counters, indexed by `Counter`; userspace sums the CPUs.
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_COUNT, 0);

/// Per-CPU scratch space for one data record: 4 KiB does not fit the 512-byte BPF stack.
/// One entry per CPU; a program runs to completion on its CPU, so nothing else touches it.
#[map]
static SCRATCH: PerCpuArray<DataRecord> = PerCpuArray::with_max_entries(1, 0);

/// Per-CPU position of the payload copy in progress (see `copy_out`). One entry per CPU.
#[map]
static CURSOR: PerCpuArray<CopyCursor> = PerCpuArray::with_max_entries(1, 0);

/// Threads inside `connect` to a watched port (pid_tgid → pending connect). An entry lives for
/// one syscall; LRU so a thread killed mid-call leaks nothing. Bound: concurrent connects.
#[map]
static PENDING_CONNECTS: LruHashMap<u64, PendingConnect> = LruHashMap::with_max_entries(4096, 0);

/// Watched kernel sockets (sock address → owner and 4-tuple). Removed at TCP_CLOSE; LRU for
/// sockets whose close we miss. Bound: watched connections alive at once.
#[map]
static CONNECTIONS: LruHashMap<u64, Connection> = LruHashMap::with_max_entries(16384, 0);

/// A process's descriptors of watched sockets ((tgid, fd) → capture state). Removed by
/// `close`; a process that exits closes its fds without the syscall, hence LRU.
#[map]
static SOCKETS: LruHashMap<SocketKey, SocketState> = LruHashMap::with_max_entries(16384, 0);

/// Threads inside a read or write on a watched socket (pid_tgid → the call's arguments), from
/// syscall entry to exit. LRU for threads killed mid-call. Bound: concurrent calls.
#[map]
static IN_FLIGHT: LruHashMap<u64, IoCall> = LruHashMap::with_max_entries(8192, 0);

// ---------------------------------------------------------------------------------------------
// Kernel-only state (never read by userspace, so not in the shared library).
// ---------------------------------------------------------------------------------------------

#[repr(C)]
#[derive(Clone, Copy)]
struct PendingConnect {
    sock: u64,
    fd: u32,
    port_class: u8,
    _reserved: [u8; 3],
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Connection {
    cgroup_id: u64,
    tgid: u32,
    sport: u16,
    dport: u16,
    family: u16,
    port_class: u8,
    _reserved: [u8; 5],
    saddr: [u8; 16],
    daddr: [u8; 16],
    comm: [u8; 16],
}

#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
struct SocketKey {
    tgid: u32,
    fd: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct SocketState {
    sock: u64,
    /// Stream positions: bytes moved so far in each direction, captured or not.
    sent: u64,
    received: u64,
    port_class: u8,
    /// WebSocket policy: the first send / first receive has been captured.
    ws_sent_done: u8,
    ws_received_done: u8,
    _reserved: [u8; 5],
}

/// How the user buffers of an in-flight call are laid out.
const BUFFER_PLAIN: u8 = 0;
const BUFFER_IOVEC: u8 = 1;

/// How a syscall passes its buffers (see `try_enter_io`).
const ARGUMENTS_BUFFER: u8 = 0;
const ARGUMENTS_IOVEC: u8 = 1;
const ARGUMENTS_MSGHDR: u8 = 2;

#[repr(C)]
#[derive(Clone, Copy)]
struct IoCall {
    /// Plain: the buffer. Iovec: the `struct iovec` array.
    buffers: u64,
    /// Plain: the buffer's size. Iovec: number of entries.
    count: u64,
    fd: u32,
    direction: u8,
    layout: u8,
    _reserved: [u8; 2],
}

/// Where `copy_out` is: the current user buffer, bytes left in it, bytes left to capture,
/// the next iovec entry and the stream offset of the next chunk.
#[repr(C)]
#[derive(Clone, Copy)]
struct CopyCursor {
    base: u64,
    left: u64,
    remaining: u64,
    next_iovec: u64,
    offset: u64,
}

impl CopyCursor {
    fn load(&self) -> Self {
        // SAFETY: `self` is a valid, aligned map value. Volatile: see `copy_out`.
        unsafe { core::ptr::read_volatile(self) }
    }

    fn store(&mut self, value: Self) {
        // SAFETY: as in `load`.
        unsafe { core::ptr::write_volatile(self, value) }
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Iovec {
    base: u64,
    len: u64,
}

// Offsets in the tracepoint records (see /sys/kernel/tracing/events/*/*/format). Syscall
// tracepoints: 8 bytes of common header, the syscall number, then every argument as 8 bytes.
const SYSCALL_ARG0: usize = 16;
const SYSCALL_ARG1: usize = 24;
const SYSCALL_ARG2: usize = 32;
const SYSCALL_RET: usize = 16;
// `sock/inet_sock_set_state`, unchanged since 4.16.
const SOCK_SKADDR: usize = 8;
const SOCK_OLDSTATE: usize = 16;
const SOCK_NEWSTATE: usize = 20;
const SOCK_SPORT: usize = 24;
const SOCK_DPORT: usize = 26;
const SOCK_FAMILY: usize = 28;
const SOCK_PROTOCOL: usize = 30;
const SOCK_SADDR: usize = 32;
const SOCK_DADDR: usize = 36;
const SOCK_SADDR_V6: usize = 40;
const SOCK_DADDR_V6: usize = 56;
// `struct user_msghdr` on 64-bit: msg_iov at 16, msg_iovlen at 24.
const MSGHDR_IOV: u64 = 16;
const MSGHDR_IOVLEN: u64 = 24;

const IPPROTO_TCP: u16 = 6;
// bpf_ringbuf_query / bpf_ringbuf_output flags (uapi/linux/bpf.h).
const BPF_RB_AVAIL_DATA: u64 = 0;
const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const EINPROGRESS: i64 = 115;

// ---------------------------------------------------------------------------------------------
// Program entry points: thin wrappers, the work is in the `try_*` functions.
// ---------------------------------------------------------------------------------------------

#[tracepoint]
pub fn sys_enter_connect(ctx: TracePointContext) -> u32 {
    let _ = try_sys_enter_connect(&ctx);
    0
}

#[tracepoint]
pub fn sys_exit_connect(ctx: TracePointContext) -> u32 {
    let _ = try_sys_exit_connect(&ctx);
    0
}

#[tracepoint]
pub fn inet_sock_set_state(ctx: TracePointContext) -> u32 {
    let _ = try_inet_sock_set_state(&ctx);
    0
}

#[tracepoint]
pub fn sys_enter_close(ctx: TracePointContext) -> u32 {
    let _ = try_sys_enter_close(&ctx);
    0
}

/// `write(fd, buf, count)` and `sendto(fd, buf, len, …)`.
#[tracepoint]
pub fn sys_enter_send_buffer(ctx: TracePointContext) -> u32 {
    let _ = try_enter_io(&ctx, DIRECTION_SEND, ARGUMENTS_BUFFER);
    0
}

/// `read(fd, buf, count)` and `recvfrom(fd, buf, len, …)`.
#[tracepoint]
pub fn sys_enter_recv_buffer(ctx: TracePointContext) -> u32 {
    let _ = try_enter_io(&ctx, DIRECTION_RECV, ARGUMENTS_BUFFER);
    0
}

/// `writev(fd, iov, iovcnt)`.
#[tracepoint]
pub fn sys_enter_send_iovec(ctx: TracePointContext) -> u32 {
    let _ = try_enter_io(&ctx, DIRECTION_SEND, ARGUMENTS_IOVEC);
    0
}

/// `readv(fd, iov, iovcnt)`.
#[tracepoint]
pub fn sys_enter_recv_iovec(ctx: TracePointContext) -> u32 {
    let _ = try_enter_io(&ctx, DIRECTION_RECV, ARGUMENTS_IOVEC);
    0
}

/// `sendmsg(fd, msg, flags)`.
#[tracepoint]
pub fn sys_enter_sendmsg(ctx: TracePointContext) -> u32 {
    let _ = try_enter_io(&ctx, DIRECTION_SEND, ARGUMENTS_MSGHDR);
    0
}

/// `recvmsg(fd, msg, flags)`.
#[tracepoint]
pub fn sys_enter_recvmsg(ctx: TracePointContext) -> u32 {
    let _ = try_enter_io(&ctx, DIRECTION_RECV, ARGUMENTS_MSGHDR);
    0
}

/// The exit of every read and write syscall above: copies what was actually transferred.
#[tracepoint]
pub fn sys_exit_io(ctx: TracePointContext) -> u32 {
    let _ = try_sys_exit_io(&ctx);
    0
}

// ---------------------------------------------------------------------------------------------
// Connection lifecycle.
// ---------------------------------------------------------------------------------------------

fn try_sys_enter_connect(ctx: &TracePointContext) -> Result<(), i64> {
    let fd: u64 = unsafe { ctx.read_at(SYSCALL_ARG0) }.map_err(i64::from)?;
    let sockaddr: u64 = unsafe { ctx.read_at(SYSCALL_ARG1) }.map_err(i64::from)?;
    // sockaddr_in and sockaddr_in6 both start with a u16 family and the big-endian port.
    let family: u16 = unsafe { bpf_probe_read_user(sockaddr as *const u16) }?;
    if family != AF_INET && family != AF_INET6 {
        return Ok(());
    }
    let port_be: u16 = unsafe { bpf_probe_read_user((sockaddr + 2) as *const u16) }?;
    let Some(class) = (unsafe { WATCHED_PORTS.get(u16::from_be(port_be)) }) else {
        return Ok(());
    };
    let pending = PendingConnect {
        sock: 0,
        fd: fd as u32,
        port_class: *class,
        _reserved: [0; 3],
    };
    insert_or_count(&PENDING_CONNECTS, &bpf_get_current_pid_tgid(), &pending)
}

fn try_sys_exit_connect(ctx: &TracePointContext) -> Result<(), i64> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(pending) = (unsafe { PENDING_CONNECTS.get(pid_tgid) }).copied() else {
        return Ok(());
    };
    let _ = PENDING_CONNECTS.remove(pid_tgid);
    let ret: i64 = unsafe { ctx.read_at(SYSCALL_RET) }.map_err(i64::from)?;
    // No SYN_SENT inside the call: not TCP, or it failed before the handshake.
    if pending.sock == 0 || (ret != 0 && ret != -EINPROGRESS) {
        return Ok(());
    }
    let key = SocketKey {
        tgid: (pid_tgid >> 32) as u32,
        fd: pending.fd,
    };
    let state = SocketState {
        sock: pending.sock,
        sent: 0,
        received: 0,
        port_class: pending.port_class,
        ws_sent_done: 0,
        ws_received_done: 0,
        _reserved: [0; 5],
    };
    insert_or_count(&SOCKETS, &key, &state)?;
    debug!(ctx, "watching fd {} of pid {}", key.fd, key.tgid);
    Ok(())
}

fn try_inet_sock_set_state(ctx: &TracePointContext) -> Result<(), i64> {
    let protocol: u16 = unsafe { ctx.read_at(SOCK_PROTOCOL) }.map_err(i64::from)?;
    if protocol != IPPROTO_TCP {
        return Ok(());
    }
    let sock: u64 = unsafe { ctx.read_at(SOCK_SKADDR) }.map_err(i64::from)?;
    let old_state: i32 = unsafe { ctx.read_at(SOCK_OLDSTATE) }.map_err(i64::from)?;
    let new_state: i32 = unsafe { ctx.read_at(SOCK_NEWSTATE) }.map_err(i64::from)?;
    let new_state = new_state as u32;

    if new_state == TCP_SYN_SENT {
        return on_syn_sent(ctx, sock);
    }
    let Some(conn) = CONNECTIONS.get_ptr_mut(sock) else {
        return Ok(());
    };
    // SAFETY: the pointer is a live map value; only this socket's state changes write it,
    // and the kernel serialises those under the socket lock.
    let conn = unsafe { &mut *conn };
    // The source port is chosen after SYN_SENT is set (inet_hash_connect), so the 4-tuple is
    // only complete from the next state on: refresh it every time.
    read_tuple(ctx, conn)?;
    let mut header = header_for(RecordKind::TcpState, sock, conn);
    header.old_state = old_state as u32;
    header.new_state = new_state;
    output_header(&header);
    if new_state == TCP_CLOSE {
        let _ = CONNECTIONS.remove(sock);
    }
    Ok(())
}

/// SYN_SENT fires inside `connect`: the connecting thread is current, and if it is connecting
/// to a watched port, its pending connect is waiting for this socket.
fn on_syn_sent(ctx: &TracePointContext, sock: u64) -> Result<(), i64> {
    let dport: u16 = unsafe { ctx.read_at(SOCK_DPORT) }.map_err(i64::from)?;
    if unsafe { WATCHED_PORTS.get(dport) }.is_none() {
        return Ok(());
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(pending) = PENDING_CONNECTS.get_ptr_mut(pid_tgid) else {
        return Ok(());
    };
    // SAFETY: live map value owned by the current thread's connect.
    let pending = unsafe { &mut *pending };
    pending.sock = sock;
    let mut conn = Connection {
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        tgid: (pid_tgid >> 32) as u32,
        sport: 0,
        dport,
        family: 0,
        port_class: pending.port_class,
        _reserved: [0; 5],
        saddr: [0; 16],
        daddr: [0; 16],
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    };
    read_tuple(ctx, &mut conn)?;
    let mut header = header_for(RecordKind::TcpConnect, sock, &conn);
    header.new_state = TCP_SYN_SENT;
    insert_or_count(&CONNECTIONS, &sock, &conn)?;
    output_header(&header);
    Ok(())
}

fn read_tuple(ctx: &TracePointContext, conn: &mut Connection) -> Result<(), i64> {
    conn.family = unsafe { ctx.read_at(SOCK_FAMILY) }.map_err(i64::from)?;
    conn.sport = unsafe { ctx.read_at(SOCK_SPORT) }.map_err(i64::from)?;
    conn.dport = unsafe { ctx.read_at(SOCK_DPORT) }.map_err(i64::from)?;
    if conn.family == AF_INET6 {
        conn.saddr = unsafe { ctx.read_at(SOCK_SADDR_V6) }.map_err(i64::from)?;
        conn.daddr = unsafe { ctx.read_at(SOCK_DADDR_V6) }.map_err(i64::from)?;
    } else {
        let saddr: [u8; 4] = unsafe { ctx.read_at(SOCK_SADDR) }.map_err(i64::from)?;
        let daddr: [u8; 4] = unsafe { ctx.read_at(SOCK_DADDR) }.map_err(i64::from)?;
        conn.saddr[..4].copy_from_slice(&saddr);
        conn.daddr[..4].copy_from_slice(&daddr);
    }
    Ok(())
}

fn try_sys_enter_close(ctx: &TracePointContext) -> Result<(), i64> {
    let fd: u64 = unsafe { ctx.read_at(SYSCALL_ARG0) }.map_err(i64::from)?;
    let pid_tgid = bpf_get_current_pid_tgid();
    let key = SocketKey {
        tgid: (pid_tgid >> 32) as u32,
        fd: fd as u32,
    };
    let Some(state) = (unsafe { SOCKETS.get(key) }).copied() else {
        return Ok(());
    };
    let _ = SOCKETS.remove(key);
    if let Some(conn) = unsafe { CONNECTIONS.get(state.sock) } {
        let mut header = header_for(RecordKind::Close, state.sock, conn);
        stamp_current(&mut header, pid_tgid);
        output_header(&header);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Payload capture.
// ---------------------------------------------------------------------------------------------

/// Remembers the arguments of a read or write on a watched socket until the syscall exits.
/// `arguments` says how the syscall passes its buffers: `ARGUMENTS_BUFFER` (buf, len),
/// `ARGUMENTS_IOVEC` (iov, iovcnt) or `ARGUMENTS_MSGHDR` (a msghdr holding an iovec array).
fn try_enter_io(ctx: &TracePointContext, direction: u8, arguments: u8) -> Result<(), i64> {
    let fd: u64 = unsafe { ctx.read_at(SYSCALL_ARG0) }.map_err(i64::from)?;
    let pid_tgid = bpf_get_current_pid_tgid();
    let key = SocketKey {
        tgid: (pid_tgid >> 32) as u32,
        fd: fd as u32,
    };
    // The one lookup an unwatched descriptor costs.
    if unsafe { SOCKETS.get(key) }.is_none() {
        return Ok(());
    }
    let first: u64 = unsafe { ctx.read_at(SYSCALL_ARG1) }.map_err(i64::from)?;
    let (buffers, count, layout) = if arguments == ARGUMENTS_MSGHDR {
        // The iovec array is read at entry: the msghdr is the caller's and stays valid, but
        // reading it once here keeps the exit path identical for every syscall.
        let iov: u64 = unsafe { bpf_probe_read_user((first + MSGHDR_IOV) as *const u64) }?;
        let iovlen: u64 = unsafe { bpf_probe_read_user((first + MSGHDR_IOVLEN) as *const u64) }?;
        (iov, iovlen, BUFFER_IOVEC)
    } else {
        let second: u64 = unsafe { ctx.read_at(SYSCALL_ARG2) }.map_err(i64::from)?;
        let layout = if arguments == ARGUMENTS_IOVEC {
            BUFFER_IOVEC
        } else {
            BUFFER_PLAIN
        };
        (first, second, layout)
    };
    let call = IoCall {
        buffers,
        count,
        fd: fd as u32,
        direction,
        layout,
        _reserved: [0; 2],
    };
    insert_or_count(&IN_FLIGHT, &pid_tgid, &call)
}

fn try_sys_exit_io(ctx: &TracePointContext) -> Result<(), i64> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(call) = (unsafe { IN_FLIGHT.get(pid_tgid) }).copied() else {
        return Ok(());
    };
    let _ = IN_FLIGHT.remove(pid_tgid);
    let transferred: i64 = unsafe { ctx.read_at(SYSCALL_RET) }.map_err(i64::from)?;
    if transferred <= 0 {
        return Ok(());
    }
    let transferred = transferred as u64;
    let key = SocketKey {
        tgid: (pid_tgid >> 32) as u32,
        fd: call.fd,
    };
    // Closed by another thread while this call ran: nothing left to attribute it to.
    let Some(state) = SOCKETS.get_ptr_mut(key) else {
        return Ok(());
    };
    // SAFETY: live map value; calls on one descriptor are in practice made by one thread at a
    // time, and a lost update here only shifts an offset, never memory safety.
    let state = unsafe { &mut *state };
    let Some(conn) = (unsafe { CONNECTIONS.get(state.sock) }).copied() else {
        return Ok(());
    };

    let stream_offset = if call.direction == DIRECTION_SEND {
        state.sent
    } else {
        state.received
    };
    if call.direction == DIRECTION_SEND {
        state.sent += transferred;
    } else {
        state.received += transferred;
    }
    let capture = capture_allowance(state, call.direction, stream_offset, transferred);
    if capture < transferred {
        count(Counter::BytesNotCaptured, transferred - capture);
    }
    if capture == 0 {
        return Ok(());
    }

    let mut header = header_for(RecordKind::Data, state.sock, &conn);
    stamp_current(&mut header, pid_tgid);
    header.direction = call.direction;
    header.call_len = transferred;
    header.offset = stream_offset;
    copy_out(&call, header, capture, capture < transferred);
    Ok(())
}

/// How many of the `transferred` bytes at `stream_offset` the port class's policy lets us copy.
fn capture_allowance(
    state: &mut SocketState,
    direction: u8,
    stream_offset: u64,
    transferred: u64,
) -> u64 {
    if state.port_class == PortClass::WebSocket as u8 {
        // The upgrade request and its answer name the user; everything after them is chat.
        let done = if direction == DIRECTION_SEND {
            &mut state.ws_sent_done
        } else {
            &mut state.ws_received_done
        };
        if *done != 0 {
            return 0;
        }
        *done = 1;
        return transferred.min(CHUNK_SIZE as u64);
    }
    let budget = match CONFIG.get(0) {
        Some(config) => u64::from(config.grpc_budget),
        None => u64::from(DEFAULT_GRPC_BUDGET),
    };
    budget.saturating_sub(stream_offset).min(transferred)
}

/// Copies the first `capture` bytes of the call's buffers to the ring, `CHUNK_SIZE` at a time.
///
/// One bounded loop walks both the iovec array and the chunks inside each entry: a step either
/// loads the next iovec or emits one chunk.
///
/// Verifier: with the walk's state (`CopyCursor`) in registers, every iteration forked the
/// paths of the previous one (min of two unknowns, error exits, …) and the verifier gave up at
/// "processed 1000001 insns (limit 1000000)". The state therefore lives in per-CPU map memory,
/// read and written with volatile accesses so LLVM cannot keep it in registers: the verifier
/// does not track map contents, so the paths of one iteration converge at the loop head and
/// are pruned, and the cost grows linearly with the bound.
fn copy_out(call: &IoCall, header: RecordHeader, capture: u64, truncated: bool) {
    let (Some(scratch), Some(cursor)) = (SCRATCH.get_ptr_mut(0), CURSOR.get_ptr_mut(0)) else {
        return;
    };
    // SAFETY: this CPU's entries; a program runs to completion on its CPU, and no other
    // program of ours uses them.
    let (scratch, cursor) = unsafe { (&mut *scratch, &mut *cursor) };
    scratch.header = header;
    let plain = call.layout == BUFFER_PLAIN;
    cursor.store(CopyCursor {
        base: if plain { call.buffers } else { 0 },
        left: if plain { call.count } else { 0 },
        remaining: capture,
        next_iovec: 0,
        offset: header.offset,
    });
    let iovec_count = call.count.min(MAX_IOVECS as u64);

    for _ in 0..(MAX_CHUNKS_PER_CALL + MAX_IOVECS) {
        let mut step = cursor.load();
        if step.remaining == 0 {
            break;
        }
        if step.left == 0 {
            if plain || step.next_iovec >= iovec_count {
                break;
            }
            let entry = call.buffers + step.next_iovec * core::mem::size_of::<Iovec>() as u64;
            let Ok(iovec) = (unsafe { bpf_probe_read_user(entry as *const Iovec) }) else {
                count(Counter::UserReadFailures, 1);
                break;
            };
            step.next_iovec += 1;
            step.base = iovec.base;
            step.left = iovec.len;
            cursor.store(step);
            continue;
        }
        let wanted = step.left.min(step.remaining).min(CHUNK_SIZE as u64);
        // Bound the size again on the very register the helper receives (a no-op after the
        // `min`): otherwise LLVM may pass a copy whose range the verifier no longer knows
        // ("R2 unbounded memory access").
        let len = (wanted as u32) & (2 * CHUNK_SIZE as u32 - 1);
        if len == 0 || len > CHUNK_SIZE as u32 {
            break;
        }
        let read = unsafe {
            probe_read_user_raw(
                scratch.payload.as_mut_ptr().cast(),
                len,
                step.base as *const core::ffi::c_void,
            )
        };
        if read != 0 {
            count(Counter::UserReadFailures, 1);
            break;
        }
        step.remaining -= u64::from(len);
        step.left -= u64::from(len);
        step.base += u64::from(len);
        scratch.header.len = len;
        scratch.header.offset = step.offset;
        scratch.header.flags = if truncated && step.remaining == 0 {
            FLAG_TRUNCATED
        } else {
            0
        };
        step.offset += u64::from(len);
        cursor.store(step);
        output_data(scratch);
    }
    let left_over = cursor.load().remaining;
    if left_over > 0 {
        // Past the chunk or iovec bound, or unreadable: the gap shows in the next offset.
        count(Counter::BytesNotCaptured, left_over);
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------------------------

fn header_for(kind: RecordKind, sock: u64, conn: &Connection) -> RecordHeader {
    RecordHeader {
        ts_ns: unsafe { bpf_ktime_get_ns() },
        sock,
        cgroup_id: conn.cgroup_id,
        offset: 0,
        call_len: 0,
        tgid: conn.tgid,
        len: 0,
        old_state: 0,
        new_state: 0,
        sport: conn.sport,
        dport: conn.dport,
        family: conn.family,
        kind: kind as u8,
        direction: 0,
        flags: 0,
        port_class: conn.port_class,
        _reserved: [0; 6],
        saddr: conn.saddr,
        daddr: conn.daddr,
        comm: conn.comm,
    }
}

/// Records made in a syscall name the calling process, which may differ from the connecting
/// one (a forked child, a descriptor passed over a unix socket).
fn stamp_current(header: &mut RecordHeader, pid_tgid: u64) {
    header.tgid = (pid_tgid >> 32) as u32;
    header.cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    if let Ok(comm) = bpf_get_current_comm() {
        header.comm = comm;
    }
}

fn output_header(header: &RecordHeader) {
    if EVENTS
        .output::<RecordHeader>(header, wakeup_flags())
        .is_err()
    {
        count(Counter::RingFullDrops, 1);
    }
}

/// Wakes the reader only once enough bytes wait (see `CaptureConfig::wakeup_bytes`).
fn wakeup_flags() -> u64 {
    let threshold = match CONFIG.get(0) {
        Some(config) => u64::from(config.wakeup_bytes),
        None => 0,
    };
    if EVENTS.query(BPF_RB_AVAIL_DATA) >= threshold {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

fn output_data(record: &DataRecord) {
    let size = core::mem::size_of::<RecordHeader>() + record.header.len as usize;
    if size > core::mem::size_of::<DataRecord>() {
        return;
    }
    // SAFETY: `size` is within the record (checked above), which lives in the scratch map.
    let bytes =
        unsafe { core::slice::from_raw_parts((record as *const DataRecord).cast::<u8>(), size) };
    if EVENTS.output::<[u8]>(bytes, wakeup_flags()).is_err() {
        count(Counter::RingFullDrops, 1);
    }
}

fn insert_or_count<K, V>(map: &LruHashMap<K, V>, key: &K, value: &V) -> Result<(), i64> {
    map.insert(key, value, 0).map_err(|err| {
        count(Counter::MapInsertFailures, 1);
        i64::from(err)
    })
}

fn count(counter: Counter, amount: u64) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: this CPU's slot of a per-CPU array: no other writer.
        unsafe { *slot += amount };
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
