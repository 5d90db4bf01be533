//! `OutputWhitelist` against the real decoders and a hostile corpus: no canary survives at any
//! chunking, and a filtered stream decodes into the same facts. The decoders sit above this
//! layer; tests may use them as an oracle.

use bytes::Bytes;
use openim_test_kit::http2::{
    END_HEADERS, HEADERS, data_frames, frame, grpc_message, hpack_integer, hpack_raw_string,
};

use super::*;
use crate::decode::protobuf::tests::sample_request;
use crate::decode::test_streams::{
    AUTHORITY, CANARY, FactsPerCall, Field, PUSH_PATH, header_block, hpack_string,
    push_request_stream, request_stream, response_stream,
};
use crate::decode::{GrpcConnectionDecoder, GrpcFact, Limits};
use crate::hpack::huffman_encode;

/// Chunkings that cut every field, string and frame somewhere, and none.
const CHUNKINGS: [usize; 9] = [1, 2, 3, 5, 7, 13, 64, 4096, usize::MAX];

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

/// The canary as it may appear on the wire: raw, or Huffman-coded (the core of it).
fn assert_no_canary(filtered: &[u8], canary: &[u8], what: &str) {
    assert!(!contains(filtered, &canary[..8]), "{what}: raw canary");
    let huffman = huffman_encode(canary);
    assert!(
        !contains(filtered, &huffman[1..huffman.len() - 1]),
        "{what}: Huffman-coded canary"
    );
}

fn filter_in_chunks(
    port_class: PortClass,
    streams: &[(Direction, &[u8])],
    chunk_len: usize,
) -> Vec<Vec<u8>> {
    let mut whitelist = OutputWhitelist::new(port_class);
    let mut filtered: Vec<Vec<u8>> = streams.iter().map(|_| Vec::new()).collect();
    let mut positions = vec![0usize; streams.len()];
    // Interleaved, as a connection's two directions arrive.
    while positions
        .iter()
        .zip(streams)
        .any(|(&at, (_, stream))| at < stream.len())
    {
        for (index, (direction, stream)) in streams.iter().enumerate() {
            let at = positions[index];
            if at >= stream.len() {
                continue;
            }
            let end = at.saturating_add(chunk_len).min(stream.len());
            let mut chunk = stream[at..end].to_vec();
            whitelist.filter(*direction, at as u64, &mut chunk);
            filtered[index].extend(chunk);
            positions[index] = end;
        }
    }
    filtered
}

fn filter_send(port_class: PortClass, stream: &[u8], chunk_len: usize) -> Vec<u8> {
    filter_in_chunks(port_class, &[(Direction::Send, stream)], chunk_len).remove(0)
}

fn decoded(direction: Direction, stream: &[u8]) -> Vec<GrpcFact> {
    let mut decoder = GrpcConnectionDecoder::new(Limits::default());
    let mut facts = decoder.feed_all(direction, 0, &Bytes::copy_from_slice(stream));
    decoder.finish(&mut facts);
    facts
}

#[test]
fn content_is_masked_at_every_chunking_and_calls_decode_the_same() {
    let body = sample_request(CANARY, &["u1", "u2"]);
    for max_frame in [7, 16_384] {
        let stream = push_request_stream(&grpc_message(0, &body), max_frame);
        let expected = decoded(Direction::Send, &stream);
        assert!(matches!(expected[0], GrpcFact::Request { .. }));
        for chunk_len in CHUNKINGS {
            let filtered = filter_send(PortClass::Grpc, &stream, chunk_len);
            assert_eq!(filtered.len(), stream.len());
            assert_no_canary(&filtered, CANARY, &format!("{max_frame}/{chunk_len}"));
            assert_eq!(
                decoded(Direction::Send, &filtered),
                expected,
                "{max_frame}/{chunk_len}"
            );
            // What the engine reads stays (whole where the frames do not cut it).
            if max_frame > body.len() {
                assert!(contains(&filtered, b"client-abc"));
            }
        }
    }
}

/// A protobuf field with a length-delimited value.
fn bytes_field(number: u64, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    prost::encoding::encode_key(
        number as u32,
        prost::encoding::WireType::LengthDelimited,
        &mut out,
    );
    prost::encoding::encode_varint(value.len() as u64, &mut out);
    out.extend(value);
    out
}

