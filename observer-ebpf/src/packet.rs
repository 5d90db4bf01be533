//! Captures payloads on the packet side (`CaptureHook::Packets`): `cgroup_skb` programs at the root
//! of the cgroup v2 hierarchy see every IP packet a socket of the node sends or receives, after TCP
//! made it and before TCP takes it. No syscall runs any of our code, so no process pays for the
//! observer; a watched connection's segments are copied as they pass.
//!
//! A packet is turned away by its socket's remote port (`skb->sk`, one array read in
//! `WATCHED_PORTS`): the remote port of the watched side of a connection is the gateway's, in
//! both directions. A watched port's segment without payload (an ACK, a FIN) stops after its
//! headers. Any other is looked up by its socket's address in `PACKET_STREAMS`, where
//! `inet_sock_set_state` put the socket at SYN_SENT. The socket's address is the `skaddr` of
//! that tracepoint, so the connection's owner (recorded in the connecting process, in the
//! same entry) needs no syscall hook.
//!
//! Where a segment's bytes sit in the stream comes from its sequence number, relative to the
//! SYN of its direction (the SYN this side sent, and the SYN-ACK it received). Each direction
//! keeps the furthest byte seen and where a hole before it starts (`place_segment`): a
//! retransmission of bytes seen is not copied again, one that overlaps them only past them; a
//! segment beyond the furthest byte (its predecessor lost or reordered in the network) is
//! copied at its own offset and counted (`SegmentsOutOfOrder`), and so is the hole's fill when
//! it comes. Userspace puts the records back in order.
//!
//! A gRPC direction's HTTP/2 frames are followed from segment to segment by their headers'
//! lengths (`follow_frames`), and a segment that holds only frames the decoder does not read
//! (SETTINGS, WINDOW_UPDATE, PING, GOAWAY) is left out: not copied, and not counted in the
//! offsets of the bytes after it. Of the 9 or 10 segments of a short connection, such as each
//! of OpenIM's pushes opens, 5 or 6 are left out so.
//!
//! Policies as for syscalls: a WebSocket connection's first write in each direction, up to
//! `CHUNK_SIZE` bytes (the upgrade request and its answer; the chat after them never), a gRPC
//! one up to its budget. A write's last segment carries PSH (Linux marks the end of every
//! `sendmsg` so, as do other stacks), which is how the packets tell where the first write ends.

use aya_ebpf::{
    bindings::{__sk_buff, BPF_NOEXIST},
    helpers::generated::bpf_skb_load_bytes,
    macros::cgroup_skb,
    programs::SkBuffContext,
};
use observer_records::{
    AF_INET, AF_INET6, CHUNK_SIZE, ConnectionTuple, Counter, DataRecord, Direction, FLAG_TRUNCATED,
    FRAMES_NOT_FOLLOWED, IPPROTO_TCP, JOINED_STREAM_OFFSET, PortClass, RecordKind, TcpState,
    http2::{CLIENT_PREFACE, FRAME_HEADER_LEN, FRAME_SETTINGS, is_call_frame},
};

use crate::{
    io::draw_grpc_budget,
    maps::{
        ADOPTABLE, Connection, NO_HOLE, PACKET_COPY, PACKET_NESTING, PACKET_STREAMS, PacketCopy,
        PacketDirection, PacketStream, SCRATCH, SCRATCH_SLOTS, STREAM_HEAD_TAKEN, STREAM_JOINED,
        STREAM_SEQ_KNOWN, count, watched_port,
    },
    ring::{RecordTime, header_at, header_for, output_data, output_header},
};

/// Holds a connection's `PACKET_STREAMS` entry when it is adopted, from read-only data: the packet
/// programs' stack has no room for it (Linux 6.1), and a per-CPU slot could be overwritten by an
/// ingress packet's softirq interrupting an egress one on the same CPU.
static JOINED_PACKET_STREAM: PacketStream = PacketStream::JOINED;

/// Holds what `bpf_map_update_elem` returns when `BPF_NOEXIST` refuses an insert: -EEXIST.
const EEXIST: i64 = 17;

/// Names the `cgroup_skb` verdict that lets the packet through. The programs only look.
const PASS: i32 = 1;

const TCP_FLAG_SYN: u8 = 0x02;
const TCP_FLAG_PSH: u8 = 0x08;

