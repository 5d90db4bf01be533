//! Turns ring-buffer records into `Event`s: the header layout shared with the kernel side
//! (`observer_records`), kernel time to wall time, and batches bounded in memory.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use aya::maps::{MapData, RingBuf};
use bytes::BytesMut;
use compact_str::CompactString;
use observer_records::{AF_INET6, FLAG_TRUNCATED, RecordHeader, RecordKind};

use crate::model::{Direction, Event, EventKind, PortClass, TcpState};

/// Converts `bpf_ktime_get_ns` (CLOCK_MONOTONIC) to wall-clock time, measured once at start.
pub(super) struct MonotonicToWall {
    offset_ns: i128,
}

impl MonotonicToWall {
    /// Measures the offset between the wall clock and the monotonic one now.
    pub(super) fn now() -> Self {
        let wall = clock_ns(libc::CLOCK_REALTIME);
        let monotonic = clock_ns(libc::CLOCK_MONOTONIC);
        Self {
            offset_ns: wall - monotonic,
        }
    }

    /// Converts `monotonic_ns` to wall-clock nanoseconds (0 before the epoch).
    pub(super) fn wall_ns(&self, monotonic_ns: u64) -> u64 {
        u64::try_from(i128::from(monotonic_ns) + self.offset_ns).unwrap_or(0)
    }
}

/// Returns the monotonic clock's time now, in nanoseconds.
pub(super) fn monotonic_now_ns() -> u64 {
    u64::try_from(clock_ns(libc::CLOCK_MONOTONIC)).unwrap_or(0)
}

fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we own.
    unsafe { libc::clock_gettime(clock, &mut time) };
    i128::from(time.tv_sec) * 1_000_000_000 + i128::from(time.tv_nsec)
}

/// Bounds a batch: at most this many records, and records carrying at most
/// `MAX_BATCH_PAYLOAD_BYTES`, are converted before the engine consumes them: under a flood the
/// programs refill the ring as fast as it is read, and an unbounded drain held every record made
/// meanwhile in memory outside the memory budget (issue 10's flood took the daemon 40 MiB past it).
const MAX_BATCH_RECORDS: usize = 4096;
const MAX_BATCH_PAYLOAD_BYTES: usize = 2 << 20;

/// Sizes the blocks record payloads are copied into (a larger record gets a block of its
/// own size).
const PAYLOAD_BLOCK_BYTES: usize = 64 << 10;

/// Receives the record payloads copied out of the ring: each is a slice of a block shared by the
/// records around it, so a record costs no allocation of its own, and a decoder that slices it
/// further (HTTP/2 frames, gRPC messages) shares the block instead of allocating a reference
/// count for it (each was an allocation: the daemon made 65 a push under the lab's push flood,
/// 48 with this, and allocation was a fifth of its CPU there, the first touch of a free block
/// gone cold since the last read). A slice kept after its read keeps its whole block alive, so
/// whatever holds a payload past the read copies it first: `Reorder` holding a record ahead of
/// a gap, a connection holding what a server sent before its protocol is known. Every other
/// step copies what it keeps into buffers of its own.
#[derive(Default)]
struct PayloadArena {
    /// The unused rest of the current block.
    block: BytesMut,
}

impl PayloadArena {
    /// Copies `bytes` into the current block (a new one when they do not fit), writable until
    /// frozen.
    fn copy(&mut self, bytes: &[u8]) -> BytesMut {
        if self.block.capacity() < bytes.len() {
            self.block = BytesMut::with_capacity(PAYLOAD_BLOCK_BYTES.max(bytes.len()));
        }
        self.block.extend_from_slice(bytes);
        self.block.split()
    }
}

/// Counts what one drain of the ring did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drained {
    /// Records that could not be converted (never expected: the layout is shared with the
    /// kernel side).
    pub malformed: usize,
    /// Records taken from the ring, malformed ones included.
    pub records: usize,
    /// The batch filled up before the ring was empty: drain again once it is consumed.
    pub more: bool,
}

/// Turns ring records into events: their kernel times into wall time, their payloads into
/// shared blocks.
pub(super) struct RecordConverter {
    pub(super) clock: MonotonicToWall,
    arena: PayloadArena,
}

impl RecordConverter {
    /// Builds a converter whose clock offset is measured now.
    pub(super) fn new() -> Self {
        Self {
            clock: MonotonicToWall::now(),
            arena: PayloadArena::default(),
        }
    }

