//! Describes the alerts: one JSON object per line on stdout, each with `kind`, `schema_version` and
//! `ts`, and enough context to act on without reading code. docs/alerts/ documents every field.
//!
//! The alert is an envelope around model types (`GatewayInfo`, `ProcessInfo` add the pods
//! `--kube` names); `fold` turns repeats of one alert into one count per window; `line` writes
//! the lines (`json` for what it does not write itself).

use std::sync::Arc;

use serde::Serialize;

mod fold;
mod json;
mod line;
pub mod schema;
mod text;

pub use fold::FoldWindows;
pub use line::LineWriter;
pub use text::{text_line, text_of};

use crate::model::{
    Gateway, GatewayAnswer, MessageIds, MismatchCause, PlatformResult, Process, Rfc3339, UserId,
};
use crate::openim::diagnosis;

/// Names the version of the alert objects; bumped when a field changes meaning.
pub const SCHEMA_VERSION: u32 = 1;

/// Names a Kubernetes pod by the names `kubectl` takes, and what else names it: its container, the
/// workload that owns it, and the labels `--pod-labels` selects. docs/alerts/README.md gives
/// the naming convention.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    /// The container: a process's, from its cgroup; a gateway's, the one that declares its port
    /// (or the pod's only container).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// The controller that owns the pod, as `kubectl` names it: a ReplicaSet's Deployment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload: Option<WorkloadRef>,
    /// The pod's labels that `--pod-labels` names, where it has them.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
}

impl PodRef {
    /// Returns the pod `namespace`/`name` with nothing else known.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            ..Self::default()
        }
    }
}

/// Names the workload that owns a pod: `kind` as the API spells it (`Deployment`, `StatefulSet`,
/// `DaemonSet`, `Job`, …) and its name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WorkloadRef {
    pub kind: String,
    pub name: String,
}

/// Describes a gateway as printed: the model's `Gateway`, and the pod that holds its IP when
/// `--kube` knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GatewayInfo {
    #[serde(flatten)]
    pub gateway: Gateway,
    /// Boxed: unnamed (no `--kube`) it costs a word, not 48 bytes, in every alert a fold
    /// window keeps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<Box<PodRef>>,
}

impl From<Gateway> for GatewayInfo {
    fn from(gateway: Gateway) -> Self {
        Self { gateway, pod: None }
    }
}

/// Describes a process as printed: its pid and name, and its pod when `--kube` knows it. The
/// model's `Process` is kept whole (its cgroup id is what names the pod) but only these are
/// printed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessInfo {
    pub process: Process,
    /// Boxed, as `GatewayInfo`'s.
    pub pod: Option<Box<PodRef>>,
}

impl From<Process> for ProcessInfo {
    fn from(process: Process) -> Self {
        Self { process, pod: None }
    }
}

impl Serialize for ProcessInfo {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Printed<'a> {
            pid: u32,
            comm: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            pod: &'a Option<Box<PodRef>>,
        }
        Printed {
            pid: self.process.pid,
            comm: &self.process.comm,
            pod: &self.pod,
        }
        .serialize(serializer)
    }
}

/// Records where the proxy placed a user's WebSocket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlacementInfo {
    pub gateway: GatewayInfo,
    pub platforms: Vec<i32>,
    /// When the placement's upgrade was seen, printed as `since` in RFC 3339.
    #[serde(rename = "since", serialize_with = "serialize_rfc3339")]
    pub since_ns: u64,
    pub proxy: ProcessInfo,
    /// Cluster mode: the node whose observer saw the placement.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// Records a push call as printed: the gateway called, the method, the message, the pusher and
