//! Where each side of OpenIM believes a user lives, and the alerts when they disagree.
//!
//! Fed with `Observation`s (what the decoders saw, in routing terms) in time order, it keeps:
//! - placements: user → the WebSocket placements the proxy made (gateway IP, `Host`, platform),
//!   ended when their connection closes;
//! - pending push calls until the gateway answers, then checks every recipient against its
//!   placements;
//! - the two learned rings: gateway names from `Host` and from `:authority`, tied to IPs;
//! - per pusher, how many gRPC connections it opens and closes.
//!
//! Every table has a cap; what a cap turns away is counted, never silently lost.

use std::{
    collections::{HashMap, VecDeque},
    net::IpAddr,
};

use crate::{
    alert::{Alert, AlertBody, PlacementInfo, PushInfo, rfc3339},
    model::{ConnectionId, Gateway, GatewayAnswer, MessageIds, Process, UserResult},
    openim::members::describe_member_difference,
};

use super::rings::{LearnedRings, Verdict};

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Bounds and windows; the daemon sets them from flags.
#[derive(Clone, Debug)]
pub struct RouteLimits {
    pub max_users: usize,
    pub max_placements_per_user: usize,
    pub max_pending_calls: usize,
    pub max_tracked_connections: usize,
    pub max_fold_keys: usize,
    /// Repeats of one alert key within this many seconds fold into a count.
    pub fold_window_secs: u64,
    /// Learned ring membership must be stable this long before a divergence is reported, so a
    /// warming-up observer or a rollout in progress yields one alert, not one per new member.
    pub ring_settle_secs: u64,
    /// A push call without an answer after this long is judged without one.
    pub answer_timeout_secs: u64,
    /// Churn: at least this many new connections by one pusher within `churn_window_secs`…
    pub churn_min_new_connections: u64,
    pub churn_window_secs: u64,
}

impl Default for RouteLimits {
    fn default() -> Self {
        Self {
            max_users: 1_000_000,
            max_placements_per_user: 16,
            max_pending_calls: 65_536,
            max_tracked_connections: 262_144,
            max_fold_keys: 262_144,
            fold_window_secs: 60,
            ring_settle_secs: 3,
            answer_timeout_secs: 5,
            churn_min_new_connections: 20,
            churn_window_secs: 10,
        }
    }
}

/// What happened on the wire, in routing terms. Produced by `correlate::connections`.
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
        ts_ns: u64,
        user: String,
        platform: Option<i32>,
        gateway: Gateway,
        proxy: Process,
    },
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
        method: String,
        gateway: Gateway,
        pusher: Process,
        message: MessageIds,
        recipients: Vec<String>,
    },
    PushAnswered {
        connection: ConnectionId,
        stream_id: u32,
        ts_ns: u64,
        results: Vec<UserResult>,
    },
}

#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RouteCounters {
    pub placements: u64,
    pub push_calls: u64,
    pub push_answers: u64,
    pub users_evicted: u64,
    pub placements_evicted: u64,
    pub pending_calls_evicted: u64,
    pub calls_without_answer: u64,
    pub connections_evicted: u64,
    pub fold_keys_evicted: u64,
}

#[derive(Clone, Debug)]
struct Placement {
    connection: ConnectionId,
    gateway: Gateway,
    platform: Option<i32>,
    since_ns: u64,
    proxy: Process,
}

#[derive(Clone, Debug)]
struct PendingCall {
    ts_ns: u64,
    method: String,
    gateway: Gateway,
    pusher: Process,
    message: MessageIds,
    recipients: Vec<String>,
}

/// Connections whose close matters: placements end with theirs, and a pusher's open count.
#[derive(Clone, Debug)]
enum TrackedConnection {
    Placement { user: String },
    Push { pusher_pid: u32 },
}

#[derive(Debug, Default)]
struct PusherActivity {
    comm: String,
    cgroup_id: u64,
    opened_at: VecDeque<u64>,
    called_at: VecDeque<u64>,
    open: u64,
    last_alert_ns: Option<u64>,
}

/// Repeats of one alert key within a window: the first is emitted at once, the rest are
/// counted and emitted as one alert with the count when the window ends.
#[derive(Debug)]
struct Fold {
    window_start_ns: u64,
    count: u64,
    /// The window's first alert; repeats only update its count, time and merged lists, so a
    /// repeat costs a lookup, not a new alert text.
    summary: Alert,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
enum FoldKey {
    Mismatch {
        user: String,
        placed: Vec<IpAddr>,
        pushed: IpAddr,
    },
    UpgradeOnGrpc {
        gateway: IpAddr,
        port: u16,
        proxy_pid: u32,
    },
}

pub struct RouteTable {
    limits: RouteLimits,
    placements: HashMap<String, Vec<Placement>>,
    pending_calls: HashMap<(ConnectionId, u32), PendingCall>,
    connections: HashMap<ConnectionId, TrackedConnection>,
    upgrades_on_grpc: HashMap<ConnectionId, (IpAddr, u16, u32)>,
    rings: LearnedRings,
    /// When a learned member last changed; a verdict waits for membership to settle.
    members_changed_ns: Option<u64>,
    /// Placements arrived since the last verdict.
    evidence_since_verdict: bool,
    /// Verdicts rehash every placement seen: at most one per settle period.
    last_verdict_ns: u64,
    reported_divergence: Option<(Vec<String>, Vec<String>)>,
    /// How the two sides spell one gateway differently, computed once per membership change
    /// (every mismatch quotes it, and a misrouting incident produces mismatches by the
    /// thousand): `None` until computed, `Some(None)` when no gateway is spelled two ways.
    spelling_cause: Option<Option<String>>,
    pushers: HashMap<u32, PusherActivity>,
    folds: HashMap<FoldKey, Fold>,
    /// When `folds` was last swept for closed windows.
    folds_swept_ns: u64,
    counters: RouteCounters,
}

impl RouteTable {
    pub fn new(limits: RouteLimits) -> Self {
        Self {
            limits,
            placements: HashMap::new(),
            pending_calls: HashMap::new(),
            connections: HashMap::new(),
            upgrades_on_grpc: HashMap::new(),
            rings: LearnedRings::default(),
            members_changed_ns: None,
            evidence_since_verdict: false,
            last_verdict_ns: 0,
            reported_divergence: None,
            spelling_cause: None,
            pushers: HashMap::new(),
            folds: HashMap::new(),
            folds_swept_ns: 0,
            counters: RouteCounters::default(),
        }
    }

