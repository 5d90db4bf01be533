//! Captures payloads on the syscall side: the read and write entry points remember a call on a
//! watched descriptor, and its exit decides how much of what moved the port class's policy lets us
//! copy.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user},
    macros::tracepoint,
    programs::TracePointContext,
};
use observer_records::{
    CHUNK_SIZE, Counter, DEFAULT_GRPC_BUDGET, DEFAULT_GRPC_BUDGET_REFILL, Direction, PortClass,
    RecordKind,
};

use crate::{
    copy,
    maps::{
        BUFFER_IOVEC, BUFFER_PLAIN, Budget, CONFIG, CONNECTIONS, IN_FLIGHT, IoCall, SOCKETS,
        SocketKey, SocketState, add_claims, count, insert_or_count, may_be_watching,
        may_have_claim,
    },
    ring::{RecordTime, header_at, stamp_current},
    scope::current_task_in_scope,
    tracepoint::{
        MSGHDR_IOV, MSGHDR_IOVLEN, SYSCALL_ARG0, SYSCALL_ARG1, SYSCALL_ARG2, SYSCALL_RET,
    },
};

/// Says how a syscall passes its buffers (see `try_enter_io`).
const ARGUMENTS_BUFFER: u8 = 0;
const ARGUMENTS_IOVEC: u8 = 1;
const ARGUMENTS_MSGHDR: u8 = 2;

// Program entry points: thin wrappers, the work is in the `try_*` functions.

/// Enters `write(fd, buf, count)` and `sendto(fd, buf, len, …)`.
#[tracepoint]
pub fn sys_enter_send_buffer(ctx: TracePointContext) -> u32 {
    let _ = try_enter_io(&ctx, Direction::Send, ARGUMENTS_BUFFER);
    0
}

/// Enters `read(fd, buf, count)` and `recvfrom(fd, buf, len, …)`.
#[tracepoint]
pub fn sys_enter_recv_buffer(ctx: TracePointContext) -> u32 {
    let _ = try_enter_io(&ctx, Direction::Recv, ARGUMENTS_BUFFER);
    0
}

/// Enters `writev(fd, iov, iovcnt)`.
#[tracepoint]
pub fn sys_enter_send_iovec(ctx: TracePointContext) -> u32 {
    let _ = try_enter_io(&ctx, Direction::Send, ARGUMENTS_IOVEC);
    0
}

/// Enters `readv(fd, iov, iovcnt)`.
#[tracepoint]
pub fn sys_enter_recv_iovec(ctx: TracePointContext) -> u32 {
    let _ = try_enter_io(&ctx, Direction::Recv, ARGUMENTS_IOVEC);
    0
}

/// Enters `sendmsg(fd, msg, flags)`.
#[tracepoint]
pub fn sys_enter_sendmsg(ctx: TracePointContext) -> u32 {
    let _ = try_enter_io(&ctx, Direction::Send, ARGUMENTS_MSGHDR);
    0
}

/// Enters `recvmsg(fd, msg, flags)`.
#[tracepoint]
pub fn sys_enter_recvmsg(ctx: TracePointContext) -> u32 {
    let _ = try_enter_io(&ctx, Direction::Recv, ARGUMENTS_MSGHDR);
    0
}

/// Handles the exit of every read and write syscall above: copies what was actually transferred,
/// with `bpf_loop` (Linux 5.17+).
#[tracepoint]
pub fn sys_exit_io(ctx: TracePointContext) -> u32 {
    if try_sys_exit_io(&ctx) == Ok(true) {
        copy::walk_with_loop();
    }
    0
}

/// Handles the exit as `sys_exit_io` does, for kernels without `bpf_loop`: the copy goes on in tail
/// calls.
#[tracepoint]
pub fn sys_exit_io_bounded(ctx: TracePointContext) -> u32 {
    if try_sys_exit_io(&ctx) == Ok(true) {
        let _ = copy::walk_bounded(&ctx);
    }
    0
}

/// Remembers the arguments of a read or write on a watched socket until the syscall exits.
/// `arguments` says how the syscall passes its buffers: `ARGUMENTS_BUFFER` (buf, len),
/// `ARGUMENTS_IOVEC` (iov, iovcnt) or `ARGUMENTS_MSGHDR` (a msghdr holding an iovec array).
fn try_enter_io(ctx: &TracePointContext, direction: Direction, arguments: u8) -> Result<(), i64> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    // What a read or write of a process that owns no watched socket costs: an array read.
    if !may_be_watching(tgid) {
        return Ok(());
    }
    let fd: u64 = unsafe { ctx.read_at(SYSCALL_ARG0) }.map_err(i64::from)?;
    let key = SocketKey {
        tgid,
        fd: fd as u32,
    };
    // The one lookup an unwatched descriptor of such a process costs.
    let Some(state) = SOCKETS.get_ptr_mut(key) else {
        return Ok(());
    };
    if !current_task_in_scope() {
        return Ok(());
    };
    // Refresh the descriptor's copy of the connection while the socket is alive: the exit,
    // and the close, may come after a reset removed it (`SocketState::conn`).
    if let Some(conn) = unsafe { CONNECTIONS.get((*state).sock) } {
        // SAFETY: live map value; see `try_sys_exit_io` on concurrent calls.
        unsafe { (*state).conn = *conn };
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
    // By reference, as the connection tables' inserts (Linux 6.1's stack limit).
    #[expect(
        clippy::needless_borrows_for_generic_args,
        reason = "BPF stack size on Linux 6.1"
    )]
    let inserted = IN_FLIGHT.insert(&pid_tgid, &call, 0);
    insert_or_count(inserted)?;
    add_claims(pid_tgid, 1);
    Ok(())
}

