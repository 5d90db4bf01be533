//! The connection table on event streams it meets in the capture: WebSockets upgraded and
//! released, and gRPC ports whose server speaks first.

use super::*;

fn event(kind: EventKind) -> Event {
    Event {
        ts_ns: 1,
        connection: 7,
        pid: 10,
        comm: "msggw-proxy".into(),
        cgroup_id: 1,
        saddr: "10.0.0.2".parse().unwrap(),
        sport: 40000,
        daddr: "10.0.0.10".parse().unwrap(),
        dport: 80,
        port_class: PortClass::WebSocket,
        kind,
    }
}

fn data(direction: Direction, bytes: &'static [u8]) -> Event {
    event(EventKind::Data {
        direction,
        offset: 0,
        call_len: bytes.len() as u64,
        truncated: false,
        payload: Bytes::from_static(bytes),
    })
}

#[test]
fn an_upgraded_websocket_keeps_only_its_id_until_it_closes() {
    let mut decoders = ConnectionDecoders::new(Limits::default(), 4);
    let mut observations = Vec::new();
    decoders.on_event(&event(EventKind::TcpConnect), &mut observations);
    decoders.on_event(
        &data(
            Direction::Send,
            b"GET /?sendID=42&platformID=2 HTTP/1.1\r\nHost: gw-0\r\nUpgrade: websocket\r\n\r\n",
        ),
        &mut observations,
    );
    decoders.on_event(
        &data(Direction::Recv, b"HTTP/1.1 101 Switching Protocols\r\n\r\n"),
        &mut observations,
    );
    assert!(decoders.connections.is_empty(), "the decoder is released");
    assert_eq!(decoders.counters().tracked, 1);
    assert!(matches!(
        observations.as_slice(),
        [
            Observation::UpgradeRequested { user, .. },
            Observation::UpgradeAnswered { status: 101, .. }
        ] if user == "42"
    ));
    observations.clear();
    decoders.on_event(&event(EventKind::Close), &mut observations);
    assert!(matches!(
        observations.as_slice(),
        [Observation::ConnectionClosed { connection: 7, .. }]
    ));
    assert_eq!(decoders.counters().tracked, 0);
}

/// An upgrade request whose end was never captured (a head written in two calls, only the
/// first copied) loses its placement: its close says so, in a counter and a blind spot.
#[test]
fn a_websocket_closed_with_half_a_head_counts_the_placement_lost() {
    let mut decoders = ConnectionDecoders::new(Limits::default(), 4);
    let mut observations = Vec::new();
    decoders.on_event(&event(EventKind::TcpConnect), &mut observations);
    decoders.on_event(
        &data(
            Direction::Send,
            b"GET /?sendID=42&platformID=2 HTTP/1.1\r\nHost: gw-0\r\n",
        ),
        &mut observations,
    );
    decoders.on_event(&event(EventKind::Close), &mut observations);
    assert!(
        matches!(
            observations.as_slice(),
            [Observation::ConnectionClosed { connection: 7, .. }]
        ),
        "{observations:?}"
    );
    assert_eq!(decoders.counters().heads_incomplete, 1);
    assert!(!decoders.take_blind_spots().is_empty());
}

/// Two proxies' upgrades naming one gateway get one copy of its name: an alert line compares
/// gateways by it (`alert::line`), and copies compare byte by byte.
#[test]
fn upgrades_naming_one_gateway_share_one_copy_of_its_name() {
    let mut decoders = ConnectionDecoders::new(Limits::default(), 4);
    let mut observations = Vec::new();
    for connection in [7, 8] {
        let on = |event: Event| Event {
            connection,
            ..event
        };
        decoders.on_event(&on(event(EventKind::TcpConnect)), &mut observations);
        decoders.on_event(
            &on(data(
                Direction::Send,
                b"GET /?sendID=42 HTTP/1.1\r\nHost: gw-0:10001\r\nUpgrade: websocket\r\n\r\n",
            )),
            &mut observations,
        );
    }
    let names: Vec<_> = observations
        .iter()
        .filter_map(|observation| match observation {
            Observation::UpgradeRequested { gateway, .. } => gateway.name.clone(),
            _ => None,
        })
        .collect();
    let [first, second] = names.as_slice() else {
        panic!("two named upgrades: {observations:?}")
    };
    assert_eq!(&**first, "gw-0:10001");
    assert!(std::sync::Arc::ptr_eq(first, second));
}

/// A chunk on a gRPC port (88).
fn grpc_data(direction: Direction, bytes: &'static [u8]) -> Event {
    Event {
        dport: 88,
        port_class: PortClass::Grpc,
        ..data(direction, bytes)
    }
}

/// An HTTP/2 server's first bytes, sent as it accepts: an empty SETTINGS frame.
const SERVER_SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];

/// A gRPC port's connection on which the server's SETTINGS come before `client_first`,
/// the client's first bytes: the decoders, and what they observed.
fn server_first(client_first: &'static [u8]) -> (ConnectionDecoders, Vec<Observation>) {
    let mut decoders = ConnectionDecoders::new(Limits::default(), 4);
    let mut observations = Vec::new();
    decoders.on_event(
        &grpc_data(Direction::Recv, SERVER_SETTINGS),
        &mut observations,
    );
    assert!(observations.is_empty(), "{observations:?}");
    assert_eq!(decoders.buffered_bytes, SERVER_SETTINGS.len(), "held");
    decoders.on_event(&grpc_data(Direction::Send, client_first), &mut observations);
    (decoders, observations)
}

#[test]
fn an_upgrade_sent_to_a_grpc_port_is_told_by_the_client_even_when_the_server_spoke_first() {
    let (_, observations) = server_first(
        b"GET /?sendID=42&platformID=2 HTTP/1.1\r\nHost: gw-0:88\r\nUpgrade: websocket\r\n\r\n",
    );
    assert!(
        matches!(
            observations.as_slice(),
            [Observation::UpgradeOnGrpcPort { user: Some(user), .. }] if user == "42"
        ),
        "{observations:?}"
    );
}

#[test]
fn a_grpc_client_is_told_by_its_preface_after_the_server_spoke_first() {
    let (decoders, observations) = server_first(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    assert!(
        matches!(
            observations.as_slice(),
            [Observation::GrpcConnectionOpened { connection: 7, .. }]
        ),
        "{observations:?}"
    );
    // The held SETTINGS went to the decoder, which keeps nothing of a whole frame.
    assert_eq!(decoders.buffered_bytes, 0);
    assert_eq!(decoders.counters().decode, DecodeCounters::default());
}
