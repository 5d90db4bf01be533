//! The engine fuzz target's input format: a byte-driven sequence of capture events.
//!
//! Each event starts with an `op` byte and a `slot` byte:
//! - `op & 3`: 0 and 1 data, 2 `TcpConnect`, 3 close (`op & 4`: a `Close`, else the
//!   `TcpState` change to CLOSE); `op >> 3`: time since the previous event, in 50 ms steps.
//! - `slot & 31`: one of 32 connections; slots 16..31 are WebSocket-port connections (proxy),
//!   0..15 gRPC-port ones (push). `slot >> 5`: which of 8 gateway IPs it goes to.
//! - data then has a `flags` byte (bit 0 receive side, bit 3 truncated, bits 1-2 the offset:
//!   0 continue where the direction stopped, 1 skip ahead by the next byte + 1, 2 step back by
//!   the next byte, 3 the next 4 bytes little-endian), a little-endian u16 length (at most
//!   4096, what the kernel copies) and the payload.
//!
//! `encode` writes events in this format, so the seed corpus can be real synthetic traffic.

use std::net::{IpAddr, Ipv4Addr};

use bytes::Bytes;
use observer::model::{Direction, Event, EventKind, PortClass, TcpState};

pub const SLOTS: usize = 32;
const FIRST_WEBSOCKET_SLOT: u8 = 16;
const TIME_STEP_NS: u64 = 50_000_000;
const MAX_PAYLOAD: usize = 4096;
const START_NS: u64 = 1_764_500_000_000_000_000;

fn gateway_ip(index: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 244, 3, 10 + index))
}

/// Stream positions per slot and direction, reset when a slot's connection opens or closes.
#[derive(Default)]
struct Positions([[u64; 2]; SLOTS]);

impl Positions {
    fn next(&mut self, slot: u8, direction: Direction) -> &mut u64 {
        let side = usize::from(direction == Direction::Recv);
        &mut self.0[usize::from(slot) % SLOTS][side]
    }

    fn reset(&mut self, slot: u8) {
        self.0[usize::from(slot) % SLOTS] = [0, 0];
    }
}

pub fn decode(mut data: &[u8]) -> Vec<Event> {
    let mut events = Vec::new();
    let mut positions = Positions::default();
    let mut now_ns = START_NS;
    let take = |count: usize, data: &mut &[u8]| -> Option<Vec<u8>> {
        let (taken, rest) = data.split_at_checked(count)?;
        *data = rest;
        Some(taken.to_vec())
    };
    while let Some(header) = take(2, &mut data) {
        let (op, slot_byte) = (header[0], header[1]);
        let slot = slot_byte % SLOTS as u8;
        now_ns += u64::from(op >> 3) * TIME_STEP_NS;
        let websocket = slot >= FIRST_WEBSOCKET_SLOT;
        let kind = match op & 3 {
            2 => {
                positions.reset(slot);
                EventKind::TcpConnect
            }
            3 => {
                positions.reset(slot);
                if op & 4 != 0 {
                    EventKind::Close
                } else {
                    EventKind::TcpState {
                        old: TcpState::Established,
                        new: TcpState::Close,
                    }
                }
            }
            _ => {
                let Some(flags) = take(1, &mut data) else {
                    break;
                };
                let flags = flags[0];
                let direction = if flags & 1 != 0 {
                    Direction::Recv
                } else {
                    Direction::Send
                };
                let position = positions.next(slot, direction);
                let offset = match (flags >> 1) & 3 {
                    0 => *position,
                    1 => match take(1, &mut data) {
                        Some(skip) => *position + u64::from(skip[0]) + 1,
                        None => break,
                    },
                    2 => match take(1, &mut data) {
                        Some(back) => position.saturating_sub(u64::from(back[0])),
                        None => break,
                    },
                    _ => match take(4, &mut data) {
                        Some(bytes) => {
                            u64::from(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
                        }
                        None => break,
                    },
                };
                let Some(length) = take(2, &mut data) else {
                    break;
                };
                let length = usize::from(u16::from_le_bytes([length[0], length[1]]))
                    .min(MAX_PAYLOAD)
                    .min(data.len());
                let payload = take(length, &mut data).unwrap_or_default();
                *position = offset + payload.len() as u64;
                EventKind::Data {
                    direction,
                    offset,
                    call_len: payload.len() as u64,
                    truncated: flags & 8 != 0,
                    payload: Bytes::from(payload),
                }
            }
        };
        let (pid, comm, port, port_class) = if websocket {
            (2101, "openim-msggatew", 80, PortClass::WebSocket)
        } else {
            (3303, "openim-push", 88, PortClass::Grpc)
        };
        events.push(Event {
            ts_ns: now_ns,
            connection: 0xffff_8880_0400_0000 + u64::from(slot) * 0x800,
            pid,
            comm: comm.into(),
            cgroup_id: 7,
            saddr: IpAddr::V4(Ipv4Addr::new(10, 244, 1, 21)),
            sport: 40_000 + u16::from(slot),
            daddr: gateway_ip(slot_byte >> 5),
            dport: port,
            port_class,
            kind,
        });
    }
    events
}

/// Writes `events` in the input format. Connections take slots in order of appearance (by port
/// class), gateways are told apart by the last octet of their IP.
#[allow(dead_code)]
pub fn encode(events: &[Event]) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut slots: Vec<(u64, u8)> = Vec::new();
    let mut next_slot = [0u8; 2];
    let mut positions = Positions::default();
    let mut previous_ns = events.first().map_or(0, |event| event.ts_ns);
    for event in events {
        let class = usize::from(event.port_class == PortClass::WebSocket);
        let slot = match slots
            .iter()
            .find(|(connection, _)| *connection == event.connection)
        {
            Some(&(_, slot)) => slot,
            None => {
                let slot = next_slot[class] % FIRST_WEBSOCKET_SLOT
                    + if class == 1 { FIRST_WEBSOCKET_SLOT } else { 0 };
                next_slot[class] = next_slot[class].wrapping_add(1);
                slots.retain(|&(_, taken)| taken != slot);
                slots.push((event.connection, slot));
                slot
            }
        };
        let gateway = match event.daddr {
            IpAddr::V4(ip) => ip.octets()[3].wrapping_sub(10) & 7,
            IpAddr::V6(_) => 0,
        };
        let steps = (event.ts_ns.saturating_sub(previous_ns) / TIME_STEP_NS).min(31) as u8;
        previous_ns = event.ts_ns;
        let slot_byte = slot | gateway << 5;
        match &event.kind {
            EventKind::TcpConnect => {
                positions.reset(slot);
                bytes.extend([steps << 3 | 2, slot_byte]);
            }
            EventKind::Close | EventKind::TcpState { .. } => {
                positions.reset(slot);
                bytes.extend([steps << 3 | 4 | 3, slot_byte]);
            }
            EventKind::Data {
                direction,
                offset,
                truncated,
                payload,
                ..
            } => {
                bytes.extend([steps << 3, slot_byte]);
                let position = positions.next(slot, *direction);
                let mut flags = u8::from(*direction == Direction::Recv) | u8::from(*truncated) << 3;
                if *offset == *position {
                    bytes.push(flags);
                } else {
                    flags |= 3 << 1;
                    bytes.push(flags);
                    bytes.extend((*offset as u32).to_le_bytes());
                }
                let payload = &payload[..payload.len().min(MAX_PAYLOAD)];
                bytes.extend((payload.len() as u16).to_le_bytes());
                bytes.extend_from_slice(payload);
                *position = offset + payload.len() as u64;
            }
        }
    }
    bytes
}
