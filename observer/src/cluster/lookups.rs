//! Looks up other nodes' placements for the link's worker, through a connection of its own and
//! a cache that stays exact: what a read in the same round would have returned.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, atomic::Ordering},
};

use super::{
    ClusterConfig, RedisTopology,
    clock::unix_now_ms,
    connection::{REQUEST_TIMEOUT, RedisConnection},
    keys::SharedPlacement,
    store::{SharedState, StoreError},
};
use crate::correlate::RemotePlacement;

/// Bounds the users whose placements are cached; past that the cache starts over.
const MAX_CACHED_USERS: usize = 262_144;
/// Bounds the change log entries a round reads: when the one it stopped at is not among them,
/// entries were missed, and the cache starts over.
const MAX_CHANGES_PER_ROUND: usize = 1_024;
/// Counts the entries read beyond those the log's count says are new (writers add and count in two
/// steps).
const CHANGES_SLACK: usize = 16;

/// Opens the placement lookups' own connection, so a lookup never waits behind a write batch.
pub(super) fn lookup_connection(config: &ClusterConfig) -> Result<RedisConnection, StoreError> {
    RedisConnection::open(&config.redis).map_err(|error| lookup_error(&config.redis, Some(&error)))
}

/// Builds what a failed lookup says: the topology without passwords.
fn lookup_error(redis: &RedisTopology, error: Option<&redis::RedisError>) -> StoreError {
    match error {
        Some(error) => StoreError::Redis {
            redis: redis.to_string(),
            reason: redis.scrub(&error.to_string()),
        },
        None => StoreError::Timeout {
            redis: redis.to_string(),
            timeout: REQUEST_TIMEOUT,
        },
    }
}

/// Runs placement lookups, with a cache that stays exact: every round also reads the placement
/// change log's count, and when it moved, the entries since the one the previous round
/// stopped at; a cached user that a write batch changed since is read again. A cached answer is
/// therefore what a read in that round would have returned; only the placements' own expiry is
/// checked locally.
pub(super) struct Lookups {
    connection: RedisConnection,
    redis: RedisTopology,
    /// Other nodes' placements of each user read.
    cached: HashMap<String, Cached>,
    /// Where the change log was last read; `None` until a round anchors it (the cache is empty).
    cursor: Option<Cursor>,
}

/// Holds other nodes' placements of one user, as read.
struct Cached {
    /// Oldest first; every lookup answered while all are live shares this copy.
    placements: Arc<[RemotePlacement]>,
    /// The Unix millisecond each of `placements` expires at.
    expires_ms: Vec<u64>,
}

impl Cached {
    /// Keeps the placements of `read` made on other nodes than `node`.
    fn new(read: Vec<(SharedPlacement, u64)>, node: &str) -> Self {
        let (placements, expires_ms): (Vec<RemotePlacement>, Vec<u64>) = read
            .into_iter()
            .filter(|(placement, _)| placement.node != node)
            .map(|(placement, expires_ms)| (placement.to_remote(), expires_ms))
            .unzip();
        Self {
            placements: placements.into(),
            expires_ms,
        }
    }

    /// Returns the placements not expired at `now_ms`: the shared copy while all are live.
    fn live(&self, now_ms: u64) -> Arc<[RemotePlacement]> {
        if self
            .expires_ms
            .iter()
            .all(|expires_ms| *expires_ms > now_ms)
        {
            return Arc::clone(&self.placements);
        }
        self.placements
            .iter()
            .zip(&self.expires_ms)
            .filter(|(_, expires_ms)| **expires_ms > now_ms)
            .map(|(placement, _)| placement.clone())
            .collect()
    }
}

/// Records where a reader left the change log.
#[derive(Clone)]
struct Cursor {
    /// The log's count of entries then.
    count: u64,
    /// Its newest entry then (entries are unique); `None`: it was empty.
    head: Option<String>,
}

impl Lookups {
    pub(super) fn new(connection: RedisConnection, redis: RedisTopology) -> Self {
        Self {
            connection,
            redis,
            cached: HashMap::new(),
            cursor: None,
        }
    }

    /// Forgets every cached placement (Redis went away, or changes were missed).
    pub(super) fn forget(&mut self) {
        self.cached.clear();
        self.cursor = None;
    }

