//! Learns from the wire how push routes a message, and holds back the misses that routing may
//! still cover.
//!
//! OpenIM's push sends a message either to the one gateway its ring picks for each recipient
//! ([`PushRoutingMode::Ring`]: 3.5 to 3.8.3 with Kubernetes discovery) or to every gateway,
//! each call listing every recipient ([`PushRoutingMode::Broadcast`]: zookeeper or etcd
//! discovery, 3.8.4 and later). Under broadcast a call to a gateway that does not hold a
//! recipient's WebSocket is expected: the recipient misses real time only when no gateway that
//! received the message holds it. So the calls of one message (same ids) are grouped: a
//! recipient list seen on two gateways is broadcast, recipient lists split over gateways are a
//! ring. Until the ring is learned, a miss waits [`RouteLimits::message_window_ms`] for the
//! message's other calls; once it is, misses are judged at once, as the ring sends each
//! recipient to one gateway only.

use std::{collections::VecDeque, hash::BuildHasher, net::IpAddr, sync::Arc};

use hashbrown::{DefaultHashBuilder, HashMap};
use smallvec::SmallVec;

use crate::{
    alert::{Alert, AlertBody, FoldWindows, PushRoutingMode},
    model::{MessageIds, UserId},
};

use super::{FoldKey, RouteLimits};

/// Bounds the calls of one message remembered (a broadcast makes one per gateway, a ring one per
/// gateway holding recipients): OpenIM runs tens of gateways.
const MAX_CALLS_PER_MESSAGE: usize = 64;

/// Records how push routed the calls of one message seen so far.
#[derive(Debug)]
struct MessageRoute {
    /// Each call's gateway and a fingerprint of its recipient list.
    calls: SmallVec<[(IpAddr, u64); 4]>,
    /// One recipient list went to two gateways.
    broadcast: bool,
    /// Users (by hash) a miss of this broadcast message was reported for: one line each,
    /// not one per gateway the message went to.
    reported: SmallVec<[u64; 2]>,
}

impl MessageRoute {
    /// Tells whether the message went to two gateways, no recipient list to both.
    fn split(&self) -> bool {
        let first = self.calls.first().map(|(gateway, _)| *gateway);
        !self.broadcast
            && self
                .calls
                .iter()
                .any(|(gateway, _)| Some(*gateway) != first)
    }
}

/// Holds a miss waiting for the rest of its message's calls.
#[derive(Debug)]
struct Parked {
    message: u64,
    /// The user's hash, to report a broadcast message's miss once.
    user: u64,
    due_ns: u64,
    /// The gateways holding the user's WebSocket.
    placed: SmallVec<[IpAddr; 1]>,
    key: FoldKey,
    alert: Alert,
}

/// Says when a miss is judged (see [`MessageRoutes::judgment`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judgment {
    /// At once: a `route_mismatch` unless its fold window is open.
    Now,
    /// Once the message's window has passed ([`MessageRoutes::hold`]).
    Hold,
    /// Not at all, and counted.
    Skip,
}

/// Holds what the routing table counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RouteLearningCounters {
    /// Misses held back until their message's calls were all seen.
    pub misses_held: u64,
    /// Held misses that another call of the same broadcast message covered.
    pub misses_covered_by_broadcast: u64,
    /// Messages forgotten before their window ended (the table was full).
    pub messages_evicted: u64,
    /// Held misses judged before their window ended (the table was full).
    pub misses_judged_early: u64,
    /// Push calls without message ids, under broadcast: not judged.
    pub calls_unjudged_without_ids: u64,
}

/// Holds push's routing as learned from its calls, and the misses it may still cover.
pub struct MessageRoutes {
    window_ns: u64,
    /// How long a message's route is kept: until its last held miss is due, a call without an
    /// answer included.
    keep_ns: u64,
    max_messages: usize,
    max_parked: usize,
    hasher: DefaultHashBuilder,
    messages: HashMap<u64, MessageRoute>,
    /// Messages in opening order, to forget them once their window has passed.
    opened: VecDeque<(u64, u64)>,
    parked: VecDeque<Parked>,
    mode: Option<PushRoutingMode>,
    service: Option<Arc<str>>,
    /// What the last `push_routing` line said.
    announced: Option<(PushRoutingMode, Option<Arc<str>>)>,
    counters: RouteLearningCounters,
}

