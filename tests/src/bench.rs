//! What watching costs (`openim-lab bench`, run by `cargo xtask bench`): figures, never a
//! verdict, since speed on a shared machine is no test.
//!
//! 1. Push throughput and latency of the lab's push loop (a new gRPC connection per call to
//!    gateways on port 88, so every gateway connection is watched) with no watcher, with the real
//!    observer, and with a `bpftrace` script doing comparable work as a peer reference. Rounds
//!    interleave the three and rotate their order, so drift on the machine spreads over all.
//!    Each round is a pair (a watcher against no watcher in the same round): the report gives the
//!    ratio of every pair and their median, never an average of rounds. A segment starts only
//!    once the previous watcher has exited and the CPUs are idle again (bounded wait); a segment
//!    that started on a busy machine is flagged noisy and its pair left out of the ratios.
//!    A second no-watcher segment in every round (the control, at its own place in the order)
//!    pairs with the first as a watcher would: those ratios are what noise alone does to a
//!    pair, and "within noise" means a rank test does not tell a watcher's ratios from them.
//!    Then, in the same lab, watching's cost within one flood (`watching_cost`): one observer
//!    attached throughout, its watching switched on and off between short phases, which spread
//!    far less than separate segments.
//! 2. Nanoseconds per syscall, timed by a small C program (tests/bench/syscall_cost.c, built with
//!    `cc`): `getppid` (not hooked), 64-byte writes to /dev/null (hooked, no socket), and 64-byte
//!    writes on loopback TCP to an unwatched and to a watched port, under each watcher in
//!    alternating rounds; the ratio to no watcher, per round, is what each call pays.
//! 3. From traffic to alert line at low load (`alert_latency`).
//! 4. The observer's peak resident memory under issue 10's garbage flood and with 100k users
//!    placed (`memory_load`).
//!
//! Every watcher runs as a child that is stopped (SIGINT, then SIGKILL) when its handle drops,
//! so an error or Ctrl-C leaves no process and no program loaded.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};

use crate::lab::truth::FloodReport;
use crate::watching_cost::{self, WatchSwitch, WatchingCost};
use crate::{Lab, LabConfig};

/// The gateways' ports, watched by default by the observer: gRPC (push) and WebSocket (proxy).
const GATEWAY_PORTS: [u16; 2] = [88, 80];
const ATTACH_TIMEOUT: Duration = Duration::from_secs(60);
/// The observer flushes and detaches on SIGINT; past this it is killed.
const STOP_GRACE: Duration = Duration::from_secs(15);
const WARM_UP: Duration = Duration::from_secs(2);
const WRITE_SIZE: usize = 64;
/// The throughput loss the observer is meant to stay under (issue 4).
const TARGET_LOSS_PERCENT: f64 = 3.0;
/// The p99 push latency the observer may add (issue 13).
const TARGET_P99_PERCENT: f64 = 5.0;
/// A verdict needs at least this many clean pairs: with fewer, their spread says nothing.
const MIN_PAIRS_FOR_VERDICT: usize = 3;
/// How unlikely under noise alone a watcher's ratios must be to count as outside it.
const NOISE_SIGNIFICANCE: f64 = 0.05;
/// The machine counts as quiet when this share of all CPU time over one sample is idle.
const QUIET_IDLE_SHARE: f64 = 0.85;
const QUIET_SAMPLE: Duration = Duration::from_millis(500);
/// Past this a segment starts anyway and its round is flagged noisy.
const QUIET_WAIT: Duration = Duration::from_secs(20);
/// `bpftrace` copies at most this many bytes per call: its default string size.
const BPFTRACE_COPY_BYTES: usize = 64;
const BPFTRACE_READY: &str = "bench_ready";
const OBSERVER_READY: &str = "\"observer_started\"";

pub struct BenchConfig {
    /// The observer under test (a release build).
    pub observer: PathBuf,
    pub rounds: usize,
    /// Seconds of push flood per watcher and round.
    pub seconds: u64,
    pub replicas: usize,
    pub users: usize,
    /// 64-byte TCP writes per timed syscall loop (the cheaper calls run 5× as many).
    pub writes: usize,
    /// Pairs of phases watched and not within one flood (`watching_cost`); 0 skips them.
    pub watching_pairs: usize,
    /// Only the memory section.
    pub memory_only: bool,
    /// Only the alert latency section.
    pub latency_only: bool,
    /// Only watching's cost within one flood.
    pub watching_only: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Watcher {
    Nothing,
    /// Nothing again, in the push flood only: its pair with `Nothing` measures the noise.
    Control,
    /// The observer with `--capture-hook syscalls`, what it falls back to without CAP_NET_ADMIN
    /// or a cgroup v2 hierarchy.
    SyscallHook,
    /// The observer with `--capture-hook packets`, what `auto` takes where it can.
    PacketHook,
    Bpftrace,
}

impl Watcher {
    const ALL: [Self; 5] = [
        Self::Nothing,
        Self::Control,
        Self::SyscallHook,
        Self::PacketHook,
        Self::Bpftrace,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Nothing => "no observer",
            Self::Control => "no observer (control)",
            Self::SyscallHook => "observer, syscall hook",
            Self::PacketHook => "observer, packet hook",
            Self::Bpftrace => "bpftrace",
        }
    }
}

/// What the watchers other than the observer need from this machine.
#[derive(Clone, Debug)]
struct Tools {
    bpftrace: Option<PathBuf>,
    /// A mounted cgroup v2 hierarchy, for `Watcher::PacketHook`'s `--cgroup-root`.
    cgroup2_root: Option<PathBuf>,
}

impl Tools {
    fn find() -> Self {
        let tools = Self {
            bpftrace: find_in_path("bpftrace"),
            cgroup2_root: mounted_cgroup2(),
        };
        if tools.bpftrace.is_none() {
            eprintln!(
                "bench: bpftrace not found (`apt-get install -y bpftrace`): its segments are skipped"
            );
        }
        if tools.cgroup2_root.is_none() {
            eprintln!(
                "bench: no cgroup v2 hierarchy mounted (`mount -t cgroup2 none DIR`): the packet hook's segments are skipped"
            );
        }
        tools
    }

    /// Round `round` runs the watchers in a rotated order, so none always goes first; a
    /// watcher whose tool is missing is skipped, and the control unless `control`.
    fn order(&self, round: usize, control: bool) -> impl Iterator<Item = Watcher> + '_ {
        (0..Watcher::ALL.len())
            .map(move |step| Watcher::ALL[(round + step) % Watcher::ALL.len()])
            .filter(move |watcher| match watcher {
                Watcher::Bpftrace => self.bpftrace.is_some(),
                Watcher::PacketHook => self.cgroup2_root.is_some(),
                Watcher::Control => control,
                Watcher::Nothing | Watcher::SyscallHook => true,
            })
    }
}