    /// Returns other nodes' live placements of `users`, for those that have any: the cached ones
    /// that no write batch changed since, and the others read, in one pipelined round trip with
    /// the change log's count (a second one when it moved, for the new entries, and a third for
    /// cached users they name).
    pub(super) async fn placements_of<'u>(
        &mut self,
        state: &SharedState,
        users: &[&'u str],
    ) -> Result<HashMap<&'u str, Arc<[RemotePlacement]>>, StoreError> {
        let anchored = self.cursor.is_some();
        let (hits, misses): (Vec<&'u str>, Vec<&'u str>) = users
            .iter()
            .partition(|user| anchored && self.cached.contains_key(**user));
        let keys = state.keys();
        let mut pipe = redis::pipe();
        pipe.get(keys.placement_changes_count());
        if !anchored {
            // Where the log ends: later entries are read from there.
            pipe.lindex(keys.placement_changes(), 0);
        }
        for user in &misses {
            pipe.hgetall(keys.user_placements(user));
        }
        let mut answers: Vec<redis::Value> = self.query(state, &pipe).await?;
        let read = answers.split_off(if anchored { 1 } else { 2 }.min(answers.len()));
        let mut answers = answers.into_iter();
        let count: Option<u64> = answers
            .next()
            .and_then(|count| redis::from_redis_value(count).ok());
        let changed = match answers.next() {
            Some(head) => {
                self.cursor = Some(Cursor {
                    count: count.unwrap_or(0),
                    head: redis::from_redis_value(head).ok(),
                });
                None
            }
            None => self.changes_since(state, count.unwrap_or(0)).await?,
        };
        let stale: Vec<&'u str> = hits
            .into_iter()
            .filter(|user| {
                changed
                    .as_ref()
                    .is_none_or(|changed| changed.contains(*user))
            })
            .collect();
        let now_ms = unix_now_ms();
        let node = state.node();
        let mut found = HashMap::with_capacity(users.len());
        for (user, hash) in misses.into_iter().zip(read) {
            let placements = Cached::new(stored_placements(user, hash), node);
            found.insert(user, placements.live(now_ms));
            // Read before or after the change (a Redis Cluster answers per shard): not kept.
            if changed
                .as_ref()
                .is_some_and(|changed| !changed.contains(user))
            {
                self.keep(user, placements);
            }
        }
        if !stale.is_empty() {
            let mut pipe = redis::pipe();
            for user in &stale {
                pipe.hgetall(keys.user_placements(user));
            }
            let read: Vec<redis::Value> = self.query(state, &pipe).await?;
            for (user, hash) in stale.into_iter().zip(read) {
                let placements = Cached::new(stored_placements(user, hash), node);
                found.insert(user, placements.live(now_ms));
                // The log was read before this: a later change is in its next entries.
                self.keep(user, placements);
            }
        }
        for user in users {
            if !found.contains_key(user)
                && let Some(placements) = self.cached.get(*user)
            {
                found.insert(user, placements.live(now_ms));
            }
        }
        found.retain(|_, placements| !placements.is_empty());
        Ok(found)
    }

    /// Returns the users the change log named since the cursor (which moves on), forgotten from the
    /// cache; `None` when that cannot be told (the entry the cursor stopped at is gone: Redis
    /// lost the log, or too many came since), and then the whole cache is forgotten.
    async fn changes_since(
        &mut self,
        state: &SharedState,
        count: u64,
    ) -> Result<Option<HashSet<String>>, StoreError> {
        let Some(cursor) = self.cursor.clone() else {
            return Ok(None);
        };
        if count == cursor.count {
            return Ok(Some(HashSet::new()));
        }
        let wanted = (count.saturating_sub(cursor.count) as usize + CHANGES_SLACK)
            .min(MAX_CHANGES_PER_ROUND);
        let keys = state.keys();
        let mut pipe = redis::pipe();
        pipe.get(keys.placement_changes_count()).lrange(
            keys.placement_changes(),
            0,
            wanted as isize - 1,
        );
        let (count, entries): (Option<u64>, Vec<String>) = self.query(state, &pipe).await?;
        let new = match &cursor.head {
            Some(head) => entries.iter().position(|entry| entry == head),
            // Empty before: all of it is new, if all of it was read.
            None => (entries.len() < wanted).then_some(entries.len()),
        };
        self.cursor = Some(Cursor {
            count: count.unwrap_or(0),
            head: entries.first().cloned(),
        });
        let Some(new) = new else {
            self.cached.clear();
            return Ok(None);
        };
        let changed: HashSet<String> = entries[..new]
            .iter()
            .filter_map(|entry| serde_json::from_str::<ChangeEntry>(entry).ok())
            .flat_map(|entry| entry.users)
            .collect();
        for user in &changed {
            self.cached.remove(user);
        }
        Ok(Some(changed))
    }

    fn keep(&mut self, user: &str, placements: Cached) {
        if self.cached.len() >= MAX_CACHED_USERS {
            self.cached.clear();
        }
        self.cached.insert(user.to_owned(), placements);
    }

    async fn query<T: redis::FromRedisValue>(
        &mut self,
        state: &SharedState,
        pipe: &redis::Pipeline,
    ) -> Result<T, StoreError> {
        state.health().round_trips.fetch_add(1, Ordering::Relaxed);
        match tokio::time::timeout(REQUEST_TIMEOUT, pipe.query_async::<T>(&mut self.connection))
            .await
        {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(lookup_error(&self.redis, Some(&error))),
            Err(_) => Err(lookup_error(&self.redis, None)),
        }
    }
}

/// Returns the placements of one user's hash, as read (malformed fields left out), oldest first.
fn stored_placements(user: &str, hash: redis::Value) -> Vec<(SharedPlacement, u64)> {
    let hash: HashMap<String, String> = redis::from_redis_value(hash).unwrap_or_default();
    let mut placements: Vec<(SharedPlacement, u64)> = hash
        .iter()
        .filter_map(|(field, value)| SharedPlacement::from_stored_until(user, field, value))
        .collect();
    placements.sort_by_key(|(placement, _)| (placement.since_ns, placement.field()));
    placements
}

/// Holds the users of one change log entry (the writer's `ChangeEntry`).
#[derive(serde::Deserialize)]
struct ChangeEntry {
    users: Vec<String>,
}
