//! Shares state in cluster mode: the observers of one cluster, one per node, share what the engine
//! needs through Redis, so a join whose halves were seen on different nodes (the proxy's placement
//! here, push's call there) still completes, and a restarted observer finds the placements made
//! before it started.
//!
//! Without `--redis-url`, `--redis-cluster` or `--redis-sentinel` nothing here runs and the
//! observer works alone.
//!
//! - [`connection`]: one connection type over the three Redis topologies (one server, a Redis
//!   Cluster, a Sentinel-managed primary) that reconnects on its own.
//! - [`keys`]: the key schema (prefix, hash tags, TTLs) and the values stored: placements, ring
//!   evidence and dedup claims; never a token, never message content.
//! - [`link`]: between the engine and the store: facts out, placement lookups and dedup
//!   claims through a worker task, `capture_degraded` when Redis is lost and back.
//! - [`recovery`]: after a restart, which stored placements' connections the kernel still holds.
//! - [`store`]: the client: a writer task fed by a bounded queue (pipelined batches; a full
//!   queue drops and counts), reads with a deadline and a health probe; [`health`] holds what
//!   they count, for the metrics.

mod clock;
pub mod connection;
mod fact;
pub mod health;
pub mod keys;
pub mod link;
mod lookups;
pub mod recovery;
pub mod store;
mod writer;

use std::{fmt, path::PathBuf};

use clap::Args;
use thiserror::Error;

pub use keys::{ConnectionKey, Keys, RingSide, SharedPlacement};
pub use link::ClusterLink;
pub use store::{SharedState, StoreHealth, StoreMetrics};

/// Names the environment variable read for the Redis URL when neither flag gives one, so a
/// Kubernetes Secret can hold the credentials (`env.valueFrom.secretKeyRef`).
pub const REDIS_URL_ENV: &str = "OPENIM_OBSERVER_REDIS_URL";
/// Names the environment variable read for a Redis Cluster's seed nodes, as [`REDIS_URL_ENV`].
pub const REDIS_CLUSTER_ENV: &str = "OPENIM_OBSERVER_REDIS_CLUSTER";
/// Names the environment variable read for the sentinels' URLs, as [`REDIS_URL_ENV`].
pub const REDIS_SENTINEL_ENV: &str = "OPENIM_OBSERVER_REDIS_SENTINEL";

/// Describes a cluster-mode setting that cannot be used; each displays as one line.
#[derive(Debug, Error)]
pub enum ClusterError {
    #[error("{flag} {path}: {source}")]
    UrlFile {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{flag} {path} is empty")]
    EmptyUrlFile { flag: &'static str, path: PathBuf },
    /// Two of `--redis-url`, `--redis-cluster` and `--redis-sentinel` (flag, file or
    /// environment) are given.
    #[error("{0} and {1} both name a Redis: give one")]
    TwoTopologies(&'static str, &'static str),
    #[error("--redis-sentinel needs --redis-sentinel-master NAME (the name the sentinels monitor)")]
    NoSentinelMaster,
    #[error("--redis-sentinel-master is given without --redis-sentinel")]
    MasterWithoutSentinel,
    #[error("a Redis Cluster has database 0 only: leave /DB out of --redis-cluster")]
    ClusterDatabase,
    /// The text never repeats the URL: it may hold a password.
    #[error(
        "invalid Redis URL ({reason}); expected redis://[USER:PASSWORD@]HOST[:PORT][/DB] or \
        rediss://…"
    )]
    InvalidUrl { reason: &'static str },
    #[error("--redis-prefix must not be empty")]
    EmptyPrefix,
    #[error(
        "no node name: pass --node-name or set NODE_NAME (the DaemonSet sets it from spec.nodeName)"
    )]
    NoNodeName,
}

