//! Checks that the engine under a flood keeps to its memory budget and sheds the least useful state
//! first.

use bytes::Bytes;

use crate::correlate::{Engine, EngineConfig};
use crate::{
    budget::MemoryBudget,
    model::{Direction, Event, EventKind, PortClass, wire::CLIENT_PREFACE},
};

const SEC: u64 = 1_000_000_000;

fn event(connection: u64, ts_ns: u64, port_class: PortClass, kind: EventKind) -> Event {
    Event {
        ts_ns,
        connection,
        pid: 10,
        comm: "flooder".into(),
        cgroup_id: 1,
        saddr: "10.0.0.2".parse().unwrap(),
        sport: 40000,
        daddr: "10.0.0.10".parse().unwrap(),
        dport: if port_class == PortClass::Grpc {
            88
        } else {
            80
        },
        port_class,
        kind,
    }
}

fn data(connection: u64, ts_ns: u64, port_class: PortClass, offset: u64, bytes: Vec<u8>) -> Event {
    event(
        connection,
        ts_ns,
        port_class,
        EventKind::Data {
            direction: Direction::Send,
            offset,
            call_len: bytes.len() as u64,
            truncated: false,
            payload: Bytes::from(bytes),
        },
    )
}

/// Builds what the flood sends: the client preface, then a frame header announcing a frame
/// the decoder must buffer (0x0ffff0 bytes, just under its 1 MiB limit, so the filler never
/// completes it), then filler.
fn garbage(length: usize) -> Vec<u8> {
    let mut bytes = CLIENT_PREFACE.to_vec();
    bytes.extend_from_slice(&[0x0f, 0xff, 0xf0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01]);
    bytes.resize(CLIENT_PREFACE.len() + 9 + length, 0x5a);
    bytes
}

fn place_user(engine: &mut Engine, connection: u64, ts_ns: u64, user: &str) {
    let mut alerts = Vec::new();
    let request = format!(
        "GET /?sendID={user}&platformID=1 HTTP/1.1\r\nHost: gw-0\r\nUpgrade: websocket\r\n\r\n"
    );
    engine.on_event(
        &data(
            connection,
            ts_ns,
            PortClass::WebSocket,
            0,
            request.into_bytes(),
        ),
        &mut alerts,
    );
}

fn engine(budget: usize) -> Engine {
    Engine::new(EngineConfig {
        memory: MemoryBudget::new(budget),
        max_connections: MemoryBudget::new(budget).max_connections(),
        ..EngineConfig::default()
    })
}

#[test]
fn a_garbage_flood_is_shed_before_live_users() {
    let budget = 8 << 20;
    let mut engine = engine(budget);
    for user in 0..100u64 {
        place_user(&mut engine, 1_000_000 + user, SEC, &format!("user{user}"));
    }
    let mut alerts = Vec::new();
    // 1,500 connections × 64 KiB buffered would be ~94 MiB unbounded.
    for connection in 0..1_500u64 {
        let ts_ns = 2 * SEC + connection;
        engine.on_event(
            &data(connection, ts_ns, PortClass::Grpc, 0, garbage(64 << 10)),
            &mut alerts,
        );
        let memory = engine.memory();
        assert!(
            memory.accounted_bytes() <= budget,
            "{} bytes accounted over a budget of {budget}",
            memory.accounted_bytes()
        );
    }
    let memory = engine.memory();
    assert!(memory.shed_undecoded_decoders > 0, "{memory:?}");
    assert_eq!(memory.shed_users, 0, "users go last: {memory:?}");
    assert_eq!(engine.counters().users_tracked, 100);
}

#[test]
fn users_are_shed_oldest_first_when_nothing_else_is_left() {
    // About 800 users' worth of budget.
    let budget = 1 << 20;
    let mut engine = engine(budget);
    for user in 0..2_000u64 {
        place_user(&mut engine, user, SEC + user, &format!("user{user}"));
    }
    let memory = engine.memory();
    assert!(memory.accounted_bytes() <= budget, "{memory:?}");
    assert!(memory.shed_users > 0, "{memory:?}");
    let counters = engine.counters();
    assert!(counters.users_tracked > 500, "{counters:?}");
    assert!(engine.detectors.placements.of("user1999").is_some());
    assert!(engine.detectors.placements.of("user0").is_none());
}

#[test]
fn a_full_connection_table_evicts_the_idle_rather_than_refusing_the_new() {
    let mut engine = Engine::new(EngineConfig {
        max_connections: 64,
        ..EngineConfig::default()
    });
    let mut alerts = Vec::new();
    for connection in 0..1_000u64 {
        engine.on_event(
            &data(
                connection,
                SEC + connection,
                PortClass::Grpc,
                0,
                garbage(16),
            ),
            &mut alerts,
        );
    }
    let counters = engine.counters().connections;
    assert!(counters.tracked <= 64, "{counters:?}");
    assert_eq!(counters.evicted as usize + counters.tracked, 1_000);
    assert!(
        engine.decoders.is_tracked(999),
        "the newest connection is decoded"
    );
}
