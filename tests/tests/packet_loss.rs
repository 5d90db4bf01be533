//! The packet hook (`--capture-hook packets`) under real packet loss: netfilter drops chosen
//! segments of a loopback connection before they reach the receiving socket, so the segments
//! behind them reach the packet programs first and TCP retransmits the lost ones. The observer
//! must still hand the decoders each direction whole and in order.
//!
//! Host only (not in the kernel guests: it needs `iptables` and the host's netfilter), root,
//! and an observer built with its eBPF programs; without them the test skips (see
//! `tests::privileges`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::Duration;

use base64::{Engine, engine::general_purpose::STANDARD as BASE64};
use openim_test_kit::cgroup2::Cgroup2Mount;
use openim_test_kit::http2::{
    ACK, CLIENT_PREFACE, END_HEADERS, END_STREAM, HEADERS, PING, SETTINGS, WINDOW_UPDATE, frame,
};
use serde_json::Value;
use tests::observed::{ObserverProcess, find_observer_binary, metric_value, scrape_metrics};
use tests::privileges::{Needs, can_run};

const PORT: u16 = 18991;
const METRICS_ADDR: &str = "127.0.0.1:18992";
/// Writes of the server, each its own segment (`TCP_NODELAY`, a pause between them).
const WRITES: usize = 40;
const WRITE_SIZE: usize = 1000;
/// Which of the server's packets to the client netfilter drops (counted from 0: the SYN-ACK,
/// then the ACK of the request, then data): two data segments with segments behind them.
const DROPPED: [u32; 2] = [6, 17];
/// The HTTP/2 test's port, its rounds of request and PING each way, and which segment with
/// payload of each direction it drops (from 0: in the rounds, past the opening writes).
const HTTP2_PORT: u16 = 18993;
const HTTP2_ROUNDS: usize = 12;
const HTTP2_DROPPED: u32 = 6;

/// An iptables rule in the INPUT chain, removed when dropped.
struct DropRule(Vec<String>);

impl DropRule {
    /// Drops the `nth` packet (from 0) from local port `port` on its way in: the receiver's
    /// packet programs never see it.
    fn nth_from_port(port: u16, nth: u32) -> Self {
        Self::nth(&["--sport", &port.to_string()], nth)
    }

    /// Drops the `nth` packet (from 0) with payload coming in from local port `port`
    /// (`port_match` `--sport`: the receiver's packet programs never see it) or to it
    /// (`--dport`: the sender's saw it leave, and see its retransmission). IPv4 and TCP headers
    /// with timestamps are 52 bytes: only packets longer than that count.
    fn nth_segment(port_match: &str, port: u16, nth: u32) -> Self {
        Self::nth(
            &[
                port_match,
                &port.to_string(),
                "-m",
                "length",
                "--length",
                "53:65535",
            ],
            nth,
        )
    }

    /// `matches` are the rule's before its count: only the packets they match are counted.
    fn nth(matches: &[&str], nth: u32) -> Self {
        let rule: Vec<String> = ["INPUT", "-p", "tcp"]
            .iter()
            .chain(matches)
            .chain(&[
                "-m",
                "statistic",
                "--mode",
                "nth",
                "--every",
                "1000000",
                "--packet",
                &nth.to_string(),
                "-j",
                "DROP",
            ])
            .map(|part| (*part).to_owned())
            .collect();
        let status = Command::new("iptables")
            .args(["-w", "-I"])
            .args(&rule)
            .status()
            .expect("run iptables");
        assert!(status.success(), "iptables -I {rule:?}: {status}");
        Self(rule)
    }
}

impl Drop for DropRule {
    fn drop(&mut self) {
        let _ = Command::new("iptables")
            .args(["-w", "-D"])
            .args(&self.0)
            .status();
    }
}

/// The observer with the packet hook at a cgroup v2 hierarchy of its own (held while the
/// observer runs), printing its records, `port` a gRPC port; `more` arguments after those.
fn observe_packets(port: u16, more: &[&str]) -> (Cgroup2Mount, ObserverProcess) {
    let cgroups = Cgroup2Mount::mount();
    let root = cgroups.root().display().to_string();
    let port = port.to_string();
    let mut args = vec![
        "--events",
        "--capture-hook",
        "packets",
        "--cgroup-root",
        &root,
        "--grpc-port",
        &port,
    ];
    args.extend(more);
    let observer = ObserverProcess::start(&find_observer_binary().expect("observer binary"), &args)
        .expect("observer attaches");
    (cgroups, observer)
}