/// Where a cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a
/// hybrid host), from `/proc/self/mounts`.
fn mounted_cgroup2() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let (_source, target, fstype) = (fields.next()?, fields.next()?, fields.next()?);
        (fstype == "cgroup2").then(|| PathBuf::from(target))
    })
}

/// Runs both benchmarks and returns the report to print.
pub async fn run(config: BenchConfig) -> anyhow::Result<String> {
    ensure!(config.rounds >= 1, "at least one round");
    ensure!(config.writes >= 1, "at least one write per loop");
    crate::lab::netns::require_root()?;
    ensure!(
        config.observer.is_file(),
        "observer binary {} not found: build it with `cargo xtask build --release`",
        config.observer.display()
    );
    if config.memory_only {
        return crate::memory_load::measure(&config.observer).await;
    }
    if config.latency_only {
        return crate::alert_latency::measure(&config.observer, config.replicas).await;
    }
    if config.watching_only {
        ensure!(
            config.watching_pairs >= 1,
            "--watching-only needs --watching-pairs of at least 1"
        );
        // The packet hook's observer is the only watcher here.
        let tools = Tools {
            bpftrace: None,
            cgroup2_root: mounted_cgroup2(),
        };
        ensure!(
            tools.cgroup2_root.is_some(),
            "--watching-only needs a mounted cgroup v2 hierarchy (`mount -t cgroup2 none DIR`) for the packet hook"
        );
        let (_, watching) = measure_pushes(&config, &tools, 0).await?;
        return Ok(watching.map_or_else(String::new, |cost| cost.render(TARGET_LOSS_PERCENT)));
    }
    let tools = Tools::find();
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let (floods, watching) = measure_pushes(&config, &tools, config.rounds).await?;
    let syscalls = measure_syscalls(&config, &tools).await?;
    // The last syscall round's watcher (bpftrace's exit can take seconds) must be gone too.
    let quiet = wait_until_quiet_async().await?;
    let mut latency = crate::alert_latency::measure(&config.observer, config.replicas).await?;
    if !quiet.reached {
        latency.insert_str(
            0,
            &format!(
                "NOISY (the machine was {:.0}% idle when this section started): ",
                100.0 * quiet.idle_share
            ),
        );
    }
    let memory = crate::memory_load::measure(&config.observer).await?;
    let watching = watching.map_or_else(String::new, |cost| cost.render(TARGET_LOSS_PERCENT));
    Ok(render(&config, load_before.trim(), &floods, &syscalls) + &watching + &latency + &memory)
}

// ---------------------------------------------------------------------------------------------
// Watchers.
// ---------------------------------------------------------------------------------------------

/// What a watcher said about itself when it stopped.
#[derive(Debug, Default)]
struct WatcherCounts {
    /// Lines printed on stdout: alerts for the observer, captured records for bpftrace.
    lines: u64,
    /// Kernel records the observer dropped because its ring was full.
    ring_full_drops: Option<u64>,
    /// CPU the watcher's own process used while the workload ran (its threads' time on a CPU),
    /// seconds.
    cpu_seconds: f64,
    /// Times the watcher's threads went to sleep and were woken (voluntary context switches)
    /// while the workload ran: how often the kernel woke it to consume records.
    wakeups: u64,
}

/// A running observer or bpftrace. Its stdout is counted (alerts are not kept), its stderr goes
/// to a file so a chatty child never blocks on a full pipe.
struct WatcherProcess {
    label: &'static str,
    child: Child,
    reaped: bool,
    lines: Arc<AtomicU64>,
    stdout_reader: Option<JoinHandle<()>>,
    stderr_path: PathBuf,
    /// CPU seconds and wakeups of the process when it was attached.
    cpu_at_ready: f64,
    wakeups_at_ready: u64,
}

