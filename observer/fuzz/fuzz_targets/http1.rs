//! The WebSocket decoder and the redaction over arbitrary bytes and chunkings.
#![no_main]

use libfuzzer_sys::fuzz_target;
use observer::decode::{Limits, WebSocketDecoder};
use observer::model::Direction;
use observer::privacy::redact_secrets;

fuzz_target!(|data: &[u8]| {
    let Some((&chunking, bytes)) = data.split_first() else {
        return;
    };
    let mut redacted = bytes.to_vec();
    redact_secrets(&mut redacted);
    assert_eq!(redacted.len(), bytes.len());
    assert_token_values_hidden(&redacted);

    // Redacting twice changes nothing: a head whole in one chunk, which the capture layer has
    // redacted, is parsed as it comes, while one joined from several is redacted again.
    let mut twice = redacted.clone();
    redact_secrets(&mut twice);
    assert_eq!(twice, redacted);

    let chunk_len = usize::from(chunking % 32) + 1;
    // How a stream with its credentials redacted is chunked must not change the fact it gives.
    let whole = WebSocketDecoder::new(Limits::default()).feed(Direction::Send, 0, &redacted);
    let mut chunked_decoder = WebSocketDecoder::new(Limits::default());
    let mut offset = 0u64;
    let mut chunked = None;
    for chunk in redacted.chunks(chunk_len) {
        chunked = chunked.or(chunked_decoder.feed(Direction::Send, offset, chunk));
        offset += chunk.len() as u64;
    }
    if !bytes.is_empty() {
        assert_eq!(whole, chunked);
    }

    let mut decoder = WebSocketDecoder::new(Limits::default());
    let mut offsets = [0u64; 2];
    for (index, chunk) in bytes.chunks(chunk_len).enumerate() {
        // Bit i of `chunking` picks the direction of chunk i (cycling).
        let side = usize::from((chunking >> (index % 8)) & 1);
        let direction = if side == 0 {
            Direction::Send
        } else {
            Direction::Recv
        };
        decoder.feed(direction, offsets[side], chunk);
        offsets[side] += chunk.len() as u64;
    }
});

/// After redaction every `token=` (any case) is followed only by `*` up to its delimiter.
fn assert_token_values_hidden(bytes: &[u8]) {
    for start in 0..bytes.len() {
        let rest = &bytes[start..];
        if rest.len() >= 6 && rest[..6].eq_ignore_ascii_case(b"token=") {
            let value = rest[6..]
                .iter()
                .take_while(|&&byte| !matches!(byte, b'&' | b' ' | b'\r' | b'\n' | b'#'));
            for &byte in value {
                assert_eq!(byte, b'*');
            }
        }
    }
}
