//! The syscall hook's copies: every send and receive call, byte-exact and in order, up to
//! IOV_MAX entries; around a peer's reset; within the gRPC budget and its refill.
//!
//! Each test starts the real `observer` binary (which loads and attaches the eBPF programs),
//! makes real loopback connections, and checks what comes out. They need root and an observer
//! built with its programs: without them they skip and say why, except under `cargo xtask test`
//! (`OBSERVER_REQUIRE_EBPF`), where they fail. They share kernel state (attached programs), so
//! they take `serial()` and run one at a time; each asks `free_port()` for its ports. The
//! harness is in the test kit (`openim_test_kit::{observer_process, captured, privileges}`).

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    os::fd::AsRawFd,
    thread,
    time::{Duration, Instant},
};

use base64::{Engine, engine::general_purpose::STANDARD as BASE64};
use openim_test_kit::{
    captured::{
        captured_stream, check, events_on_port, iovecs, listen, msghdr, pattern, report, serial,
    },
    observer_process::{Observer, stopped_line},
    ports::free_port,
    privileges::can_run,
};
use serde_json::Value;

const OBSERVER: &str = env!("CARGO_BIN_EXE_observer");

#[test]
fn every_send_and_receive_syscall_is_captured_byte_exact_and_in_order() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    let port = free_port();
    let listener = listen(port);
    let mut observer = Observer::start(OBSERVER, &["--grpc-port", &port.to_string()]);

    let server = thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        let mut request = vec![0u8; 4 + 6 + 10 + 8];
        socket.read_exact(&mut request).unwrap();
        for answer in [&b"one-"[..], b"two-", b"three-", b"four"] {
            socket.write_all(answer).unwrap();
            thread::sleep(Duration::from_millis(50));
        }
        request
    });

    let client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let fd = client.as_raw_fd();
    // SAFETY (all calls below): plain syscalls on our socket with buffers we own.
    unsafe {
        check(libc::write(fd, b"wrt|".as_ptr().cast(), 4), "write");
        check(libc::send(fd, b"send()".as_ptr().cast(), 6, 0), "send");
        let (mut a, mut b, mut c) = (*b"msg", *b"-three", *b"|");
        let mut iov = iovecs(&mut [&mut a, &mut b, &mut c]);
        let header = msghdr(&mut iov);
        check(libc::sendmsg(fd, &header, 0), "sendmsg");
        let (mut d, mut e) = (*b"writ", *b"ev()");
        let iov = iovecs(&mut [&mut d, &mut e]);
        check(libc::writev(fd, iov.as_ptr(), 2), "writev");

        let mut buffer = [0u8; 4];
        check(libc::read(fd, buffer.as_mut_ptr().cast(), 4), "read");
        let mut buffer = [0u8; 4];
        check(
            libc::recv(fd, buffer.as_mut_ptr().cast(), 4, libc::MSG_WAITALL),
            "recv",
        );
        let (mut f, mut g) = ([0u8; 3], [0u8; 3]);
        let mut iov = iovecs(&mut [&mut f, &mut g]);
        let mut header = msghdr(&mut iov);
        check(libc::recvmsg(fd, &mut header, libc::MSG_WAITALL), "recvmsg");
        let (mut h, mut i) = ([0u8; 2], [0u8; 2]);
        let iov = iovecs(&mut [&mut h, &mut i]);
        check(libc::readv(fd, iov.as_ptr(), 2), "readv");
    }
    let request = server.join().unwrap();
    assert_eq!(request, b"wrt|send()msg-three|writev()");
    drop(client);

    assert!(
        observer
            .wait_for(|line| line["kind"] == "close" && line["dport"] == port)
            .is_some()
    );
    let (lines, _) = observer.stop();
    let ours = events_on_port(&lines, port);
    assert_eq!(
        captured_stream(&ours, "send"),
        b"wrt|send()msg-three|writev()"
    );
    assert_eq!(captured_stream(&ours, "recv"), b"one-two-three-four");
    // The three-part sendmsg arrives as one call of 10 bytes, its entries sharing one record.
    let sendmsg_records: Vec<_> = ours
        .iter()
        .filter(|line| line["direction"] == "send" && line["call_len"] == 10)
        .collect();
    assert_eq!(sendmsg_records.len(), 1, "{sendmsg_records:?}");
    assert_eq!(sendmsg_records[0]["len"], 10);
}

