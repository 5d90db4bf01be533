//! Keeps one decoder per live connection, chosen by port class and first bytes, turning capture
//! events into routing `Observation`s.
//!
//! - WebSocket ports: the proxy's upgrade request places a user; the answer confirms it.
//! - gRPC ports: HTTP/2 from the preface on, push calls and the gateway's answers. If the first
//!   bytes are an HTTP/1 request instead, it is a WebSocket upgrade sent to the gRPC port.

use bytes::Bytes;
use hashbrown::{HashMap, HashSet};

use crate::{
    alert::DegradedReason,
    budget::{self, CONNECTION_BYTES, UPGRADED_CONNECTION_BYTES},
    decode::{DecodeCounters, GrpcConnectionDecoder, GrpcFact, Limits, WebSocketDecoder},
    model::{
        ConnectionId, Direction, Event, EventKind, Gateway, PortClass, Process, TcpState,
        wire::starts_like_http1_request,
    },
};
use observer_records::is_adopted_connection;

pub use super::connection_counters::ConnectionCounters;
use super::{
    Observation,
    blindness::BlindSpots,
    fact_observations::{
        ConnectionView, grpc_observation, note_http1_loss, note_http2_loss,
        upgrade_on_grpc_observation, websocket_observation,
    },
    shared_texts::SharedTexts,
};

enum Protocol {
    /// Nothing sent yet on a gRPC port: the client's first bytes decide. What the server sent
    /// before them waits here: an HTTP/2 server's SETTINGS, sent as it accepts, which the packet
    /// hook can see arrive before the client's first segment leaves (the syscall hook sees the
    /// client write before it reads). Judged by those, a WebSocket upgrade sent to the port
    /// would pass for a gRPC connection.
    Undetermined {
        server_first: Vec<Bytes>,
    },
    WebSocket(WebSocketDecoder),
    Grpc(Box<GrpcConnectionDecoder>),
    UpgradeOnGrpcPort(WebSocketDecoder),
    /// Its decoder was dropped to keep to the memory budget: later bytes are ignored.
    Shed,
}

impl Protocol {
    fn buffered_bytes(&self) -> usize {
        match self {
            Protocol::WebSocket(decoder) | Protocol::UpgradeOnGrpcPort(decoder) => {
                decoder.buffered_bytes()
            }
            Protocol::Grpc(decoder) => decoder.buffered_bytes(),
            Protocol::Undetermined { server_first } => server_first.iter().map(Bytes::len).sum(),
            Protocol::Shed => 0,
        }
    }

    fn counters(&self) -> Option<&DecodeCounters> {
        match self {
            Protocol::WebSocket(decoder) | Protocol::UpgradeOnGrpcPort(decoder) => {
                Some(decoder.counters())
            }
            Protocol::Grpc(decoder) => Some(decoder.counters()),
            Protocol::Undetermined { .. } | Protocol::Shed => None,
        }
    }
}

struct Connection {
    process: Process,
    gateway: Gateway,
    protocol: Protocol,
    /// Time of its last data: the connection idle longest is the least useful.
    last_active_ns: u64,
    /// Whether its decoder produced an observation: one that never did goes first.
    decoded: bool,
    /// `protocol.buffered_bytes()` as last accounted in `ConnectionDecoders::buffered_bytes`.
    buffered: usize,
}

/// Holds the decoders of the live connections and what they counted.
pub struct ConnectionDecoders {
    limits: Limits,
    max_connections: usize,
    connections: HashMap<ConnectionId, Connection>,
    /// WebSocket connections whose upgrade and answer are read: only their close still
    /// matters (it ends the placement). An id costs far less than a decoder, and a proxy holds
    /// one such connection per online user.
    upgraded: HashSet<ConnectionId>,
    /// Sum of every live decoder's `buffered` bytes.
    buffered_bytes: usize,
    counters: ConnectionCounters,
    shed_undecoded: u64,
    shed_decoded: u64,
    /// What the decoders lost since the last `take_blind_spots`.
    blind_spots: BlindSpots,
    /// The facts of the chunk being decoded: one list for every gRPC decoder, emptied after
    /// each chunk and kept (see `GrpcConnectionDecoder::feed`), down to `KEPT_GRPC_FACTS`
    /// entries after a chunk that held more.
    grpc_facts: Vec<GrpcFact>,
    /// Gateway names and push methods, one copy each for every connection's observations.
    texts: SharedTexts,
}

