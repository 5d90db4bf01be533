//! Cluster mode: the observers of one cluster, one per node, share what the engine needs
//! through Redis, so a join whose halves were seen on different nodes (the proxy's placement
//! here, push's call there) still completes, and a restarted observer finds the placements made
//! before it started.
//!
//! Without `--redis-url` nothing here runs and the observer works alone.
//!
//! - [`keys`]: the key schema (prefix, hash tags, TTLs) and the values stored: placements, ring
//!   evidence, push outcomes and dedup claims; never a token, never message content.
//! - [`link`]: between the engine and the store: facts out, placement lookups and dedup
//!   claims through a worker task, `capture_degraded` when Redis is lost and back.
//! - [`recovery`]: after a restart, which stored placements' connections the kernel still holds.
//! - [`store`]: the client: a writer task fed by a bounded queue (pipelined batches; a full
//!   queue drops and counts), reads with a deadline, a health probe, and the metrics.

pub mod keys;
pub mod link;
pub mod recovery;
pub mod store;
mod writer;

use std::{fmt, path::PathBuf};

use clap::Args;
use thiserror::Error;

pub use keys::{ConnectionKey, Keys, PushOutcome, RingSide, SharedPlacement};
pub use link::ClusterLink;
pub use store::{SharedState, StoreHealth, StoreMetrics};

/// The environment variable read for the Redis URL when neither flag gives one, so a Kubernetes
/// Secret can hold the credentials (`env.valueFrom.secretKeyRef`).
pub const REDIS_URL_ENV: &str = "OPENIM_OBSERVER_REDIS_URL";

#[derive(Debug, Error)]
pub enum ClusterError {
    #[error("--redis-url-file {path}: {source}")]
    UrlFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--redis-url-file {path} is empty")]
    EmptyUrlFile { path: PathBuf },
    /// The text never repeats the URL: it may hold a password.
    #[error(
        "invalid Redis URL ({reason}); expected redis://[USER:PASSWORD@]HOST[:PORT][/DB] or rediss://…"
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
    /// Without any of them the observer works alone.
    #[arg(long, value_name = "URL")]
    pub redis_url: Option<String>,
    /// A file holding the Redis URL (a mounted Secret), read once at start.
    #[arg(long, value_name = "FILE", conflicts_with = "redis_url")]
    pub redis_url_file: Option<PathBuf>,
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

/// Cluster mode's settings, resolved from the flags, a file and the environment.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub url: RedisUrl,
    pub prefix: String,
    pub node: String,
    pub queue_capacity: usize,
}

impl ClusterArgs {
    /// `None` when no Redis URL is given anywhere: single-node mode.
    pub fn resolve(&self) -> Result<Option<ClusterConfig>, ClusterError> {
        let from_env = || {
            std::env::var(REDIS_URL_ENV)
                .ok()
                .filter(|url| !url.is_empty())
        };
        let url = match (&self.redis_url, &self.redis_url_file) {
            (Some(url), _) => url.clone(),
            (None, Some(path)) => read_url_file(path)?,
            (None, None) => match from_env() {
                Some(url) => url,
                None => return Ok(None),
            },
        };
        if self.redis_prefix.is_empty() {
            return Err(ClusterError::EmptyPrefix);
        }
        let node = match &self.node_name {
            Some(name) if !name.trim().is_empty() => name.trim().to_owned(),
            _ => hostname().ok_or(ClusterError::NoNodeName)?,
        };
        Ok(Some(ClusterConfig {
            url: RedisUrl::parse(&url)?,
            prefix: self.redis_prefix.clone(),
            node,
            queue_capacity: self.redis_queue.max(1),
        }))
    }
}

fn read_url_file(path: &PathBuf) -> Result<String, ClusterError> {
    let text = std::fs::read_to_string(path).map_err(|source| ClusterError::UrlFile {
        path: path.clone(),
        source,
    })?;
    let url = text.trim();
    if url.is_empty() {
        return Err(ClusterError::EmptyUrlFile { path: path.clone() });
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

/// A Redis URL that may hold a password: `Display` and `Debug` show it without one
/// (`rediss://observer@redis:6380/0`), so logs and errors never carry it.
#[derive(Clone)]
pub struct RedisUrl {
    secret: String,
    redacted: String,
}

impl RedisUrl {
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
        })
    }

    /// The URL with its credentials, for the client only.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(url: Option<&str>) -> ClusterArgs {
        ClusterArgs {
            redis_url: url.map(str::to_owned),
            redis_url_file: None,
            redis_prefix: keys::DEFAULT_PREFIX.to_owned(),
            node_name: Some("node-a".to_owned()),
            redis_queue: 16,
        }
    }

    #[test]
    fn the_password_never_shows() {
        let url = RedisUrl::parse("redis://observer:s3cret-pw@redis.chat:6380/2").unwrap();
        assert_eq!(url.to_string(), "redis://observer@redis.chat:6380/2");
        assert!(!format!("{url:?}").contains("s3cret-pw"));
        assert_eq!(
            url.scrub("failed: redis://observer:s3cret-pw@x"),
            "failed: redis://observer:***@x"
        );
        let tls = RedisUrl::parse("rediss://:pw@redis:6390").unwrap();
        assert_eq!(tls.to_string(), "rediss://redis:6390/0");
    }

    #[test]
    fn bad_urls_are_refused_without_echoing_them() {
        for bad in [
            "http://user:pw@host",
            "redis-pw-host",
            "unix:///tmp/redis.sock",
        ] {
            let error = RedisUrl::parse(bad).unwrap_err().to_string();
            assert!(!error.contains("pw"), "{error}");
            assert!(error.starts_with("invalid Redis URL"), "{error}");
        }
    }

    #[test]
    fn the_url_comes_from_the_flag_then_the_file() {
        if std::env::var_os(REDIS_URL_ENV).is_none() {
            assert!(args(None).resolve().unwrap().is_none());
        }
        let config = args(Some("redis://127.0.0.1:7000"))
            .resolve()
            .unwrap()
            .unwrap();
        assert_eq!(config.node, "node-a");
        assert_eq!(config.url.to_string(), "redis://127.0.0.1:7000/0");

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("url");
        std::fs::write(&path, "redis://u:p@10.0.0.1:6379/1\n").unwrap();
        let mut from_file = args(None);
        from_file.redis_url_file = Some(path.clone());
        let config = from_file.resolve().unwrap().unwrap();
        assert_eq!(config.url.to_string(), "redis://u@10.0.0.1:6379/1");

        std::fs::write(&path, "  \n").unwrap();
        assert!(matches!(
            from_file.resolve(),
            Err(ClusterError::EmptyUrlFile { .. })
        ));
    }

    #[test]
    fn the_node_defaults_to_the_hostname() {
        let mut unnamed = args(Some("redis://127.0.0.1"));
        unnamed.node_name = None;
        let config = unnamed.resolve().unwrap().unwrap();
        assert_eq!(Some(config.node), hostname());
    }
}
