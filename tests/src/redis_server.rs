//! Runs a real `redis-server` for cluster mode (Debian's `redis-server` package; `cargo xtask test`
//! and `.ci/run` install it): started on a free loopback port with a temporary directory, no
//! persistence, and removed when dropped. Tests kill and restart it to play Redis faults.

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

/// Bounds how long a started server may take to answer PING.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Lists the commands docs/install.md grants the observer's ACL user on one server or a
/// Sentinel-managed primary (besides `+role` there): what an [`AclUser`] may run.
pub const OBSERVER_ACL_COMMANDS: &str = "-@all +ping +hset +hdel +hgetall +hget +pexpire +lpush +ltrim +lrange +lindex +set +get +incrby";

/// Names an ACL user the server is started with (the default user is then disabled), limited to
/// keys under `prefix` and to [`OBSERVER_ACL_COMMANDS`]: how an observer shares OpenIM's own
/// Redis.
#[derive(Clone, Debug)]
pub struct AclUser {
    pub name: String,
    pub password: String,
    pub prefix: String,
}

/// Holds a running `redis-server`, its port, directory and settings.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    acl: Option<AclUser>,
    /// Arguments after the common ones: a Redis Cluster node's or a replica's settings.
    extra: Vec<String>,
    /// A configuration file (in `dir`) the server starts from and may rewrite: a sentinel's.
    config: Option<String>,
}

impl RedisServer {
    /// Starts a server on a free port, with the default user.
    ///
    /// # Errors
    ///
    /// Fails when the server's directory or port cannot be set up, or `redis-server` does not
    /// start, exits, or does not answer PING within 10 s.
    pub fn start() -> Result<Self> {
        Self::start_with(None)
    }

    /// Starts a server on a free port, as `acl` when given (the default user then disabled).
    ///
    /// # Errors
    ///
    /// Fails when the server's directory or port cannot be set up, or `redis-server` does not
    /// start, exits, or does not answer PING within 10 s.
    pub fn start_with(acl: Option<AclUser>) -> Result<Self> {
        Self::launch(acl, Vec::new(), None)
    }

    /// Starts a server with `extra` arguments (e.g. `--replicaof`, `--cluster-enabled yes`), on a
    /// free port, or on `port` when given.
    ///
    /// # Errors
    ///
    /// Fails when the server's directory or port cannot be set up, or `redis-server` does not
    /// start, exits, or does not answer PING within 10 s.
    pub fn start_args(extra: Vec<String>, port: Option<u16>) -> Result<Self> {
        Self::launch_on(None, extra, None, port)
    }

    /// Starts a sentinel (`redis-server FILE --sentinel`) whose configuration file holds `config`
    /// after its `port` line.
    ///
    /// # Errors
    ///
    /// Fails when the server's directory or port cannot be set up, or `redis-server` does not
    /// start, exits, or does not answer PING within 10 s.
    pub fn start_sentinel(config: &str) -> Result<Self> {
        Self::launch(None, vec!["--sentinel".to_owned()], Some(config.to_owned()))
    }

    fn launch(acl: Option<AclUser>, extra: Vec<String>, config: Option<String>) -> Result<Self> {
        Self::launch_on(acl, extra, config, None)
    }

