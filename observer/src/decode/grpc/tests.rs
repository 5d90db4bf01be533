//! HTTP/2 + gRPC decoding over hand-built byte streams, fed the way the capture delivers them.

use bytes::Bytes;
use openim_test_kit::http2::*;
use prost::Message;

use crate::model::{Direction, MessageIds};

use crate::decode::grpc::{BodyError, GrpcConnectionDecoder, GrpcFact, RequestBody, ResponseBody};
use crate::decode::http2::{FrameError, Undecodable};
use crate::decode::protobuf::PushCall;
use crate::decode::protobuf::tests::{sample_ids, sample_request};
use crate::decode::{DecodeCounters, Limits};
use crate::model::wire::{CLIENT_PREFACE, FRAME_HEADER_LEN, is_call_frame};

use crate::decode::test_streams::*;

mod robustness;

#[test]
fn decodes_a_push_call_and_its_answer() {
    let message = grpc_message(0, &sample_request(CANARY, &["alice", "bob"]));
    let send = request_stream(1, &first_request_headers(PUSH_PATH), &message, 16384);
    let mut decoder = GrpcConnectionDecoder::new(Limits::default());
    let mut facts = decoder.feed_all(Direction::Send, 0, &Bytes::copy_from_slice(&send));
    decoder.feed(
        Direction::Recv,
        0,
        &Bytes::copy_from_slice(&response_stream(1)),
        &mut facts,
    );
    decoder.finish(&mut facts);
    let mut expected = vec![push_request(1, complete_call(&["alice", "bob"]))];
    expected.extend(expected_response_facts(1));
    assert_eq!(facts, expected);
    assert_eq!(*decoder.counters(), DecodeCounters::default());
}

/// OpenIM 3.7 renamed the protocol's package: the same push under `openim.*` decodes alike,
/// and a method renamed in some later release is read by its request's shape.
#[test]
fn push_calls_decode_under_any_package_and_by_shape_under_an_unknown_method() {
    for (path, by_shape) in [
        (
            "/openim.msggateway.msgGateway/SuperGroupOnlineBatchPushOneMsg",
            0,
        ),
        ("/im.gateway.v4.Gateway/BatchPush", 1),
    ] {
        let message = grpc_message(0, &sample_request(CANARY, &["alice", "bob"]));
        let send = request_stream(1, &first_request_headers(path), &message, 16384);
        let mut decoder = GrpcConnectionDecoder::new(Limits::default());
        let mut facts = decoder.feed_all(Direction::Send, 0, &Bytes::copy_from_slice(&send));
        decoder.feed(
            Direction::Recv,
            0,
            &Bytes::copy_from_slice(&response_stream(1)),
            &mut facts,
        );
        decoder.finish(&mut facts);
        let mut expected = vec![GrpcFact::Request {
            stream_id: 1,
            method: path.into(),
            authority: Some(AUTHORITY.into()),
            body: RequestBody::Push(complete_call(&["alice", "bob"])),
        }];
        expected.extend(expected_response_facts(1));
        assert_eq!(facts, expected, "{path}");
        assert_eq!(decoder.counters().calls_recognised_by_shape, by_shape);
    }
}

/// `stream` as the packet hook delivers it when each of its frames came in a segment of its
/// own: without the frames the decoder does not read (`is_call_frame`, which the packet
/// programs follow), the client preface kept.
fn without_frames_left_out(stream: &[u8]) -> Vec<u8> {
    let (mut kept, mut rest) = match stream.strip_prefix(&CLIENT_PREFACE[..]) {
        Some(rest) => (CLIENT_PREFACE.to_vec(), rest),
        None => (Vec::new(), stream),
    };
    while !rest.is_empty() {
        let len = FRAME_HEADER_LEN + u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        let (frame, tail) = rest.split_at(len);
        if is_call_frame(frame[3]) {
            kept.extend(frame);
        }
        rest = tail;
    }
    kept
}