    pub fn counters(&self) -> &RouteCounters {
        &self.counters
    }

    pub fn tracked_users(&self) -> usize {
        self.placements.len()
    }

    pub fn observe(&mut self, observation: Observation, alerts: &mut Vec<Alert>) {
        match observation {
            Observation::GrpcConnectionOpened {
                connection,
                ts_ns,
                pusher,
            } => self.on_grpc_connection(connection, ts_ns, pusher, alerts),
            Observation::ConnectionClosed { connection, ts_ns } => {
                self.on_close(connection, ts_ns, alerts);
            }
            Observation::UpgradeRequested {
                connection,
                ts_ns,
                user,
                platform,
                gateway,
                proxy,
            } => self.on_upgrade(connection, ts_ns, user, platform, gateway, proxy),
            Observation::UpgradeAnswered {
                connection, status, ..
            } => {
                if status != 101 {
                    self.end_placement(connection);
                }
            }
            Observation::UpgradeOnGrpcPort {
                connection,
                ts_ns,
                user,
                gateway,
                proxy,
            } => self.on_upgrade_on_grpc(connection, ts_ns, user, gateway, proxy, alerts),
            Observation::UpgradeOnGrpcPortAnswered { connection, status } => {
                self.on_upgrade_on_grpc_answer(connection, status);
            }
            Observation::PushCalled {
                connection,
                stream_id,
                ts_ns,
                method,
                gateway,
                pusher,
                message,
                recipients,
            } => {
                self.counters.push_calls += 1;
                if let Some(name) = &gateway.name
                    && self.rings.learn_push_member(name, gateway.ip)
                {
                    self.members_changed(ts_ns);
                }
                if let Some(TrackedConnection::Push { pusher_pid }) =
                    self.connections.get(&connection)
                    && let Some(activity) = self.pushers.get_mut(pusher_pid)
                {
                    push_bounded(
                        &mut activity.called_at,
                        ts_ns,
                        self.limits.churn_window_secs,
                    );
                }
                if self.pending_calls.len() >= self.limits.max_pending_calls {
                    self.counters.pending_calls_evicted += 1;
                    return;
                }
                self.pending_calls.insert(
                    (connection, stream_id),
                    PendingCall {
                        ts_ns,
                        method,
                        gateway,
                        pusher,
                        message,
                        recipients,
                    },
                );
            }
            Observation::PushAnswered {
                connection,
                stream_id,
                ts_ns,
                results,
            } => {
                if let Some(call) = self.pending_calls.remove(&(connection, stream_id)) {
                    self.counters.push_answers += 1;
                    self.judge_call(call, Some(&results), ts_ns, alerts);
                }
            }
        }
    }

    /// Time passes: windows close, unanswered calls time out, settled rings are compared,
    /// churn is assessed. The daemon calls it about once a second.
    pub fn tick(&mut self, now_ns: u64, alerts: &mut Vec<Alert>) {
        let timeout = self.limits.answer_timeout_secs * NANOS_PER_SEC;
        let expired: Vec<(ConnectionId, u32)> = self
            .pending_calls
            .iter()
            .filter(|(_, call)| now_ns.saturating_sub(call.ts_ns) >= timeout)
            .map(|(key, _)| *key)
            .collect();
        for key in expired {
            if let Some(call) = self.pending_calls.remove(&key) {
                self.counters.calls_without_answer += 1;
                self.judge_call(call, None, now_ns, alerts);
            }
        }
        self.close_fold_windows(now_ns, false, alerts);
        self.evaluate_rings_at(now_ns, false, alerts);
        self.assess_churn(now_ns, alerts);
    }

    /// End of input (replay) or shutdown: judge what is pending and emit folded counts now.
    pub fn finish(&mut self, now_ns: u64, alerts: &mut Vec<Alert>) {
        let pending: Vec<PendingCall> = self.pending_calls.drain().map(|(_, call)| call).collect();
        for call in pending {
            self.counters.calls_without_answer += 1;
            self.judge_call(call, None, now_ns, alerts);
        }
        self.assess_churn(now_ns, alerts);
        self.evaluate_rings_at(now_ns, true, alerts);
        self.close_fold_windows(now_ns, true, alerts);
    }

    fn on_grpc_connection(
        &mut self,
        connection: ConnectionId,
        ts_ns: u64,
        pusher: Process,
        alerts: &mut Vec<Alert>,
    ) {
        if !self.track_connection(
            connection,
            TrackedConnection::Push {
                pusher_pid: pusher.pid,
            },
        ) {
            return;
        }
        let activity = self.pushers.entry(pusher.pid).or_default();
        activity.comm = pusher.comm;
        activity.cgroup_id = pusher.cgroup_id;
        activity.open += 1;
        push_bounded(
            &mut activity.opened_at,
            ts_ns,
            self.limits.churn_window_secs,
        );
        // At once, not at the next tick: a short burst may be over (and its connections torn
        // down) by then.
        assess_pusher(&self.limits, pusher.pid, activity, ts_ns, alerts);
    }