// Program entry points: thin wrappers, the work is in `try_packet`.

/// Watches the packets a socket sends: the watched side's bytes to the gateway.
#[cgroup_skb(egress)]
pub fn packet_egress(ctx: SkBuffContext) -> i32 {
    let _ = try_packet(&ctx, Direction::Send);
    PASS
}

/// Watches the packets a socket receives: the gateway's bytes to the watched side.
#[cgroup_skb(ingress)]
pub fn packet_ingress(ctx: SkBuffContext) -> i32 {
    let _ = try_packet(&ctx, Direction::Recv);
    PASS
}

/// Holds where the TCP payload starts and what the header says.
struct Segment {
    seq: u32,
    syn: bool,
    /// The last segment of a write.
    push: bool,
    payload_start: u32,
    payload_len: u32,
}

fn try_packet(ctx: &SkBuffContext, direction: Direction) -> Result<(), i64> {
    let skb: *mut __sk_buff = ctx.skb.skb;
    // What every other packet costs: the port of its socket (the kernel runs cgroup programs
    // only for packets of full sockets, so there is one), network byte order in the upper half.
    let remote_port = (u32::from_be(ctx.skb.remote_port())) as u16;
    if watched_port(remote_port).is_none() {
        return Ok(());
    }
    let segment = read_segment(ctx)?;
    // A segment without payload matters only as a SYN, where its direction's sequence starts:
    // the ACKs and FINs stop here, before any lookup.
    if segment.payload_len == 0 && !segment.syn {
        return Ok(());
    }
    // The socket's address as a number, the key `inet_sock_set_state` used. Verifier: a socket
    // pointer may be spilled to the stack and read by a helper as a map key only with pointer
    // leaks allowed (CAP_PERFMON), which loading the tracepoints needs anyway.
    let sock = unsafe { (*skb).__bindgen_anon_2.sk } as u64;
    let stream = match PACKET_STREAMS.get_ptr_mut(sock) {
        Some(stream) => stream,
        None => adopt(ctx, sock, direction)?,
    };
    // SAFETY: a live map value. A socket's packets in one direction pass one at a time in
    // practice (sent under its lock; a flow's packets received on one CPU); two CPUs racing
    // could only copy a segment twice or misplace a hole, which userspace's reordering
    // tolerates, never touch memory outside the value.
    let stream = unsafe { &mut *stream };
    // Every entry names its watched port, but one another CPU adopted may not hold its
    // connection yet (between its insert and the write after it, `adopt`).
    if stream.conn.dport == 0 {
        count(Counter::BytesNotCaptured, u64::from(segment.payload_len));
        return Ok(());
    }
    // The source port, chosen after SYN_SENT recorded the connection: its first packet (the
    // SYN) carries it, so the state program need not read the socket again at ESTABLISHED.
    if stream.conn.sport == 0 {
        stream.conn.sport = ctx.skb.local_port() as u16;
    }
    let half = if direction == Direction::Send {
        &mut stream.send
    } else {
        &mut stream.recv
    };
    let Some(segment_start) = payload_offset(half, &segment) else {
        return Ok(());
    };
    let end = segment_start + u64::from(segment.payload_len);
    if stream.conn.port_class == PortClass::Grpc as u8
        && end > half.seen_end
        && half.next_frame != FRAMES_NOT_FOLLOWED
        && follow_frames(ctx, half, direction, &segment, segment_start)
    {
        count(Counter::SegmentsLeftOut, 1);
        return Ok(());
    }
    let Some((start, len)) = place_segment(half, segment_start, end) else {
        // Every byte seen already: a retransmission.
        return Ok(());
    };
    // Bytes of the segment's front seen before.
    let skip = start - segment_start;
    let conn = &stream.conn;
    let mut time = RecordTime::unread();
    let capture = capture_allowance(half, conn.port_class, &segment, start, len, &mut time);
    if capture < len {
        count(Counter::BytesNotCaptured, len - capture);
    }
    if capture == 0 {
        return Ok(());
    }
    let copy = SegmentCopy {
        payload_start: segment.payload_start + skip as u32,
        stream_offset: start - half.left_out,
        len,
        capture,
    };
    output_segment(ctx, sock, conn, direction, time.now(), &copy);
    Ok(())
}

