//! Names the OpenIM releases the lab speaks and how each one's push reaches the gateways, as read
//! in open-im-server and OpenIMSDK/protocol at their tags (see `../shared/openim/NOTES.md`, "Later
//! releases"): the gRPC service name, whether push keeps its connections, whether the gateway
//! answers in request order, and whether push hashes recipients over a ring or sends every
//! recipient to every gateway.

use serde::{Deserialize, Serialize};

/// Names the gRPC service of protocol v0.0.42 to v0.0.57 (OpenIM 3.5 and 3.6).
pub const SERVICE_3_5: &str = "OpenIMServer.msggateway.msgGateway";
/// Names the same service after protocol v0.0.58 renamed the package (OpenIM 3.7 and later).
pub const SERVICE_3_7: &str = "openim.msggateway.msgGateway";
/// Names the method push calls for a group message.
pub const SUPER_GROUP_PUSH: &str = "SuperGroupOnlineBatchPushOneMsg";

/// Names an OpenIM release line.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, clap::ValueEnum, Serialize, Deserialize,
)]
pub enum OpenImRelease {
    /// 3.5.x (protocol v0.0.42): a new push connection per call.
    #[default]
    #[value(name = "3.5")]
    #[serde(rename = "3.5")]
    V3_5,
    /// 3.6.x (protocol v0.0.55): long-lived push connections.
    #[value(name = "3.6")]
    #[serde(rename = "3.6")]
    V3_6,
    /// 3.7.0-3.7.1: the `openim.*` package name, the same messages.
    #[value(name = "3.7")]
    #[serde(rename = "3.7")]
    V3_7,
    /// 3.8.0-3.8.3: answers in any order (upstream's default discovery is etcd, the lab's
    /// stays kubernetes: pass `--discovery etcd`).
    #[value(name = "3.8")]
    #[serde(rename = "3.8")]
    V3_8,
    /// 3.8.4-alpha.1 and main: every recipient to every gateway, whatever the discovery.
    #[value(name = "main")]
    #[serde(rename = "main")]
    Main,
}

/// Says where push learns the gateways from.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, clap::ValueEnum, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Discovery {
    /// The StatefulSet's member strings (`MY_MSGGATEWAY_REPLICACOUNT`).
    #[default]
    Kubernetes,
    /// Registered gateway addresses (etcd; zookeeper behaves the same for push).
    Etcd,
}

/// Says how push splits one message's recipients over the gateways.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PushRouting {
    /// Each recipient to the gateway push's `…:88` ring picks.
    Ring,
    /// Every recipient to every gateway, dialled by address.
    Broadcast,
}

impl OpenImRelease {
    /// Returns the release as `--openim` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V3_5 => "3.5",
            Self::V3_6 => "3.6",
            Self::V3_7 => "3.7",
            Self::V3_8 => "3.8",
            Self::Main => "main",
        }
    }

    /// Returns the gRPC service the gateway serves and push calls.
    pub fn service(self) -> &'static str {
        match self {
            Self::V3_5 | Self::V3_6 => SERVICE_3_5,
            Self::V3_7 | Self::V3_8 | Self::Main => SERVICE_3_7,
        }
    }

    /// Returns the `:path` of push's group-message call.
    pub fn push_path(self) -> String {
        format!("/{}/{SUPER_GROUP_PUSH}", self.service())
    }

    /// Tells whether push keeps one connection per gateway (3.6 and later) rather than dialling
    /// anew for every call (3.5).
    pub fn reuses_push_connections(self) -> bool {
        self != Self::V3_5
    }

    /// Tells whether the gateway may answer in another order than the request's users (3.8 and
    /// later; the lab answers in reverse order).
    pub fn reorders_answers(self) -> bool {
        matches!(self, Self::V3_8 | Self::Main)
    }

    /// Returns how push routes with `discovery`: the ring only with Kubernetes discovery before
    /// 3.8.4.
    pub fn routing(self, discovery: Discovery) -> PushRouting {
        match (self, discovery) {
            (Self::Main, _) | (_, Discovery::Etcd) => PushRouting::Broadcast,
            (_, Discovery::Kubernetes) => PushRouting::Ring,
        }
    }
}

impl Discovery {
    /// Returns the discovery as `--discovery` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kubernetes => "kubernetes",
            Self::Etcd => "etcd",
        }
    }
}

impl PushRouting {
    /// Returns the routing as the observer's `push_routing` line spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ring => "ring",
            Self::Broadcast => "broadcast",
        }
    }
}

#[cfg(test)]
mod tests;
