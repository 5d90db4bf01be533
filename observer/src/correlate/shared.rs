//! Holds cluster mode's side of the engine: what this node's observer tells the others, and the
//! joins it completes with what they saw.
//!
//! The engine stays synchronous: it appends facts (placements, ring members) to a buffer the
//! daemon forwards to Redis, and when a push call names recipients this node holds no placement
//! for, it parks the judgment and asks for their placements (`PlacementLookup`).
//! The daemon answers with `Engine::joined`, which completes the judgment with the placements
//! other nodes saw. Nothing here runs without `--redis-url`.

use std::{collections::HashMap, net::IpAddr, sync::Arc};

use crate::model::{ConnectionId, ConnectionKey, Gateway, NANOS_PER_SEC, Process, UserResult};

use super::pending_call::PendingCall;

/// Bounds the judgments parked for a lookup; more are judged with local placements only (counted).
const MAX_AWAITING_JOINS: usize = 16_384;
/// Bounds a parked judgment's wait: one whose lookup never came back is dropped after this long
/// (counted).
const JOIN_TIMEOUT_NS: u64 = 30 * NANOS_PER_SEC;
/// Spaces the telling of a ring member: one seen again is told again at most this often (its shared
/// entry expires unless refreshed; telling it on every call would queue a fact per push).
const MEMBER_REFRESH_NS: u64 = 60 * NANOS_PER_SEC;
/// Bounds the ring members remembered for that refresh (gateways × two spellings).
const MAX_MEMBERS: usize = 4_096;

/// Says which side of OpenIM spelled a ring member: the proxy (`Host`) or push (`:authority`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RingSide {
    Proxy,
    Push,
}

impl RingSide {
    /// Returns the side's name: `proxy` or `push`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Proxy => "proxy",
            Self::Push => "push",
        }
    }
}

/// Says what this node saw that the other nodes need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SharedFact {
    /// The proxy on this node asked a gateway to take `user`.
    Placed {
        user: String,
        connection: ConnectionKey,
        gateway: Gateway,
        platform: Option<i32>,
        since_ns: u64,
        proxy: Process,
    },
    /// That placement ended (refused upgrade, or the connection closed).
    Unplaced {
        user: String,
        connection: ConnectionKey,
    },
    RingMember {
        side: RingSide,
        member: String,
        ip: IpAddr,
    },
}

/// Describes a placement another node saw (or this node, before its observer restarted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemotePlacement {
    /// Shared: every lookup answered from the same cached read holds the same copy.
    pub node: Arc<str>,
    pub connection: ConnectionKey,
    pub gateway: Gateway,
    pub platform: Option<i32>,
    pub since_ns: u64,
    pub proxy: Process,
}

/// Lists the recipients of a judged call that this node holds no placement for: the daemon looks
/// them up and answers with `Engine::joined(id, …)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacementLookup {
    pub id: u64,
    pub users: Vec<String>,
}

/// Holds the cluster's shared ring evidence, merged into this node's learned rings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SharedRingEvidence {
    /// `(member, gateway IP)` per side.
    pub proxy: Vec<(String, IpAddr)>,
    pub push: Vec<(String, IpAddr)>,
    /// `(user, gateway IP)` placements, newest first.
    pub placements: Vec<(String, IpAddr)>,
}

/// Counts the lookups, the joins completed, dropped and expired, and the placements adopted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct JoinCounters {
    pub lookups: u64,
    pub joins_completed: u64,
    /// Judged with local placements only: too many judgments were waiting.
    pub joins_dropped: u64,
    /// Their lookup never came back.
    pub joins_expired: u64,
    pub placements_adopted: u64,
}

/// Holds a judgment waiting for other nodes' placements.
pub struct AwaitingJoin {
    pub call: PendingCall,
    pub results: Option<Vec<UserResult>>,
    pub ts_ns: u64,
}

/// Holds this node's side of the cluster: its name, the facts and lookups to send, and the
/// judgments waiting.
pub struct ClusterSide {
    pub node: Arc<str>,
    pub facts: Vec<SharedFact>,
    pub lookups: Vec<PlacementLookup>,
    awaiting: HashMap<u64, AwaitingJoin>,
    next_lookup: u64,
    /// The two ends of each live placement's connection, for its `Unplaced` fact.
    pub keys_by_connection: HashMap<ConnectionId, ConnectionKey>,
    /// When each ring member was last told.
    members_told: HashMap<(RingSide, String), (IpAddr, u64)>,
    pub counters: JoinCounters,
}

impl ClusterSide {
    /// Builds the cluster side of node `node`, with nothing to send and no judgment waiting.
    pub fn new(node: &str) -> Self {
        Self {
            node: node.into(),
            facts: Vec::new(),
            lookups: Vec::new(),
            awaiting: HashMap::new(),
            next_lookup: 1,
            keys_by_connection: HashMap::new(),
            members_told: HashMap::new(),
            counters: JoinCounters::default(),
        }
    }

    /// Parks the judgment of `users` (no local placement) and asks for their placements;
    /// false when too many judgments wait already.
    pub fn park(&mut self, users: Vec<String>, join: AwaitingJoin) -> bool {
        if self.awaiting.len() >= MAX_AWAITING_JOINS {
            self.counters.joins_dropped += 1;
            return false;
        }
        let id = self.next_lookup;
        self.next_lookup += 1;
        self.counters.lookups += 1;
        self.awaiting.insert(id, join);
        self.lookups.push(PlacementLookup { id, users });
        true
    }

    /// Takes the judgment parked under lookup `id`, if it still waits.
    pub fn unpark(&mut self, id: u64) -> Option<AwaitingJoin> {
        let join = self.awaiting.remove(&id);
        if join.is_some() {
            self.counters.joins_completed += 1;
        }
        join
    }

    /// Drops judgments whose lookup never came back (the daemon answers every lookup, even
    /// with nothing: this only bounds a lost answer).
    pub fn expire(&mut self, now_ns: u64) {
        let before = self.awaiting.len();
        self.awaiting
            .retain(|_, join| now_ns.saturating_sub(join.ts_ns) < JOIN_TIMEOUT_NS);
        self.counters.joins_expired += (before - self.awaiting.len()) as u64;
    }

    /// Notes that a member was seen: told when new, moved, or not told for a while.
    pub fn member_seen(&mut self, side: RingSide, member: &str, ip: IpAddr, ts_ns: u64) {
        let key = (side, member.to_owned());
        let due = match self.members_told.get(&key) {
            Some((told_ip, told_ns)) => {
                *told_ip != ip || ts_ns.saturating_sub(*told_ns) >= MEMBER_REFRESH_NS
            }
            None => true,
        };
        if !due {
            return;
        }
        if self.members_told.len() < MAX_MEMBERS || self.members_told.contains_key(&key) {
            self.members_told.insert(key, (ip, ts_ns));
        }
        self.facts.push(SharedFact::RingMember {
            side,
            member: member.to_owned(),
            ip,
        });
    }
}