/// the gateway's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PushInfo {
    pub gateway: GatewayInfo,
    /// One copy for every call of a method (`correlate::shared_texts`).
    pub method: Arc<str>,
    pub message: MessageIds,
    pub pusher: ProcessInfo,
    pub answer: GatewayAnswer,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub answer_platforms: Vec<PlatformResult>,
    /// Cluster mode: the node whose observer saw the push call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// Reports that a push for `user` went to a gateway other than the one(s) holding its WebSocket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteMismatch {
    /// Inline for ids of up to 24 bytes: a fold window's summary, written a minute after its
    /// first alert, reads it without one more cold heap block.
    pub user: UserId,
    pub placed_on: Vec<PlacementInfo>,
    pub pushed_to: PushInfo,
    /// Mismatches for this (user, placement, push gateway) in the current window, including
    /// this one.
    pub count: u64,
    pub window_secs: u64,
    /// What separates the two rings' spellings of a gateway, in plain words, when learnt: the
    /// diagnosis quotes it.
    pub spelling_difference: Option<Arc<str>>,
    /// Why the user's WebSocket is not where push sent the message, as the evidence shows.
    pub cause: MismatchCause,
}

impl RouteMismatch {
    /// Describes the situation in one paragraph, from the alert's own fields.
    pub fn diagnosis(&self) -> impl std::fmt::Display + '_ {
        self.diagnosis_parts()
    }

    fn diagnosis_parts(
        &self,
    ) -> diagnosis::RouteMismatchDiagnosis<'_, impl Iterator<Item = &Gateway> + Clone> {
        diagnosis::RouteMismatchDiagnosis {
            user: &self.user,
            placed_on: self.placed_on.iter().map(|info| &info.gateway.gateway),
            pushed_to: &self.pushed_to.gateway.gateway,
            answer: self.pushed_to.answer,
            spelling_difference: self.spelling_difference.as_deref(),
            cause: self.cause,
        }
    }
}

/// Writes the fields in the documented order, then `diagnosis`, written straight into the line
/// rather than kept as text: a fold window holds its first alert for a whole window, and the
/// paragraph (about half a kilobyte) was most of it, read again cold for the summary line.
impl Serialize for RouteMismatch {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        struct Diagnosis<'a>(&'a RouteMismatch);
        impl Serialize for Diagnosis<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(&self.0.diagnosis())
            }
        }
        let mut fields = serializer.serialize_struct("RouteMismatch", 7)?;
        fields.serialize_field("user", self.user.as_str())?;
        fields.serialize_field("placed_on", &self.placed_on)?;
        fields.serialize_field("pushed_to", &self.pushed_to)?;
        fields.serialize_field("count", &self.count)?;
        fields.serialize_field("window_secs", &self.window_secs)?;
        fields.serialize_field("cause", &self.cause)?;
        fields.serialize_field("diagnosis", &Diagnosis(self))?;
        fields.end()
    }
}

/// Names why the observer sees less than it should. Each reason is its own episode (raised, then
/// recovered); a new one needs a variant here, its name in `name`, and a diagnosis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DegradedReason {
    /// Cluster mode: Redis does not answer, so joins across nodes and cluster-wide
    /// deduplication are off; each node detects with what it sees itself.
    SharedStateUnreachable,
    /// Started on a live node: WebSockets upgraded before the observer watched have users it
    /// does not know, so pushes to users without a seen placement cannot be judged.
    JoinedMidStream,
    /// The kernel→userspace ring buffer was full: records were dropped, whatever connection
    /// they belonged to.
    RingFull,
    /// A connection's direction missed bytes and its decoder lost the stream from there on.
    LostSync,
    /// Traffic on a watched port could not be decoded (not HTTP/2 or HTTP/1 as expected,
    /// protocol errors, a frame larger than a decoder may buffer).
    Undecodable,
    /// A full table or the memory budget dropped connections, users or calls.
    TableFull,
    /// gRPC bytes beyond the per-connection capture budget were not copied.
    BudgetExhausted,
    /// The kernel skipped runs of the observer's programs (one was already running on that
    /// CPU): state changes or syscalls they would have seen went unseen.
    RunsSkipped,
}

