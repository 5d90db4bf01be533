use std::net::{IpAddr, Ipv4Addr};

use super::*;
use crate::model::PortClass;

const CONNECTION: ConnectionId = 0xffff_8881_0000_0000;

fn event(kind: EventKind) -> Event {
    Event {
        ts_ns: 0,
        connection: CONNECTION,
        pid: 1,
        comm: "push".into(),
        cgroup_id: 1,
        saddr: IpAddr::V4(Ipv4Addr::LOCALHOST),
        sport: 40000,
        daddr: IpAddr::V4(Ipv4Addr::LOCALHOST),
        dport: 88,
        port_class: PortClass::Grpc,
        kind,
    }
}

fn data(offset: u64, bytes: &[u8]) -> Event {
    event(EventKind::Data {
        direction: Direction::Recv,
        offset,
        call_len: bytes.len() as u64,
        truncated: false,
        payload: Bytes::copy_from_slice(bytes),
    })
}

fn offsets(events: &[Event]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::Data { offset, .. } => Some(*offset),
            _ => None,
        })
        .collect()
}

/// A record's payload is a slice of a block shared with other records of its read
/// (`PayloadArena`): held, it keeps none of that block.
#[test]
fn a_held_record_keeps_no_share_of_the_block_it_came_in() {
    let block = Bytes::from(b"aaaabbbb".to_vec());
    let mut ahead = data(4, b"bbbb");
    if let EventKind::Data { payload, .. } = &mut ahead.kind {
        *payload = block.slice(4..8);
    }
    let mut reorder = Reorder::default();
    let mut out = Vec::new();
    reorder.push(ahead, 0, &mut out);
    assert!(out.is_empty(), "held ahead of the gap at 0");
    assert!(block.is_unique(), "the held record copied its bytes");
    reorder.push(data(0, b"aaaa"), 1, &mut out);
    assert_eq!(offsets(&out), [0, 4]);
    let EventKind::Data { payload, .. } = &out[1].kind else {
        unreachable!()
    };
    assert_eq!(&payload[..], b"bbbb");
}

#[test]
fn records_ahead_of_a_gap_wait_for_its_fill() {
    let mut reorder = Reorder::default();
    let mut out = Vec::new();
    reorder.push(data(0, b"aaaa"), 0, &mut out);
    reorder.push(data(8, b"cccc"), 1, &mut out);
    reorder.push(data(12, b"dddd"), 2, &mut out);
    assert_eq!(offsets(&out), [0]);
    assert_eq!(reorder.holding.len(), 1);
    // The fill, and (as the kernel may copy it) bytes after it again: passed on once.
    reorder.push(data(4, b"bbbbcc"), 3, &mut out);
    assert_eq!(offsets(&out), [0, 4, 10, 12]);
    assert_eq!(
        reorder.counters(),
        ReorderCounters {
            records_held: 2,
            gaps_filled: 1,
            gaps_released: 0,
        }
    );
    assert_eq!(reorder.held_bytes, 0);
    assert!(reorder.holding.is_empty());
}

#[test]
fn a_first_record_ahead_of_the_stream_start_waits_too() {
    let mut reorder = Reorder::default();
    let mut out = Vec::new();
    reorder.push(data(4, b"bbbb"), 0, &mut out);
    assert!(out.is_empty());
    reorder.push(data(0, b"aaaa"), 1, &mut out);
    assert_eq!(offsets(&out), [0, 4]);
    // An adopted connection's first record is its start.
    let mut adopted = data(JOINED_STREAM_OFFSET + 4, b"xxxx");
    adopted.connection += 1;
    reorder.push(adopted, 2, &mut out);
    assert_eq!(offsets(&out), [0, 4, JOINED_STREAM_OFFSET + 4]);
}

#[test]
fn a_gap_that_lasts_is_released_with_its_records_in_order() {
    let mut reorder = Reorder::default();
    let mut out = Vec::new();
    reorder.push(data(0, b"aaaa"), 0, &mut out);
    reorder.push(data(12, b"dddd"), 10, &mut out);
    reorder.push(data(8, b"cccc"), 20, &mut out);
    reorder.expire(HOLD_NS, &mut out);
    assert_eq!(offsets(&out), [0]);
    reorder.expire(10 + HOLD_NS, &mut out);
    assert_eq!(offsets(&out), [0, 8, 12]);
    assert_eq!(reorder.counters().gaps_released, 1);
    assert!(reorder.holding.is_empty());
    // Later records follow on from there.
    reorder.push(data(16, b"eeee"), 11 + HOLD_NS, &mut out);
    assert_eq!(offsets(&out), [0, 8, 12, 16]);
}

#[test]
fn a_close_releases_what_waited_before_it() {
    let mut reorder = Reorder::default();
    let mut out = Vec::new();
    reorder.push(data(0, b"aaaa"), 0, &mut out);
    reorder.push(data(8, b"cccc"), 1, &mut out);
    reorder.push(
        event(EventKind::TcpState {
            old: TcpState::LastAck,
            new: TcpState::Close,
        }),
        2,
        &mut out,
    );
    assert_eq!(offsets(&out), [0, 8]);
    assert!(reorder.holding.is_empty() && reorder.streams.is_empty());
    assert!(matches!(
        out.last().unwrap().kind,
        EventKind::TcpState {
            new: TcpState::Close,
            ..
        }
    ));
    assert!(reorder.streams.is_empty());
}

#[test]
fn a_jump_after_a_cut_record_is_not_waited_for() {
    let mut reorder = Reorder::default();
    let mut out = Vec::new();
    let mut cut = data(0, b"aaaa");
    if let EventKind::Data { truncated, .. } = &mut cut.kind {
        *truncated = true;
    }
    reorder.push(cut, 0, &mut out);
    reorder.push(data(100, b"zzzz"), 1, &mut out);
    assert_eq!(offsets(&out), [0, 100]);
    assert_eq!(reorder.counters().records_held, 0);
}

#[test]
fn held_bytes_stay_within_their_bound() {
    let mut reorder = Reorder::default();
    let mut out = Vec::new();
    reorder.push(data(0, b"a"), 0, &mut out);
    let chunk = vec![7u8; 4096];
    let mut offset = 10;
    for _ in 0..(MAX_HELD_BYTES / chunk.len() + 1) {
        reorder.push(data(offset, &chunk), 1, &mut out);
        offset += chunk.len() as u64;
        assert!(reorder.held_bytes <= MAX_HELD_BYTES);
    }
    assert_eq!(reorder.counters().gaps_released, 1);
    assert_eq!(out.len(), 1 + MAX_HELD_BYTES / chunk.len() + 1);
}
