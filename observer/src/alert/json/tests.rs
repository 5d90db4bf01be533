//! `alert::json` and `alert::line` held to serde_json's output: strings, serde's data model,
//! every alert kind.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use serde::Serialize;

use super::super::*;
use crate::model::{Gateway, GatewayAnswer, MessageIds, MismatchCause, PlatformResult, Process};

fn ours(value: &(impl Serialize + ?Sized)) -> String {
    let mut line = Vec::new();
    super::append(&mut line, value).unwrap();
    String::from_utf8(line).unwrap()
}

fn same_as_serde_json(value: &(impl Serialize + ?Sized)) {
    assert_eq!(ours(value), serde_json::to_string(value).unwrap());
}

/// Every ASCII byte and a few wider characters, at every position of a short string, of two
/// whole blocks and of the tail after them, alone and next to each other.
#[test]
fn strings_are_escaped_as_serde_json_escapes_them() {
    let mut characters: Vec<char> = (0u8..0x80).map(char::from).collect();
    characters.extend(['é', '€', '😀', '\u{2028}']);
    for &character in &characters {
        for before in 0..33 {
            for after in 0..10 {
                let text = format!("{}{character}{}", "a".repeat(before), "b".repeat(after));
                same_as_serde_json(&text);
                same_as_serde_json(&character);
            }
        }
    }
    let alphabet = [
        'a', '"', '\\', '\n', '\u{1}', '\u{1f}', '\u{7f}', ' ', '/', 'é', '😀',
    ];
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..5_000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let text: String = (0..state % 40)
            .map(|index| alphabet[((state >> (index % 50)) % alphabet.len() as u64) as usize])
            .collect();
        same_as_serde_json(&text);
    }
}

#[derive(Serialize)]
enum Variants {
    Unit,
    Newtype(u8),
    Tuple(i8, &'static str),
    Struct { field: Option<bool> },
}

#[derive(Serialize)]
struct UnitStruct;

#[derive(Serialize)]
struct Newtype(&'static str);

#[derive(Serialize)]
struct TupleStruct(u16, f32);

#[derive(Serialize)]
#[serde(tag = "kind")]
enum Tagged {
    Inner { value: i32 },
}

#[derive(Serialize)]
struct Everything {
    integers: (i8, i16, i32, i64, i128, u8, u16, u32, u64, u128),
    extremes: [i64; 2],
    floats: Vec<f64>,
    character: char,
    bytes: &'static [u8],
    unit: (),
    unit_struct: UnitStruct,
    newtype: Newtype,
    tuple_struct: TupleStruct,
    variants: Vec<Variants>,
    map: BTreeMap<&'static str, Vec<Option<u32>>>,
    empty_map: BTreeMap<String, u8>,
    empty_list: Vec<u8>,
    #[serde(flatten)]
    tagged: Tagged,
    #[serde(rename = "renamed \"key\"")]
    escaped_key: bool,
}

#[test]
fn every_shape_of_serdes_data_model_is_written_as_serde_json_writes_it() {
    same_as_serde_json(&Everything {
        integers: (-8, -16, -32, -64, i128::MIN, 8, 16, 32, u64::MAX, u128::MAX),
        extremes: [i64::MIN, i64::MAX],
        floats: vec![
            0.0,
            -0.0,
            1.5,
            1e300,
            5e-324,
            f64::NAN,
            f64::INFINITY,
            0.1 + 0.2,
        ],
        character: '"',
        bytes: b"\x00\xff",
        unit: (),
        unit_struct: UnitStruct,
        newtype: Newtype("new\ttype"),
        tuple_struct: TupleStruct(7, 0.25),
        variants: vec![
            Variants::Unit,
            Variants::Newtype(1),
            Variants::Tuple(-1, "two"),
            Variants::Struct { field: None },
            Variants::Struct { field: Some(true) },
        ],
        map: BTreeMap::from([("a", vec![Some(1), None]), ("b\n", Vec::new())]),
        empty_map: BTreeMap::new(),
        empty_list: Vec::new(),
        tagged: Tagged::Inner { value: -3 },
        escaped_key: false,
    });
}

/// serde_json would quote the number; no alert has such a key, so it is refused rather
/// than written some other way.
#[test]
fn a_map_key_that_is_not_a_string_is_an_error() {
    let error = super::append(&mut Vec::new(), &BTreeMap::from([(1, 2)])).unwrap_err();
    assert_eq!(error.to_string(), "a map key that is not a string");
}

fn gateway(last: u8, port: u16, name: Option<&str>) -> GatewayInfo {
    GatewayInfo {
        gateway: Gateway {
            ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)),
            port,
            name: name.map(Arc::from),
        },
        pod: Some(Box::new(PodRef::new("chat", format!("msggateway-{last}")))),
    }
}

