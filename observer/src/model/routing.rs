//! Who talks to whom in OpenIM's routing, and what a push call carries and gets back.

use std::net::IpAddr;

use serde::Serialize;

/// A process seen on one end of a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Process {
    pub pid: u32,
    pub comm: String,
    /// cgroup v2 id of the process: what names its pod (`--kube`).
    pub cgroup_id: u64,
}

/// A gateway as one side of OpenIM addressed it: the IP it dialled and the member string it
/// used (`Host` for the proxy, `:authority` for push), when seen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Gateway {
    pub ip: IpAddr,
    pub port: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
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

/// A gateway's answer for one requested user. No platforms means the gateway holds no
/// connection for the user.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserResult {
    pub user_id: String,
    pub online_push: bool,
    pub platforms: Vec<PlatformResult>,
}

/// How the write to one of the user's connections (one platform) went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PlatformResult {
    pub platform_id: i32,
    /// 0 delivered, -2 write failed, -3 iOS in background.
    pub result_code: i64,
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
