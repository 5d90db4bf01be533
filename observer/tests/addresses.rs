//! Addresses other than plain IPv4: IPv6 connections under either hook, and a dual-stack
//! socket that reaches an IPv4 peer through a mapped address.
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
};

use openim_test_kit::{
    captured::{captured_stream, events_on_port, is_end_of, listen, packet_hook_args, serial},
    cgroup2::Cgroup2Mount,
    observer_process::Observer,
    ports::free_port,
    privileges::can_run,
};

const OBSERVER: &str = env!("CARGO_BIN_EXE_observer");

#[test]
fn ipv6_connections_are_watched_too() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    an_ipv6_connection_is_watched(free_port(), &[]);
}

#[test]
fn the_packet_hook_reads_ipv6_packets_too() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    let cgroups = Cgroup2Mount::mount();
    for (state_tracepoint, port) in [("raw", free_port()), ("formatted", free_port())] {
        let mut args = packet_hook_args(&cgroups).to_vec();
        args.extend(["--state-tracepoint".to_owned(), state_tracepoint.to_owned()]);
        an_ipv6_connection_is_watched(port, &args);
    }
}

fn an_ipv6_connection_is_watched(port: u16, hook_args: &[String]) {
    let listener = TcpListener::bind(("::1", port)).expect("bind [::1]");
    let port_arg = port.to_string();
    let mut args = vec!["--grpc-port", &port_arg];
    args.extend(hook_args.iter().map(String::as_str));
    let mut observer = Observer::start(OBSERVER, &args);
    let mut client = TcpStream::connect(("::1", port)).unwrap();
    let local_port = client.local_addr().unwrap().port();
    let (mut server_side, _) = listener.accept().unwrap();
    client.write_all(b"over v6").unwrap();
    let mut buffer = [0u8; 7];
    server_side.read_exact(&mut buffer).unwrap();
    server_side.write_all(b"back").unwrap();
    client.read_exact(&mut buffer[..4]).unwrap();
    drop(client);
    assert!(observer.wait_for(|line| is_end_of(line, port)).is_some());
    let (lines, _) = observer.stop();
    let ours = events_on_port(&lines, port);
    // The whole 4-tuple on every record after the connect's: the syscall hook reads the
    // source port at ESTABLISHED, the packet hook from the SYN.
    for line in ours.iter().filter(|line| line["kind"] != "tcp_connect") {
        assert_eq!(line["daddr"], "::1", "{line}");
        assert_eq!(line["saddr"], "::1", "{line}");
        assert_eq!(line["sport"], local_port, "{line}");
    }
    assert_eq!(captured_stream(&ours, "send"), b"over v6");
    assert_eq!(captured_stream(&ours, "recv"), b"back");
}

#[test]
fn a_dual_stack_socket_reaching_an_ipv4_peer_is_recorded_as_ipv4() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    let port = free_port();
    let listener = listen(port);
    let mut observer = Observer::start(OBSERVER, &["--grpc-port", &port.to_string()]);
    let mapped: std::net::Ipv6Addr = "::ffff:127.0.0.1".parse().unwrap();
    let mut client = TcpStream::connect((mapped, port)).unwrap();
    assert!(client.local_addr().unwrap().is_ipv6(), "an AF_INET6 socket");
    let local_port = client.local_addr().unwrap().port();
    let (mut server_side, _) = listener.accept().unwrap();
    client.write_all(b"over a mapped address").unwrap();
    let mut buffer = [0u8; 21];
    server_side.read_exact(&mut buffer).unwrap();
    drop(client);
    assert!(
        observer
            .wait_for(|line| line["kind"] == "close" && line["dport"] == port)
            .is_some()
    );
    let (lines, _) = observer.stop();
    let ours = events_on_port(&lines, port);
    assert!(ours.iter().any(|line| line["kind"] == "tcp_connect"));
    for line in &ours {
        assert_eq!(line["daddr"], "127.0.0.1", "{line}");
        assert_eq!(line["saddr"], "127.0.0.1", "{line}");
    }
    let established = ours
        .iter()
        .find(|line| line["kind"] == "tcp_state" && line["new_state"] == "ESTABLISHED")
        .expect("ESTABLISHED");
    assert_eq!(established["sport"], local_port);
    assert_eq!(captured_stream(&ours, "send"), b"over a mapped address");
}