fn process(pid: u32, comm: &str) -> ProcessInfo {
    ProcessInfo {
        process: Process {
            pid,
            comm: comm.into(),
            cgroup_id: 7,
        },
        pod: Some(Box::new(PodRef {
            container: Some("push".into()),
            workload: Some(WorkloadRef {
                kind: "Deployment".into(),
                name: "push".into(),
            }),
            labels: [("app".to_owned(), "push \"quoted\"".to_owned())].into(),
            ..PodRef::new("chat", "push-0")
        })),
    }
}

/// Each kind of alert with every optional field present, and with none.
///
/// Longer than 100 lines on purpose: one value of each kind, built in full so the test shows
/// every field a line can carry.
#[test]
fn every_kind_of_alert_line_is_serde_jsons() {
    let route_mismatch = RouteMismatch {
        user: "user \"quoted\"\n".into(),
        placed_on: vec![PlacementInfo {
            gateway: gateway(1, 80, Some("gw-1.svc")),
            platforms: vec![1, 5],
            since_ns: 1_700_000_000_123_456_789,
            proxy: process(10, "msggw-proxy"),
            node: Some("node-a".into()),
        }],
        pushed_to: PushInfo {
            gateway: GatewayInfo {
                gateway: Gateway {
                    ip: IpAddr::V6(Ipv6Addr::LOCALHOST),
                    port: 88,
                    name: None,
                },
                pod: None,
            },
            method: "OnlinePushMsg".into(),
            message: MessageIds {
                client_msg_id: Some("c".into()),
                server_msg_id: Some("s".into()),
                seq: Some(-1),
                session_type: Some(3),
            },
            pusher: process(20, "openim-push"),
            answer: GatewayAnswer::DeliveryFailed,
            answer_platforms: vec![PlatformResult {
                platform_id: 1,
                result_code: -2,
            }],
            node: Some("node-b".into()),
        },
        count: 3,
        window_secs: 60,
        spelling_difference: Some("ü\u{1}".into()),
        cause: MismatchCause::RingSpelling,
    };
    let degraded = |affected| AlertBody::CaptureDegraded {
        reason: DegradedReason::RingFull,
        state: DegradedState::Recovered,
        since: "2026-12-04T10:00:00.000000Z".into(),
        affects: "everything".into(),
        affected,
        diagnosis: "d".into(),
    };
    let mut sparse_mismatch = RouteMismatch {
        spelling_difference: None,
        cause: MismatchCause::StalePlacement,
        ..route_mismatch.clone()
    };
    sparse_mismatch.placed_on.push(PlacementInfo {
        gateway: GatewayInfo {
            pod: None,
            ..gateway(3, 80, None)
        },
        platforms: Vec::new(),
        since_ns: 0,
        proxy: ProcessInfo {
            pod: None,
            ..process(11, "proxy\t2")
        },
        node: None,
    });
    sparse_mismatch.pushed_to.message = MessageIds::default();
    sparse_mismatch.pushed_to.answer_platforms.clear();
    sparse_mismatch.pushed_to.node = None;
    let bodies = [
        AlertBody::RouteMismatch(sparse_mismatch),
        AlertBody::RouteMismatch(route_mismatch),
        AlertBody::RingDivergence {
            state: crate::openim::members::RingDivergenceState::Diverged,
            proxy_members: vec!["a".into(), "b".into()],
            push_members: vec!["a:88".into()],
            difference: "':88'".into(),
            complete: false,
            placements_seen: 50,
            placements_split: 44,
            sample_split_share: 0.897,
            lasted_secs: None,
            placements_checked: None,
            pushes_checked: None,
            diagnosis: "d".into(),
        },
        AlertBody::RingDivergence {
            state: crate::openim::members::RingDivergenceState::Resolved,
            proxy_members: vec!["a:88".into()],
            push_members: vec!["a:88".into()],
            difference: "same".into(),
            complete: true,
            placements_seen: 50,
            placements_split: 0,
            sample_split_share: 0.0,
            lasted_secs: Some(61),
            placements_checked: Some(7),
            pushes_checked: Some(0),
            diagnosis: "d".into(),
        },
        AlertBody::WsUpgradeOnGrpcPort {
            gateway: gateway(2, 88, None),
            users: vec!["u1".into()],
            proxy: process(10, "proxy"),
            answer_status: Some(400),
            count: 1,
            window_secs: 60,
            diagnosis: "d".into(),
        },
        AlertBody::PushConnectionChurn {
            pusher: process(20, "push"),
            new_connections: 20,
            window_secs: 10,
            per_second: 2.0,
            open_connections: 20,
            calls_per_connection: f64::NAN,
            diagnosis: "d".into(),
        },
        AlertBody::PushRouting {
            service: "openim.msggateway.msgGateway".into(),
            routing: PushRoutingMode::Broadcast,
            gateways: 5,
            diagnosis: "d".into(),
        },
        degraded(None),
        degraded(Some(Affected {
            records: Some(1),
            connections: Some(2),
            bytes: Some(3),
            users: Some(4),
            calls: Some(5),
            runs: Some(6),
            processes: vec![AffectedProcess {
                process: process(30, "p"),
                connections: 7,
                bytes: 8,
            }],
        })),
        degraded(Some(Affected::default())),
    ];
    // One writer for all, so that the second line of each is written from kept fragments.
    let mut lines = LineWriter::default();
    for body in bodies {
        let mut alert = Alert::new(1_764_859_200_000_000_001, body);
        for node in [None, Some("node-c")] {
            alert.node = node.map(str::to_owned);
            same_as_serde_json(&alert);
            let expected = serde_json::to_string(&alert).unwrap();
            assert_eq!(lines.line(&alert), expected);
            let mut written = Vec::new();
            lines.write(&alert, &mut written).unwrap();
            assert_eq!(written, format!("{expected}\n").into_bytes());
            assert_eq!(alert.to_json_line(), expected);
            // Printed lines always name their node: those fit the schema.
            if alert.node.is_some() {
                let value: serde_json::Value = serde_json::from_str(&expected).unwrap();
                if let Err(error) = schema::validate(&schema::schema(), &value) {
                    panic!("{expected}: {error}");
                }
            }
        }
    }
}

