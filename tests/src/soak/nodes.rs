//! Runs the soak's three observers, one per simulated node, and what is read from each per
//! interval: resident memory and CPU from `/proc/PID`, the kernel tables' entries from the
//! process's own maps, the engine's tables and the ring drops from its `/metrics`.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use aya::maps::{MapData, MapInfo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::observed::{ObserverOutput, ObserverProcess};
use crate::redis_server::free_port;
use crate::{Lab, kernel_tables};

/// Names the kernel's hash tables with one entry per connection, socket or call in flight: all of
/// them must be empty once the lab's sockets are gone.
pub const KERNEL_TABLES: [&str; 6] = [
    "CONNECTIONS",
    "SOCKETS",
    "PACKET_STREAMS",
    "ADOPTABLE",
    "PENDING_CONNECTS",
    "IN_FLIGHT",
];
/// Bounds how long a scrape of `/metrics` may take before the sample counts it as missing.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// Holds one node's observer: the process, where its metrics are served, its maps.
pub struct NodeObserver {
    pub name: String,
    pub process: ObserverProcess,
    pub pid: u32,
    metrics_addr: String,
    tables: KernelTables,
    /// CPU ticks (user + system) at the previous sample.
    last_ticks: u64,
}

/// Records what one observer held at one sample.
#[derive(Clone, Debug, Default)]
pub struct NodeSample {
    pub rss_kib: u64,
    /// Percent of one core since the previous sample.
    pub cpu_percent: f64,
    /// Entries over every table of [`KERNEL_TABLES`], and per table.
    pub kernel_entries: usize,
    pub kernel_by_table: Vec<(String, usize)>,
    pub connections: f64,
    pub users: f64,
    pub ring_drops: f64,
    /// Facts for Redis dropped (full queue) or lost (a batch Redis did not take).
    pub facts_dropped: f64,
    pub running: bool,
}

impl NodeObserver {
    /// Starts `node`'s observer scoped to its cgroup in `lab`, sharing `redis_url`, with its
    /// stderr appended to a file in `out_dir` (a pipe nobody reads would fill up over a long
    /// run) and its metrics on a free loopback port.
    ///
    /// # Errors
    ///
    /// Fails when the lab has a single node, the cgroup path is not UTF-8, no free port is found,
    /// the stderr file cannot be opened, or the observer does not start or its process and maps
    /// cannot be found.
    pub fn start(
        binary: &Path,
        lab: &Lab,
        node: usize,
        redis_url: &str,
        extra: &[&str],
        out_dir: &Path,
    ) -> anyhow::Result<Self> {
        let name = Lab::node_name(node);
        let scope = lab
            .node_cgroup(node)
            .context("the soak's lab has more than one node")?
            .to_str()
            .context("cgroup path is not UTF-8")?
            .to_owned();
        let metrics_addr = format!("127.0.0.1:{}", free_port()?);
        let stderr = out_dir.join(format!("{name}.stderr"));
        let mut command = Command::new("sh");
        command
            .args(["-c", "exec \"$0\" \"$@\" 2>>\"$SOAK_STDERR\""])
            .arg(binary)
            .env("SOAK_STDERR", &stderr);
        let mut args = vec![
            "--grpc-port",
            "88",
            "--ws-port",
            "80",
            "--cgroup-scope",
            &scope,
            "--node-name",
            &name,
            "--redis-url",
            redis_url,
            "--metrics-addr",
            &metrics_addr,
        ];
        args.extend_from_slice(extra);
        let process = ObserverProcess::spawn(command, &args)
            .with_context(|| format!("{name}'s observer (stderr in {})", stderr.display()))?;
        let pid = observer_pid(&metrics_addr)?;
        let tables = KernelTables::of(pid)?;
        Ok(Self {
            name,
            process,
            pid,
            metrics_addr,
            tables,
            last_ticks: cpu_ticks(pid).unwrap_or(0),
        })
    }

    /// Reads what the observer holds now; CPU is the share of one core since the last call.
    pub async fn sample(&mut self, since_last: Duration) -> NodeSample {
        let running = self.process.is_running();
        let ticks = cpu_ticks(self.pid).unwrap_or(self.last_ticks);
        let spent = ticks.saturating_sub(self.last_ticks) as f64 / clock_ticks_per_second();
        self.last_ticks = ticks;
        let kernel_by_table = self.tables.entries();
        let scraped = scrape(&self.metrics_addr).await.unwrap_or_default();
        let metric = |name: &str| metric(&scraped, name).unwrap_or(f64::NAN);
        NodeSample {
            rss_kib: rss_kib(self.pid).unwrap_or(0),
            cpu_percent: 100.0 * spent / since_last.as_secs_f64().max(0.001),
            kernel_entries: kernel_by_table.iter().map(|(_, count)| count).sum(),
            kernel_by_table,
            connections: metric("openim_observer_connections_tracked"),
            users: metric("openim_observer_users_tracked"),
            ring_drops: metric("openim_observer_kernel_total{kind=\"ring_full_drops\"}"),
            facts_dropped: metric("openim_observer_redis_facts_dropped_total")
                + metric("openim_observer_redis_facts_lost_total"),
            running,
        }
    }

    /// Stops the observer (SIGINT) and returns what it printed; its stderr is in the file.
    ///
    /// # Errors
    ///
    /// Fails when the observer exits unsuccessfully; the error names the node.
    pub fn stop(self) -> anyhow::Result<ObserverOutput> {
        let name = self.name;
        self.process
            .stop()
            .with_context(|| format!("{name}'s observer"))
    }
}

/// Finds the pid of the observer serving `metrics_addr` (found by its command line: `sh` execs it,
/// and other observers may run on this machine).
fn observer_pid(metrics_addr: &str) -> anyhow::Result<u32> {
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|&byte| byte == 0).collect();
        if args.contains(&&b"run"[..]) && args.contains(&metrics_addr.as_bytes()) {
            return Ok(pid);
        }
    }
    bail!("no observer process serves {metrics_addr}")
}

/// Reads the `VmRSS` of `pid`, in KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Reads the user and system CPU of `pid` in clock ticks (`utime` + `stime` of `/proc/PID/stat`).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) start with the state, field 3.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// Scrapes the `/metrics` page at `addr` (plain text format), or `None` when it does not answer.
async fn scrape(addr: &str) -> Option<String> {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: observer\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        response.starts_with("HTTP/1.1 200").then_some(response)
    };
    tokio::time::timeout(SCRAPE_TIMEOUT, fetch).await.ok()?
}

/// Returns the value of the series `name` (labels included) in a scraped page.
pub fn metric(scraped: &str, name: &str) -> Option<f64> {
    scraped.lines().find_map(|line| {
        line.strip_prefix(name)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Opens the [`KERNEL_TABLES`] of one observer process, by the maps it holds.
struct KernelTables {
    maps: Vec<(String, MapData, MapInfo)>,
}

impl KernelTables {
    fn of(pid: u32) -> anyhow::Result<Self> {
        let maps = kernel_tables::observer_tables(pid, &KERNEL_TABLES)?;
        if !maps.iter().any(|(name, ..)| name == "CONNECTIONS") {
            bail!("observer {pid} holds no CONNECTIONS map");
        }
        Ok(Self { maps })
    }

    /// Counts each table's entries.
    fn entries(&self) -> Vec<(String, usize)> {
        self.maps
            .iter()
            .map(|(name, map, info)| (name.clone(), kernel_tables::keys(map, info).len()))
            .collect()
    }
}
