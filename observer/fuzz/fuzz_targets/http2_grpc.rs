//! The HTTP/2 + gRPC connection decoder over arbitrary frames, chunkings and gaps.
#![no_main]

use libfuzzer_sys::fuzz_target;
use observer::capture::Direction;
use observer::decode::http2::CLIENT_PREFACE;
use observer::decode::{GrpcConnectionDecoder, Limits};

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
    let limits = Limits {
        max_buffered_bytes: 2048,
        max_header_block_bytes: 1024,
        max_dynamic_table_size: 512,
        max_streams: 4,
        ..Limits::default()
    };
    let mut decoder = GrpcConnectionDecoder::new(limits);
    let chunk_len = usize::from(chunking % 64) + 1;
    // A gap of one byte now and then in either direction when bit 1 is set.
    let with_gaps = control & 2 != 0;
    let mut send_chunks = send.chunks(chunk_len);
    let mut recv_chunks = recv.chunks(chunk_len);
    let mut offsets = [0u64; 2];
    for round in 0usize.. {
        let side = (usize::from(*control) >> (2 + round % 6)) & 1;
        let chunk = if side == 0 {
            send_chunks.next()
        } else {
            recv_chunks.next()
        };
        let Some(chunk) = chunk
            .or_else(|| send_chunks.next())
            .or_else(|| recv_chunks.next())
        else {
            break;
        };
        let direction = if side == 0 {
            Direction::Send
        } else {
            Direction::Recv
        };
        let skip = u64::from(with_gaps && round % 7 == 6);
        let side_offset = &mut offsets[side];
        decoder.feed(direction, *side_offset + skip, chunk);
        *side_offset += skip + chunk.len() as u64;
    }
    decoder.finish();
});
