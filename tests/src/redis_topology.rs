//! Runs the Redis topologies cluster mode supports, from real `redis-server` processes on free
//! loopback ports: a Redis Cluster of three primaries and three replicas made by
//! `redis-cli --cluster create`, and a primary with one replica watched by three sentinels
//! (`redis-server FILE --sentinel`). Tests kill a primary and wait for its replica's promotion.
//! [`SharedRedis`] is any of them (or one server) as the observers' flags name it.

use std::{
    collections::BTreeSet,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::redis_server::{RedisServer, free_port};

/// Bounds how long a cluster may take to form or a failover to complete.
const FORM_TIMEOUT: Duration = Duration::from_secs(30);
/// Bounds how long a node may be unreachable before it is failed over: small, so tests stay short.
const NODE_TIMEOUT_MS: u32 = 1_000;
/// Names the master the sentinels monitor.
pub const SENTINEL_MASTER: &str = "observer";

/// Holds a Redis Cluster: three primaries, one replica each.
pub struct RedisCluster {
    /// In creation order: the first three are the primaries `redis-cli` made.
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts six nodes, makes them a cluster and waits until every slot is served and every
    /// primary has a replica in sync.
    ///
    /// # Errors
    ///
    /// Fails when a node does not start, `redis-cli --cluster create` fails, or the cluster is not
    /// whole within 30 s.
    pub fn start() -> Result<Self> {
        let mut nodes = Vec::new();
        for _ in 0..6 {
            let bus = free_port()?;
            nodes.push(RedisServer::start_args(
                [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    &NODE_TIMEOUT_MS.to_string(),
                    "--cluster-port",
                    &bus.to_string(),
                ]
                .map(str::to_owned)
                .to_vec(),
                None,
            )?);
        }
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port()));
        }
        let output = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .context("running redis-cli --cluster create")?;
        if !output.status.success() {
            bail!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&output.stdout)
            );
        }
        let cluster = Self { nodes };
        cluster.wait_until(|cluster| {
            Ok(cluster.state_ok()?
                && cluster.primaries()?.len() == 3
                && cluster.replicas_in_sync()? == 3)
        })?;
        Ok(cluster)
    }

    /// Returns the seed nodes as `--redis-cluster` takes them: every node's URL, comma-separated.
    pub fn seeds(&self) -> String {
        self.nodes
            .iter()
            .map(RedisServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Returns a node still running, to ask about the cluster.
    fn any(&self) -> Result<&RedisServer> {
        self.nodes
            .iter()
            .find(|node| node.client().is_ok())
            .context("no cluster node answers")
    }

    fn state_ok(&self) -> Result<bool> {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut self.any()?.client()?)?;
        Ok(info.contains("cluster_state:ok"))
    }

    /// Returns the ports of the nodes serving slots now (`CLUSTER SLOTS`).
    ///
    /// # Errors
    ///
    /// Fails when no node is running or `CLUSTER SLOTS` fails.
    pub fn primaries(&self) -> Result<BTreeSet<u16>> {
        Ok(self.slots()?.into_iter().map(|(_, _, port)| port).collect())
    }

    /// Returns `(first slot, last slot, primary's port)` per range.
    fn slots(&self) -> Result<Vec<(u16, u16, u16)>> {
        let ranges: Vec<redis::Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut self.any()?.client()?)?;
        let mut slots = Vec::new();
        for range in ranges {
            let redis::Value::Array(parts) = range else {
                bail!("CLUSTER SLOTS: not an array");
            };
            let number = |value: &redis::Value| -> Result<u16> {
                Ok(u16::try_from(redis::from_redis_value_ref::<i64>(value)?)?)
            };
            let (Some(first), Some(last), Some(redis::Value::Array(primary))) =
                (parts.first(), parts.get(1), parts.get(2))
            else {
                bail!("CLUSTER SLOTS: an unexpected range");
            };
            let port = primary.get(1).context("CLUSTER SLOTS: no port")?;
            slots.push((number(first)?, number(last)?, number(port)?));
        }
        Ok(slots)
    }

    /// Returns the slot of `key` (`CLUSTER KEYSLOT`).
    ///
    /// # Errors
    ///
    /// Fails when no node is running or `CLUSTER KEYSLOT` fails.
    pub fn slot_of(&self, key: &str) -> Result<u16> {
        Ok(redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut self.any()?.client()?)?)
    }

    /// Returns the port of the primary serving `slot`.
    ///
    /// # Errors
    ///
    /// Fails when the slots cannot be read or no primary serves `slot`.
    pub fn primary_of(&self, slot: u16) -> Result<u16> {
        self.slots()?
            .into_iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .map(|(_, _, port)| port)
            .context("slot not served")
    }

    /// Counts the replicas whose link to their primary is up.
    fn replicas_in_sync(&self) -> Result<usize> {
        let mut count = 0;
        for node in &self.nodes {
            if let Ok(info) = node.info("replication")
                && info.get("role").map(String::as_str) == Some("slave")
                && info.get("master_link_status").map(String::as_str) == Some("up")
            {
                count += 1;
            }
        }
        Ok(count)
    }

    /// Kills the primary serving `slot` (SIGKILL) and returns its port, without waiting for its
    /// replica.
    ///
    /// # Errors
    ///
    /// Fails when no primary serves `slot` or it is not one of the nodes.
    pub fn kill_primary(&mut self, slot: u16) -> Result<u16> {
        let port = self.primary_of(slot)?;
        let node = self
            .nodes
            .iter_mut()
            .find(|node| node.port() == port)
            .context("the primary is not one of the nodes")?;
        node.kill();
        Ok(port)
    }

    /// Waits until another node than `killed` serves `slot` and the cluster is whole again.
    ///
    /// # Errors
    ///
    /// Fails when that takes more than 30 s.
    pub fn wait_failed_over(&self, slot: u16, killed: u16) -> Result<()> {
        self.wait_until(|cluster| {
            Ok(cluster.primary_of(slot).is_ok_and(|now| now != killed) && cluster.state_ok()?)
        })
    }

    /// Hands the slot's primary role to its replica (`CLUSTER FAILOVER`, which loses no write)
    /// and waits until the replica serves it and the cluster is whole. Returns the new primary's
    /// port. No client request fails meanwhile: clients see only a `MOVED`.
    ///
    /// # Errors
    ///
    /// Fails when the slot has no replica, the replica refuses, or the cluster is not whole again
    /// within 30 s.
    pub fn hand_over(&self, slot: u16) -> Result<u16> {
        let primary = self.primary_of(slot)?;
        let replica = self
            .nodes
            .iter()
            .find(|node| {
                node.port() != primary
                    && node.info("replication").is_ok_and(|info| {
                        info.get("master_port")
                            .is_some_and(|port| port == &primary.to_string())
                    })
            })
            .context("the slot's primary has no replica")?;
        let _: String = redis::cmd("CLUSTER")
            .arg("FAILOVER")
            .query(&mut replica.client()?)?;
        let port = replica.port();
        self.wait_until(|cluster| Ok(cluster.primary_of(slot)? == port && cluster.state_ok()?))?;
        Ok(port)
    }

    /// Deletes `key` on the primary serving it, behind its clients' backs.
    ///
    /// # Errors
    ///
    /// Fails when the key's primary cannot be found or reached.
    pub fn delete(&self, key: &str) -> Result<()> {
        let port = self.primary_of(self.slot_of(key)?)?;
        let node = self
            .nodes
            .iter()
            .find(|node| node.port() == port)
            .context("the primary is not one of the nodes")?;
        let _: i64 = redis::cmd("DEL").arg(key).query(&mut node.client()?)?;
        Ok(())
    }

    /// Returns every key on every primary, and its slot, as `(slot, primary's port, key)`.
    ///
    /// # Errors
    ///
    /// Fails when a primary cannot be reached or a command fails.
    pub fn keys(&self) -> Result<Vec<(u16, u16, String)>> {
        let primaries = self.primaries()?;
        let mut keys = Vec::new();
        for node in self
            .nodes
            .iter()
            .filter(|node| primaries.contains(&node.port()))
        {
            let mut client = node.client()?;
            let names: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut client)?;
            for key in names {
                let slot: u16 = redis::cmd("CLUSTER")
                    .arg("KEYSLOT")
                    .arg(&key)
                    .query(&mut client)?;
                keys.push((slot, node.port(), key));
            }
        }
        keys.sort();
        Ok(keys)
    }

    /// Returns every key's content on every primary, for the checks that no secret was stored.
    ///
    /// # Errors
    ///
    /// Fails when a primary cannot be reached or its keys cannot be read.
    pub fn dump(&self) -> Result<String> {
        let primaries = self.primaries()?;
        let mut dump = Vec::new();
        for node in self
            .nodes
            .iter()
            .filter(|node| primaries.contains(&node.port()))
        {
            for stored in node.dump()? {
                dump.push(format!("{} {}", stored.key, stored.content));
            }
        }
        Ok(dump.join("\n"))
    }

    fn wait_until(&self, done: impl Fn(&Self) -> Result<bool>) -> Result<()> {
        wait(|| done(self), "the Redis Cluster")
    }
}