/// One direction of a connection as the observer printed its records (`--events`), which must
/// follow each other in stream order.
fn captured_stream(stdout: &[String], local_port: u16, port: u16, direction: &str) -> Vec<u8> {
    let mut captured = Vec::new();
    for record in stdout
        .iter()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| {
            line["kind"] == "data"
                && line["direction"] == direction
                && line["sport"] == local_port
                && line["dport"] == port
        })
    {
        assert_eq!(
            record["offset"].as_u64().unwrap(),
            captured.len() as u64,
            "records out of order or overlapping: {record}"
        );
        captured.extend(
            BASE64
                .decode(record["payload_b64"].as_str().unwrap())
                .unwrap(),
        );
    }
    captured
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|index| (index * 7 % 251) as u8).collect()
}

#[test]
fn segments_lost_and_retransmitted_are_put_back_in_order() {
    if !can_run(Needs::RootAndPrograms) {
        return;
    }
    let (_cgroups, observer) = observe_packets(PORT, &["--metrics-addr", METRICS_ADDR]);
    // Two rules for two packets: one rule's counter drops only its own nth match.
    let _rules: Vec<DropRule> = DROPPED
        .iter()
        .map(|&nth| DropRule::nth_from_port(PORT, nth))
        .collect();

    let answer = pattern(WRITES * WRITE_SIZE);
    let listener = TcpListener::bind(("127.0.0.1", PORT)).expect("bind");
    let sent = answer.clone();
    let server = std::thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        socket.set_nodelay(true).unwrap();
        let mut request = [0u8; 5];
        socket.read_exact(&mut request).unwrap();
        for chunk in sent.chunks(WRITE_SIZE) {
            socket.write_all(chunk).unwrap();
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut rest = Vec::new();
        socket.read_to_end(&mut rest).unwrap();
    });
    let mut client = TcpStream::connect(("127.0.0.1", PORT)).unwrap();
    client.write_all(b"hello").unwrap();
    let mut received = vec![0u8; answer.len()];
    client.read_exact(&mut received).unwrap();
    assert!(received == answer, "TCP delivered the answer");
    let local_port = client.local_addr().unwrap().port();
    drop(client);
    server.join().unwrap();
    // `/metrics` has the reordering too, within a second or two (the series update each second).
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let gaps_filled_series = "openim_observer_packet_reorder_total{what=\"gaps_filled\"}";
    let mut scraped = String::new();
    for _ in 0..50 {
        scraped = runtime.block_on(scrape_metrics(METRICS_ADDR));
        if scraped.contains(gaps_filled_series) && metric_value(&scraped, gaps_filled_series) >= 1.0
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        metric_value(&scraped, gaps_filled_series) >= 1.0,
        "no gap filled on /metrics:\n{scraped}"
    );
    std::thread::sleep(Duration::from_millis(500));
    let output = observer.stop().expect("observer stops cleanly");

    let captured = captured_stream(&output.stdout, local_port, PORT, "recv");
    assert!(
        captured == answer,
        "captured {} of {} bytes",
        captured.len(),
        answer.len()
    );
    let stopped = output.stopped_line();
    let kernel = &stopped["kernel"];
    assert!(
        kernel["segments_out_of_order"].as_u64().unwrap() >= 1,
        "the losses reached the programs as segments out of order: {kernel}"
    );
    let reorder = &stopped["reorder"];
    assert!(reorder["records_held"].as_u64().unwrap() >= 1, "{reorder}");
    assert!(reorder["gaps_filled"].as_u64().unwrap() >= 1, "{reorder}");
    assert_eq!(reorder["gaps_released"], 0, "{reorder}");
}