impl DegradedReason {
    /// Returns the reason's name (`ring_full`, `lost_sync`, …).
    pub const fn name(self) -> &'static str {
        match self {
            DegradedReason::SharedStateUnreachable => "shared_state_unreachable",
            DegradedReason::JoinedMidStream => "joined_mid_stream",
            DegradedReason::RingFull => "ring_full",
            DegradedReason::LostSync => "lost_sync",
            DegradedReason::Undecodable => "undecodable",
            DegradedReason::TableFull => "table_full",
            DegradedReason::BudgetExhausted => "budget_exhausted",
            DegradedReason::RunsSkipped => "runs_skipped",
        }
    }
}

/// Counts how much a degradation hides: the counts that apply to its reason, and the processes
/// whose connections it hit, where known.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Affected {
    /// Kernel records lost (each a syscall's bytes or a connection event).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub records: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connections: Option<u64>,
    /// Payload bytes not seen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub users: Option<u64>,
    /// Push calls dropped before their answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calls: Option<u64>,
    /// Runs of the observer's programs the kernel skipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runs: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<AffectedProcess>,
}

/// Counts what one process lost to a degradation: its connections and bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AffectedProcess {
    #[serde(flatten)]
    pub process: ProcessInfo,
    pub connections: u64,
    pub bytes: u64,
}

/// Names how push routes one message to the gateways.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PushRoutingMode {
    /// Each recipient goes to the one gateway push's consistent-hash ring picks (OpenIM 3.5
    /// to 3.8.3 with Kubernetes discovery).
    Ring,
    /// Every recipient goes to every gateway (zookeeper or etcd discovery, 3.8.4 and later):
    /// no push ring exists to diverge from.
    Broadcast,
}

impl PushRoutingMode {
    /// Returns the mode's name as the alert line spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Ring => "ring",
            Self::Broadcast => "broadcast",
        }
    }
}

/// Names the state a `capture_degraded` line reports: raised, or over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DegradedState {
    Degraded,
    Recovered,
}

/// Holds what an alert says, by kind (its `kind` field names the variant).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AlertBody {
    /// A push for `user` went to a gateway other than the one(s) holding its WebSocket.
    RouteMismatch(RouteMismatch),
    /// The proxy places users with a ring over differently spelled members than push's, so
    /// the two rings split users.
    /// Printed once more with `state: resolved` when the rings agree again.
    RingDivergence {
        /// `diverged` on the first line of an incident, `resolved` on its last.
        state: crate::openim::members::RingDivergenceState,
        /// The proxy's ring as inferred from its placements (in its `Host` spelling while they
        /// diverge), members in the order upstream adds them.
        proxy_members: Vec<String>,
        /// Push's ring, rebuilt by ordinal from the `:authority` of its calls.
        push_members: Vec<String>,
        difference: String,
        /// Every gateway `0..n-1` of the rebuilt rings was seen on both sides (otherwise the
        /// missing ones are spelled as the seen ones).
        #[serde(rename = "ring_complete")]
        complete: bool,
        /// Placements seen, and how many of them push's ring sends elsewhere.
        placements_seen: usize,
        placements_split: usize,
        /// Share of a uniform sample of user ids the two rings send to different gateways.
        sample_split_share: f64,
        /// Resolved: seconds from the divergence's first line to this one.
        #[serde(skip_serializing_if = "Option::is_none")]
        lasted_secs: Option<u64>,
        /// Resolved: placements and push calls checked while it lasted.
        #[serde(skip_serializing_if = "Option::is_none")]
        placements_checked: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pushes_checked: Option<u64>,
        diagnosis: String,
    },
    /// A WebSocket upgrade was sent to a gRPC port (the incident report's fix as written).
    WsUpgradeOnGrpcPort {
        gateway: GatewayInfo,
        users: Vec<String>,
        proxy: ProcessInfo,
        /// Status the port answered with, if it answered in HTTP/1 at all.
        #[serde(skip_serializing_if = "Option::is_none")]
        answer_status: Option<u16>,
        count: u64,
        window_secs: u64,
        diagnosis: String,
    },
    /// A pusher opens a new gRPC connection per call and does not close them.
    PushConnectionChurn {
        pusher: ProcessInfo,
        new_connections: u64,
        window_secs: u64,
        per_second: f64,
        open_connections: u64,
        calls_per_connection: f64,
        diagnosis: String,
    },
    /// What the wire taught about push: the gRPC service it calls and how it routes a message,
    /// printed once when learned and again when either changes.
    PushRouting {
        /// The gateway service push calls, e.g. `openim.msggateway.msgGateway`.
        service: String,
        routing: PushRoutingMode,
        /// Gateways the message that taught the routing went to.
        gateways: usize,
        diagnosis: String,
    },
    /// The observer itself sees less than it should (and again when it no longer does).
    CaptureDegraded {
        reason: DegradedReason,
        state: DegradedState,
        /// RFC 3339 time the degradation began.
        since: String,
        /// What is missed or weakened meanwhile.
        affects: String,
        /// How much: counts and processes, since `since` (capture reasons).
        #[serde(skip_serializing_if = "Option::is_none")]
        affected: Option<Affected>,
        diagnosis: String,
    },
}

