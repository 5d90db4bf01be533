//! An observer's life on the kernel, with the syscall hook: it reports a watched connection
//! from connect to close with its process and ports, ignores the ports it is not told to
//! watch, refuses bad usage in one line, and leaves no program loaded once stopped.
//!
//! Each test starts the real `observer` binary (which loads and attaches the eBPF programs),
//! makes real loopback connections, and checks what comes out. They need root and an observer
//! built with its programs: without them they skip and say why, except under `cargo xtask test`
//! (`OBSERVER_REQUIRE_EBPF`), where they fail. They share kernel state (attached programs), so
//! they take `serial()` and run one at a time; each asks `free_port()` for its ports. The
//! harness is in the test kit (`openim_test_kit::{observer_process, captured, privileges}`).

use std::{
    io::{Read, Write},
    net::TcpStream,
    process::Command,
    time::{Duration, Instant},
};

use openim_test_kit::{
    captured::{events_on_port, listen, serial, skipped_runs_are_read_where_counted},
    observer_process::{Observer, stopped_line},
    ports::{free_port, free_ports},
    privileges::can_run,
};

const OBSERVER: &str = env!("CARGO_BIN_EXE_observer");

/// With the TCP state changes from either tracepoint: the raw one, reading the socket where
/// the kernel's BTF says its fields are, and the formatted one, for kernels without BTF.
#[test]
fn a_watched_connect_reports_its_lifecycle_with_process_and_ports() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    for (state_tracepoint, port) in [("raw", free_port()), ("formatted", free_port())] {
        a_watched_connect_reports_its_lifecycle(state_tracepoint, port);
    }
}

fn a_watched_connect_reports_its_lifecycle(state_tracepoint: &str, port: u16) {
    let listener = listen(port);
    let mut observer = Observer::start(
        OBSERVER,
        &[
            "--grpc-port",
            &port.to_string(),
            "--state-tracepoint",
            state_tracepoint,
        ],
    );
    let started = observer
        .wait_for(|line| line["kind"] == "observer_started")
        .unwrap();
    assert_eq!(started["state_tracepoint"], state_tracepoint, "{started}");

    let client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let local_port = client.local_addr().unwrap().port();
    let (server_side, _) = listener.accept().unwrap();
    drop(client);
    drop(server_side);
    let comm = thread_comm();

    let closed = observer.wait_for(|line| {
        line["kind"] == "tcp_state" && line["new_state"] == "CLOSE" && line["dport"] == port
    });
    let closed = closed.expect("no CLOSE state seen");
    // The kernel releases the local port before the state changes to CLOSE: the port is the
    // one the socket had all the same.
    assert_eq!(closed["sport"], local_port, "{closed}");
    assert_eq!(closed["saddr"], "127.0.0.1", "{closed}");
    let (lines, stderr) = observer.stop();
    skipped_runs_are_read_where_counted(&stopped_line(&stderr)["kernel"]);
    let ours = events_on_port(&lines, port);

    let connect = ours
        .iter()
        .find(|line| line["kind"] == "tcp_connect")
        .expect("tcp_connect");
    assert_eq!(connect["pid"], std::process::id());
    assert_eq!(connect["comm"], comm.as_str());
    assert_eq!(connect["daddr"], "127.0.0.1");
    let established = ours
        .iter()
        .find(|line| line["kind"] == "tcp_state" && line["new_state"] == "ESTABLISHED")
        .expect("ESTABLISHED");
    assert_eq!(established["old_state"], "SYN_SENT");
    assert_eq!(established["sport"], local_port);
    assert_eq!(established["pid"], std::process::id());
    assert_eq!(established["comm"], comm.as_str());
    assert_eq!(established["connection"], connect["connection"]);
    let close = ours
        .iter()
        .find(|line| line["kind"] == "close")
        .expect("descriptor close");
    assert_eq!(close["sport"], local_port);
}

fn thread_comm() -> String {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
        .unwrap()
        .trim()
        .to_owned()
}

#[test]
fn an_unwatched_port_produces_nothing() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    let [watched, unwatched] = free_ports();
    let listener = listen(unwatched);
    let _watched_listener = listen(watched);
    let observer = Observer::start(OBSERVER, &["--grpc-port", &watched.to_string()]);

    let mut client = TcpStream::connect(("127.0.0.1", unwatched)).unwrap();
    let (mut server_side, _) = listener.accept().unwrap();
    client.write_all(b"not for us").unwrap();
    let mut buffer = [0u8; 10];
    server_side.read_exact(&mut buffer).unwrap();
    drop(client);
    // A watched connection afterwards proves the observer was live all along.
    let probe = TcpStream::connect(("127.0.0.1", watched)).unwrap();
    drop(probe);
    let mut observer = observer;
    assert!(
        observer
            .wait_for(|line| line["kind"] == "tcp_connect" && line["dport"] == watched)
            .is_some()
    );
    let (lines, _) = observer.stop();
    assert!(
        events_on_port(&lines, unwatched).is_empty(),
        "events for an unwatched port"
    );
}

#[test]
fn stopping_leaves_no_program_loaded() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    let port = free_port().to_string();
    let observer = Observer::start(OBSERVER, &["--grpc-port", &port]);
    let ours = |name: &str| {
        observer::capture::kernel::program_names()
            .any(|program| program.starts_with(name) || name.starts_with(program))
    };
    let loaded = || -> Vec<String> {
        aya::programs::loaded_programs()
            .filter_map(Result::ok)
            .filter_map(|info| info.name_as_str().map(str::to_owned))
            .filter(|name| !name.is_empty() && ours(name))
            .collect()
    };
    assert!(
        !loaded().is_empty(),
        "the running observer's programs are not listed"
    );
    observer.stop();
    // The kernel may free a program after an RCU grace period rather than when its last
    // descriptor closes (a raw tracepoint's link defers its release), so it can still be
    // listed for a moment after the process is gone: a full test run here saw
    // `raw_sock_state` once.
    let mut left = loaded();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        left = loaded();
    }
    assert_eq!(left, Vec::<String>::new());
}

#[test]
fn usage_errors_are_one_line_with_exit_code_two() {
    let output = Command::new(OBSERVER)
        .args(["run", "--grpc-port", "70000"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("70000"), "{stderr}");
}