/// Writes each of `writes` in a segment of its own (no Nagle, 2 ms apart), then reads `len`
/// bytes.
fn write_apart_then_read(socket: &mut TcpStream, writes: &[Vec<u8>], len: usize) -> Vec<u8> {
    socket.set_nodelay(true).unwrap();
    for write in writes {
        socket.write_all(write).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut received = vec![0u8; len];
    socket.read_exact(&mut received).unwrap();
    received
}

/// The headers of the HTTP/2 frames in `stream` from `start`, which must end with a whole
/// frame; the control frames' (SETTINGS, PING, WINDOW_UPDATE) left out when `calls_only`.
fn frame_headers(stream: &[u8], start: usize, calls_only: bool) -> Vec<Vec<u8>> {
    let mut headers = Vec::new();
    let mut at = start;
    while let Some(header) = stream.get(at..at + 9) {
        if !calls_only || ![SETTINGS, PING, WINDOW_UPDATE].contains(&header[3]) {
            headers.push(header.to_vec());
        }
        at += 9 + u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
    }
    assert_eq!(at, stream.len(), "the stream ends inside a frame");
    headers
}

/// An HTTP/2 connection whose control-frame segments the packet programs leave out, losing a
/// segment each way: the client's, after its packet programs saw it leave (its retransmission
/// brings nothing new), and the server's, before the client's programs saw it (the segments
/// behind it come first, and that direction's frames are no longer followed). Each direction
/// still reaches userspace in order and whole, frame after frame, with every call frame.
#[test]
fn an_http2_connection_losing_segments_keeps_its_frames_whole() {
    if !can_run(Needs::RootAndPrograms) {
        return;
    }
    let (_cgroups, observer) = observe_packets(HTTP2_PORT, &[]);
    let _rules = [
        DropRule::nth_segment("--dport", HTTP2_PORT, HTTP2_DROPPED),
        DropRule::nth_segment("--sport", HTTP2_PORT, HTTP2_DROPPED),
    ];

    // Header blocks of HPACK static-table fields (:method POST, :scheme http, :path /;
    // :status 200), which the output whitelist reads through, so the frames after them are
    // printed with their headers.
    let request = frame(HEADERS, END_HEADERS | END_STREAM, 1, &[0x83, 0x86, 0x84]);
    let answer = frame(HEADERS, END_HEADERS | END_STREAM, 1, &[0x88]);
    let ping = frame(PING, 0, 0, &[7; 8]);
    let settings = frame(SETTINGS, 0, 0, &[0, 4, 0, 1, 0, 0]);
    let mut client_writes = vec![CLIENT_PREFACE.to_vec(), settings.clone()];
    let mut server_writes = vec![settings];
    for round in 0..HTTP2_ROUNDS {
        client_writes.extend([request.clone(), ping.clone()]);
        server_writes.extend([frame(PING, ACK, 0, &[7; 8]), answer.clone()]);
        if round % 4 == 0 {
            client_writes.push(frame(WINDOW_UPDATE, 0, 0, &[0, 0, 1, 0]));
        }
    }
    let listener = TcpListener::bind(("127.0.0.1", HTTP2_PORT)).expect("bind");
    let client_sent: Vec<u8> = client_writes.concat();
    let expected_request = client_sent.clone();
    let server_sent: Vec<u8> = server_writes.concat();
    let server = std::thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        let received = write_apart_then_read(&mut socket, &server_writes, expected_request.len());
        assert!(received == expected_request, "TCP delivered the request");
        let mut rest = Vec::new();
        socket.read_to_end(&mut rest).unwrap();
    });
    let mut client = TcpStream::connect(("127.0.0.1", HTTP2_PORT)).unwrap();
    let received = write_apart_then_read(&mut client, &client_writes, server_sent.len());
    assert!(received == server_sent, "TCP delivered the answer");
    let local_port = client.local_addr().unwrap().port();
    drop(client);
    server.join().unwrap();
    // Past the reordering's wait for a gap (300 ms).
    std::thread::sleep(Duration::from_millis(800));
    let output = observer.stop().expect("observer stops cleanly");

    for (direction, sent, start) in [
        ("send", &client_sent, CLIENT_PREFACE.len()),
        ("recv", &server_sent, 0),
    ] {
        let captured = captured_stream(&output.stdout, local_port, HTTP2_PORT, direction);
        assert!(captured.len() < sent.len(), "{direction}: nothing left out");
        assert_eq!(
            frame_headers(&captured, start, true),
            frame_headers(sent, start, true),
            "{direction}: the call frames differ"
        );
    }
    let stopped = output.stopped_line();
    let kernel = &stopped["kernel"];
    assert!(
        kernel["segments_left_out"].as_u64().unwrap() >= 1,
        "{kernel}"
    );
    assert!(
        kernel["segments_out_of_order"].as_u64().unwrap() >= 1,
        "the server's loss reached the programs as a segment out of order: {kernel}"
    );
    assert_eq!(stopped["reorder"]["gaps_released"], 0, "{stopped}");
}
