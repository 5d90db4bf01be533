//! Connects to the shared state, whichever Redis serves it: one server
//! (`--redis-url`), a Redis Cluster (`--redis-cluster`) or a Sentinel-managed primary
//! (`--redis-sentinel`). [`RedisConnection`] is a [`redis::aio::ConnectionLike`], cheap to clone
//! and shared by the writer, the reads and the probe; it connects lazily and reconnects on its
//! own, so the rest of cluster mode never knows which topology it talks to.
//!
//! - One server: the client's connection manager, which reconnects to the same address.
//! - A Redis Cluster: the client's cluster connection (slot map, `MOVED`, reconnects to the
//!   seed nodes when every node was lost). It refuses a pipeline whose keys span slots, so a
//!   pipeline is split per slot here ([`split_per_slot`]), the parts sent at once and the
//!   answers put back in order. Every key carries a hash tag (`keys.rs`), so one user's
//!   commands stay together.
//! - Sentinel: the sentinels are asked for the primary's address (and the primary must say it
//!   is one); a broken connection, a timeout or a `READONLY` answer (a demoted primary) drops
//!   it, and the next request asks the sentinels again, so a failover is followed.

use std::{collections::HashMap, sync::Arc, time::Duration};

use futures_util::future::{FutureExt, join_all};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Pipeline,
    RedisError, RedisFuture, RedisResult, TlsMode, Value,
    aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection},
    cluster::ClusterClientBuilder,
    cluster_async::ClusterConnection,
    cluster_routing::Slot,
    sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType},
};

use super::RedisTopology;

/// Bounds the time of every request (read, batch, probe) and of each connection attempt.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// Bounds the wait between the client's own reconnection attempts.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(4);

/// Holds a connection to the shared state's Redis, whatever its topology.
#[derive(Clone)]
pub struct RedisConnection(Topology);

#[derive(Clone)]
enum Topology {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(Arc<SentinelPrimary>),
}