impl WatcherProcess {
    /// Starts `watcher` over `ports` (the first is a gRPC port, the rest WebSocket ports for the
    /// observer) and waits until it says its programs are attached. `Nothing` starts nothing.
    fn start(
        watcher: Watcher,
        observer: &Path,
        tools: &Tools,
        ports: &[u16],
        grpc_budget: Option<u32>,
    ) -> anyhow::Result<Option<Self>> {
        let (mut command, ready_marker) = match watcher {
            Watcher::Nothing | Watcher::Control => return Ok(None),
            Watcher::SyscallHook | Watcher::PacketHook => {
                let mut command = Command::new(observer);
                command.arg("run");
                if watcher == Watcher::SyscallHook {
                    command.args(["--capture-hook", "syscalls"]);
                }
                if watcher == Watcher::PacketHook {
                    let root = tools
                        .cgroup2_root
                        .as_ref()
                        .context("no cgroup v2 hierarchy")?;
                    command
                        .args(["--capture-hook", "packets", "--cgroup-root"])
                        .arg(root);
                }
                let (grpc, websocket) = ports.split_first().context("no port to watch")?;
                command.arg("--grpc-port").arg(grpc.to_string());
                for port in websocket {
                    command.arg("--ws-port").arg(port.to_string());
                }
                if let Some(budget) = grpc_budget {
                    command.arg("--grpc-budget").arg(budget.to_string());
                }
                (command, OBSERVER_READY)
            }
            Watcher::Bpftrace => {
                let bpftrace = tools.bpftrace.as_ref().context("bpftrace not installed")?;
                let mut command = Command::new(bpftrace);
                command.arg("-e").arg(bpftrace_script(ports));
                (command, BPFTRACE_READY)
            }
        };
        let stderr_path =
            std::env::temp_dir().join(format!("openim-bench-{}-{}.err", std::process::id(), {
                watcher.label().replace(' ', "-")
            }));
        let stderr = File::create(&stderr_path)
            .with_context(|| format!("create {}", stderr_path.display()))?;
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("start {}", watcher.label()))?;
        let stdout = child.stdout.take().context("watcher stdout")?;
        let lines = Arc::new(AtomicU64::new(0));
        let (ready_sender, ready) = mpsc::channel();
        let counted = lines.clone();
        let stdout_reader = std::thread::spawn(move || {
            let mut ready_sender = Some(ready_sender);
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if ready_sender.is_some() && line.contains(ready_marker) {
                    if let Some(sender) = ready_sender.take() {
                        let _ = sender.send(());
                    }
                    continue;
                }
                counted.fetch_add(1, Ordering::Relaxed);
            }
        });
        let mut process = Self {
            label: watcher.label(),
            child,
            reaped: false,
            lines,
            stdout_reader: Some(stdout_reader),
            stderr_path,
            cpu_at_ready: 0.0,
            wakeups_at_ready: 0,
        };
        if ready.recv_timeout(ATTACH_TIMEOUT).is_err() {
            process.shut_down();
            bail!(
                "{} did not attach: {}",
                watcher.label(),
                process.last_stderr_line()
            );
        }
        // Stdout and CPU counted from here on are what the workload caused.
        process.lines.store(0, Ordering::Relaxed);
        process.cpu_at_ready = process.cpu_seconds();
        process.wakeups_at_ready = process.wakeups();
        Ok(Some(process))
    }

    /// SIGINT (the observer flushes and detaches, bpftrace prints its maps and exits), SIGKILL
    /// after the grace period; reaps the child either way.
    fn shut_down(&mut self) -> Option<ExitStatus> {
        if self.reaped {
            return None;
        }
        self.reaped = true;
        let pid = libc::pid_t::try_from(self.child.id()).ok()?;
        // SAFETY: kill(2) on our own, not yet reaped, child.
        unsafe { libc::kill(pid, libc::SIGINT) };
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => break,
            }
        }
        let _ = self.child.kill();
        self.child.wait().ok()
    }

    /// CPU seconds of the process so far: its threads' time on a CPU in nanoseconds
    /// (`/proc/PID/task/*/schedstat`), since user + system time counts in ticks of 10 ms,
    /// several times what a whole 1.5-second phase of the flood costs the daemon when not
    /// watching. A thread that exited takes its time with it: the observer runs on one thread,
    /// bpftrace keeps its own. From the ticks when the kernel keeps no scheduler statistics; 0
    /// when /proc cannot tell at all.
    fn cpu_seconds(&self) -> f64 {
        let on_cpu_ns: Vec<u64> = std::fs::read_dir(format!("/proc/{}/task", self.child.id()))
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
            .filter_map(|schedstat| schedstat.split_whitespace().next()?.parse().ok())
            .collect();
        if !on_cpu_ns.is_empty() {
            return on_cpu_ns.iter().sum::<u64>() as f64 / 1e9;
        }
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // Fields after the parenthesised comm, which may hold spaces: state is field 3, utime
        // and stime are fields 14 and 15.
        let after_comm = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let ticks: u64 = after_comm
            .split_whitespace()
            .skip(11)
            .take(2)
            .filter_map(|field| field.parse::<u64>().ok())
            .sum();
        // SAFETY: sysconf only reads a configuration value.
        let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
        ticks as f64 / ticks_per_second as f64
    }

    /// Voluntary context switches summed over the process's threads (0 when /proc cannot tell).
    fn wakeups(&self) -> u64 {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", self.child.id())) else {
            return 0;
        };
        tasks
            .filter_map(Result::ok)
            .filter_map(|task| std::fs::read_to_string(task.path().join("status")).ok())
            .filter_map(|status| {
                status
                    .lines()
                    .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
                    .and_then(|count| count.trim().parse::<u64>().ok())
            })
            .sum()
    }

    fn stop(mut self) -> anyhow::Result<WatcherCounts> {
        // Before SIGINT: the observer's final flush is not the workload's cost.
        let cpu_seconds = self.cpu_seconds() - self.cpu_at_ready;
        let wakeups = self.wakeups().saturating_sub(self.wakeups_at_ready);
        let status = self.shut_down();
        if let Some(reader) = self.stdout_reader.take() {
            let _ = reader.join();
        }
        let stderr = self.stderr();
        // Killed after the grace period: the figures stand, but the slow exit is worth a line.
        if status.and_then(|status| status.signal()) == Some(libc::SIGKILL) {
            eprintln!(
                "bench: {} did not exit within {} s of SIGINT and was killed",
                self.label,
                STOP_GRACE.as_secs()
            );
        // bpftrace ends on SIGINT with status 0; the observer too. Anything else is a failure.
        } else if !status.is_some_and(|status| status.success()) {
            bail!(
                "{} exited with {status:?}: {}",
                self.label,
                self.last_stderr_line()
            );
        }
        let ring_full_drops = stderr
            .lines()
            .filter(|line| line.contains("\"observer_stopped\""))
            .find_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .and_then(|stopped| stopped["kernel"]["ring_full_drops"].as_u64());
        Ok(WatcherCounts {
            lines: self.lines.load(Ordering::Relaxed),
            ring_full_drops,
            cpu_seconds,
            wakeups,
        })
    }

    fn stderr(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = File::open(&self.stderr_path) {
            let _ = file.read_to_string(&mut text);
        }
        text
    }

    fn last_stderr_line(&self) -> String {
        self.stderr()
            .lines()
            .rfind(|line| !line.trim().is_empty())
            .unwrap_or("no output")
            .to_owned()
    }
}

impl Drop for WatcherProcess {
    fn drop(&mut self) {
        self.shut_down();
        let _ = std::fs::remove_file(&self.stderr_path);
    }
}

/// Starts a watcher off the async threads (attaching takes seconds), so Ctrl-C stays heard.
async fn start_watcher(
    watcher: Watcher,
    config: &BenchConfig,
    tools: &Tools,
    ports: Vec<u16>,
    grpc_budget: Option<u32>,
) -> anyhow::Result<Option<WatcherProcess>> {
    let observer = config.observer.clone();
    let tools = tools.clone();
    tokio::task::spawn_blocking(move || {
        WatcherProcess::start(watcher, &observer, &tools, &ports, grpc_budget)
    })
    .await
    .context("watcher start task")?
}

async fn stop_watcher(process: Option<WatcherProcess>) -> anyhow::Result<WatcherCounts> {
    match process {
        Some(process) => tokio::task::spawn_blocking(move || process.stop())
            .await
            .context("watcher stop task")?,
        None => Ok(WatcherCounts::default()),
    }
}

