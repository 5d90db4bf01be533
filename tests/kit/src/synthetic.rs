//! Generates synthetic OpenIM 3.5.1 traffic as the capture layer delivers it: real byte streams in
//! `Event`s, for benches, integration tests and the fuzz seeds.
//!
//! What is generated, as OpenIM 3.5.1 does it:
//! - proxy → gateway (port 80): per user, `TcpConnect`, the WebSocket upgrade request
//!   (`Host` = the proxy's ring member, `token` in the query) and the `101` answer. The proxy
//!   places each user with the proxy ring (`PROXY_MEMBER_TEMPLATE`); the connection stays open.
//! - push → gateway (port 88): per push call, the recipients grouped by the push ring
//!   (`PUSH_MEMBER_TEMPLATE`, members with `:88`), one new gRPC connection per member: client
//!   preface, SETTINGS, WINDOW_UPDATE, HEADERS (HPACK literals, no Huffman) and DATA with a
//!   gRPC-framed `OnlineBatchPushOneMsgReq`; the gateway answers SETTINGS, HEADERS `:status 200`,
//!   DATA with `OnlineBatchPushOneMsgResp` (a user it holds gets a platform result, any other
//!   user an entry with only the user id) and trailers `grpc-status 0`.
//! - every syscall's bytes are cut into chunks of at most `max_chunk` bytes, each with its
//!   stream offset and the syscall's length, as the kernel programs report them.
//!
//! A user is misrouted exactly when the two rings pick different gateways for it, as in 3.5.1;
//! `misrouted_share` picks users so that this share of them is misrouted.

use std::net::{IpAddr, Ipv4Addr};

use bytes::Bytes;
use observer::model::wire::CLIENT_PREFACE;
use observer::model::{ConnectionId, Direction, Event, EventKind, PortClass};
use observer::openim::hashring::{
    MemberTemplate, PROXY_MEMBER_TEMPLATE, PUSH_MEMBER_TEMPLATE, Ring,
};
use prost::Message;

use crate::http2::{
    ACK, DEFAULT_MAX_FRAME, END_HEADERS, END_STREAM, HEADERS, SETTINGS, WINDOW_UPDATE, data_frames,
    frame, grpc_message, hpack_integer, hpack_literal_without_indexing,
};
use crate::message::{
    BatchPushAnswerAsSent, BatchPushRequestWithContent, MsgDataWithContent,
    SingleMsgToUserPlatform, UserResultsAsSent,
};

/// Names the gRPC method of the pushes generated.
pub const PUSH_PATH: &str = "/OpenIMServer.msggateway.msgGateway/SuperGroupOnlineBatchPushOneMsg";
/// Names the OpenIM instance of the generated cluster.
pub const INSTANCE: &str = "im";
/// Names the namespace of the generated cluster.
pub const NAMESPACE: &str = "openim";
/// Names the proxy process as the kernel's `comm` does, the first 15 bytes of the executable
/// name.
pub const PROXY_COMM: &str = "openim-msggatew";
/// Names the push process as the kernel's `comm` does.
pub const PUSH_COMM: &str = "openim-push";
/// Numbers the proxy process.
pub const PROXY_PID: u32 = 2101;
/// Numbers the push process.
pub const PUSH_PID: u32 = 3303;
/// Numbers the gateways' WebSocket port.
pub const WEBSOCKET_PORT: u16 = 80;
/// Numbers the gateways' gRPC port.
pub const GRPC_PORT: u16 = 88;
/// Starts the clock around 2025-11-30, so rendered timestamps look like a capture's.
const START_NS: u64 = 1_764_500_000_000_000_000;
/// Numbers the first socket in the direct map, where kernel socket addresses live.
const FIRST_SOCKET: u64 = 0xffff_8880_0400_0000;

