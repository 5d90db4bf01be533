//! Runs the Go and Python client stacks' processes (see [`crate::lab::stack`]) and the JSON lines
//! the lab exchanges with them: push calls as raw protobuf bytes (the lab encodes and decodes
//! OpenIM's messages), user connections and the messages that arrive on them.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::lab::client::Arrivals;
use crate::lab::stack::ClientProgram;

/// Starts `program` with piped stdin and stdout, killed with the lab (also on SIGKILL).
fn spawn(program: &ClientProgram) -> anyhow::Result<(Child, ChildStdin, ChildStdout)> {
    let mut command = Command::from(program.command());
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    // SAFETY: prctl is async-signal-safe and only sets this child's parent-death signal.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let mut child = command
        .spawn()
        .with_context(|| format!("start {}", program.program.display()))?;
    let stdin = child.stdin.take().context("client stdin")?;
    let stdout = child.stdout.take().context("client stdout")?;
    Ok((child, stdin, stdout))
}

async fn write_line(stdin: &mut ChildStdin, value: &impl Serialize) -> anyhow::Result<()> {
    let mut line = serde_json::to_vec(value)?;
    line.push(b'\n');
    stdin.write_all(&line).await?;
    stdin.flush().await?;
    Ok(())
}

#[derive(Serialize)]
struct CallRequest<'a> {
    id: u64,
    /// `ip:port` of the gateway.
    target: &'a str,
    /// The HTTP/2 `:authority` (the push ring's member string).
    authority: &'a str,
    /// The gRPC method path.
    method: &'a str,
    /// The encoded request message, base64.
    request: String,
}

#[derive(Deserialize)]
struct CallAnswer {
    id: u64,
    /// The encoded response message, base64.
    #[serde(default)]
    response: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

/// Drives the push pod's gRPC client when it is not tonic: one call at a time, each on a new
/// connection that stays open (3.5.1's leak, as with tonic), or with the program's `--reuse` on the
/// one connection it keeps per gateway (3.6 and later).
pub struct ExternalPush {
    _child: Child,
    stdin: ChildStdin,
    answers: Lines<BufReader<ChildStdout>>,
    next_id: u64,
}

impl ExternalPush {
    /// Starts the client program in its `push` mode.
    ///
    /// # Errors
    ///
    /// Fails when the program cannot be started with piped stdin and stdout.
    pub fn start(program: &ClientProgram) -> anyhow::Result<Self> {
        let (child, stdin, stdout) = spawn(program)?;
        Ok(Self {
            _child: child,
            stdin,
            answers: BufReader::new(stdout).lines(),
            next_id: 1,
        })
    }

    /// Calls `method` on `target` with an encoded request; returns the encoded response.
    ///
    /// # Errors
    ///
    /// Fails when the program cannot be written to, exits, does not answer in time, or answers with
    /// an error, neither a response nor an error, or a line that is not JSON or base64.
    pub async fn call(
        &mut self,
        target: &str,
        authority: &str,
        method: &str,
        request: &[u8],
        timeout: Duration,
    ) -> anyhow::Result<Vec<u8>> {
        let id = self.next_id;
        self.next_id += 1;
        write_line(
            &mut self.stdin,
            &CallRequest {
                id,
                target,
                authority,
                method,
                request: STANDARD.encode(request),
            },
        )
        .await
        .context("send the call to the client program")?;
        let answer = async {
            loop {
                let line = self
                    .answers
                    .next_line()
                    .await?
                    .context("the client program exited")?;
                let answer: CallAnswer = serde_json::from_str(&line)
                    .with_context(|| format!("client program said {line:?}"))?;
                if answer.id == id {
                    return anyhow::Ok(answer);
                }
            }
        };
        // The program's own deadline is shorter; this only guards against a hung program.
        let answer = tokio::time::timeout(timeout * 2, answer)
            .await
            .context("the client program did not answer")??;
        match (answer.response, answer.error) {
            (_, Some(error)) => bail!("{error}"),
            (Some(response), None) => Ok(STANDARD.decode(response)?),
            (None, None) => bail!("the client program answered neither a response nor an error"),
        }
    }
}

#[derive(Serialize)]
struct UserRequest<'a> {
    user: &'a str,
    url: &'a str,
    /// The proxy's `ip:port`.
    address: String,
}

#[derive(Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
enum UserEvent {
    Connected { user: String },
    Failed { user: String, error: String },
    Arrived { user: String, client_msg_id: String },
}

/// Drives the users' WebSocket clients when they are not tokio-tungstenite: one process holds every
/// user's connection; arrivals go straight into the lab's [`Arrivals`].
pub struct ExternalUsers {
    _child: Child,
    stdin: ChildStdin,
    outcomes: mpsc::UnboundedReceiver<(String, Result<(), String>)>,
    reader: JoinHandle<()>,
}

impl Drop for ExternalUsers {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl ExternalUsers {
    /// Starts the client program in its `users` mode, its arrivals going into `arrivals`.
    ///
    /// # Errors
    ///
    /// Fails when the program cannot be started with piped stdin and stdout.
    pub fn start(program: &ClientProgram, arrivals: Arrivals) -> anyhow::Result<Self> {
        let (child, stdin, stdout) = spawn(program)?;
        let (sender, outcomes) = mpsc::unbounded_channel();
        let reader = tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let arrived = Instant::now();
                match serde_json::from_str::<UserEvent>(&line) {
                    Ok(UserEvent::Arrived {
                        user,
                        client_msg_id,
                    }) => {
                        if let Ok(mut arrivals) = arrivals.lock() {
                            arrivals.entry((user, client_msg_id)).or_insert(arrived);
                        }
                    }
                    Ok(UserEvent::Connected { user }) => {
                        let _ = sender.send((user, Ok(())));
                    }
                    Ok(UserEvent::Failed { user, error }) => {
                        let _ = sender.send((user, Err(error)));
                    }
                    Err(_) => {}
                }
            }
        });
        Ok(Self {
            _child: child,
            stdin,
            outcomes,
            reader,
        })
    }

    /// Asks for every user's connection (user id, upgrade URL) at once, then collects whether
    /// each connected, within `timeout`; a user the program never answered for failed.
    ///
    /// # Errors
    ///
    /// Fails when the users cannot be sent to the program; a user that did not connect is reported
    /// in its own result instead.
    pub async fn connect(
        &mut self,
        proxy: std::net::SocketAddr,
        users: &[(String, String)],
        timeout: Duration,
    ) -> anyhow::Result<Vec<(String, Result<(), String>)>> {
        for (user, url) in users {
            write_line(
                &mut self.stdin,
                &UserRequest {
                    user,
                    url,
                    address: proxy.to_string(),
                },
            )
            .await
            .context("send a user to the client program")?;
        }
        let mut pending: std::collections::HashSet<&str> =
            users.iter().map(|(user, _)| user.as_str()).collect();
        let mut outcomes = Vec::new();
        let deadline = tokio::time::Instant::now() + timeout;
        while !pending.is_empty() {
            match tokio::time::timeout_at(deadline, self.outcomes.recv()).await {
                Ok(Some((user, outcome))) => {
                    if pending.remove(user.as_str()) {
                        outcomes.push((user, outcome));
                    }
                }
                Ok(None) => break,
                Err(_) => break,
            }
        }
        outcomes.extend(pending.into_iter().map(|user| {
            (
                user.to_owned(),
                Err("the client program reported no outcome".to_owned()),
            )
        }));
        Ok(outcomes)
    }
}
