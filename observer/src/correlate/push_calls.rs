//! Keeps push calls waiting for the gateway's answer, and makes the judgment once it comes (or
//! cannot): every recipient whose WebSocket is placed on another gateway is a `route_mismatch`.

use std::net::IpAddr;

use hashbrown::HashMap;

use crate::{
    alert::{Alert, AlertBody, FoldWindows, PushInfo, RouteMismatch},
    budget,
    model::{ConnectionId, GatewayAnswer, NANOS_PER_SEC, PlatformResult, UserId, UserResult},
};

pub use super::pending_call::PendingCall;
use super::{
    FoldKey, MismatchKey, RouteLimits,
    message_routes::{Judgment, MessageRoutes},
    mid_stream::MidStream,
    placements::{self, Placement, Placements},
    ring_verdicts::RingVerdicts,
    shared::{AwaitingJoin, ClusterSide},
};

/// Counts the calls seen, answered, evicted, and left without an answer.
#[derive(Clone, Copy, Debug, Default)]
pub struct CallCounters {
    pub push_calls: u64,
    pub push_answers: u64,
    pub pending_calls_evicted: u64,
    pub calls_without_answer: u64,
}

/// Holds what judging a call consults and where its alerts fold.
pub struct Judge<'a> {
    pub placements: &'a Placements,
    pub rings: &'a mut RingVerdicts,
    /// Push's routing: whether a miss is judged now or held for its message's other calls.
    pub routes: &'a mut MessageRoutes,
    pub folds: &'a mut FoldWindows<FoldKey>,
    /// Recipients whose placement the observer could not see (it joined mid-stream).
    pub mid_stream: &'a mut MidStream,
    /// Cluster mode: where recipients without a local placement are looked up.
    pub cluster: Option<&'a mut ClusterSide>,
    /// Recipients checked against their placements so far.
    pub recipients_judged: &'a mut u64,
}

/// Holds the push calls waiting for their answer, within the limits' bound.
pub struct PushCalls {
    max_pending: usize,
    answer_timeout_secs: u64,
    pending: HashMap<(ConnectionId, u32), PendingCall>,
    counters: CallCounters,
}

impl PushCalls {
    /// Builds an empty table with the limits' bound and answer timeout.
    pub fn new(limits: &RouteLimits) -> Self {
        Self {
            max_pending: limits.max_pending_calls,
            answer_timeout_secs: limits.answer_timeout_secs,
            pending: HashMap::new(),
            counters: CallCounters::default(),
        }
    }

    /// Returns what the table counted.
    pub fn counters(&self) -> CallCounters {
        self.counters
    }

    /// Returns the connections with calls waiting for an answer.
    pub fn connections(&self) -> impl Iterator<Item = ConnectionId> + '_ {
        self.pending.keys().map(|(connection, _)| *connection)
    }

    /// Counts the calls waiting for an answer.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Records that push called stream `stream_id` of `connection`; the call waits for its answer.
    /// A full table first judges its oldest calls without their answer (as their timeout would),
    /// counted as evicted, rather than refusing the newest.
    pub fn called(
        &mut self,
        connection: ConnectionId,
        stream_id: u32,
        call: PendingCall,
        judge: &mut Judge<'_>,
        alerts: &mut Vec<Alert>,
    ) {
        self.counters.push_calls += 1;
        if self.pending.len() >= self.max_pending {
            let batch = budget::eviction_batch(self.max_pending);
            let oldest = budget::least_useful(self.pending.iter(), batch, |call| call.ts_ns);
            for key in oldest {
                if let Some(old) = self.pending.remove(&key) {
                    self.counters.pending_calls_evicted += 1;
                    judge_call(old, None, call.ts_ns, judge, alerts);
                }
            }
        }
        self.pending.insert((connection, stream_id), call);
    }

    /// Judges the call on stream `stream_id` of `connection` with the gateway's answer, if it
    /// waits.
    pub fn answered(
        &mut self,
        (connection, stream_id): (ConnectionId, u32),
        ts_ns: u64,
        results: &[UserResult],
        judge: &mut Judge<'_>,
        alerts: &mut Vec<Alert>,
    ) {
        if let Some(call) = self.pending.remove(&(connection, stream_id)) {
            self.counters.push_answers += 1;
            judge_call(call, Some(results), ts_ns, judge, alerts);
        }
    }

    /// Judges the calls on a closing connection without an answer: they will get none.
    pub fn closed(
        &mut self,
        connection: ConnectionId,
        ts_ns: u64,
        judge: &mut Judge<'_>,
        alerts: &mut Vec<Alert>,
    ) {
        let unanswered: Vec<u32> = self
            .pending
            .keys()
            .filter(|(call_connection, _)| *call_connection == connection)
            .map(|(_, stream)| *stream)
            .collect();
        for stream in unanswered {
            if let Some(call) = self.pending.remove(&(connection, stream)) {
                self.counters.calls_without_answer += 1;
                judge_call(call, None, ts_ns, judge, alerts);
            }
        }
    }

    /// Judges without an answer the calls that got none within the timeout.
    pub fn expire(&mut self, now_ns: u64, judge: &mut Judge<'_>, alerts: &mut Vec<Alert>) {
        let timeout = self.answer_timeout_secs * NANOS_PER_SEC;
        let expired: Vec<(ConnectionId, u32)> = self
            .pending
            .iter()
            .filter(|(_, call)| now_ns.saturating_sub(call.ts_ns) >= timeout)
            .map(|(key, _)| *key)
            .collect();
        for key in expired {
            if let Some(call) = self.pending.remove(&key) {
                self.counters.calls_without_answer += 1;
                judge_call(call, None, now_ns, judge, alerts);
            }
        }
    }

    /// Judges every pending call without an answer, at the end of input.
    pub fn finish(&mut self, now_ns: u64, judge: &mut Judge<'_>, alerts: &mut Vec<Alert>) {
        let pending: Vec<PendingCall> = self.pending.drain().map(|(_, call)| call).collect();
        for call in pending {
            self.counters.calls_without_answer += 1;
            judge_call(call, None, now_ns, judge, alerts);
        }
    }
}

