//! One decoder per live connection, chosen by port class and first bytes, turning capture
//! events into routing `Observation`s.
//!
//! - WebSocket ports: the proxy's upgrade request places a user; the answer confirms it.
//! - gRPC ports: HTTP/2 from the preface on, push calls and the gateway's answers. If the first
//!   bytes are an HTTP/1 request instead, it is a WebSocket upgrade sent to the gRPC port.

use std::collections::{HashMap, HashSet};

use crate::{
    decode::{
        DecodeCounters, GrpcConnectionDecoder, GrpcFact, Limits, RequestBody, ResponseBody,
        WebSocketDecoder, WebSocketFact,
    },
    model::{
        ConnectionId, ConnectionKey, Direction, Event, EventKind, Gateway, PortClass, Process,
        TcpState, wire::starts_like_http1_request,
    },
};
use observer_records::is_adopted_connection;

use super::Observation;

#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ConnectionCounters {
    pub tracked: usize,
    pub evicted: u64,
    pub upgrades_without_user: u64,
    pub calls_not_push: u64,
    pub calls_compressed: u64,
    pub calls_malformed: u64,
    pub answers_unreadable: u64,
    /// Connections adopted at start (established before the observer watched), and of them
    /// the WebSockets, whose users are unknown.
    pub adopted: u64,
    pub adopted_websockets_without_user: u64,
    /// Connections found gone by reconciling with the kernel, their close never seen.
    pub closes_reconciled: u64,
    pub decode: DecodeCounters,
}

enum Protocol {
    /// Nothing sent yet on a gRPC port: the first bytes decide.
    Undetermined,
    WebSocket(WebSocketDecoder),
    Grpc(Box<GrpcConnectionDecoder>),
    UpgradeOnGrpcPort(WebSocketDecoder),
}

struct Connection {
    process: Process,
    gateway: Gateway,
    protocol: Protocol,
}

pub struct ConnectionDecoders {
    limits: Limits,
    max_connections: usize,
    connections: HashMap<ConnectionId, Connection>,
    /// WebSocket connections whose upgrade and answer are read: only their close still
    /// matters (it ends the placement). An id costs far less than a decoder, and a proxy holds
    /// one such connection per online user.
    upgraded: HashSet<ConnectionId>,
    counters: ConnectionCounters,
}

/// Upgraded WebSocket connections remembered per decoder slot (`max_connections`): with the
/// decoders themselves, `tracked` stays within `max_connections * (1 + UPGRADED_PER_SLOT)`.
pub const UPGRADED_PER_SLOT: usize = 16;

impl ConnectionDecoders {
    pub fn new(limits: Limits, max_connections: usize) -> Self {
        Self {
            limits,
            max_connections,
            connections: HashMap::new(),
            upgraded: HashSet::new(),
            counters: ConnectionCounters::default(),
        }
    }

    /// Counters of closed connections plus those of the live ones.
    pub fn counters(&self) -> ConnectionCounters {
        let mut counters = self.counters.clone();
        counters.tracked = self.connections.len() + self.upgraded.len();
        for connection in self.connections.values() {
            match &connection.protocol {
                Protocol::WebSocket(decoder) | Protocol::UpgradeOnGrpcPort(decoder) => {
                    counters.decode.add(decoder.counters());
                }
                Protocol::Grpc(decoder) => counters.decode.add(decoder.counters()),
                Protocol::Undetermined => {}
            }
        }
        counters
    }

