//! Tracks where the proxy placed each user: user → the live WebSocket placements (gateway, `Host`,
//! platform), each ended when its connection closes or its upgrade is refused.

use std::{hash::BuildHasher, sync::Arc};

use compact_str::CompactString;
use hashbrown::{DefaultHashBuilder, HashMap, HashTable};
use smallvec::SmallVec;

use crate::{
    alert::PlacementInfo,
    budget,
    model::{ConnectionId, ConnectionKey, Gateway, Process, prefetch_bucket},
    table_memory::HugePageTables,
};

use super::RouteLimits;

/// Records one live WebSocket placement: the connection, the gateway, the platform, since when, by
/// which proxy.
#[derive(Clone, Debug)]
pub struct Placement {
    pub connection: ConnectionId,
    pub gateway: Gateway,
    pub platform: Option<i32>,
    pub since_ns: u64,
    pub proxy: Process,
    /// Cluster mode: the node that saw it, when not this one.
    pub node: Option<Arc<str>>,
}

/// Counts the placements made, evicted and replaced.
#[derive(Clone, Copy, Debug, Default)]
pub struct PlacementCounters {
    pub placements: u64,
    pub users_evicted: u64,
    pub placements_evicted: u64,
    pub connections_evicted: u64,
    /// Placements ended by a new one on their connection's socket address: their socket was
    /// gone, its close never seen (a record dropped, itself counted), and its memory reused.
    pub placements_replaced: u64,
}

/// Holds one user's live placements, oldest first. Nearly every user holds one: inline in the
/// bucket, so judging a recipient reads the bucket its lookup found instead of one more heap
/// line.
struct UserPlacements {
    user: CompactString,
    placements: SmallVec<[Placement; 1]>,
}

/// Holds every user's live placements, within the limits' bounds on users and connections.
pub struct Placements {
    max_users: usize,
    max_per_user: usize,
    max_connections: usize,
    /// By user, hashed as `&str` by `hasher`. A table rather than a map so that a recipient's
    /// bucket can be found, and prefetched, before it is read (`prefetch`); on huge pages once
    /// it is large.
    by_user: HashTable<UserPlacements, HugePageTables>,
    hasher: DefaultHashBuilder,
    /// The connection that holds each placement, so that its close ends it.
    users_by_connection: HashMap<ConnectionId, CompactString>,
    /// Placements made before this observer started (cluster mode), by their connection's two
    /// ends: the kernel's socket address was not seen, so their close is matched by these.
    adopted: HashMap<ConnectionKey, ConnectionId>,
    /// Adopted placements are numbered from 1: kernel socket addresses are kernel pointers, in
    /// the top half of the address space, so the two never meet.
    next_adopted: ConnectionId,
    counters: PlacementCounters,
}

impl Placements {
    /// Builds an empty table with the limits' bounds on users, placements and connections.
    pub fn new(limits: &RouteLimits) -> Self {
        Self {
            max_users: limits.max_users,
            max_per_user: limits.max_placements_per_user,
            max_connections: limits.max_tracked_connections,
            by_user: HashTable::new_in(HugePageTables),
            hasher: DefaultHashBuilder::default(),
            users_by_connection: HashMap::new(),
            adopted: HashMap::new(),
            next_adopted: 1,
            counters: PlacementCounters::default(),
        }
    }

    /// Returns what the table counted.
    pub fn counters(&self) -> PlacementCounters {
        self.counters
    }

    /// Counts the users with a live placement.
    pub fn users(&self) -> usize {
        self.by_user.len()
    }

    /// Returns the live placements of `user`, oldest first.
    pub fn of(&self, user: &str) -> Option<&[Placement]> {
        self.by_user
            .find(self.hasher.hash_one(user), |entry| entry.user == user)
            .map(|entry| entry.placements.as_slice())
    }

    /// Starts loading the bucket `of(user)` will read.
    pub fn prefetch(&self, user: &str) {
        prefetch_bucket(&self.by_user, self.hasher.hash_one(user));
    }

    fn entry_mut(&mut self, user: &str) -> Option<&mut UserPlacements> {
        self.by_user
            .find_mut(self.hasher.hash_one(user), |entry| entry.user == user)
    }

    fn remove_user(&mut self, user: &str) -> Option<SmallVec<[Placement; 1]>> {
        let entry = self
            .by_user
            .find_entry(self.hasher.hash_one(user), |entry| entry.user == user)
            .ok()?;
        Some(entry.remove().0.placements)
    }

