//! Puts the packet hook's records back in stream order. A segment lost or reordered in the network
//! reaches the packet programs after the segments behind it (`observer-ebpf/src/packet.rs`
//! copies each at its own offset); the decoders need each direction in order, and an HTTP/2
//! direction that meets a gap stops decoding for good. Records ahead of a gap wait here, per
//! connection direction, until the gap is filled (TCP retransmits within a round trip, or a
//! retransmission timeout: 200 ms at least), and are released in order then; or, if the gap
//! lasts `HOLD_NS` or the held bytes pass `MAX_HELD_BYTES`, released with the gap, which the
//! decoders report. Bytes seen twice (a hole's fill overlaps what follows) are left to the
//! decoders, which skip them.
//!
//! Only for the packet hook: the syscall hook's records come in order by construction, and
//! its offsets jump only where bytes were deliberately not copied.

use std::collections::BTreeMap;

use bytes::Bytes;
use hashbrown::{HashMap, HashSet};

use observer_records::JOINED_STREAM_OFFSET;

use crate::model::{ConnectionId, Direction, Event, EventKind, TcpState};

/// Bounds how long records wait for a gap before them to fill: longer than a retransmission
/// timeout's minimum (200 ms), short enough that alerts are not held back much.
pub const HOLD_NS: u64 = 300_000_000;

/// Bounds the payload bytes held across every connection; past it the connection that needs room
/// is released, gap and all. Outside the engine's memory budget, as the ring's batch bound.
pub const MAX_HELD_BYTES: usize = 2 << 20;

/// Counts what reordering did, for the observer's final counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReorderCounters {
    /// Records that came ahead of a gap and waited.
    pub records_held: u64,
    /// Gaps that were filled while records waited behind them.
    pub gaps_filled: u64,
    /// Gaps given up on (too long, or too much held): their records went on with the gap.
    pub gaps_released: u64,
}

/// Holds each watched stream's position and the records that wait for a gap before them.
#[derive(Default)]
pub struct Reorder {
    /// Every direction of every watched connection that sent data: a node's proxy holds one
    /// per user's WebSocket, so nothing walks this table per read.
    streams: HashMap<(ConnectionId, Direction), Stream>,
    /// The streams holding records, the only ones `expire` looks at on every read of the ring
    /// (a walk of every stream was 200,000 entries a millisecond on a proxy of 100,000 users).
    holding: HashSet<(ConnectionId, Direction)>,
    held_bytes: usize,
    counters: ReorderCounters,
}

/// Tracks one direction of a connection.
struct Stream {
    /// Offset of the next byte expected.
    next: u64,
    /// The last record passed on stopped short of its segment (budget or policy): a jump in
    /// offsets after it is expected, not a gap to wait for.
    cut: bool,
    /// Records ahead of `next`, by offset, and when the first of them came.
    held: BTreeMap<u64, Event>,
    held_since_ns: u64,
}

impl Reorder {
    /// Returns what reordering did so far.
    pub fn counters(&self) -> ReorderCounters {
        self.counters
    }

    /// Says whether records wait for a gap before them to fill.
    pub fn holds(&self) -> bool {
        !self.holding.is_empty()
    }

    /// Passes `event` on into `out`, with any records it lets go after it, or holds it.
    /// `now_ns`: the monotonic clock (`HOLD_NS` is measured on it).
    pub fn push(&mut self, event: Event, now_ns: u64, out: &mut Vec<Event>) {
        let (direction, offset, len) = match &event.kind {
            EventKind::Data {
                direction,
                offset,
                payload,
                ..
            } => (*direction, *offset, payload.len() as u64),
            // A socket address reused by a new connection, or the connection's end.
            EventKind::TcpConnect
            | EventKind::Close
            | EventKind::TcpState {
                new: TcpState::Close,
                ..
            } => {
                self.end(event.connection, out);
                return out.push(event);
            }
            EventKind::TcpState { .. } => return out.push(event),
        };
        let key = (event.connection, direction);
        // A direction starts at 0, or where an adopted connection was first seen
        // (`JOINED_STREAM_OFFSET` and beyond).
        let stream = self.streams.entry(key).or_insert_with(|| Stream {
            next: if offset >= JOINED_STREAM_OFFSET {
                offset
            } else {
                0
            },
            cut: false,
            held: BTreeMap::new(),
            held_since_ns: 0,
        });
        if offset > stream.next && !stream.cut {
            if stream.held.is_empty() {
                stream.held_since_ns = now_ns;
                self.holding.insert(key);
            }
            self.counters.records_held += 1;
            self.held_bytes += len as usize;
            if let Some(repeated) = stream.held.insert(offset, with_own_payload(event)) {
                self.held_bytes -= extent(&repeated).0;
            }
            if self.held_bytes > MAX_HELD_BYTES {
                self.counters.gaps_released += 1;
                self.release(key, out);
            }
            return;
        }
        pass_on(stream, event, out);
        if !stream.held.is_empty() && self.release_ready(key, out) {
            self.counters.gaps_filled += 1;
        }
    }