    pub fn on_event(&mut self, event: &Event, observations: &mut Vec<Observation>) {
        match &event.kind {
            EventKind::TcpConnect => {
                open(
                    &mut self.connections,
                    &mut self.counters,
                    self.limits,
                    self.max_connections,
                    event,
                );
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
            EventKind::TcpState {
                new: TcpState::Established,
                ..
            } if is_adopted_connection(event.connection) => self.adopt(event, observations),
            EventKind::TcpState { .. } => {}
        }
    }

    /// A connection established before the observer started (`capture::adopt`).
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
            PortClass::Grpc => {
                open(
                    &mut self.connections,
                    &mut self.counters,
                    self.limits,
                    self.max_connections,
                    event,
                );
            }
        }
    }

    /// Ends every tracked connection not in `alive` (the kernel's watched connections), as if
    /// its close had been seen: closes lost with dropped records end here.
    pub fn reconcile(
        &mut self,
        alive: &HashSet<ConnectionId>,
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
        payload: &[u8],
        observations: &mut Vec<Observation>,
    ) {
        if self.upgraded.contains(&event.connection) {
            return;
        }
        let limits = self.limits;
        let Some(connection) = open(
            &mut self.connections,
            &mut self.counters,
            limits,
            self.max_connections,
            event,
        ) else {
            return;
        };
        if let Protocol::Undetermined = connection.protocol {
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
        }
        let counters = &mut self.counters;
        let Connection {
            process,
            gateway,
            protocol,
        } = connection;
        let view = ConnectionView { process, gateway };
        match protocol {
            Protocol::Undetermined => {}
            Protocol::WebSocket(decoder) => {
                if let Some(fact) = decoder.feed(direction, offset, payload) {
                    observations.extend(websocket_observation(event, &view, fact, counters));
                }
                if decoder.is_done() {
                    counters.decode.add(decoder.counters());
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
                    observations.extend(upgrade_on_grpc_observation(event, &view, fact));
                }
            }
            Protocol::Grpc(decoder) => {
                for fact in decoder.feed(direction, offset, payload) {
                    observations.extend(grpc_observation(
                        event.ts_ns,
                        event.connection,
                        &view,
                        fact,
                        counters,
                    ));
                }
            }
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
        match &mut connection.protocol {
            Protocol::Grpc(decoder) => {
                let view = ConnectionView {
                    process: &connection.process,
                    gateway: &connection.gateway,
                };
                for fact in decoder.finish() {
                    observations.extend(grpc_observation(
                        ts_ns,
                        connection_id,
                        &view,
                        fact,
                        &mut self.counters,
                    ));
                }
                self.counters.decode.add(decoder.counters());
            }
            Protocol::WebSocket(decoder) | Protocol::UpgradeOnGrpcPort(decoder) => {
                self.counters.decode.add(decoder.counters());
            }
            Protocol::Undetermined => {}
        }
        observations.push(Observation::ConnectionClosed {
            connection: connection_id,
            ts_ns,
        });
    }
}

/// Starts tracking a connection; `None` when the table is full (counted).
fn open<'a>(
    connections: &'a mut HashMap<ConnectionId, Connection>,
    counters: &mut ConnectionCounters,
    limits: Limits,
    max_connections: usize,
    event: &Event,
) -> Option<&'a mut Connection> {
    if !connections.contains_key(&event.connection) && connections.len() >= max_connections {
        counters.evicted += 1;
        return None;
    }
    Some(
        connections
            .entry(event.connection)
            .or_insert_with(|| Connection {
                process: process_of(event),
                gateway: Gateway {
                    ip: event.daddr,
                    port: event.dport,
                    name: None,
                },
                protocol: match event.port_class {
                    PortClass::WebSocket => Protocol::WebSocket(WebSocketDecoder::new(limits)),
                    // Adopted: the preface and the first bytes went by before the observer.
                    PortClass::Grpc if is_adopted_connection(event.connection) => {
                        Protocol::Grpc(Box::new(GrpcConnectionDecoder::joined_mid_stream(limits)))
                    }
                    PortClass::Grpc => Protocol::Undetermined,
                },
            }),
    )
}

/// What the observation builders need of a connection, borrowed apart from its decoder.
struct ConnectionView<'a> {
    process: &'a Process,
    gateway: &'a Gateway,
}

fn process_of(event: &Event) -> Process {
    Process {
        pid: event.pid,
        comm: event.comm.clone(),
        cgroup_id: event.cgroup_id,
    }
}

fn named_gateway(gateway: &Gateway, name: Option<String>) -> Gateway {
    Gateway {
        ip: gateway.ip,
        port: gateway.port,
        name,
    }
}

fn websocket_observation(
    event: &Event,
    view: &ConnectionView<'_>,
    fact: WebSocketFact,
    counters: &mut ConnectionCounters,
) -> Option<Observation> {
    match fact {
        WebSocketFact::UpgradeRequest(request) => {
            let Some(user) = request.send_id.filter(|user| !user.is_empty()) else {
                counters.upgrades_without_user += 1;
                return None;
            };
            Some(Observation::UpgradeRequested {
                connection: event.connection,
                endpoints: ConnectionKey::of(event),
                ts_ns: event.ts_ns,
                user,
                platform: request.platform_id,
                gateway: named_gateway(view.gateway, request.host),
                proxy: view.process.clone(),
            })
        }
        WebSocketFact::UpgradeResponse { status } => Some(Observation::UpgradeAnswered {
            connection: event.connection,
            ts_ns: event.ts_ns,
            status,
        }),
        // Counted by the decoder.
        WebSocketFact::Undecodable { .. } => None,
    }
}

