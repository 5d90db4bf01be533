//! Runs the writer task of cluster mode: sends queued facts as pipelined batches while Redis is up,
//! and keeps this node's own placements and ring members fresh (TTL refreshes, and a rewrite of
//! everything it owns when Redis comes back, possibly restarted empty).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
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
    /// Users whose placement changes the change log has not been told yet.
    unannounced: BTreeSet<String>,
    /// This writer's start (Unix nanoseconds) and the change log entries it added.
    writer_id: u64,
    announced: u64,
}

/// Holds one entry of the placement change log (`keys::Keys::placement_changes`).
#[derive(serde::Serialize)]
struct ChangeEntry<'a> {
    node: &'a str,
    /// This writer's start time (Unix nanoseconds), with `entry` unique in the log.
    writer: u64,
    entry: u64,
    users: &'a BTreeSet<String>,
}

/// Holds what the facts of one batch share, written once each at the end of its pipeline.
#[derive(Default)]
struct Staged {
    /// `USER IP` per placement, oldest first.
    ring_placements: Vec<String>,
    /// Placement hashes written to.
    placement_keys: HashSet<String>,
    ring_touched: [bool; 2],
    /// Users placed or unplaced.
    changed_users: BTreeSet<String>,
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
            unannounced: BTreeSet::new(),
            writer_id: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_nanos() as u64),
            announced: 0,
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
        let mut comebacks_seen = 0;
        loop {
            // Facts wait in the queue (bounded) while Redis is down; when it comes back it may
            // have restarted empty or failed over without the last writes, so everything this
            // node owns is written again first. Counted, not only watched: Redis may have gone
            // and come back while a batch was in flight.
            if !*up.borrow_and_update() {
                loop {
                    if up.changed().await.is_err() {
                        return;
                    }
                    if *up.borrow_and_update() {
                        break;
                    }
                }
            }
            let comebacks = self.health.comebacks();
            if comebacks != comebacks_seen {
                comebacks_seen = comebacks;
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
    /// come back with the next rewrite). The users whose placements it changed are then told
    /// in the change log.
    async fn write(&mut self, batch: &mut Vec<Fact>) {
        let now_ms = unix_now_ms();
        let mut pipe = redis::pipe();
        let mut staged = Staged::default();
        let written = batch.len() as u64;
        for fact in batch.drain(..) {
            self.stage(fact, &mut pipe, &mut staged, now_ms);
        }
        self.finish(&mut pipe, &mut staged);
        if self.send(&pipe).await {
            self.health
                .facts_written
                .fetch_add(written, Ordering::Relaxed);
        } else {
            self.health.facts_lost.fetch_add(written, Ordering::Relaxed);
        }
        // Told even when the batch failed: part of it may have been applied.
        self.unannounced.append(&mut staged.changed_users);
        self.announce().await;
    }

    /// Adds one fact's commands to `pipe`; what several facts share goes to `staged`.
    fn stage(&mut self, fact: Fact, pipe: &mut redis::Pipeline, staged: &mut Staged, now_ms: u64) {
        match fact {
            Fact::Placed(placement) => {
                staged
                    .ring_placements
                    .push(format!("{} {}", placement.user, placement.gateway_ip));
                staged.changed_users.insert(placement.user.clone());
                self.write_placement(pipe, &placement, now_ms);
                staged
                    .placement_keys
                    .insert(self.keys.user_placements(&placement.user));
                self.remember(placement);
            }
            Fact::Adopted(placement) => {
                self.write_placement(pipe, &placement, now_ms);
                staged
                    .placement_keys
                    .insert(self.keys.user_placements(&placement.user));
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
                staged.changed_users.insert(user);
            }
            Fact::RingMember { side, member, ip } => {
                if self.ring_member_due(side, &member, ip, now_ms) {
                    staged.ring_touched[usize::from(side == RingSide::Push)] = true;
                    self.write_ring_member(pipe, side, &member, ip, now_ms);
                }
            }
        }
    }

    /// Adds what the batch's facts share, once per key: the ring placements in one `LPUSH`, and
    /// one `PEXPIRE` per placement hash, node index and ring.
    fn finish(&mut self, pipe: &mut redis::Pipeline, staged: &mut Staged) {
        if !staged.ring_placements.is_empty() {
            let key = self.keys.ring_placements();
            pipe.lpush(&key, &staged.ring_placements)
                .ignore()
                .ltrim(&key, 0, keys::MAX_RING_PLACEMENTS as isize - 1)
                .ignore()
                .pexpire(&key, millis(keys::RING_TTL) as i64)
                .ignore();
        }
        let placement_ttl = millis(keys::PLACEMENT_TTL) as i64;
        for key in &staged.placement_keys {
            pipe.pexpire(key, placement_ttl).ignore();
        }
        if !staged.placement_keys.is_empty() {
            pipe.pexpire(self.keys.node_connections(&self.node), placement_ttl)
                .ignore();
        }
        for (side, touched) in [RingSide::Proxy, RingSide::Push]
            .into_iter()
            .zip(staged.ring_touched)
        {
            if touched {
                pipe.pexpire(self.keys.ring_members(side), millis(keys::RING_TTL) as i64)
                    .ignore();
            }
        }
    }

    /// Tells the change log which users' placements changed, after their writes (in a Redis
    /// Cluster the two may live on different shards: a reader must not see the change before
    /// the placement), then counts the entry. Kept for the next batch when Redis does not take
    /// it.
    async fn announce(&mut self) {
        if self.unannounced.is_empty() {
            return;
        }
        let (log, count) = (
            self.keys.placement_changes(),
            self.keys.placement_changes_count(),
        );
        // Unique: what a reader remembers to find where it left off.
        let entry = serde_json::to_string(&ChangeEntry {
            node: &self.node,
            writer: self.writer_id,
            entry: self.announced,
            users: &self.unannounced,
        })
        .unwrap_or_default();
        let ttl = millis(keys::RING_TTL) as i64;
        let mut pipe = redis::pipe();
        pipe.lpush(&log, entry)
            .ignore()
            .ltrim(&log, 0, keys::PLACEMENT_CHANGES_LEN as isize - 1)
            .ignore()
            .incr(&count, 1)
            .ignore()
            .pexpire(&log, ttl)
            .ignore()
            .pexpire(&count, ttl)
            .ignore();
        self.announced += 1;
        if self.send(&pipe).await {
            self.unannounced.clear();
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

    /// Says whether a sighting of a ring member must be written: new, moved, or not written for
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
        self.announce().await;
        let placements: Vec<SharedPlacement> = self.own_placements.values().cloned().collect();
        for chunk in placements.chunks(MAX_BATCH) {
            let mut pipe = redis::pipe();
            let mut placement_keys = HashSet::new();
            for placement in chunk {
                self.write_placement(&mut pipe, placement, now_ms);
                placement_keys.insert(self.keys.user_placements(&placement.user));
            }
            for key in &placement_keys {
                pipe.pexpire(key, millis(keys::PLACEMENT_TTL) as i64)
                    .ignore();
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