/// Describes the synthetic cluster and traffic [`generate`] makes.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub gateways: usize,
    pub users: usize,
    /// Share of users (0.0..=1.0) the two rings place on different gateways. With one gateway
    /// nobody can be misrouted: it is ignored then.
    pub misrouted_share: f64,
    pub push_calls: usize,
    pub recipients_per_call: usize,
    /// `MsgData.content` of every pushed message; `{seq}` is replaced by the message's seq.
    pub content: String,
    /// The `token` query value of every upgrade; `{user}` is replaced by the user id.
    pub token: String,
    /// An `Authorization` header value for every upgrade, when set.
    pub authorization: Option<String>,
    /// Largest chunk of one syscall the capture reports (the kernel programs copy 4 KiB).
    pub max_chunk: usize,
    /// 3.5.1's push never closes its gRPC connections; closing them keeps a long synthetic
    /// run under the engine's connection cap.
    pub close_push_connections: bool,
    /// Multiplies every gap between events: 1.0 spaces them as a lab cluster does (a push call
    /// every 5 ms), 0.01 plays the same traffic 100 times denser. Alerts fold per window of
    /// traffic time, so the denser the traffic, the fewer alerts per event.
    pub time_scale: f64,
    pub seed: u64,
}

impl Default for Scenario {
    fn default() -> Self {
        Self {
            gateways: 5,
            users: 1_000,
            misrouted_share: 0.5,
            push_calls: 200,
            recipients_per_call: 20,
            content: "hello, message {seq}".into(),
            token: "eyJhbGciOiJIUzI1NiJ9.{user}.sig".into(),
            authorization: None,
            max_chunk: 4096,
            close_push_connections: true,
            time_scale: 1.0,
            seed: 0x5EED,
        }
    }
}

/// Holds the generated events, in time order, and what a correct observer should conclude.
pub struct Traffic {
    pub events: Vec<Event>,
    pub users: Vec<String>,
    pub misrouted_users: usize,
    /// Push calls as gRPC requests (one per gateway a call reached).
    pub grpc_requests: usize,
    pub proxy_members: Vec<String>,
    pub push_members: Vec<String>,
}

/// Draws numbers from a fixed-seed SplitMix64, so every run generates the same traffic.
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// Starts the sequence at `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// Returns the next number of the sequence.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut mixed = self.0;
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        mixed ^ (mixed >> 31)
    }

    /// Returns a number below `bound`, or 0 when `bound` is 0.
    pub fn below(&mut self, bound: usize) -> usize {
        (self.next_u64() % bound.max(1) as u64) as usize
    }
}

/// Returns the address of gateway `index`: 10.244.3.(10 + `index`).
pub fn gateway_ip(index: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 244, 3, 10 + index as u8))
}

const PROXY_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 244, 1, 21));
const PUSH_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 244, 2, 33));

struct Generator {
    events: Vec<Event>,
    now_ns: u64,
    time_scale: f64,
    next_socket: u64,
    next_port: u16,
    max_chunk: usize,
}

/// Holds one connection's identity, copied into each of its events.
#[derive(Clone)]
struct Endpoints {
    connection: ConnectionId,
    pid: u32,
    comm: &'static str,
    saddr: IpAddr,
    sport: u16,
    daddr: IpAddr,
    dport: u16,
    port_class: PortClass,
}

/// Holds the stream positions of a connection's two directions.
#[derive(Default)]
struct Offsets {
    send: u64,
    recv: u64,
}

impl Generator {
    /// Moves the clock by `nanos` of lab time, scaled; at least a nanosecond, so that no scale
    /// merges two steps into one instant.
    fn advance(&mut self, nanos: u64) {
        self.now_ns += ((nanos as f64 * self.time_scale) as u64).max(1);
    }

    fn open(
        &mut self,
        pid: u32,
        comm: &'static str,
        saddr: IpAddr,
        daddr: IpAddr,
        dport: u16,
    ) -> Endpoints {
        let endpoints = Endpoints {
            connection: self.next_socket,
            pid,
            comm,
            saddr,
            sport: self.next_port,
            daddr,
            dport,
            port_class: if dport == GRPC_PORT {
                PortClass::Grpc
            } else {
                PortClass::WebSocket
            },
        };
        self.next_socket += 0x800;
        self.next_port = if self.next_port >= 60_999 {
            32_768
        } else {
            self.next_port + 1
        };
        self.push(&endpoints, EventKind::TcpConnect);
        endpoints
    }