/// Decides what of a finished call is copied and prepares the copy walk; returns whether there
/// is anything to walk.
fn try_sys_exit_io(ctx: &TracePointContext) -> Result<bool, i64> {
    let pid_tgid = bpf_get_current_pid_tgid();
    // What the exit of a call nobody claimed costs: an array read.
    if !may_have_claim(pid_tgid) {
        return Ok(false);
    }
    let Some(call) = (unsafe { IN_FLIGHT.get(pid_tgid) }).copied() else {
        return Ok(false);
    };
    let _ = IN_FLIGHT.remove(pid_tgid);
    add_claims(pid_tgid, u64::MAX);
    let transferred: i64 = unsafe { ctx.read_at(SYSCALL_RET) }.map_err(i64::from)?;
    if transferred <= 0 {
        return Ok(false);
    }
    let transferred = transferred as u64;
    let key = SocketKey {
        tgid: (pid_tgid >> 32) as u32,
        fd: call.fd,
    };
    // Closed by another thread while this call ran: nothing left to attribute it to.
    let Some(state) = SOCKETS.get_ptr_mut(key) else {
        return Ok(false);
    };
    // SAFETY: live map value; calls on one descriptor are in practice made by one thread at a
    // time, and a lost update here only shifts an offset, never memory safety.
    let state = unsafe { &mut *state };
    // Not `CONNECTIONS`: a peer's reset may have removed the socket since the call began, and
    // the bytes it moved must be recorded all the same.
    let conn = state.conn;

    let stream_offset = if call.direction == Direction::Send {
        state.sent
    } else {
        state.received
    };
    if call.direction == Direction::Send {
        state.sent += transferred;
    } else {
        state.received += transferred;
    }
    let mut time = RecordTime::unread();
    let capture = capture_allowance(state, call.direction, transferred, &mut time);
    if capture < transferred {
        count(Counter::BytesNotCaptured, transferred - capture);
    }
    if capture == 0 {
        return Ok(false);
    }

    let mut header = header_at(RecordKind::Data, state.sock, &conn, time.now());
    stamp_current(&mut header, pid_tgid);
    header.direction = call.direction as u8;
    header.call_len = transferred;
    header.offset = stream_offset;
    Ok(copy::begin(&call, header, capture, capture < transferred))
}

/// Returns how many of the `transferred` bytes the port class's policy lets us copy; a gRPC budget
/// reads the record's `time`.
fn capture_allowance(
    state: &mut SocketState,
    direction: Direction,
    transferred: u64,
    time: &mut RecordTime,
) -> u64 {
    if state.port_class == PortClass::WebSocket as u8 {
        // The upgrade request and its answer name the user; everything after them is chat.
        let done = if direction == Direction::Send {
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
    let budget = if direction == Direction::Send {
        &mut state.send_budget
    } else {
        &mut state.receive_budget
    };
    draw_grpc_budget(budget, transferred, time.now())
}

/// Draws up to `wanted` bytes at `now_ns` from a gRPC direction's budget, as configured, and
/// counts what it cuts (`BytesOverBudget`).
pub fn draw_grpc_budget(budget: &mut Budget, wanted: u64, now_ns: u64) -> u64 {
    let (burst, refill) = match CONFIG.get(0) {
        Some(config) => (config.grpc_budget, config.grpc_budget_refill),
        None => (DEFAULT_GRPC_BUDGET, DEFAULT_GRPC_BUDGET_REFILL),
    };
    let capture = draw(budget, u64::from(burst), u64::from(refill), now_ns, wanted);
    if capture < wanted {
        count(Counter::BytesOverBudget, wanted - capture);
    }
    capture
}

const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// Draws up to `wanted` bytes from a token bucket of `burst` bytes that regains `refill` bytes
/// per second (`refill` at most `MAX_GRPC_BUDGET_REFILL`, 2^30, so products stay below 2^64).
/// The bucket only ever cuts the tail of a call: once it refills, capture resumes at the start
/// of a later call, which is where the gap in offsets shows.
fn draw(budget: &mut Budget, burst: u64, refill: u64, now_ns: u64, wanted: u64) -> u64 {
    let elapsed = now_ns.saturating_sub(budget.settled_ns);
    let regained = if elapsed < 1 << 33 {
        // Below 2^33 ns × 2^30 bytes/s.
        elapsed * refill / NANOS_PER_SECOND
    } else {
        // Eight seconds or more: whole seconds, capped at 2^32, are precise enough.
        (elapsed / NANOS_PER_SECOND).min(1 << 32) * refill
    };
    // Time is settled once it has paid for a byte (or once the bucket is full, so a full
    // bucket does not bank time): a busy socket's calls a few nanoseconds apart each regain
    // less than a byte, and would otherwise regain nothing at all.
    if regained > 0 || budget.spent == 0 {
        budget.spent = budget.spent.saturating_sub(regained);
        budget.settled_ns = now_ns;
    }
    let capture = burst.saturating_sub(budget.spent).min(wanted);
    budget.spent += capture;
    capture
}
