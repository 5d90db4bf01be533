//! Runs the real `observer` binary for a test: [`ObserverProcess`] for any `observer run`, and
//! [`Observer`] for the kernel tests' `observer run --events`, whose lines they read as JSON.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use serde_json::Value;

/// Bounds how long [`Observer::wait_for`] waits for a line.
pub const WAIT: Duration = Duration::from_secs(20);

/// Holds a live `observer run`, its stdout (JSON lines) collected on a thread.
pub struct ObserverProcess {
    child: Child,
    /// Each line with the time the reading thread got it.
    lines: Receiver<(SystemTime, String)>,
    stdout: Vec<String>,
    /// Waited for: nothing left to kill on drop.
    exited: bool,
}

/// Holds everything the observer printed.
#[derive(Debug, Default)]
pub struct ObserverOutput {
    /// Alert objects (stdout lines other than `observer_started`).
    pub alerts: Vec<Value>,
    /// The same alerts, verbatim as printed.
    pub alert_lines: Vec<String>,
    /// Every stdout line, verbatim.
    pub stdout: Vec<String>,
    pub stderr: String,
}

impl ObserverOutput {
    /// Returns the `observer_stopped` line (its counters) from stderr.
    pub fn stopped_line(&self) -> Value {
        stopped_line(&self.stderr)
    }
}

/// Finds the `observer_stopped` line (its counters) the observer wrote on `stderr`.
///
/// # Panics
/// When there is none.
pub fn stopped_line(stderr: &str) -> Value {
    stderr
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line["kind"] == "observer_stopped")
        .unwrap_or_else(|| panic!("no observer_stopped line in:\n{stderr}"))
}

impl ObserverProcess {
    /// Starts `observer run ARGS…` and waits until it reports that it is attached.
    ///
    /// # Errors
    /// When the binary does not start, or exits or stays silent for 30 s before it attaches.
    pub fn start(binary: &Path, args: &[&str]) -> anyhow::Result<Self> {
        Self::spawn(Command::new(binary), args)
    }

    /// Starts the observer as [`ObserverProcess::start`] does, through `command`, a command line
    /// that ends in the observer binary (a wrapper such as `setpriv … observer`), with `run ARGS…`
    /// appended.
    ///
    /// # Errors
    /// As [`ObserverProcess::start`].
    pub fn spawn(mut command: Command, args: &[&str]) -> anyhow::Result<Self> {
        let program = command.get_program().to_owned();
        let mut child = command
            .arg("run")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("start {}", Path::new(&program).display()))?;
        let stdout = child.stdout.take().context("observer stdout")?;
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send((SystemTime::now(), line)).is_err() {
                    break;
                }
            }
        });
        let mut observer = Self {
            child,
            lines,
            stdout: Vec::new(),
            exited: false,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match observer.lines.recv_timeout(left) {
                Ok((_, line)) => {
                    let started = line.contains("\"observer_started\"");
                    observer.stdout.push(line);
                    if started {
                        return Ok(observer);
                    }
                }
                Err(_) => {
                    let output = observer.stop()?;
                    bail!(
                        "the observer did not attach: {}",
                        output.stderr.lines().last().unwrap_or("no output")
                    );
                }
            }
        }
    }

    /// Says where its kernel programs copy the bytes, and why: `observer_started`'s `capture_hook`
    /// and `capture_hook_reason`, as "packets (auto: …)".
    pub fn capture_hook(&self) -> String {
        let started = self
            .stdout
            .iter()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .find(|line| line["kind"] == "observer_started")
            .unwrap_or_default();
        format!(
            "{} ({})",
            started["capture_hook"].as_str().unwrap_or("?"),
            started["capture_hook_reason"].as_str().unwrap_or("?")
        )
    }

    /// Returns the stdout lines read so far, verbatim.
    pub fn lines(&self) -> &[String] {
        &self.stdout
    }

    /// Reads the next stdout line, waiting up to `timeout`; the line is kept for
    /// [`ObserverProcess::stop`] like every other.
    pub fn next_line(&mut self, timeout: Duration) -> Option<String> {
        let (_, line) = self.lines.recv_timeout(timeout).ok()?;
        self.stdout.push(line.clone());
        Some(line)
    }

    /// Waits (bounded) for a stdout line that `accept` takes; the line is kept for
    /// [`ObserverProcess::stop`] like every other.
    ///
    /// # Errors
    /// When no such line comes within `timeout`.
    pub fn wait_for_line(
        &mut self,
        timeout: Duration,
        accept: impl Fn(&str) -> bool,
    ) -> anyhow::Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(line) = self.next_line(left) else {
                bail!("no such observer line within {timeout:?}");
            };
            if accept(&line) {
                return Ok(line);
            }
        }
    }

    /// Returns the lines printed until `until`, each with the time it was read (kept for
    /// [`ObserverProcess::stop`] too).
    pub fn timed_lines_until(&mut self, until: Instant) -> Vec<(SystemTime, String)> {
        let mut lines = Vec::new();
        while let Ok((read_at, line)) = self
            .lines
            .recv_timeout(until.saturating_duration_since(Instant::now()))
        {
            self.stdout.push(line.clone());
            lines.push((read_at, line));
        }
        lines
    }

    /// Stops the observer (SIGSTOP) until `resume`, as on a node that gives it no CPU: nothing
    /// reads its ring meanwhile, so the programs drop the records that do not fit.
    pub fn pause(&self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGSTOP) };
    }

    /// Lets a paused observer run again (SIGCONT).
    pub fn resume(&self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGCONT) };
    }

    /// Says whether the process has not exited.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends SIGINT (the observer flushes what it holds back and detaches), then collects.
    ///
    /// # Errors
    /// When the observer exits unsuccessfully (the error names its last stderr line).
    pub fn stop(mut self) -> anyhow::Result<ObserverOutput> {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
        let status = self.child.wait().context("wait for the observer")?;
        self.exited = true;
        let mut stderr = String::new();
        if let Some(mut pipe) = self.child.stderr.take() {
            pipe.read_to_string(&mut stderr)
                .context("read observer stderr")?;
        }
        while let Ok((_, line)) = self.lines.recv_timeout(Duration::from_millis(500)) {
            self.stdout.push(line);
        }
        if !status.success() {
            bail!(
                "the observer exited with {status}: {}",
                stderr.lines().last().unwrap_or("")
            );
        }
        check_schema(&self.stdout)?;
        let (alerts, alert_lines) = self
            .stdout
            .iter()
            .filter_map(|line| Some((serde_json::from_str::<Value>(line).ok()?, line.clone())))
            .filter(|(value, _)| value["kind"] != "observer_started")
            .unzip();
        Ok(ObserverOutput {
            alerts,
            alert_lines,
            stdout: std::mem::take(&mut self.stdout),
            stderr,
        })
    }
}