/// Places a segment's payload in its direction's stream (a SYN sets where the stream starts):
/// returns the stream offset of its first byte, or `None` when it has no payload or the
/// stream's start was never seen (its bytes counted as not captured).
#[inline(always)]
fn payload_offset(half: &mut PacketDirection, segment: &Segment) -> Option<u64> {
    if segment.syn {
        // The first payload byte follows the SYN's own sequence number.
        half.first_seq = segment.seq.wrapping_add(1);
        half.flags |= STREAM_SEQ_KNOWN;
    }
    if segment.payload_len == 0 {
        return None;
    }
    let payload_seq = if segment.syn {
        segment.seq.wrapping_add(1)
    } else {
        segment.seq
    };
    if half.flags & STREAM_SEQ_KNOWN == 0 {
        if half.flags & STREAM_JOINED == 0 {
            // Its SYN passed before the socket was watched: nowhere to place the bytes.
            count(Counter::BytesNotCaptured, u64::from(segment.payload_len));
            return None;
        }
        // Adopted established: the stream, as far as it is seen, starts here, at an offset
        // that says it is not the stream's start.
        half.first_seq = payload_seq;
        half.seen_end = JOINED_STREAM_OFFSET;
        half.flags |= STREAM_SEQ_KNOWN;
    }
    Some(stream_offset(half, payload_seq))
}

/// Describes what of a segment goes to the ring: where its new bytes start in the packet and in the
/// stream (less what was left out before), how many are new and how many of them are copied.
struct SegmentCopy {
    payload_start: u32,
    stream_offset: u64,
    len: u64,
    capture: u64,
}

/// Copies a segment's new bytes into a data record through this CPU's scratch slot of the
/// current nesting level (an ingress softirq may interrupt an egress run on the same CPU).
#[inline(always)]
fn output_segment(
    ctx: &SkBuffContext,
    sock: u64,
    conn: &Connection,
    direction: Direction,
    now: u64,
    copy: &SegmentCopy,
) {
    let Some(nesting) = PACKET_NESTING.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's counter. Volatile: the compiler knows nothing of interrupts, and must
    // not drop the writes that take and give back the level. (No fence: the BPF backend cannot
    // select one. None is needed: the record is reached through helper calls made after the
    // level is taken, and it is last read by the ring's helper before the level is given back;
    // the compiler moves no write to `nesting` across a helper that might read it.)
    let level = unsafe { core::ptr::read_volatile(nesting) };
    if level >= SCRATCH_SLOTS {
        count(Counter::BytesNotCaptured, copy.capture);
        return;
    }
    unsafe { core::ptr::write_volatile(nesting, level + 1) };
    if let (Some(buffer), Some(progress)) =
        (SCRATCH.get_ptr_mut(level), PACKET_COPY.get_ptr_mut(level))
    {
        // SAFETY: this CPU's slots of this nesting level: no other run touches them until
        // this one gives the level back.
        let (record, progress) = unsafe { (&mut (*buffer).record, &mut *progress) };
        record.header = header_at(RecordKind::Data, sock, conn, now);
        record.header.direction = direction as u8;
        record.header.call_len = copy.len;
        copy_payload(
            ctx,
            record,
            progress,
            copy.payload_start,
            copy.stream_offset,
            copy.capture as u32,
            copy.capture < copy.len,
        );
    }
    // SAFETY: as above.
    unsafe { core::ptr::write_volatile(nesting, level) };
}

/// Adopts a socket to a watched port that `PACKET_STREAMS` does not hold: if userspace named its
/// connection in `ADOPTABLE` (established before the programs were attached), it is watched from
/// this packet on, and userspace learns so from a state record "unknown → established". Its new
/// entry, or Err: the packet is not ours.
fn adopt(ctx: &SkBuffContext, sock: u64, direction: Direction) -> Result<*mut PacketStream, i64> {
    let tuple = read_tuple(ctx, direction)?;
    let Some(conn) = (unsafe { ADOPTABLE.get(tuple) }) else {
        return Err(0);
    };
    // Another CPU may be adopting it with a packet of the other direction: the first insert
    // wins, and only it announces the connection.
    #[expect(
        clippy::needless_borrows_for_generic_args,
        reason = "BPF stack size on Linux 6.1"
    )]
    let inserted = PACKET_STREAMS.insert(&sock, &JOINED_PACKET_STREAM, u64::from(BPF_NOEXIST));
    if let Err(err) = inserted {
        if i64::from(err) == -EEXIST {
            return PACKET_STREAMS.get_ptr_mut(sock).ok_or(0);
        }
        count(Counter::MapInsertFailures, 1);
        return Err(i64::from(err));
    }
    let stream = PACKET_STREAMS.get_ptr_mut(sock).ok_or(0)?;
    // SAFETY: a live map value, inserted just now by this program.
    unsafe { (*stream).conn = *conn };
    let mut header = header_for(RecordKind::TcpState, sock, conn);
    header.new_state = TcpState::Established as u32;
    output_header(&header);
    let _ = ADOPTABLE.remove(tuple);
    Ok(stream)
}

