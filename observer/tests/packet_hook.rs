//! The packet hook's copies (`--capture-hook packets`, programs at a cgroup's ingress and
//! egress): both directions byte-exact with no syscall hooked, HTTP/2 control frames left out,
//! and a connection made before the observer adopted at its next packet.
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
    thread,
};

use base64::{Engine, engine::general_purpose::STANDARD as BASE64};
use openim_test_kit::{
    captured::{
        captured_stream, events_on_port, is_end_of, listen, packet_hook_args, pattern, serial,
        skipped_runs_are_read_where_counted,
    },
    cgroup2::Cgroup2Mount,
    observer_process::{Observer, stopped_line},
    ports::free_port,
    privileges::can_run,
};
use serde_json::Value;

const OBSERVER: &str = env!("CARGO_BIN_EXE_observer");

/// The observer with the packet hook at `cgroups`, `port` a gRPC port with a budget no test's
/// connection spends (4 MiB).
fn packet_hook_on_grpc_port(cgroups: &Cgroup2Mount, port: u16) -> Observer {
    let port_arg = port.to_string();
    let mut args = vec!["--grpc-port", &port_arg, "--grpc-budget", "4194304"];
    let hook_args = packet_hook_args(cgroups);
    args.extend(hook_args.iter().map(String::as_str));
    Observer::start(OBSERVER, &args)
}