fn varint_field(number: u64, value: u64) -> Vec<u8> {
    let mut out = Vec::new();
    prost::encoding::encode_key(number as u32, prost::encoding::WireType::Varint, &mut out);
    prost::encoding::encode_varint(value, &mut out);
    out
}

#[test]
fn every_field_the_engine_does_not_read_is_masked_whatever_its_nesting() {
    const PREVIEW: &[u8] = b"CANARY-offline-push-preview-91c2";
    const NICKNAME: &[u8] = b"CANARY-sender-nickname-55aa01bc";
    const EX: &[u8] = b"CANARY-ex-attached-json-0b7e4dd1";
    const TOP: &[u8] = b"CANARY-unknown-top-level-33f0aa";
    const SENDER: &[u8] = b"CANARY-sender-id-no-alert-reads";
    const SECRET_NUMBER: u64 = 0x5ec2_e7c0_ffee;
    let mut offline_push_info = bytes_field(1, PREVIEW);
    offline_push_info.extend(bytes_field(2, PREVIEW));
    let mut msg_data = bytes_field(1, SENDER);
    msg_data.extend(bytes_field(4, b"client-abc"));
    msg_data.extend(bytes_field(7, NICKNAME));
    msg_data.extend(varint_field(9, 3));
    msg_data.extend(bytes_field(12, CANARY));
    msg_data.extend(varint_field(14, 42));
    msg_data.extend(varint_field(16, SECRET_NUMBER));
    msg_data.extend(bytes_field(19, &offline_push_info));
    msg_data.extend(bytes_field(22, EX));
    let mut request = bytes_field(1, &msg_data);
    request.extend(bytes_field(2, b"u1"));
    request.extend(bytes_field(3, TOP));
    let stream = push_request_stream(&grpc_message(0, &request), 16_384);
    let expected = decoded(Direction::Send, &stream);
    assert!(matches!(expected[0], GrpcFact::Request { .. }));
    let mut secret_varint = Vec::new();
    prost::encoding::encode_varint(SECRET_NUMBER, &mut secret_varint);
    for chunk_len in CHUNKINGS {
        let filtered = filter_send(PortClass::Grpc, &stream, chunk_len);
        for canary in [CANARY, PREVIEW, NICKNAME, EX, TOP, SENDER] {
            assert_no_canary(&filtered, canary, &format!("chunks of {chunk_len}"));
        }
        assert!(
            !contains(&filtered, &secret_varint),
            "chunks of {chunk_len}"
        );
        assert_eq!(decoded(Direction::Send, &filtered), expected);
    }
}

#[test]
fn grpc_metadata_values_are_masked_however_they_are_encoded() {
    const TOKEN: &str = "CANARY-token-eyJhbGciOiJIUzI1NiJ9";
    const BEARER: &str = "Bearer CANARY-authorization-77d1e0";
    const AGENT: &str = "CANARY-user-agent-c0re-1.62.0";
    const SECOND: &str = "CANARY-second-token-value-a9b8c7";
    let mut first = header_block(&[
        Field::Indexed(3),
        Field::Indexed(6),
        Field::Literal {
            name_index: 4,
            name: "",
            value: PUSH_PATH,
        },
        Field::Literal {
            name_index: 1,
            name: "",
            value: AUTHORITY,
        },
        Field::Literal {
            name_index: 31,
            name: "",
            value: "application/grpc",
        },
        // Added to the dynamic table, Huffman-coded name and value.
        Field::Literal {
            name_index: 0,
            name: "token",
            value: TOKEN,
        },
    ]);
    // Raw, incremental indexing, literal name.
    hpack_integer(0x40, 6, 0, &mut first);
    hpack_raw_string("authorization", &mut first);
    hpack_raw_string(BEARER, &mut first);
    // Never indexed, static name (user-agent, 58).
    hpack_integer(0x10, 4, 58, &mut first);
    hpack_string(AGENT, &mut first);
    let message = grpc_message(0, &sample_request(b"hello", &["u1"]));
    let mut stream = request_stream(1, &first, &message, 16_384);
    // The second call by dynamic-table references (the first call added, newest first:
    // authorization 62, token 63, content-type 64, :authority 65, :path 66), the token with its
    // value, then a new value under the token's dynamic name, split over a CONTINUATION frame.
    let mut second = header_block(&[
        Field::Indexed(3),
        Field::Indexed(6),
        Field::Indexed(66),
        Field::Indexed(65),
        Field::Indexed(64),
        Field::Indexed(63),
    ]);
    hpack_integer(0x40, 6, 63, &mut second);
    hpack_string(SECOND, &mut second);
    let (head, tail) = second.split_at(second.len() - 6);
    stream.extend(frame(HEADERS, 0, 3, head));
    stream.extend(frame(0x9, END_HEADERS, 3, tail));
    stream.extend(data_frames(3, &message, 16_384, true));
    let expected = decoded(Direction::Send, &stream);
    assert_eq!(
        expected
            .iter()
            .filter(|fact| matches!(fact, GrpcFact::Request { .. }))
            .count(),
        2,
        "{expected:?}"
    );
    for chunk_len in CHUNKINGS {
        let filtered = filter_send(PortClass::Grpc, &stream, chunk_len);
        for canary in [TOKEN, BEARER, AGENT, SECOND] {
            assert_no_canary(
                &filtered,
                canary.as_bytes(),
                &format!("chunks of {chunk_len}"),
            );
        }
        // The kept values, and every call, decode as before.
        assert_eq!(decoded(Direction::Send, &filtered), expected);
    }
}

