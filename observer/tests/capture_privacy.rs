//! Privacy through the real kernel: a WebSocket port's upgrade is captured with its token
//! masked and no chat after it (under either hook), split and encoded tokens reach no output,
//! and a recording is created private.
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
    os::{fd::AsRawFd, unix::fs::PermissionsExt},
    process::Command,
    thread,
    time::Duration,
};

use base64::{Engine, engine::general_purpose::STANDARD as BASE64};
use openim_test_kit::{
    captured::{
        captured_stream, check, events_on_port, iovecs, is_end_of, listen, msghdr,
        packet_hook_args, serial,
    },
    cgroup2::Cgroup2Mount,
    observer_process::Observer,
    ports::{free_port, free_ports},
    privileges::can_run,
};

const OBSERVER: &str = env!("CARGO_BIN_EXE_observer");

#[test]
fn a_websocket_port_captures_only_the_upgrade_and_its_answer_without_the_token() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    only_the_upgrade_and_its_answer_are_captured(free_port(), &[]);
}

#[test]
fn the_packet_hook_captures_only_the_upgrade_and_its_answer_without_the_token() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    let cgroups = Cgroup2Mount::mount();
    only_the_upgrade_and_its_answer_are_captured(free_port(), &packet_hook_args(&cgroups));
}

/// A WebSocket upgrade with a token, its answer, and three chat frames each way on `port`:
/// the observer, started with `hook_args`, captures the upgrade (token masked) and its answer,
/// and no chat.
fn only_the_upgrade_and_its_answer_are_captured(port: u16, hook_args: &[String]) {
    let secret = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0LWNhbmFyeQ.Zm9vYmFy";
    let listener = listen(port);
    let port_arg = port.to_string();
    let grpc_port = free_port().to_string();
    let mut args = vec!["--grpc-port", &grpc_port, "--ws-port", &port_arg];
    args.extend(hook_args.iter().map(String::as_str));
    let mut observer = Observer::start(OBSERVER, &args);
    let request = format!(
        "GET /?sendID=3355700821&token={secret}&platformID=2 HTTP/1.1\r\nHost: gw-0:80\r\nUpgrade: \
        websocket\r\nConnection: Upgrade\r\n\r\n"
    );
    let answer = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n";
    let server = thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        let mut buffer = [0u8; 4096];
        let _ = socket.read(&mut buffer).unwrap();
        socket.write_all(answer).unwrap();
        for _ in 0..3 {
            let _ = socket.read(&mut buffer).unwrap();
            socket
                .write_all(b"private chat frame from gateway")
                .unwrap();
        }
    });
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    client.write_all(request.as_bytes()).unwrap();
    let mut buffer = [0u8; 4096];
    let read = client.read(&mut buffer).unwrap();
    assert_eq!(&buffer[..read], answer);
    for _ in 0..3 {
        client.write_all(b"private chat frame from client").unwrap();
        let _ = client.read(&mut buffer).unwrap();
    }
    server.join().unwrap();
    drop(client);

    assert!(observer.wait_for(|line| is_end_of(line, port)).is_some());
    let (lines, stderr) = observer.stop();
    let ours = events_on_port(&lines, port);
    let sent = captured_stream(&ours, "send");
    let expected = request.replace(secret, &"*".repeat(secret.len()));
    assert_eq!(String::from_utf8_lossy(&sent), expected);
    assert_eq!(captured_stream(&ours, "recv"), answer);
    let everything = format!("{lines:?}{stderr}");
    assert!(!everything.contains("private chat"), "chat frames captured");
    assert!(!everything.contains("c2VjcmV0LWNhbmFyeQ"), "token leaked");
}