    fn launch_on(
        acl: Option<AclUser>,
        extra: Vec<String>,
        config: Option<String>,
        port: Option<u16>,
    ) -> Result<Self> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "openim-lab-redis-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let port = match port {
            Some(port) => port,
            None => free_port()?,
        };
        if let Some(config) = &config {
            std::fs::write(dir.join("redis.conf"), format!("port {port}\n{config}\n"))
                .context("writing the server's configuration")?;
        }
        let mut server = Self {
            child: None,
            port,
            dir,
            acl,
            extra,
            config,
        };
        server.restart()?;
        Ok(server)
    }

    /// Returns the server's URL, `redis://[USER:PASSWORD@]127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        match &self.acl {
            Some(user) => format!(
                "redis://{}:{}@127.0.0.1:{}",
                user.name, user.password, self.port
            ),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// Returns the server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server (SIGKILL: nothing saved, clients see resets) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again, empty, on the same port.
    ///
    /// # Errors
    ///
    /// Fails when `redis-server` does not start, exits, or does not answer PING within 10 s.
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        let mut command = Command::new("redis-server");
        if self.config.is_some() {
            command.arg(self.dir.join("redis.conf"));
        }
        command
            .args(["--bind", "127.0.0.1", "--port"])
            .arg(self.port.to_string())
            .arg("--dir")
            .arg(&self.dir)
            .args([
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
                "--logfile",
                "redis.log",
            ])
            .args(&self.extra);
        if let Some(user) = &self.acl {
            command.args(["--user", "default", "off"]).args([
                "--user",
                &user.name,
                "on",
                &format!(">{}", user.password),
                &format!("~{}*", user.prefix),
            ]);
            command.args(OBSERVER_ACL_COMMANDS.split(' '));
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .context("could not start redis-server (install it: apt-get install redis-server)")?;
        self.child = Some(child);
        let started = Instant::now();
        while started.elapsed() < READY_TIMEOUT {
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
                bail!("redis-server exited with {status}: {}", log.trim());
            }
            if self.ping().is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!(
            "redis-server did not answer on port {} within {READY_TIMEOUT:?}",
            self.port
        )
    }

    /// Sends PING (after AUTH with the ACL user), over a plain socket.
    fn ping(&self) -> Result<()> {
        let address = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let mut stream = TcpStream::connect_timeout(&address, Duration::from_millis(200))?;
        stream.set_read_timeout(Some(Duration::from_millis(500)))?;
        if let Some(user) = &self.acl {
            write!(stream, "AUTH {} {}\r\n", user.name, user.password)?;
            expect_line(&mut stream, "+OK")?;
        }
        stream.write_all(b"PING\r\n")?;
        expect_line(&mut stream, "+PONG")
    }

    /// Opens a synchronous client, as the ACL user when there is one.
    ///
    /// # Errors
    ///
    /// Fails when the URL is refused or the server cannot be reached within 2 s.
    pub fn client(&self) -> Result<redis::Connection> {
        let client = redis::Client::open(self.url())?;
        Ok(client.get_connection_with_timeout(Duration::from_secs(2))?)
    }

    /// Returns one section of `INFO` (`memory`, `stats`, `commandstats`, …) as its `name:value`
    /// lines.
    ///
    /// # Errors
    ///
    /// Fails when the server cannot be reached or the command fails.
    pub fn info(&self, section: &str) -> Result<BTreeMap<String, String>> {
        let text: String = redis::cmd("INFO").arg(section).query(&mut self.client()?)?;
        Ok(text
            .lines()
            .filter_map(|line| line.split_once(':'))
            .map(|(name, value)| (name.to_owned(), value.trim().to_owned()))
            .collect())
    }

    /// Zeroes the server's statistics (`CONFIG RESETSTAT`), so `INFO stats` and
    /// `INFO commandstats` count from here.
    ///
    /// # Errors
    ///
    /// Fails when the server cannot be reached or the command fails.
    pub fn reset_stats(&self) -> Result<()> {
        Ok(redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut self.client()?)?)
    }

    /// Returns every key with its remaining TTL in milliseconds (-1: none) and its whole content as
    /// text, for checks that every key expires and that no secret was stored.
    ///
    /// # Errors
    ///
    /// Fails when the server cannot be reached, a command fails, or a key has a type this does not
    /// read.
    pub fn dump(&self) -> Result<Vec<StoredKey>> {
        let mut connection = self.client()?;
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut connection)?;
        let mut dump = Vec::with_capacity(keys.len());
        for key in keys {
            let kind: String = redis::cmd("TYPE").arg(&key).query(&mut connection)?;
            let ttl_ms: i64 = redis::cmd("PTTL").arg(&key).query(&mut connection)?;
            let content: Vec<String> = match kind.as_str() {
                "string" => vec![redis::cmd("GET").arg(&key).query(&mut connection)?],
                "hash" => redis::cmd("HGETALL").arg(&key).query(&mut connection)?,
                "list" => redis::cmd("LRANGE")
                    .arg(&key)
                    .arg(0)
                    .arg(-1)
                    .query(&mut connection)?,
                "set" => redis::cmd("SMEMBERS").arg(&key).query(&mut connection)?,
                "none" => continue,
                other => bail!("unexpected Redis type {other} for {key}"),
            };
            dump.push(StoredKey {
                key,
                kind,
                ttl_ms,
                content: content.join("\n"),
            });
        }
        dump.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(dump)
    }
}

/// Holds one key as [`RedisServer::dump`] found it.
#[derive(Clone, Debug)]
pub struct StoredKey {
    pub key: String,
    pub kind: String,
    pub ttl_ms: i64,
    pub content: String,
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn expect_line(stream: &mut TcpStream, expected: &str) -> Result<()> {
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    while !answer.ends_with(b"\r\n") && answer.len() < 256 {
        if stream.read(&mut byte)? == 0 {
            break;
        }
        answer.push(byte[0]);
    }
    let answer = String::from_utf8_lossy(&answer);
    if answer.trim_end() == expected {
        Ok(())
    } else {
        bail!("redis answered {:?}", answer.trim_end())
    }
}

/// Returns a loopback port nothing listens on right now.
///
/// # Errors
///
/// Fails when no loopback port can be bound.
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}