/// The peer reference: the observer's kernel side, done the plain bpftrace way.
///
/// Same tracepoints and the same tracking: a connect to a watched port (a map) marks the
/// thread, its exit (0 or EINPROGRESS) marks (pid, fd) as watched, `close` unmarks it, and the
/// exits of write/read/sendto/recvfrom/writev/readv/sendmsg/recvmsg on a watched fd copy the
/// bytes moved; `inet_sock_set_state` on watched ports is reported too. How it differs, honestly:
/// - it copies at most 64 bytes per call (bpftrace's default string size) and only from the
///   first iovec entry, where the observer copies 4 KiB chunks over every entry up to a
///   256 KiB budget per direction of a gRPC connection (then only counts);
/// - it copies on every call for the life of the connection: no budget, and no "first send and
///   first receive only" policy for WebSocket ports;
/// - records go through bpftrace's perf buffer and are formatted as text (`%r`) by bpftrace,
///   then only counted here; the observer's go through a BPF ring buffer into its decoders
///   (HTTP/1.1, WebSocket, HTTP/2, gRPC, protobuf) and correlation engine;
/// - it keeps no per-connection 4-tuple, cgroup or stream offsets, and its maps are bpftrace's
///   plain hashes, not LRU.
fn bpftrace_script(ports: &[u16]) -> String {
    let mut watched = String::new();
    for port in ports {
        let _ = write!(watched, "@watched[{port}] = 1; ");
    }
    let copy = BPFTRACE_COPY_BYTES;
    let mut script = format!(
        r#"BEGIN {{ {watched}printf("{BPFTRACE_READY}\n"); }}
tracepoint:syscalls:sys_enter_connect {{
  $family = *uptr((uint16 *)args->uservaddr);
  if ($family == 2 || $family == 10) {{
    $raw = *uptr((uint16 *)((uint64)args->uservaddr + 2));
    $port = (($raw & 0xff) << 8) | ($raw >> 8);
    if (@watched[$port]) {{ @pending[tid] = args->fd + 1; }}
  }}
}}
tracepoint:syscalls:sys_exit_connect /@pending[tid]/ {{
  if (args->ret == 0 || args->ret == -115) {{ @sockets[pid, @pending[tid] - 1] = 1; }}
  delete(@pending[tid]);
}}
tracepoint:syscalls:sys_enter_close /@sockets[pid, args->fd]/ {{ delete(@sockets[pid, args->fd]); }}
END {{ clear(@watched); clear(@pending); clear(@sockets); clear(@inflight); }}
tracepoint:sock:inet_sock_set_state /@watched[args->dport]/ {{
  printf("state %d %d %d\n", args->dport, args->oldstate, args->newstate);
}}
"#
    );
    // (syscall, its buffer argument): buffers are the first iovec entry for the vector calls.
    let plain = [
        ("write", "buf"),
        ("read", "buf"),
        ("sendto", "buff"),
        ("recvfrom", "ubuf"),
    ];
    for (syscall, buffer) in plain {
        let _ = writeln!(
            script,
            "tracepoint:syscalls:sys_enter_{syscall} /@sockets[pid, args->fd]/ {{ @inflight[tid] = (uint64)args->{buffer}; }}"
        );
    }
    for syscall in ["writev", "readv"] {
        let _ = writeln!(
            script,
            "tracepoint:syscalls:sys_enter_{syscall} /@sockets[pid, args->fd]/ {{ @inflight[tid] = *uptr((uint64 *)args->vec); }}"
        );
    }
    for syscall in ["sendmsg", "recvmsg"] {
        // msg_iov sits at offset 16 of struct user_msghdr on 64-bit.
        let _ = writeln!(
            script,
            "tracepoint:syscalls:sys_enter_{syscall} /@sockets[pid, args->fd]/ {{ $iov = *uptr((uint64 *)((uint64)args->msg + 16)); @inflight[tid] = *uptr((uint64 *)$iov); }}"
        );
    }
    let exits: Vec<String> = [
        "write", "read", "sendto", "recvfrom", "writev", "readv", "sendmsg", "recvmsg",
    ]
    .iter()
    .map(|syscall| format!("tracepoint:syscalls:sys_exit_{syscall}"))
    .collect();
    let _ = write!(
        script,
        r#"{exits} /@inflight[tid]/ {{
  if (args->ret > 0) {{
    $len = args->ret < {copy} ? args->ret : {copy};
    printf("%d %d %d %r\n", pid, tid, args->ret, buf(uptr(@inflight[tid]), $len));
  }}
  delete(@inflight[tid]);
}}
"#,
        exits = exits.join(", ")
    );
    script
}

fn find_in_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|candidate| candidate.is_file())
    })
}

// ---------------------------------------------------------------------------------------------
// 1. Push flood.
// ---------------------------------------------------------------------------------------------

struct FloodRound {
    report: FloodReport,
    counts: WatcherCounts,
    /// The idle check before the segment started: false when the machine never went quiet.
    quiet: Quiet,
}

/// What the idle check before a segment saw.
#[derive(Clone, Copy, Debug)]
struct Quiet {
    reached: bool,
    /// Idle share of all CPU time in the last sample.
    idle_share: f64,
    waited: Duration,
}

/// Idle and total jiffies over all CPUs, from the first line of /proc/stat.
fn cpu_jiffies() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .filter_map(|field| field.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    let idle = fields.get(3)? + fields.get(4).copied().unwrap_or(0);
    let total = fields.iter().take(8).sum();
    Some((idle, total))
}

/// Waits, at most `QUIET_WAIT`, until one sample of `QUIET_SAMPLE` is mostly idle. Blocking:
/// run it off the async threads.
fn wait_until_quiet() -> Quiet {
    let started = Instant::now();
    loop {
        let before = cpu_jiffies();
        std::thread::sleep(QUIET_SAMPLE);
        let idle_share = match (before, cpu_jiffies()) {
            (Some((idle0, total0)), Some((idle1, total1))) if total1 > total0 => {
                (idle1 - idle0) as f64 / (total1 - total0) as f64
            }
            // /proc/stat unreadable: nothing to wait on, and nothing known.
            _ => f64::NAN,
        };
        let reached = idle_share.is_nan() || idle_share >= QUIET_IDLE_SHARE;
        if reached || started.elapsed() >= QUIET_WAIT {
            return Quiet {
                reached,
                idle_share,
                waited: started.elapsed(),
            };
        }
    }
}

async fn wait_until_quiet_async() -> anyhow::Result<Quiet> {
    let quiet = tokio::task::spawn_blocking(wait_until_quiet)
        .await
        .context("idle check task")?;
    if !quiet.reached {
        eprintln!(
            "bench:   machine still busy after {} s ({:.0}% idle): this round is flagged noisy",
            quiet.waited.as_secs(),
            100.0 * quiet.idle_share
        );
    }
    Ok(quiet)
}

