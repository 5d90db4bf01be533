//! The HTTP/2 + gRPC connection decoder over arbitrary frames, chunkings and gaps.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use observer::decode::{GrpcConnectionDecoder, GrpcFact, Limits};
use observer::model::Direction;
use observer::model::wire::CLIENT_PREFACE;

const LIMITS: Limits = Limits {
    max_buffered_bytes: 2048,
    max_header_block_bytes: 1024,
    max_dynamic_table_size: 512,
    max_streams: 4,
    max_http1_head_bytes: 1024,
};

fuzz_target!(|data: &[u8]| {
    let [control, split, chunking, rest @ ..] = data else {
        return;
    };
    // Most inputs get the real preface so the fuzzer spends its time on frames.
    let mut send = if control & 1 == 0 {
        CLIENT_PREFACE.to_vec()
    } else {
        Vec::new()
    };
    let split = usize::from(*split) * rest.len() / 255;
    send.extend_from_slice(&rest[..split]);
    let recv = &rest[split..];
    let chunk_len = usize::from(chunking % 64) + 1;
    if control & 2 == 0 {
        // Without gaps, how the bytes are chunked must not change what is decoded.
        let whole = decode_in_chunks(&send, recv, usize::MAX);
        let chunked = decode_in_chunks(&send, recv, chunk_len);
        assert_eq!(whole, chunked);
    } else {
        decode_interleaved_with_gaps(*control, &send, recv, chunk_len);
    }
});

fn decode_in_chunks(send: &[u8], recv: &[u8], chunk_len: usize) -> Vec<GrpcFact> {
    let mut decoder = GrpcConnectionDecoder::new(LIMITS);
    let mut facts = Vec::new();
    for (direction, bytes) in [(Direction::Send, send), (Direction::Recv, recv)] {
        let mut offset = 0u64;
        for chunk in bytes.chunks(chunk_len) {
            decoder.feed(
                direction,
                offset,
                &Bytes::copy_from_slice(chunk),
                &mut facts,
            );
            offset += chunk.len() as u64;
        }
    }
    decoder.finish(&mut facts);
    facts
}

/// Directions alternate as bits 2..8 of `control` say, and every seventh chunk skips a byte.
fn decode_interleaved_with_gaps(control: u8, send: &[u8], recv: &[u8], chunk_len: usize) {
    let mut decoder = GrpcConnectionDecoder::new(LIMITS);
    let mut facts = Vec::new();
    let mut send_chunks = send.chunks(chunk_len);
    let mut recv_chunks = recv.chunks(chunk_len);
    let mut offsets = [0u64; 2];
    for round in 0usize.. {
        let side = (usize::from(control) >> (2 + round % 6)) & 1;
        let (chunk, side) = match side {
            0 => (send_chunks.next(), 0),
            _ => (recv_chunks.next(), 1),
        };
        let (chunk, side) = match chunk {
            Some(chunk) => (chunk, side),
            None => match send_chunks.next() {
                Some(chunk) => (chunk, 0),
                None => match recv_chunks.next() {
                    Some(chunk) => (chunk, 1),
                    None => break,
                },
            },
        };
        let direction = if side == 0 {
            Direction::Send
        } else {
            Direction::Recv
        };
        let skip = u64::from(round % 7 == 6);
        decoder.feed(
            direction,
            offsets[side] + skip,
            &Bytes::copy_from_slice(chunk),
            &mut facts,
        );
        facts.clear();
        offsets[side] += skip + chunk.len() as u64;
    }
    decoder.finish(&mut facts);
}
