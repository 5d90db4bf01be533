//! The Redis client of cluster mode.
//!
//! Writes never block the engine: [`SharedState::record`] puts a fact on a bounded queue
//! (full: dropped and counted) and a writer task sends what is queued as pipelined batches.
//! The writer also keeps this node's own placements and ring members, so it refreshes their
//! TTLs itself and rewrites them all when Redis comes back (possibly restarted empty).
//!
//! Reads (placements of other nodes, ring evidence, dedup claims) are async with a deadline;
//! the caller decides what a failure means. A probe pings Redis every second while it is up
//! and backs off while it is not, which gives health and round-trip latency for `/metrics` and
//! the `capture_degraded` alert.

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use thiserror::Error;
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};

use super::{
    ClusterConfig, RedisUrl,
    keys::{self, ConnectionKey, Keys, PushOutcome, RingMember, RingSide, SharedPlacement},
};

/// Facts per pipeline: large enough to amortise a round trip, small enough that one slow
/// batch does not hold the queue long.
pub(super) const MAX_BATCH: usize = 512;
/// Deadline of every read, and of each probe and batch.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// While Redis is down the probe (which is also the reconnect attempt) backs off to this.
const MAX_PROBE_BACKOFF: Duration = Duration::from_secs(4);
/// Own placements remembered for refreshing (one per online connection of this node's
/// proxies); more are written once and left to expire, and counted.
pub(super) const MAX_OWN_PLACEMENTS: usize = 1 << 20;
/// Ring members remembered (gateways × two spellings; a cluster has at most hundreds).
pub(super) const MAX_OWN_RING_MEMBERS: usize = 4_096;
/// A ring member seen again is rewritten at most this often.
pub(super) const RING_MEMBER_REWRITE: Duration = Duration::from_secs(60);

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("Redis at {url}: {reason}")]
    Redis { url: String, reason: String },
    #[error("Redis at {url} did not answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
}

/// What this node saw that the other nodes need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fact {
    /// The proxy on this node placed a user (also feeds the shared ring evidence).
    Placed(SharedPlacement),
    /// A placement made before this observer started, still live: kept and refreshed again.
    Adopted(SharedPlacement),
    /// A placement's connection closed (or was found gone after a restart).
    Unplaced {
        user: String,
        connection: ConnectionKey,
    },
    /// One side dialled a gateway IP under this member string.
    RingMember {
        side: RingSide,
        member: String,
        ip: IpAddr,
    },
    PushOutcome(PushOutcome),
}

/// The shared ring evidence: every node's members per side and recent placements.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RingEvidence {
    pub proxy: BTreeMap<String, RingMember>,
    pub push: BTreeMap<String, RingMember>,
    /// `(user, gateway IP)`, newest first.
    pub placements: Vec<(String, IpAddr)>,
}

/// Health and totals of the store, shared with `/metrics` and the daemon.
#[derive(Debug, Default)]
pub struct StoreHealth {
    up: AtomicBool,
    /// Round trip of the last successful probe, in microseconds.
    round_trip_us: AtomicU64,
    probe_failures: AtomicU64,
    pub(super) round_trips: AtomicU64,
    pub(super) facts_written: AtomicU64,
    /// Turned away by a full queue.
    facts_dropped: AtomicU64,
    /// In a batch Redis did not take.
    pub(super) facts_lost: AtomicU64,
    pub(super) placements_not_refreshed: AtomicU64,
    /// Recorded and not yet written (or lost): still on the queue or in the batch in flight.
    pub(super) queued: AtomicU64,
    lookups_failed: AtomicU64,
    claims_failed: AtomicU64,
    mismatches_deduplicated: AtomicU64,
    divergences_deduplicated: AtomicU64,
}

/// What the engine's link to the store counts (`cluster::link`).
#[derive(Clone, Copy, Debug)]
pub enum LinkEvent {
    /// A placement lookup Redis did not answer: judged with local placements only.
    LookupFailed,
    /// A dedup claim Redis did not answer: the alert is printed anyway.
    ClaimFailed,
    /// Another node printed this `route_mismatch` (or its window's summary) first.
    MismatchDeduplicated,
    /// Another node printed this `ring_divergence` first.
    DivergenceDeduplicated,
}

/// A snapshot of [`StoreHealth`], e.g. for the `observer_stopped` line.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct StoreCounters {
    pub up: bool,
    pub round_trip_seconds: f64,
    pub probe_failures: u64,
    pub round_trips: u64,
    pub facts_written: u64,
    pub facts_dropped: u64,
    pub facts_lost: u64,
    pub placements_not_refreshed: u64,
    pub queued: u64,
    pub lookups_failed: u64,
    pub claims_failed: u64,
    pub mismatches_deduplicated: u64,
    pub divergences_deduplicated: u64,
}