#[test]
fn a_large_grpc_write_arrives_in_ordered_chunks_up_to_the_budget() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    let port = free_port();
    let budget: usize = 64 * 1024;
    let listener = listen(port);
    let mut observer = Observer::start(
        OBSERVER,
        &[
            "--grpc-port",
            &port.to_string(),
            "--grpc-budget",
            &budget.to_string(),
        ],
    );
    let payload: Vec<u8> = (0..100 * 1024).map(|index| (index % 251) as u8).collect();
    let server = thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        let mut received = Vec::new();
        socket.read_to_end(&mut received).unwrap();
        received.len()
    });
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    client.write_all(&payload).unwrap();
    drop(client);
    assert_eq!(server.join().unwrap(), payload.len());

    assert!(
        observer
            .wait_for(|line| line["kind"] == "close" && line["dport"] == port)
            .is_some()
    );
    let (lines, _) = observer.stop();
    let ours = events_on_port(&lines, port);
    let captured = captured_stream(&ours, "send");
    assert_eq!(captured.len(), budget);
    assert_eq!(captured, payload[..budget]);
    let chunks: Vec<_> = ours.iter().filter(|line| line["kind"] == "data").collect();
    assert!(chunks.len() >= budget / 4096, "{} chunks", chunks.len());
    assert!(
        chunks
            .iter()
            .all(|line| line["len"].as_u64().unwrap() <= 4096)
    );
    assert_eq!(chunks.last().unwrap()["truncated"], true);
    assert!(
        chunks[..chunks.len() - 1]
            .iter()
            .all(|line| line["truncated"] == false || line["call_len"] != chunks[0]["call_len"]),
        "only the last record of the call is marked truncated"
    );
}

/// Iovec entries over `buffer`, cut at the given lengths in turn.
fn split_iovecs(buffer: &mut [u8], lengths: impl Iterator<Item = usize>) -> Vec<libc::iovec> {
    let mut entries = Vec::new();
    let mut rest = buffer;
    for length in lengths {
        if rest.is_empty() {
            break;
        }
        let (head, tail) = rest.split_at_mut(length.min(rest.len()));
        entries.push(libc::iovec {
            iov_base: head.as_mut_ptr().cast(),
            iov_len: head.len(),
        });
        rest = tail;
    }
    entries
}

/// gRPC C-core's shape: a 9-byte HTTP/2 frame header, then the frame's payload, 130 times.
fn grpc_core_lengths() -> impl Iterator<Item = usize> {
    (0..130).flat_map(|frame| [9, 1 + frame % 13])
}

#[test]
fn calls_with_up_to_iov_max_entries_are_captured_whole_by_either_walk() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    for (walk, port) in [("auto", free_port()), ("tail-calls", free_port())] {
        check_iovec_shapes(walk, port);
    }
}

