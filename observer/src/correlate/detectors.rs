//! Holds the detectors, fed `Observation`s in time order, and the thin dispatcher between them.
//!
//! Each detector keeps its own state and file: `placements` (user → live WebSockets),
//! `push_calls` (pending calls, judged against the placements into `route_mismatch`),
//! `ring_verdicts` (the learned rings, compared once settled into `ring_divergence`), `churn`
//! (`push_connection_churn`), `upgrade_on_grpc` (`ws_upgrade_on_grpc_port`) and
//! `message_routes` (push's routing, `push_routing`, and the misses it may still cover).
//! Repeats of the alerts that fold share one `FoldWindows`, so summaries come out in one order.
//!
//! Every table has a cap; what a cap turns away is counted, never silently lost.

use std::{collections::HashSet, sync::Arc};

use crate::{
    alert::{Alert, FoldWindows, PushRoutingMode},
    budget,
    model::{ConnectionId, ConnectionKey},
};

use super::{
    FoldKey,
    churn::Churn,
    message_routes::{MessageRoutes, RouteLearningCounters},
    mid_stream::MidStream,
    observation::Observation,
    placements::{Placement, Placements},
    push_calls::{self, Judge, PendingCall, PushCalls},
    ring_verdicts::RingVerdicts,
    shared::{ClusterSide, RemotePlacement, RingSide, SharedFact, SharedRingEvidence},
    upgrade_on_grpc::{self, UpgradesOnGrpc},
};

/// Holds the bounds and windows; the daemon sets them from flags.
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
    /// Until push's ring is learned, a miss waits this long for its message's calls to other
    /// gateways (push may broadcast); 0 judges every miss at once.
    pub message_window_ms: u64,
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
            message_window_ms: 1_000,
        }
    }
}

/// Counts what the detectors saw, judged and evicted.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RouteCounters {
    pub placements: u64,
    pub push_calls: u64,
    pub push_answers: u64,
    /// Push recipients checked against their placements, whether misrouted or not: the
    /// denominator of the share of recipients misrouted.
    pub push_recipients_judged: u64,
    pub users_evicted: u64,
    pub placements_evicted: u64,
    pub pending_calls_evicted: u64,
    pub calls_without_answer: u64,
    pub connections_evicted: u64,
    pub fold_keys_evicted: u64,
    /// Push's routing as learned, and the misses it held back.
    pub routing: RouteLearningCounters,
    /// The routing learned (`ring` or `broadcast`), if learned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub push_routing: Option<&'static str>,
    /// The gateway service push calls, if seen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub push_service: Option<String>,
}

/// Runs every detector on the observations, in time order.
pub struct Detectors {
    pub(super) placements: Placements,
    pub(super) push_calls: PushCalls,
    rings: RingVerdicts,
    churn: Churn,
    upgrades_on_grpc: UpgradesOnGrpc,
    mid_stream: MidStream,
    routes: MessageRoutes,
    folds: FoldWindows<FoldKey>,
    /// Cluster mode only.
    pub(super) cluster: Option<ClusterSide>,
    max_tracked_connections: usize,
    /// Push recipients checked against their placements.
    recipients_judged: u64,
}

impl Detectors {
    /// Builds the detectors with the daemon's limits.
    pub fn new(limits: RouteLimits) -> Self {
        Self {
            cluster: None,
            max_tracked_connections: limits.max_tracked_connections,
            recipients_judged: 0,
            placements: Placements::new(&limits),
            push_calls: PushCalls::new(&limits),
            rings: RingVerdicts::new(limits.ring_settle_secs),
            churn: Churn::new(&limits),
            upgrades_on_grpc: UpgradesOnGrpc::default(),
            mid_stream: MidStream::default(),
            routes: MessageRoutes::new(&limits),
            folds: FoldWindows::new(limits.fold_window_secs, limits.max_fold_keys),
        }
    }

