//! Defines `Observation`: what happened on the wire, in routing terms. `connections` produces them
//! from decoded traffic; the detectors consume them.

use std::sync::Arc;

use crate::model::{ConnectionId, ConnectionKey, Gateway, MessageIds, Process, UserId, UserResult};

/// Says what happened on the wire, in routing terms.
#[derive(Clone, Debug, PartialEq)]
pub enum Observation {
    /// A process connected to a watched gRPC port.
    GrpcConnectionOpened {
        connection: ConnectionId,
        ts_ns: u64,
        pusher: Process,
    },
    ConnectionClosed {
        connection: ConnectionId,
        ts_ns: u64,
    },
    /// The proxy asked a gateway's WebSocket port to take `user`.
    UpgradeRequested {
        connection: ConnectionId,
        /// The connection's two ends, which name the placement in cluster mode.
        endpoints: ConnectionKey,
        ts_ns: u64,
        user: String,
        platform: Option<i32>,
        gateway: Gateway,
        proxy: Process,
    },
    /// A WebSocket adopted at start, upgraded before the observer watched: its user is unknown.
    WebSocketJoinedMidStream { connection: ConnectionId },
    UpgradeAnswered {
        connection: ConnectionId,
        ts_ns: u64,
        status: u16,
    },
    /// A WebSocket upgrade went to a gRPC port.
    UpgradeOnGrpcPort {
        connection: ConnectionId,
        ts_ns: u64,
        user: Option<String>,
        gateway: Gateway,
        proxy: Process,
    },
    /// Whatever the gRPC port answered to such an upgrade, if it spoke HTTP/1 at all.
    UpgradeOnGrpcPortAnswered {
        connection: ConnectionId,
        status: u16,
    },
    PushCalled {
        connection: ConnectionId,
        stream_id: u32,
        ts_ns: u64,
        /// The method's name (`SuperGroupOnlineBatchPushOneMsg`).
        method: Arc<str>,
        /// The gRPC service of its `:path` (`openim.msggateway.msgGateway`), when it had one.
        service: Option<Arc<str>>,
        gateway: Gateway,
        pusher: Process,
        message: MessageIds,
        recipients: Vec<UserId>,
    },
    PushAnswered {
        connection: ConnectionId,
        stream_id: u32,
        ts_ns: u64,
        results: Vec<UserResult>,
    },
}
