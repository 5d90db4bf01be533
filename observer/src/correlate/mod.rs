//! Turns decoded traffic into routing facts and checks the two routing paths against each other.
//!
//! `Engine` is the whole pipeline after capture: events in (live or replayed, in time order),
//! alerts out. It needs no privileges, so replays and tests drive it directly. Events go
//! through one decoder per connection (`connections`) into `Observation`s, which `detectors`
//! dispatches to one detector per alert kind.

pub mod blindness;
mod churn;
mod connection_counters;
pub mod connections;
mod detectors;
mod fact_observations;
mod fold_key;
mod message_routes;
mod mid_stream;
mod observation;
mod pending_call;
mod placements;
mod push_calls;
mod ring_verdicts;
mod rings;
mod shared;
mod shared_texts;
mod upgrade_on_grpc;

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use crate::{
    alert::Alert,
    budget::{MemoryBudget, MemoryCounters},
    decode::Limits,
    model::{ConnectionId, ConnectionKey, Event, EventKind, NANOS_PER_SEC, TcpState},
};

use connections::{ConnectionCounters, ConnectionDecoders};
use detectors::Detectors;
pub use detectors::{RouteCounters, RouteLimits};
use fold_key::{FoldKey, MismatchKey};
pub use observation::Observation;
pub use shared::{
    JoinCounters, PlacementLookup, RemotePlacement, RingSide, SharedFact, SharedRingEvidence,
};

/// Holds the engine's limits and settings.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub routes: RouteLimits,
    pub decode: Limits,
    /// Connections decoded at once; a full table evicts the least useful.
    pub max_connections: usize,
    /// What every table and buffer draws on together.
    pub memory: MemoryBudget,
    /// Cluster mode: this node's name. The engine then shares facts (`take_shared`), asks for
    /// other nodes' placements (`PlacementLookup`) and names the nodes in its alerts.
    pub node: Option<String>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            routes: RouteLimits::default(),
            decode: Limits::default(),
            max_connections: 65_536,
            memory: MemoryBudget::default(),
            node: None,
        }
    }
}

/// Counts what the engine saw, tracked and held.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct EngineCounters {
    pub events: u64,
    pub connections: ConnectionCounters,
    pub routes: RouteCounters,
    pub users_tracked: usize,
    pub memory: MemoryCounters,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<JoinCounters>,
}

/// Turns capture events into alerts: the connection decoders and the detectors behind them.
pub struct Engine {
    decoders: ConnectionDecoders,
    /// Connections adopted at start, by their two ends: placements recovered in cluster mode
    /// are matched by these when reconciliation finds the connection gone. Only what was
    /// established at start, so bounded by the kernel's connection table.
    adopted_keys: HashMap<ConnectionId, ConnectionKey>,
    detectors: Detectors,
    observations: Vec<Observation>,
    events: u64,
    latest_ts_ns: u64,
    last_tick_ns: u64,
    memory_budget: MemoryBudget,
    shed_users: u64,
}

impl Engine {
    /// Builds an engine with no connection, user or call tracked yet.
    pub fn new(config: EngineConfig) -> Self {
        let mut detectors = Detectors::new(config.routes);
        if let Some(node) = &config.node {
            detectors.join_cluster(node);
        }
        Self {
            decoders: ConnectionDecoders::new(config.decode, config.max_connections),
            adopted_keys: HashMap::new(),
            detectors,
            observations: Vec::new(),
            events: 0,
            latest_ts_ns: 0,
            last_tick_ns: 0,
            memory_budget: config.memory,
            shed_users: 0,
        }
    }

    /// Feeds one event; alerts it raises are appended to `alerts`. Time advances with the
    /// events' timestamps, so a replay ticks as the live run did.
    pub fn on_event(&mut self, event: &Event, alerts: &mut Vec<Alert>) {
        let first_new = alerts.len();
        self.events += 1;
        self.latest_ts_ns = self.latest_ts_ns.max(event.ts_ns);
        if matches!(
            event.kind,
            EventKind::Close
                | EventKind::TcpState {
                    new: TcpState::Close,
                    ..
                }
        ) {
            self.adopted_keys.remove(&event.connection);
            self.detectors.closed_by_key(ConnectionKey::of(event));
        }
        if let EventKind::TcpState {
            new: TcpState::Established,
            ..
        } = event.kind
            && observer_records::is_adopted_connection(event.connection)
        {
            self.adopted_keys
                .insert(event.connection, ConnectionKey::of(event));
        }
        self.decoders.on_event(event, &mut self.observations);
        for observation in self.observations.drain(..) {
            self.detectors.observe(observation, alerts);
        }
        self.keep_to_budget();
        if self.latest_ts_ns.saturating_sub(self.last_tick_ns) >= NANOS_PER_SEC {
            self.detectors.tick(self.latest_ts_ns, alerts);
            self.last_tick_ns = self.latest_ts_ns;
        }
        self.name_node(&mut alerts[first_new..]);
    }

