//! Builds HTTP/2 (RFC 9113) and gRPC framing, and the HPACK (RFC 7541) pieces to write header
//! blocks, as the byte vectors a peer would send. Nothing here checks its input: tests build broken
//! streams on purpose.

/// Holds what an HTTP/2 client sends first (RFC 9113 §3.4).
pub const CLIENT_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

// Frame types.
/// Numbers the DATA frame type.
pub const DATA: u8 = 0x0;
/// Numbers the HEADERS frame type.
pub const HEADERS: u8 = 0x1;
/// Numbers the PRIORITY frame type.
pub const PRIORITY: u8 = 0x2;
/// Numbers the RST_STREAM frame type.
pub const RST_STREAM: u8 = 0x3;
/// Numbers the SETTINGS frame type.
pub const SETTINGS: u8 = 0x4;
/// Numbers the PING frame type.
pub const PING: u8 = 0x6;
/// Numbers the WINDOW_UPDATE frame type.
pub const WINDOW_UPDATE: u8 = 0x8;
/// Numbers the CONTINUATION frame type.
pub const CONTINUATION: u8 = 0x9;

// Flags (which apply depends on the frame type).
/// Flags a frame that ends its stream (END_STREAM).
pub const END_STREAM: u8 = 0x1;
/// Flags a SETTINGS or PING frame as an acknowledgement (ACK).
pub const ACK: u8 = 0x1;
/// Flags a frame that ends its header block (END_HEADERS).
pub const END_HEADERS: u8 = 0x4;
/// Flags a padded frame (PADDED).
pub const PADDED: u8 = 0x8;
/// Flags a HEADERS frame that carries priority fields (PRIORITY).
pub const PRIORITY_FLAG: u8 = 0x20;

/// Holds HTTP/2's default SETTINGS_MAX_FRAME_SIZE.
pub const DEFAULT_MAX_FRAME: usize = 16_384;

/// Builds one frame: 24-bit length, type, flags, stream id, payload.
pub fn frame(frame_type: u8, flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
    let length = (payload.len() as u32).to_be_bytes();
    let mut frame = Vec::with_capacity(9 + payload.len());
    frame.extend_from_slice(&length[1..]);
    frame.extend([frame_type, flags]);
    frame.extend(stream_id.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// Splits `message` into DATA frames of at most `max_frame` bytes; the last one ends the stream
/// when `end_stream` is set.
pub fn data_frames(stream_id: u32, message: &[u8], max_frame: usize, end_stream: bool) -> Vec<u8> {
    let pieces: Vec<&[u8]> = message.chunks(max_frame.max(1)).collect();
    let mut frames = Vec::with_capacity(message.len() + 9 * pieces.len());
    for (index, piece) in pieces.iter().enumerate() {
        let last = index + 1 == pieces.len();
        let flags = if last && end_stream { END_STREAM } else { 0 };
        frames.extend(frame(DATA, flags, stream_id, piece));
    }
    frames
}

/// Builds a gRPC length-prefixed message: the compressed flag, the 32-bit length, the body.
pub fn grpc_message(compressed_flag: u8, body: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(5 + body.len());
    message.push(compressed_flag);
    message.extend((body.len() as u32).to_be_bytes());
    message.extend_from_slice(body);
    message
}

/// Appends an HPACK integer with an N-bit prefix after the flag bits in `first_byte` (RFC 7541
/// §5.1).
pub fn hpack_integer(first_byte: u8, prefix_bits: u32, value: usize, out: &mut Vec<u8>) {
    let prefix_max = (1usize << prefix_bits) - 1;
    if value < prefix_max {
        out.push(first_byte | value as u8);
        return;
    }
    out.push(first_byte | prefix_max as u8);
    let mut rest = value - prefix_max;
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
}

/// Appends a string literal without Huffman coding (RFC 7541 §5.2), as grpc-go writes short values.
pub fn hpack_raw_string(text: &str, out: &mut Vec<u8>) {
    hpack_integer(0, 7, text.len(), out);
    out.extend_from_slice(text.as_bytes());
}

/// Appends a literal field without indexing (RFC 7541 §6.2.2): the name by static-table index, or
/// written out when `name_index` is 0.
pub fn hpack_literal_without_indexing(
    name_index: usize,
    name: &str,
    value: &str,
    out: &mut Vec<u8>,
) {
    hpack_integer(0, 4, name_index, out);
    if name_index == 0 {
        hpack_raw_string(name, out);
    }
    hpack_raw_string(value, out);
}
