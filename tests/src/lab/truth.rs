//! Records the ground truth: what really happened in a lab run, for checking an observer's
//! conclusions.

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::lab::release::{Discovery, OpenImRelease, PushRouting};

/// Records what really happened in a lab run: the configuration, every gateway and user, and a
/// summary.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GroundTruth {
    pub mode: String,
    /// The release the stand-in spoke, the discovery push used, and the routing they make.
    pub openim: OpenImRelease,
    pub discovery: Discovery,
    pub routing: PushRouting,
    pub instance: String,
    pub namespace: String,
    pub replicas_initial: usize,
    pub replicas_final: usize,
    pub proxy_addr: String,
    /// Gateway pods in index order.
    pub gateways: Vec<GatewayTruth>,
    pub users: Vec<UserTruth>,
    pub summary: Summary,
    /// When the scale-out began (Unix milliseconds), if the run had one.
    pub scaled_out_at_unix_ms: Option<u64>,
}

/// Records one gateway pod: its address, namespace, process and member strings.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GatewayTruth {
    pub index: usize,
    pub ip: String,
    pub netns: String,
    pub pid: Option<u32>,
    /// Member strings as the proxy (no port) and push (`:88`) spell this gateway.
    pub proxy_member: String,
    pub push_member: String,
}

/// Records one user: where its WebSocket lives, each push to it, and why it missed a message.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct UserTruth {
    pub user_id: String,
    pub platform_id: i32,
    /// Connected after the scale-out (a "late" user) rather than before it.
    pub connected_after_scale: bool,
    /// Where the user's WebSocket lives, as the gateway that registered it reports.
    pub websocket: Option<Placement>,
    /// Why the WebSocket could not be opened through the proxy.
    pub connect_error: Option<String>,
    pub pushes: Vec<PushTruth>,
    /// Why a connected user missed a message in real time; `None` when it missed none.
    pub miss_cause: Option<MissCause>,
}

/// Says why a connected user's message went to a gateway that does not hold its WebSocket, spelled
/// as the observer's `route_mismatch` `cause`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MissCause {
    /// The proxy's and push's rings (as the proxy mode spells members) pick different
    /// gateways for the user now.
    RingSpelling,
    /// The rings agree now, but the user connected before the scale-out and stayed where the
    /// older membership placed it.
    StalePlacement,
    /// Neither: the lab knows no routing reason (e.g. a broadcast, where nobody should miss).
    Undetermined,
}

impl MissCause {
    /// Returns the cause as the observer spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RingSpelling => "ring_spelling",
            Self::StalePlacement => "stale_placement",
            Self::Undetermined => "undetermined",
        }
    }
}

/// Records where a user's WebSocket lives, as the gateway that registered it reports.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Placement {
    pub gateway_index: usize,
    pub gateway_ip: String,
    /// The `Host` header the gateway received on the upgrade (the proxy's member string).
    pub host_header: String,
}

/// Records one message's push to one user and whether it arrived in real time.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PushTruth {
    pub client_msg_id: String,
    pub seq: i64,
    /// The push ring's member for this user (the call's `:authority`).
    pub member: Option<String>,
    pub gateway_index: Option<usize>,
    pub gateway_ip: Option<String>,
    /// The gateway's `onlinePush` answer for the user.
    pub online_push: bool,
    pub arrived_in_time: bool,
    pub latency_ms: Option<f64>,
    pub error: Option<String>,
}

/// Counts a run's users, connections, messages and misses.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Summary {
    pub users: usize,
    pub connected: usize,
    pub connect_failures: usize,
    pub messages: usize,
    /// (user, message) pairs that were pushed.
    pub deliveries: usize,
    /// (user, message) pairs that did not arrive on the WebSocket within the timeout.
    pub realtime_misses: usize,
    /// Users who missed at least one message in real time.
    pub users_missing: usize,
    /// Connected users whose push went to a different gateway than their WebSocket.
    pub users_misrouted: usize,
    /// Push calls the gateways answered.
    pub push_calls: usize,
    /// Push calls whose `:authority` at the gateway differed from what push dials: the ring
    /// member string, or the gateway's address where push broadcasts.
    pub authority_mismatches: usize,
    /// Push calls the gateway answered in another order than the request's users.
    #[serde(default)]
    pub answers_out_of_order: usize,
    pub realtime_timeout_ms: u64,
}

/// Holds the push-loop benchmark's result; latencies cover connect + call, as push pays both per
/// message.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FloodReport {
    pub calls: u64,
    pub errors: u64,
    pub seconds: f64,
    pub pushes_per_second: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

impl GroundTruth {
    /// Writes the truth as JSON lines: one `{"user": ...}` per user, then `{"gateways": ...}` and
    /// `{"summary": ...}`.
    ///
    /// # Errors
    ///
    /// Fails when `out` cannot be written.
    pub fn write_json_lines(&self, mut out: impl Write) -> std::io::Result<()> {
        for user in &self.users {
            writeln!(out, "{}", serde_json::json!({ "user": user }))?;
        }
        writeln!(out, "{}", serde_json::json!({ "gateways": self.gateways }))?;
        writeln!(
            out,
            "{}",
            serde_json::json!({
                "summary": self.summary,
                "mode": self.mode,
                "openim": self.openim,
                "discovery": self.discovery,
                "routing": self.routing,
                "replicas_initial": self.replicas_initial,
                "replicas_final": self.replicas_final,
                "proxy_addr": self.proxy_addr,
            })
        )?;
        out.flush()
    }

    /// Writes the truth's JSON lines to a new file at `path`.
    ///
    /// # Errors
    ///
    /// Fails when the file cannot be created or written.
    pub fn write_file(&self, path: &Path) -> std::io::Result<()> {
        let file = std::fs::File::create(path)?;
        self.write_json_lines(std::io::BufWriter::new(file))
    }
}
