//! Nothing left behind: after a burst of connections and placed users whose closes the ring
//! drops, and kernel table entries whose end the programs never handled (a skipped run,
//! simulated by copying a live entry under keys no socket has), every tracked connection,
//! user and kernel table entry is gone once the sockets are; with either capture hook.
//!
//! Needs root and an observer built with its eBPF programs; without them the tests skip (see
//! `tests::privileges`). Tests take `SERIAL`: both watch the same ports.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use aya::maps::{MapData, MapInfo};
use openim_test_kit::cgroup2::Cgroup2Mount;
use tests::kernel_tables::{BPF_MAP_UPDATE_ELEM, bpf, keys, observer_tables};
use tests::observed::{ObserverProcess, find_observer_binary, metric_value, scrape_metrics};
use tests::privileges::{Needs, can_run};

static SERIAL: Mutex<()> = Mutex::new(());

const USERS: usize = 1_500;
const GRPC_CONNECTIONS: usize = 1_500;
/// Entries left behind on purpose: keys no socket has (odd, unlike a socket's address).
const LEFT_BEHIND: [u64; 3] = [0xdead_0001, 0xdead_0003, 0xdead_0005];
/// Two sweeps (every 10 s) and a reconciliation after, with room to spare.
const SETTLE: Duration = Duration::from_secs(45);

#[test]
fn with_the_syscall_hook_nothing_is_left_once_the_sockets_are_gone() {
    if !can_run(Needs::RootAndPrograms) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    nothing_left_behind(
        &["--capture-hook", "syscalls"],
        "127.0.0.1:19411",
        "CONNECTIONS",
    );
}

#[test]
fn with_the_packet_hook_nothing_is_left_once_the_sockets_are_gone() {
    if !can_run(Needs::RootAndPrograms) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    let cgroups = Cgroup2Mount::mount();
    let root = cgroups.root().display().to_string();
    nothing_left_behind(
        &["--capture-hook", "packets", "--cgroup-root", &root],
        "127.0.0.1:19412",
        "PACKET_STREAMS",
    );
}

/// Places users and opens gRPC connections under an observer with a two-page ring, leaves
/// entries behind in its `table`, closes everything while it reads nothing (the closes past
/// the ring are dropped), and waits for its tracked state and kernel tables to empty.
fn nothing_left_behind(hook_args: &[&str], metrics_addr: &str, table: &str) {
    // Ports the kernel hands out: a fixed one may be a lingering connection's ephemeral port.
    let [grpc_port, ws_port] = openim_test_kit::ports::free_ports::<2>();
    let grpc = grpc_port.to_string();
    let ws = ws_port.to_string();
    let args = [
        &[
            "--grpc-port",
            &grpc,
            "--ws-port",
            &ws,
            "--ring-bytes",
            "8192",
            "--metrics-addr",
            metrics_addr,
        ][..],
        hook_args,
    ]
    .concat();
    let observer = ObserverProcess::start(&find_observer_binary().expect("observer binary"), &args)
        .expect("observer attaches");
    let maps = ObserverMaps::of(metrics_addr);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (peak, settled, entries) = runtime.block_on(async {
        let placed = tests::memory_load::place_users(ws_port, 0..USERS)
            .await
            .expect("users placed");
        let grpc = open_grpc_connections(grpc_port).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let peak = tracked(metrics_addr).await;
        maps.leave_entries_behind(table);
        observer.pause();
        drop(placed);
        drop(grpc);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        observer.resume();
        let deadline = Instant::now() + SETTLE;
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now = tracked(metrics_addr).await;
            let entries = maps.entries();
            if (now == (0.0, 0.0) && entries.iter().all(|(_, count)| *count == 0))
                || Instant::now() > deadline
            {
                break (peak, now, entries);
            }
        }
    });
    let output = observer.stop().expect("observer stops cleanly");
    let stopped = output.stopped_line();
    let kernel = &stopped["kernel"];
    eprintln!("peak (users, connections) {peak:?}; kernel {kernel}");
    assert!(
        kernel["ring_full_drops"].as_u64().unwrap_or(0) > 0,
        "the tiny ring dropped nothing: {kernel}"
    );
    assert!(peak.0 > 0.0 && peak.1 > 0.0, "tracked nothing: {peak:?}");
    assert_eq!(
        settled,
        (0.0, 0.0),
        "state left after the sockets were gone"
    );
    assert!(
        entries.iter().all(|(_, count)| *count == 0),
        "kernel entries left: {entries:?}"
    );
    assert!(
        kernel["stale_entries_removed"].as_u64().unwrap_or(0) >= LEFT_BEHIND.len() as u64,
        "the entries left behind were not swept: {kernel}"
    );
}