/// Holds a primary, its replica and three sentinels monitoring it as [`SENTINEL_MASTER`].
pub struct RedisSentinels {
    /// The first primary, then its replica.
    servers: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
}

impl RedisSentinels {
    /// Starts them and waits until every sentinel knows the replica and the other sentinels.
    ///
    /// # Errors
    ///
    /// Fails when a server or sentinel does not start, a command fails, or the sentinels do not
    /// know each other and the replica within 30 s.
    pub fn start() -> Result<Self> {
        let primary = RedisServer::start()?;
        let replica = RedisServer::start_args(
            vec![
                "--replicaof".to_owned(),
                "127.0.0.1".to_owned(),
                primary.port().to_string(),
            ],
            None,
        )?;
        let config = format!(
            "sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {} 2\n\
             sentinel down-after-milliseconds {SENTINEL_MASTER} {NODE_TIMEOUT_MS}\n\
             sentinel failover-timeout {SENTINEL_MASTER} 5000",
            primary.port()
        );
        let sentinels = (0..3)
            .map(|_| RedisServer::start_sentinel(&config))
            .collect::<Result<Vec<_>>>()?;
        let topology = Self {
            servers: vec![primary, replica],
            sentinels,
        };
        wait(
            || {
                let mut ready = true;
                for sentinel in &topology.sentinels {
                    let mut client = sentinel.client()?;
                    let replicas: Vec<redis::Value> = redis::cmd("SENTINEL")
                        .arg("REPLICAS")
                        .arg(SENTINEL_MASTER)
                        .query(&mut client)?;
                    let others: Vec<redis::Value> = redis::cmd("SENTINEL")
                        .arg("SENTINELS")
                        .arg(SENTINEL_MASTER)
                        .query(&mut client)?;
                    ready &= replicas.len() == 1 && others.len() == 2;
                }
                Ok(ready)
            },
            "the sentinels",
        )?;
        Ok(topology)
    }