#[test]
fn the_packet_hook_captures_both_directions_byte_exact_with_no_syscall_hooked() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    // The kernel times every BPF program's runs while this is open.
    let _statistics = aya::sys::enable_stats(aya::sys::Stats::RunTime).unwrap();
    let cgroups = Cgroup2Mount::mount();
    let port = free_port();
    let listener = listen(port);
    let mut observer = packet_hook_on_grpc_port(&cgroups, port);
    let started = observer
        .wait_for(|line| line["kind"] == "observer_started")
        .unwrap();
    assert_eq!(started["capture_hook"], "packets", "{started}");
    assert_eq!(started["copy_walk"], Value::Null, "{started}");

    // Several 64 KiB packets each way (loopback's segments), so records split and follow on.
    let request = pattern(1, 300 * 1024);
    let response = pattern(2, 200 * 1024);
    let (expected_request, answer) = (request.clone(), response.clone());
    let server = thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        let mut received = vec![0u8; expected_request.len()];
        socket.read_exact(&mut received).unwrap();
        socket.write_all(&answer).unwrap();
        let mut rest = Vec::new();
        socket.read_to_end(&mut rest).unwrap();
        received == expected_request
    });
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let local_port = client.local_addr().unwrap().port();
    client.write_all(&request).unwrap();
    let mut received = vec![0u8; response.len()];
    client.read_exact(&mut received).unwrap();
    assert_eq!(received, response);
    drop(client);
    assert!(server.join().unwrap(), "the server read what was sent");

    assert!(observer.wait_for(|line| is_end_of(line, port)).is_some());
    let (lines, stderr) = observer.stop();
    let ours = events_on_port(&lines, port);
    assert!(
        captured_stream(&ours, "send") == request,
        "sent bytes differ"
    );
    assert!(
        captured_stream(&ours, "recv") == response,
        "received bytes differ"
    );
    // Records name the process that connected, though no syscall of it was seen.
    let pid = u64::from(std::process::id());
    assert!(
        ours.iter()
            .filter(|line| line["kind"] == "data")
            .all(|line| line["pid"] == pid),
        "records of another process"
    );
    assert!(!ours.iter().any(|line| line["kind"] == "close"));
    // Of the state changes only SYN_SENT and CLOSE are sent: the source port comes from the
    // SYN, and is on every record after it.
    let states: Vec<&str> = ours
        .iter()
        .filter(|line| line["kind"] == "tcp_state")
        .map(|line| line["new_state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["CLOSE"]);
    let connect_sport = ours
        .iter()
        .find(|line| line["kind"] == "tcp_connect")
        .map(|line| line["sport"].clone());
    assert_eq!(connect_sport, Some(Value::from(0)), "chosen after SYN_SENT");
    assert!(
        ours.iter()
            .filter(|line| line["kind"] != "tcp_connect")
            .all(|line| line["sport"] == local_port),
        "a record without the source port"
    );
    let kernel = &stopped_line(&stderr)["kernel"];
    assert_eq!(kernel["bytes_not_captured"], 0, "{kernel}");
    assert_eq!(kernel["map_insert_failures"], 0, "{kernel}");
    // Not HTTP/2, though on a gRPC port: nothing is left out.
    assert_eq!(kernel["segments_left_out"], 0, "{kernel}");
    skipped_runs_are_read_where_counted(kernel);
    // The programs' own CPU, outside the observer's process, as the kernel timed it.
    assert!(kernel["program_runs_timed"].as_u64() > Some(0), "{kernel}");
    assert!(kernel["program_run_time_ns"].as_u64() > Some(0), "{kernel}");
}

/// An HTTP/2 exchange written one frame group at a time, each its own segment (the peer reads
/// it whole before the next is written): under the packet hook, the segments that hold only
/// frames the decoder does not read are left out, and the offsets of the bytes copied close up
/// over them, so the stream received is the connection's without them. A frame larger than a
/// segment is followed across its segments.
///
/// Longer than 100 lines on purpose: one scenario told in order, start to end; its steps
/// depend on the ones before.
#[test]
fn the_packet_hook_leaves_out_segments_of_http2_control_frames_only() {
    use observer_records::http2::{
        CLIENT_PREFACE, FLAG_END_HEADERS, FLAG_END_STREAM, FRAME_DATA, FRAME_GOAWAY, FRAME_HEADERS,
        FRAME_PING, FRAME_SETTINGS, FRAME_WINDOW_UPDATE,
    };
    use openim_test_kit::http2::{ACK, frame};

    if !can_run() {
        return;
    }
    let _serial = serial();
    let cgroups = Cgroup2Mount::mount();
    let port = free_port();
    let listener = listen(port);
    let mut observer = packet_hook_on_grpc_port(&cgroups, port);
    observer
        .wait_for(|line| line["kind"] == "observer_started")
        .unwrap();

    let settings = frame(FRAME_SETTINGS, 0, 0, &[0, 4, 0, 1, 0, 0]);
    let settings_ack = frame(FRAME_SETTINGS, ACK, 0, &[]);
    let window_update = frame(FRAME_WINDOW_UPDATE, 0, 0, &[0, 0x0e, 0, 1]);
    let ping = frame(FRAME_PING, 0, 0, &[7; 8]);
    // Header blocks of HPACK static-table fields (:method POST, :scheme http, :path /;
    // :status 200), which the output whitelist reads through, keeping the frames after them.
    let headers = frame(FRAME_HEADERS, FLAG_END_HEADERS, 1, &[0x83, 0x86, 0x84]);
    // Larger than a loopback segment (64 KiB).
    let data = frame(FRAME_DATA, FLAG_END_STREAM, 1, &pattern(4, 100 * 1024));
    let goaway = frame(FRAME_GOAWAY, 0, 0, &[0; 8]);
    let answer = [
        frame(FRAME_HEADERS, FLAG_END_HEADERS, 1, &[0x88]),
        frame(FRAME_DATA, 0, 1, &pattern(6, 300)),
        frame(
            FRAME_HEADERS,
            FLAG_END_HEADERS | FLAG_END_STREAM,
            1,
            &[0x88],
        ),
    ]
    .concat();
    // (write, whether it is left out)
    let client_writes: Vec<(Vec<u8>, bool)> = vec![
        (CLIENT_PREFACE.to_vec(), false),
        ([settings.clone(), window_update.clone()].concat(), true),
        (headers.clone(), false),
        (data.clone(), false),
        (settings_ack.clone(), true),
        // A control frame ahead of a call frame: kept whole.
        ([ping.clone(), headers.clone()].concat(), false),
        (goaway.clone(), true),
    ];
    let server_writes: Vec<(Vec<u8>, bool)> = vec![
        (settings.clone(), true),
        ([settings_ack.clone(), window_update.clone()].concat(), true),
        (answer.clone(), false),
        (frame(FRAME_PING, ACK, 0, &[7; 8]), true),
    ];
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    client.set_nodelay(true).unwrap();
    server.set_nodelay(true).unwrap();
    let pass = |from: &mut TcpStream, to: &mut TcpStream, write: &[u8]| {
        from.write_all(write).unwrap();
        let mut read = vec![0u8; write.len()];
        to.read_exact(&mut read).unwrap();
        assert!(read == write);
    };
    // The server speaks first, as HTTP/2 servers do; then the two sides take turns.
    pass(&mut server, &mut client, &server_writes[0].0);
    for (write, _) in &client_writes[..4] {
        pass(&mut client, &mut server, write);
    }
    for (write, _) in &server_writes[1..] {
        pass(&mut server, &mut client, write);
    }
    for (write, _) in &client_writes[4..] {
        pass(&mut client, &mut server, write);
    }
    drop(client);
    drop(server);

    assert!(observer.wait_for(|line| is_end_of(line, port)).is_some());
    let (lines, stderr) = observer.stop();
    let ours = events_on_port(&lines, port);
    let kept = |writes: &[(Vec<u8>, bool)]| -> Vec<u8> {
        writes
            .iter()
            .filter(|(_, left_out)| !left_out)
            .flat_map(|(write, _)| write.clone())
            .collect()
    };
    // The output whitelist zeroes what it does not let out (header blocks, message bytes),
    // so the streams are compared by length and by the frame headers where they should be.
    let frame_headers = |stream: &[u8], start: usize| -> Vec<Vec<u8>> {
        let mut headers = Vec::new();
        let mut at = start;
        while let Some(header) = stream.get(at..at + 9) {
            headers.push(header.to_vec());
            at += 9 + u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        }
        headers
    };
    // Send: HEADERS, DATA, PING, HEADERS; receive: HEADERS, DATA, trailers.
    for (direction, writes, start, frames) in [
        ("send", &client_writes, CLIENT_PREFACE.len(), 4),
        ("recv", &server_writes, 0, 3),
    ] {
        let (captured, kept) = (captured_stream(&ours, direction), kept(writes));
        assert_eq!(captured.len(), kept.len(), "{direction}");
        let headers = frame_headers(&kept, start);
        assert_eq!(headers.len(), frames, "{direction}");
        assert_eq!(frame_headers(&captured, start), headers, "{direction}");
    }
    assert_eq!(
        captured_stream(&ours, "send")[..CLIENT_PREFACE.len()],
        CLIENT_PREFACE
    );
    let kernel = &stopped_line(&stderr)["kernel"];
    let left_out = client_writes
        .iter()
        .chain(&server_writes)
        .filter(|(_, left_out)| *left_out)
        .count();
    assert_eq!(kernel["segments_left_out"], left_out, "{kernel}");
    assert_eq!(kernel["bytes_not_captured"], 0, "{kernel}");
}

#[test]
fn the_packet_hook_adopts_a_connection_established_before_it_at_its_next_packet() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    let cgroups = Cgroup2Mount::mount();
    let port = free_port();
    let listener = listen(port);
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    client.write_all(b"before the observer").unwrap();
    let mut before = [0u8; 19];
    server.read_exact(&mut before).unwrap();

    let port_arg = port.to_string();
    let mut args = vec!["--grpc-port", &port_arg];
    let hook_args = packet_hook_args(&cgroups);
    args.extend(hook_args.iter().map(String::as_str));
    let mut observer = Observer::start(OBSERVER, &args);
    let started = observer
        .wait_for(|line| line["kind"] == "observer_started")
        .unwrap();
    assert_eq!(started["adopted_connections"]["grpc"], 1, "{started}");
    // Adopted at its next packet, whichever direction it goes.
    server.write_all(b"answer").unwrap();
    let mut answer = [0u8; 6];
    client.read_exact(&mut answer).unwrap();
    client.write_all(b"request").unwrap();
    let mut request = [0u8; 7];
    server.read_exact(&mut request).unwrap();
    let local_port = client.local_addr().unwrap().port();
    drop(client);
    drop(server);

    assert!(observer.wait_for(|line| is_end_of(line, port)).is_some());
    let (lines, _) = observer.stop();
    let ours: Vec<&Value> = events_on_port(&lines, port)
        .into_iter()
        .filter(|line| line["sport"] == local_port)
        .collect();
    let adopted = ours.first().expect("the adopted connection's records");
    assert_eq!(adopted["kind"], "tcp_state", "{adopted}");
    assert_eq!(adopted["old_state"], "UNKNOWN", "{adopted}");
    assert_eq!(adopted["new_state"], "ESTABLISHED", "{adopted}");
    // Its owner, as /proc named it to the programs, and one connection throughout.
    assert_eq!(adopted["pid"], std::process::id(), "{adopted}");
    assert!(
        ours.iter()
            .all(|line| line["connection"] == adopted["connection"])
    );
    // Each direction's stream starts at its first segment seen, at an offset that says it is
    // not the stream's start; --events then shows zeros (nothing joined mid-way is vouched for).
    for (direction, len) in [("recv", 6), ("send", 7)] {
        let records: Vec<&&Value> = ours
            .iter()
            .filter(|line| line["kind"] == "data" && line["direction"] == direction)
            .collect();
        assert_eq!(records.len(), 1, "{records:?}");
        assert_eq!(records[0]["offset"], observer_records::JOINED_STREAM_OFFSET);
        assert_eq!(records[0]["len"], len);
        let payload = BASE64
            .decode(records[0]["payload_b64"].as_str().unwrap())
            .unwrap();
        assert!(payload.iter().all(|&byte| byte == 0), "{payload:?}");
    }
    let last = ours.last().unwrap();
    assert_eq!(last["new_state"], "CLOSE", "{last}");
}