/// Issue 10's leaks, through the real kernel and every output: a token split across iovec
/// entries of one `sendmsg` and a percent-encoded `tok%65n` on a WebSocket port, a 101 answered
/// together with the first chat frame, and an upgrade to the gRPC port in two `send`s cut right
/// after `token=`. Nothing of the canaries reaches `--events`, `--record`, `observer replay` of
/// the recording, or the observer's own logs at trace level.
///
/// Longer than 100 lines on purpose: one scenario told in order, start to end; its steps
/// depend on the ones before.
#[test]
fn split_and_encoded_tokens_reach_no_output_through_the_kernel() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    const TOKEN: &str = "eyJhbGciOiJIUzI1NiJ9.S1BMSVQtQ0FOQVJZ.c2ln";
    const CHAT: &str = "CHAT-CANARY-private-frame";
    let [ws_port, grpc_port] = free_ports();
    let dir = tempfile::tempdir().unwrap();
    let recording = dir.path().join("hostile.jsonl");
    let ws_listener = listen(ws_port);
    let grpc_listener = listen(grpc_port);
    let mut observer = Observer::start_with_env(
        OBSERVER,
        &[
            "--grpc-port",
            &grpc_port.to_string(),
            "--ws-port",
            &ws_port.to_string(),
            "--record",
            recording.to_str().expect("UTF-8 temp path"),
        ],
        &[("RUST_LOG", "observer=trace")],
    );
    let answer = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: \
        Upgrade\r\n\r\n\u{81}\u{19}{CHAT}"
    );
    let ws_server = thread::spawn(move || {
        let (mut socket, _) = ws_listener.accept().unwrap();
        let mut buffer = [0u8; 4096];
        let _ = socket.read(&mut buffer).unwrap();
        socket.write_all(answer.as_bytes()).unwrap();
        let _ = socket.read(&mut buffer);
    });
    let grpc_server = thread::spawn(move || {
        let (mut socket, _) = grpc_listener.accept().unwrap();
        let mut buffer = [0u8; 4096];
        while socket.read(&mut buffer).is_ok_and(|read| read > 0) {}
    });

    let client = TcpStream::connect(("127.0.0.1", ws_port)).unwrap();
    let mut parts: Vec<Vec<u8>> = [
        "GET /?sendID=1&tok".to_owned(),
        format!("en={TOKEN}&platformID=1&tok%65n={TOKEN} HTTP/1.1\r\nAuthori"),
        format!("zation: Bearer {TOKEN}\r\nHost: gw-0:80\r\nUpgrade: websocket\r\n\r\n"),
    ]
    .into_iter()
    .map(String::into_bytes)
    .collect();
    let mut slices: Vec<&mut [u8]> = parts.iter_mut().map(|part| part.as_mut_slice()).collect();
    let mut iov = iovecs(&mut slices);
    let header = msghdr(&mut iov);
    // SAFETY: a connected socket and a msghdr whose iovecs point at live buffers.
    check(
        unsafe { libc::sendmsg(client.as_raw_fd(), &header, 0) },
        "sendmsg",
    );
    let mut buffer = [0u8; 4096];
    let _ = (&client).read(&mut buffer).unwrap();
    drop(client);
    ws_server.join().unwrap();

    let mut client = TcpStream::connect(("127.0.0.1", grpc_port)).unwrap();
    client.write_all(b"GET /?sendID=2&token=").unwrap();
    thread::sleep(Duration::from_millis(20));
    client
        .write_all(format!("{TOKEN}&platformID=5 HTTP/1.1\r\nHost: gw-0:88\r\n\r\n").as_bytes())
        .unwrap();
    drop(client);
    grpc_server.join().unwrap();

    for port in [ws_port, grpc_port] {
        assert!(
            observer
                .wait_for(|line| line["kind"] == "close" && line["dport"] == port)
                .is_some(),
            "close on {port}"
        );
    }
    let (lines, stderr) = observer.stop();
    let ours = events_on_port(&lines, ws_port);
    let sent = String::from_utf8_lossy(&captured_stream(&ours, "send")).into_owned();
    assert!(sent.starts_with("GET /?sendID=1&token=*"), "{sent}");
    assert!(sent.contains("Host: gw-0:80\r\n"), "{sent}");
    let recorded = std::fs::read_to_string(&recording).unwrap();
    let replayed = Command::new(OBSERVER)
        .arg("replay")
        .arg(&recording)
        .env("RUST_LOG", "observer=trace")
        .output()
        .expect("observer replay");
    assert!(replayed.status.success(), "{replayed:?}");
    let everything = format!(
        "{lines:?}\n{stderr}\n{recorded}\n{}\n{}",
        String::from_utf8_lossy(&replayed.stdout),
        String::from_utf8_lossy(&replayed.stderr)
    );
    // The token's middle part, in the clear and as base64 of any alignment.
    for canary in ["S1BMSVQtQ0FOQVJZ", CHAT] {
        assert!(!everything.contains(canary), "{canary} leaked");
        for shift in 0..3 {
            let encoded = BASE64.encode(format!("{}{canary}", &"xx"[..shift]));
            let core = &encoded[4..encoded.len() - 4];
            assert!(!everything.contains(core), "{canary} leaked as base64");
        }
    }
}

#[test]
fn a_recording_is_created_private_once_attached() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let recording = dir.path().join("cap.jsonl");
    let port = free_port();
    let listener = listen(port);
    let mut observer = Observer::start(
        OBSERVER,
        &[
            "--grpc-port",
            &port.to_string(),
            "--record",
            recording.to_str().expect("UTF-8 temp path"),
        ],
    );
    observer
        .wait_for(|line| line["kind"] == "observer_started")
        .expect("observer_started");
    let mode = std::fs::metadata(&recording)
        .expect("the recording exists once attached")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let _server_side = listener.accept().unwrap();
    client.write_all(b"recorded").unwrap();
    drop(client);
    observer
        .wait_for(|line| line["kind"] == "close" && line["dport"] == port)
        .expect("close");
    observer.stop();
    let text = std::fs::read_to_string(&recording).unwrap();
    assert!(
        text.lines().any(|line| line.contains("\"kind\":\"close\"")),
        "{text}"
    );
}