#[test]
fn answers_keep_what_the_engine_reads_and_nothing_else() {
    let stream = response_stream(1);
    let expected = decoded(Direction::Recv, &stream);
    let hello = CLIENT_PREFACE.to_vec();
    for chunk_len in CHUNKINGS {
        let filtered = filter_in_chunks(
            PortClass::Grpc,
            &[(Direction::Send, &hello), (Direction::Recv, &stream)],
            chunk_len,
        );
        assert_eq!(decoded(Direction::Recv, &filtered[1]), expected);
    }
    // An answer field the engine does not read.
    const EXTRA: &[u8] = b"CANARY-answer-extension-4d5e6f70";
    let mut answer = bytes_field(1, &bytes_field(1, b"bob"));
    answer.extend(bytes_field(9, EXTRA));
    let stream = frame(0, 0, 1, &grpc_message(0, &answer));
    for chunk_len in CHUNKINGS {
        let filtered = filter_in_chunks(
            PortClass::Grpc,
            &[(Direction::Send, &hello), (Direction::Recv, &stream)],
            chunk_len,
        );
        assert_no_canary(&filtered[1], EXTRA, &format!("chunks of {chunk_len}"));
        assert!(contains(&filtered[1], b"bob"));
    }
}

#[test]
fn padded_frames_and_several_messages_per_stream() {
    let message = grpc_message(0, &sample_request(CANARY, &["u1"]));
    let mut data = vec![3u8];
    data.extend(&message);
    data.extend([0, 0, 0]);
    // No message: the preface, SETTINGS, WINDOW_UPDATE and HEADERS only.
    let mut stream = push_request_stream(&[], 1);
    stream.extend(frame(0, FLAG_PADDED, 1, &data));
    stream.extend(frame(0, FLAG_END_STREAM, 1, &message));
    for chunk_len in [1, 4, 9, 4096] {
        let filtered = filter_send(PortClass::Grpc, &stream, chunk_len);
        assert_no_canary(&filtered, CANARY, &format!("chunks of {chunk_len}"));
        assert!(contains(&filtered, b"client-abc"));
    }
}

#[test]
fn what_cannot_be_followed_is_zeroed() {
    let body = sample_request(CANARY, &["u1"]);
    // Compressed flag: the whole body goes.
    let stream = push_request_stream(&grpc_message(1, &body), 16_384);
    let filtered = filter_send(PortClass::Grpc, &stream, 10);
    assert_no_canary(&filtered, CANARY, "compressed");
    assert!(!contains(&filtered, b"client-abc"));
    // A gap: the rest of the direction goes.
    let stream = push_request_stream(&grpc_message(0, &body), 16_384);
    let mut whitelist = OutputWhitelist::new(PortClass::Grpc);
    let (head, tail) = stream.split_at(30);
    let mut head = head.to_vec();
    whitelist.filter(Direction::Send, 0, &mut head);
    let mut tail = tail.to_vec();
    whitelist.filter(Direction::Send, 31, &mut tail);
    assert!(tail.iter().all(|&byte| byte == 0));
    // Joined mid-stream: everything goes.
    let mut whitelist = OutputWhitelist::new(PortClass::Grpc);
    let mut late = stream.clone();
    whitelist.filter(Direction::Send, 5, &mut late);
    assert!(late.iter().all(|&byte| byte == 0));
}