/// Bounds what a gRPC port's server may send before its client's first bytes and be held for them:
/// an HTTP/2 server's SETTINGS and WINDOW_UPDATE are a few dozen bytes. Past this the connection is
/// taken for gRPC without them.
const MAX_SERVER_FIRST_BYTES: usize = 4096;

/// Sizes the kept facts for what a chunk usually completes (a call's request, or its answer and
/// trailers) with room to spare; a packet hook's chunk of 512 KiB of resets could complete tens of
/// thousands.
const KEPT_GRPC_FACTS: usize = 64;

/// Bounds the upgraded WebSocket connections remembered per decoder slot (`max_connections`): with
/// the decoders themselves, `tracked` stays within `max_connections * (1 + UPGRADED_PER_SLOT)`.
pub const UPGRADED_PER_SLOT: usize = 16;

impl ConnectionDecoders {
    /// Builds an empty table for at most `max_connections` decoders, each within `limits`.
    pub fn new(limits: Limits, max_connections: usize) -> Self {
        Self {
            limits,
            max_connections,
            connections: HashMap::new(),
            upgraded: HashSet::new(),
            buffered_bytes: 0,
            counters: ConnectionCounters::default(),
            shed_undecoded: 0,
            shed_decoded: 0,
            blind_spots: BlindSpots::default(),
            grpc_facts: Vec::new(),
            texts: SharedTexts::default(),
        }
    }

    /// Takes what the decoders lost since the last call, by reason and process.
    pub fn take_blind_spots(&mut self) -> BlindSpots {
        std::mem::take(&mut self.blind_spots)
    }

    /// Says whether `connection` is tracked.
    #[cfg(test)]
    pub fn is_tracked(&self, connection: ConnectionId) -> bool {
        self.connections.contains_key(&connection)
    }

    /// Estimates the bytes held: entries at their fixed cost, decoders' buffers as they are.
    pub fn memory(&self, memory: &mut budget::MemoryCounters) {
        memory.decoder_buffer_bytes = self.buffered_bytes;
        memory.connection_bytes = self.connections.len() * CONNECTION_BYTES
            + self.upgraded.len() * UPGRADED_CONNECTION_BYTES;
        memory.shed_undecoded_decoders = self.shed_undecoded;
        memory.shed_decoders = self.shed_decoded;
    }

    /// Starts tracking the connection of `event` unless it is tracked already. A full table
    /// first evicts a batch of its least useful connections (never decoded anything, then idle
    /// longest), counted in `evicted`: a flood of new connections pushes out stale ones
    /// instead of locking every new one out. `joined_mid_stream`: it was established before the
    /// observer started, so its first bytes went by.
    fn open(&mut self, event: &Event, joined_mid_stream: bool) {
        if self.connections.contains_key(&event.connection) {
            return;
        }
        if self.connections.len() >= self.max_connections {
            let batch = budget::eviction_batch(self.max_connections);
            let evicted = budget::least_useful(self.connections.iter(), batch, |connection| {
                (connection.decoded, connection.last_active_ns)
            });
            for id in evicted {
                if let Some(connection) = self.connections.remove(&id) {
                    self.buffered_bytes -= connection.buffered;
                    if let Some(counters) = connection.protocol.counters() {
                        self.counters.decode.add(counters);
                    }
                    self.counters.evicted += 1;
                }
            }
        }
        self.connections.insert(
            event.connection,
            Connection {
                process: process_of(event),
                gateway: Gateway {
                    ip: event.daddr,
                    port: event.dport,
                    name: None,
                },
                protocol: match event.port_class {
                    PortClass::WebSocket => Protocol::WebSocket(WebSocketDecoder::new(self.limits)),
                    PortClass::Grpc if joined_mid_stream => Protocol::Grpc(Box::new(
                        GrpcConnectionDecoder::joined_mid_stream(self.limits),
                    )),
                    PortClass::Grpc => Protocol::Undetermined {
                        server_first: Vec::new(),
                    },
                },
                last_active_ns: event.ts_ns,
                decoded: false,
                buffered: 0,
            },
        );
    }