    fn track_connection(&mut self, connection: ConnectionId, tracked: TrackedConnection) -> bool {
        if self.connections.len() >= self.limits.max_tracked_connections
            && !self.connections.contains_key(&connection)
        {
            self.counters.connections_evicted += 1;
            return false;
        }
        self.connections.insert(connection, tracked);
        true
    }

    fn on_close(&mut self, connection: ConnectionId, ts_ns: u64, alerts: &mut Vec<Alert>) {
        // Calls on a closing connection will get no answer.
        let unanswered: Vec<u32> = self
            .pending_calls
            .keys()
            .filter(|(call_connection, _)| *call_connection == connection)
            .map(|(_, stream)| *stream)
            .collect();
        for stream in unanswered {
            if let Some(call) = self.pending_calls.remove(&(connection, stream)) {
                self.counters.calls_without_answer += 1;
                self.judge_call(call, None, ts_ns, alerts);
            }
        }
        self.upgrades_on_grpc.remove(&connection);
        match self.connections.remove(&connection) {
            Some(TrackedConnection::Placement { user }) => self.remove_placement(&user, connection),
            Some(TrackedConnection::Push { pusher_pid, .. }) => {
                if let Some(activity) = self.pushers.get_mut(&pusher_pid) {
                    activity.open = activity.open.saturating_sub(1);
                }
            }
            None => {}
        }
    }

    fn on_upgrade(
        &mut self,
        connection: ConnectionId,
        ts_ns: u64,
        user: String,
        platform: Option<i32>,
        gateway: Gateway,
        proxy: Process,
    ) {
        if let Some(name) = &gateway.name
            && self.rings.learn_proxy_host(name, gateway.ip)
        {
            self.members_changed(ts_ns);
        }
        self.rings.record_placement(&user, gateway.ip);
        self.evidence_since_verdict = true;
        if !self.placements.contains_key(&user) && self.placements.len() >= self.limits.max_users {
            self.counters.users_evicted += 1;
            return;
        }
        if !self.track_connection(
            connection,
            TrackedConnection::Placement { user: user.clone() },
        ) {
            return;
        }
        self.counters.placements += 1;
        let placements = self.placements.entry(user).or_default();
        if placements.len() >= self.limits.max_placements_per_user {
            // The oldest placement is the likeliest to be stale (its close missed).
            placements.remove(0);
            self.counters.placements_evicted += 1;
        }
        placements.push(Placement {
            connection,
            gateway,
            platform,
            since_ns: ts_ns,
            proxy,
        });
    }

    fn end_placement(&mut self, connection: ConnectionId) {
        if let Some(TrackedConnection::Placement { user }) = self.connections.remove(&connection) {
            self.remove_placement(&user, connection);
        }
    }

    fn remove_placement(&mut self, user: &str, connection: ConnectionId) {
        if let Some(placements) = self.placements.get_mut(user) {
            placements.retain(|placement| placement.connection != connection);
            if placements.is_empty() {
                self.placements.remove(user);
            }
        }
    }

    fn on_upgrade_on_grpc(
        &mut self,
        connection: ConnectionId,
        ts_ns: u64,
        user: Option<String>,
        gateway: Gateway,
        proxy: Process,
        alerts: &mut Vec<Alert>,
    ) {
        self.upgrades_on_grpc
            .insert(connection, (gateway.ip, gateway.port, proxy.pid));
        let key = FoldKey::UpgradeOnGrpc {
            gateway: gateway.ip,
            port: gateway.port,
            proxy_pid: proxy.pid,
        };
        let merged = fold_repeat(
            &mut self.folds,
            self.limits.fold_window_secs,
            &key,
            ts_ns,
            |body| {
                if let AlertBody::WsUpgradeOnGrpcPort { users, .. } = body
                    && let Some(user) = &user
                    && !users.contains(user)
                    && users.len() < 100
                {
                    users.push(user.clone());
                }
            },
        );
        if merged {
            return;
        }
        let diagnosis = format!(
            "a WebSocket upgrade{} was sent to {}:{}, a gRPC port: the proxy dials its ring member literally, so members carrying the gRPC port (the incident report's fix as written) send WebSockets to the gRPC server, which rejects them. Hash on the ':88' spelling but dial the WebSocket port",
            user.as_deref()
                .map(|user| format!(" for user {user}"))
                .unwrap_or_default(),
            gateway.ip,
            gateway.port
        );
        let alert = Alert::new(
            ts_ns,
            AlertBody::WsUpgradeOnGrpcPort {
                gateway: gateway.into(),
                users: user.into_iter().collect(),
                proxy: proxy.into(),
                answer_status: None,
                count: 1,
                window_secs: self.limits.fold_window_secs,
                diagnosis,
            },
        );
        self.fold_first(key, alert, alerts);
    }

    fn on_upgrade_on_grpc_answer(&mut self, connection: ConnectionId, status: u16) {
        let Some(&(gateway, port, proxy_pid)) = self.upgrades_on_grpc.get(&connection) else {
            return;
        };
        let key = FoldKey::UpgradeOnGrpc {
            gateway,
            port,
            proxy_pid,
        };
        if let Some(Fold {
            summary:
                Alert {
                    body: AlertBody::WsUpgradeOnGrpcPort { answer_status, .. },
                    ..
                },
            ..
        }) = self.folds.get_mut(&key)
        {
            *answer_status = Some(status);
        }
    }

