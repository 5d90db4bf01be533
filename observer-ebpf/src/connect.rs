//! Follows the connection lifecycle: which sockets are watched, from `connect` to `close`.

use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_probe_read_kernel, bpf_probe_read_user,
    },
    macros::{raw_tracepoint, tracepoint},
    programs::{RawTracePointContext, TracePointContext},
};
use aya_log_ebpf::debug;
use observer_records::{AF_INET, AF_INET6, IPPROTO_TCP, RecordKind, SockLayout, TcpState};

use crate::{
    maps::{
        Budget, CONFIG, CONNECTIONS, Connection, NEW_CONNECTION, PACKET_STREAMS, PENDING_CONNECTS,
        PacketStream, PendingConnect, SOCKETS, SocketKey, SocketState, insert_or_count,
        mark_watching, may_be_watching, packet_hook, watched_port,
    },
    ring::{header_for, output_header, stamp_current},
    scope::current_task_in_scope,
    tracepoint::{
        EINPROGRESS, SOCK_DADDR, SOCK_DADDR_V6, SOCK_DPORT, SOCK_FAMILY, SOCK_NEWSTATE,
        SOCK_OLDSTATE, SOCK_PROTOCOL, SOCK_SADDR, SOCK_SADDR_V6, SOCK_SKADDR, SOCK_SPORT,
        SYSCALL_ARG0, SYSCALL_ARG1, SYSCALL_RET,
    },
};

// Program entry points: thin wrappers, the work is in the `try_*` functions.

/// Enters `connect(fd, addr, addrlen)`: remembers a connect to a watched port in
/// `PENDING_CONNECTS`.
#[tracepoint]
pub fn sys_enter_connect(ctx: TracePointContext) -> u32 {
    let _ = try_sys_enter_connect(&ctx);
    0
}

/// Handles the exit of `connect`: moves a connect that reached SYN_SENT and succeeded (or is in
/// progress) to `SOCKETS`.
#[tracepoint]
pub fn sys_exit_connect(ctx: TracePointContext) -> u32 {
    let _ = try_sys_exit_connect(&ctx);
    0
}

/// Handles TCP state changes from the formatted tracepoint, where the kernel has no BTF to find
/// `struct sock`'s fields in. Attached through perf_event_open, which a
/// `kernel.perf_event_paranoid` above 2 refuses without CAP_SYS_ADMIN on Debian's kernels.
#[tracepoint]
pub fn inet_sock_set_state(ctx: TracePointContext) -> u32 {
    let _ = try_inet_sock_set_state(&FormattedRecord(&ctx));
    0
}

/// Handles the same changes from the raw tracepoint (its arguments: the socket, the old state, the
/// new one), reading the socket at the offsets userspace found in the kernel's BTF. Attached with
/// BPF_RAW_TRACEPOINT_OPEN, which needs no perf event: this is what lets the packet hook run
/// without CAP_SYS_ADMIN whatever `perf_event_paranoid` says, and it skips the formatted record the
/// kernel would build for each state change.
#[raw_tracepoint(tracepoint = "inet_sock_set_state")]
pub fn raw_sock_state(ctx: RawTracePointContext) -> u32 {
    let _ = try_raw_sock_state(&ctx);
    0
}

/// Enters `close(fd)`: forgets the process's watched descriptor `fd` (`SOCKETS`) and sends its
/// close record.
#[tracepoint]
pub fn sys_enter_close(ctx: TracePointContext) -> u32 {
    let _ = try_sys_enter_close(&ctx);
    0
}