fn check_iovec_shapes(walk: &str, port: u16) {
    let unwatched_port = free_port();
    let listener = listen(port);
    let unwatched = listen(unwatched_port);
    // A budget that never runs dry: the cost measurement below copies megabytes.
    let mut observer = Observer::start(
        OBSERVER,
        &[
            "--grpc-port",
            &port.to_string(),
            "--copy-walk",
            walk,
            "--grpc-budget",
            &u32::MAX.to_string(),
        ],
    );
    let chosen = observer
        .wait_for(|line| line["kind"] == "observer_started")
        .expect("observer_started")["copy_walk"]
        .as_str()
        .unwrap()
        .to_owned();
    if walk == "tail-calls" {
        assert_eq!(chosen, "tail_calls");
    }

    // Every shape: 260 C-core entries, IOV_MAX tiny entries, IOV_MAX entries around a large
    // one (chunk boundaries inside an entry), and a receive into 700 entries.
    let mut core_call = pattern(1, grpc_core_lengths().sum());
    let mut tiny_entries = pattern(2, (0..1024).map(|entry| 1 + entry % 13).sum());
    let mut large_among_small = pattern(3, 1023 + 20_000);
    let sent: Vec<u8> = [&core_call[..], &tiny_entries, &large_among_small].concat();
    let answer = pattern(4, 700 * 11);
    let expected_sent = sent.clone();
    let answer_to_send = answer.clone();
    let server = thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        let mut request = vec![0u8; expected_sent.len()];
        socket.read_exact(&mut request).unwrap();
        socket.write_all(&answer_to_send).unwrap();
        request
    });
    let client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let fd = client.as_raw_fd();
    let mut received = vec![0u8; answer.len()];
    // SAFETY (all calls below): plain syscalls on our socket with buffers we own.
    unsafe {
        let mut iov = split_iovecs(&mut core_call, grpc_core_lengths());
        assert_eq!(iov.len(), 260);
        let header = msghdr(&mut iov);
        check(libc::sendmsg(fd, &header, 0), "sendmsg 260");
        let iov = split_iovecs(&mut tiny_entries, (0..1024).map(|entry| 1 + entry % 13));
        assert_eq!(iov.len(), 1024);
        check(libc::writev(fd, iov.as_ptr(), 1024), "writev 1024");
        let lengths = (0..1024).map(|entry| if entry == 500 { 20_000 } else { 1 });
        let mut iov = split_iovecs(&mut large_among_small, lengths);
        assert_eq!(iov.len(), 1024);
        let header = msghdr(&mut iov);
        check(libc::sendmsg(fd, &header, 0), "sendmsg 1024");
        let mut iov = split_iovecs(&mut received, std::iter::repeat(11));
        assert_eq!(iov.len(), 700);
        let mut header = msghdr(&mut iov);
        check(
            libc::recvmsg(fd, &mut header, libc::MSG_WAITALL),
            "recvmsg 700",
        );
    }
    assert_eq!(server.join().unwrap(), sent);
    assert_eq!(received, answer);
    let measured = measure_core_sendmsg(port, &unwatched);
    drop(client);
    assert!(
        observer
            .wait_for(|line| line["kind"] == "close" && line["dport"] == port)
            .is_some()
    );
    let (lines, stderr) = observer.stop();
    let ours: Vec<&Value> = events_on_port(&lines, port)
        .into_iter()
        .filter(|line| line["connection"] == lines_connection(&lines, port))
        .collect();
    assert_eq!(captured_stream(&ours, "send"), sent, "{walk}");
    assert_eq!(captured_stream(&ours, "recv"), answer, "{walk}");
    let kernel = &stopped_line(&stderr)["kernel"];
    for counter in [
        "calls_cut_at_step_limit",
        "calls_cut_unreadable",
        "calls_cut_at_chunk_limit",
    ] {
        assert_eq!(kernel[counter], 0, "{walk}: {kernel}");
    }
    report(&format!(
        "{chosen}: a 260-entry sendmsg of {} bytes costs {measured}",
        grpc_core_lengths().sum::<usize>()
    ));
}

/// The connection of the first `tcp_connect` to `port`.
fn lines_connection(lines: &[Value], port: u16) -> Value {
    lines
        .iter()
        .find(|line| line["kind"] == "tcp_connect" && line["dport"] == port)
        .expect("tcp_connect")["connection"]
        .clone()
}

