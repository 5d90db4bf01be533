//! Builds HTTP/2 + gRPC byte streams by hand for the decoders' and the scrubber's tests: frames,
//! a small HPACK encoder, push requests and answers as grpc-go writes them.

use bytes::Bytes;
use openim_test_kit::http2::{
    DATA, END_HEADERS, END_STREAM, HEADERS, PING, SETTINGS, WINDOW_UPDATE, data_frames, frame,
    grpc_message, hpack_integer,
};
use openim_test_kit::message::{
    OnlineBatchPushOneMsgResp, PlatformOfUserResult, SingleMsgToUserResults,
};
use prost::Message;

use crate::model::{Direction, PlatformResult, UserResult};

use super::grpc::{GrpcConnectionDecoder, GrpcFact, RequestBody, ResponseBody};
use super::protobuf::PushCall;
use super::protobuf::tests::sample_ids;
use crate::hpack::huffman_encode;
use crate::model::wire::CLIENT_PREFACE;

pub(crate) const PUSH_PATH: &str =
    "/OpenIMServer.msggateway.msgGateway/SuperGroupOnlineBatchPushOneMsg";
pub(crate) const AUTHORITY: &str =
    "im-openim-msggateway-1.im-openim-msggateway-headless.ns.svc.cluster.local:88";
pub(crate) const CANARY: &[u8] = b"CANARY-private-message-body-7f3a";

pub(crate) fn hpack_string(text: &str, out: &mut Vec<u8>) {
    let encoded = huffman_encode(text.as_bytes());
    hpack_integer(0x80, 7, encoded.len(), out);
    out.extend(encoded);
}

/// Names a field for a small HPACK encoder: static-table indexes, and literals with incremental
/// indexing.
pub(crate) enum Field<'a> {
    Indexed(usize),
    /// Literal value with incremental indexing, name from table index `name_index` (0: literal).
    Literal {
        name_index: usize,
        name: &'a str,
        value: &'a str,
    },
}

pub(crate) fn header_block(fields: &[Field]) -> Vec<u8> {
    let mut out = Vec::new();
    for field in fields {
        match *field {
            Field::Indexed(index) => hpack_integer(0x80, 7, index, &mut out),
            Field::Literal {
                name_index,
                name,
                value,
            } => {
                hpack_integer(0x40, 6, name_index, &mut out);
                if name_index == 0 {
                    hpack_string(name, &mut out);
                }
                hpack_string(value, &mut out);
            }
        }
    }
    out
}

pub(crate) fn first_request_headers(path: &str) -> Vec<u8> {
    header_block(&[
        Field::Indexed(3), // :method POST
        Field::Indexed(6), // :scheme http
        Field::Literal {
            name_index: 4,
            name: "",
            value: path,
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
        Field::Literal {
            name_index: 0,
            name: "te",
            value: "trailers",
        },
    ])
}

/// Builds what grpc-go writes: preface, SETTINGS, WINDOW_UPDATE, HEADERS, then the message in DATA
/// frames of at most `max_frame` bytes, the last with END_STREAM.
pub(crate) fn request_stream(
    stream_id: u32,
    headers: &[u8],
    message: &[u8],
    max_frame: usize,
) -> Vec<u8> {
    let mut bytes = CLIENT_PREFACE.to_vec();
    bytes.extend(frame(SETTINGS, 0, 0, &[0, 2, 0, 0, 0, 0]));
    bytes.extend(frame(WINDOW_UPDATE, 0, 0, &[0, 0x0e, 0, 1]));
    bytes.extend(frame(HEADERS, END_HEADERS, stream_id, headers));
    bytes.extend(data_frames(stream_id, message, max_frame, true));
    bytes
}

/// Builds the send side of one push call whose DATA (`grpc_bytes`, framed gRPC messages) is split
/// into frames of at most `max_frame` bytes.
pub(crate) fn push_request_stream(grpc_bytes: &[u8], max_frame: usize) -> Vec<u8> {
    request_stream(1, &first_request_headers(PUSH_PATH), grpc_bytes, max_frame)
}

pub(crate) fn sample_response() -> Vec<u8> {
    OnlineBatchPushOneMsgResp {
        single_push_result: vec![
            SingleMsgToUserResults {
                user_id: "alice".into(),
                resp: vec![],
                online_push: false,
            },
            SingleMsgToUserResults {
                user_id: "bob".into(),
                resp: vec![PlatformOfUserResult {
                    result_code: 0,
                    recv_platform_id: 2,
                }],
                online_push: true,
            },
        ],
    }
    .encode_to_vec()
}

pub(crate) fn expected_results() -> Vec<UserResult> {
    vec![
        UserResult {
            user_id: "alice".into(),
            online_push: false,
            platforms: vec![],
        },
        UserResult {
            user_id: "bob".into(),
            online_push: true,
            platforms: vec![PlatformResult {
                result_code: 0,
                platform_id: 2,
            }],
        },
    ]
}

pub(crate) fn response_stream(stream_id: u32) -> Vec<u8> {
    let mut bytes = frame(SETTINGS, 0, 0, &[]);
    bytes.extend(frame(SETTINGS, 1, 0, &[]));
    let headers = header_block(&[
        Field::Indexed(8), // :status 200
        Field::Literal {
            name_index: 31,
            name: "",
            value: "application/grpc",
        },
    ]);
    bytes.extend(frame(HEADERS, END_HEADERS, stream_id, &headers));
    bytes.extend(frame(PING, 0, 0, &[0; 8]));
    bytes.extend(frame(
        DATA,
        0,
        stream_id,
        &grpc_message(0, &sample_response()),
    ));
    let trailers = header_block(&[
        Field::Literal {
            name_index: 0,
            name: "grpc-status",
            value: "0",
        },
        Field::Literal {
            name_index: 0,
            name: "grpc-message",
            value: "",
        },
    ]);
    bytes.extend(frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        stream_id,
        &trailers,
    ));
    bytes
}

