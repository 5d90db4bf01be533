//! Every placement accounted for: users placed over watched WebSocket connections, from child
//! processes one after the other as the memory bench places them (`openim-lab place-users`),
//! and the engine's count of placements equals the number placed, exactly.
//!
//! `OBSERVER_PLACEMENT_USERS` sets how many (default `DEFAULT_USERS`, which runs within about
//! a minute; `tests::memory_load::BENCH_USERS`, 100,000, is the bench's figure).
//!
//! With either capture hook; the tests take `SERIAL`: both watch the same ports.
//!
//! Needs root and an observer built with its eBPF programs (see `tests::privileges`).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use openim_test_kit::cgroup2::Cgroup2Mount;
use tests::lab::find_lab_binary;
use tests::memory_load::{USERS_PER_PROCESS, place_users_in_processes, stop_line};
use tests::observed::{ObserverProcess, find_observer_binary};
use tests::privileges::{Needs, can_run};

static SERIAL: Mutex<()> = Mutex::new(());

const DEFAULT_USERS: usize = 30_000;
const GRPC_PORT: u16 = 27_488;
const FIRST_WS_PORT: u16 = 27_500;

#[test]
fn with_the_syscall_hook_every_placed_user_is_counted_once() {
    if !can_run(Needs::RootAndPrograms) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    every_placed_user_is_counted_once(&["--capture-hook", "syscalls"]);
}

#[test]
fn with_the_packet_hook_every_placed_user_is_counted_once() {
    if !can_run(Needs::RootAndPrograms) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    let cgroups = Cgroup2Mount::mount();
    let root = cgroups.root().display().to_string();
    every_placed_user_is_counted_once(&["--capture-hook", "packets", "--cgroup-root", &root]);
}

/// Places the users under an observer started with `hook_args`, then compares its count.
fn every_placed_user_is_counted_once(hook_args: &[&str]) {
    let users: usize = std::env::var("OBSERVER_PLACEMENT_USERS")
        .ok()
        .and_then(|users| users.parse().ok())
        .unwrap_or(DEFAULT_USERS);
    let processes = u16::try_from(users.div_ceil(USERS_PER_PROCESS)).expect("a port each");
    let mut args = vec!["--grpc-port".to_owned(), GRPC_PORT.to_string()];
    for port in FIRST_WS_PORT..FIRST_WS_PORT + processes {
        args.extend(["--ws-port".to_owned(), port.to_string()]);
    }
    // Kernel tables sized for the users, as the deploy docs' rule says.
    let tables = (users + users / 4).next_power_of_two().max(65_536);
    args.extend(["--max-watched-connections".to_owned(), tables.to_string()]);
    let args: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .chain(hook_args.iter().copied())
        .collect();
    let observer = ObserverProcess::start(&find_observer_binary().expect("observer"), &args)
        .expect("observer attaches");
    let lab = find_lab_binary().expect("openim-lab binary");
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let placed = runtime
        .block_on(place_users_in_processes(
            &lab,
            FIRST_WS_PORT,
            users,
            Duration::from_secs(2),
        ))
        .expect("users placed");
    let output = observer.stop().expect("observer stops cleanly");
    let stopped = stop_line(&output.stderr).expect("stop line");
    let engine = &stopped["engine"];
    eprintln!(
        "{placed} of {users} users placed in {:.1} s; engine {engine}; kernel {}",
        started.elapsed().as_secs_f64(),
        stopped["kernel"],
    );
    assert_eq!(placed, users, "the lab could not place every user");
    assert_eq!(
        engine["routes"]["placements"].as_u64(),
        Some(placed as u64),
        "placements counted against {placed} placed"
    );
}

#[test]
fn with_the_syscall_hook_an_upgrade_head_in_two_writes_is_counted_lost() {
    if !can_run(Needs::RootAndPrograms) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    a_head_in_two_writes_is_counted_lost(&["--capture-hook", "syscalls"]);
}

#[test]
fn with_the_packet_hook_an_upgrade_head_in_two_writes_is_counted_lost() {
    if !can_run(Needs::RootAndPrograms) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    let cgroups = Cgroup2Mount::mount();
    let root = cgroups.root().display().to_string();
    a_head_in_two_writes_is_counted_lost(&["--capture-hook", "packets", "--cgroup-root", &root]);
}

/// The programs copy a WebSocket's first write (first pushed segment) only: an upgrade request
/// written in two loses its end, and with it the placement. Not silently: `heads_incomplete`
/// and `capture_degraded` (`lost_sync`) say so once the connection closes.
fn a_head_in_two_writes_is_counted_lost(hook_args: &[&str]) {
    use std::io::{Read, Write};
    let ws = FIRST_WS_PORT.to_string();
    let grpc = GRPC_PORT.to_string();
    let args = [&["--grpc-port", &grpc, "--ws-port", &ws][..], hook_args].concat();
    let observer = ObserverProcess::start(&find_observer_binary().expect("observer"), &args)
        .expect("observer attaches");
    let listener = std::net::TcpListener::bind(("127.0.0.1", FIRST_WS_PORT)).expect("free port");
    let mut client = std::net::TcpStream::connect(("127.0.0.1", FIRST_WS_PORT)).expect("connect");
    client.set_nodelay(true).expect("nodelay");
    let (mut server, _) = listener.accept().expect("accept");
    client
        .write_all(b"GET /?sendID=split-user&platformID=1 HTTP/1.1\r\nHost: gw-0\r\n")
        .expect("first write");
    let mut first = [0u8; 59];
    server.read_exact(&mut first).expect("first half");
    client
        .write_all(b"Upgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
        .expect("second write");
    let mut second = [0u8; 43];
    server.read_exact(&mut second).expect("second half");
    server
        .write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n")
        .expect("answer");
    let mut answer = [0u8; 56];
    client.read_exact(&mut answer).expect("answer read");
    drop(client);
    drop(server);
    // Health is judged every second.
    std::thread::sleep(Duration::from_millis(2500));
    let output = observer.stop().expect("observer stops cleanly");
    let stopped = output.stopped_line();
    let connections = &stopped["engine"]["connections"];
    assert_eq!(connections["heads_incomplete"], 1, "{connections}");
    assert_eq!(stopped["engine"]["routes"]["placements"], 0);
    assert!(
        output
            .alerts
            .iter()
            .any(|alert| alert["kind"] == "capture_degraded" && alert["reason"] == "lost_sync"),
        "no capture_degraded (lost_sync) among {:?}",
        output.alert_lines
    );
}