/// Counts how many recipients ahead of the one being judged its two lookups are prefetched: each is
/// a cache miss in a table of up to 100,000 users. Four did best on the worst-case engine bench
/// (two and eight: ×0.97–×0.98 of it).
const PREFETCH_AHEAD: usize = 4;

/// Checks each recipient of a call against its placements. In cluster mode, recipients this
/// node holds no placement for are looked up on the other nodes and judged when the answer
/// comes (`judge_joined`), and every answer is shared.
fn judge_call(
    call: PendingCall,
    results: Option<&[UserResult]>,
    ts_ns: u64,
    judge: &mut Judge<'_>,
    alerts: &mut Vec<Alert>,
) {
    // A copy of the shared reference: the placements outlive the mutable uses of `judge`.
    let local_placements = judge.placements;
    let mut unplaced = Vec::new();
    let mut unseen = 0;
    let answers = Answers::new(&call.recipients, results.unwrap_or_default());
    let prefetch = |judge: &Judge<'_>, user: &str| {
        local_placements.prefetch(user);
        judge.folds.prefetch(&MismatchKey {
            user,
            // Where a user is placed is not hashed: the key is found without it.
            placed: &[],
            pushed: call.gateway.ip,
        });
    };
    for user in call.recipients.iter().take(PREFETCH_AHEAD) {
        prefetch(judge, user);
    }
    for (position, user) in call.recipients.iter().enumerate() {
        if let Some(ahead) = call.recipients.get(position + PREFETCH_AHEAD) {
            prefetch(judge, ahead);
        }
        let answer = answers.for_recipient(position, user);
        match local_placements.of(user) {
            Some(placements) => {
                judge_user(user, placements, answer, &call, ts_ns, judge, alerts);
            }
            None if judge.cluster.is_some() => unplaced.push(user.clone()),
            None => unseen += 1,
        }
    }
    judge.mid_stream.unjudged(unseen, ts_ns, alerts);
    let Some(cluster) = judge.cluster.as_deref_mut() else {
        return;
    };
    if unplaced.is_empty() {
        return;
    }
    let results = results.map(|results| {
        results
            .iter()
            .filter(|answer| unplaced.contains(&answer.user_id))
            .cloned()
            .collect()
    });
    let join = AwaitingJoin {
        call: PendingCall {
            recipients: Vec::new(),
            ..call
        },
        results,
        ts_ns,
    };
    cluster.park(
        unplaced.into_iter().map(UserId::into_string).collect(),
        join,
    );
}

/// Holds the gateway's answers to one call, by recipient.
enum Answers<'a> {
    /// One answer per recipient, in the request's order, as OpenIM's gateway writes them: a
    /// recipient's answer is the one at its own position, found without a table.
    InOrder(&'a [UserResult]),
    /// Any other order (or answers missing): one lookup per recipient instead of a scan of
    /// every answer (a call to 40 users compared 1,600 user ids); the first answer naming a
    /// user wins.
    ByUser(HashMap<&'a str, &'a UserResult>),
}

