//! Talks to Redis for cluster mode.
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
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use redis::aio::ConnectionLike;
use thiserror::Error;
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};

use super::{
    ClusterConfig, RedisTopology,
    clock::{millis, unix_now_ms},
    connection::{REQUEST_TIMEOUT, RedisConnection},
    keys::{self, Keys, RingMember, RingSide, SharedPlacement},
    writer::Writer,
};
pub use super::{
    fact::Fact,
    health::{LinkEvent, StoreCounters, StoreHealth, StoreMetrics},
};

const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// Bounds the probe's backoff: while Redis is down the probe (which is also the reconnect attempt)
/// backs off to this.
const MAX_PROBE_BACKOFF: Duration = Duration::from_secs(4);

/// Describes a Redis request that failed; `redis` names the topology without passwords.
#[derive(Debug, Error)]
pub enum StoreError {
    /// `redis` is the topology without passwords ([`RedisTopology`]'s `Display`).
    #[error("{redis}: {reason}")]
    Redis { redis: String, reason: String },
    #[error("{redis} did not answer within {timeout:?}")]
    Timeout { redis: String, timeout: Duration },
}

/// Holds the shared ring evidence: every node's members per side and recent placements.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RingEvidence {
    pub proxy: BTreeMap<String, RingMember>,
    pub push: BTreeMap<String, RingMember>,
    /// `(user, gateway IP)`, newest first.
    pub placements: Vec<(String, IpAddr)>,
}

/// Holds a node's handle on the shared state. Dropping it stops its tasks.
pub struct SharedState {
    keys: Keys,
    node: String,
    redis: RedisTopology,
    connection: RedisConnection,
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
    ///
    /// # Errors
    ///
    /// Fails with [`StoreError::Redis`] when no client can be set up for the configured Redis.
    pub fn start(config: &ClusterConfig) -> Result<Self, StoreError> {
        // rustls picks its provider from the process default; kube already builds `ring`.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let redis = config.redis.clone();
        let connection = RedisConnection::open(&redis).map_err(|error| StoreError::Redis {
            redis: redis.to_string(),
            reason: redis.scrub(&error.to_string()),
        })?;
        let health = Arc::new(StoreHealth::default());
        let (up_sender, up) = watch::channel(false);
        let (facts, queue) = mpsc::channel(config.queue_capacity);
        let keys = Keys::new(&config.prefix);
        let probe = tokio::spawn(probe(connection.clone(), Arc::clone(&health), up_sender));
        let writer = Writer::new(
            keys.clone(),
            config.node.clone(),
            connection.clone(),
            Arc::clone(&health),
        );
        let writer = tokio::spawn(writer.run(queue, up));
        tracing::info!(
            redis = %redis,
            node = %config.node,
            prefix = %config.prefix,
            "cluster mode: sharing state through Redis"
        );
        Ok(Self {
            keys,
            node: config.node.clone(),
            redis,
            connection,
            facts,
            health,
            tasks: [probe, writer],
        })
    }

    /// Returns this node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Returns the keys under this cluster's prefix.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// Returns the store's health and totals, shared.
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

    /// Returns every node's live placements of `users`, in one pipelined round trip.
    ///
    /// # Errors
    ///
    /// Fails with [`StoreError::Timeout`] when Redis does not answer in time, and
    /// [`StoreError::Redis`] when the request fails or its answer does not decode.
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

    /// Returns the placements this node made and shared, e.g. before a restart: two round trips
    /// (the node's connection index, then its users' fields).
    ///
    /// # Errors
    ///
    /// Fails with [`StoreError::Timeout`] when Redis does not answer in time, and
    /// [`StoreError::Redis`] when a request fails or its answer does not decode.
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

