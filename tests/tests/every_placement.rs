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