/// The push flood's `rounds`, then (with a packet hook and `watching_pairs`) watching's cost
/// within one flood of the same lab.
async fn measure_pushes(
    config: &BenchConfig,
    tools: &Tools,
    rounds: usize,
) -> anyhow::Result<(BTreeMap<Watcher, Vec<FloodRound>>, Option<WatchingCost>)> {
    let mut lab = Lab::start(LabConfig {
        replicas_initial: config.replicas,
        replicas_final: config.replicas,
        users: config.users,
        progress: true,
        ..LabConfig::default()
    })
    .await?;
    lab.connect_users(0..config.users, false).await;
    eprintln!("bench: warming up ({} s of push flood)", WARM_UP.as_secs());
    lab.push_flood(WARM_UP).await?;
    let mut floods: BTreeMap<Watcher, Vec<FloodRound>> = BTreeMap::new();
    for round in 0..rounds {
        for watcher in tools.order(round, true) {
            eprintln!(
                "bench: push flood, round {}/{}, {} ({} s)",
                round + 1,
                rounds,
                watcher.label(),
                config.seconds
            );
            // The previous watcher has exited (stop reaps it); its teardown and output must
            // also be over before this segment's clock starts.
            let quiet = wait_until_quiet_async().await?;
            let process =
                start_watcher(watcher, config, tools, GATEWAY_PORTS.to_vec(), None).await?;
            let report = lab.push_flood(Duration::from_secs(config.seconds)).await?;
            let counts = stop_watcher(process).await?;
            eprintln!(
                "bench:   {:.0} pushes/s, p50 {} us, p99 {} us, {} errors",
                report.pushes_per_second, report.p50_us, report.p99_us, report.errors
            );
            floods.entry(watcher).or_default().push(FloodRound {
                report,
                counts,
                quiet,
            });
        }
    }
    if config.watching_pairs == 0 || tools.cgroup2_root.is_none() {
        return Ok((floods, None));
    }
    // Only for the last segment's watcher to be gone: pairs side by side within one flood
    // need no quiet machine, drift on it reaches both phases of a pair alike.
    wait_until_quiet_async().await?;
    let before = watching_cost::watched_port_maps()?;
    let process = start_watcher(
        Watcher::PacketHook,
        config,
        tools,
        GATEWAY_PORTS.to_vec(),
        None,
    )
    .await?;
    let daemon_cpu = || process.as_ref().map_or(0.0, WatcherProcess::cpu_seconds);
    // Stopped whatever the measurement's outcome.
    let cost = async {
        let mut switch = WatchSwitch::find(&before)?;
        watching_cost::measure(&mut lab, &mut switch, config.watching_pairs, &daemon_cpu).await
    }
    .await;
    stop_watcher(process).await?;
    Ok((floods, Some(cost?)))
}

// ---------------------------------------------------------------------------------------------
// 2. Cost per syscall.
// ---------------------------------------------------------------------------------------------

/// The timing program, shipped as source and built with the system's `cc` at run time.
const SYSCALL_COST_SOURCE: &str = include_str!("../bench/syscall_cost.c");
/// The observer's hooks, as the syscall table names them (`ATTACHMENTS` in observer/src/capture/programs.rs).
const HOOK_STRATEGY: &str = "syscall hook: per-syscall tracepoints (syscalls:sys_enter_*/sys_exit_* of connect, close and the read/write family), perf tracepoint path; array filters (WATCHING, CLAIMS) ahead of the hash lookups. packet hook: cgroup_skb egress/ingress at the cgroup v2 root, sock:inet_sock_set_state; no syscall hooked";
/// The cheap syscalls run this many times more calls than a TCP loop, for a similar duration.
const CHEAP_CALLS_FACTOR: usize = 5;

/// One timed loop of `syscall_cost`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Syscall {
    /// `getppid`: a syscall the observer does not hook.
    Getppid,
    /// A 64-byte write to /dev/null: hooked, but no socket, let alone a watched one.
    DevNull,
    /// A 64-byte write on loopback TCP to a port nobody watches.
    TcpUnwatched,
    /// The same to a watched port, every byte copied.
    TcpWatched,
}

impl Syscall {
    const ALL: [Self; 4] = [
        Self::Getppid,
        Self::DevNull,
        Self::TcpUnwatched,
        Self::TcpWatched,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Getppid => "getppid (not hooked)",
            Self::DevNull => "write 64 B /dev/null",
            Self::TcpUnwatched => "write 64 B TCP, unwatched port",
            Self::TcpWatched => "write 64 B TCP, watched port",
        }
    }
}

