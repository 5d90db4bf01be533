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

/// An iptables rule in the INPUT chain, removed when dropped.
struct DropRule(Vec<String>);

impl DropRule {
    /// Drops the `nth` packet (from 0) from local port `port` on its way in.
    fn nth_from_port(port: u16, nth: u32) -> Self {
        let rule: Vec<String> = [
            "INPUT",
            "-p",
            "tcp",
            "--sport",
            &port.to_string(),
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
        ]
        .iter()
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

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|index| (index * 7 % 251) as u8).collect()
}

#[test]
fn segments_lost_and_retransmitted_are_put_back_in_order() {
    if !can_run(Needs::RootAndPrograms) {
        return;
    }
    let cgroups = Cgroup2Mount::mount();
    let root = cgroups.root().display().to_string();
    let port = PORT.to_string();
    let observer = ObserverProcess::start(
        &find_observer_binary().expect("observer binary"),
        &[
            "--events",
            "--capture-hook",
            "packets",
            "--cgroup-root",
            &root,
            "--grpc-port",
            &port,
            "--metrics-addr",
            METRICS_ADDR,
        ],
    )
    .expect("observer attaches");
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

    let records: Vec<Value> = output
        .stdout
        .iter()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| {
            line["kind"] == "data"
                && line["direction"] == "recv"
                && line["sport"] == local_port
                && line["dport"] == PORT
        })
        .collect();
    let mut captured = Vec::new();
    for record in &records {
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
