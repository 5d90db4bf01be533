use bytes::Bytes;
use observer_records::adopted_connection_id;

use super::*;
use crate::{
    decode::{protobuf::tests::sample_request, test_streams},
    model::{Direction, PortClass},
};

mod memory;

fn event(connection: u64, port_class: PortClass, dport: u16, kind: EventKind) -> Event {
    Event {
        ts_ns: 10 * NANOS_PER_SEC,
        connection,
        pid: 10,
        comm: "test".into(),
        cgroup_id: 1,
        saddr: "10.0.0.2".parse().unwrap(),
        sport: 40_000 + (connection % 1000) as u16,
        daddr: "10.0.0.10".parse().unwrap(),
        dport,
        port_class,
        kind,
    }
}

fn data(connection: u64, port_class: PortClass, direction: Direction, bytes: Vec<u8>) -> Event {
    let dport = if port_class == PortClass::Grpc {
        88
    } else {
        80
    };
    event(
        connection,
        port_class,
        dport,
        EventKind::Data {
            direction,
            offset: 0,
            call_len: bytes.len() as u64,
            truncated: false,
            payload: Bytes::from(bytes),
        },
    )
}

fn adopted(connection: u64, port_class: PortClass) -> Event {
    let dport = if port_class == PortClass::Grpc {
        88
    } else {
        80
    };
    event(
        connection,
        port_class,
        dport,
        EventKind::TcpState {
            old: TcpState::Unknown,
            new: TcpState::Established,
        },
    )
}

fn place(engine: &mut Engine, connection: u64, user: &str) {
    let request = format!(
        "GET /?sendID={user}&platformID=2 HTTP/1.1\r\nHost: gw-0\r\nUpgrade: websocket\r\n\r\n"
    );
    let mut alerts = Vec::new();
    for (direction, bytes) in [
        (Direction::Send, request.into_bytes()),
        (
            Direction::Recv,
            b"HTTP/1.1 101 Switching Protocols\r\n\r\n".to_vec(),
        ),
    ] {
        engine.on_event(
            &data(connection, PortClass::WebSocket, direction, bytes),
            &mut alerts,
        );
    }
    assert!(alerts.is_empty());
}

#[test]
fn state_whose_close_was_lost_ends_when_the_kernel_no_longer_has_its_socket() {
    let mut engine = Engine::new(EngineConfig::default());
    let mut alerts = Vec::new();
    place(&mut engine, 0xffff_8000_0000_0007, "u1");
    place(&mut engine, 0xffff_8000_0000_0008, "u2");
    engine.on_event(
        &adopted(adopted_connection_id(55), PortClass::Grpc),
        &mut alerts,
    );
    assert_eq!(engine.counters().users_tracked, 2);
    assert_eq!(engine.counters().connections.tracked, 3);
    // u2's socket is still there; the others closed without their close being seen.
    let alive = HashSet::from([0xffff_8000_0000_0008]);
    engine.reconcile(&alive, 20 * NANOS_PER_SEC, &mut alerts);
    let counters = engine.counters();
    assert_eq!(counters.users_tracked, 1);
    assert_eq!(counters.connections.tracked, 1);
    assert_eq!(counters.connections.closes_reconciled, 2);
    engine.reconcile(&HashSet::new(), 25 * NANOS_PER_SEC, &mut alerts);
    assert_eq!(engine.counters().users_tracked, 0);
    assert_eq!(engine.counters().connections.tracked, 0);
    assert!(alerts.is_empty(), "{alerts:?}");
}

#[test]
fn a_placement_recovered_in_cluster_mode_ends_when_its_adopted_socket_is_gone() {
    let mut engine = Engine::new(EngineConfig {
        node: Some("node-a".into()),
        ..EngineConfig::default()
    });
    let websocket = adopted(adopted_connection_id(91), PortClass::WebSocket);
    engine.adopt(vec![(
        "u1".into(),
        RemotePlacement {
            node: "node-a".into(),
            connection: ConnectionKey::of(&websocket),
            gateway: crate::model::Gateway {
                ip: websocket.daddr,
                port: 80,
                name: None,
            },
            platform: Some(2),
            since_ns: NANOS_PER_SEC,
            proxy: crate::model::Process {
                pid: 10,
                comm: "test".into(),
                cgroup_id: 1,
            },
        },
    )]);
    let mut alerts = Vec::new();
    engine.on_event(&websocket, &mut alerts);
    assert_eq!(engine.counters().users_tracked, 1);
    engine.reconcile(&HashSet::new(), 20 * NANOS_PER_SEC, &mut alerts);
    assert_eq!(engine.counters().users_tracked, 0);
    assert_eq!(engine.counters().connections.tracked, 0);
}

#[test]
fn a_push_to_a_user_whose_placement_went_unseen_says_capture_degraded() {
    let mut engine = Engine::new(EngineConfig::default());
    let mut alerts = Vec::new();
    let websocket = adopted_connection_id(77);
    engine.on_event(&adopted(websocket, PortClass::WebSocket), &mut alerts);
    assert_eq!(
        engine
            .counters()
            .connections
            .adopted_websockets_without_user,
        1
    );
    place(&mut engine, 0xffff_8000_0000_0001, "placed");
    let message = test_streams::push_request_stream(
        &openim_test_kit::http2::grpc_message(0, &sample_request(b"hi", &["placed", "unseen"])),
        16_384,
    );
    engine.on_event(
        &data(
            0xffff_8000_0000_0002,
            PortClass::Grpc,
            Direction::Send,
            message,
        ),
        &mut alerts,
    );
    engine.tick(30 * NANOS_PER_SEC, &mut alerts);
    let kinds: Vec<&str> = alerts.iter().map(Alert::kind).collect();
    assert!(kinds.contains(&"capture_degraded"), "{kinds:?}");
    let degraded: serde_json::Value = serde_json::from_str(
        &alerts
            .iter()
            .find(|alert| alert.kind() == "capture_degraded")
            .unwrap()
            .to_json_line(),
    )
    .unwrap();
    assert_eq!(degraded["reason"], "joined_mid_stream");
    assert_eq!(degraded["state"], "degraded");
    alerts.clear();
    engine.on_event(
        &event(websocket, PortClass::WebSocket, 80, EventKind::Close),
        &mut alerts,
    );
    assert_eq!(alerts.len(), 1);
    assert_eq!(alerts[0].kind(), "capture_degraded");
    assert!(alerts[0].to_json_line().contains("\"recovered\""));
}