impl MessageRoutes {
    /// Creates an empty table with the limits' window and bounds.
    pub fn new(limits: &RouteLimits) -> Self {
        Self {
            window_ns: limits.message_window_ms * 1_000_000,
            keep_ns: 2 * limits.message_window_ms * 1_000_000
                + limits.answer_timeout_secs * crate::model::NANOS_PER_SEC,
            max_messages: limits.max_pending_calls,
            max_parked: limits.max_pending_calls,
            hasher: DefaultHashBuilder::default(),
            messages: HashMap::new(),
            opened: VecDeque::new(),
            parked: VecDeque::new(),
            mode: None,
            service: None,
            announced: None,
            counters: RouteLearningCounters::default(),
        }
    }

    /// Returns what the table counted.
    pub fn counters(&self) -> RouteLearningCounters {
        self.counters
    }

    /// Returns the routing learned so far.
    pub fn mode(&self) -> Option<PushRoutingMode> {
        self.mode
    }

    /// Returns the gateway service push was last seen calling.
    pub fn service(&self) -> Option<&str> {
        self.service.as_deref()
    }

    /// Returns how long a miss waits for its message's other calls.
    #[cfg(test)]
    pub fn window_ns(&self) -> u64 {
        self.window_ns
    }

    /// Returns how many messages and held misses the table holds.
    pub fn held(&self) -> usize {
        self.messages.len() + self.parked.len()
    }

    /// Records a push call (its service, when its `:path` named one, gateway and recipients);
    /// returns the routing when this call changed what was learned (a
    /// `push_routing` line is then in `alerts`).
    pub fn called(
        &mut self,
        message: &MessageIds,
        (service, gateway, recipients): (Option<&Arc<str>>, IpAddr, &[UserId]),
        ts_ns: u64,
        alerts: &mut Vec<Alert>,
    ) -> Option<PushRoutingMode> {
        if let Some(service) = service
            && self.service.as_ref() != Some(service)
        {
            self.service = Some(service.clone());
        }
        let mut learned = None;
        if let Some(id) = self.message_key(message)
            && !recipients.is_empty()
        {
            let fingerprint = self.fingerprint(recipients);
            learned = self.record_call(id, gateway, fingerprint, ts_ns);
        }
        self.announce(ts_ns, alerts);
        learned
    }

    /// Decides when a miss in a call of `message` is judged: now (the ring is learned, or the
    /// message cannot be grouped), after the message's other calls, or never (broadcast, and
    /// the message has no ids to group it by).
    pub fn judgment(&mut self, message: &MessageIds) -> Judgment {
        if self.window_ns == 0 {
            return Judgment::Now;
        }
        match (self.mode, self.message_key(message).is_some()) {
            (Some(PushRoutingMode::Ring), _) => Judgment::Now,
            (_, true) => Judgment::Hold,
            (Some(PushRoutingMode::Broadcast), false) => {
                self.counters.calls_unjudged_without_ids += 1;
                Judgment::Skip
            }
            (None, false) => Judgment::Now,
        }
    }

    /// Holds a miss until one window after its alert's time (see [`MessageRoutes::release`]).
    pub fn hold(
        &mut self,
        message: &MessageIds,
        placed: &[IpAddr],
        key: FoldKey,
        alert: Alert,
        folds: &mut FoldWindows<FoldKey>,
        alerts: &mut Vec<Alert>,
    ) {
        let ts_ns = alert.ts_ns;
        let Some(id) = self.message_key(message) else {
            return;
        };
        if self.parked.len() >= self.max_parked
            && let Some(oldest) = self.parked.pop_front()
        {
            self.counters.misses_judged_early += 1;
            self.judge(oldest, folds, alerts);
        }
        self.counters.misses_held += 1;
        let user = match &*alert.body {
            AlertBody::RouteMismatch(mismatch) => self.hasher.hash_one(mismatch.user.as_str()),
            _ => 0,
        };
        self.parked.push_back(Parked {
            message: id,
            user,
            due_ns: ts_ns + self.window_ns,
            placed: placed.iter().copied().collect(),
            key,
            alert,
        });
    }

    /// Judges the held misses whose window has ended by `now_ns` (all with `all`), and forgets
    /// the messages no held miss needs any more.
    pub fn release(
        &mut self,
        now_ns: u64,
        all: bool,
        folds: &mut FoldWindows<FoldKey>,
        alerts: &mut Vec<Alert>,
    ) {
        while let Some(front) = self.parked.front()
            && (all || front.due_ns <= now_ns)
        {
            if let Some(parked) = self.parked.pop_front() {
                // The window has passed: a message split over gateways teaches the ring now,
                // not only when it is forgotten.
                if let Some(route) = self.messages.get(&parked.message)
                    && route.split()
                    && self.learn(PushRoutingMode::Ring).is_some()
                {
                    self.announce(now_ns, alerts);
                }
                self.judge(parked, folds, alerts);
            }
        }
        while let Some(&(opened_ns, id)) = self.opened.front()
            && (all || now_ns.saturating_sub(opened_ns) >= self.keep_ns)
        {
            self.opened.pop_front();
            if let Some(route) = self.messages.remove(&id) {
                self.closed(&route, now_ns, alerts);
            }
        }
    }