#[derive(Args, Debug, Clone, Default)]
pub struct ClusterArgs {
    /// Share state with the observers on the other nodes through Redis (cluster mode):
    /// redis://USER:PASSWORD@HOST:PORT/DB (all but HOST optional), or rediss:// for TLS. Also
    /// read from --redis-url-file or the OPENIM_OBSERVER_REDIS_URL environment variable.
    /// Without any of them (or --redis-cluster, --redis-sentinel) the observer works alone.
    #[arg(long, value_name = "URL")]
    pub redis_url: Option<String>,
    /// A file holding the Redis URL (a mounted Secret), read once at start.
    #[arg(long, value_name = "FILE", conflicts_with = "redis_url")]
    pub redis_url_file: Option<PathBuf>,
    /// Share state through a Redis Cluster instead: some of its nodes (seeds, the rest is
    /// discovered), comma-separated URLs as for --redis-url (one user and password for all,
    /// no /DB). Also read from --redis-cluster-file or OPENIM_OBSERVER_REDIS_CLUSTER.
    #[arg(long, value_name = "URL[,URL...]", conflicts_with_all = ["redis_url", "redis_url_file"])]
    pub redis_cluster: Option<String>,
    /// A file holding the Redis Cluster's seed URLs (comma- or line-separated).
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = ["redis_url", "redis_url_file", "redis_cluster"]
    )]
    pub redis_cluster_file: Option<PathBuf>,
    /// Share state through a Sentinel-managed primary instead: the sentinels' URLs,
    /// comma-separated (redis://USER:PASSWORD@HOST:26379; the first one's user, password, /DB
    /// and TLS also reach the primary), with --redis-sentinel-master. Also read from
    /// --redis-sentinel-file or OPENIM_OBSERVER_REDIS_SENTINEL.
    #[arg(
        long,
        value_name = "URL[,URL...]",
        conflicts_with_all = ["redis_url", "redis_url_file", "redis_cluster", "redis_cluster_file"]
    )]
    pub redis_sentinel: Option<String>,
    /// A file holding the sentinels' URLs (comma- or line-separated).
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = [
            "redis_url", "redis_url_file", "redis_cluster", "redis_cluster_file", "redis_sentinel"
        ]
    )]
    pub redis_sentinel_file: Option<PathBuf>,
    /// The name of the primary the sentinels monitor (`sentinel monitor NAME ...`), with
    /// --redis-sentinel.
    #[arg(long, value_name = "NAME")]
    pub redis_sentinel_master: Option<String>,
    /// Prefix of every key the observer writes, so it can share a Redis (for example OpenIM's
    /// own, under an ACL user limited to `~PREFIX*`).
    #[arg(long, value_name = "PREFIX", default_value = keys::DEFAULT_PREFIX)]
    pub redis_prefix: String,
    /// This node's name in shared state and alerts. Default: the NODE_NAME environment variable
    /// (the DaemonSet passes spec.nodeName down), else the hostname.
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Facts waiting for Redis at most; more are dropped and counted (while Redis is slow or
    /// unreachable).
    #[arg(long, value_name = "N", default_value_t = 65_536)]
    pub redis_queue: usize,
}

/// Holds cluster mode's settings, resolved from the flags, a file and the environment.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub redis: RedisTopology,
    pub prefix: String,
    pub node: String,
    pub queue_capacity: usize,
}

impl ClusterArgs {
    /// Resolves the settings; `None` when no Redis is given anywhere: single-node mode.
    ///
    /// # Errors
    ///
    /// Fails when a URL file cannot be read or is empty, a URL is invalid, two of `--redis-url`,
    /// `--redis-cluster` and `--redis-sentinel` are given, the sentinel master is missing or given
    /// alone, a cluster URL names a database, the prefix is empty, or no node name is found.
    pub fn resolve(&self) -> Result<Option<ClusterConfig>, ClusterError> {
        let Some(redis) = self.topology()? else {
            return Ok(None);
        };
        if self.redis_prefix.is_empty() {
            return Err(ClusterError::EmptyPrefix);
        }
        let node = match &self.node_name {
            Some(name) if !name.trim().is_empty() => name.trim().to_owned(),
            _ => hostname().ok_or(ClusterError::NoNodeName)?,
        };
        Ok(Some(ClusterConfig {
            redis,
            prefix: self.redis_prefix.clone(),
            node,
            queue_capacity: self.redis_queue.max(1),
        }))
    }