/// Holds every alert line in `stdout` (each JSON line with a `schema_version`; `--events`
/// records have none) to the schema of the alert lines (docs/schema/).
///
/// # Errors
/// Names the first line that does not fit, and why.
pub fn check_schema(stdout: &[String]) -> anyhow::Result<()> {
    let schema = observer::alert::schema::schema();
    for line in stdout {
        let Ok(value) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if value.get("schema_version").is_none() {
            continue;
        }
        if let Err(error) = observer::alert::schema::validate(&schema, &value) {
            bail!("an observer line does not fit the schema ({error}): {line}");
        }
    }
    Ok(())
}

/// Kills an observer dropped without `stop` (a failed start beside it, a test that panicked): it
/// must not keep its programs attached (or the machine lock its parent inherited) under the next
/// test.
impl Drop for ObserverProcess {
    fn drop(&mut self) {
        if !self.exited {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Holds a running `observer run --events` of the kernel tests, its lines read as JSON.
///
/// It hooks the syscalls unless the arguments name a hook: `auto` would take the packet hook
/// wherever the machine offers a cgroup v2 hierarchy, and the tests of the syscall hook would
/// then test the other one.
pub struct Observer {
    process: ObserverProcess,
    /// Every line read so far, parsed.
    seen: Vec<Value>,
}

impl Observer {
    /// Starts `BINARY run --events ARGS` and waits for `observer_started`.
    ///
    /// # Panics
    /// When the observer does not start (not root, no programs, a refused argument).
    pub fn start(binary: impl AsRef<OsStr>, args: &[&str]) -> Self {
        Self::start_with_env(binary, args, &[])
    }

    /// Starts the observer as [`Observer::start`] does, with `env` added to the observer's
    /// environment.
    pub fn start_with_env(binary: impl AsRef<OsStr>, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(binary);
        command.envs(env.iter().copied());
        Self::spawn(command, args)
    }

    /// Starts the observer as [`Observer::start`] does, in a cgroup namespace of its own, rooted at
    /// `cgroup` (as a pod's is on a cgroup v2 node): /proc then spells other processes' cgroups
    /// from there.
    pub fn start_in_cgroup_namespace(
        binary: impl AsRef<OsStr>,
        cgroup: &Path,
        args: &[&str],
    ) -> Self {
        let mut command = Command::new("sh");
        command
            .args([
                "-c",
                r#"echo $$ > "$0/cgroup.procs" && exec unshare --cgroup "$@""#,
            ])
            .arg(cgroup)
            .arg(binary);
        Self::spawn(command, args)
    }

    /// Starts the observer as [`Observer::start`] does, through `command`, a command line that ends
    /// in the observer binary.
    pub fn spawn(command: Command, args: &[&str]) -> Self {
        let mut all = vec!["--events"];
        if !args.contains(&"--capture-hook") {
            all.extend(["--capture-hook", "syscalls"]);
        }
        all.extend(args);
        let process = ObserverProcess::spawn(command, &all)
            .unwrap_or_else(|err| panic!("observer did not start (root with BPF?): {err:#}"));
        let seen = process.lines().iter().map(|line| parse(line)).collect();
        Self { process, seen }
    }

    /// Reads lines until one matches (or finds one read already), or [`WAIT`] passes.
    pub fn wait_for(&mut self, mut predicate: impl FnMut(&Value) -> bool) -> Option<Value> {
        if let Some(found) = self.seen.iter().find(|line| predicate(line)) {
            return Some(found.clone());
        }
        let deadline = Instant::now() + WAIT;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let line = parse(&self.process.next_line(left)?);
            let matched = predicate(&line);
            self.seen.push(line.clone());
            if matched {
                return Some(line);
            }
        }
        None
    }

    /// Sends SIGINT, waits for exit 0, and returns every stdout line plus the stderr text.
    ///
    /// # Panics
    /// When the observer exits unsuccessfully.
    pub fn stop(self) -> (Vec<Value>, String) {
        let output = self.process.stop().unwrap_or_else(|err| panic!("{err:#}"));
        let lines = output.stdout.iter().map(|line| parse(line)).collect();
        (lines, output.stderr)
    }
}

/// Parses one line of `--events`, which are all JSON.
fn parse(line: &str) -> Value {
    serde_json::from_str(line)
        .unwrap_or_else(|err| panic!("stdout line is not JSON ({err}): {line}"))
}