    fn push(&mut self, endpoints: &Endpoints, kind: EventKind) {
        self.events.push(Event {
            ts_ns: self.now_ns,
            connection: endpoints.connection,
            pid: endpoints.pid,
            comm: endpoints.comm.into(),
            cgroup_id: 0x2000 + u64::from(endpoints.pid),
            saddr: endpoints.saddr,
            sport: endpoints.sport,
            daddr: endpoints.daddr,
            dport: endpoints.dport,
            port_class: endpoints.port_class,
            kind,
        });
    }

    /// Records one syscall of `bytes`, reported in chunks of at most `max_chunk`.
    fn syscall(
        &mut self,
        endpoints: &Endpoints,
        offsets: &mut Offsets,
        direction: Direction,
        bytes: &[u8],
    ) {
        let offset = match direction {
            Direction::Send => &mut offsets.send,
            Direction::Recv => &mut offsets.recv,
        };
        for chunk in bytes.chunks(self.max_chunk.max(1)) {
            let kind = EventKind::Data {
                direction,
                offset: *offset,
                call_len: bytes.len() as u64,
                truncated: false,
                payload: Bytes::copy_from_slice(chunk),
            };
            *offset += chunk.len() as u64;
            self.push(endpoints, kind);
        }
    }
}

fn user_id(rng: &mut SplitMix64) -> String {
    (1_000_000_000 + rng.next_u64() % 9_000_000_000).to_string()
}