    /// Checks each recipient of a call against its placements.
    fn judge_call(
        &mut self,
        call: PendingCall,
        results: Option<&[UserResult]>,
        ts_ns: u64,
        alerts: &mut Vec<Alert>,
    ) {
        for user in &call.recipients {
            let Some(placements) = self.placements.get(user) else {
                continue;
            };
            if placements
                .iter()
                .any(|placement| placement.gateway.ip == call.gateway.ip)
            {
                continue;
            }
            let answer =
                results.and_then(|results| results.iter().find(|answer| &answer.user_id == user));
            let (gateway_answer, answer_platforms) = match answer {
                None => (GatewayAnswer::Unknown, Vec::new()),
                Some(answer) if answer.platforms.is_empty() => {
                    (GatewayAnswer::NotOnlineHere, Vec::new())
                }
                Some(answer) => {
                    let delivered = answer.online_push
                        || answer
                            .platforms
                            .iter()
                            .any(|platform| platform.result_code == 0);
                    let verdict = if delivered {
                        GatewayAnswer::Delivered
                    } else {
                        GatewayAnswer::DeliveryFailed
                    };
                    (verdict, answer.platforms.clone())
                }
            };
            let mut placed: Vec<IpAddr> = placements
                .iter()
                .map(|placement| placement.gateway.ip)
                .collect();
            placed.sort();
            placed.dedup();
            let key = FoldKey::Mismatch {
                user: user.clone(),
                placed,
                pushed: call.gateway.ip,
            };
            if fold_repeat(
                &mut self.folds,
                self.limits.fold_window_secs,
                &key,
                ts_ns,
                |_| {},
            ) {
                continue;
            }
            let placed_on = summarize_placements(placements);
            let diagnosis =
                self.mismatch_diagnosis(user, &placed_on, &call.gateway, gateway_answer);
            let alert = Alert::new(
                ts_ns,
                AlertBody::RouteMismatch {
                    user: user.clone(),
                    placed_on,
                    pushed_to: PushInfo {
                        gateway: call.gateway.clone().into(),
                        method: call.method.clone(),
                        message: call.message.clone(),
                        pusher: call.pusher.clone().into(),
                        answer: gateway_answer,
                        answer_platforms,
                    },
                    count: 1,
                    window_secs: self.limits.fold_window_secs,
                    diagnosis,
                },
            );
            self.fold_first(key, alert, alerts);
        }
    }

    fn mismatch_diagnosis(
        &mut self,
        user: &str,
        placed_on: &[PlacementInfo],
        pushed: &Gateway,
        answer: GatewayAnswer,
    ) -> String {
        let placed_names: Vec<String> = placed_on
            .iter()
            .map(|placement| describe_gateway(&placement.gateway.gateway))
            .collect();
        let consequence = match answer {
            GatewayAnswer::NotOnlineHere => {
                "that gateway answered that the user is not online there, so the message missed real time (offline push instead)"
            }
            GatewayAnswer::Delivered => {
                "that gateway still reported a delivery (the user also has a connection there the observer did not see)"
            }
            GatewayAnswer::DeliveryFailed => "that gateway failed to deliver it",
            GatewayAnswer::Unknown => {
                "the gateway's answer was not seen; the user's connection is not on that gateway, so real-time delivery most likely failed"
            }
        };
        let spelling_cause = match &self.spelling_cause {
            Some(cached) => cached,
            None => self
                .spelling_cause
                .insert(
                    self.rings
                        .spelling_difference()
                        .map(|(proxy_name, push_name)| {
                            describe_member_difference(&proxy_name, &push_name)
                        }),
                ),
        };
        let cause = match spelling_cause {
            Some(difference) => format!(
                "; the proxy's and push's rings spell gateways differently ({difference}), so they hash user {user} to different gateways"
            ),
            None => String::new(),
        };
        format!(
            "user {user} holds its WebSocket on {} but push delivered to {}: {consequence}{cause}",
            placed_names.join(" and "),
            describe_gateway(pushed),
        )
    }

    /// Emits the first alert of a window for `key` and opens the window.
    fn fold_first(&mut self, key: FoldKey, alert: Alert, alerts: &mut Vec<Alert>) {
        if let Some(expired) = self.folds.remove(&key) {
            emit_summary(expired, alerts);
        }
        let window_start_ns = alert.ts_ns;
        alerts.push(alert.clone());
        // A sweep walks the whole table: when it is full of windows still open, sweeping again
        // for every new key made each alert cost O(table) (hundreds of µs at 262,144 keys).
        // Windows expire by the second, so one sweep a second finds all there is to find.
        if self.folds.len() >= self.limits.max_fold_keys
            && window_start_ns.saturating_sub(self.folds_swept_ns) >= NANOS_PER_SEC
        {
            self.close_fold_windows(window_start_ns, false, alerts);
        }
        if self.folds.len() >= self.limits.max_fold_keys {
            // Unfolded: repeats of this key will each be emitted.
            self.counters.fold_keys_evicted += 1;
            return;
        }
        self.folds.insert(
            key,
            Fold {
                window_start_ns,
                count: 1,
                summary: alert,
            },
        );
    }

