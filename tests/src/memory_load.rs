//! Generates loads that test the observer's memory budget (issue 10), on loopback: a flood of
//! garbage to a watched gRPC port, and many users placed over watched WebSocket connections. The
//! memory test and `cargo xtask bench` run them beside a real observer and read its peak resident
//! memory from its stop line (VmHWM of its own /proc/self/status).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Counts the connections of the flood.
pub const FLOOD_CONNECTIONS: usize = 1_500;
/// Sizes what each connection of the flood writes: the HTTP/2 client preface, a frame header
/// announcing a frame just under the decoder's 1 MiB limit, and filler up to the default
/// per-connection capture budget, so every captured byte is one a decoder would buffer.
pub const FLOOD_BYTES_PER_CONNECTION: usize = 256 << 10;

fn garbage() -> Vec<u8> {
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    // DATA frame of 0x0ffff0 (1,048,560) bytes on stream 1.
    bytes.extend_from_slice(&[0x0f, 0xff, 0xf0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01]);
    bytes.resize(FLOOD_BYTES_PER_CONNECTION, 0x5a);
    bytes
}

/// Runs a server on `port` that accepts everything and reads it all; `answer` is written once a
/// connection's first bytes arrive (a WebSocket server's 101).
async fn sink_server(
    port: u16,
    answer: Option<&'static [u8]>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(("127.0.0.1", port))
        .await
        .with_context(|| format!("bind 127.0.0.1:{port}"))?;
    Ok(tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = vec![0u8; 16 << 10];
                let mut answered = answer.is_none();
                while let Ok(read) = socket.read(&mut buffer).await {
                    if read == 0 {
                        return;
                    }
                    if !answered {
                        answered = true;
                        if socket.write_all(answer.unwrap_or_default()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    }))
}

/// Opens `FLOOD_CONNECTIONS` connections to `port`, writes the garbage on each, holds them open
/// for `hold`; returns how many wrote it all.
///
/// # Errors
///
/// Fails when the descriptor limit cannot be raised enough for the flood, or the sink server cannot
/// listen on `port`.
pub async fn garbage_flood(port: u16, hold: Duration) -> anyhow::Result<usize> {
    let limit = raise_descriptor_limit(4 * FLOOD_CONNECTIONS as u64)?;
    anyhow::ensure!(
        limit >= 2 * FLOOD_CONNECTIONS as u64 + 64,
        "the flood needs {} descriptors, the limit is {limit}",
        2 * FLOOD_CONNECTIONS + 64
    );
    let server = sink_server(port, None).await?;
    let payload = Arc::new(garbage());
    let clients: Vec<_> = (0..FLOOD_CONNECTIONS)
        .map(|_| {
            let payload = Arc::clone(&payload);
            tokio::spawn(async move {
                let mut stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
                stream.write_all(&payload).await.ok()?;
                Some(stream)
            })
        })
        .collect();
    let mut open = Vec::new();
    for client in clients {
        if let Ok(Some(stream)) = client.await {
            open.push(stream);
        }
    }
    tokio::time::sleep(hold).await;
    let written = open.len();
    drop(open);
    server.abort();
    Ok(written)
}

/// Bounds the users placed by one process: both ends of each connection are in it, and its
/// descriptor limit must hold them (20,000 on these machines, a hard limit that root cannot raise
/// here).
pub const USERS_PER_PROCESS: usize = 9_000;

/// Holds the connections of placed users and the server that answered them; dropping it closes all.
pub struct PlacedUsers {
    pub placed: usize,
    _open: Vec<TcpStream>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for PlacedUsers {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Places the users numbered `users`: one WebSocket upgrade each to `port` (answered 101),
/// held open as a proxy holds one per online user, until the result is dropped.
///
/// # Errors
///
/// Fails when the descriptor limit cannot be raised or the server cannot listen on `port`.
pub async fn place_users(port: u16, users: std::ops::Range<usize>) -> anyhow::Result<PlacedUsers> {
    // Both ends are in this process: as many as its descriptor limit allows.
    let wanted = users.len();
    let limit = raise_descriptor_limit(2 * wanted as u64 + 1_024)?;
    let room = usize::try_from(limit.saturating_sub(1_024) / 2).unwrap_or(wanted);
    let users = users.start..users.start + wanted.min(room);
    let server = sink_server(
        port,
        Some(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"),
    )
    .await?;
    let mut open = Vec::with_capacity(users.len());
    // In batches, so the listen backlog never overflows.
    for batch in users.collect::<Vec<_>>().chunks(1_000) {
        let clients: Vec<_> = batch
            .iter()
            .map(|&user| {
                tokio::spawn(async move {
                    let mut stream = connect_from_own_address(user, port).await?;
                    let request = format!(
                        "GET /?sendID=bench-user-{user}&platformID=1 HTTP/1.1\r\nHost: gw-0\r\n\
                         Upgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
                    );
                    stream.write_all(request.as_bytes()).await.ok()?;
                    let mut answer = [0u8; 128];
                    let read = stream.read(&mut answer).await.ok()?;
                    (read > 0).then_some(stream)
                })
            })
            .collect();
        for client in clients {
            if let Ok(Some(stream)) = client.await {
                open.push(stream);
            }
        }
    }
    Ok(PlacedUsers {
        placed: open.len(),
        _open: open,
        server,
    })
}

/// Places `users` users from child processes (`lab place-users`) of `USERS_PER_PROCESS` each,
/// the nth on port `first_port + n`, one process after the other, holds them all for `hold`
/// once every child has placed its share, and returns how many were placed.
///
/// # Errors
///
/// Fails when a child process does not start, ends before it reports, or reports something other
/// than its count.
pub async fn place_users_in_processes(
    lab: &std::path::Path,
    first_port: u16,
    users: usize,
    hold: Duration,
) -> anyhow::Result<usize> {
    use tokio::io::AsyncBufReadExt;
    let mut children = Vec::new();
    let mut placed = 0;
    for (index, first) in (0..users).step_by(USERS_PER_PROCESS).enumerate() {
        let count = USERS_PER_PROCESS.min(users - first);
        let port = first_port + u16::try_from(index)?;
        let mut child = tokio::process::Command::new(lab)
            .arg("place-users")
            .args(["--port", &port.to_string()])
            .args(["--first", &first.to_string()])
            .args(["--count", &count.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {} place-users", lab.display()))?;
        let stdout = child.stdout.take().context("place-users stdout")?;
        // One process places at a time, as users arrive over time rather than all at once.
        let line = tokio::io::BufReader::new(stdout)
            .lines()
            .next_line()
            .await?
            .context("a place-users process ended before it reported")?;
        placed += line
            .trim()
            .parse::<usize>()
            .with_context(|| format!("place-users reported {line:?}"))?;
        children.push(child);
    }
    tokio::time::sleep(hold).await;
    for mut child in children {
        // Its standard input closes: it lets its users go and exits.
        drop(child.stdin.take());
        child.wait().await?;
    }
    Ok(placed)
}

/// Connects to 127.0.0.1:`port` from a loopback address of `user`'s own (127.1.0.0/16, 250
/// users each): one source address has only ~28k ephemeral ports for one destination.
async fn connect_from_own_address(user: usize, port: u16) -> Option<TcpStream> {
    let source = std::net::Ipv4Addr::new(127, 1, (user / 250 % 256) as u8, (user % 250 + 1) as u8);
    let socket = tokio::net::TcpSocket::new_v4().ok()?;
    socket.bind((source, 0).into()).ok()?;
    socket.connect(([127, 0, 0, 1], port).into()).await.ok()
}

/// Raises, since both ends of every connection are in this process, the soft descriptor limit
/// toward `wanted`, as far as the hard limit allows; returns the limit now.
fn raise_descriptor_limit(wanted: u64) -> anyhow::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to an rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            anyhow::bail!("getrlimit: {}", std::io::Error::last_os_error());
        }
        if limit.rlim_cur >= wanted {
            return Ok(limit.rlim_cur);
        }
        limit.rlim_cur = wanted.min(limit.rlim_max);
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
            anyhow::bail!(
                "raising the descriptor limit to {}: {}",
                limit.rlim_cur,
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(limit.rlim_cur)
}

/// Finds the observer's stop line (`observer_stopped`, on stderr).
///
/// # Errors
///
/// Fails when `stderr` holds no stop line.
pub fn stop_line(stderr: &str) -> anyhow::Result<Value> {
    stderr
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line["kind"] == "observer_stopped")
        .context("the observer printed no stop line")
}

/// Returns the observer's peak resident memory, in bytes, from the stop line.
///
/// # Errors
///
/// Fails when the stop line has no `resident_memory.peak_bytes`.
pub fn peak_resident_bytes(stop_line: &Value) -> anyhow::Result<u64> {
    stop_line["resident_memory"]["peak_bytes"]
        .as_u64()
        .context("no resident_memory.peak_bytes in the stop line")
}

/// Numbers the ports of `cargo xtask bench`'s memory rounds, on loopback, below the ephemeral range
/// (a listener cannot take a port a client connection holds): one WebSocket port per placing
/// process.
const BENCH_GRPC_PORT: u16 = 27_288;
const BENCH_FIRST_WS_PORT: u16 = 27_300;
const BENCH_WS_PORTS: u16 = BENCH_USERS.div_ceil(USERS_PER_PROCESS) as u16;
/// Counts the users of the 100k-user round.
pub const BENCH_USERS: usize = 100_000;

/// Measures `cargo xtask bench`'s memory section: the observer's peak resident memory under the
/// garbage flood (with the default budget, and with a budget too large to bind, for reference) and
/// with `BENCH_USERS` users placed. Returns the lines to print.
///
/// # Errors
///
/// Fails when this executable's path is unknown, an observer does not start or stop cleanly, a load
/// fails, or the stop line lacks the peak.
pub async fn measure(observer: &std::path::Path) -> anyhow::Result<String> {
    let mut ports = vec!["--grpc-port".to_owned(), BENCH_GRPC_PORT.to_string()];
    for port in BENCH_FIRST_WS_PORT..BENCH_FIRST_WS_PORT + BENCH_WS_PORTS {
        ports.extend(["--ws-port".to_owned(), port.to_string()]);
    }
    // The placing processes are this one's own binary (`openim-lab place-users`).
    let lab = std::env::current_exe().context("this executable's path")?;
    let mut report = String::from("\nMemory (peak resident memory of the observer, VmHWM)\n");
    let unbounded = (1u64 << 40).to_string();
    let rounds: [(&str, Vec<&str>, bool); 3] = [
        ("garbage flood, default budget", vec![], true),
        (
            "garbage flood, no budget (reference)",
            vec!["--memory-budget", &unbounded],
            true,
        ),
        // Kernel tables sized for the users, as the deploy docs' rule says.
        (
            "100k placed users",
            vec!["--max-watched-connections", "131072"],
            false,
        ),
    ];
    for (label, extra, flood) in rounds {
        let args: Vec<&str> = ports.iter().map(String::as_str).chain(extra).collect();
        let process = crate::observed::ObserverProcess::start(observer, &args)?;
        let done = if flood {
            garbage_flood(BENCH_GRPC_PORT, Duration::from_secs(3)).await
        } else {
            place_users_in_processes(
                &lab,
                BENCH_FIRST_WS_PORT,
                BENCH_USERS,
                Duration::from_secs(3),
            )
            .await
        };
        let output = process.stop()?;
        let done = done?;
        let stopped = stop_line(&output.stderr)?;
        let peak = peak_resident_bytes(&stopped)?;
        let engine = &stopped["engine"];
        let what = if flood {
            format!("{done} connections × {FLOOD_BYTES_PER_CONNECTION} bytes")
        } else {
            // Counted at the stop, after the users left: placements seen, not still held.
            format!(
                "{done} users placed, {} placements seen",
                engine["routes"]["placements"]
            )
        };
        report.push_str(&format!(
            "  {label:<40} peak {:>6.1} MiB  ({what}; shed {}, evicted {}, ring drops {})\n",
            peak as f64 / f64::from(1 << 20),
            engine["memory"]["shed_undecoded_decoders"]
                .as_u64()
                .unwrap_or(0)
                + engine["memory"]["shed_decoders"].as_u64().unwrap_or(0)
                + engine["memory"]["shed_users"].as_u64().unwrap_or(0),
            engine["connections"]["evicted"],
            stopped["kernel"]["ring_full_drops"],
        ));
    }
    Ok(report)
}
