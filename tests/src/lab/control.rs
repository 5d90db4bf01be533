//! Carries the lab's control channel to its pods: JSON lines on the pod process's stdin (commands)
//! and stdout (events). It is a pipe, not the network, so the observer never sees it as traffic.

use std::io::Write;

use serde::{Deserialize, Serialize};

use crate::lab::truth::FloodReport;

/// Names what a pod tells the lab.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum PodEvent {
    /// The pod's listeners are bound (or, for push, its ring is built).
    Ready,
    /// A gateway registered a WebSocket session from the upgrade request's query.
    SessionOpened {
        user_id: String,
        platform_id: i32,
        /// The HTTP `Host` header of the upgrade request, as the gateway received it.
        host: String,
    },
    SessionClosed {
        user_id: String,
        platform_id: i32,
    },
    /// A gateway answered a push RPC.
    PushServed {
        method: String,
        /// The HTTP/2 `:authority` the gateway received.
        authority: String,
        users: usize,
        delivered: usize,
    },
    /// The proxy relays a client to a gateway.
    RelayOpened {
        user_id: String,
        member: String,
        dialed: String,
    },
    /// The proxy could not reach the gateway it picked; the client got `502 Bad Gateway`.
    RelayFailed {
        user_id: String,
        member: String,
        dialed: String,
        error: String,
    },
    /// The proxy stopped accepting (SIGTERM) and keeps serving the relays it has.
    ListenerClosed,
    PushDone(PushOutcome),
    FloodDone(FloodReport),
    /// A command could not be carried out.
    CommandFailed {
        error: String,
    },
}

/// Names what the lab asks the push pod to do.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum PushCommand {
    /// Push one message to the recipients, as OpenIM push does for a group message.
    Push {
        client_msg_id: String,
        seq: i64,
        send_id: String,
        recipients: Vec<String>,
    },
    /// Push in a loop at full speed for `duration_ms`, measuring each call.
    Flood {
        duration_ms: u64,
        recipients: Vec<String>,
    },
}

/// Holds the push pod's account of one message: one gRPC call per gateway member.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PushOutcome {
    pub client_msg_id: String,
    pub calls: Vec<PushCall>,
}

/// Records one gRPC call of a push: its member, gateway, recipients and answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PushCall {
    /// The push ring's member string (with `:88`), also the call's `:authority`.
    pub member: String,
    pub gateway_addr: String,
    /// The recipients this call carried.
    pub recipients: Vec<String>,
    /// The gateway's answer per recipient; empty when the call failed.
    pub results: Vec<UserPushResult>,
    pub error: Option<String>,
}

/// Records the gateway's answer for one recipient.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct UserPushResult {
    pub user_id: String,
    /// The gateway's `onlinePush`: it wrote the message to at least one connection of the user.
    pub online_push: bool,
    pub platform_results: usize,
}

/// Writes one event line on stdout, where the lab reads it. A lab that went away (broken pipe)
/// is not an error worth stopping a pod for: the lab kills its pods anyway.
pub fn emit(event: &PodEvent) {
    if let Ok(line) = serde_json::to_string(event) {
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "{line}");
        let _ = stdout.flush();
    }
}