impl RedisConnection {
    /// Builds the client for `topology` without connecting; needs a tokio runtime. Fails only on
    /// settings the client refuses (e.g. seed nodes with different passwords).
    ///
    /// # Errors
    ///
    /// Fails with the client's [`redis::RedisError`] when it refuses the settings or a URL.
    pub fn open(topology: &RedisTopology) -> RedisResult<Self> {
        let connection = match topology {
            RedisTopology::Single(url) => {
                let client = redis::Client::open(url.expose())?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(REQUEST_TIMEOUT))
                    .set_response_timeout(Some(REQUEST_TIMEOUT))
                    // The probe is the reconnect loop (with its own backoff): retry once.
                    .set_number_of_retries(1)
                    .set_min_delay(Duration::from_millis(100))
                    .set_max_delay(MAX_RETRY_DELAY);
                Topology::Single(ConnectionManager::new_lazy_with_config(client, config)?)
            }
            RedisTopology::Cluster(seeds) => {
                let client = ClusterClientBuilder::new(seeds.iter().map(|url| url.expose()))
                    .connection_timeout(REQUEST_TIMEOUT)
                    .response_timeout(REQUEST_TIMEOUT)
                    // Requests have a deadline of their own; the client retries within it
                    // (a MOVED after a failover, a node reconnecting).
                    .retries(3)
                    .min_retry_wait(50)
                    .max_retry_wait(500)
                    .build()?;
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(REQUEST_TIMEOUT)
                    .set_response_timeout(REQUEST_TIMEOUT);
                Topology::Cluster(client.get_pending_async_connection_with_config(config))
            }
            RedisTopology::Sentinel { sentinels, master } => {
                Topology::Sentinel(Arc::new(SentinelPrimary::new(sentinels, master)?))
            }
        };
        Ok(Self(connection))
    }

    /// Returns a Redis Cluster's current epoch (`CLUSTER INFO`), which grows with every failover
    /// and configuration change; `None` on the other topologies, whose failovers break the
    /// connection.
    ///
    /// # Errors
    ///
    /// Fails when the node asked does not answer.
    pub async fn cluster_epoch(&mut self) -> RedisResult<Option<u64>> {
        let Topology::Cluster(cluster) = &mut self.0 else {
            return Ok(None);
        };
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query_async(cluster)
            .await?;
        Ok(info
            .lines()
            .find_map(|line| line.strip_prefix("cluster_current_epoch:"))
            .and_then(|epoch| epoch.trim().parse().ok()))
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.0 {
            Topology::Single(manager) => manager.req_packed_command(cmd),
            Topology::Cluster(cluster) => cluster.req_packed_command(cmd),
            Topology::Sentinel(primary) => {
                let primary = Arc::clone(primary);
                async move {
                    let mut connection = primary.connection().await?;
                    let answer = connection.req_packed_command(cmd).await;
                    primary.check(&answer, |value| std::slice::from_ref(value));
                    answer
                }
                .boxed()
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        if pipeline.is_empty() {
            // Nothing to send, nothing to wait for: the client would wait for an answer that
            // never comes, until the request's deadline (a batch with nothing due).
            return std::future::ready(Ok(Vec::new())).boxed();
        }
        match &mut self.0 {
            Topology::Single(manager) => manager.req_packed_commands(pipeline, offset, count),
            Topology::Cluster(cluster) => {
                let cluster = cluster.clone();
                async move { cluster_pipeline(cluster, pipeline, offset, count).await }.boxed()
            }
            Topology::Sentinel(primary) => {
                let primary = Arc::clone(primary);
                async move {
                    let mut connection = primary.connection().await?;
                    let answer = connection
                        .req_packed_commands(pipeline, offset, count)
                        .await;
                    primary.check(&answer, Vec::as_slice);
                    answer
                }
                .boxed()
            }
        }
    }

    fn get_db(&self) -> i64 {
        match &self.0 {
            Topology::Single(manager) => manager.get_db(),
            Topology::Cluster(cluster) => cluster.get_db(),
            Topology::Sentinel(primary) => primary.db,
        }
    }
}

/// Sends a pipeline to a Redis Cluster: one part per slot, all at once, the answers put back
/// in the pipeline's order. A transaction (`MULTI`/`EXEC`) is sent whole: its keys must share
/// a slot.
async fn cluster_pipeline(
    mut cluster: ClusterConnection,
    pipeline: &Pipeline,
    offset: usize,
    count: usize,
) -> RedisResult<Vec<Value>> {
    let parts = split_per_slot(pipeline);
    if pipeline.is_transaction() || parts.len() <= 1 {
        return cluster.req_packed_commands(pipeline, offset, count).await;
    }
    let sent = parts.iter().map(|(_, part)| {
        let mut cluster = cluster.clone();
        async move { cluster.req_packed_commands(part, 0, part.len()).await }
    });
    let answers = join_all(sent).await;
    let mut values = vec![Value::Nil; pipeline.len()];
    for ((positions, _), answer) in parts.iter().zip(answers) {
        for (&position, value) in positions.iter().zip(answer?) {
            values[position] = value;
        }
    }
    Ok(values)
}

/// Splits a pipeline into one per hash slot (commands without a key make one of their own),
/// each with the positions of its commands in the original, in order. Results are not
/// ignored in the parts: the original pipeline filters them.
pub fn split_per_slot(pipeline: &Pipeline) -> Vec<(Vec<usize>, Pipeline)> {
    let mut parts: Vec<(Vec<usize>, Pipeline)> = Vec::new();
    let mut by_slot: HashMap<Option<Slot>, usize> = HashMap::new();
    for (position, cmd) in pipeline.cmd_iter().enumerate() {
        let part = *by_slot.entry(slot_of(cmd)).or_insert_with(|| {
            parts.push((Vec::new(), redis::pipe()));
            parts.len() - 1
        });
        let (positions, part) = &mut parts[part];
        positions.push(position);
        part.add_command(cmd.clone());
    }
    parts
}

/// Returns the slot of a command's first key: its first argument, except for scripts and functions
/// (`EVAL script numkeys key…`); `None` for a command without a key.
fn slot_of(cmd: &Cmd) -> Option<Slot> {
    let mut args = cmd.args_iter().filter_map(|arg| match arg {
        redis::Arg::Simple(bytes) => Some(bytes),
        _ => None,
    });
    let name = args.next()?.to_ascii_uppercase();
    let key = match name.as_slice() {
        b"PING" | b"INFO" | b"ROLE" | b"CLUSTER" | b"SCRIPT" | b"FUNCTION" | b"DBSIZE" => None,
        b"EVAL" | b"EVALSHA" | b"EVAL_RO" | b"EVALSHA_RO" | b"FCALL" | b"FCALL_RO" => {
            let numkeys = args.nth(1)?;
            (numkeys != b"0").then(|| args.next()).flatten()
        }
        _ => args.next(),
    };
    key.map(Slot::for_key)
}

/// Holds the primary of a Sentinel-managed Redis: the sentinels' answer, connected, until it fails.
struct SentinelPrimary {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    current: std::sync::Mutex<Option<MultiplexedConnection>>,
    config: AsyncConnectionConfig,
    db: i64,
}

impl SentinelPrimary {
    /// Builds the client: the sentinels are reached with each URL's own address, user, password and
    /// TLS (DB 0: a sentinel has no databases); the primary with the first URL's user, password, DB
    /// and TLS.
    fn new(sentinels: &[super::RedisUrl], master: &str) -> RedisResult<Self> {
        let infos = sentinels
            .iter()
            .map(|url| url.expose().into_connection_info())
            .collect::<RedisResult<Vec<ConnectionInfo>>>()?;
        let first = infos.first().cloned().ok_or_else(|| {
            RedisError::from((redis::ErrorKind::InvalidClientConfig, "no sentinel given"))
        })?;
        let db = first.redis_settings().db();
        let mut primary = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(first.redis_settings().clone());
        if let ConnectionAddr::TcpTls { insecure, .. } = first.addr() {
            primary = primary.set_tls_mode(if *insecure {
                TlsMode::Insecure
            } else {
                TlsMode::Secure
            });
        }
        let sentinel_infos: Vec<ConnectionInfo> = infos
            .into_iter()
            .map(|info| {
                let settings = info.redis_settings().clone().set_db(0);
                info.set_redis_settings(settings)
            })
            .collect();
        let client = SentinelClient::build(
            sentinel_infos,
            master,
            Some(primary),
            SentinelServerType::Master,
        )?;
        Ok(Self {
            sentinels: tokio::sync::Mutex::new(client),
            current: std::sync::Mutex::new(None),
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(REQUEST_TIMEOUT))
                .set_response_timeout(Some(REQUEST_TIMEOUT)),
            db,
        })
    }

    /// Returns the connection to the primary, asking the sentinels for it first when there is none.
    async fn connection(&self) -> RedisResult<MultiplexedConnection> {
        if let Some(connection) = self.cached() {
            return Ok(connection);
        }
        let mut sentinels = self.sentinels.lock().await;
        // Another request may have connected while this one waited.
        if let Some(connection) = self.cached() {
            return Ok(connection);
        }
        let client = sentinels.async_get_client().await?;
        let connection = client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        if let Ok(mut current) = self.current.lock() {
            *current = Some(connection.clone());
        }
        Ok(connection)
    }

    fn cached(&self) -> Option<MultiplexedConnection> {
        self.current.lock().ok().and_then(|current| current.clone())
    }

    /// Drops the connection when an answer says the primary is gone or is one no more: the
    /// next request asks the sentinels again.
    fn check<T>(&self, answer: &RedisResult<T>, values: impl Fn(&T) -> &[Value]) {
        let stale = match answer {
            Err(error) => {
                error.is_io_error()
                    || error.is_connection_dropped()
                    || error.is_timeout()
                    || error.code() == Some("READONLY")
            }
            Ok(answer) => values(answer).iter().any(
                |value| matches!(value, Value::ServerError(error) if error.code() == "READONLY"),
            ),
        };
        if stale && let Ok(mut current) = self.current.lock() {
            *current = None;
        }
    }
}

#[cfg(test)]
mod tests;