    /// Converts the records in the ring into `events`, up to one batch.
    pub(super) fn drain(
        &mut self,
        ring: &mut RingBuf<MapData>,
        events: &mut Vec<Event>,
    ) -> Drained {
        let mut drained = Drained::default();
        let mut payload_bytes = 0;
        while events.len() < MAX_BATCH_RECORDS && payload_bytes < MAX_BATCH_PAYLOAD_BYTES {
            let Some(item) = ring.next() else {
                return drained;
            };
            drained.records += 1;
            match event_from_record(&item, &self.clock, &mut self.arena) {
                Some(event) => {
                    if let EventKind::Data { payload, .. } = &event.kind {
                        payload_bytes += payload.len();
                    }
                    events.push(event);
                }
                None => drained.malformed += 1,
            }
        }
        drained.more = true;
        drained
    }
}

fn event_from_record(
    record: &[u8],
    clock: &MonotonicToWall,
    arena: &mut PayloadArena,
) -> Option<Event> {
    let header_size = std::mem::size_of::<RecordHeader>();
    if record.len() < header_size {
        return None;
    }
    // SAFETY: the record starts with a RecordHeader written by our programs; the struct is
    // plain old data, and read_unaligned makes no alignment assumption.
    let header: RecordHeader = unsafe { std::ptr::read_unaligned(record.as_ptr().cast()) };
    let port_class = PortClass::from(observer_records::PortClass::from_repr(header.port_class)?);
    let kind = match RecordKind::from_repr(header.kind)? {
        RecordKind::TcpConnect => EventKind::TcpConnect,
        RecordKind::TcpState => EventKind::TcpState {
            old: TcpState::from_kernel(header.old_state),
            new: TcpState::from_kernel(header.new_state),
        },
        RecordKind::Close => EventKind::Close,
        RecordKind::Data => {
            let direction =
                Direction::from(observer_records::Direction::from_repr(header.direction)?);
            let payload = record.get(header_size..header_size + header.len as usize)?;
            let mut payload = arena.copy(payload);
            // Credentials never leave the capture layer: WebSocket upgrades carry the user's
            // token, also when they are sent to a gRPC port by mistake.
            let upgrade_on_grpc_port = direction == Direction::Send
                && header.offset == 0
                && crate::model::wire::starts_like_http1_request(&payload);
            if port_class == PortClass::WebSocket || upgrade_on_grpc_port {
                crate::privacy::redact_secrets(&mut payload);
            }
            EventKind::Data {
                direction,
                offset: header.offset,
                call_len: header.call_len,
                truncated: header.flags & FLAG_TRUNCATED != 0,
                payload: payload.freeze(),
            }
        }
    };
    Some(Event {
        ts_ns: clock.wall_ns(header.ts_ns),
        connection: header.sock,
        pid: header.tgid,
        comm: comm_text(&header.comm),
        cgroup_id: header.cgroup_id,
        saddr: ip_from_kernel(header.family, &header.saddr),
        sport: header.sport,
        daddr: ip_from_kernel(header.family, &header.daddr),
        dport: header.dport,
        port_class,
        kind,
    })
}

/// Reads a process name as text. Checked as UTF-8 first: `CompactString::from_utf8_lossy` goes
/// character by character even when nothing needs repairing, and every record names its
/// process (it was 3% of the daemon's CPU under the push flood).
fn comm_text(comm: &[u8; 16]) -> CompactString {
    let end = comm
        .iter()
        .position(|&byte| byte == 0)
        .unwrap_or(comm.len());
    match std::str::from_utf8(&comm[..end]) {
        Ok(text) => CompactString::new(text),
        Err(_) => CompactString::from_utf8_lossy(&comm[..end]),
    }
}

/// Reads an address the kernel recorded; IPv4-mapped IPv6 addresses come out as IPv4 (the programs
/// already record them so): one identity per endpoint, whichever socket family reached it.
fn ip_from_kernel(family: u16, address: &[u8; 16]) -> IpAddr {
    if family == AF_INET6 {
        IpAddr::V6(Ipv6Addr::from(*address)).to_canonical()
    } else {
        IpAddr::V4(Ipv4Addr::new(
            address[0], address[1], address[2], address[3],
        ))
    }
}

#[cfg(test)]
mod tests;