pub(crate) fn push_request(stream_id: u32, call: PushCall) -> GrpcFact {
    GrpcFact::Request {
        stream_id,
        method: PUSH_PATH.into(),
        authority: Some(AUTHORITY.into()),
        body: RequestBody::Push(call),
    }
}

pub(crate) fn complete_call(recipients: &[&str]) -> PushCall {
    PushCall {
        message: sample_ids(),
        message_truncated: false,
        recipients: recipients.iter().map(|&r| r.into()).collect(),
        recipients_truncated: false,
    }
}

pub(crate) fn expected_response_facts(stream_id: u32) -> Vec<GrpcFact> {
    vec![
        GrpcFact::Response {
            stream_id,
            http_status: Some(200),
            body: ResponseBody::Push {
                results: expected_results(),
                truncated: false,
            },
        },
        GrpcFact::Trailers {
            stream_id,
            grpc_status: Some(0),
            grpc_message: Some(String::new()),
        },
    ]
}

/// Returns the decoder's facts as a list per call, as the tests compare them (the engine
/// passes one list it reuses).
pub(crate) trait FactsPerCall {
    fn feed_all(&mut self, direction: Direction, offset: u64, payload: &Bytes) -> Vec<GrpcFact>;
    fn finish_all(&mut self) -> Vec<GrpcFact>;
}

impl FactsPerCall for GrpcConnectionDecoder {
    fn feed_all(&mut self, direction: Direction, offset: u64, payload: &Bytes) -> Vec<GrpcFact> {
        let mut facts = Vec::new();
        self.feed(direction, offset, payload, &mut facts);
        facts
    }

    fn finish_all(&mut self) -> Vec<GrpcFact> {
        let mut facts = Vec::new();
        self.finish(&mut facts);
        facts
    }
}

/// Feeds `bytes` of one direction as chunks ending at `cuts`.
pub(crate) fn feed_cut(
    decoder: &mut GrpcConnectionDecoder,
    direction: Direction,
    bytes: &[u8],
    cuts: &[usize],
) -> Vec<GrpcFact> {
    let mut facts = Vec::new();
    let mut start = 0usize;
    for &end in cuts.iter().chain([&bytes.len()]) {
        decoder.feed(
            direction,
            start as u64,
            &Bytes::copy_from_slice(&bytes[start..end]),
            &mut facts,
        );
        start = end;
    }
    facts
}

pub(crate) fn feed_in_chunks(
    decoder: &mut GrpcConnectionDecoder,
    direction: Direction,
    bytes: &[u8],
    size: usize,
) -> Vec<GrpcFact> {
    let cuts: Vec<usize> = (size..bytes.len()).step_by(size).collect();
    feed_cut(decoder, direction, bytes, &cuts)
}
