//! `ContentScrubber` against the real decoders: what it zeroes, and that a scrubbed stream
//! decodes into the same push calls. The decoders sit above this layer; tests may use them as
//! an oracle.

use super::*;
use crate::decode::protobuf::tests::sample_request;
use crate::decode::test_streams::{CANARY, frame, grpc_message, push_request_stream};
use crate::decode::{GrpcConnectionDecoder, GrpcFact, Limits};

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

fn scrub_in_chunks(stream: &[u8], chunk_len: usize) -> Vec<u8> {
    let mut scrubber = ContentScrubber::new();
    let mut scrubbed = Vec::with_capacity(stream.len());
    for (index, chunk) in stream.chunks(chunk_len).enumerate() {
        let mut chunk = chunk.to_vec();
        scrubber.scrub(Direction::Send, (index * chunk_len) as u64, &mut chunk);
        scrubbed.extend(chunk);
    }
    scrubbed
}

fn decoded(stream: &[u8]) -> Vec<GrpcFact> {
    let mut decoder = GrpcConnectionDecoder::new(Limits::default());
    let mut facts = decoder.feed(Direction::Send, 0, stream);
    facts.extend(decoder.finish());
    facts
}

#[test]
fn content_is_zeroed_at_every_chunking_and_calls_decode_the_same() {
    let body = sample_request(CANARY, &["u1", "u2"]);
    for max_frame in [7, 16_384] {
        let stream = push_request_stream(&grpc_message(0, &body), max_frame);
        let expected = decoded(&stream);
        assert!(matches!(expected[0], GrpcFact::Request { .. }));
        for chunk_len in [1, 2, 3, 5, 7, 13, 64, 4096] {
            let scrubbed = scrub_in_chunks(&stream, chunk_len);
            assert_eq!(scrubbed.len(), stream.len());
            assert!(
                !contains(&scrubbed, &CANARY[..8]),
                "{max_frame}/{chunk_len}"
            );
            assert_eq!(decoded(&scrubbed), expected, "{max_frame}/{chunk_len}");
            // Only the content changed.
            let changed = stream.iter().zip(&scrubbed).filter(|(a, b)| a != b);
            assert_eq!(changed.count(), CANARY.len(), "{max_frame}/{chunk_len}");
        }
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
        let scrubbed = scrub_in_chunks(&stream, chunk_len);
        assert!(!contains(&scrubbed, &CANARY[..8]), "chunks of {chunk_len}");
        assert!(contains(&scrubbed, b"client-abc"));
    }
}

#[test]
fn what_cannot_be_followed_is_zeroed() {
    let body = sample_request(CANARY, &["u1"]);
    // Compressed flag: the whole body goes.
    let stream = push_request_stream(&grpc_message(1, &body), 16_384);
    let scrubbed = scrub_in_chunks(&stream, 10);
    assert!(!contains(&scrubbed, &CANARY[..8]));
    assert!(!contains(&scrubbed, b"client-abc"));
    // A gap: the rest of the direction goes.
    let stream = push_request_stream(&grpc_message(0, &body), 16_384);
    let mut scrubber = ContentScrubber::new();
    let (head, tail) = stream.split_at(30);
    let mut head = head.to_vec();
    scrubber.scrub(Direction::Send, 0, &mut head);
    let mut tail = tail.to_vec();
    scrubber.scrub(Direction::Send, 31, &mut tail);
    assert!(tail.iter().all(|&byte| byte == 0));
    // Joined mid-stream: everything goes.
    let mut scrubber = ContentScrubber::new();
    let mut late = stream.clone();
    scrubber.scrub(Direction::Send, 5, &mut late);
    assert!(late.iter().all(|&byte| byte == 0));
}

#[test]
fn broken_protobuf_zeroes_the_rest_of_the_message() {
    // msgData claims more bytes than the message holds; the canary follows.
    let mut body = vec![0x0a, 0x7f, 0x62, CANARY.len() as u8];
    body.extend(CANARY);
    let stream = push_request_stream(&grpc_message(0, &body), 16_384);
    for chunk_len in [1, 3, 4096] {
        assert!(!contains(
            &scrub_in_chunks(&stream, chunk_len),
            &CANARY[..8]
        ));
    }
}

#[test]
fn http1_on_the_grpc_port_is_redacted_like_websocket_ports() {
    let mut scrubber = ContentScrubber::new();
    let mut request =
        b"GET /?sendID=u1&token=CANARY-TOKEN HTTP/1.1\r\nHost: gw:88\r\n\r\n".to_vec();
    scrubber.scrub(Direction::Send, 0, &mut request);
    assert!(!contains(&request, b"CANARY"));
    assert!(contains(&request, b"sendID=u1"));
}

#[test]
fn answers_pass_unchanged() {
    let mut scrubber = ContentScrubber::new();
    let mut hello = CLIENT_PREFACE.to_vec();
    scrubber.scrub(Direction::Send, 0, &mut hello);
    let answer = frame(
        0,
        0,
        1,
        &grpc_message(0, &sample_request(b"result", &["u1"])),
    );
    let mut scrubbed = answer.clone();
    scrubber.scrub(Direction::Recv, 0, &mut scrubbed);
    assert_eq!(scrubbed, answer);
}

#[test]
fn a_stream_that_starts_as_something_else_is_not_grpc_and_passes() {
    let mut scrubber = ContentScrubber::new();
    let mut first = b"hello world".to_vec();
    scrubber.scrub(Direction::Send, 0, &mut first);
    assert_eq!(first, b"hello world");
    let mut later = b"more bytes".to_vec();
    scrubber.scrub(Direction::Send, 11, &mut later);
    assert_eq!(later, b"more bytes");
}