    /// Returns every node's ring members (seen within the ring TTL) and recent placements.
    ///
    /// # Errors
    ///
    /// Fails with [`StoreError::Timeout`] when Redis does not answer in time, and
    /// [`StoreError::Redis`] when the request fails or its answer does not decode.
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
    ///
    /// # Errors
    ///
    /// Fails with [`StoreError::Timeout`] when Redis does not answer in time, and
    /// [`StoreError::Redis`] when the request fails or its answer does not decode.
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
                redis: self.redis.to_string(),
                reason: self.redis.scrub(&error.to_string()),
            }),
            Err(_) => Err(StoreError::Timeout {
                redis: self.redis.to_string(),
                timeout: REQUEST_TIMEOUT,
            }),
        }
    }
}

/// Sends a command or a pipeline the same way.
trait Requestable {
    async fn send<T: redis::FromRedisValue>(
        &self,
        connection: &mut (impl ConnectionLike + Send),
    ) -> redis::RedisResult<T>;
}

impl Requestable for redis::Cmd {
    async fn send<T: redis::FromRedisValue>(
        &self,
        connection: &mut (impl ConnectionLike + Send),
    ) -> redis::RedisResult<T> {
        self.query_async(connection).await
    }
}

impl Requestable for redis::Pipeline {
    async fn send<T: redis::FromRedisValue>(
        &self,
        connection: &mut (impl ConnectionLike + Send),
    ) -> redis::RedisResult<T> {
        self.query_async(connection).await
    }
}

/// Pings Redis: every second while up, backing off to [`MAX_PROBE_BACKOFF`] while down; a
/// request that failed in between also makes the probe fail. Each ping over a broken
/// connection is also the client's reconnect attempt. Redis coming back, or a Redis Cluster
/// failing over behind the client's back (its epoch grew), counts as a comeback: the writer
/// writes this node's state again and the lookups forget what they cached.
async fn probe(mut connection: RedisConnection, health: Arc<StoreHealth>, up: watch::Sender<bool>) {
    let mut wait = Duration::ZERO;
    let mut failed_before = health.failed_requests();
    let mut epoch = None;
    loop {
        tokio::time::sleep(wait).await;
        let started = Instant::now();
        health.round_trips.fetch_add(1, Ordering::Relaxed);
        let answer = tokio::time::timeout(
            REQUEST_TIMEOUT,
            redis::cmd("PING").query_async::<String>(&mut connection),
        )
        .await;
        // A request that failed since the last probe counts as a failed probe: on a Redis
        // Cluster a PING may pass while a primary is being replaced, and going down then up
        // makes the writer write this node's state back.
        let failed_now = health.failed_requests();
        let reachable = matches!(answer, Ok(Ok(_))) && failed_now == failed_before;
        failed_before = failed_now;
        if reachable {
            let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            health.round_trip_us.store(micros, Ordering::Relaxed);
            wait = PROBE_INTERVAL;
            if failed_over(&mut connection, &mut epoch).await && health.is_up() {
                tracing::info!(
                    "shared state: the Redis Cluster failed over; writing this node's state again"
                );
                health.comebacks.fetch_add(1, Ordering::Relaxed);
                up.send_replace(true);
            }
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
                health.comebacks.fetch_add(1, Ordering::Relaxed);
                tracing::info!("shared state: Redis reachable");
            } else {
                tracing::warn!("shared state: Redis unreachable; detecting with local state only");
            }
            up.send_replace(reachable);
        }
    }
}

/// Says whether a Redis Cluster's epoch grew since the last call (`epoch` keeps the highest
/// seen): a failover, which the client follows without a request failing, while the promoted
/// replica may lack the old primary's last writes. Always false on other topologies, and when
/// the epoch cannot be read (the next probe tries again).
async fn failed_over(connection: &mut RedisConnection, epoch: &mut Option<u64>) -> bool {
    let Ok(Ok(Some(now))) = tokio::time::timeout(REQUEST_TIMEOUT, connection.cluster_epoch()).await
    else {
        return false;
    };
    let grew = epoch.is_some_and(|seen| now > seen);
    *epoch = Some(epoch.map_or(now, |seen| seen.max(now)));
    grew
}