/// Builds `syscall_cost` into the temp directory; returns its path.
fn build_syscall_cost() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("openim-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let source = dir.join("syscall_cost.c");
    std::fs::write(&source, SYSCALL_COST_SOURCE)
        .with_context(|| format!("write {}", source.display()))?;
    let binary = dir.join("syscall_cost");
    let output = Command::new("cc")
        .args(["-O2", "-Wall", "-o"])
        .arg(&binary)
        .arg(&source)
        .output()
        .context("run cc (the syscall section builds a small C program): install a C compiler")?;
    ensure!(
        output.status.success(),
        "cc failed on syscall_cost.c: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(binary)
}

/// Runs one timed loop; for TCP, accepts the program's connection on `listener` and drains it so
/// the send buffer never fills and the loop times `write`, not the reader.
fn time_syscall(
    program: &Path,
    syscall: Syscall,
    calls: usize,
    listener: Option<&TcpListener>,
) -> anyhow::Result<f64> {
    let mut command = Command::new(program);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    match (syscall, listener) {
        (Syscall::Getppid, _) => {
            command.args(["getppid", &(calls * CHEAP_CALLS_FACTOR).to_string()])
        }
        (Syscall::DevNull, _) => {
            command.args(["devnull", &(calls * CHEAP_CALLS_FACTOR).to_string()])
        }
        (_, Some(listener)) => command
            .args(["tcp", &calls.to_string()])
            .arg(listener.local_addr()?.port().to_string()),
        (_, None) => bail!("a TCP loop needs a listener"),
    };
    let child = command.spawn().context("start syscall_cost")?;
    if let Some(listener) = listener {
        let (mut accepted, _) = listener
            .accept()
            .context("accept syscall_cost's connection")?;
        let mut buffer = vec![0u8; 1 << 16];
        while matches!(accepted.read(&mut buffer), Ok(read) if read > 0) {}
    }
    let output = child.wait_with_output().context("wait for syscall_cost")?;
    ensure!(
        output.status.success(),
        "syscall_cost {} failed: {}",
        syscall.label(),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .with_context(|| format!("syscall_cost {} printed no figure", syscall.label()))
}

struct SyscallCosts {
    /// (watcher, syscall) → ns per call of every timed loop, in round order.
    samples: BTreeMap<(Watcher, Syscall), Vec<f64>>,
    /// Rounds where a segment started on a busy machine.
    noisy_rounds: Vec<usize>,
    /// Ring-full drops the observer reported over its rounds.
    observer_drops: u64,
}

async fn measure_syscalls(config: &BenchConfig, tools: &Tools) -> anyhow::Result<SyscallCosts> {
    let program = tokio::task::spawn_blocking(build_syscall_cost)
        .await
        .context("cc task")??;
    let watched = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("bind loopback")?;
    let unwatched = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("bind loopback")?;
    let watched_port = watched.local_addr()?.port();
    let listeners = Arc::new((watched, unwatched));
    // A budget covering the whole connection (warm-up included): every watched write is
    // copied, the worst case.
    let budget = u32::try_from(2 * config.writes * WRITE_SIZE).unwrap_or(u32::MAX);
    let mut costs = SyscallCosts {
        samples: BTreeMap::new(),
        noisy_rounds: Vec::new(),
        observer_drops: 0,
    };
    for round in 0..config.rounds {
        // No control: every syscall ratio comes with its range over the rounds.
        for watcher in tools.order(round, false) {
            eprintln!(
                "bench: syscalls, round {}/{}, {}",
                round + 1,
                config.rounds,
                watcher.label()
            );
            let quiet = wait_until_quiet_async().await?;
            if !quiet.reached && !costs.noisy_rounds.contains(&round) {
                costs.noisy_rounds.push(round);
            }
            let process =
                start_watcher(watcher, config, tools, vec![watched_port], Some(budget)).await?;
            let (program, listeners, calls) = (program.clone(), listeners.clone(), config.writes);
            let timed = tokio::task::spawn_blocking(move || {
                Syscall::ALL
                    .into_iter()
                    .map(|syscall| {
                        let listener = match syscall {
                            Syscall::TcpWatched => Some(&listeners.0),
                            Syscall::TcpUnwatched => Some(&listeners.1),
                            _ => None,
                        };
                        Ok((syscall, time_syscall(&program, syscall, calls, listener)?))
                    })
                    .collect::<anyhow::Result<Vec<_>>>()
            })
            .await
            .context("syscall loop task")??;
            let counts = stop_watcher(process).await?;
            costs.observer_drops += counts.ring_full_drops.unwrap_or(0);
            for (syscall, nanos) in timed {
                costs
                    .samples
                    .entry((watcher, syscall))
                    .or_default()
                    .push(nanos);
            }
        }
    }
    if let Some(dir) = program.parent() {
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(costs)
}

// ---------------------------------------------------------------------------------------------
// Report.
// ---------------------------------------------------------------------------------------------

pub(crate) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        len if len % 2 == 1 => sorted[len / 2],
        len => (sorted[len / 2 - 1] + sorted[len / 2]) / 2.0,
    }
}

/// "within target" only when every clean pair is within, "over target" only when none is: a
/// verdict noise could flip is reported as inconclusive.
fn verdict(ratios: &[f64], within: impl Fn(f64) -> bool) -> String {
    let inside = ratios.iter().filter(|ratio| within(**ratio)).count();
    if ratios.len() < MIN_PAIRS_FOR_VERDICT {
        format!(
            "inconclusive: {} clean pairs, a verdict needs {MIN_PAIRS_FOR_VERDICT}",
            ratios.len()
        )
    } else if inside == ratios.len() {
        "within target in every clean pair".to_owned()
    } else if inside == 0 {
        "over target in every clean pair".to_owned()
    } else {
        format!(
            "inconclusive: {inside} of {} clean pairs within target, the range straddles it",
            ratios.len()
        )
    }
}

/// Whether a watcher's throughput ratios differ from the control's, which are what noise alone
/// does to a pair: a one-sided rank test each way (Mann–Whitney, exact), so a segment a burst on
/// the host slowed weighs as one rank, not by its size, as it would in a range or a mean.
/// "below noise" when the watcher's ratios rank lower than the control's with a probability of
/// at most `NOISE_SIGNIFICANCE` under noise alone, "above noise" when higher, "within noise"
/// otherwise. With too few pairs on either side, inconclusive.
fn noise_verdict(ratios: &[f64], noise: &[f64]) -> String {
    if ratios.len() < MIN_PAIRS_FOR_VERDICT || noise.len() < MIN_PAIRS_FOR_VERDICT {
        return format!(
            "inconclusive: {} clean pairs and {} control pairs, a verdict needs {MIN_PAIRS_FOR_VERDICT} of each",
            ratios.len(),
            noise.len()
        );
    }
    let lower = chance_of_ranking_this_low(ratios, noise);
    let higher = chance_of_ranking_this_low(noise, ratios);
    let place = if lower <= NOISE_SIGNIFICANCE {
        "below"
    } else if higher <= NOISE_SIGNIFICANCE {
        "above"
    } else {
        "within"
    };
    format!(
        "{place} noise (median ×{:.3} against the control's ×{:.3}; rank test p = {:.3})",
        median(ratios),
        median(noise),
        lower.min(higher)
    )
}

/// Were `first` and `second` drawn alike, the chance that `first` ranks at least this far below
/// `second`: the upper tail of the Mann–Whitney U, the pairs in which `first`'s value is the
/// smaller (a tie counts half, rounded down, which can only make the chance larger).
fn chance_of_ranking_this_low(first: &[f64], second: &[f64]) -> f64 {
    let twice_u: usize = first
        .iter()
        .flat_map(|a| second.iter().map(move |b| (a, b)))
        .map(|(a, b)| match a.total_cmp(b) {
            std::cmp::Ordering::Less => 2,
            std::cmp::Ordering::Equal => 1,
            std::cmp::Ordering::Greater => 0,
        })
        .sum();
    let orderings = u_distribution(first.len(), second.len());
    let total: f64 = orderings.iter().sum();
    orderings[twice_u / 2..].iter().sum::<f64>() / total
}

/// For `n` values of one kind and `m` of another in a random order, how many of the orderings
/// give each U from 0 to n·m (U: the pairs whose first-kind value is the smaller). The largest
/// value is either of the second kind, above all `n` of the first (U gains `n`), or of the
/// first kind, above none of the second.
fn u_distribution(n: usize, m: usize) -> Vec<f64> {
    // One row at a time (i values of the first kind, j = 0..=m of the second), so that
    // `--rounds` in the hundreds needs megabytes, not the whole table's gigabytes.
    let mut row: Vec<Vec<f64>> = vec![vec![1.0]; m + 1];
    for i in 1..=n {
        let mut next: Vec<Vec<f64>> = Vec::with_capacity(m + 1);
        next.push(vec![1.0]);
        for j in 1..=m {
            let mut here = vec![0.0; i * j + 1];
            for (u, count) in next[j - 1].iter().enumerate() {
                here[u + i] += count;
            }
            for (u, count) in row[j].iter().enumerate() {
                here[u] += count;
            }
            next.push(here);
        }
        row = next;
    }
    row.swap_remove(m)
}

/// "median (min–max)" of the ratios, or a dash when there are none.
fn ratio_summary(ratios: &[f64]) -> String {
    if ratios.is_empty() {
        return "—".to_owned();
    }
    let min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let max = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("×{:.3} (×{min:.3}–×{max:.3})", median(ratios))
}

/// A watcher's rounds against no watcher's, pair by pair (the same round); a pair counts only
/// when both of its segments started on a quiet machine.
struct PairRatios {
    throughput: Vec<f64>,
    p99: Vec<f64>,
}

impl PairRatios {
    fn new(rounds: &[FloodRound], baseline: &[FloodRound]) -> Self {
        let pairs: Vec<(&FloodRound, &FloodRound)> = rounds
            .iter()
            .zip(baseline)
            .filter(|(with, without)| with.quiet.reached && without.quiet.reached)
            .collect();
        Self {
            throughput: pairs
                .iter()
                .map(|(with, without)| {
                    with.report.pushes_per_second
                        / without.report.pushes_per_second.max(f64::EPSILON)
                })
                .collect(),
            p99: pairs
                .iter()
                .map(|(with, without)| {
                    with.report.p99_us as f64 / without.report.p99_us.max(1) as f64
                })
                .collect(),
        }
    }
}

fn render_floods(
    out: &mut String,
    config: &BenchConfig,
    floods: &BTreeMap<Watcher, Vec<FloodRound>>,
) {
    let _ = writeln!(
        out,
        "\npush flood: {} s per round, {} gateways, {} users, a new gRPC connection per push (all on watched port 88)",
        config.seconds, config.replicas, config.users
    );
    for round in 0..config.rounds {
        let mut line = format!("round {}:", round + 1);
        for (watcher, rounds) in floods {
            if let Some(r) = rounds.get(round) {
                let _ = write!(
                    line,
                    " {} {:.0}/s p99 {} us (idle before {:.0}%{});",
                    watcher.label(),
                    r.report.pushes_per_second,
                    r.report.p99_us,
                    100.0 * r.quiet.idle_share,
                    if r.quiet.reached { "" } else { ", NOISY" }
                );
            }
        }
        let _ = writeln!(out, "{line}");
    }
    let _ = writeln!(
        out,
        "{:<22} {:>6} {:>10} {:>19} {:>8} {:>8} {:>8} {:>16} {:>13}  stdout lines",
        "watcher",
        "clean",
        "pushes/s",
        "rounds (min–max)",
        "p50 us",
        "p99 us",
        "errors",
        "CPU ms/1k push",
        "wakeups/push"
    );
    for (watcher, rounds) in floods {
        let kept: Vec<&FloodRound> = rounds.iter().filter(|r| r.quiet.reached).collect();
        let per_round: Vec<f64> = kept.iter().map(|r| r.report.pushes_per_second).collect();
        let p50: Vec<f64> = kept.iter().map(|r| r.report.p50_us as f64).collect();
        let p99: Vec<f64> = kept.iter().map(|r| r.report.p99_us as f64).collect();
        let calls = kept.iter().map(|r| r.report.calls).sum::<u64>().max(1) as f64;
        let _ = writeln!(
            out,
            "{:<22} {:>6} {:>10.0} {:>19} {:>8.0} {:>8.0} {:>8} {:>16.1} {:>13.2}  {}",
            watcher.label(),
            format!("{}/{}", kept.len(), rounds.len()),
            median(&per_round),
            format!(
                "{:.0}–{:.0}",
                per_round.iter().copied().fold(f64::INFINITY, f64::min),
                per_round.iter().copied().fold(0.0, f64::max)
            ),
            median(&p50),
            median(&p99),
            kept.iter().map(|r| r.report.errors).sum::<u64>(),
            1e6 * kept.iter().map(|r| r.counts.cpu_seconds).sum::<f64>() / calls,
            kept.iter().map(|r| r.counts.wakeups).sum::<u64>() as f64 / calls,
            kept.iter().map(|r| r.counts.lines).sum::<u64>(),
        );
    }
    let _ = writeln!(
        out,
        "clean: segments that started on a quiet machine; figures are medians over them (NaN: none). p50/p99: each round's hdrhistogram percentile (connect + call);\nCPU ms/1k push: the watcher process's CPU per 1,000 pushes, its threads' time on a CPU (not its programs', paid inside the lab's syscalls and softirqs: the observer's are timed in the watching section below);\nwakeups/push: the watcher's voluntary context switches per push (the kernel waking it to consume records)"
    );
    let Some(baseline) = floods.get(&Watcher::Nothing) else {
        return;
    };
    let noise = floods
        .get(&Watcher::Control)
        .map(|control| PairRatios::new(control, baseline).throughput)
        .unwrap_or_default();
    for (watcher, rounds) in floods.iter().filter(|(w, _)| **w != Watcher::Nothing) {
        let ratios = PairRatios::new(rounds, baseline);
        let _ = writeln!(
            out,
            "{} vs. no observer, per clean pair: throughput {}, p99 {}{}",
            watcher.label(),
            ratio_summary(&ratios.throughput),
            ratio_summary(&ratios.p99),
            if *watcher == Watcher::Control {
                ": what noise alone does to a pair"
            } else {
                ""
            }
        );
        if matches!(watcher, Watcher::SyscallHook | Watcher::PacketHook) {
            let _ = writeln!(
                out,
                "target: throughput within noise: {}; at most {TARGET_LOSS_PERCENT}% throughput loss: {}; p99 at most +{TARGET_P99_PERCENT}%: {}",
                noise_verdict(&ratios.throughput, &noise),
                verdict(&ratios.throughput, |ratio| ratio
                    >= 1.0 - TARGET_LOSS_PERCENT / 100.0),
                verdict(&ratios.p99, |ratio| ratio
                    <= 1.0 + TARGET_P99_PERCENT / 100.0)
            );
        }
    }
    let observer_drops: u64 = [Watcher::SyscallHook, Watcher::PacketHook]
        .iter()
        .filter_map(|watcher| floods.get(watcher))
        .flatten()
        .filter_map(|round| round.counts.ring_full_drops)
        .sum();
    let _ = writeln!(
        out,
        "observer ring-full drops during floods (both hooks): {observer_drops}"
    );
}

/// "median (min–max)" of nanosecond figures.
fn nanos_summary(values: &[f64]) -> String {
    if values.is_empty() {
        return "—".to_owned();
    }
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{:.0} ({min:.0}–{max:.0})", median(values))
}

fn render_syscalls(out: &mut String, config: &BenchConfig, costs: &SyscallCosts) {
    let clean: Vec<usize> = (0..config.rounds)
        .filter(|round| !costs.noisy_rounds.contains(round))
        .collect();
    let _ = writeln!(
        out,
        "\nsyscalls: ns per call, median (min–max) over {} clean of {} rounds; {} TCP writes, {} other calls per loop; ratio: median of per-round ratios to no observer (min–max)\nhooks in use: {HOOK_STRATEGY}",
        clean.len(),
        config.rounds,
        config.writes,
        config.writes * CHEAP_CALLS_FACTOR
    );
    let _ = writeln!(
        out,
        "{:<31} {:>18} {:>18} {:>26} {:>18} {:>26} {:>18} {:>26}",
        "call",
        "no observer ns",
        "syscall hook ns",
        "syscall hook ratio",
        "packet hook ns",
        "packet hook ratio",
        "bpftrace ns",
        "bpftrace ratio"
    );
    let clean_samples = |watcher: Watcher, syscall: Syscall| -> Vec<f64> {
        let samples = costs.samples.get(&(watcher, syscall));
        clean
            .iter()
            .filter_map(|&round| samples.and_then(|samples| samples.get(round).copied()))
            .collect()
    };
    for syscall in Syscall::ALL {
        let baseline = clean_samples(Watcher::Nothing, syscall);
        let mut line = format!("{:<31} {:>18}", syscall.label(), nanos_summary(&baseline));
        for watcher in [Watcher::SyscallHook, Watcher::PacketHook, Watcher::Bpftrace] {
            let with = clean_samples(watcher, syscall);
            if with.is_empty() {
                let _ = write!(line, " {:>18} {:>26}", "—", "not run");
                continue;
            }
            let ratios: Vec<f64> = with
                .iter()
                .zip(&baseline)
                .map(|(with, without)| with / without.max(f64::EPSILON))
                .collect();
            let _ = write!(
                line,
                " {:>18} {:>26}",
                nanos_summary(&with),
                ratio_summary(&ratios)
            );
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    let _ = writeln!(
        out,
        "observer ring-full drops during syscall loops (both hooks): {} (a dropped record still paid the copy)",
        costs.observer_drops
    );
}

fn render(
    config: &BenchConfig,
    load_before: &str,
    floods: &BTreeMap<Watcher, Vec<FloodRound>>,
    syscalls: &SyscallCosts,
) -> String {
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "overhead of watching: {} rounds, watchers interleaved; {cpus} CPUs, load average before: {load_before}",
        config.rounds
    );
    render_floods(&mut out, config, floods);

    render_syscalls(&mut out, config, syscalls);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verdict_noise_could_flip_is_inconclusive() {
        let within = |ratio: f64| ratio >= 0.97;
        assert!(verdict(&[0.99, 0.98], within).starts_with("inconclusive: 2 clean pairs"));
        assert_eq!(
            verdict(&[0.99, 0.98, 1.01], within),
            "within target in every clean pair"
        );
        assert_eq!(
            verdict(&[0.90, 0.93, 0.88], within),
            "over target in every clean pair"
        );
        assert!(verdict(&[0.99, 0.93, 1.02], within).contains("2 of 3 clean pairs within target"));
    }

    /// The orderings of three values of each kind: 20 in all, by U as tabulated, symmetric.
    #[test]
    fn the_rank_statistic_is_distributed_as_tabulated() {
        assert_eq!(
            u_distribution(3, 3),
            [1.0, 1.0, 2.0, 3.0, 3.0, 3.0, 3.0, 2.0, 1.0, 1.0]
        );
        let seven = u_distribution(7, 7);
        assert_eq!(seven.iter().sum::<f64>(), 3432.0);
        assert!(seven.iter().eq(seven.iter().rev()));
        assert_eq!(u_distribution(2, 0), [1.0]);
        assert_eq!(u_distribution(0, 2), [1.0]);
        assert_eq!(u_distribution(1, 2), [1.0, 1.0, 1.0]);
    }

    /// The pairs of three runs of this bench on a 2-core VM (throughput ratios to no observer:
    /// the packet hook's, then the control's). The second and third runs each had a segment a
    /// burst on the host slowed (control ×1.536, ×0.338): ranks keep it from hiding the
    /// observer's cost, which a range test let pass.
    #[test]
    fn a_watchers_pairs_are_judged_against_the_controls_by_rank() {
        let first = noise_verdict(
            &[1.030, 0.823, 0.869, 0.812, 1.001],
            &[1.142, 0.955, 0.856, 1.004, 1.024],
        );
        assert!(first.starts_with("within noise"), "{first}");
        let second = noise_verdict(
            &[0.959, 0.949, 1.159, 0.930, 0.960],
            &[1.069, 1.049, 1.536, 0.985, 0.975],
        );
        assert!(second.starts_with("below noise"), "{second}");
        let third = noise_verdict(
            &[0.887, 0.957, 0.569, 0.908, 0.971, 0.882, 1.012],
            &[1.012, 1.009, 1.232, 0.982, 1.015, 0.338, 1.052],
        );
        assert!(third.starts_with("below noise"), "{third}");
        let faster = noise_verdict(&[1.20, 1.25, 1.30], &[0.99, 1.00, 1.01]);
        assert!(faster.starts_with("above noise"), "{faster}");
        assert!(noise_verdict(&[1.0, 1.0, 1.0], &[1.0, 1.0]).starts_with("inconclusive"));
    }

    #[test]
    fn ratios_summarise_as_median_and_range() {
        assert_eq!(ratio_summary(&[]), "—");
        assert_eq!(ratio_summary(&[0.9, 1.1, 1.0]), "×1.000 (×0.900–×1.100)");
    }
}