    /// Releases, gap and all, the records that waited `HOLD_NS` or longer.
    pub fn expire(&mut self, now_ns: u64, out: &mut Vec<Event>) {
        if self.holding.is_empty() {
            return;
        }
        let expired: Vec<(ConnectionId, Direction)> = self
            .holding
            .iter()
            .filter(|key| {
                self.streams
                    .get(*key)
                    .is_some_and(|stream| now_ns.saturating_sub(stream.held_since_ns) >= HOLD_NS)
            })
            .copied()
            .collect();
        for key in expired {
            self.counters.gaps_released += 1;
            self.release(key, out);
        }
    }

    /// Forgets the connections not in `alive` (the kernel's watched connections): those whose
    /// close was lost with dropped records. What they held goes on first.
    pub fn retain(
        &mut self,
        alive: &std::collections::HashSet<ConnectionId>,
        out: &mut Vec<Event>,
    ) {
        let gone: Vec<ConnectionId> = self
            .streams
            .keys()
            .filter(|(connection, _)| !alive.contains(connection))
            .map(|(connection, _)| *connection)
            .collect();
        for connection in gone {
            self.end(connection, out);
        }
    }

    /// Releases everything held, in order (the capture ends).
    pub fn release_all(&mut self, out: &mut Vec<Event>) {
        let held: Vec<(ConnectionId, Direction)> = self.holding.iter().copied().collect();
        for key in held {
            self.counters.gaps_released += 1;
            self.release(key, out);
        }
    }

    /// Releases, first and in order, what the connection held when it ends (or its socket is
    /// reused).
    fn end(&mut self, connection: ConnectionId, out: &mut Vec<Event>) {
        for direction in [Direction::Send, Direction::Recv] {
            let key = (connection, direction);
            if self.holding.contains(&key) {
                self.counters.gaps_released += 1;
                self.release(key, out);
            }
            self.streams.remove(&key);
        }
    }

    /// Passes on the held records that now follow without a gap; true when that was all of
    /// them (the gap is filled).
    fn release_ready(&mut self, key: (ConnectionId, Direction), out: &mut Vec<Event>) -> bool {
        let Some(stream) = self.streams.get_mut(&key) else {
            return false;
        };
        while let Some(entry) = stream.held.first_entry() {
            if *entry.key() > stream.next && !stream.cut {
                return false;
            }
            let event = entry.remove();
            self.held_bytes -= pass_on(stream, event, out);
        }
        self.holding.remove(&key);
        true
    }

    /// Passes on every held record of `key` in order, over the gaps.
    fn release(&mut self, key: (ConnectionId, Direction), out: &mut Vec<Event>) {
        let Some(stream) = self.streams.get_mut(&key) else {
            return;
        };
        while let Some((_, event)) = stream.held.pop_first() {
            self.held_bytes -= pass_on(stream, event, out);
        }
        self.holding.remove(&key);
    }
}

/// Gives `event` a payload of its own: a record held past the read it came in would otherwise
/// keep that read's whole block of payloads alive (`ring_records::PayloadArena`).
fn with_own_payload(mut event: Event) -> Event {
    if let EventKind::Data { payload, .. } = &mut event.kind {
        *payload = Bytes::copy_from_slice(payload);
    }
    event
}

/// Passes `event` on without what `stream` passed already, and advances `stream` past it;
/// returns its payload's size (as held).
fn pass_on(stream: &mut Stream, event: Event, out: &mut Vec<Event>) -> usize {
    let (size, end, truncated) = extent(&event);
    let next = stream.next;
    stream.next = next.max(end);
    stream.cut = truncated;
    out.extend(past(next, event));
    size
}

/// Returns a data event's payload size, the offset past it, and whether it was cut.
fn extent(event: &Event) -> (usize, u64, bool) {
    match &event.kind {
        EventKind::Data {
            offset,
            payload,
            truncated,
            ..
        } => (payload.len(), offset + payload.len() as u64, *truncated),
        _ => (0, 0, false),
    }
}

/// Cuts `event`'s bytes before `next` (passed on already in an earlier record: a hole's
/// fill may overlap what came after the hole); `None` if nothing is left.
fn past(next: u64, mut event: Event) -> Option<Event> {
    if let EventKind::Data {
        offset, payload, ..
    } = &mut event.kind
        && *offset < next
    {
        let seen = usize::try_from(next - *offset).unwrap_or(usize::MAX);
        if seen >= payload.len() {
            return None;
        }
        *payload = payload.slice(seen..);
        *offset = next;
    }
    Some(event)
}

#[cfg(test)]
mod tests;