#[test]
fn leaving_out_the_frames_the_decoder_does_not_read_changes_no_fact() {
    let message = grpc_message(0, &sample_request(CANARY, &["alice", "bob"]));
    let send = request_stream(1, &first_request_headers(PUSH_PATH), &message, 40);
    let recv = response_stream(1);
    let facts_of = |send: &[u8], recv: &[u8]| {
        let mut decoder = GrpcConnectionDecoder::new(Limits::default());
        let mut facts = decoder.feed_all(Direction::Send, 0, &Bytes::copy_from_slice(send));
        decoder.feed(
            Direction::Recv,
            0,
            &Bytes::copy_from_slice(recv),
            &mut facts,
        );
        decoder.finish(&mut facts);
        (facts, *decoder.counters())
    };
    let (send_kept, recv_kept) = (
        without_frames_left_out(&send),
        without_frames_left_out(&recv),
    );
    // The test streams hold SETTINGS, WINDOW_UPDATE and PING frames.
    assert!(send_kept.len() < send.len() && recv_kept.len() < recv.len());
    assert_eq!(facts_of(&send_kept, &recv_kept), facts_of(&send, &recv));
}

#[test]
fn split_at_every_byte_boundary_gives_the_same_facts() {
    let message = grpc_message(0, &sample_request(CANARY, &["alice", "bob"]));
    // Small DATA frames so the message spans several frames too.
    let send = request_stream(1, &first_request_headers(PUSH_PATH), &message, 40);
    let recv = response_stream(1);
    let mut expected = vec![push_request(1, complete_call(&["alice", "bob"]))];
    expected.extend(expected_response_facts(1));
    for split in 0..send.len().max(recv.len()) {
        let mut decoder = GrpcConnectionDecoder::new(Limits::default());
        let mut facts = feed_cut(
            &mut decoder,
            Direction::Send,
            &send,
            &[split.min(send.len())],
        );
        facts.extend(feed_cut(
            &mut decoder,
            Direction::Recv,
            &recv,
            &[split.min(recv.len())],
        ));
        assert_eq!(facts, expected, "split at {split}");
    }
    let mut decoder = GrpcConnectionDecoder::new(Limits::default());
    let mut facts = feed_in_chunks(&mut decoder, Direction::Send, &send, 1);
    facts.extend(feed_in_chunks(&mut decoder, Direction::Recv, &recv, 1));
    assert_eq!(facts, expected);
}

#[test]
fn padding_priority_and_continuation() {
    let headers = first_request_headers(PUSH_PATH);
    let (first, rest) = headers.split_at(7);
    let (middle, last) = rest.split_at(20);
    let mut padded_headers = vec![3u8];
    padded_headers.extend([0, 0, 0, 0, 16]); // priority: dependency 0, weight 16
    padded_headers.extend(first);
    padded_headers.extend([0, 0, 0]);
    let message = grpc_message(0, &sample_request(CANARY, &["carol"]));
    let (message_start, message_end) = message.split_at(30);
    let mut padded_data = vec![200u8];
    padded_data.extend(message_start);
    padded_data.extend([0u8; 200]);

    let mut send = CLIENT_PREFACE.to_vec();
    send.extend(frame(SETTINGS, 0, 0, &[]));
    send.extend(frame(HEADERS, PADDED | PRIORITY_FLAG, 1, &padded_headers));
    send.extend(frame(CONTINUATION, 0, 1, middle));
    send.extend(frame(CONTINUATION, END_HEADERS, 1, last));
    send.extend(frame(PRIORITY, 0, 1, &[0, 0, 0, 0, 16]));
    send.extend(frame(DATA, PADDED, 1, &padded_data));
    send.extend(frame(
        DATA,
        PADDED | END_STREAM,
        1,
        &[[0u8].as_slice(), message_end].concat(),
    ));

    let mut decoder = GrpcConnectionDecoder::new(Limits::default());
    for size in [1, 7, 4096] {
        let facts = feed_in_chunks(&mut decoder, Direction::Send, &send, size);
        assert_eq!(
            facts,
            vec![push_request(1, complete_call(&["carol"]))],
            "chunks of {size}"
        );
        decoder = GrpcConnectionDecoder::new(Limits::default());
    }
}