impl<'a> Answers<'a> {
    fn new(recipients: &[UserId], answered: &'a [UserResult]) -> Self {
        let in_order = answered.len() == recipients.len()
            && answered
                .iter()
                .zip(recipients)
                .all(|(answer, user)| answer.user_id == *user);
        if in_order {
            return Answers::InOrder(answered);
        }
        let mut by_user = HashMap::with_capacity(answered.len());
        for answer in answered {
            by_user.entry(answer.user_id.as_str()).or_insert(answer);
        }
        Answers::ByUser(by_user)
    }

    fn for_recipient(&self, position: usize, user: &str) -> Option<&'a UserResult> {
        match self {
            Answers::InOrder(answered) => answered.get(position),
            Answers::ByUser(by_user) => by_user.get(user).copied(),
        }
    }
}

/// Completes a parked judgment with the placements other nodes saw for its recipients.
pub fn judge_joined(
    join: AwaitingJoin,
    found: &mut [(String, Vec<Placement>)],
    judge: &mut Judge<'_>,
    alerts: &mut Vec<Alert>,
) {
    found.sort_unstable_by(|(a, _), (b, _)| a.cmp(b));
    for (user, placements) in found.iter() {
        if placements.is_empty() {
            continue;
        }
        let answer = join
            .results
            .as_deref()
            .and_then(|results| results.iter().find(|answer| answer.user_id == user));
        judge_user(
            user, placements, answer, &join.call, join.ts_ns, judge, alerts,
        );
    }
}

/// Reads what the gateway's answer for one user says, and the platforms it lists.
fn gateway_answer(answer: Option<&UserResult>) -> (GatewayAnswer, Vec<PlatformResult>) {
    match answer {
        None => (GatewayAnswer::Unknown, Vec::new()),
        Some(answer) if answer.platforms.is_empty() => (GatewayAnswer::EmptyEntry, Vec::new()),
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
    }
}

/// Judges one recipient against its placements: a `route_mismatch` unless one of them is on the
/// gateway the call went to.
fn judge_user(
    user: &str,
    placements: &[Placement],
    answer: Option<&UserResult>,
    call: &PendingCall,
    ts_ns: u64,
    judge: &mut Judge<'_>,
    alerts: &mut Vec<Alert>,
) {
    *judge.recipients_judged += 1;
    if placements
        .iter()
        .any(|placement| placement.gateway.ip == call.gateway.ip)
    {
        return;
    }
    // Nearly every user has one placement: its gateway is the sorted list, without a Vec.
    let several: Vec<IpAddr>;
    let placed = match placements {
        [only] => std::slice::from_ref(&only.gateway.ip),
        _ => {
            let mut gateways: Vec<IpAddr> = placements
                .iter()
                .map(|placement| placement.gateway.ip)
                .collect();
            gateways.sort();
            gateways.dedup();
            several = gateways;
            &several
        }
    };
    let key = MismatchKey {
        user,
        placed,
        pushed: call.gateway.ip,
    };
    let judgment = judge.routes.judgment(&call.message);
    match judgment {
        Judgment::Skip => return,
        Judgment::Now if judge.folds.repeat(&key, ts_ns) => return,
        Judgment::Now | Judgment::Hold => {}
    }
    let alert = mismatch_alert(user, placements, placed, answer, call, ts_ns, judge);
    if judgment == Judgment::Now {
        judge.folds.first(key.to_owned_key(), alert, alerts);
    } else {
        judge.routes.hold(
            &call.message,
            placed,
            key.to_owned_key(),
            alert,
            judge.folds,
            alerts,
        );
    }
}

/// Builds the `route_mismatch` for `user`, placed on `placed`, in `call`.
fn mismatch_alert(
    user: &str,
    placements: &[Placement],
    placed: &[IpAddr],
    answer: Option<&UserResult>,
    call: &PendingCall,
    ts_ns: u64,
    judge: &mut Judge<'_>,
) -> Alert {
    let (gateway_answer, answer_platforms) = gateway_answer(answer);
    let cause = judge.rings.cause(user, placed, call.gateway.ip);
    let local_node = judge.cluster.as_deref().map(|cluster| &*cluster.node);
    let placed_on = placements::summarize(placements, local_node);
    Alert::new(
        ts_ns,
        AlertBody::RouteMismatch(RouteMismatch {
            user: user.into(),
            placed_on,
            pushed_to: PushInfo {
                gateway: call.gateway.clone().into(),
                method: call.method.clone(),
                message: call.message.clone(),
                pusher: call.pusher.clone().into(),
                answer: gateway_answer,
                answer_platforms,
                node: local_node.map(str::to_owned),
            },
            count: 1,
            window_secs: judge.folds.window_secs(),
            spelling_difference: judge.rings.spelling_difference(),
            cause,
        }),
    )
}

#[cfg(test)]
mod tests;
