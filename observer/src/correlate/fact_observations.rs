//! Reads what the decoders' facts mean in routing terms: an `Observation` for each fact that places
//! a user, calls a gateway or answers a call, and a blind spot for each that says the decoder
//! lost sight of its connection.

use crate::{
    alert::DegradedReason,
    decode::{
        GrpcFact, Http1Error, RequestBody, ResponseBody, Undecodable, WebSocketFact,
        protobuf::service_of,
    },
    model::{ConnectionId, ConnectionKey, Event, Gateway, Process},
};

use super::{
    Observation, blindness::BlindSpots, connection_counters::ConnectionCounters,
    shared_texts::SharedTexts,
};

/// Notes a decoder that stopped seeing its connection as a blind spot. Joining mid-stream is not
/// counted here: every connection open when the observer starts does it.
pub(super) fn note_http2_loss(
    spots: &mut BlindSpots,
    fact: &GrpcFact,
    connection: ConnectionId,
    process: &Process,
) {
    let GrpcFact::Undecodable(reason) = fact else {
        return;
    };
    match reason {
        Undecodable::JoinedMidStream { .. } => {}
        Undecodable::Gap { missing, .. } => {
            spots.record(DegradedReason::LostSync, connection, process, *missing);
        }
        Undecodable::NoClientPreface
        | Undecodable::BufferOverflow { .. }
        | Undecodable::Framing { .. }
        | Undecodable::Hpack { .. } => {
            spots.record(DegradedReason::Undecodable, connection, process, 0);
        }
    }
}

/// Notes a WebSocket decoder that could not read a head as a blind spot; joining mid-stream is
/// not counted.
pub(super) fn note_http1_loss(
    spots: &mut BlindSpots,
    fact: &WebSocketFact,
    connection: ConnectionId,
    process: &Process,
) {
    let WebSocketFact::Undecodable { reason, .. } = fact else {
        return;
    };
    match reason {
        Http1Error::JoinedMidStream(_) => {}
        Http1Error::Gap { .. } => spots.record(DegradedReason::LostSync, connection, process, 0),
        Http1Error::HeadTooLarge(_) | Http1Error::Parse(_) => {
            spots.record(DegradedReason::Undecodable, connection, process, 0);
        }
    }
}

/// Holds what the observation builders need of a connection, borrowed apart from its decoder, and
/// the texts every connection shares.
pub(super) struct ConnectionView<'a> {
    pub(super) process: &'a Process,
    pub(super) gateway: &'a Gateway,
    pub(super) texts: &'a mut SharedTexts,
}

fn named_gateway(gateway: &Gateway, name: Option<&str>, texts: &mut SharedTexts) -> Gateway {
    Gateway {
        ip: gateway.ip,
        port: gateway.port,
        name: name.map(|name| texts.share(name)),
    }
}

/// Turns a WebSocket connection's fact into a placement request or answer; counts an upgrade
/// without a user.
pub(super) fn websocket_observation(
    event: &Event,
    view: &mut ConnectionView<'_>,
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
                gateway: named_gateway(view.gateway, request.host.as_deref(), view.texts),
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

/// Turns the fact of a WebSocket upgrade sent to a gRPC port into its observation.
pub(super) fn upgrade_on_grpc_observation(
    event: &Event,
    view: &mut ConnectionView<'_>,
    fact: WebSocketFact,
) -> Option<Observation> {
    match fact {
        WebSocketFact::UpgradeRequest(request) => Some(Observation::UpgradeOnGrpcPort {
            connection: event.connection,
            ts_ns: event.ts_ns,
            user: request.send_id.filter(|user| !user.is_empty()),
            gateway: named_gateway(view.gateway, request.host.as_deref(), view.texts),
            proxy: view.process.clone(),
        }),
        WebSocketFact::UpgradeResponse { status } => Some(Observation::UpgradeOnGrpcPortAnswered {
            connection: event.connection,
            status,
        }),
        WebSocketFact::Undecodable { .. } => None,
    }
}

/// Turns a push connection's fact into a push call or answer; counts the calls and answers it
/// cannot read.
pub(super) fn grpc_observation(
    ts_ns: u64,
    connection: ConnectionId,
    view: &mut ConnectionView<'_>,
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
                method: view
                    .texts
                    .share(method.rsplit('/').next().unwrap_or(&method)),
                service: service_of(&method).map(|service| view.texts.share(service)),
                gateway: named_gateway(view.gateway, authority.as_deref(), view.texts),
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