#[test]
fn dynamic_table_carries_over_between_requests() {
    let message = grpc_message(0, &sample_request(CANARY, &["dave"]));
    let mut send = request_stream(1, &first_request_headers(PUSH_PATH), &message, 16384);
    // Newest first: te (62), content-type (63), :authority (64), :path (65).
    let second_headers = header_block(&[
        Field::Indexed(3),
        Field::Indexed(6),
        Field::Indexed(65),
        Field::Indexed(64),
        Field::Indexed(63),
        Field::Indexed(62),
    ]);
    send.extend(frame(HEADERS, END_HEADERS, 3, &second_headers));
    send.extend(data_frames(
        3,
        &grpc_message(0, &sample_request(CANARY, &["erin"])),
        16384,
        true,
    ));
    let mut recv = response_stream(1);
    // The response side has its own table: grpc-message (62), grpc-status (63), content-type (64).
    let headers = header_block(&[Field::Indexed(8), Field::Indexed(64)]);
    recv.extend(frame(HEADERS, END_HEADERS, 3, &headers));
    recv.extend(frame(DATA, 0, 3, &grpc_message(0, &sample_response())));
    recv.extend(frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        3,
        &header_block(&[Field::Indexed(63), Field::Indexed(62)]),
    ));

    let mut decoder = GrpcConnectionDecoder::new(Limits::default());
    let mut facts = decoder.feed_all(Direction::Send, 0, &Bytes::copy_from_slice(&send));
    decoder.feed(
        Direction::Recv,
        0,
        &Bytes::copy_from_slice(&recv),
        &mut facts,
    );
    let mut expected = vec![
        push_request(1, complete_call(&["dave"])),
        push_request(3, complete_call(&["erin"])),
    ];
    expected.extend(expected_response_facts(1));
    expected.push(GrpcFact::Response {
        stream_id: 3,
        http_status: Some(200),
        body: ResponseBody::Push {
            results: expected_results(),
            truncated: false,
        },
    });
    expected.push(GrpcFact::Trailers {
        stream_id: 3,
        grpc_status: Some(0),
        grpc_message: Some(String::new()),
    });
    assert_eq!(facts, expected);
}

#[test]
fn joined_mid_stream_reports_nothing_else() {
    let message = grpc_message(0, &sample_request(CANARY, &["alice"]));
    let send = request_stream(1, &first_request_headers(PUSH_PATH), &message, 16384);
    let mut decoder = GrpcConnectionDecoder::new(Limits::default());
    let facts = decoder.feed_all(Direction::Send, 24, &Bytes::copy_from_slice(&send[24..]));
    assert_eq!(
        facts,
        vec![GrpcFact::Undecodable(Undecodable::JoinedMidStream {
            direction: Direction::Send,
            first_offset: 24
        })]
    );
    assert!(
        decoder
            .feed_all(
                Direction::Recv,
                0,
                &Bytes::copy_from_slice(&response_stream(1))
            )
            .is_empty()
    );
    assert!(decoder.finish_all().is_empty());
    assert_eq!(decoder.counters().undecodable_joined_mid_stream, 1);

    let mut decoder = GrpcConnectionDecoder::new(Limits::default());
    let facts = decoder.feed_all(Direction::Send, 0, &Bytes::copy_from_slice(&send[9..]));
    assert_eq!(
        facts,
        vec![GrpcFact::Undecodable(Undecodable::NoClientPreface)]
    );
    assert!(
        decoder
            .feed_all(
                Direction::Send,
                send.len() as u64 - 9,
                &Bytes::copy_from_slice(b"more")
            )
            .is_empty()
    );
    assert_eq!(decoder.counters().undecodable_no_client_preface, 1);
}