/// Reads the connection's endpoints as the programs record them: ours first, IPv4 as IPv4.
fn read_tuple(ctx: &SkBuffContext, direction: Direction) -> Result<ConnectionTuple, i64> {
    let version: u8 = ctx.load(0)?;
    let mut tuple = ConnectionTuple {
        saddr: [0; 16],
        daddr: [0; 16],
        sport: ctx.skb.local_port() as u16,
        dport: (u32::from_be(ctx.skb.remote_port())) as u16,
        family: AF_INET,
        _reserved: 0,
    };
    let (source, destination) = if direction == Direction::Send {
        (&mut tuple.saddr, &mut tuple.daddr)
    } else {
        (&mut tuple.daddr, &mut tuple.saddr)
    };
    if version >> 4 == 4 {
        source[..4].copy_from_slice(&ctx.load::<[u8; 4]>(12)?);
        destination[..4].copy_from_slice(&ctx.load::<[u8; 4]>(16)?);
    } else {
        *source = ctx.load(8)?;
        *destination = ctx.load(24)?;
        tuple.family = AF_INET6;
    }
    Ok(tuple)
}

/// Reads the IP and TCP headers; the packet starts at its network header. Two loads, each a
/// helper call: the start of the IP header (IPv4's protocol is its 10th byte, IPv6's next
/// header its 7th), then the TCP header up to its flags.
fn read_segment(ctx: &SkBuffContext) -> Result<Segment, i64> {
    let ip: [u8; 10] = ctx.load(0)?;
    let (ip_header_len, protocol) = match ip[0] >> 4 {
        4 => (u32::from(ip[0] & 0x0f) * 4, ip[9]),
        // Extension headers are not followed: TCP sockets send none of their own.
        6 => (40, ip[6]),
        _ => return Err(0),
    };
    if protocol != IPPROTO_TCP {
        return Err(0);
    }
    let tcp: [u8; 14] = ctx.load(ip_header_len as usize)?;
    let seq = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]);
    let data_offset = tcp[12];
    let flags = tcp[13];
    let payload_start = ip_header_len + u32::from(data_offset >> 4) * 4;
    Ok(Segment {
        seq,
        syn: flags & TCP_FLAG_SYN != 0,
        push: flags & TCP_FLAG_PSH != 0,
        payload_start,
        // `len` counts from the network header, and covers a whole GSO/GRO packet.
        payload_len: ctx.len().saturating_sub(payload_start),
    })
}

/// Bounds the frame headers of one segment the programs read. A short connection's segments hold
/// one to four frames (SETTINGS, its ACK and a WINDOW_UPDATE; a call's HEADERS, DATA and trailers);
/// past this many the frames are no longer followed in that direction.
const MAX_FRAMES_FOLLOWED: u32 = 8;

