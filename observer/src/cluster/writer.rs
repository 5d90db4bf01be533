//! The writer task of cluster mode: sends queued facts as pipelined batches while Redis is up,
//! and keeps this node's own placements and ring members fresh (TTL refreshes, and a rewrite of
//! everything it owns when Redis comes back, possibly restarted empty).

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    sync::{Arc, atomic::Ordering},
    time::Instant,
};

use tokio::sync::{mpsc, watch};

use super::{
    clock::{millis, unix_now_ms},
    connection::{REQUEST_TIMEOUT, RedisConnection},
    fact::{Fact, MAX_BATCH, MAX_OWN_PLACEMENTS, MAX_OWN_RING_MEMBERS, RING_MEMBER_REWRITE},
    health::StoreHealth,
    keys::{self, ConnectionKey, Keys, RingMember, RingSide, SharedPlacement, placement_field},
};

/// Sends queued facts while Redis is up, and keeps this node's own facts fresh.
pub(super) struct Writer {
    keys: Keys,
    node: String,
    connection: RedisConnection,
    health: Arc<StoreHealth>,
    own_placements: HashMap<ConnectionKey, SharedPlacement>,
    /// Last seen and last written, per member.
    own_ring_members: BTreeMap<(RingSide, String), (IpAddr, u64, Option<Instant>)>,
}

impl Writer {
    pub(super) fn new(
        keys: Keys,
        node: String,
        connection: RedisConnection,
        health: Arc<StoreHealth>,
    ) -> Self {
        Self {
            keys,
            node,
            connection,
            health,
            own_placements: HashMap::new(),
            own_ring_members: BTreeMap::new(),
        }
    }

    pub(super) async fn run(
        mut self,
        mut queue: mpsc::Receiver<Fact>,
        mut up: watch::Receiver<bool>,
    ) {
        let mut refresh = tokio::time::interval(keys::PLACEMENT_REFRESH);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut batch = Vec::with_capacity(MAX_BATCH);
        loop {
            // Facts wait in the queue (bounded) while Redis is down; when it comes back it may
            // have restarted empty, so everything this node owns is written again first.
            if !*up.borrow_and_update() {
                loop {
                    if up.changed().await.is_err() {
                        return;
                    }
                    if *up.borrow_and_update() {
                        break;
                    }
                }
                self.rewrite_own().await;
            }
            tokio::select! {
                received = queue.recv_many(&mut batch, MAX_BATCH) => {
                    if received == 0 {
                        return;
                    }
                    self.write(&mut batch).await;
                    // Queued until written (or lost): a stopping observer waits for them.
                    self.health.queued.fetch_sub(received as u64, Ordering::Relaxed);
                }
                _ = refresh.tick() => self.rewrite_own().await,
                _ = up.changed() => {}
            }
        }
    }

    /// Writes one batch in one pipeline; a failed batch is counted as lost (own placements
    /// come back with the next rewrite).
    async fn write(&mut self, batch: &mut Vec<Fact>) {
        let now_ms = unix_now_ms();
        let mut pipe = redis::pipe();
        let mut placed_any = false;
        let mut node_index_touched = false;
        let mut ring_touched = [false; 2];
        let written = batch.len() as u64;
        for fact in batch.drain(..) {
            match fact {
                Fact::Placed(placement) => {
                    pipe.lpush(
                        self.keys.ring_placements(),
                        format!("{} {}", placement.user, placement.gateway_ip),
                    )
                    .ignore();
                    placed_any = true;
                    node_index_touched = true;
                    self.write_placement(&mut pipe, &placement, now_ms);
                    self.remember(placement);
                }
                Fact::Adopted(placement) => {
                    node_index_touched = true;
                    self.write_placement(&mut pipe, &placement, now_ms);
                    self.remember(placement);
                }
                Fact::Unplaced { user, connection } => {
                    self.own_placements.remove(&connection);
                    pipe.hdel(
                        self.keys.user_placements(&user),
                        placement_field(&self.node, &connection),
                    )
                    .ignore()
                    .hdel(
                        self.keys.node_connections(&self.node),
                        connection.to_string(),
                    )
                    .ignore();
                }
                Fact::RingMember { side, member, ip } => {
                    if self.ring_member_due(side, &member, ip, now_ms) {
                        ring_touched[usize::from(side == RingSide::Push)] = true;
                        self.write_ring_member(&mut pipe, side, &member, ip, now_ms);
                    }
                }
                Fact::PushOutcome(outcome) => {
                    let key = self.keys.user_pushes(&outcome.user);
                    let value = serde_json::to_string(&outcome).unwrap_or_default();
                    pipe.lpush(&key, value)
                        .ignore()
                        .ltrim(&key, 0, keys::MAX_PUSH_OUTCOMES as isize - 1)
                        .ignore()
                        .pexpire(&key, millis(keys::PUSH_OUTCOME_TTL) as i64)
                        .ignore();
                }
            }
        }
        if placed_any {
            let key = self.keys.ring_placements();
            pipe.ltrim(&key, 0, keys::MAX_RING_PLACEMENTS as isize - 1)
                .ignore()
                .pexpire(&key, millis(keys::RING_TTL) as i64)
                .ignore();
        }
        if node_index_touched {
            pipe.pexpire(
                self.keys.node_connections(&self.node),
                millis(keys::PLACEMENT_TTL) as i64,
            )
            .ignore();
        }
        for (side, touched) in [RingSide::Proxy, RingSide::Push]
            .into_iter()
            .zip(ring_touched)
        {
            if touched {
                pipe.pexpire(self.keys.ring_members(side), millis(keys::RING_TTL) as i64)
                    .ignore();
            }
        }
        if self.send(&pipe).await {
            self.health
                .facts_written
                .fetch_add(written, Ordering::Relaxed);
        } else {
            self.health.facts_lost.fetch_add(written, Ordering::Relaxed);
        }
    }

