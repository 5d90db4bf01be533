//! Runs the watchers of a segment: the observer with either hook, and bpftrace doing comparable
//! work, each a child process stopped when its handle drops.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::{BenchConfig, Tools, Watcher};

const ATTACH_TIMEOUT: Duration = Duration::from_secs(60);
/// Bounds a watcher's stop: the observer flushes and detaches on SIGINT; past this it is killed.
const STOP_GRACE: Duration = Duration::from_secs(15);
/// Bounds the bytes `bpftrace` copies per call: its default string size.
const BPFTRACE_COPY_BYTES: usize = 64;
const BPFTRACE_READY: &str = "bench_ready";
const OBSERVER_READY: &str = "\"observer_started\"";

/// Records what a watcher said about itself when it stopped.
#[derive(Debug, Default)]
pub(super) struct WatcherCounts {
    /// Lines printed on stdout: alerts for the observer, captured records for bpftrace.
    pub(super) lines: u64,
    /// Kernel records the observer dropped because its ring was full.
    pub(super) ring_full_drops: Option<u64>,
    /// CPU the watcher's own process used while the workload ran (its threads' time on a CPU),
    /// seconds.
    pub(super) cpu_seconds: f64,
    /// Times the watcher's threads went to sleep and were woken (voluntary context switches)
    /// while the workload ran: how often the kernel woke it to consume records.
    pub(super) wakeups: u64,
}

/// Holds a running observer or bpftrace. Its stdout is counted (alerts are not kept), its stderr
/// goes to a file so a chatty child never blocks on a full pipe.
pub(super) struct WatcherProcess {
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

    /// Sends SIGINT (the observer flushes and detaches, bpftrace prints its maps and exits),
    /// SIGKILL after the grace period; reaps the child either way.
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

    /// Returns the CPU seconds of the process so far: its threads' time on a CPU in nanoseconds
    /// (`/proc/PID/task/*/schedstat`), since user + system time counts in ticks of 10 ms, several
    /// times what a whole 1.5-second phase of the flood costs the daemon when not watching. A
    /// thread that exited takes its time with it: the observer runs on one thread, bpftrace keeps
    /// its own. From the ticks when the kernel keeps no scheduler statistics; 0 when /proc cannot
    /// tell at all.
    pub(super) fn cpu_seconds(&self) -> f64 {
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

    /// Counts the voluntary context switches summed over the process's threads (0 when /proc cannot
    /// tell).
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
///
/// # Errors
///
/// Fails when the watcher does not start or the blocking task panics.
pub(super) async fn start_watcher(
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

/// Stops a watcher off the async threads and returns what it said; no watcher counts nothing.
///
/// # Errors
///
/// Fails when the watcher does not stop cleanly or the blocking task panics.
pub(super) async fn stop_watcher(process: Option<WatcherProcess>) -> anyhow::Result<WatcherCounts> {
    match process {
        Some(process) => tokio::task::spawn_blocking(move || process.stop())
            .await
            .context("watcher stop task")?,
        None => Ok(WatcherCounts::default()),
    }
}

/// Writes the peer reference: the observer's kernel side, done the plain bpftrace way.
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
            "tracepoint:syscalls:sys_enter_{syscall} /@sockets[pid, args->fd]/ {{ @inflight[tid] = \
            (uint64)args->{buffer}; }}"
        );
    }
    for syscall in ["writev", "readv"] {
        let _ = writeln!(
            script,
            "tracepoint:syscalls:sys_enter_{syscall} /@sockets[pid, args->fd]/ {{ @inflight[tid] = \
            *uptr((uint64 *)args->vec); }}"
        );
    }
    for syscall in ["sendmsg", "recvmsg"] {
        // msg_iov sits at offset 16 of struct user_msghdr on 64-bit.
        let _ = writeln!(
            script,
            "tracepoint:syscalls:sys_enter_{syscall} /@sockets[pid, args->fd]/ {{ $iov = \
            *uptr((uint64 *)((uint64)args->msg + 16)); @inflight[tid] = *uptr((uint64 *)$iov); }}"
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

/// Finds `program` in a directory of `$PATH`.
pub(super) fn find_in_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|candidate| candidate.is_file())
    })
}