/// Follows a gRPC direction's HTTP/2 frames through a segment that brings bytes not seen
/// before, at stream offset `segment_start`: where the next frame header starts
/// (`next_frame`), and whether the segment is to be left out (true): it holds whole frames
/// only, all of types the decoder does not read, and nothing before it is missing. Its bytes
/// then count as seen, and in `left_out`, which the offsets of the bytes copied after it leave
/// out, so userspace receives the stream without them. Retransmissions and holes are placed
/// by sequence number as ever: every byte copied after a segment left out lies beyond it.
///
/// A short gRPC connection (OpenIM's push opens one per call) sends 9 or 10 segments, of
/// which 5 or 6 hold SETTINGS, their ACKs, WINDOW_UPDATE and GOAWAY only: leaving them out
/// spares their copy, their ring records and userspace's work on them.
fn follow_frames(
    ctx: &SkBuffContext,
    half: &mut PacketDirection,
    direction: Direction,
    segment: &Segment,
    segment_start: u64,
) -> bool {
    let end = segment_start + u64::from(segment.payload_len);
    if segment_start == 0 && !opens_as_http2(ctx, direction, segment) {
        half.next_frame = FRAMES_NOT_FOLLOWED;
        return false;
    }
    let next_frame = half.next_frame;
    if next_frame >= end {
        // Inside a frame that runs past this segment (or the client preface).
        return false;
    }
    if next_frame < segment_start {
        // The next frame header is among bytes not seen.
        half.next_frame = FRAMES_NOT_FOLLOWED;
        return false;
    }
    let mut position = (next_frame - segment_start) as u32;
    let mut call_frames = false;
    for _ in 0..MAX_FRAMES_FOLLOWED {
        if position >= segment.payload_len {
            break;
        }
        // A frame header's length (24 bits) and type; unreadable when the segment ends
        // within it.
        let Ok(head) = ctx.load::<[u8; 4]>((segment.payload_start + position) as usize) else {
            half.next_frame = FRAMES_NOT_FOLLOWED;
            return false;
        };
        call_frames |= is_call_frame(head[3]);
        position += FRAME_HEADER_LEN as u32 + u32::from_be_bytes([0, head[0], head[1], head[2]]);
    }
    if position < segment.payload_len {
        half.next_frame = FRAMES_NOT_FOLLOWED;
        return false;
    }
    half.next_frame = segment_start + u64::from(position);
    let leave_out = !call_frames
        && next_frame == segment_start
        && position == segment.payload_len
        && segment_start == half.seen_end
        && half.hole_from == NO_HOLE;
    if leave_out {
        half.seen_end = end;
        half.left_out += u64::from(segment.payload_len);
    }
    leave_out
}

/// Says whether a direction's first segment opens as HTTP/2 does (RFC 9113 §3.4): the client's with
/// the preface, the server's with a SETTINGS frame (not an ACK) on stream 0. Frames are followed
/// only then, so that no other protocol on a gRPC port has a segment left out.
fn opens_as_http2(ctx: &SkBuffContext, direction: Direction, segment: &Segment) -> bool {
    let start = segment.payload_start as usize;
    if direction == Direction::Send {
        return ctx.load::<[u8; CLIENT_PREFACE.len()]>(start) == Ok(CLIENT_PREFACE);
    }
    matches!(
        ctx.load::<[u8; FRAME_HEADER_LEN]>(start),
        Ok([_, _, _, FRAME_SETTINGS, 0, 0, 0, 0, 0])
    )
}

/// Returns what of the segment at `start..end` to copy, given what this direction saw: `None` when
/// every byte of it was copied before (a retransmission), else its start past the bytes already
/// seen, and its length. Updates what was seen.
///
/// A segment beyond the furthest byte seen (its predecessor lost or reordered in the network)
/// opens a hole there; segments below the furthest byte are then copied from the hole on
/// (the hole's fill, and anything after it: userspace drops what repeats), and the hole
/// closes once a segment fills it up to the furthest byte. Userspace puts the records back in
/// order (`capture::reorder`).
fn place_segment(half: &mut PacketDirection, start: u64, end: u64) -> Option<(u64, u64)> {
    let seen_end = half.seen_end;
    if start > seen_end {
        count(Counter::SegmentsOutOfOrder, 1);
        half.hole_from = half.hole_from.min(seen_end);
        half.seen_end = end;
        return Some((start, end - start));
    }
    // Below this every byte has been seen.
    let seen_below = half.hole_from.min(seen_end);
    if end <= seen_below {
        return None;
    }
    let start = start.max(seen_below);
    if start == half.hole_from {
        // Filled from the hole's start: what may still be missing starts after this segment
        // (a segment further in the hole leaves its start where it was).
        half.hole_from = if end >= seen_end { NO_HOLE } else { end };
    }
    half.seen_end = seen_end.max(end);
    Some((start, end - start))
}