/// Nanoseconds per 260-entry sendmsg on a watched and on an unwatched connection, in
/// interleaved rounds (a figure, not a check).
fn measure_core_sendmsg(watched_port: u16, unwatched: &TcpListener) -> String {
    const CALLS_PER_ROUND: u32 = 500;
    const ROUNDS: u32 = 4;
    let unwatched_port = unwatched.local_addr().unwrap().port();
    let sink = |listener: TcpListener| {
        thread::spawn(move || {
            let (mut socket, _) = listener.accept().unwrap();
            let mut sink = Vec::new();
            let _ = socket.read_to_end(&mut sink);
        })
    };
    let watched_listener = listen(watched_port);
    let sinks = [sink(watched_listener), sink(unwatched.try_clone().unwrap())];
    let watched = TcpStream::connect(("127.0.0.1", watched_port)).unwrap();
    let plain = TcpStream::connect(("127.0.0.1", unwatched_port)).unwrap();
    let mut call = pattern(5, grpc_core_lengths().sum());
    let mut iov = split_iovecs(&mut call, grpc_core_lengths());
    let header = msghdr(&mut iov);
    let mut totals = [Duration::ZERO; 2];
    for _ in 0..ROUNDS {
        for (index, socket) in [&watched, &plain].into_iter().enumerate() {
            let start = Instant::now();
            for _ in 0..CALLS_PER_ROUND {
                // SAFETY: sendmsg on our socket with buffers we own.
                check(
                    unsafe { libc::sendmsg(socket.as_raw_fd(), &header, 0) },
                    "sendmsg",
                );
            }
            totals[index] += start.elapsed();
        }
    }
    drop((watched, plain));
    for sink in sinks {
        sink.join().unwrap();
    }
    let calls = f64::from(CALLS_PER_ROUND * ROUNDS);
    let per_call = |total: Duration| total.as_nanos() as f64 / calls;
    format!(
        "{:.0} ns watched, {:.0} ns unwatched (+{:.0} ns)",
        per_call(totals[0]),
        per_call(totals[1]),
        per_call(totals[0]) - per_call(totals[1])
    )
}

#[test]
fn what_is_written_and_read_around_a_peer_reset_and_the_close_are_recorded_every_time() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    const RUNS: usize = 100;
    let port = free_port();
    let listener = listen(port);
    let mut observer = Observer::start(OBSERVER, &["--grpc-port", &port.to_string()]);
    let answer = b"HTTP/1.1 400 Bad Request\r\n\r\n";
    // What grpc-go does with a WebSocket upgrade on its port: it reads the 24 bytes of a
    // client preface, finds none, and resets the connection (SO_LINGER 0). This one answers
    // first, so the client also reads after the reset.
    let server = thread::spawn(move || {
        for _ in 0..RUNS {
            let (mut socket, _) = listener.accept().unwrap();
            let mut preface = [0u8; 24];
            socket.read_exact(&mut preface).unwrap();
            socket.write_all(answer).unwrap();
            let linger = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            // SAFETY: setsockopt on our socket with a value we own.
            let set = unsafe {
                libc::setsockopt(
                    socket.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_LINGER,
                    (&linger as *const libc::linger).cast(),
                    std::mem::size_of::<libc::linger>() as libc::socklen_t,
                )
            };
            assert_eq!(set, 0, "SO_LINGER");
        }
    });
    let mut runs = Vec::new();
    for run in 0..RUNS {
        let request = format!(
            "GET /?sendID={}&platformID=5 HTTP/1.1\r\nHost: gw-0:88\r\nUpgrade: \
            websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\r\n",
            3_000_000_000u64 + run as u64
        );
        let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let local_port = client.local_addr().unwrap().port();
        client.write_all(request.as_bytes()).unwrap();
        // Wait for the reset, then read what arrived before it.
        let mut poll = libc::pollfd {
            fd: client.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while poll.revents & libc::POLLHUP == 0 && Instant::now() < deadline {
            // SAFETY: poll on one descriptor we own.
            unsafe { libc::poll(&mut poll, 1, 100) };
        }
        let mut buffer = [0u8; 64];
        let read = client
            .read(&mut buffer)
            .expect("the answer, read after the reset");
        assert_eq!(&buffer[..read], answer);
        runs.push((local_port, request));
    }
    server.join().unwrap();
    let last_port = runs.last().unwrap().0;
    assert!(
        observer
            .wait_for(|line| line["kind"] == "close" && line["sport"] == last_port)
            .is_some()
    );
    let (lines, _) = observer.stop();
    let ours = events_on_port(&lines, port);
    for (run, (local_port, request)) in runs.iter().enumerate() {
        let connection: Vec<&Value> = ours
            .iter()
            .copied()
            .filter(|line| line["sport"] == *local_port)
            .collect();
        assert_eq!(
            String::from_utf8_lossy(&captured_stream(&connection, "send")),
            *request,
            "run {run}: the write before the reset"
        );
        assert_eq!(
            captured_stream(&connection, "recv"),
            answer,
            "run {run}: the read after the reset"
        );
        assert!(
            connection.iter().any(|line| line["kind"] == "close"),
            "run {run}: the close after the reset"
        );
    }
}