    /// Frees at least `bytes` if it can: drops decoders, first those of connections that never
    /// decoded anything, then those idle longest (their connections stay tracked, so later
    /// bytes are ignored rather than decoded from the middle; their counters are kept); then
    /// forgets connections that never decoded anything. Returns the bytes freed.
    pub fn shed(&mut self, bytes: usize) -> usize {
        let mut holders: Vec<(bool, u64, ConnectionId)> = self
            .connections
            .iter()
            .filter(|(_, connection)| connection.buffered > 0)
            .map(|(id, connection)| (connection.decoded, connection.last_active_ns, *id))
            .collect();
        holders.sort_unstable();
        let mut freed = 0;
        for (decoded, _, id) in holders {
            if freed >= bytes {
                break;
            }
            let Some(connection) = self.connections.get_mut(&id) else {
                continue;
            };
            if let Some(counters) = connection.protocol.counters() {
                self.counters.decode.add(counters);
            }
            connection.protocol = Protocol::Shed;
            freed += connection.buffered;
            self.buffered_bytes -= connection.buffered;
            connection.buffered = 0;
            if decoded {
                self.shed_decoded += 1;
            } else {
                self.shed_undecoded += 1;
            }
        }
        // Then the entries of connections that never decoded anything, idle longest first.
        if freed < bytes {
            let undecoded = self
                .connections
                .values()
                .filter(|connection| !connection.decoded)
                .count();
            let wanted = (bytes - freed).div_ceil(CONNECTION_BYTES).min(undecoded);
            let evicted = budget::least_useful(self.connections.iter(), wanted, |connection| {
                (connection.decoded, connection.last_active_ns)
            });
            for id in evicted {
                if let Some(connection) = self.connections.remove(&id) {
                    if let Some(counters) = connection.protocol.counters() {
                        self.counters.decode.add(counters);
                    }
                    self.buffered_bytes -= connection.buffered;
                    self.counters.evicted += 1;
                    freed += CONNECTION_BYTES + connection.buffered;
                }
            }
        }
        freed
    }

    /// Returns the counters of closed connections plus those of the live ones.
    pub fn counters(&self) -> ConnectionCounters {
        let mut counters = self.counters.clone();
        counters.tracked = self.connections.len() + self.upgraded.len();
        for connection in self.connections.values() {
            if let Some(decoder) = connection.protocol.counters() {
                counters.decode.add(decoder);
            }
        }
        counters
    }

    /// Feeds one capture event, and appends what it teaches to `observations`.
    pub fn on_event(&mut self, event: &Event, observations: &mut Vec<Observation>) {
        match &event.kind {
            EventKind::TcpConnect => {
                self.open(event, false);
            }
            EventKind::Data {
                direction,
                offset,
                payload,
                ..
            } => self.on_data(event, *direction, *offset, payload, observations),
            EventKind::Close
            | EventKind::TcpState {
                new: TcpState::Close,
                ..
            } => self.close(event.connection, event.ts_ns, observations),
            // Established before the observer: adopted at start (syscall hook) or at its first
            // packet (packet hook).
            EventKind::TcpState {
                old: TcpState::Unknown,
                new: TcpState::Established,
            } => self.adopt(event, observations),
            EventKind::TcpState { .. } => {}
        }
    }

    /// Adopts a connection established before the observer started (`capture::adopt`).
    fn adopt(&mut self, event: &Event, observations: &mut Vec<Observation>) {
        self.counters.adopted += 1;
        match event.port_class {
            PortClass::WebSocket => {
                self.counters.adopted_websockets_without_user += 1;
                // Only its close still matters, as for an upgraded one.
                if self.upgraded.len() < self.max_connections.saturating_mul(UPGRADED_PER_SLOT) {
                    self.upgraded.insert(event.connection);
                    observations.push(Observation::WebSocketJoinedMidStream {
                        connection: event.connection,
                    });
                } else {
                    self.counters.evicted += 1;
                }
            }
            PortClass::Grpc => self.open(event, true),
        }
    }