/// Returns the stream offset of sequence number `seq`: sequence numbers wrap every 4 GiB, so it is
/// the offset nearest the furthest byte seen with those low 32 bits.
fn stream_offset(half: &PacketDirection, seq: u32) -> u64 {
    let relative = seq.wrapping_sub(half.first_seq);
    let distance = relative.wrapping_sub(half.seen_end as u32) as i32;
    half.seen_end.wrapping_add(distance as i64 as u64)
}

/// Returns how many of the `len` bytes at stream offset `start` the port class's policy lets us
/// copy; a gRPC budget reads the record's `time`.
fn capture_allowance(
    half: &mut PacketDirection,
    port_class: u8,
    segment: &Segment,
    start: u64,
    len: u64,
    time: &mut RecordTime,
) -> u64 {
    if port_class == PortClass::WebSocket as u8 {
        // The upgrade request and its answer name the user; everything after them is chat.
        if half.flags & STREAM_HEAD_TAKEN != 0 {
            return 0;
        }
        let capture = (CHUNK_SIZE as u64).saturating_sub(start).min(len);
        if segment.push || capture < len {
            half.flags |= STREAM_HEAD_TAKEN;
        }
        return capture;
    }
    draw_grpc_budget(&mut half.budget, len, time.now())
}

/// Bounds the records one packet fills: 512 KiB, the most a GSO packet holds (`GSO_MAX_SIZE` with
/// BIG TCP; 64 KiB without it, though loopback here sent 95,232 bytes in one packet). Anything past
/// it would be cut and counted, as a long syscall.
const MAX_CHUNKS_PER_PACKET: u32 = 128;

/// Copies `capture` payload bytes from `payload_start` in the packet into records of up to
/// `CHUNK_SIZE`, the first at stream offset `offset`.
///
/// Verifier: with the copy's progress in registers, each iteration's paths (the helper's
/// failure, the ring's wakeup decision) multiplied with the previous ones' until "BPF program
/// is too large. Processed 1000001 insn". The progress lives in map memory (`PACKET_COPY`),
/// read and written volatile so LLVM keeps it there, which the verifier does not track: the
/// paths of one iteration converge at the next, as in `copy`.
fn copy_payload(
    ctx: &SkBuffContext,
    record: &mut DataRecord,
    progress: &mut PacketCopy,
    payload_start: u32,
    offset: u64,
    capture: u32,
    truncated: bool,
) {
    progress.store(PacketCopy {
        position: payload_start,
        left: capture,
        offset,
    });
    for _ in 0..MAX_CHUNKS_PER_PACKET {
        let mut copy = progress.load();
        if copy.left == 0 {
            return;
        }
        // 1 to `CHUNK_SIZE`, and the verifier must see both bounds on the register the helper
        // receives (its size may not be zero, unlike `bpf_probe_read_user`'s). A test
        // `len == 0 || len > N` became one unsigned test of `len - 1` on another register,
        // which Linux 6.1's verifier did not carry over ("invalid access to map value ...
        // size=0"); arithmetic it follows instead: masked below `CHUNK_SIZE`, then one added.
        // The volatile read hides `wanted`'s range from LLVM, which would drop the mask.
        let wanted = copy.left.min(CHUNK_SIZE as u32);
        // SAFETY: a read of a local.
        let opaque = unsafe { core::ptr::read_volatile(&wanted) };
        let len = (opaque.wrapping_sub(1) & (CHUNK_SIZE as u32 - 1)) + 1;
        // SAFETY: the destination is the scratch record's payload, `len` ≤ its size.
        let loaded = unsafe {
            bpf_skb_load_bytes(
                ctx.skb.skb as *const core::ffi::c_void,
                copy.position,
                record.payload.as_mut_ptr().cast(),
                len,
            )
        };
        if loaded != 0 {
            count(Counter::BytesNotCaptured, u64::from(copy.left));
            progress.store(PacketCopy { left: 0, ..copy });
            return;
        }
        copy.left -= len;
        record.header.len = len;
        record.header.offset = copy.offset;
        record.header.flags = if truncated && copy.left == 0 {
            FLAG_TRUNCATED
        } else {
            0
        };
        copy.position += len;
        copy.offset += u64::from(len);
        progress.store(copy);
        output_data(record);
    }
    let left = progress.load().left;
    if left > 0 {
        count(Counter::CallsCutAtChunkLimit, 1);
        count(Counter::BytesNotCaptured, u64::from(left));
    }
}
