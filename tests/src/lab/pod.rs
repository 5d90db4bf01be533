//! Runs pod processes: `ip netns exec <ns> <openim-lab binary> <role> ...`, so each pod is a
//! separate process in its own namespace (as in Kubernetes), observable with its own pid and comm.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use thiserror::Error;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::lab::control::{PodEvent, PushCommand};

/// Says why a pod could not be started, answered or reached.
#[derive(Debug, Error)]
pub enum PodError {
    #[error("could not start pod {label}: {source}")]
    Spawn {
        label: String,
        source: std::io::Error,
    },
    #[error("pod {label} exited while the lab waited for {waiting_for}")]
    Exited { label: String, waiting_for: String },
    #[error("pod {label} did not report {waiting_for} within {timeout:?}")]
    Timeout {
        label: String,
        waiting_for: String,
        timeout: Duration,
    },
    #[error("pod {label} refused: {error}")]
    Refused { label: String, error: String },
    #[error("could not send a command to pod {label}: {source}")]
    Command {
        label: String,
        source: std::io::Error,
    },
}

/// Records what the gateways and the proxy report while the lab runs (its raw ground truth).
#[derive(Debug, Default)]
pub struct Observations {
    /// user → (gateway index, Host header of the upgrade).
    pub sessions: HashMap<String, (usize, String)>,
    /// Push calls the gateways answered, counted by (gateway index, `:authority`); counts, not
    /// a list, so that a long push flood needs no more memory.
    pub push_calls: HashMap<(usize, String), usize>,
    /// user → the proxy's relay error, for users whose WebSocket the proxy could not open.
    pub relay_failures: HashMap<String, String>,
}

/// Shares [`Observations`] behind a lock between the lab's tasks.
pub type SharedObservations = Arc<Mutex<Observations>>;

/// Moves the calling process into the cgroup whose `cgroup.procs` is `procs` ("0" names the
/// writer). Runs between fork and exec: async-signal-safe calls only.
fn join_cgroup(procs: &std::ffi::CStr) -> std::io::Result<()> {
    // SAFETY: a valid C string; the fd is closed on every path.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let written = libc::write(fd, c"0".as_ptr().cast(), 1);
        let error = std::io::Error::last_os_error();
        libc::close(fd);
        if written == 1 { Ok(()) } else { Err(error) }
    }
}

/// Holds a running pod process and the channel of its events.
pub struct PodProcess {
    label: String,
    child: Child,
    stdin: Option<ChildStdin>,
    replies: mpsc::UnboundedReceiver<PodEvent>,
    reader: JoinHandle<()>,
}

