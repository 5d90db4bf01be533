//! The misrouting scenario with every client stack the observer must see through: push's gRPC
//! calls and the users' WebSockets made by the lab's own Rust stack (tonic, tokio-tungstenite),
//! by Go (grpc-go and gorilla/websocket, what OpenIM itself uses) and by Python (grpcio, the gRPC
//! C-core, and websockets), each from IPv4 sockets and from dual-stack ones (AF_INET6 sockets to
//! IPv4-mapped addresses). Gateways and proxy are the lab's own. Every stack must give exact
//! alerts: every misrouted user alerted, no other; and the same from the packet hook
//! (`--capture-hook packets`), which sees each stack's segments rather than its syscalls. The Go
//! stack also calls 3.7's renamed service (`openim.msggateway.msgGateway`) over the long-lived
//! connections 3.6 and later keep.
//!
//! Needs root, an observer built with its eBPF programs and the stack's toolchain (see
//! `tests::lab::stack`); without them a plain `cargo test` skips and says why, `cargo xtask
//! test` (which installs the toolchains) fails. Tests take `SERIAL`: one observer and one lab at
//! a time.

use std::sync::Mutex;
use std::time::Duration;

use openim_test_kit::cgroup2::Cgroup2Mount;
use tests::lab::stack::{AddressFamily, ClientStack};
use tests::observed::{ObserverOutput, Score, observe_lab};
use tests::privileges::can_run_stack;
use tests::{LabConfig, OpenImRelease, ProxyMode};

static SERIAL: Mutex<()> = Mutex::new(());

/// As shipped, with five gateways most users sit on a gateway push does not pick for them.
fn scenario(client_stack: ClientStack, family: AddressFamily, openim: OpenImRelease) -> LabConfig {
    LabConfig {
        mode: ProxyMode::V351,
        openim,
        replicas_initial: 5,
        replicas_final: 5,
        users: 100,
        messages_per_user: 3,
        realtime_timeout: Duration::from_secs(2),
        client_stack,
        family,
        ..LabConfig::default()
    }
}

/// What the observer said about its own sight: the `observer_stopped` counters (lost sync,
/// decoded calls) and every alert kind, for a failure message.
fn diagnosis(output: &ObserverOutput, score: &Score) -> String {
    format!(
        "alerts by kind {:?}; {}",
        score.kinds,
        output.stopped_line()
    )
}

/// Where the observer copies the bytes (`--capture-hook`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hook {
    Syscalls,
    /// At the root of a cgroup v2 hierarchy mounted for the test: the lab's processes, as every
    /// process here, live in its root cgroup.
    Packets,
}

fn every_misrouted_user_and_no_other(client_stack: ClientStack, family: AddressFamily, hook: Hook) {
    every_misrouted_user_and_no_other_on(OpenImRelease::V3_5, client_stack, family, hook);
}

/// The same, with the stand-in speaking `openim`.
fn every_misrouted_user_and_no_other_on(
    openim: OpenImRelease,
    client_stack: ClientStack,
    family: AddressFamily,
    hook: Hook,
) {
    if !can_run_stack(client_stack) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    let cgroups = (hook == Hook::Packets).then(Cgroup2Mount::mount);
    let root = cgroups
        .as_ref()
        .map(|cgroups| cgroups.root().display().to_string());
    let flags = match &root {
        Some(root) => vec!["--capture-hook", "packets", "--cgroup-root", root.as_str()],
        None => vec!["--capture-hook", "syscalls"],
    };
    let (truth, output) = observe_lab(scenario(client_stack, family, openim), &flags);
    assert_eq!(
        truth.summary.connect_failures, 0,
        "every user connects: {:?}",
        truth.summary
    );
    assert_eq!(
        truth.summary.authority_mismatches, 0,
        "push's :authority is the member string: {:?}",
        truth.summary
    );
    let score = Score::new(&truth, &output.alerts);
    assert!(
        score.missed.len() >= 50,
        "five gateways should lose most of 100 users: {:?}",
        truth.summary
    );
    let why = diagnosis(&output, &score);
    assert!(
        score.false_negatives.is_empty(),
        "{} of {} misrouted users not alerted (recall {:.1}%): {:?}; {why}",
        score.false_negatives.len(),
        score.missed.len(),
        score.recall() * 100.0,
        score.false_negatives
    );
    let first_false_alarm = score.false_positives.first().and_then(|user| {
        output
            .alert_lines
            .iter()
            .find(|line| line.contains(&format!("\"user\":\"{user}\"")))
    });
    assert!(
        score.false_positives.is_empty(),
        "{} users alerted but fine (precision {:.1}%): {:?}; the first: {first_false_alarm:?}; \
         {why}",
        score.false_positives.len(),
        score.precision() * 100.0,
        score.false_positives
    );
    // One identity per endpoint: a gateway reached over a dual-stack socket is the same gateway,
    // named by its IPv4 address.
    let mapped: Vec<&String> = output
        .alert_lines
        .iter()
        .filter(|line| line.contains("::ffff:"))
        .collect();
    assert!(
        mapped.is_empty(),
        "alerts name IPv4-mapped addresses: {mapped:?}"
    );
}

#[test]
fn rust_stack_over_ipv4() {
    every_misrouted_user_and_no_other(ClientStack::Rust, AddressFamily::Ipv4, Hook::Syscalls);
}

#[test]
fn rust_stack_over_dual_stack_sockets() {
    every_misrouted_user_and_no_other(ClientStack::Rust, AddressFamily::DualStack, Hook::Syscalls);
}

#[test]
fn go_grpc_and_gorilla_over_ipv4() {
    every_misrouted_user_and_no_other(ClientStack::Go, AddressFamily::Ipv4, Hook::Syscalls);
}

#[test]
fn go_grpc_and_gorilla_over_dual_stack_sockets() {
    every_misrouted_user_and_no_other(ClientStack::Go, AddressFamily::DualStack, Hook::Syscalls);
}

#[test]
fn go_grpc_calling_the_renamed_3_7_service_over_kept_connections() {
    every_misrouted_user_and_no_other_on(
        OpenImRelease::V3_7,
        ClientStack::Go,
        AddressFamily::Ipv4,
        Hook::Syscalls,
    );
}

#[test]
fn python_grpcio_and_websockets_over_ipv4() {
    every_misrouted_user_and_no_other(ClientStack::Python, AddressFamily::Ipv4, Hook::Syscalls);
}

#[test]
fn python_grpcio_and_websockets_over_dual_stack_sockets() {
    every_misrouted_user_and_no_other(
        ClientStack::Python,
        AddressFamily::DualStack,
        Hook::Syscalls,
    );
}

#[test]
fn rust_stack_seen_by_the_packet_hook() {
    every_misrouted_user_and_no_other(ClientStack::Rust, AddressFamily::Ipv4, Hook::Packets);
}

#[test]
fn go_grpc_and_gorilla_seen_by_the_packet_hook() {
    every_misrouted_user_and_no_other(ClientStack::Go, AddressFamily::Ipv4, Hook::Packets);
}

#[test]
fn python_grpcio_and_websockets_over_dual_stack_sockets_seen_by_the_packet_hook() {
    every_misrouted_user_and_no_other(ClientStack::Python, AddressFamily::DualStack, Hook::Packets);
}