#[test]
fn the_grpc_budget_refills_so_a_long_lived_connection_stays_watched() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    let port = free_port();
    let burst = 8 * 1024;
    let listener = listen(port);
    let mut observer = Observer::start(
        OBSERVER,
        &[
            "--grpc-port",
            &port.to_string(),
            "--grpc-budget",
            &burst.to_string(),
            "--grpc-budget-refill",
            "65536",
        ],
    );
    let bulk = pattern(6, 64 * 1024);
    let message = |index: usize| pattern(100 + index, 512);
    const MESSAGES: usize = 100;
    let total = bulk.len() + MESSAGES * 512;
    let server = thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        let mut received = vec![0u8; total];
        socket.read_exact(&mut received).unwrap();
    });
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    // A bulk write drains the bucket; then messages at 25 KiB/s, well under the refill rate,
    // each captured whole once the bucket has refilled, long past the burst.
    client.write_all(&bulk).unwrap();
    thread::sleep(Duration::from_millis(300));
    for index in 0..MESSAGES {
        client.write_all(&message(index)).unwrap();
        thread::sleep(Duration::from_millis(20));
    }
    server.join().unwrap();
    drop(client);
    assert!(
        observer
            .wait_for(|line| line["kind"] == "close" && line["dport"] == port)
            .is_some()
    );
    let (lines, stderr) = observer.stop();
    let ours = events_on_port(&lines, port);
    let mut captured = std::collections::BTreeMap::new();
    for line in ours
        .iter()
        .filter(|line| line["kind"] == "data" && line["direction"] == "send")
    {
        let payload = BASE64
            .decode(line["payload_b64"].as_str().unwrap())
            .unwrap();
        captured.insert(line["offset"].as_u64().unwrap() as usize, payload);
    }
    let mut burst_captured = Vec::new();
    while let Some(chunk) = captured.get(&burst_captured.len()) {
        burst_captured.extend_from_slice(chunk);
    }
    assert_eq!(burst_captured, bulk[..burst], "the burst");
    for index in 0..MESSAGES {
        let offset = bulk.len() + index * 512;
        assert_eq!(
            captured.get(&offset),
            Some(&message(index)),
            "message {index} at {offset}"
        );
    }
    // The bulk write's tail (a little less if it took several calls and the bucket regained a
    // few bytes between them).
    let kernel = &stopped_line(&stderr)["kernel"];
    let over_budget = kernel["bytes_over_budget"].as_u64().unwrap() as usize;
    assert!(
        (bulk.len() - burst - 1024..=bulk.len() - burst).contains(&over_budget),
        "{kernel}"
    );
}