    fn close_fold_windows(&mut self, now_ns: u64, all: bool, alerts: &mut Vec<Alert>) {
        self.folds_swept_ns = now_ns;
        let window = self.limits.fold_window_secs * NANOS_PER_SEC;
        let expired: Vec<FoldKey> = self
            .folds
            .iter()
            .filter(|(_, fold)| all || now_ns.saturating_sub(fold.window_start_ns) >= window)
            .map(|(key, _)| key.clone())
            .collect();
        let mut closed: Vec<(FoldKey, Fold)> = expired
            .into_iter()
            .filter_map(|key| self.folds.remove_entry(&key))
            .collect();
        // Ordered by key among windows opened at once: a replay prints the same lines in the
        // same order every time, whatever the hash map's order.
        closed.sort_by(|(left_key, left), (right_key, right)| {
            (left.window_start_ns, left_key).cmp(&(right.window_start_ns, right_key))
        });
        for (_, fold) in closed {
            emit_summary(fold, alerts);
        }
    }

    /// A learned member changed: texts quoting the members must be rebuilt.
    fn members_changed(&mut self, ts_ns: u64) {
        self.spelling_cause = None;
        self.members_changed_ns = Some(ts_ns);
    }

    fn evaluate_rings_at(&mut self, now_ns: u64, force: bool, alerts: &mut Vec<Alert>) {
        if self.members_changed_ns.is_none() && !self.evidence_since_verdict {
            return;
        }
        let settle = self.limits.ring_settle_secs * NANOS_PER_SEC;
        if !force {
            let membership_moving = self
                .members_changed_ns
                .is_some_and(|changed| now_ns.saturating_sub(changed) < settle);
            if membership_moving || now_ns.saturating_sub(self.last_verdict_ns) < settle {
                return;
            }
        }
        self.members_changed_ns = None;
        self.evidence_since_verdict = false;
        self.last_verdict_ns = now_ns;
        // Agree and Undetermined wait for new evidence; only a divergence is reported.
        let Verdict::Diverge(divergence) = self.rings.verdict() else {
            return;
        };
        let key = (
            divergence.proxy_members.clone(),
            divergence.push_members.clone(),
        );
        if self.reported_divergence.as_ref() == Some(&key) {
            return;
        }
        let diagnosis = format!(
            "msggateway-proxy places users with a ring over {} members like '{}', push delivers with a ring over {} members like '{}' ({}); the two rings send {:.0}% of user ids to different gateways ({} of the {} placements seen), and every such online user misses real-time messages. Make both hash the same member strings while the proxy keeps dialling the WebSocket port",
            divergence.proxy_members.len(),
            divergence.proxy_example,
            divergence.push_members.len(),
            divergence.push_example,
            divergence.difference,
            divergence.sample_split_share * 100.0,
            divergence.placements_split,
            divergence.placements_seen,
        );
        alerts.push(Alert::new(
            now_ns,
            AlertBody::RingDivergence {
                proxy_members: divergence.proxy_members,
                push_members: divergence.push_members,
                difference: divergence.difference,
                placements_seen: divergence.placements_seen,
                placements_split: divergence.placements_split,
                sample_split_share: divergence.sample_split_share,
                diagnosis,
            },
        ));
        self.reported_divergence = Some(key);
    }