fn upgrade_on_grpc_observation(
    event: &Event,
    view: &ConnectionView<'_>,
    fact: WebSocketFact,
) -> Option<Observation> {
    match fact {
        WebSocketFact::UpgradeRequest(request) => Some(Observation::UpgradeOnGrpcPort {
            connection: event.connection,
            ts_ns: event.ts_ns,
            user: request.send_id.filter(|user| !user.is_empty()),
            gateway: named_gateway(view.gateway, request.host),
            proxy: view.process.clone(),
        }),
        WebSocketFact::UpgradeResponse { status } => Some(Observation::UpgradeOnGrpcPortAnswered {
            connection: event.connection,
            status,
        }),
        WebSocketFact::Undecodable { .. } => None,
    }
}

fn grpc_observation(
    ts_ns: u64,
    connection: ConnectionId,
    view: &ConnectionView<'_>,
    fact: GrpcFact,
    counters: &mut ConnectionCounters,
) -> Option<Observation> {
    match fact {
        GrpcFact::Request {
            stream_id,
            method,
            authority,
            body,
        } => match body {
            RequestBody::Push(call) => Some(Observation::PushCalled {
                connection,
                stream_id,
                ts_ns,
                method: method.rsplit('/').next().unwrap_or(&method).to_owned(),
                gateway: named_gateway(view.gateway, authority),
                pusher: view.process.clone(),
                message: call.message,
                recipients: call.recipients,
            }),
            RequestBody::OtherMethod => {
                counters.calls_not_push += 1;
                None
            }
            RequestBody::Compressed => {
                counters.calls_compressed += 1;
                None
            }
            RequestBody::Missing | RequestBody::Malformed(_) => {
                counters.calls_malformed += 1;
                None
            }
        },
        GrpcFact::Response {
            stream_id, body, ..
        } => match body {
            ResponseBody::Push { results, .. } => Some(Observation::PushAnswered {
                connection,
                stream_id,
                ts_ns,
                results,
            }),
            ResponseBody::Compressed | ResponseBody::Malformed(_) => {
                counters.answers_unreadable += 1;
                None
            }
        },
        GrpcFact::Trailers { .. } | GrpcFact::Undecodable(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn event(kind: EventKind) -> Event {
        Event {
            ts_ns: 1,
            connection: 7,
            pid: 10,
            comm: "msggw-proxy".into(),
            cgroup_id: 1,
            saddr: "10.0.0.2".parse().unwrap(),
            sport: 40000,
            daddr: "10.0.0.10".parse().unwrap(),
            dport: 80,
            port_class: PortClass::WebSocket,
            kind,
        }
    }

    fn data(direction: Direction, bytes: &'static [u8]) -> Event {
        event(EventKind::Data {
            direction,
            offset: 0,
            call_len: bytes.len() as u64,
            truncated: false,
            payload: Bytes::from_static(bytes),
        })
    }

    #[test]
    fn an_upgraded_websocket_keeps_only_its_id_until_it_closes() {
        let mut decoders = ConnectionDecoders::new(Limits::default(), 4);
        let mut observations = Vec::new();
        decoders.on_event(&event(EventKind::TcpConnect), &mut observations);
        decoders.on_event(
            &data(
                Direction::Send,
                b"GET /?sendID=42&platformID=2 HTTP/1.1\r\nHost: gw-0\r\nUpgrade: websocket\r\n\r\n",
            ),
            &mut observations,
        );
        decoders.on_event(
            &data(Direction::Recv, b"HTTP/1.1 101 Switching Protocols\r\n\r\n"),
            &mut observations,
        );
        assert!(decoders.connections.is_empty(), "the decoder is released");
        assert_eq!(decoders.counters().tracked, 1);
        assert!(matches!(
            observations.as_slice(),
            [
                Observation::UpgradeRequested { user, .. },
                Observation::UpgradeAnswered { status: 101, .. }
            ] if user == "42"
        ));
        observations.clear();
        decoders.on_event(&event(EventKind::Close), &mut observations);
        assert!(matches!(
            observations.as_slice(),
            [Observation::ConnectionClosed { connection: 7, .. }]
        ));
        assert_eq!(decoders.counters().tracked, 0);
    }
}