fn try_sys_enter_connect(ctx: &TracePointContext) -> Result<(), i64> {
    let fd: u64 = unsafe { ctx.read_at(SYSCALL_ARG0) }.map_err(i64::from)?;
    let sockaddr: u64 = unsafe { ctx.read_at(SYSCALL_ARG1) }.map_err(i64::from)?;
    // sockaddr_in and sockaddr_in6 both start with a u16 family and the big-endian port.
    let family: u16 = unsafe { bpf_probe_read_user(sockaddr as *const u16) }?;
    if family != AF_INET && family != AF_INET6 {
        return Ok(());
    }
    let port_be: u16 = unsafe { bpf_probe_read_user((sockaddr + 2) as *const u16) }?;
    let Some(class) = watched_port(u16::from_be(port_be)) else {
        return Ok(());
    };
    // After the port test: only connects to watched ports pay for the cgroup test.
    if !current_task_in_scope() {
        return Ok(());
    }
    let pending = PendingConnect {
        sock: 0,
        fd: fd as u32,
        port_class: class,
        _reserved: [0; 3],
    };
    insert_or_count(PENDING_CONNECTS.insert(bpf_get_current_pid_tgid(), pending, 0))
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
    // Inserted at SYN_SENT; gone already if the connection failed inside the call, or was
    // reset between its success and this exit (then it is not watched: nothing names it).
    let Some(conn) = (unsafe { CONNECTIONS.get(pending.sock) }).copied() else {
        return Ok(());
    };
    let state = SocketState {
        sock: pending.sock,
        sent: 0,
        received: 0,
        send_budget: Budget::default(),
        receive_budget: Budget::default(),
        conn,
        port_class: pending.port_class,
        ws_sent_done: 0,
        ws_received_done: 0,
        _reserved: [0; 5],
    };
    // By reference: by value, the 144-byte state is copied onto this frame as well, past what
    // Linux 6.1's verifier allows the call chain ("combined stack size of 3 calls is 544").
    #[expect(
        clippy::needless_borrows_for_generic_args,
        reason = "BPF stack size on Linux 6.1"
    )]
    let inserted = SOCKETS.insert(&key, &state, 0);
    insert_or_count(inserted)?;
    mark_watching(key.tgid);
    debug!(ctx, "watching fd {} of pid {}", key.fd, key.tgid);
    Ok(())
}

fn try_raw_sock_state(ctx: &RawTracePointContext) -> Result<(), i64> {
    let layout = &CONFIG.get(0).ok_or(0)?.sock_layout;
    // Arguments are 64-bit slots; the states are `int`s.
    let change = SocketFields {
        sock: ctx.arg::<u64>(0),
        old_state: ctx.arg::<u64>(1) as i32,
        new_state: ctx.arg::<u64>(2) as i32,
        layout,
    };
    try_inet_sock_set_state(&change)
}

fn try_inet_sock_set_state(change: &impl StateChange) -> Result<(), i64> {
    let (old_state, new_state) = change.states()?;
    let new_state = new_state as u32;
    // Three changes of a watched socket matter: SYN_SENT (its owner), ESTABLISHED (its 4-tuple
    // complete: the source port is chosen after SYN_SENT) and CLOSE (its end). The others
    // (FIN_WAIT1, FIN_WAIT2, CLOSE_WAIT, LAST_ACK, …) stop here, before anything is read. With
    // the packet hook ESTABLISHED stops here too: the packet programs take the source port
    // from the connection's first packet (its SYN), which spares every connection of the node
    // this run's reads, and every watched one a record.
    let connecting = new_state == TcpState::SynSent as u32;
    let packet_hook = packet_hook();
    let wanted = connecting
        || new_state == TcpState::Close as u32
        || (new_state == TcpState::Established as u32 && !packet_hook);
    if !wanted {
        return Ok(());
    }
    if change.protocol()? != u16::from(IPPROTO_TCP) {
        return Ok(());
    }
    // Only a socket connecting to a watched port is ever watched: one array read turns the
    // others (every accepted socket among them) away before the table lookup.
    let dport = change.dport()?;
    let Some(class) = watched_port(dport) else {
        return Ok(());
    };
    let sock = change.sock()?;
    if connecting {
        return on_syn_sent(change, sock, dport, class);
    }
    let conn = if packet_hook {
        let stream = PACKET_STREAMS.get_ptr_mut(sock).ok_or(0)?;
        // SAFETY: a field of a live map value.
        unsafe { core::ptr::addr_of_mut!((*stream).conn) }
    } else {
        CONNECTIONS.get_ptr_mut(sock).ok_or(0)?
    };
    // SAFETY: the pointer is into a live map value; only this socket's state changes write
    // it, and the kernel serialises those under the socket lock.
    let conn = unsafe { &mut *conn };
    // The source port is chosen after SYN_SENT is set (inet_hash_connect), so the 4-tuple is
    // complete from the next state on: ESTABLISHED, or CLOSE for a connect that failed (or,
    // with the packet hook, one whose SYN never left).
    if new_state == TcpState::Established as u32 || conn.sport == 0 {
        read_tuple(change, conn)?;
    }
    let mut header = header_for(RecordKind::TcpState, sock, conn);
    header.old_state = old_state as u32;
    header.new_state = new_state;
    output_header(&header);
    if new_state == TcpState::Close as u32 {
        let _ = if packet_hook {
            PACKET_STREAMS.remove(sock)
        } else {
            CONNECTIONS.remove(sock)
        };
    }
    Ok(())
}