impl AlertBody {
    /// Returns the count of alerts a fold window summarises, for the kinds that are folded.
    fn fold_count_mut(&mut self) -> Option<&mut u64> {
        match self {
            AlertBody::RouteMismatch(RouteMismatch { count, .. })
            | AlertBody::WsUpgradeOnGrpcPort { count, .. } => Some(count),
            AlertBody::RingDivergence { .. }
            | AlertBody::PushRouting { .. }
            | AlertBody::PushConnectionChurn { .. }
            | AlertBody::CaptureDegraded { .. } => None,
        }
    }
}

/// Holds one alert: its envelope (`schema_version`, `ts`, `node`) and its body.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Alert {
    pub schema_version: u32,
    /// Unix nanoseconds of the event that raised the alert (how long the alert took is
    /// measured from it), printed as `ts` in RFC 3339: spelled only when the line is written.
    #[serde(rename = "ts", serialize_with = "serialize_rfc3339")]
    pub ts_ns: u64,
    /// Shared, so that the copy a fold window keeps of its first alert costs a count, not a
    /// deep clone of every string in it; `body_mut` copies it only while both are alive.
    #[serde(flatten)]
    pub body: Arc<AlertBody>,
    /// The node whose observer printed the alert: set on every printed line (cluster mode's
    /// `--node-name`, else `NODE_NAME`, else the hostname); `None` only before printing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

impl Alert {
    /// Builds an alert around `body`, raised at `ts_ns`.
    pub fn new(ts_ns: u64, body: AlertBody) -> Self {
        Self::shared(ts_ns, Arc::new(body))
    }

    /// Builds an alert around a body a fold window shared.
    pub fn shared(ts_ns: u64, body: Arc<AlertBody>) -> Self {
        Self {
            schema_version: SCHEMA_VERSION,
            ts_ns,
            body,
            node: None,
        }
    }

    /// Returns the body to change, copied first if a fold window still shares it.
    pub fn body_mut(&mut self) -> &mut AlertBody {
        Arc::make_mut(&mut self.body)
    }

    /// Returns the alert's `kind`, as its line spells it.
    pub fn kind(&self) -> &'static str {
        match *self.body {
            AlertBody::RouteMismatch(_) => "route_mismatch",
            AlertBody::RingDivergence { .. } => "ring_divergence",
            AlertBody::WsUpgradeOnGrpcPort { .. } => "ws_upgrade_on_grpc_port",
            AlertBody::PushConnectionChurn { .. } => "push_connection_churn",
            AlertBody::PushRouting { .. } => "push_routing",
            AlertBody::CaptureDegraded { .. } => "capture_degraded",
        }
    }

    /// Returns the alert's line without its newline. Printing many alerts, keep one `LineWriter`.
    pub fn to_json_line(&self) -> String {
        LineWriter::default().line(self).to_owned()
    }
}

fn serialize_rfc3339<S: serde::Serializer>(ts_ns: &u64, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(Rfc3339::new(*ts_ns).as_str())
}