    /// Lets time pass without events (the live daemon calls it every second).
    pub fn tick(&mut self, now_ns: u64, alerts: &mut Vec<Alert>) {
        let first_new = alerts.len();
        self.last_tick_ns = now_ns;
        self.detectors.tick(now_ns, alerts);
        self.name_node(&mut alerts[first_new..]);
    }

    /// Ends the state of every connection not in `alive` (the connections the kernel still
    /// watches), whether or not its close was seen: records dropped in a full ring lose
    /// closes, never the kernel's own bookkeeping. The live daemon calls it every
    /// `RECONCILE_INTERVAL`.
    pub fn reconcile(
        &mut self,
        alive: &HashSet<ConnectionId>,
        now_ns: u64,
        alerts: &mut Vec<Alert>,
    ) {
        let first_new = alerts.len();
        self.decoders
            .reconcile(alive, now_ns, &mut self.observations);
        for observation in self.observations.drain(..) {
            self.detectors.observe(observation, alerts);
        }
        self.detectors.reconcile(alive, now_ns, alerts);
        self.adopted_keys.retain(|connection, key| {
            let open = alive.contains(connection);
            if !open {
                self.detectors.closed_by_key(*key);
            }
            open
        });
        self.name_node(&mut alerts[first_new..]);
    }

    /// Judges pending calls at the end of input and emits what windows were holding back.
    pub fn finish(&mut self, alerts: &mut Vec<Alert>) {
        let first_new = alerts.len();
        self.detectors.finish(self.latest_ts_ns, alerts);
        self.name_node(&mut alerts[first_new..]);
    }

    /// Takes, in cluster mode, the facts to share and the lookups to make since the last call.
    pub fn take_shared(&mut self, facts: &mut Vec<SharedFact>, lookups: &mut Vec<PlacementLookup>) {
        if let Some(cluster) = &mut self.detectors.cluster {
            facts.append(&mut cluster.facts);
            lookups.append(&mut cluster.lookups);
        }
    }

    /// Takes, in cluster mode, the answer to lookup `id`: the placements other nodes saw for its
    /// users (users without any left out); completes the judgment that asked.
    pub fn joined(
        &mut self,
        id: u64,
        found: Vec<(String, Arc<[RemotePlacement]>)>,
        alerts: &mut Vec<Alert>,
    ) {
        let first_new = alerts.len();
        self.detectors.joined(id, found, alerts);
        self.name_node(&mut alerts[first_new..]);
    }

    /// Takes over, in cluster mode at start, the placements this node made before the observer
    /// restarted whose connections are still established, as `(user, placement)`. Pushes for their
    /// users are judged again, and a close of the connection (matched by its two ends) ends them.
    pub fn adopt(&mut self, placements: Vec<(String, RemotePlacement)>) {
        self.detectors.adopt(placements);
    }

    /// Merges, in cluster mode, the cluster-wide ring members and recent placements, so the ring
    /// verdict rests on what every node saw.
    pub fn merge_ring_evidence(&mut self, evidence: &SharedRingEvidence) {
        // The engine's own clock: event time in a replay, wall time live.
        let now_ns = self.latest_ts_ns.max(self.last_tick_ns);
        self.detectors.merge_ring_evidence(evidence, now_ns);
    }

    /// Takes what the decoders lost since the last call (for `blindness::CaptureHealth`).
    pub fn take_blind_spots(&mut self) -> blindness::BlindSpots {
        self.decoders.take_blind_spots()
    }

    /// Estimates the bytes held, by table, and what was shed.
    pub fn memory(&self) -> MemoryCounters {
        let mut memory = MemoryCounters {
            budget_bytes: self.memory_budget.bytes,
            shed_users: self.shed_users,
            ..MemoryCounters::default()
        };
        self.decoders.memory(&mut memory);
        self.detectors.memory(&mut memory);
        memory
    }

    /// Sheds, over budget, the least useful state until an eighth of the budget is free again
    /// (so that shedding is rare, not one entry per event): decoder buffers first (those of
    /// connections that never decoded anything before the others), users placed longest ago
    /// last.
    fn keep_to_budget(&mut self) {
        let accounted = self.memory().accounted_bytes();
        let budget = self.memory_budget.bytes;
        if accounted <= budget {
            return;
        }
        let mut excess = accounted - (budget - budget / 8);
        excess = excess.saturating_sub(self.decoders.shed(excess));
        if excess > 0 {
            self.shed_users += self.detectors.shed_users(excess);
        }
    }

    /// Names, in cluster mode, the node whose observer raised each alert.
    fn name_node(&self, alerts: &mut [Alert]) {
        if let Some(cluster) = &self.detectors.cluster {
            for alert in alerts {
                alert.node = Some(cluster.node.to_string());
            }
        }
    }

    /// Returns what the engine counted so far.
    pub fn counters(&self) -> EngineCounters {
        EngineCounters {
            events: self.events,
            connections: self.decoders.counters(),
            routes: self.detectors.counters(),
            users_tracked: self.detectors.tracked_users(),
            memory: self.memory(),
            cluster: self
                .detectors
                .cluster
                .as_ref()
                .map(|cluster| cluster.counters),
        }
    }
}

#[cfg(test)]
mod tests;