#[test]
fn broken_protobuf_zeroes_the_rest_of_the_message() {
    // msgData claims more bytes than the message holds; the canary follows.
    let mut body = vec![0x0a, 0x7f, 0x62, CANARY.len() as u8];
    body.extend(CANARY);
    let stream = push_request_stream(&grpc_message(0, &body), 16_384);
    for chunk_len in [1, 3, 4096] {
        assert_no_canary(
            &filter_send(PortClass::Grpc, &stream, chunk_len),
            CANARY,
            "broken",
        );
    }
}

/// Every HTTP/1 leak issue 10 found, and what else a hostile client could try: split writes,
/// percent-encoded keys, folded headers, a pipelined request, frames after the 101.
#[test]
fn http1_heads_keep_only_what_the_engine_reads_across_any_split() {
    const TOKEN: &str = "CANARY.eyJzdWIiOiJ1MSJ9.sig-0a1b2c";
    let request = format!(
        "GET /?sendID=u1&token={TOKEN}&platformID=5&tok%65n={TOKEN}&operationID=op-1#{TOKEN} \
         HTTP/1.1\r\nHost: gw-0:80\r\nAuthorization: Bearer {TOKEN}\r\nX-Note: first\r\n \
         folded {TOKEN}\r\nCookie: s={TOKEN}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {TOKEN}\r\n\r\nGET /?sendID=u2&token={TOKEN} HTTP/1.1\r\n\r\n"
    );
    let response = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Set-Cookie: {TOKEN}\r\n\r\n\u{81}\u{20}{TOKEN}"
    );
    for port_class in [PortClass::WebSocket, PortClass::Grpc] {
        for chunk_len in CHUNKINGS {
            let filtered = filter_in_chunks(
                port_class,
                &[
                    (Direction::Send, request.as_bytes()),
                    (Direction::Recv, response.as_bytes()),
                ],
                chunk_len,
            );
            for side in &filtered {
                assert!(
                    !contains(side, TOKEN.as_bytes()),
                    "{port_class:?}/{chunk_len}: {}",
                    String::from_utf8_lossy(side)
                );
                assert!(!contains(side, b"CANARY"), "{port_class:?}/{chunk_len}");
            }
            let head = String::from_utf8_lossy(&filtered[0]).into_owned();
            for kept in [
                "GET /?sendID=u1&",
                "&platformID=5&",
                "&operationID=op-1",
                "Host: gw-0:80\r\n",
                "Upgrade: websocket\r\n",
                "Connection: Upgrade\r\n",
            ] {
                assert!(head.contains(kept), "{kept:?} in {head}");
            }
            assert!(String::from_utf8_lossy(&filtered[1]).starts_with("HTTP/1.1 101 "));
        }
    }
}

#[test]
fn a_stream_that_starts_as_something_else_is_not_openim_and_passes() {
    let mut whitelist = OutputWhitelist::new(PortClass::Grpc);
    let mut first = b"hello world".to_vec();
    whitelist.filter(Direction::Send, 0, &mut first);
    assert_eq!(first, b"hello world");
    let mut later = b"more bytes".to_vec();
    whitelist.filter(Direction::Send, 11, &mut later);
    assert_eq!(later, b"more bytes");
}

#[test]
fn a_table_larger_than_the_mirror_zeroes_the_rest_of_the_headers() {
    const TOKEN: &str = "CANARY-after-a-huge-table-e1f2a3";
    let mut block = Vec::new();
    hpack_integer(0x20, 5, 1 << 20, &mut block);
    block.extend(header_block(&[Field::Literal {
        name_index: 0,
        name: "token",
        value: TOKEN,
    }]));
    let stream = request_stream(1, &block, &[], 16_384);
    for chunk_len in CHUNKINGS {
        let filtered = filter_send(PortClass::Grpc, &stream, chunk_len);
        assert_no_canary(
            &filtered,
            TOKEN.as_bytes(),
            &format!("chunks of {chunk_len}"),
        );
    }
}

#[test]
fn a_websocket_port_stream_that_is_not_a_head_is_masked_whole() {
    for stream in [
        &b"\x16\x03\x01\x02\x00CANARY-tls-client-hello-secret"[..],
        b"hello CANARY-lowercase-is-no-method",
    ] {
        for chunk_len in CHUNKINGS {
            let filtered = filter_send(PortClass::WebSocket, stream, chunk_len);
            assert!(!contains(&filtered, b"CANARY"), "chunks of {chunk_len}");
        }
    }
}