impl PodProcess {
    /// Starts `binary role_args...` inside `netns`, and inside the cgroup whose `cgroup.procs`
    /// is `cgroup_procs` if one is given. `gateway_index` tags the gateway's reports.
    ///
    /// # Errors
    ///
    /// Fails when the cgroup path holds a NUL byte, or the process cannot be started or has no
    /// stdout pipe.
    pub fn spawn(
        binary: &Path,
        netns: &str,
        role_args: &[String],
        label: &str,
        gateway_index: Option<usize>,
        cgroup_procs: Option<&Path>,
        observations: SharedObservations,
    ) -> Result<Self, PodError> {
        let spawn_error = |source| PodError::Spawn {
            label: label.to_owned(),
            source,
        };
        let cgroup_procs = cgroup_procs
            .map(|path| std::ffi::CString::new(path.as_os_str().as_encoded_bytes()))
            .transpose()
            .map_err(|_| spawn_error(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", netns])
            .arg(binary)
            .args(role_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        // SAFETY: prctl, open, write and close are async-signal-safe, on memory prepared before
        // the fork. The parent-death signal makes a lab killed with SIGKILL (no Drop) take its
        // pods with it; joining the cgroup before exec puts every syscall of the pod (and of
        // its children) inside it. `ip netns exec` execs the pod binary in place, and both
        // survive exec.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(procs) = &cgroup_procs {
                    join_cgroup(procs)?;
                }
                Ok(())
            });
        }
        let mut child = command.spawn().map_err(spawn_error)?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| spawn_error(std::io::Error::other("no stdout pipe")))?;
        let (reply_tx, replies) = mpsc::unbounded_channel();
        let reader = tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(event) = serde_json::from_str::<PodEvent>(&line) else {
                    continue;
                };
                if let Some(reply) = record(event, gateway_index, &observations) {
                    let _ = reply_tx.send(reply);
                }
            }
        });
        Ok(Self {
            label: label.to_owned(),
            child,
            stdin,
            replies,
            reader,
        })
    }

    /// Returns the pod's label, as errors name it.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Returns the pod process's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Waits for the first reply `accept` takes, skipping others.
    ///
    /// # Errors
    ///
    /// Fails when the pod refuses, exits before the reply, or does not reply within `timeout`.
    pub async fn wait_for<T>(
        &mut self,
        waiting_for: &str,
        timeout: Duration,
        mut accept: impl FnMut(PodEvent) -> Option<T>,
    ) -> Result<T, PodError> {
        let label = self.label.clone();
        let wait = async {
            loop {
                match self.replies.recv().await {
                    Some(PodEvent::CommandFailed { error }) => {
                        return Err(PodError::Refused {
                            label: label.clone(),
                            error,
                        });
                    }
                    Some(event) => {
                        if let Some(found) = accept(event) {
                            return Ok(found);
                        }
                    }
                    None => {
                        return Err(PodError::Exited {
                            label: label.clone(),
                            waiting_for: waiting_for.to_owned(),
                        });
                    }
                }
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .unwrap_or_else(|_| {
                Err(PodError::Timeout {
                    label: self.label.clone(),
                    waiting_for: waiting_for.to_owned(),
                    timeout,
                })
            })
    }

    /// Waits up to 10 s for the pod to report that it is ready.
    ///
    /// # Errors
    ///
    /// Fails when the pod refuses, exits, or is not ready in time.
    pub async fn wait_ready(&mut self) -> Result<(), PodError> {
        self.wait_for("ready", Duration::from_secs(10), |event| {
            matches!(event, PodEvent::Ready).then_some(())
        })
        .await
    }

    /// Sends `command` to the pod as one JSON line on its stdin.
    ///
    /// # Errors
    ///
    /// Fails when the pod's stdin is closed or cannot be written.
    pub async fn send(&mut self, command: &PushCommand) -> Result<(), PodError> {
        let command_error = |source| PodError::Command {
            label: self.label.clone(),
            source,
        };
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| command_error(std::io::Error::other("stdin closed")))?;
        let mut line = serde_json::to_vec(command)
            .map_err(|error| command_error(std::io::Error::other(error)))?;
        line.push(b'\n');
        let written = async {
            stdin.write_all(&line).await?;
            stdin.flush().await
        };
        written.await.map_err(|source| PodError::Command {
            label: self.label.clone(),
            source,
        })
    }

    /// Sends SIGTERM: a proxy stops accepting and keeps its relays; other roles exit.
    pub fn terminate(&self) {
        if let Some(pid) = self.child.id().and_then(|pid| i32::try_from(pid).ok()) {
            // SAFETY: kill has no memory effects; the pid is our own unreaped child.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
    }
}

impl Drop for PodProcess {
    fn drop(&mut self) {
        self.reader.abort();
        let _ = self.child.start_kill();
        // Reap it so no zombie or straggler outlives the lab; bounded, SIGKILL is quick.
        for _ in 0..400 {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }
}

/// Files an observation; hands back events the lab waits for.
fn record(
    event: PodEvent,
    gateway_index: Option<usize>,
    observations: &SharedObservations,
) -> Option<PodEvent> {
    let Ok(mut observed) = observations.lock() else {
        return Some(event);
    };
    match (event, gateway_index) {
        (PodEvent::SessionOpened { user_id, host, .. }, Some(index)) => {
            observed.sessions.insert(user_id, (index, host));
        }
        (PodEvent::SessionClosed { user_id, .. }, Some(index)) => {
            if observed
                .sessions
                .get(&user_id)
                .is_some_and(|(at, _)| *at == index)
            {
                observed.sessions.remove(&user_id);
            }
        }
        (PodEvent::PushServed { authority, .. }, Some(index)) => {
            *observed.push_calls.entry((index, authority)).or_default() += 1;
        }
        (PodEvent::RelayFailed { user_id, error, .. }, _) => {
            observed.relay_failures.insert(user_id, error);
        }
        (PodEvent::RelayOpened { .. }, _) => {}
        (event, _) => return Some(event),
    }
    None
}