    /// Returns the Redis named by the flags, their files or the environment; two named is an error.
    fn topology(&self) -> Result<Option<RedisTopology>, ClusterError> {
        let single = given(
            &self.redis_url,
            &self.redis_url_file,
            "--redis-url-file",
            REDIS_URL_ENV,
        )?;
        let cluster = given(
            &self.redis_cluster,
            &self.redis_cluster_file,
            "--redis-cluster-file",
            REDIS_CLUSTER_ENV,
        )?;
        let sentinel = given(
            &self.redis_sentinel,
            &self.redis_sentinel_file,
            "--redis-sentinel-file",
            REDIS_SENTINEL_ENV,
        )?;
        let master = self
            .redis_sentinel_master
            .as_deref()
            .map(str::trim)
            .filter(|name| !name.is_empty());
        let topology = match (single, cluster, sentinel) {
            (None, None, None) => None,
            (Some(url), None, None) => Some(RedisTopology::Single(RedisUrl::parse(&url)?)),
            (None, Some(seeds), None) => {
                let seeds = RedisUrl::parse_list(&seeds)?;
                if seeds.iter().any(|seed| seed.db != 0) {
                    return Err(ClusterError::ClusterDatabase);
                }
                Some(RedisTopology::Cluster(seeds))
            }
            (None, None, Some(sentinels)) => Some(RedisTopology::Sentinel {
                sentinels: RedisUrl::parse_list(&sentinels)?,
                master: master.ok_or(ClusterError::NoSentinelMaster)?.to_owned(),
            }),
            (Some(_), Some(_), _) => {
                return Err(ClusterError::TwoTopologies(
                    "--redis-url",
                    "--redis-cluster",
                ));
            }
            (Some(_), None, Some(_)) => {
                return Err(ClusterError::TwoTopologies(
                    "--redis-url",
                    "--redis-sentinel",
                ));
            }
            (None, Some(_), Some(_)) => {
                return Err(ClusterError::TwoTopologies(
                    "--redis-cluster",
                    "--redis-sentinel",
                ));
            }
        };
        if master.is_some() && !matches!(topology, Some(RedisTopology::Sentinel { .. })) {
            return Err(ClusterError::MasterWithoutSentinel);
        }
        Ok(topology)
    }
}

/// Returns a setting given by its flag, else its file flag, else its environment variable.
fn given(
    flag: &Option<String>,
    file: &Option<PathBuf>,
    file_flag: &'static str,
    env: &str,
) -> Result<Option<String>, ClusterError> {
    Ok(match (flag, file) {
        (Some(value), _) => Some(value.clone()),
        (None, Some(path)) => Some(read_url_file(file_flag, path)?),
        (None, None) => std::env::var(env).ok().filter(|value| !value.is_empty()),
    })
}

fn read_url_file(flag: &'static str, path: &PathBuf) -> Result<String, ClusterError> {
    let text = std::fs::read_to_string(path).map_err(|source| ClusterError::UrlFile {
        flag,
        path: path.clone(),
        source,
    })?;
    let url = text.trim();
    if url.is_empty() {
        return Err(ClusterError::EmptyUrlFile {
            flag,
            path: path.clone(),
        });
    }
    Ok(url.to_owned())
}

fn hostname() -> Option<String> {
    let mut buffer = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that many bytes.
    let written = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) };
    if written != 0 {
        return None;
    }
    let end = buffer
        .iter()
        .position(|&byte| byte == 0)
        .unwrap_or(buffer.len());
    let name = String::from_utf8_lossy(&buffer[..end]).trim().to_owned();
    (!name.is_empty()).then_some(name)
}

/// Holds a Redis URL that may hold a password: `Display` and `Debug` show it without one
/// (`rediss://observer@redis:6380/0`), so logs and errors never carry it.
#[derive(Clone)]
pub struct RedisUrl {
    secret: String,
    redacted: String,
    db: i64,
}