    /// Returns the sentinels as `--redis-sentinel` takes them, comma-separated.
    pub fn urls(&self) -> String {
        self.sentinels
            .iter()
            .map(RedisServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Returns the port of the primary the sentinels name now.
    ///
    /// # Errors
    ///
    /// Fails when no sentinel answers.
    pub fn primary(&self) -> Result<u16> {
        let sentinel = self
            .sentinels
            .iter()
            .find(|sentinel| sentinel.client().is_ok())
            .context("no sentinel answers")?;
        let (_, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(SENTINEL_MASTER)
            .query(&mut sentinel.client()?)?;
        Ok(port)
    }

    /// Returns the server the sentinels name primary now.
    ///
    /// # Errors
    ///
    /// Fails when no sentinel answers or the primary it names is not one of the servers.
    pub fn primary_server(&self) -> Result<&RedisServer> {
        let port = self.primary()?;
        self.servers
            .iter()
            .find(|server| server.port() == port)
            .context("the primary is not one of the servers")
    }

    /// Kills the primary and returns its port, without waiting for the sentinels.
    ///
    /// # Errors
    ///
    /// Fails when no sentinel answers.
    pub fn kill_primary(&mut self) -> Result<u16> {
        let port = self.primary()?;
        if let Some(server) = self.servers.iter_mut().find(|server| server.port() == port) {
            server.kill();
        }
        Ok(port)
    }

    /// Waits until the sentinels name another primary than `killed` and it says it is one.
    ///
    /// # Errors
    ///
    /// Fails when no sentinel answers, or the replica is not promoted within 30 s.
    pub fn wait_failed_over(&self, killed: u16) -> Result<()> {
        wait(
            || {
                let now = self.primary()?;
                let promoted = self.servers.iter().find(|server| server.port() == now);
                Ok(now != killed
                    && promoted.is_some_and(|server| {
                        server.info("replication").is_ok_and(|info| {
                            info.get("role").map(String::as_str) == Some("master")
                        })
                    }))
            },
            "the sentinels' failover",
        )
    }
}

/// Polls `done` until it says true (errors count as not yet) within [`FORM_TIMEOUT`].
fn wait(mut done: impl FnMut() -> Result<bool>, what: &str) -> Result<()> {
    let started = Instant::now();
    let mut last = None;
    while started.elapsed() < FORM_TIMEOUT {
        match done() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(error) => last = Some(error),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("{what} not ready within {FORM_TIMEOUT:?} (last error: {last:?})")
}

/// Names the Redis the observers of a test share.
pub enum SharedRedis {
    Single(RedisServer),
    Cluster(RedisCluster),
    Sentinel(RedisSentinels),
}

impl SharedRedis {
    /// Returns the observer's flags naming this Redis.
    pub fn observer_args(&self) -> Vec<String> {
        let args: [&str; 2] = match self {
            Self::Single(_) => ["--redis-url", ""],
            Self::Cluster(_) => ["--redis-cluster", ""],
            Self::Sentinel(_) => ["--redis-sentinel", ""],
        };
        let value = match self {
            Self::Single(server) => server.url(),
            Self::Cluster(cluster) => cluster.seeds(),
            Self::Sentinel(sentinels) => sentinels.urls(),
        };
        let mut flags = vec![args[0].to_owned(), value];
        if let Self::Sentinel(_) = self {
            flags.extend([
                "--redis-sentinel-master".to_owned(),
                SENTINEL_MASTER.to_owned(),
            ]);
        }
        flags
    }

    /// Returns the one server, for tests that kill and restart it.
    pub fn single(&mut self) -> &mut RedisServer {
        match self {
            Self::Single(server) => server,
            _ => panic!("not a single redis-server"),
        }
    }

    /// Returns every key and its content, one line each.
    ///
    /// # Errors
    ///
    /// Fails when a server cannot be reached or its keys cannot be read.
    pub fn dump(&self) -> Result<String> {
        let server = match self {
            Self::Single(server) => server,
            Self::Cluster(cluster) => return cluster.dump(),
            Self::Sentinel(sentinels) => sentinels.primary_server()?,
        };
        Ok(server
            .dump()?
            .iter()
            .map(|stored| format!("{} {}", stored.key, stored.content))
            .collect::<Vec<_>>()
            .join("\n"))
    }
}
