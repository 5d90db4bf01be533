//! Alerts: one JSON object per line on stdout, each with `kind`, `schema_version` and `ts`, and
//! enough context to act on without reading code. The README documents every field.

use std::net::IpAddr;

use serde::Serialize;

/// Version of the alert objects; bumped when a field changes meaning.
pub const SCHEMA_VERSION: u32 = 1;

/// A process seen on one end of a connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Process {
    pub pid: u32,
    pub comm: String,
    /// cgroup v2 id of the process, kept so the output can name its pod (`--kube`).
    #[serde(skip)]
    pub cgroup_id: u64,
    /// The pod the process runs in, when `--kube` knows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
}

/// A Kubernetes pod, by the names `kubectl` takes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
}

/// A gateway as one side of OpenIM addressed it: the IP it dialled and the member string it
/// used (`Host` for the proxy, `:authority` for push), when seen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Gateway {
    pub ip: IpAddr,
    pub port: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The pod that holds `ip`, when `--kube` knows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
}

/// Where the proxy placed a user's WebSocket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlacementInfo {
    pub gateway: Gateway,
    pub platforms: Vec<i32>,
    /// RFC 3339 time the placement's upgrade was seen.
    pub since: String,
    pub proxy: Process,
}

/// Ids that identify a message without revealing it (never its content).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct MessageIds {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_msg_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_msg_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_type: Option<i32>,
}

/// What the gateway that received a push answered for one user.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GatewayAnswer {
    /// At least one of the user's connections on that gateway took the message.
    Delivered,
    /// The gateway holds no connection for the user: the message missed real time.
    NotOnlineHere,
    /// Connections exist but every write failed (result codes say why).
    DeliveryFailed,
    /// No answer was seen (connection closed first, or the answer was not captured).
    Unknown,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlatformResult {
    pub platform_id: i32,
    pub result_code: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PushInfo {
    pub gateway: Gateway,
    pub method: String,
    pub message: MessageIds,
    pub pusher: Process,
    pub answer: GatewayAnswer,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub answer_platforms: Vec<PlatformResult>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AlertBody {
    /// A push for `user` went to a gateway other than the one(s) holding its WebSocket.
    RouteMismatch {
        user: String,
        placed_on: Vec<PlacementInfo>,
        pushed_to: PushInfo,
        /// Mismatches for this (user, placement, push gateway) in the current window,
        /// including this one.
        count: u64,
        window_secs: u64,
        diagnosis: String,
    },
    /// The proxy places users with a ring over differently spelled members than push's, so
    /// the two rings split users.
    RingDivergence {
        /// The proxy's ring as inferred from its placements, in its `Host` spelling.
        proxy_members: Vec<String>,
        /// Push's ring, from the `:authority` of its calls.
        push_members: Vec<String>,
        difference: String,
        /// Placements seen, and how many of them push's ring sends elsewhere.
        placements_seen: usize,
        placements_split: usize,
        /// Share of a uniform sample of user ids the two rings send to different gateways.
        sample_split_share: f64,
        diagnosis: String,
    },
    /// A WebSocket upgrade was sent to a gRPC port (the incident report's fix as written).
    WsUpgradeOnGrpcPort {
        gateway: Gateway,
        users: Vec<String>,
        proxy: Process,
        /// Status the port answered with, if it answered in HTTP/1 at all.
        #[serde(skip_serializing_if = "Option::is_none")]
        answer_status: Option<u16>,
        count: u64,
        window_secs: u64,
        diagnosis: String,
    },
    /// A pusher opens a new gRPC connection per call and does not close them.
    PushConnectionChurn {
        pusher: Process,
        new_connections: u64,
        window_secs: u64,
        per_second: f64,
        open_connections: u64,
        calls_per_connection: f64,
        diagnosis: String,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Alert {
    pub schema_version: u32,
    /// RFC 3339 time of the event that raised the alert.
    pub ts: String,
    /// The same time in Unix nanoseconds, for measuring how long the alert took.
    #[serde(skip)]
    pub ts_ns: u64,
    #[serde(flatten)]
    pub body: AlertBody,
}

impl Alert {
    pub fn new(ts_ns: u64, body: AlertBody) -> Self {
        Self {
            schema_version: SCHEMA_VERSION,
            ts: rfc3339(ts_ns),
            ts_ns,
            body,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self.body {
            AlertBody::RouteMismatch { .. } => "route_mismatch",
            AlertBody::RingDivergence { .. } => "ring_divergence",
            AlertBody::WsUpgradeOnGrpcPort { .. } => "ws_upgrade_on_grpc_port",
            AlertBody::PushConnectionChurn { .. } => "push_connection_churn",
        }
    }

    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).expect("alerts contain only serialisable fields")
    }
}

/// Unix nanoseconds as RFC 3339 with microseconds.
pub fn rfc3339(ts_ns: u64) -> String {
    humantime::format_rfc3339_micros(std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ts_ns))
        .to_string()
}