    fn write_placement(
        &self,
        pipe: &mut redis::Pipeline,
        placement: &SharedPlacement,
        now_ms: u64,
    ) {
        let ttl = millis(keys::PLACEMENT_TTL);
        let key = self.keys.user_placements(&placement.user);
        pipe.hset(&key, placement.field(), placement.value(now_ms + ttl))
            .ignore()
            .pexpire(&key, ttl as i64)
            .ignore()
            .hset(
                self.keys.node_connections(&self.node),
                placement.connection.to_string(),
                &placement.user,
            )
            .ignore();
    }

    fn remember(&mut self, placement: SharedPlacement) {
        let full = self.own_placements.len() >= MAX_OWN_PLACEMENTS;
        if full && !self.own_placements.contains_key(&placement.connection) {
            self.health
                .placements_not_refreshed
                .fetch_add(1, Ordering::Relaxed);
        } else {
            self.own_placements.insert(placement.connection, placement);
        }
    }

    /// Whether a sighting of a ring member must be written: new, moved, or not written for
    /// [`RING_MEMBER_REWRITE`].
    fn ring_member_due(&mut self, side: RingSide, member: &str, ip: IpAddr, now_ms: u64) -> bool {
        let key = (side, member.to_owned());
        if let Some((known_ip, seen_ms, written)) = self.own_ring_members.get_mut(&key) {
            let due =
                *known_ip != ip || written.is_none_or(|at| at.elapsed() >= RING_MEMBER_REWRITE);
            *known_ip = ip;
            *seen_ms = now_ms;
            if due {
                *written = Some(Instant::now());
            }
            return due;
        }
        if self.own_ring_members.len() < MAX_OWN_RING_MEMBERS {
            self.own_ring_members
                .insert(key, (ip, now_ms, Some(Instant::now())));
        }
        true
    }

    fn write_ring_member(
        &self,
        pipe: &mut redis::Pipeline,
        side: RingSide,
        member: &str,
        ip: IpAddr,
        seen_ms: u64,
    ) {
        let value = RingMember {
            ip,
            node: self.node.clone(),
            seen_ms,
        };
        pipe.hset(
            self.keys.ring_members(side),
            member,
            serde_json::to_string(&value).unwrap_or_default(),
        )
        .ignore();
    }

    /// Writes again everything this node owns, refreshing TTLs (and restoring it after Redis
    /// lost it), in pipelines of [`MAX_BATCH`] placements.
    async fn rewrite_own(&mut self) {
        let now_ms = unix_now_ms();
        let placements: Vec<SharedPlacement> = self.own_placements.values().cloned().collect();
        for chunk in placements.chunks(MAX_BATCH) {
            let mut pipe = redis::pipe();
            for placement in chunk {
                self.write_placement(&mut pipe, placement, now_ms);
            }
            pipe.pexpire(
                self.keys.node_connections(&self.node),
                millis(keys::PLACEMENT_TTL) as i64,
            )
            .ignore();
            if !self.send(&pipe).await {
                return;
            }
        }
        let members: Vec<((RingSide, String), (IpAddr, u64))> = self
            .own_ring_members
            .iter()
            .map(|(key, (ip, seen_ms, _))| (key.clone(), (*ip, *seen_ms)))
            .collect();
        if !members.is_empty() {
            let mut pipe = redis::pipe();
            for ((side, member), (ip, seen_ms)) in &members {
                self.write_ring_member(&mut pipe, *side, member, *ip, *seen_ms);
            }
            for side in [RingSide::Proxy, RingSide::Push] {
                pipe.pexpire(self.keys.ring_members(side), millis(keys::RING_TTL) as i64)
                    .ignore();
            }
            self.send(&pipe).await;
        }
    }

    async fn send(&mut self, pipe: &redis::Pipeline) -> bool {
        self.health.round_trips.fetch_add(1, Ordering::Relaxed);
        let sent = tokio::time::timeout(
            REQUEST_TIMEOUT,
            pipe.query_async::<()>(&mut self.connection),
        )
        .await;
        match sent {
            Ok(Ok(())) => true,
            Ok(Err(error)) => {
                tracing::debug!(%error, "shared state: a batch failed");
                false
            }
            Err(_) => {
                tracing::debug!("shared state: a batch timed out");
                false
            }
        }
    }
}