    /// Returns what the detectors counted.
    pub fn counters(&self) -> RouteCounters {
        let placements = self.placements.counters();
        let calls = self.push_calls.counters();
        RouteCounters {
            placements: placements.placements,
            push_calls: calls.push_calls,
            push_answers: calls.push_answers,
            push_recipients_judged: self.recipients_judged,
            users_evicted: placements.users_evicted,
            placements_evicted: placements.placements_evicted,
            pending_calls_evicted: calls.pending_calls_evicted,
            calls_without_answer: calls.calls_without_answer,
            connections_evicted: placements.connections_evicted + self.churn.connections_evicted(),
            fold_keys_evicted: self.folds.keys_evicted(),
            routing: self.routes.counters(),
            push_routing: self.routes.mode().map(PushRoutingMode::name),
            push_service: self.routes.service().map(str::to_owned),
        }
    }

    /// Counts the users with a live placement.
    pub fn tracked_users(&self) -> usize {
        self.placements.users()
    }

    /// Estimates the bytes of users, pending calls and fold windows.
    pub fn memory(&self, memory: &mut budget::MemoryCounters) {
        memory.user_bytes = self.placements.users() * budget::USER_BYTES;
        memory.pending_call_bytes =
            (self.push_calls.pending() + self.routes.held()) * budget::PENDING_CALL_BYTES;
        memory.fold_window_bytes = self.folds.open_windows() * budget::FOLD_WINDOW_BYTES;
    }

    /// Drops the users placed longest ago until about `bytes` are freed; returns how many.
    pub fn shed_users(&mut self, bytes: usize) -> u64 {
        self.placements.evict(bytes.div_ceil(budget::USER_BYTES))
    }

    /// Returns what judging a push call consults.
    fn judge(&mut self) -> (&mut PushCalls, Judge<'_>) {
        (
            &mut self.push_calls,
            Judge {
                placements: &self.placements,
                rings: &mut self.rings,
                routes: &mut self.routes,
                folds: &mut self.folds,
                mid_stream: &mut self.mid_stream,
                cluster: self.cluster.as_mut(),
                recipients_judged: &mut self.recipients_judged,
            },
        )
    }