    /// Ends every tracked connection not in `alive` (the kernel's watched connections), as if
    /// its close had been seen: closes lost with dropped records end here.
    pub fn reconcile(
        &mut self,
        alive: &std::collections::HashSet<ConnectionId>,
        ts_ns: u64,
        observations: &mut Vec<Observation>,
    ) {
        let gone: Vec<ConnectionId> = self
            .connections
            .keys()
            .chain(self.upgraded.iter())
            .filter(|connection| !alive.contains(connection))
            .copied()
            .collect();
        for connection in gone {
            self.counters.closes_reconciled += 1;
            self.close(connection, ts_ns, observations);
        }
    }

    fn on_data(
        &mut self,
        event: &Event,
        direction: Direction,
        offset: u64,
        payload: &Bytes,
        observations: &mut Vec<Observation>,
    ) {
        if self.upgraded.contains(&event.connection) {
            return;
        }
        if event.port_class == PortClass::Grpc
            && let EventKind::Data {
                call_len,
                truncated: true,
                ..
            } = &event.kind
        {
            let missing = call_len.saturating_sub(payload.len() as u64);
            self.counters.budget_truncated_calls += 1;
            self.counters.budget_truncated_bytes += missing;
            self.blind_spots.record(
                DegradedReason::BudgetExhausted,
                event.connection,
                &process_of(event),
                missing,
            );
        }
        // A connection adopted at start and evicted since is still one joined mid-stream.
        self.open(event, is_adopted_connection(event.connection));
        self.feed(event, direction, offset, payload, observations);
    }

    /// Holds the first chunks of a gRPC port's connection until its client's first bytes tell what
    /// it is (`Protocol::Undetermined`); then each chunk held so far and this one go to the
    /// decoder chosen, in stream order.
    fn decide_protocol(
        &mut self,
        event: &Event,
        direction: Direction,
        offset: u64,
        payload: &Bytes,
        observations: &mut Vec<Observation>,
    ) {
        let limits = self.limits;
        let Some(connection) = self.connections.get_mut(&event.connection) else {
            return;
        };
        let Protocol::Undetermined { server_first: held } = &mut connection.protocol else {
            return;
        };
        let held_bytes: usize = held.iter().map(Bytes::len).sum();
        if direction == Direction::Recv
            && offset == held_bytes as u64
            && held_bytes + payload.len() <= MAX_SERVER_FIRST_BYTES
        {
            // Copied: a slice would keep the whole record it came in alive.
            held.push(Bytes::copy_from_slice(payload));
            let buffered = held_bytes + payload.len();
            self.buffered_bytes = self.buffered_bytes - connection.buffered + buffered;
            connection.buffered = buffered;
            return;
        }
        let server_first = std::mem::take(held);
        let is_http1 =
            direction == Direction::Send && offset == 0 && starts_like_http1_request(payload);
        connection.protocol = if is_http1 {
            Protocol::UpgradeOnGrpcPort(WebSocketDecoder::new(limits))
        } else {
            // Only now is it a gRPC client connection (a WebSocket sent to this port is
            // not one, and must not count as push churn).
            observations.push(Observation::GrpcConnectionOpened {
                connection: event.connection,
                ts_ns: event.ts_ns,
                pusher: connection.process.clone(),
            });
            Protocol::Grpc(Box::new(GrpcConnectionDecoder::new(limits)))
        };
        // The server's first bytes follow the client's first bytes (what it answered them
        // with, for an upgrade), or precede the rest of what it sent.
        if direction == Direction::Send {
            self.feed(event, direction, offset, payload, observations);
        }
        let mut server_offset = 0;
        for held in &server_first {
            self.feed(event, Direction::Recv, server_offset, held, observations);
            server_offset += held.len() as u64;
        }
        if direction == Direction::Recv {
            self.feed(event, direction, offset, payload, observations);
        }
    }