/// Says what a TCP state change tells: read from the formatted tracepoint's record, or from the
/// socket the raw tracepoint hands over. Ports in host order, addresses as the wire has them.
trait StateChange {
    /// Returns the socket's address, by which `CONNECTIONS`, `PACKET_STREAMS` and the packet
    /// programs know it.
    fn sock(&self) -> Result<u64, i64>;
    /// Returns the old state and the new one.
    fn states(&self) -> Result<(i32, i32), i64>;
    fn protocol(&self) -> Result<u16, i64>;
    fn family(&self) -> Result<u16, i64>;
    fn sport(&self) -> Result<u16, i64>;
    fn dport(&self) -> Result<u16, i64>;
    fn saddr(&self) -> Result<[u8; 4], i64>;
    fn daddr(&self) -> Result<[u8; 4], i64>;
    fn saddr_v6(&self) -> Result<[u8; 16], i64>;
    fn daddr_v6(&self) -> Result<[u8; 16], i64>;
}

/// Reads `sock/inet_sock_set_state`'s formatted record (offsets checked against tracefs at start).
struct FormattedRecord<'a>(&'a TracePointContext);

impl FormattedRecord<'_> {
    fn read<T>(&self, offset: usize) -> Result<T, i64> {
        // SAFETY: a read the helper bounds-checks, at offsets userspace checked against this
        // kernel's tracefs before loading.
        unsafe { self.0.read_at(offset) }.map_err(i64::from)
    }
}

impl StateChange for FormattedRecord<'_> {
    fn sock(&self) -> Result<u64, i64> {
        self.read(SOCK_SKADDR)
    }
    fn states(&self) -> Result<(i32, i32), i64> {
        Ok((self.read(SOCK_OLDSTATE)?, self.read(SOCK_NEWSTATE)?))
    }
    fn protocol(&self) -> Result<u16, i64> {
        self.read(SOCK_PROTOCOL)
    }
    fn family(&self) -> Result<u16, i64> {
        self.read(SOCK_FAMILY)
    }
    fn sport(&self) -> Result<u16, i64> {
        self.read(SOCK_SPORT)
    }
    fn dport(&self) -> Result<u16, i64> {
        self.read(SOCK_DPORT)
    }
    fn saddr(&self) -> Result<[u8; 4], i64> {
        self.read(SOCK_SADDR)
    }
    fn daddr(&self) -> Result<[u8; 4], i64> {
        self.read(SOCK_DADDR)
    }
    fn saddr_v6(&self) -> Result<[u8; 16], i64> {
        self.read(SOCK_SADDR_V6)
    }
    fn daddr_v6(&self) -> Result<[u8; 16], i64> {
        self.read(SOCK_DADDR_V6)
    }
}

/// Holds the raw tracepoint's arguments, and the socket's own fields where `layout` says they are.
struct SocketFields<'a> {
    sock: u64,
    old_state: i32,
    new_state: i32,
    layout: &'a SockLayout,
}

impl SocketFields<'_> {
    fn read<T>(&self, offset: u16) -> Result<T, i64> {
        // SAFETY: a read of kernel memory the helper checks; the socket outlives its
        // tracepoint, which runs under its lock.
        unsafe { bpf_probe_read_kernel((self.sock + u64::from(offset)) as *const T) }
            .map_err(i64::from)
    }
}

impl StateChange for SocketFields<'_> {
    fn sock(&self) -> Result<u64, i64> {
        Ok(self.sock)
    }
    fn states(&self) -> Result<(i32, i32), i64> {
        Ok((self.old_state, self.new_state))
    }
    fn protocol(&self) -> Result<u16, i64> {
        self.read(self.layout.protocol)
    }
    fn family(&self) -> Result<u16, i64> {
        self.read(self.layout.family)
    }
    fn sport(&self) -> Result<u16, i64> {
        self.read(self.layout.sport).map(u16::from_be)
    }
    fn dport(&self) -> Result<u16, i64> {
        self.read(self.layout.dport).map(u16::from_be)
    }
    fn saddr(&self) -> Result<[u8; 4], i64> {
        self.read(self.layout.saddr)
    }
    fn daddr(&self) -> Result<[u8; 4], i64> {
        self.read(self.layout.daddr)
    }
    fn saddr_v6(&self) -> Result<[u8; 16], i64> {
        self.read(self.layout.v6_rcv_saddr)
    }
    fn daddr_v6(&self) -> Result<[u8; 16], i64> {
        self.read(self.layout.v6_daddr)
    }
}