/// Generates a scenario's traffic and the truth it implies.
///
/// Longer than 100 lines on purpose: the scenario's timeline (rings, placements, scale-out,
/// pushes) written in the order it happens.
pub fn generate(scenario: &Scenario) -> Traffic {
    let members = |template: &str| match MemberTemplate::parse(template) {
        Ok(template) => template.members(INSTANCE, NAMESPACE, scenario.gateways.max(1)),
        Err(error) => panic!("built-in template {template:?}: {error}"),
    };
    let proxy_members = members(PROXY_MEMBER_TEMPLATE);
    let push_members = members(PUSH_MEMBER_TEMPLATE);
    let proxy_ring = Ring::new(proxy_members.iter().cloned());
    let push_ring = Ring::new(push_members.iter().cloned());
    let pick = |ring: &Ring, user: &str| ring.get_index(user).unwrap_or_default();

    let mut rng = SplitMix64::new(scenario.seed);
    // Rings of one member always agree.
    let misrouted_wanted = if proxy_members.len() < 2 {
        0
    } else {
        (scenario.users as f64 * scenario.misrouted_share.clamp(0.0, 1.0)).round() as usize
    };
    let mut users = Vec::with_capacity(scenario.users);
    let (mut misrouted, mut agreeing) = (0usize, 0usize);
    // Candidates the quota no longer wants are skipped; a bound keeps a share that the ring
    // can't produce (any misrouting with one gateway) from looping for ever.
    let mut candidates_left = scenario.users.saturating_mul(100).max(1_000);
    while users.len() < scenario.users && candidates_left > 0 {
        candidates_left -= 1;
        let user = user_id(&mut rng);
        let disagrees = pick(&proxy_ring, &user) != pick(&push_ring, &user);
        if disagrees && misrouted < misrouted_wanted {
            misrouted += 1;
            users.push(user);
        } else if !disagrees && agreeing < scenario.users - misrouted_wanted {
            agreeing += 1;
            users.push(user);
        }
    }

    let mut generator = Generator {
        events: Vec::new(),
        now_ns: START_NS,
        time_scale: scenario.time_scale,
        next_socket: FIRST_SOCKET,
        next_port: 32_768,
        max_chunk: scenario.max_chunk,
    };
    // The placement of each user: its gateway index (by the proxy ring).
    let placed_on: Vec<usize> = users.iter().map(|user| pick(&proxy_ring, user)).collect();
    for (index, user) in users.iter().enumerate() {
        let gateway = placed_on[index];
        let platform = 1 + (index % 5) as i32;
        let endpoints = generator.open(
            PROXY_PID,
            PROXY_COMM,
            PROXY_IP,
            gateway_ip(gateway),
            WEBSOCKET_PORT,
        );
        let mut offsets = Offsets::default();
        generator.advance(80_000);
        let request = upgrade_request(
            user,
            &scenario.token.replace("{user}", user),
            platform,
            index,
            &proxy_members[gateway],
            scenario.authorization.as_deref(),
        );
        generator.syscall(&endpoints, &mut offsets, Direction::Send, &request);
        generator.advance(250_000);
        generator.syscall(
            &endpoints,
            &mut offsets,
            Direction::Recv,
            &upgrade_answer(index),
        );
        generator.advance(20_000);
    }

    let user_index: std::collections::HashMap<&str, usize> = users
        .iter()
        .enumerate()
        .map(|(index, user)| (user.as_str(), index))
        .collect();
    let mut grpc_requests = 0;
    for call in 0..scenario.push_calls {
        let seq = call as i64 + 1;
        let sender = &users[rng.below(users.len())];
        let mut by_member: Vec<Vec<&str>> = vec![Vec::new(); push_members.len()];
        for _ in 0..scenario.recipients_per_call.min(users.len()) {
            let recipient = users[rng.below(users.len())].as_str();
            let member = pick(&push_ring, recipient);
            if !by_member[member].contains(&recipient) {
                by_member[member].push(recipient);
            }
        }
        let message = MsgDataWithContent {
            send_id: sender.clone(),
            group_id: format!("group-{}", call % 97),
            client_msg_id: format!("client-{seq:08x}"),
            server_msg_id: format!("server-{seq:08x}"),
            sender_platform_id: 2,
            session_type: 3,
            content_type: 101,
            content: scenario
                .content
                .replace("{seq}", &seq.to_string())
                .into_bytes(),
            seq,
            send_time: (generator.now_ns / 1_000_000) as i64,
        };
        for (member, recipients) in by_member.iter().enumerate() {
            if recipients.is_empty() {
                continue;
            }
            grpc_requests += 1;
            let holds = |user: &&str| {
                user_index
                    .get(user)
                    .is_some_and(|&index| placed_on[index] == member)
            };
            push_call(
                &mut generator,
                &push_members[member],
                gateway_ip(member),
                &message,
                recipients,
                &holds,
                scenario.close_push_connections,
            );
        }
        generator.advance(5_000_000);
    }
    Traffic {
        events: generator.events,
        users,
        misrouted_users: misrouted,
        grpc_requests,
        proxy_members,
        push_members,
    }
}

fn upgrade_request(
    user: &str,
    token: &str,
    platform: i32,
    index: usize,
    host: &str,
    authorization: Option<&str>,
) -> Vec<u8> {
    let mut request = format!(
        "GET /?sendID={user}&token={token}&platformID={platform}&operationID=op-{index:010}&isBackground=false&compression=gzip HTTP/1.1\r\n\
         Host: {host}\r\n\
         User-Agent: Go-http-client/1.1\r\n\
         Connection: Upgrade\r\n\
         Upgrade: websocket\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Sec-WebSocket-Version: 13\r\n"
    );
    if let Some(authorization) = authorization {
        request.push_str(&format!("Authorization: {authorization}\r\n"));
    }
    request.push_str("\r\n");
    request.into_bytes()
}

fn upgrade_answer(index: usize) -> Vec<u8> {
    format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: \
        Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+{:03}=\r\n\r\n",
        index % 1000
    )
    .into_bytes()
}