/// More gateways and processes than the writer keeps, each named again after others replaced
/// it, with every answer (each its own words in the diagnosis), with and without a spelling
/// difference: every line is still serde_json's.
#[test]
fn kept_fragments_are_replaced_without_changing_a_line() {
    let answers = [
        GatewayAnswer::Delivered,
        GatewayAnswer::EmptyEntry,
        GatewayAnswer::DeliveryFailed,
        GatewayAnswer::Unknown,
    ];
    let causes = [
        MismatchCause::RingSpelling,
        MismatchCause::StalePlacement,
        MismatchCause::PushRingLags,
        MismatchCause::ProxyRingLags,
        MismatchCause::Undetermined,
    ];
    let mut lines = LineWriter::default();
    for round in 0..3u16 {
        for index in 0..100u16 {
            let mut name = format!("gw-{index}.svc");
            if index % 7 == 0 {
                name.push('"');
            }
            let gateway = gateway((index % 250) as u8, 80 + index, Some(&name));
            let proxy = process(u32::from(index), "proxy");
            let placement = PlacementInfo {
                gateway: gateway.clone(),
                platforms: vec![i32::from(index)],
                since_ns: u64::from(index) * 1_000_000_007,
                proxy: proxy.clone(),
                node: None,
            };
            let alert = Alert::new(
                u64::from(round) * 1_000_000_000_000 + u64::from(index),
                AlertBody::RouteMismatch(RouteMismatch {
                    user: format!("{index}").into(),
                    placed_on: vec![placement.clone(), placement],
                    pushed_to: PushInfo {
                        gateway,
                        method: "OnlinePushMsg".into(),
                        message: MessageIds::default(),
                        pusher: proxy,
                        answer: answers[usize::from(index) % answers.len()],
                        answer_platforms: Vec::new(),
                        node: None,
                    },
                    count: 1,
                    window_secs: 60,
                    spelling_difference: (index % 3 == 0).then(|| "':88'".into()),
                    cause: causes[usize::from(index) % causes.len()],
                }),
            );
            assert_eq!(lines.line(&alert), serde_json::to_string(&alert).unwrap());
        }
    }
}