    /// Judges a held miss: a miss unless its message went, under broadcast, to a gateway that holds
    /// the user's WebSocket.
    fn judge(&mut self, parked: Parked, folds: &mut FoldWindows<FoldKey>, alerts: &mut Vec<Alert>) {
        if let Some(route) = self.messages.get_mut(&parked.message)
            && route.broadcast
        {
            let covered = route
                .calls
                .iter()
                .any(|(gateway, _)| parked.placed.contains(gateway));
            if covered {
                self.counters.misses_covered_by_broadcast += 1;
                return;
            }
            if route.reported.contains(&parked.user) {
                return;
            }
            route.reported.push(parked.user);
        }
        if !folds.repeat(&parked.key, parked.alert.ts_ns) {
            folds.first(parked.key, parked.alert, alerts);
        }
    }

    /// Adds a call to its message's route; returns the routing if it changed.
    fn record_call(
        &mut self,
        id: u64,
        gateway: IpAddr,
        fingerprint: u64,
        ts_ns: u64,
    ) -> Option<PushRoutingMode> {
        if !self.messages.contains_key(&id) {
            if self.messages.len() >= self.max_messages
                && let Some((_, oldest)) = self.opened.pop_front()
                && self.messages.remove(&oldest).is_some()
            {
                self.counters.messages_evicted += 1;
            }
            self.opened.push_back((ts_ns, id));
        }
        let route = self.messages.entry(id).or_insert_with(|| MessageRoute {
            calls: SmallVec::new(),
            broadcast: false,
            reported: SmallVec::new(),
        });
        let same_list_elsewhere = route
            .calls
            .iter()
            .any(|&(other, seen)| other != gateway && seen == fingerprint);
        if route.calls.len() < MAX_CALLS_PER_MESSAGE {
            route.calls.push((gateway, fingerprint));
        }
        if same_list_elsewhere && !route.broadcast {
            route.broadcast = true;
            return self.learn(PushRoutingMode::Broadcast);
        }
        None
    }

    /// Closes a message's window: calls to two gateways with no list in common are a ring.
    fn closed(&mut self, route: &MessageRoute, now_ns: u64, alerts: &mut Vec<Alert>) {
        if route.split() && self.learn(PushRoutingMode::Ring).is_some() {
            self.announce(now_ns, alerts);
        }
    }

    fn learn(&mut self, mode: PushRoutingMode) -> Option<PushRoutingMode> {
        (self.mode != Some(mode)).then(|| {
            self.mode = Some(mode);
            mode
        })
    }

    /// Prints a `push_routing` line when the routing is learned, and again when it or the
    /// service changes.
    fn announce(&mut self, ts_ns: u64, alerts: &mut Vec<Alert>) {
        let Some(mode) = self.mode else {
            return;
        };
        let now = (mode, self.service.clone());
        if self.announced.as_ref() == Some(&now) {
            return;
        }
        let gateways = self.gateways_seen();
        let service = self.service.as_deref().unwrap_or("(unknown)").to_owned();
        alerts.push(Alert::new(
            ts_ns,
            AlertBody::PushRouting {
                diagnosis: crate::openim::diagnosis::push_routing(&service, mode),
                service,
                routing: mode,
                gateways,
            },
        ));
        self.announced = Some(now);
    }

    /// Returns the most gateways one message still remembered went to.
    fn gateways_seen(&self) -> usize {
        self.messages
            .values()
            .map(|route| {
                let mut gateways: SmallVec<[IpAddr; 8]> =
                    route.calls.iter().map(|(gateway, _)| *gateway).collect();
                gateways.sort();
                gateways.dedup();
                gateways.len()
            })
            .max()
            .unwrap_or(0)
    }

    /// Identifies a message by its ids; `None` when it carries none.
    fn message_key(&self, message: &MessageIds) -> Option<u64> {
        if message.client_msg_id.is_none()
            && message.server_msg_id.is_none()
            && message.seq.is_none()
        {
            return None;
        }
        Some(self.hasher.hash_one((
            message.client_msg_id.as_deref(),
            message.server_msg_id.as_deref(),
            message.seq,
        )))
    }

    /// Fingerprints a recipient list whatever its order: the sum of its users' hashes.
    fn fingerprint(&self, recipients: &[UserId]) -> u64 {
        recipients
            .iter()
            .fold(recipients.len() as u64, |sum, user| {
                sum.wrapping_add(self.hasher.hash_one(user.as_str()))
            })
    }
}

#[cfg(test)]
mod tests;