    /// Records that the proxy asked a gateway to take `user` on `connection`.
    pub fn place(
        &mut self,
        connection: ConnectionId,
        ts_ns: u64,
        user: String,
        platform: Option<i32>,
        gateway: Gateway,
        proxy: Process,
    ) {
        // A full table makes room by dropping the users placed longest ago, rather than
        // refusing the newest ones (the likeliest to be pushed to).
        let user = CompactString::from(user);
        // Left in place, the old placement outlived its socket: its user stayed tracked (and
        // judged by it) for good, since the close of this one ends only the new placement.
        if self.end(connection).is_some() {
            self.counters.placements_replaced += 1;
        }
        if self.by_user.len() >= self.max_users && self.of(&user).is_none() {
            self.counters.users_evicted += self.evict(budget::eviction_batch(self.max_users));
        }
        if self.users_by_connection.len() >= self.max_connections
            && !self.users_by_connection.contains_key(&connection)
        {
            self.counters.connections_evicted +=
                self.evict(budget::eviction_batch(self.max_connections));
        }
        self.users_by_connection.insert(connection, user.clone());
        self.counters.placements += 1;
        let hasher = &self.hasher;
        let placements = &mut self
            .by_user
            .entry(
                hasher.hash_one(user.as_str()),
                |entry| entry.user == user,
                |entry| hasher.hash_one(entry.user.as_str()),
            )
            .or_insert_with(|| UserPlacements {
                user,
                placements: SmallVec::new(),
            })
            .into_mut()
            .placements;
        if placements.len() >= self.max_per_user {
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
            node: None,
        });
    }

    /// Takes over a placement made before this observer started, still established; its close
    /// is matched by `key`.
    pub fn adopt(
        &mut self,
        key: ConnectionKey,
        since_ns: u64,
        user: String,
        platform: Option<i32>,
        gateway: Gateway,
        proxy: Process,
    ) {
        let key = key.canonical();
        if self.adopted.contains_key(&key) {
            return;
        }
        let connection = self.next_adopted;
        self.next_adopted += 1;
        self.place(connection, since_ns, user, platform, gateway, proxy);
        if self.users_by_connection.contains_key(&connection) {
            self.adopted.insert(key, connection);
        }
    }

    /// Says whether `connection` still holds a placement when a new one comes on it: its socket is
    /// gone, its close unseen, and its address reused. Counted in `placements_replaced`; the
    /// caller ends it as a close would (`place` does so otherwise).
    pub fn reused(&mut self, connection: ConnectionId) -> bool {
        let reused = self.users_by_connection.contains_key(&connection);
        self.counters.placements_replaced += u64::from(reused);
        reused
    }

    /// Ends the placement on `connection`, if any: refused, or closed. Returns its user.
    pub fn end(&mut self, connection: ConnectionId) -> Option<String> {
        let user = self.users_by_connection.remove(&connection)?;
        if let Some(entry) = self.entry_mut(&user) {
            entry
                .placements
                .retain(|placement| placement.connection != connection);
            if entry.placements.is_empty() {
                self.remove_user(&user);
            }
        }
        Some(user.into_string())
    }

    /// Ends an adopted placement whose connection closed. Returns its user.
    pub fn end_adopted(&mut self, key: ConnectionKey) -> Option<String> {
        let connection = self.adopted.remove(&key)?;
        self.end(connection)
    }

    /// Returns the connections holding placements.
    pub fn connections(&self) -> impl Iterator<Item = ConnectionId> + '_ {
        self.users_by_connection.keys().copied()
    }

    /// Says whether `connection` numbers a placement adopted in cluster mode (not a kernel socket).
    pub fn is_adopted(&self, connection: ConnectionId) -> bool {
        connection < self.next_adopted
    }

    /// Drops the `count` users whose newest placement is oldest, with their placements;
    /// returns how many went.
    pub fn evict(&mut self, count: usize) -> u64 {
        let entries = self
            .by_user
            .iter()
            .map(|entry| (&entry.user, &entry.placements));
        let users = budget::least_useful(entries, count, |placements| {
            placements.iter().map(|placement| placement.since_ns).max()
        });
        let mut evicted = 0;
        for user in users {
            let Some(placements) = self.remove_user(&user) else {
                continue;
            };
            for placement in placements {
                self.users_by_connection.remove(&placement.connection);
                if placement.connection < self.next_adopted {
                    self.adopted
                        .retain(|_, connection| *connection != placement.connection);
                }
            }
            evicted += 1;
        }
        evicted
    }

    /// Says whether any placement adopted in cluster mode is still held.
    pub fn has_adopted(&self) -> bool {
        !self.adopted.is_empty()
    }
}

/// Summarizes a user's placements as an alert prints them: one entry per gateway, its platforms
/// merged. `local_node` names this node in cluster mode.
pub fn summarize(placements: &[Placement], local_node: Option<&str>) -> Vec<PlacementInfo> {
    let mut summary: Vec<PlacementInfo> = Vec::with_capacity(placements.len());
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
            since_ns: placement.since_ns,
            proxy: placement.proxy.clone().into(),
            node: placement.node.as_deref().or(local_node).map(str::to_owned),
        });
    }
    summary
}

#[cfg(test)]
mod tests;