    /// Hands one observation to the detectors it concerns.
    ///
    /// Longer than 100 lines on purpose: one `match` with an arm per kind of observation, so
    /// which detector sees what reads in one place.
    pub fn observe(&mut self, observation: Observation, alerts: &mut Vec<Alert>) {
        match observation {
            Observation::GrpcConnectionOpened {
                connection,
                ts_ns,
                pusher,
            } => self.churn.opened(connection, ts_ns, pusher, alerts),
            Observation::ConnectionClosed { connection, ts_ns } => {
                self.closed(connection, ts_ns, alerts);
            }
            Observation::UpgradeRequested {
                connection,
                endpoints,
                ts_ns,
                user,
                platform,
                gateway,
                proxy,
            } => {
                // The placement its socket address still holds ends as a close would end it.
                if self.placements.reused(connection) {
                    self.end_placement(connection);
                }
                self.rings
                    .placement(gateway.name.as_deref(), gateway.ip, &user, ts_ns);
                if let Some(cluster) = &mut self.cluster {
                    share_placement(
                        cluster,
                        self.max_tracked_connections,
                        connection,
                        endpoints,
                        ts_ns,
                        &user,
                        platform,
                        &gateway,
                        &proxy,
                    );
                }
                self.placements
                    .place(connection, ts_ns, user, platform, gateway, proxy);
            }
            Observation::WebSocketJoinedMidStream { connection } => {
                self.mid_stream.websocket_adopted(connection);
            }
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
            } => self.upgrades_on_grpc.requested(
                upgrade_on_grpc::Request {
                    connection,
                    ts_ns,
                    user,
                    gateway,
                    proxy,
                },
                &mut self.folds,
                alerts,
            ),
            Observation::UpgradeOnGrpcPortAnswered { connection, status } => {
                self.upgrades_on_grpc
                    .answered(connection, status, &mut self.folds);
            }
            Observation::PushCalled {
                connection,
                stream_id,
                ts_ns,
                method,
                service,
                gateway,
                pusher,
                message,
                recipients,
            } => {
                self.rings
                    .push_call(gateway.name.as_deref(), gateway.ip, ts_ns);
                let call = (service.as_ref(), gateway.ip, recipients.as_slice());
                if let Some(mode) = self.routes.called(&message, call, ts_ns, alerts) {
                    self.rings.push_routing_learned(mode);
                }
                if let (Some(cluster), Some(member)) = (&mut self.cluster, &gateway.name) {
                    cluster.member_seen(RingSide::Push, member, gateway.ip, ts_ns);
                }
                self.churn.called(connection, ts_ns);
                let (calls, mut judge) = self.judge();
                calls.called(
                    connection,
                    stream_id,
                    PendingCall {
                        ts_ns,
                        method,
                        gateway,
                        pusher,
                        message,
                        recipients,
                    },
                    &mut judge,
                    alerts,
                );
            }
            Observation::PushAnswered {
                connection,
                stream_id,
                ts_ns,
                results,
            } => {
                let (calls, mut judge) = self.judge();
                calls.answered((connection, stream_id), ts_ns, &results, &mut judge, alerts);
            }
        }
    }

    fn closed(&mut self, connection: ConnectionId, ts_ns: u64, alerts: &mut Vec<Alert>) {
        let (calls, mut judge) = self.judge();
        calls.closed(connection, ts_ns, &mut judge, alerts);
        self.upgrades_on_grpc.closed(connection);
        self.end_placement(connection);
        self.churn.closed(connection);
        self.mid_stream.closed(connection, ts_ns, alerts);
    }

    /// Ends what every connection not in `alive` still holds (placements, pending calls,
    /// churn and upgrade records), as its close would have. Placements adopted in cluster mode
    /// are not kernel connections: their close is matched by their two ends.
    pub fn reconcile(
        &mut self,
        alive: &HashSet<ConnectionId>,
        now_ns: u64,
        alerts: &mut Vec<Alert>,
    ) {
        let mut gone: HashSet<ConnectionId> = self
            .placements
            .connections()
            .chain(self.push_calls.connections())
            .chain(self.churn.connections())
            .chain(self.upgrades_on_grpc.connections())
            .chain(self.mid_stream.unseen_connections())
            .filter(|connection| !alive.contains(connection))
            .collect();
        gone.retain(|connection| !self.placements.is_adopted(*connection));
        for connection in gone {
            self.closed(connection, now_ns, alerts);
        }
    }

    /// Ends the placement on `connection` (if any); cluster mode tells the other nodes.
    fn end_placement(&mut self, connection: ConnectionId) {
        let user = self.placements.end(connection);
        if let Some(cluster) = &mut self.cluster
            && let Some(key) = cluster.keys_by_connection.remove(&connection)
            && let Some(user) = user
        {
            cluster.facts.push(SharedFact::Unplaced {
                user,
                connection: key,
            });
        }
    }

    /// Switches to cluster mode from now on, as `node`.
    pub fn join_cluster(&mut self, node: &str) {
        self.cluster = Some(ClusterSide::new(node));
    }

    /// Handles the close of a connection the decoders did not know: the end of an adopted
    /// placement?
    pub fn closed_by_key(&mut self, key: ConnectionKey) {
        if !self.placements.has_adopted() {
            return;
        }
        if let Some(user) = self.placements.end_adopted(key)
            && let Some(cluster) = &mut self.cluster
        {
            cluster.facts.push(SharedFact::Unplaced {
                user,
                connection: key,
            });
        }
    }

    /// Takes over placements this node made before the observer restarted.
    pub fn adopt(&mut self, placements: Vec<(String, RemotePlacement)>) {
        for (user, placement) in placements {
            self.placements.adopt(
                placement.connection,
                placement.since_ns,
                user,
                placement.platform,
                placement.gateway,
                placement.proxy,
            );
            if let Some(cluster) = &mut self.cluster {
                cluster.counters.placements_adopted += 1;
            }
        }
    }

    /// Completes the judgment parked under lookup `id` with the placements found for its users.
    pub fn joined(
        &mut self,
        id: u64,
        found: Vec<(String, Arc<[RemotePlacement]>)>,
        alerts: &mut Vec<Alert>,
    ) {
        let Some(join) = self.cluster.as_mut().and_then(|cluster| cluster.unpark(id)) else {
            return;
        };
        let mut found: Vec<(String, Vec<Placement>)> = found
            .into_iter()
            .map(|(user, placements)| {
                let placements = placements
                    .iter()
                    .map(|placement| Placement {
                        // Not held here: no connection of this node ends it.
                        connection: 0,
                        gateway: placement.gateway.clone(),
                        platform: placement.platform,
                        since_ns: placement.since_ns,
                        proxy: placement.proxy.clone(),
                        node: Some(Arc::clone(&placement.node)),
                    })
                    .collect();
                (user, placements)
            })
            .collect();
        let (_, mut judge) = self.judge();
        push_calls::judge_joined(join, &mut found, &mut judge, alerts);
    }

    /// Judges the misses held for their message's other calls once due (all with `all`); the
    /// routing they teach reaches the rings.
    fn release_held(&mut self, now_ns: u64, all: bool, alerts: &mut Vec<Alert>) {
        let before = self.routes.mode();
        self.routes.release(now_ns, all, &mut self.folds, alerts);
        if let Some(mode) = self.routes.mode()
            && before != Some(mode)
        {
            self.rings.push_routing_learned(mode);
        }
    }

    /// Merges the cluster's ring evidence into the learned rings.
    pub fn merge_ring_evidence(&mut self, evidence: &SharedRingEvidence, now_ns: u64) {
        self.rings.merge(evidence, now_ns);
    }

    /// Lets time pass: windows close, unanswered calls time out, settled rings are compared,
    /// churn is assessed. The daemon calls it about once a second.
    pub fn tick(&mut self, now_ns: u64, alerts: &mut Vec<Alert>) {
        let (calls, mut judge) = self.judge();
        calls.expire(now_ns, &mut judge, alerts);
        self.release_held(now_ns, false, alerts);
        if let Some(cluster) = &mut self.cluster {
            cluster.expire(now_ns);
        }
        self.folds.close(now_ns, false, alerts);
        self.rings.evaluate(now_ns, false, alerts);
        self.churn.assess(now_ns, alerts);
    }

    /// Judges what is pending and emits folded counts now: end of input (replay) or shutdown.
    pub fn finish(&mut self, now_ns: u64, alerts: &mut Vec<Alert>) {
        let (calls, mut judge) = self.judge();
        calls.finish(now_ns, &mut judge, alerts);
        self.release_held(now_ns, true, alerts);
        self.churn.assess(now_ns, alerts);
        self.rings.evaluate(now_ns, true, alerts);
        self.folds.close(now_ns, true, alerts);
    }
}

/// Tells the other nodes about a placement, and remembers its connection's two ends for the
/// `Unplaced` fact that will end it.
#[allow(clippy::too_many_arguments)]
fn share_placement(
    cluster: &mut ClusterSide,
    max_connections: usize,
    connection: ConnectionId,
    endpoints: ConnectionKey,
    ts_ns: u64,
    user: &str,
    platform: Option<i32>,
    gateway: &crate::model::Gateway,
    proxy: &crate::model::Process,
) {
    if let Some(host) = &gateway.name {
        cluster.member_seen(RingSide::Proxy, host, gateway.ip, ts_ns);
    }
    if cluster.keys_by_connection.len() < max_connections
        || cluster.keys_by_connection.contains_key(&connection)
    {
        cluster.keys_by_connection.insert(connection, endpoints);
    }
    cluster.facts.push(SharedFact::Placed {
        user: user.to_owned(),
        connection: endpoints,
        gateway: gateway.clone(),
        platform,
        since_ns: ts_ns,
        proxy: proxy.clone(),
    });
}

#[cfg(test)]
pub(super) mod testing;

#[cfg(test)]
mod tests;