#[test]
fn a_gap_truncates_the_call_but_keeps_what_was_read() {
    // msgData far larger than the capture budget: the recipients are never captured.
    let big = vec![b'x'; 300 << 10];
    let message = grpc_message(0, &sample_request(&big, &["alice", "bob"]));
    let send = request_stream(1, &first_request_headers(PUSH_PATH), &message, 16384);
    let budget = 256 << 10;
    let mut decoder = GrpcConnectionDecoder::new(Limits::default());
    let mut facts = feed_in_chunks(&mut decoder, Direction::Send, &send[..budget], 4096);
    decoder.feed(
        Direction::Send,
        send.len() as u64 - 100,
        &Bytes::copy_from_slice(&send[send.len() - 100..]),
        &mut facts,
    );
    let mut expected_call = PushCall {
        message: sample_ids(),
        message_truncated: true,
        recipients: vec![],
        recipients_truncated: true,
    };
    // Fields of msgData after the content (seq) are lost with the cut.
    expected_call.message.seq = None;
    assert_eq!(
        facts,
        vec![
            GrpcFact::Undecodable(Undecodable::Gap {
                direction: Direction::Send,
                position: budget as u64,
                missing: (send.len() - 100 - budget) as u64,
            }),
            push_request(1, expected_call),
        ]
    );
    assert_eq!(decoder.counters().truncated_calls, 1);
    assert_eq!(decoder.counters().lost_sync_gap, 1);
    // The answer still decodes: the receive side has its own HPACK state.
    assert_eq!(
        decoder.feed_all(
            Direction::Recv,
            0,
            &Bytes::copy_from_slice(&response_stream(1))
        ),
        expected_response_facts(1)
    );
}

#[test]
fn a_cut_inside_the_recipients_lists_the_complete_ones() {
    let message = grpc_message(0, &sample_request(CANARY, &["alice", "bob", "carol"]));
    let send = request_stream(1, &first_request_headers(PUSH_PATH), &message, 16384);
    // Ends inside "carol": the capture stopped there and the connection closed.
    let captured = &send[..send.len() - 3];
    let mut decoder = GrpcConnectionDecoder::new(Limits::default());
    assert!(
        decoder
            .feed_all(Direction::Send, 0, &Bytes::copy_from_slice(captured))
            .is_empty()
    );
    let call = PushCall {
        message: sample_ids(),
        message_truncated: false,
        recipients: vec!["alice".into(), "bob".into()],
        recipients_truncated: true,
    };
    assert_eq!(decoder.finish_all(), vec![push_request(1, call)]);
}

#[test]
fn compressed_messages_are_reported_not_parsed() {
    let send = request_stream(
        1,
        &first_request_headers(PUSH_PATH),
        &grpc_message(1, b"\x1f\x8b gzip"),
        16384,
    );
    let mut decoder = GrpcConnectionDecoder::new(Limits::default());
    let facts = decoder.feed_all(Direction::Send, 0, &Bytes::copy_from_slice(&send));
    assert_eq!(
        facts,
        vec![GrpcFact::Request {
            stream_id: 1,
            method: PUSH_PATH.into(),
            authority: Some(AUTHORITY.into()),
            body: RequestBody::Compressed,
        }]
    );
    assert_eq!(decoder.counters().compressed_messages, 1);
}

#[test]
fn other_methods_are_named_not_decoded() {
    let path = "/OpenIMServer.msggateway.msgGateway/GetUsersOnlineStatus";
    let send = request_stream(
        1,
        &first_request_headers(path),
        &grpc_message(0, b"\x0a\x01u"),
        16384,
    );
    let mut decoder = GrpcConnectionDecoder::new(Limits::default());
    let mut facts = decoder.feed_all(Direction::Send, 0, &Bytes::copy_from_slice(&send));
    decoder.feed(
        Direction::Recv,
        0,
        &Bytes::copy_from_slice(&response_stream(1)),
        &mut facts,
    );
    assert_eq!(
        facts,
        vec![
            GrpcFact::Request {
                stream_id: 1,
                method: path.into(),
                authority: Some(AUTHORITY.into()),
                body: RequestBody::OtherMethod,
            },
            GrpcFact::Trailers {
                stream_id: 1,
                grpc_status: Some(0),
                grpc_message: Some(String::new())
            },
        ]
    );
}