impl RedisUrl {
    /// Parses one `redis://` or `rediss://` URL.
    ///
    /// # Errors
    ///
    /// Fails with [`ClusterError::InvalidUrl`] for another scheme or a URL the Redis client
    /// rejects.
    pub fn parse(text: &str) -> Result<Self, ClusterError> {
        use redis::IntoConnectionInfo;
        let scheme = text.split_once("://").map(|(scheme, _)| scheme);
        if !matches!(scheme, Some("redis" | "rediss")) {
            return Err(ClusterError::InvalidUrl {
                reason: "the scheme must be redis:// or rediss://",
            });
        }
        let info = text
            .into_connection_info()
            .map_err(|_| ClusterError::InvalidUrl {
                reason: "not a URL the Redis client accepts",
            })?;
        let user = info
            .redis_settings()
            .username()
            .map(|user| format!("{user}@"))
            .unwrap_or_default();
        let redacted = format!(
            "{}://{user}{}/{}",
            scheme.unwrap_or("redis"),
            info.addr(),
            info.redis_settings().db()
        );
        Ok(Self {
            secret: text.to_owned(),
            redacted,
            db: info.redis_settings().db(),
        })
    }

    /// Parses URLs separated by commas, spaces or lines (a list in a file); at least one.
    ///
    /// # Errors
    ///
    /// Fails with [`ClusterError::InvalidUrl`] when a URL is invalid or the list has none.
    pub fn parse_list(text: &str) -> Result<Vec<Self>, ClusterError> {
        let urls = text
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|url| !url.is_empty())
            .map(Self::parse)
            .collect::<Result<Vec<_>, _>>()?;
        if urls.is_empty() {
            return Err(ClusterError::InvalidUrl {
                reason: "no URL in the list",
            });
        }
        Ok(urls)
    }

    /// Returns the URL with its credentials, for the client only.
    pub(crate) fn expose(&self) -> &str {
        &self.secret
    }

    /// Removes the password from a text that might quote it (a client error echoing the URL).
    pub(crate) fn scrub(&self, text: &str) -> String {
        use redis::IntoConnectionInfo;
        let password = self
            .secret
            .as_str()
            .into_connection_info()
            .ok()
            .and_then(|info| info.redis_settings().password().map(str::to_owned));
        match password {
            Some(password) if !password.is_empty() => text.replace(&password, "***"),
            _ => text.to_owned(),
        }
    }
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisUrl({})", self.redacted)
    }
}

/// Names which Redis holds the shared state. `Display` names it without passwords.
#[derive(Clone, Debug)]
pub enum RedisTopology {
    /// One server (`--redis-url`).
    Single(RedisUrl),
    /// A Redis Cluster, by some of its nodes (`--redis-cluster`).
    Cluster(Vec<RedisUrl>),
    /// The primary the sentinels name `master` (`--redis-sentinel`).
    Sentinel {
        sentinels: Vec<RedisUrl>,
        master: String,
    },
}

impl RedisTopology {
    /// Removes every password of the topology's URLs from a text that might quote one.
    pub(crate) fn scrub(&self, text: &str) -> String {
        self.urls()
            .iter()
            .fold(text.to_owned(), |text, url| url.scrub(&text))
    }

    fn urls(&self) -> &[RedisUrl] {
        match self {
            Self::Single(url) => std::slice::from_ref(url),
            Self::Cluster(urls)
            | Self::Sentinel {
                sentinels: urls, ..
            } => urls,
        }
    }
}

impl fmt::Display for RedisTopology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |urls: &[RedisUrl]| {
            urls.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        match self {
            Self::Single(url) => write!(f, "Redis at {url}"),
            Self::Cluster(seeds) => write!(f, "Redis Cluster at {}", list(seeds)),
            Self::Sentinel { sentinels, master } => {
                write!(f, "Redis primary {master} of sentinels {}", list(sentinels))
            }
        }
    }
}

#[cfg(test)]
mod tests;