/// Generates one `SuperGroupOnlineBatchPushOneMsg` on a new connection, as grpc-go writes and reads
/// it.
fn push_call(
    generator: &mut Generator,
    member: &str,
    gateway: IpAddr,
    message: &MsgDataWithContent,
    recipients: &[&str],
    gateway_holds: &dyn Fn(&&str) -> bool,
    close: bool,
) {
    const STREAM: u32 = 1;
    let endpoints = generator.open(PUSH_PID, PUSH_COMM, PUSH_IP, gateway, GRPC_PORT);
    let mut offsets = Offsets::default();
    generator.advance(60_000);

    let mut hello = CLIENT_PREFACE.to_vec();
    hello.extend(frame(SETTINGS, 0, 0, &[]));
    generator.syscall(&endpoints, &mut offsets, Direction::Send, &hello);
    generator.advance(40_000);
    let mut server_hello = frame(SETTINGS, 0, 0, &[0, 5, 0, 0, 0x40, 0]);
    server_hello.extend(frame(SETTINGS, ACK, 0, &[]));
    generator.syscall(&endpoints, &mut offsets, Direction::Recv, &server_hello);

    let body = BatchPushRequestWithContent {
        msg_data: Some(message.clone()),
        push_to_user_ids: recipients.iter().map(|&user| user.to_owned()).collect(),
    }
    .encode_to_vec();
    let mut request = frame(SETTINGS, ACK, 0, &[]);
    request.extend(frame(WINDOW_UPDATE, 0, 0, &[0, 0x0e, 0, 0x01]));
    request.extend(frame(
        HEADERS,
        END_HEADERS,
        STREAM,
        &request_header_block(member),
    ));
    request.extend(data_frames(
        STREAM,
        &grpc_message(0, &body),
        DEFAULT_MAX_FRAME,
        true,
    ));
    generator.advance(30_000);
    generator.syscall(&endpoints, &mut offsets, Direction::Send, &request);

    let answer = BatchPushAnswerAsSent {
        single_push_result: recipients
            .iter()
            .map(|user| {
                let online = gateway_holds(user);
                UserResultsAsSent {
                    user_id: (*user).to_owned(),
                    resp: if online {
                        vec![SingleMsgToUserPlatform {
                            result_code: 0,
                            recv_id: Bytes::copy_from_slice(user.as_bytes()),
                            recv_platform_id: 2,
                        }]
                    } else {
                        Vec::new()
                    },
                    online_push: online,
                }
            })
            .collect(),
    }
    .encode_to_vec();
    let mut response = frame(HEADERS, END_HEADERS, STREAM, &response_header_block());
    response.extend(data_frames(
        STREAM,
        &grpc_message(0, &answer),
        DEFAULT_MAX_FRAME,
        false,
    ));
    response.extend(frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        STREAM,
        &trailer_block(),
    ));
    generator.advance(400_000);
    generator.syscall(&endpoints, &mut offsets, Direction::Recv, &response);
    generator.advance(20_000);
    if close {
        generator.push(&endpoints, EventKind::Close);
    }
}

fn request_header_block(member: &str) -> Vec<u8> {
    let mut block = Vec::with_capacity(256);
    hpack_integer(0x80, 7, 3, &mut block); // :method POST
    hpack_integer(0x80, 7, 6, &mut block); // :scheme http
    hpack_literal_without_indexing(4, "", PUSH_PATH, &mut block);
    hpack_literal_without_indexing(1, "", member, &mut block);
    hpack_literal_without_indexing(31, "", "application/grpc", &mut block);
    hpack_literal_without_indexing(0, "te", "trailers", &mut block);
    hpack_literal_without_indexing(58, "", "grpc-go/1.60.1", &mut block); // user-agent
    block
}

fn response_header_block() -> Vec<u8> {
    let mut block = Vec::new();
    hpack_integer(0x80, 7, 8, &mut block); // :status 200
    hpack_literal_without_indexing(31, "", "application/grpc", &mut block);
    block
}

fn trailer_block() -> Vec<u8> {
    let mut block = Vec::new();
    hpack_literal_without_indexing(0, "grpc-status", "0", &mut block);
    hpack_literal_without_indexing(0, "grpc-message", "", &mut block);
    block
}