    fn assess_churn(&mut self, now_ns: u64, alerts: &mut Vec<Alert>) {
        for (pid, activity) in &mut self.pushers {
            assess_pusher(&self.limits, *pid, activity, now_ns, alerts);
        }
    }
}

/// Raises `push_connection_churn` when a pusher opened many connections within the window,
/// keeps most of them open, and makes about one call on each: a client per call, never closed.
fn assess_pusher(
    limits: &RouteLimits,
    pid: u32,
    activity: &mut PusherActivity,
    now_ns: u64,
    alerts: &mut Vec<Alert>,
) {
    let window_secs = limits.churn_window_secs;
    let horizon = now_ns.saturating_sub(window_secs * NANOS_PER_SEC);
    for times in [&mut activity.opened_at, &mut activity.called_at] {
        while times.front().is_some_and(|&time| time < horizon) {
            times.pop_front();
        }
    }
    let new_connections = activity.opened_at.len() as u64;
    if new_connections < limits.churn_min_new_connections {
        return;
    }
    let calls_per_connection = activity.called_at.len() as f64 / new_connections as f64;
    if activity.open < new_connections / 2 || calls_per_connection > 2.0 {
        return;
    }
    let repeat_after = limits.fold_window_secs * NANOS_PER_SEC;
    if activity
        .last_alert_ns
        .is_some_and(|last| now_ns.saturating_sub(last) < repeat_after)
    {
        return;
    }
    activity.last_alert_ns = Some(now_ns);
    let pusher = Process {
        pid,
        comm: activity.comm.clone(),
        cgroup_id: activity.cgroup_id,
    };
    alerts.push(Alert::new(
        now_ns,
        AlertBody::PushConnectionChurn {
            diagnosis: format!(
                "{} (pid {pid}) opened {new_connections} gRPC connections to gateways in {window_secs}s, about {calls_per_connection:.1} call per connection, and holds {} open: a new client connection per push call that is never closed, as OpenIM 3.5.1 push does in Kubernetes mode. It leaks sockets and memory in push and in every gateway until restart",
                pusher.comm, activity.open
            ),
            pusher: pusher.into(),
            new_connections,
            window_secs,
            per_second: new_connections as f64 / window_secs.max(1) as f64,
            open_connections: activity.open,
            calls_per_connection: (calls_per_connection * 100.0).round() / 100.0,
        },
    ));
}

/// Counts a repeat of `key` inside its open window and lets `merge` fold the repeat's
/// details into the window's summary; false when `key` has no open window, and the caller
/// emits a first alert with `RouteTable::fold_first`. A free function
/// over the fold table, so callers may hold borrows of other fields.
fn fold_repeat(
    folds: &mut HashMap<FoldKey, Fold>,
    window_secs: u64,
    key: &FoldKey,
    ts_ns: u64,
    merge: impl FnOnce(&mut AlertBody),
) -> bool {
    let Some(fold) = folds.get_mut(key) else {
        return false;
    };
    if ts_ns.saturating_sub(fold.window_start_ns) >= window_secs * NANOS_PER_SEC {
        return false;
    }
    fold.count += 1;
    fold.summary.ts_ns = ts_ns;
    merge(&mut fold.summary.body);
    true
}

/// A window's repeats, as one alert with their count and the time of the last one; a key seen
/// once was already emitted.
fn emit_summary(fold: Fold, alerts: &mut Vec<Alert>) {
    if fold.count < 2 {
        return;
    }
    let mut summary = fold.summary;
    summary.ts = rfc3339(summary.ts_ns);
    match &mut summary.body {
        AlertBody::RouteMismatch { count, .. } | AlertBody::WsUpgradeOnGrpcPort { count, .. } => {
            *count = fold.count;
        }
        AlertBody::RingDivergence { .. } | AlertBody::PushConnectionChurn { .. } => {}
    }
    alerts.push(summary);
}

/// Appends a timestamp to a sliding window of `window_secs`, dropping what fell out of it; the
/// length cap keeps a flood from growing it.
fn push_bounded(times: &mut VecDeque<u64>, ts_ns: u64, window_secs: u64) {
    times.push_back(ts_ns);
    let horizon = ts_ns.saturating_sub(window_secs * NANOS_PER_SEC);
    while times.front().is_some_and(|&time| time < horizon) || times.len() > 100_000 {
        times.pop_front();
    }
}

fn summarize_placements(placements: &[Placement]) -> Vec<PlacementInfo> {
    let mut summary: Vec<PlacementInfo> = Vec::new();
    for placement in placements {
        if let Some(existing) = summary
            .iter_mut()
            .find(|info| info.gateway.gateway.ip == placement.gateway.ip)
        {
            existing.platforms.extend(placement.platform);
            continue;
        }
        summary.push(PlacementInfo {
            gateway: placement.gateway.clone().into(),
            platforms: placement.platform.into_iter().collect(),
            since: rfc3339(placement.since_ns),
            proxy: placement.proxy.clone().into(),
        });
    }
    summary
}

fn describe_gateway(gateway: &Gateway) -> String {
    match &gateway.name {
        Some(name) => format!("{name} ({})", gateway.ip),
        None => gateway.ip.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = NANOS_PER_SEC;

    fn gateway(index: u8, port: u16, name: Option<String>) -> Gateway {
        Gateway {
            ip: IpAddr::from([10, 244, 0, 10 + index]),
            port,
            name,
        }
    }

    fn proxy_name(index: u8) -> String {
        format!(
            "demo-openim-msggateway-{index}.demo-openim-msggateway-headless.chat.svc.cluster.local"
        )
    }

    fn process(pid: u32, comm: &str) -> Process {
        Process {
            pid,
            comm: comm.into(),
            cgroup_id: 0,
        }
    }

    fn place(table: &mut RouteTable, connection: u64, user: &str, on: u8, ts: u64) {
        table.observe(
            Observation::UpgradeRequested {
                connection,
                ts_ns: ts,
                user: user.into(),
                platform: Some(2),
                gateway: gateway(on, 80, Some(proxy_name(on))),
                proxy: process(10, "msggw-proxy"),
            },
            &mut Vec::new(),
        );
        table.observe(
            Observation::UpgradeAnswered {
                connection,
                ts_ns: ts,
                status: 101,
            },
            &mut Vec::new(),
        );
    }

    fn push(
        table: &mut RouteTable,
        connection: u64,
        users: &[&str],
        to: u8,
        ts: u64,
        answer_online: bool,
    ) -> Vec<Alert> {
        let mut alerts = Vec::new();
        table.observe(
            Observation::GrpcConnectionOpened {
                connection,
                ts_ns: ts,
                pusher: process(20, "openim-push"),
            },
            &mut alerts,
        );
        table.observe(
            Observation::PushCalled {
                connection,
                stream_id: 1,
                ts_ns: ts,
                method: "SuperGroupOnlineBatchPushOneMsg".into(),
                gateway: gateway(to, 88, Some(format!("{}:88", proxy_name(to)))),
                pusher: process(20, "openim-push"),
                message: MessageIds {
                    client_msg_id: Some("c1".into()),
                    ..MessageIds::default()
                },
                recipients: users.iter().map(|user| user.to_string()).collect(),
            },
            &mut alerts,
        );
        let results = users
            .iter()
            .map(|user| UserResult {
                user_id: user.to_string(),
                online_push: answer_online,
                platforms: if answer_online {
                    vec![crate::model::PlatformResult {
                        platform_id: 2,
                        result_code: 0,
                    }]
                } else {
                    Vec::new()
                },
            })
            .collect();
        table.observe(
            Observation::PushAnswered {
                connection,
                stream_id: 1,
                ts_ns: ts,
                results,
            },
            &mut alerts,
        );
        alerts
    }

    fn kinds(alerts: &[Alert]) -> Vec<&'static str> {
        alerts.iter().map(Alert::kind).collect()
    }

    #[test]
    fn a_full_fold_table_is_swept_once_a_second_not_per_alert() {
        let limits = RouteLimits {
            max_fold_keys: 2,
            fold_window_secs: 10,
            ..RouteLimits::default()
        };
        let mut table = RouteTable::new(limits);
        for (index, user) in ["u1", "u2", "u3", "u4", "u5"].iter().enumerate() {
            place(&mut table, 100 + index as u64, user, 0, SEC);
        }
        // Two keys fill the table; the third is emitted unfolded.
        push(&mut table, 1, &["u1", "u2"], 1, 2 * SEC, false);
        assert_eq!(
            kinds(&push(&mut table, 2, &["u3"], 1, 2 * SEC, false)).len(),
            1
        );
        assert_eq!(table.counters().fold_keys_evicted, 1);
        // Windows still open: a second within the sweep's second changes nothing.
        push(&mut table, 3, &["u4"], 1, 2 * SEC + SEC / 2, false);
        assert_eq!(table.counters().fold_keys_evicted, 2);
        // Once the first windows have expired, the next new key sweeps them and is folded.
        let alerts = push(&mut table, 4, &["u5"], 1, 13 * SEC, false);
        assert_eq!(kinds(&alerts), ["route_mismatch"]);
        assert_eq!(table.counters().fold_keys_evicted, 2);
        assert_eq!(table.folds.len(), 1);
    }

    #[test]
    fn a_push_to_the_placing_gateway_is_silent() {
        let mut table = RouteTable::new(RouteLimits::default());
        place(&mut table, 1, "u1", 0, SEC);
        assert!(push(&mut table, 2, &["u1"], 0, 2 * SEC, true).is_empty());
    }

    #[test]
    fn a_push_elsewhere_is_a_mismatch_with_the_gateways_answer() {
        let mut table = RouteTable::new(RouteLimits::default());
        place(&mut table, 1, "u1", 0, SEC);
        // The proxy has placed someone on gateway 3 too, so both spellings of it are known.
        place(&mut table, 9, "u9", 3, SEC);
        let alerts = push(&mut table, 2, &["u1"], 3, 2 * SEC, false);
        assert_eq!(kinds(&alerts), ["route_mismatch"]);
        let json: serde_json::Value = serde_json::from_str(&alerts[0].to_json_line()).unwrap();
        assert_eq!(json["kind"], "route_mismatch");
        assert_eq!(json["schema_version"], 1);
        assert_eq!(json["user"], "u1");
        assert_eq!(json["placed_on"][0]["gateway"]["ip"], "10.244.0.10");
        assert_eq!(json["placed_on"][0]["platforms"][0], 2);
        assert_eq!(json["pushed_to"]["gateway"]["ip"], "10.244.0.13");
        assert_eq!(json["pushed_to"]["answer"], "not_online_here");
        assert_eq!(json["pushed_to"]["message"]["client_msg_id"], "c1");
        let diagnosis = json["diagnosis"].as_str().unwrap();
        assert!(diagnosis.contains("missed real time"), "{diagnosis}");
        assert!(diagnosis.contains("':88'"), "{diagnosis}");
    }

    #[test]
    fn unplaced_users_and_closed_placements_are_not_judged() {
        let mut table = RouteTable::new(RouteLimits::default());
        assert!(push(&mut table, 2, &["stranger"], 3, SEC, false).is_empty());
        place(&mut table, 1, "u1", 0, SEC);
        table.observe(
            Observation::ConnectionClosed {
                connection: 1,
                ts_ns: 2 * SEC,
            },
            &mut Vec::new(),
        );
        assert!(push(&mut table, 3, &["u1"], 3, 3 * SEC, false).is_empty());
        // A refused upgrade is no placement either.
        table.observe(
            Observation::UpgradeRequested {
                connection: 4,
                ts_ns: 4 * SEC,
                user: "u2".into(),
                platform: None,
                gateway: gateway(0, 80, None),
                proxy: process(10, "p"),
            },
            &mut Vec::new(),
        );
        table.observe(
            Observation::UpgradeAnswered {
                connection: 4,
                ts_ns: 4 * SEC,
                status: 400,
            },
            &mut Vec::new(),
        );
        assert!(push(&mut table, 5, &["u2"], 3, 5 * SEC, false).is_empty());
    }

    #[test]
    fn repeats_fold_into_one_count_per_window() {
        let mut table = RouteTable::new(RouteLimits::default());
        place(&mut table, 1, "u1", 0, SEC);
        let mut alerts = Vec::new();
        for second in 2..12 {
            alerts.extend(push(
                &mut table,
                100 + second,
                &["u1"],
                3,
                second * SEC,
                false,
            ));
        }
        assert_eq!(alerts.len(), 1, "first one at once");
        table.tick(70 * SEC, &mut alerts);
        assert_eq!(alerts.len(), 2, "the window's summary");
        let AlertBody::RouteMismatch { count, .. } = &alerts[1].body else {
            panic!("{:?}", alerts[1]);
        };
        assert_eq!(*count, 10);
    }

    #[test]
    fn unanswered_calls_are_judged_on_close_and_timeout() {
        let mut table = RouteTable::new(RouteLimits::default());
        place(&mut table, 1, "u1", 0, SEC);
        let mut alerts = Vec::new();
        table.observe(
            Observation::PushCalled {
                connection: 2,
                stream_id: 1,
                ts_ns: 2 * SEC,
                method: "OnlinePushMsg".into(),
                gateway: gateway(1, 88, None),
                pusher: process(20, "push"),
                message: MessageIds::default(),
                recipients: vec!["u1".into()],
            },
            &mut alerts,
        );
        assert!(alerts.is_empty());
        table.tick(3 * SEC, &mut alerts);
        assert!(alerts.is_empty(), "still within the answer timeout");
        table.tick(10 * SEC, &mut alerts);
        assert_eq!(kinds(&alerts), ["route_mismatch"]);
        let AlertBody::RouteMismatch { pushed_to, .. } = &alerts[0].body else {
            unreachable!()
        };
        assert_eq!(pushed_to.answer, GatewayAnswer::Unknown);
    }

    #[test]
    fn differently_spelled_rings_diverge_once_settled() {
        let mut table = RouteTable::new(RouteLimits::default());
        let mut alerts = Vec::new();
        // As shipped: the proxy places with a ring over its own spelling; push learns its
        // members from its calls.
        let place_users = |table: &mut RouteTable, replicas: u8, from: u64, ts: u64| {
            let ring = crate::openim::hashring::Ring::new((0..replicas).map(proxy_name));
            for number in from..from + 30 {
                let user = (4_000_000_000 + number * 7_777).to_string();
                let index = ring.get_index(&user).unwrap() as u8;
                place(table, 10_000 + number, &user, index, ts);
            }
        };
        for index in 0..3u8 {
            alerts.extend(push(
                &mut table,
                100 + u64::from(index),
                &[],
                index,
                SEC,
                true,
            ));
        }
        place_users(&mut table, 3, 0, SEC);
        table.tick(2 * SEC, &mut alerts);
        assert!(alerts.is_empty(), "not settled yet");
        table.tick(5 * SEC, &mut alerts);
        assert_eq!(kinds(&alerts), ["ring_divergence"]);
        let AlertBody::RingDivergence {
            difference,
            proxy_members,
            push_members,
            sample_split_share,
            ..
        } = &alerts[0].body
        else {
            unreachable!()
        };
        assert_eq!(difference, "push members carry ':88', proxy members do not");
        assert_eq!(proxy_members, &(0..3).map(proxy_name).collect::<Vec<_>>());
        assert_eq!(push_members.len(), 3);
        assert!(*sample_split_share > 0.3, "{sample_split_share}");
        table.tick(20 * SEC, &mut alerts);
        assert_eq!(alerts.len(), 1, "reported once while membership holds");
        // Scale-out: a fourth gateway appears on both sides.
        push(&mut table, 150, &[], 3, 30 * SEC, true);
        place_users(&mut table, 4, 1000, 30 * SEC);
        table.tick(40 * SEC, &mut alerts);
        assert_eq!(kinds(&alerts), ["ring_divergence", "ring_divergence"]);
    }

    #[test]
    fn one_connection_per_call_is_churn() {
        let mut table = RouteTable::new(RouteLimits::default());
        let mut alerts = Vec::new();
        for call in 0..30u64 {
            alerts.extend(push(
                &mut table,
                1000 + call,
                &[],
                0,
                SEC + call * SEC / 10,
                true,
            ));
        }
        table.tick(5 * SEC, &mut alerts);
        assert_eq!(kinds(&alerts), ["push_connection_churn"]);
        let AlertBody::PushConnectionChurn {
            open_connections,
            calls_per_connection,
            ..
        } = &alerts[0].body
        else {
            unreachable!()
        };
        // Raised as the 20th connection opens, before its call.
        assert_eq!(*open_connections, 20);
        assert!(
            (*calls_per_connection - 0.95).abs() < 0.01,
            "{calls_per_connection}"
        );
        table.tick(6 * SEC, &mut alerts);
        assert_eq!(alerts.len(), 1, "not repeated within the window");
    }

    #[test]
    fn a_reused_connection_is_not_churn() {
        let mut table = RouteTable::new(RouteLimits::default());
        let mut alerts = Vec::new();
        table.observe(
            Observation::GrpcConnectionOpened {
                connection: 1,
                ts_ns: SEC,
                pusher: process(20, "push"),
            },
            &mut alerts,
        );
        for call in 0..100u32 {
            table.observe(
                Observation::PushCalled {
                    connection: 1,
                    stream_id: call * 2 + 1,
                    ts_ns: SEC + u64::from(call),
                    method: "m".into(),
                    gateway: gateway(0, 88, None),
                    pusher: process(20, "push"),
                    message: MessageIds::default(),
                    recipients: Vec::new(),
                },
                &mut alerts,
            );
        }
        table.tick(5 * SEC, &mut alerts);
        assert!(alerts.is_empty());
    }

    #[test]
    fn caps_bound_the_tables_and_count_what_they_turn_away() {
        let limits = RouteLimits {
            max_users: 10,
            max_tracked_connections: 15,
            ..RouteLimits::default()
        };
        let mut table = RouteTable::new(limits);
        for index in 0..100u64 {
            place(&mut table, index, &format!("user{index}"), 0, SEC);
        }
        assert_eq!(table.tracked_users(), 10);
        assert_eq!(table.counters().users_evicted, 90);
    }

    #[test]
    fn an_upgrade_on_the_grpc_port_names_its_users() {
        let mut table = RouteTable::new(RouteLimits::default());
        let mut alerts = Vec::new();
        for (connection, user) in [(1, "a"), (2, "b"), (3, "a")] {
            table.observe(
                Observation::UpgradeOnGrpcPort {
                    connection,
                    ts_ns: SEC,
                    user: Some(user.into()),
                    gateway: gateway(0, 88, Some(format!("{}:88", proxy_name(0)))),
                    proxy: process(10, "msggw-proxy"),
                },
                &mut alerts,
            );
        }
        assert_eq!(kinds(&alerts), ["ws_upgrade_on_grpc_port"]);
        table.finish(2 * SEC, &mut alerts);
        let AlertBody::WsUpgradeOnGrpcPort { users, count, .. } = &alerts[1].body else {
            panic!("{alerts:?}");
        };
        assert_eq!(users, &["a", "b"]);
        assert_eq!(*count, 3);
    }
}
