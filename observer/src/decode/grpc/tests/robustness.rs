//! Decodes malformed, oversized and random streams: typed errors, bounded buffers, no panic,
//! and never a byte of message content in a fact.

use super::*;

#[test]
fn protocol_errors_are_typed() {
    let mut send = CLIENT_PREFACE.to_vec();
    send.extend(frame(HEADERS, 0, 1, &first_request_headers(PUSH_PATH)));
    send.extend(frame(DATA, 0, 1, b"xx"));
    let mut decoder = GrpcConnectionDecoder::new(Limits::default());
    assert_eq!(
        decoder.feed_all(Direction::Send, 0, &Bytes::copy_from_slice(&send)),
        vec![GrpcFact::Undecodable(Undecodable::Framing {
            direction: Direction::Send,
            error: FrameError::ContinuationExpected { frame_type: DATA },
        })]
    );
    assert_eq!(decoder.counters().http2_failures, 1);

    let mut send = CLIENT_PREFACE.to_vec();
    send.extend(frame(
        HEADERS,
        END_HEADERS,
        1,
        &[0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
    ));
    let mut decoder = GrpcConnectionDecoder::new(Limits::default());
    let facts = decoder.feed_all(Direction::Send, 0, &Bytes::copy_from_slice(&send));
    assert!(matches!(
        facts.as_slice(),
        [GrpcFact::Undecodable(Undecodable::Hpack { .. })]
    ));
    assert_eq!(decoder.counters().hpack_failures, 1);

    // The stream ends inside a message; a reset stream reports what it had.
    let mut send = request_stream(
        1,
        &first_request_headers(PUSH_PATH),
        &grpc_message(0, b"abc")[..6],
        16384,
    );
    send.extend(frame(
        HEADERS,
        END_HEADERS,
        3,
        &first_request_headers(PUSH_PATH),
    ));
    send.extend(frame(RST_STREAM, 0, 3, &[0, 0, 0, 8]));
    let mut decoder = GrpcConnectionDecoder::new(Limits::default());
    let facts = decoder.feed_all(Direction::Send, 0, &Bytes::copy_from_slice(&send));
    assert_eq!(facts.len(), 2);
    assert!(matches!(
        &facts[0],
        GrpcFact::Request {
            stream_id: 1,
            body: RequestBody::Malformed(BodyError::EndedInsideMessage),
            ..
        }
    ));
    assert!(matches!(
        &facts[1],
        GrpcFact::Request {
            stream_id: 3,
            body: RequestBody::Missing,
            ..
        }
    ));
}

#[test]
fn buffers_stay_within_limits() {
    let limits = Limits {
        max_buffered_bytes: 1000,
        ..Limits::default()
    };
    let message = grpc_message(0, &sample_request(&[b'y'; 5000], &["alice"]));
    let send = request_stream(1, &first_request_headers(PUSH_PATH), &message, 800);
    let mut decoder = GrpcConnectionDecoder::new(limits);
    let facts = feed_in_chunks(&mut decoder, Direction::Send, &send, 500);
    assert!(matches!(
        facts.as_slice(),
        [GrpcFact::Request {
            body: RequestBody::Push(PushCall {
                recipients_truncated: true,
                ..
            }),
            ..
        }]
    ));
    // A frame larger than the budget loses the direction instead of growing.
    let send = request_stream(1, &first_request_headers(PUSH_PATH), &message, 16384);
    let mut decoder = GrpcConnectionDecoder::new(limits);
    let facts = feed_in_chunks(&mut decoder, Direction::Send, &send, 500);
    assert!(
        facts.contains(&GrpcFact::Undecodable(Undecodable::BufferOverflow {
            direction: Direction::Send,
            limit: 1000
        }))
    );
}

#[test]
fn the_message_content_never_reaches_a_fact() {
    let message = grpc_message(0, &sample_request(CANARY, &["alice", "bob"]));
    let send = request_stream(1, &first_request_headers(PUSH_PATH), &message, 16384);
    for cut in (0..send.len()).step_by(3) {
        let mut decoder = GrpcConnectionDecoder::new(Limits::default());
        let mut facts = decoder.feed_all(Direction::Send, 0, &Bytes::copy_from_slice(&send[..cut]));
        decoder.feed(
            Direction::Send,
            cut as u64 + 1,
            &Bytes::copy_from_slice(send.get(cut + 1..).unwrap_or_default()),
            &mut facts,
        );
        let state = format!("{decoder:?}");
        assert!(!state.contains("CANARY") && state.contains("counters"));
        decoder.finish(&mut facts);
        let debug = format!("{facts:?}");
        assert!(!debug.contains("CANARY"), "cut {cut}: {debug}");
    }
}

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn random_and_mutated_bytes_never_panic() {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let message = grpc_message(0, &sample_request(CANARY, &["alice", "bob"]));
    let valid_send = request_stream(1, &first_request_headers(PUSH_PATH), &message, 64);
    let valid_recv = response_stream(1);
    for round in 0..3000 {
        let mut send = valid_send.clone();
        let mut recv = valid_recv.clone();
        if round % 3 == 0 {
            let len = (rng.next() % 400) as usize;
            send = CLIENT_PREFACE.to_vec();
            send.extend((0..len).map(|_| rng.next() as u8));
            recv = (0..len).map(|_| rng.next() as u8).collect();
        } else {
            for _ in 0..1 + rng.next() % 4 {
                let index = (rng.next() as usize) % send.len();
                send[index] = rng.next() as u8;
                let index = (rng.next() as usize) % recv.len();
                recv[index] = rng.next() as u8;
            }
        }
        let mut decoder = GrpcConnectionDecoder::new(Limits {
            max_buffered_bytes: 4096,
            ..Limits::default()
        });
        let chunk = 1 + (rng.next() % 64) as usize;
        feed_in_chunks(&mut decoder, Direction::Send, &send, chunk);
        feed_in_chunks(&mut decoder, Direction::Recv, &recv, chunk);
        decoder.finish_all();
    }
}