    /// Feeds one chunk of a tracked connection to its decoder, and what the decoder learns to
    /// `observations`; a gRPC port's first chunks go through `decide_protocol` first.
    fn feed(
        &mut self,
        event: &Event,
        direction: Direction,
        offset: u64,
        payload: &Bytes,
        observations: &mut Vec<Observation>,
    ) {
        let Some(connection) = self.connections.get_mut(&event.connection) else {
            return;
        };
        connection.last_active_ns = event.ts_ns;
        if let Protocol::Undetermined { .. } = connection.protocol {
            self.decide_protocol(event, direction, offset, payload, observations);
            return;
        }
        // What the decoder itself observes from here on (not the connection's opening).
        let observed_before = observations.len();
        let previously_buffered = connection.buffered;
        let counters = &mut self.counters;
        let spots = &mut self.blind_spots;
        let Connection {
            process,
            gateway,
            protocol,
            ..
        } = connection;
        let mut view = ConnectionView {
            process,
            gateway,
            texts: &mut self.texts,
        };
        match protocol {
            Protocol::Undetermined { .. } | Protocol::Shed => {}
            Protocol::WebSocket(decoder) => {
                if let Some(fact) = decoder.feed(direction, offset, payload) {
                    note_http1_loss(spots, &fact, event.connection, view.process);
                    observations.extend(websocket_observation(event, &mut view, fact, counters));
                }
                if decoder.is_done() {
                    counters.decode.add(decoder.counters());
                    self.buffered_bytes -= previously_buffered;
                    self.connections.remove(&event.connection);
                    if self.upgraded.len() < self.max_connections.saturating_mul(UPGRADED_PER_SLOT)
                    {
                        self.upgraded.insert(event.connection);
                    } else {
                        // Its close will go unseen: the placement then ends by eviction.
                        counters.evicted += 1;
                    }
                }
            }
            Protocol::UpgradeOnGrpcPort(decoder) => {
                if let Some(fact) = decoder.feed(direction, offset, payload) {
                    note_http1_loss(spots, &fact, event.connection, view.process);
                    observations.extend(upgrade_on_grpc_observation(event, &mut view, fact));
                }
            }
            Protocol::Grpc(decoder) => {
                decoder.feed(direction, offset, payload, &mut self.grpc_facts);
                for fact in self.grpc_facts.drain(..) {
                    note_http2_loss(spots, &fact, event.connection, view.process);
                    observations.extend(grpc_observation(
                        event.ts_ns,
                        event.connection,
                        &mut view,
                        fact,
                        counters,
                    ));
                }
                self.grpc_facts.shrink_to(KEPT_GRPC_FACTS);
            }
        }
        if let Some(connection) = self.connections.get_mut(&event.connection) {
            connection.decoded |= observations.len() > observed_before;
            let buffered = connection.protocol.buffered_bytes();
            self.buffered_bytes = self.buffered_bytes - connection.buffered + buffered;
            connection.buffered = buffered;
        }
    }

    fn close(
        &mut self,
        connection_id: ConnectionId,
        ts_ns: u64,
        observations: &mut Vec<Observation>,
    ) {
        if self.upgraded.remove(&connection_id) {
            observations.push(Observation::ConnectionClosed {
                connection: connection_id,
                ts_ns,
            });
            return;
        }
        let Some(mut connection) = self.connections.remove(&connection_id) else {
            return;
        };
        self.buffered_bytes -= connection.buffered;
        match &mut connection.protocol {
            Protocol::Grpc(decoder) => {
                let mut view = ConnectionView {
                    process: &connection.process,
                    gateway: &connection.gateway,
                    texts: &mut self.texts,
                };
                decoder.finish(&mut self.grpc_facts);
                for fact in self.grpc_facts.drain(..) {
                    note_http2_loss(&mut self.blind_spots, &fact, connection_id, view.process);
                    observations.extend(grpc_observation(
                        ts_ns,
                        connection_id,
                        &mut view,
                        fact,
                        &mut self.counters,
                    ));
                }
                self.grpc_facts.shrink_to(KEPT_GRPC_FACTS);
                self.counters.decode.add(decoder.counters());
            }
            Protocol::WebSocket(decoder) | Protocol::UpgradeOnGrpcPort(decoder) => {
                self.counters.decode.add(decoder.counters());
                if decoder.buffered_bytes() > 0 {
                    self.counters.heads_incomplete += 1;
                    self.blind_spots.record(
                        DegradedReason::LostSync,
                        connection_id,
                        &connection.process,
                        0,
                    );
                }
            }
            Protocol::Undetermined { .. } | Protocol::Shed => {}
        }
        observations.push(Observation::ConnectionClosed {
            connection: connection_id,
            ts_ns,
        });
    }
}

fn process_of(event: &Event) -> Process {
    Process {
        pid: event.pid,
        comm: event.comm.clone(),
        cgroup_id: event.cgroup_id,
    }
}

#[cfg(test)]
mod tests;
