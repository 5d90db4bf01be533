//! Payload capture, syscall side: the read and write entry points remember a call on a watched
//! descriptor, and its exit decides how much of what moved the port class's policy lets us copy.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user},
    macros::tracepoint,
    programs::TracePointContext,
};
use observer_records::{
    CHUNK_SIZE, Counter, DEFAULT_GRPC_BUDGET, Direction, PortClass, RecordKind,
};

use crate::{
    copy::copy_out,
    maps::{
        BUFFER_IOVEC, BUFFER_PLAIN, CONFIG, CONNECTIONS, IN_FLIGHT, IoCall, SOCKETS, SocketKey,
        SocketState, count, insert_or_count,
    },
    ring::{header_for, stamp_current},
    scope::current_task_in_scope,
    tracepoint::{
        MSGHDR_IOV, MSGHDR_IOVLEN, SYSCALL_ARG0, SYSCALL_ARG1, SYSCALL_ARG2, SYSCALL_RET,
    },
};

/// How a syscall passes its buffers (see `try_enter_io`).
const ARGUMENTS_BUFFER: u8 = 0;
const ARGUMENTS_IOVEC: u8 = 1;
const ARGUMENTS_MSGHDR: u8 = 2;

// Program entry points: thin wrappers, the work is in the `try_*` functions.

/// `write(fd, buf, count)` and `sendto(fd, buf, len, …)`.
#[tracepoint]
pub fn sys_enter_send_buffer(ctx: TracePointContext) -> u32 {
    let _ = try_enter_io(&ctx, Direction::Send, ARGUMENTS_BUFFER);
    0
}

/// `read(fd, buf, count)` and `recvfrom(fd, buf, len, …)`.
#[tracepoint]
pub fn sys_enter_recv_buffer(ctx: TracePointContext) -> u32 {
    let _ = try_enter_io(&ctx, Direction::Recv, ARGUMENTS_BUFFER);
    0
}

/// `writev(fd, iov, iovcnt)`.
#[tracepoint]
pub fn sys_enter_send_iovec(ctx: TracePointContext) -> u32 {
    let _ = try_enter_io(&ctx, Direction::Send, ARGUMENTS_IOVEC);
    0
}

/// `readv(fd, iov, iovcnt)`.
#[tracepoint]
pub fn sys_enter_recv_iovec(ctx: TracePointContext) -> u32 {
    let _ = try_enter_io(&ctx, Direction::Recv, ARGUMENTS_IOVEC);
    0
}

/// `sendmsg(fd, msg, flags)`.
#[tracepoint]
pub fn sys_enter_sendmsg(ctx: TracePointContext) -> u32 {
    let _ = try_enter_io(&ctx, Direction::Send, ARGUMENTS_MSGHDR);
    0
}

/// `recvmsg(fd, msg, flags)`.
#[tracepoint]
pub fn sys_enter_recvmsg(ctx: TracePointContext) -> u32 {
    let _ = try_enter_io(&ctx, Direction::Recv, ARGUMENTS_MSGHDR);
    0
}

/// The exit of every read and write syscall above: copies what was actually transferred.
#[tracepoint]
pub fn sys_exit_io(ctx: TracePointContext) -> u32 {
    let _ = try_sys_exit_io(&ctx);
    0
}

/// Remembers the arguments of a read or write on a watched socket until the syscall exits.
/// `arguments` says how the syscall passes its buffers: `ARGUMENTS_BUFFER` (buf, len),
/// `ARGUMENTS_IOVEC` (iov, iovcnt) or `ARGUMENTS_MSGHDR` (a msghdr holding an iovec array).
fn try_enter_io(ctx: &TracePointContext, direction: Direction, arguments: u8) -> Result<(), i64> {
    let fd: u64 = unsafe { ctx.read_at(SYSCALL_ARG0) }.map_err(i64::from)?;
    let pid_tgid = bpf_get_current_pid_tgid();
    let key = SocketKey {
        tgid: (pid_tgid >> 32) as u32,
        fd: fd as u32,
    };
    // The one lookup an unwatched descriptor costs.
    if unsafe { SOCKETS.get(key) }.is_none() || !current_task_in_scope() {
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
    let capture = capture_allowance(state, call.direction, stream_offset, transferred);
    if capture < transferred {
        count(Counter::BytesNotCaptured, transferred - capture);
    }
    if capture == 0 {
        return Ok(());
    }

    let mut header = header_for(RecordKind::Data, state.sock, &conn);
    stamp_current(&mut header, pid_tgid);
    header.direction = call.direction as u8;
    header.call_len = transferred;
    header.offset = stream_offset;
    copy_out(&call, header, capture, capture < transferred);
    Ok(())
}

/// How many of the `transferred` bytes at `stream_offset` the port class's policy lets us copy.
fn capture_allowance(
    state: &mut SocketState,
    direction: Direction,
    stream_offset: u64,
    transferred: u64,
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
    let budget = match CONFIG.get(0) {
        Some(config) => u64::from(config.grpc_budget),
        None => u64::from(DEFAULT_GRPC_BUDGET),
    };
    budget.saturating_sub(stream_offset).min(transferred)
}