/// `GRPC_CONNECTIONS` connections to `port` that each wrote a few bytes, with the server's
/// ends; dropping them closes both.
async fn open_grpc_connections(port: u16) -> Vec<tokio::net::TcpStream> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("free gRPC port");
    let mut open = Vec::new();
    for _ in 0..GRPC_CONNECTIONS {
        let mut client = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        let (mut server, _) = listener.accept().await.expect("accept");
        client
            .write_all(b"PRI * HTTP/2.0\r\n")
            .await
            .expect("write");
        let mut read = [0u8; 16];
        server.read_exact(&mut read).await.expect("read");
        open.push(client);
        open.push(server);
    }
    open
}

/// The observer's `(users_tracked, connections_tracked)`.
async fn tracked(metrics_addr: &str) -> (f64, f64) {
    let scraped = scrape_metrics(metrics_addr).await;
    (
        metric_value(&scraped, "openim_observer_users_tracked"),
        metric_value(&scraped, "openim_observer_connections_tracked"),
    )
}

/// The connection and descriptor tables of one observer process, by the maps it holds.
struct ObserverMaps {
    maps: Vec<(String, MapData, MapInfo)>,
}

/// The tables whose entries must all go with their sockets.
const TABLES: [&str; 4] = ["CONNECTIONS", "PACKET_STREAMS", "SOCKETS", "ADOPTABLE"];

impl ObserverMaps {
    /// The maps of the observer process started with `metrics_addr` (found by its command
    /// line: other observers may run on this machine).
    fn of(metrics_addr: &str) -> Self {
        let pid = std::fs::read_dir("/proc")
            .expect("/proc")
            .flatten()
            .find(|entry| {
                std::fs::read(entry.path().join("cmdline")).is_ok_and(|cmdline| {
                    let args: Vec<&[u8]> = cmdline.split(|&byte| byte == 0).collect();
                    args.contains(&&b"run"[..]) && args.contains(&metrics_addr.as_bytes())
                })
            })
            .expect("the observer's process")
            .path();
        let pid: u32 = pid
            .file_name()
            .and_then(|name| name.to_str()?.parse().ok())
            .expect("a process id");
        let maps = observer_tables(pid, &TABLES).expect("the observer's maps");
        assert!(
            maps.iter().any(|(name, ..)| name == "CONNECTIONS"),
            "no CONNECTIONS map among the observer's"
        );
        Self { maps }
    }

    /// Each table's entry count.
    fn entries(&self) -> Vec<(String, usize)> {
        self.maps
            .iter()
            .map(|(name, map, info)| (name.clone(), keys(map, info).len()))
            .collect()
    }

    /// Copies an entry of `table` under each key of `LEFT_BEHIND`: entries whose socket no
    /// process holds once that entry's connection closes, as a skipped TCP_CLOSE leaves them.
    fn leave_entries_behind(&self, table: &str) {
        let (_, map, info) = self
            .maps
            .iter()
            .find(|(name, ..)| name == table)
            .unwrap_or_else(|| panic!("no {table} map"));
        let key = keys(map, info)
            .into_iter()
            .next()
            .expect("an entry to copy");
        let mut value = vec![0u8; info.value_size() as usize];
        bpf(
            map,
            BPF_MAP_LOOKUP_ELEM,
            key.as_ptr(),
            value.as_mut_ptr(),
            0,
        )
        .expect("look the entry up");
        for fake in LEFT_BEHIND {
            let fake = fake.to_ne_bytes();
            bpf(
                map,
                BPF_MAP_UPDATE_ELEM,
                fake.as_ptr(),
                value.as_mut_ptr(),
                0,
            )
            .expect("insert an entry");
        }
    }
}

/// `bpf` command: read one element.
const BPF_MAP_LOOKUP_ELEM: u32 = 1;