/// Handles SYN_SENT, which fires inside `connect`: the connecting thread is current. The socket
/// connects to `dport`, watched as `class`: with the syscall hook, its pending connect is waiting
/// for this socket; with the packet hook nothing waits, and the scope decides here.
fn on_syn_sent(change: &impl StateChange, sock: u64, dport: u16, class: u8) -> Result<(), i64> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let packet_hook = packet_hook();
    let port_class = if packet_hook {
        if !current_task_in_scope() {
            return Ok(());
        }
        class
    } else {
        let Some(pending) = PENDING_CONNECTS.get_ptr_mut(pid_tgid) else {
            return Ok(());
        };
        // SAFETY: live map value owned by the current thread's connect.
        let pending = unsafe { &mut *pending };
        pending.sock = sock;
        pending.port_class
    };
    let entry = NEW_CONNECTION.get_ptr_mut(0).ok_or(0)?;
    // SAFETY: this CPU's slot, written only here, in process context (see `NEW_CONNECTION`).
    let entry = unsafe { &mut *entry };
    // Neither SYN seen yet.
    entry.send = PacketStream::NEW.send;
    entry.recv = PacketStream::NEW.recv;
    let conn = &mut entry.conn;
    conn.cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    conn.tgid = (pid_tgid >> 32) as u32;
    conn.dport = dport;
    conn.port_class = port_class;
    conn.comm = bpf_get_current_comm().unwrap_or([0; 16]);
    read_tuple(change, conn)?;
    let mut header = header_for(RecordKind::TcpConnect, sock, conn);
    header.new_state = TcpState::SynSent as u32;
    // Before the SYN leaves: `connect` sends it after this state change. By reference: by
    // value, the entry would be copied onto the stack it is kept off (`NEW_CONNECTION`).
    let inserted = if packet_hook {
        PACKET_STREAMS.insert(sock, entry, 0)
    } else {
        #[expect(
            clippy::needless_borrows_for_generic_args,
            reason = "BPF stack size on Linux 6.1"
        )]
        CONNECTIONS.insert(sock, &entry.conn, 0)
    };
    insert_or_count(inserted)?;
    output_header(&header);
    Ok(())
}

fn read_tuple(change: &impl StateChange, conn: &mut Connection) -> Result<(), i64> {
    conn.family = change.family()?;
    conn.sport = change.sport()?;
    conn.dport = change.dport()?;
    if conn.family == AF_INET6 {
        let daddr_v6 = change.daddr_v6()?;
        if !is_ipv4_mapped(&daddr_v6) {
            conn.saddr = change.saddr_v6()?;
            conn.daddr = daddr_v6;
            return Ok(());
        }
    }
    // IPv4, or a dual-stack socket reaching an IPv4 peer (`::ffff:a.b.c.d`): one identity per
    // endpoint, whichever socket family reached it, so it is recorded as IPv4. The socket's
    // IPv4 fields hold the same addresses then.
    conn.family = AF_INET;
    conn.saddr = [0; 16];
    conn.daddr = [0; 16];
    conn.saddr[..4].copy_from_slice(&change.saddr()?);
    conn.daddr[..4].copy_from_slice(&change.daddr()?);
    Ok(())
}

/// Says whether `address` is in `::ffff:0:0/96`, IPv4 addresses as a dual-stack socket spells them.
fn is_ipv4_mapped(address: &[u8; 16]) -> bool {
    address[..10] == [0; 10] && address[10] == 0xff && address[11] == 0xff
}

fn try_sys_enter_close(ctx: &TracePointContext) -> Result<(), i64> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !may_be_watching(tgid) {
        return Ok(());
    }
    let fd: u64 = unsafe { ctx.read_at(SYSCALL_ARG0) }.map_err(i64::from)?;
    let key = SocketKey {
        tgid,
        fd: fd as u32,
    };
    let Some(state) = (unsafe { SOCKETS.get(key) }).copied() else {
        return Ok(());
    };
    let _ = SOCKETS.remove(key);
    // The descriptor's copy: a reset may have removed the socket from `CONNECTIONS` already.
    let mut header = header_for(RecordKind::Close, state.sock, &state.conn);
    stamp_current(&mut header, pid_tgid);
    output_header(&header);
    Ok(())
}