#[test]
fn trailers_only_answer_and_single_push() {
    let path = "/OpenIMServer.msggateway.msgGateway/OnlinePushMsg";
    let request = openim_test_kit::message::OnlinePushMsgReq {
        msg_data: Some(openim_test_kit::message::MsgData {
            client_msg_id: "c1".into(),
            seq: 5,
            ..Default::default()
        }),
        push_to_user_id: "frank".into(),
    };
    let send = request_stream(
        1,
        &first_request_headers(path),
        &grpc_message(0, &request.encode_to_vec()),
        16384,
    );
    let answer = header_block(&[
        Field::Indexed(8),
        Field::Literal {
            name_index: 0,
            name: "grpc-status",
            value: "14",
        },
        Field::Literal {
            name_index: 0,
            name: "grpc-message",
            value: "no connection",
        },
    ]);
    let recv = frame(HEADERS, END_HEADERS | END_STREAM, 1, &answer);
    let mut decoder = GrpcConnectionDecoder::new(Limits::default());
    let mut facts = decoder.feed_all(Direction::Send, 0, &Bytes::copy_from_slice(&send));
    decoder.feed(
        Direction::Recv,
        0,
        &Bytes::copy_from_slice(&recv),
        &mut facts,
    );
    decoder.finish(&mut facts);
    let call = PushCall {
        message: MessageIds {
            client_msg_id: Some("c1".into()),
            seq: Some(5),
            ..Default::default()
        },
        recipients: vec!["frank".into()],
        ..PushCall::default()
    };
    assert_eq!(
        facts,
        vec![
            GrpcFact::Request {
                stream_id: 1,
                method: path.into(),
                authority: Some(AUTHORITY.into()),
                body: RequestBody::Push(call),
            },
            GrpcFact::Trailers {
                stream_id: 1,
                grpc_status: Some(14),
                grpc_message: Some("no connection".into()),
            },
        ]
    );
}

#[test]
fn adopted_connection_resyncs_and_recognises_pushes_by_shape() {
    // Stream 1 was under way when the connection was adopted; stream 3's headers refer to
    // HPACK entries made by stream 1's, which the adopted decoder never saw.
    let message = grpc_message(0, &sample_request(CANARY, &["dave"]));
    let mut send = request_stream(1, &first_request_headers(PUSH_PATH), &message, 16384);
    let joined_at = send.len() - 7;
    let second_headers = header_block(&[
        Field::Indexed(3),
        Field::Indexed(6),
        Field::Indexed(65),
        Field::Indexed(64),
        Field::Indexed(63),
        Field::Indexed(62),
    ]);
    send.extend(frame(HEADERS, END_HEADERS, 3, &second_headers));
    send.extend(data_frames(
        3,
        &grpc_message(0, &sample_request(CANARY, &["erin", "frank"])),
        16384,
        true,
    ));
    let mut recv = response_stream(1);
    let recv_joined_at = recv.len();
    recv.extend(frame(
        HEADERS,
        END_HEADERS,
        3,
        &header_block(&[Field::Indexed(8), Field::Indexed(64)]),
    ));
    recv.extend(frame(DATA, 0, 3, &grpc_message(0, &sample_response())));
    recv.extend(frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        3,
        &header_block(&[Field::Indexed(63), Field::Indexed(62)]),
    ));

    let mut decoder = GrpcConnectionDecoder::joined_mid_stream(Limits::default());
    // Positions count from the adoption, in chunks as a writer might make them.
    let mut facts = feed_in_chunks(&mut decoder, Direction::Send, &send[joined_at..], 5);
    decoder.feed(
        Direction::Recv,
        0,
        &Bytes::copy_from_slice(&recv[recv_joined_at..]),
        &mut facts,
    );
    decoder.finish(&mut facts);
    assert_eq!(
        facts,
        vec![
            GrpcFact::Request {
                stream_id: 3,
                method: crate::decode::grpc::BATCH_PUSH_BY_SHAPE.into(),
                authority: None,
                body: RequestBody::Push(complete_call(&["erin", "frank"])),
            },
            GrpcFact::Response {
                stream_id: 3,
                http_status: Some(200),
                body: ResponseBody::Push {
                    results: expected_results(),
                    truncated: false,
                },
            },
            GrpcFact::Trailers {
                stream_id: 3,
                grpc_status: None,
                grpc_message: None,
            },
        ]
    );
    let counters = decoder.counters();
    assert_eq!(counters.mid_stream_skipped_bytes, 7);
    assert_eq!(counters.calls_recognised_by_shape, 1);
    // :path, :authority, content-type, te; then content-type, grpc-status, grpc-message.
    assert_eq!(counters.mid_stream_unknown_header_fields, 7);
}