impl StoreHealth {
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Facts recorded and not yet written (or lost).
    pub fn unwritten(&self) -> u64 {
        self.queued.load(Ordering::Relaxed)
    }

    pub(crate) fn count(&self, event: LinkEvent) {
        let counter = match event {
            LinkEvent::LookupFailed => &self.lookups_failed,
            LinkEvent::ClaimFailed => &self.claims_failed,
            LinkEvent::MismatchDeduplicated => &self.mismatches_deduplicated,
            LinkEvent::DivergenceDeduplicated => &self.divergences_deduplicated,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn counters(&self) -> StoreCounters {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        StoreCounters {
            up: self.is_up(),
            round_trip_seconds: load(&self.round_trip_us) as f64 / 1e6,
            probe_failures: load(&self.probe_failures),
            round_trips: load(&self.round_trips),
            facts_written: load(&self.facts_written),
            facts_dropped: load(&self.facts_dropped),
            facts_lost: load(&self.facts_lost),
            placements_not_refreshed: load(&self.placements_not_refreshed),
            queued: load(&self.queued),
            lookups_failed: load(&self.lookups_failed),
            claims_failed: load(&self.claims_failed),
            mismatches_deduplicated: load(&self.mismatches_deduplicated),
            divergences_deduplicated: load(&self.divergences_deduplicated),
        }
    }
}

/// The store's series for `/metrics` (`openim_observer_redis_*`), read at each scrape.
#[derive(Debug)]
pub struct StoreMetrics(pub Arc<StoreHealth>);

impl Collector for StoreMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counters = self.0.counters();
        let gauges: [(&str, &str, f64); 3] = [
            (
                "redis_up",
                "1 while the shared-state Redis answers the probe",
                f64::from(u8::from(counters.up)),
            ),
            (
                "redis_round_trip_seconds",
                "Round trip of the last Redis probe (PING)",
                counters.round_trip_seconds,
            ),
            (
                "redis_queue_depth",
                "Facts waiting for Redis (queued, or in the batch being written)",
                counters.queued as f64,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        let totals: [(&str, &str, u64); 10] = [
            (
                "redis_round_trips",
                "Round trips to Redis (batches, reads, claims, probes)",
                counters.round_trips,
            ),
            (
                "redis_probe_failures",
                "Redis probes that failed or timed out",
                counters.probe_failures,
            ),
            (
                "redis_facts_written",
                "Facts written to Redis",
                counters.facts_written,
            ),
            (
                "redis_facts_dropped",
                "Facts turned away by a full queue (Redis slow or unreachable)",
                counters.facts_dropped,
            ),
            (
                "redis_facts_lost",
                "Facts in batches Redis did not take",
                counters.facts_lost,
            ),
            (
                "redis_placements_not_refreshed",
                "Own placements beyond the refresh table, left to expire",
                counters.placements_not_refreshed,
            ),
            (
                "redis_lookups_failed",
                "Placement lookups Redis did not answer (judged with local placements only)",
                counters.lookups_failed,
            ),
            (
                "redis_claims_failed",
                "Dedup claims Redis did not answer (the alert was printed anyway)",
                counters.claims_failed,
            ),
            (
                "redis_mismatches_deduplicated",
                "route_mismatch alerts another node printed first, so this one did not",
                counters.mismatches_deduplicated,
            ),
            (
                "redis_divergences_deduplicated",
                "ring_divergence alerts another node printed first, so this one did not",
                counters.divergences_deduplicated,
            ),
        ];
        for (name, help, value) in totals {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

/// A node's handle on the shared state. Dropping it stops its tasks.
pub struct SharedState {
    keys: Keys,
    node: String,
    url: RedisUrl,
    connection: ConnectionManager,
    facts: mpsc::Sender<Fact>,
    health: Arc<StoreHealth>,
    tasks: [JoinHandle<()>; 2],
}

impl Drop for SharedState {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl SharedState {
    /// Starts the probe and the writer; needs a tokio runtime. Redis need not be reachable:
    /// the client connects lazily and the probe reports when it is.
    pub fn start(config: &ClusterConfig) -> Result<Self, StoreError> {
        // rustls picks its provider from the process default; kube already builds `ring`.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let url = config.url.clone();
        let failed = |error: redis::RedisError| StoreError::Redis {
            url: url.to_string(),
            reason: url.scrub(&error.to_string()),
        };
        let client = redis::Client::open(url.expose()).map_err(failed)?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(REQUEST_TIMEOUT))
            .set_response_timeout(Some(REQUEST_TIMEOUT))
            // The probe is the reconnect loop (with its own backoff): the manager retries once.
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(100))
            .set_max_delay(MAX_PROBE_BACKOFF);
        let connection =
            ConnectionManager::new_lazy_with_config(client, manager_config).map_err(failed)?;
        let health = Arc::new(StoreHealth::default());
        let (up_sender, up) = watch::channel(false);
        let (facts, queue) = mpsc::channel(config.queue_capacity);
        let keys = Keys::new(&config.prefix);
        let probe = tokio::spawn(probe(connection.clone(), Arc::clone(&health), up_sender));
        let writer = super::writer::Writer::new(
            keys.clone(),
            config.node.clone(),
            connection.clone(),
            Arc::clone(&health),
        );
        let writer = tokio::spawn(writer.run(queue, up));
        tracing::info!(redis = %url, node = %config.node, prefix = %config.prefix, "cluster mode: sharing state through Redis");
        Ok(Self {
            keys,
            node: config.node.clone(),
            url,
            connection,
            facts,
            health,
            tasks: [probe, writer],
        })
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    pub fn health(&self) -> Arc<StoreHealth> {
        Arc::clone(&self.health)
    }

    /// Queues a fact for Redis without waiting; a full queue drops it (counted).
    pub fn record(&self, fact: Fact) {
        match self.facts.try_send(fact) {
            Ok(()) => {
                self.health.queued.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                self.health.facts_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Every node's live placements of `users`, in one pipelined round trip.
    pub async fn placements_of(
        &self,
        users: &[String],
    ) -> Result<HashMap<String, Vec<SharedPlacement>>, StoreError> {
        if users.is_empty() {
            return Ok(HashMap::new());
        }
        let mut pipe = redis::pipe();
        for user in users {
            pipe.hgetall(self.keys.user_placements(user));
        }
        let hashes: Vec<HashMap<String, String>> = self.query(&pipe).await?;
        let now = unix_now_ms();
        Ok(users
            .iter()
            .zip(hashes)
            .map(|(user, hash)| {
                let mut placements: Vec<SharedPlacement> = hash
                    .iter()
                    .filter_map(|(field, value)| {
                        SharedPlacement::from_stored(user, field, value, now)
                    })
                    .collect();
                placements.sort_by_key(|placement| (placement.since_ns, placement.field()));
                (user.clone(), placements)
            })
            .filter(|(_, placements)| !placements.is_empty())
            .collect())
    }

    /// The placements this node made and shared, e.g. before a restart: two round trips
    /// (the node's connection index, then its users' fields).
    pub async fn own_placements(&self) -> Result<Vec<SharedPlacement>, StoreError> {
        let index: HashMap<String, String> = self
            .query(redis::cmd("HGETALL").arg(self.keys.node_connections(&self.node)))
            .await?;
        let entries: Vec<(String, String)> = index.into_iter().collect();
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for (connection, user) in &entries {
            pipe.cmd("HGET")
                .arg(self.keys.user_placements(user))
                .arg(format!("{}|{connection}", self.node));
        }
        let values: Vec<Option<String>> = self.query(&pipe).await?;
        let now = unix_now_ms();
        let mut placements: Vec<SharedPlacement> = entries
            .iter()
            .zip(values)
            .filter_map(|((connection, user), value)| {
                let field = format!("{}|{connection}", self.node);
                SharedPlacement::from_stored(user, &field, &value?, now)
            })
            .collect();
        placements.sort_by_key(|placement| placement.connection);
        Ok(placements)
    }

    /// The last push outcomes for each of `users`, newest first, in one round trip.
    pub async fn push_outcomes(
        &self,
        users: &[String],
    ) -> Result<HashMap<String, Vec<PushOutcome>>, StoreError> {
        if users.is_empty() {
            return Ok(HashMap::new());
        }
        let mut pipe = redis::pipe();
        for user in users {
            pipe.lrange(self.keys.user_pushes(user), 0, -1);
        }
        let lists: Vec<Vec<String>> = self.query(&pipe).await?;
        Ok(users
            .iter()
            .zip(lists)
            .filter(|(_, list)| !list.is_empty())
            .map(|(user, list)| {
                let outcomes = list
                    .iter()
                    .filter_map(|value| serde_json::from_str::<PushOutcome>(value).ok())
                    .map(|mut outcome| {
                        outcome.user.clone_from(user);
                        outcome
                    })
                    .collect();
                (user.clone(), outcomes)
            })
            .collect())
    }

    /// Every node's ring members (seen within the ring TTL) and recent placements.
    pub async fn ring_evidence(&self) -> Result<RingEvidence, StoreError> {
        let mut pipe = redis::pipe();
        pipe.hgetall(self.keys.ring_members(RingSide::Proxy))
            .hgetall(self.keys.ring_members(RingSide::Push))
            .lrange(self.keys.ring_placements(), 0, -1);
        let (proxy, push, placements): (
            HashMap<String, String>,
            HashMap<String, String>,
            Vec<String>,
        ) = self.query(&pipe).await?;
        let oldest = unix_now_ms().saturating_sub(millis(keys::RING_TTL));
        let members = |hash: HashMap<String, String>| {
            hash.into_iter()
                .filter_map(|(member, value)| {
                    let seen: RingMember = serde_json::from_str(&value).ok()?;
                    (seen.seen_ms >= oldest).then_some((member, seen))
                })
                .collect()
        };
        Ok(RingEvidence {
            proxy: members(proxy),
            push: members(push),
            placements: placements
                .iter()
                .filter_map(|entry| {
                    let (user, ip) = entry.rsplit_once(' ')?;
                    Some((user.to_owned(), ip.parse().ok()?))
                })
                .collect(),
        })
    }

    /// Claims each key for this node for its time to live (`SET key node NX PX ttl`), in one
    /// pipelined round trip: true, in order, where this node is the one claimant cluster-wide
    /// until the key expires.
    pub async fn claims(&self, claims: &[(&str, Duration)]) -> Result<Vec<bool>, StoreError> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for (key, ttl) in claims {
            pipe.cmd("SET")
                .arg(*key)
                .arg(&self.node)
                .arg("NX")
                .arg("PX")
                .arg(millis(*ttl).max(1));
        }
        let answers: Vec<Option<String>> = self.query(&pipe).await?;
        Ok(answers.iter().map(Option::is_some).collect())
    }

    async fn query<T: redis::FromRedisValue>(
        &self,
        request: &impl Requestable,
    ) -> Result<T, StoreError> {
        let mut connection = self.connection.clone();
        self.health.round_trips.fetch_add(1, Ordering::Relaxed);
        match tokio::time::timeout(REQUEST_TIMEOUT, request.send(&mut connection)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(StoreError::Redis {
                url: self.url.to_string(),
                reason: self.url.scrub(&error.to_string()),
            }),
            Err(_) => Err(StoreError::Timeout {
                url: self.url.to_string(),
                timeout: REQUEST_TIMEOUT,
            }),
        }
    }
}

/// A command or a pipeline, sent the same way.
trait Requestable {
    async fn send<T: redis::FromRedisValue>(
        &self,
        connection: &mut ConnectionManager,
    ) -> redis::RedisResult<T>;
}

impl Requestable for redis::Cmd {
    async fn send<T: redis::FromRedisValue>(
        &self,
        connection: &mut ConnectionManager,
    ) -> redis::RedisResult<T> {
        self.query_async(connection).await
    }
}

impl Requestable for redis::Pipeline {
    async fn send<T: redis::FromRedisValue>(
        &self,
        connection: &mut ConnectionManager,
    ) -> redis::RedisResult<T> {
        self.query_async(connection).await
    }
}

/// Pings Redis: every second while up, backing off to [`MAX_PROBE_BACKOFF`] while down.
/// Each ping over a broken connection is also the manager's reconnect attempt.
async fn probe(
    mut connection: ConnectionManager,
    health: Arc<StoreHealth>,
    up: watch::Sender<bool>,
) {
    let mut wait = Duration::ZERO;
    loop {
        tokio::time::sleep(wait).await;
        let started = Instant::now();
        health.round_trips.fetch_add(1, Ordering::Relaxed);
        let answer = tokio::time::timeout(
            REQUEST_TIMEOUT,
            redis::cmd("PING").query_async::<String>(&mut connection),
        )
        .await;
        let reachable = matches!(answer, Ok(Ok(_)));
        if reachable {
            let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            health.round_trip_us.store(micros, Ordering::Relaxed);
            wait = PROBE_INTERVAL;
        } else {
            health.probe_failures.fetch_add(1, Ordering::Relaxed);
            wait = if health.is_up() || wait.is_zero() {
                Duration::from_millis(250)
            } else {
                (wait * 2).min(MAX_PROBE_BACKOFF)
            };
        }
        if health.up.swap(reachable, Ordering::Relaxed) != reachable {
            if reachable {
                tracing::info!("shared state: Redis reachable");
            } else {
                tracing::warn!("shared state: Redis unreachable; detecting with local state only");
            }
            up.send_replace(reachable);
        }
    }
}

pub(super) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

pub(super) fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, millis)
}
