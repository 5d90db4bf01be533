//! How a connection's first bytes say what it carries: shared by the decoders, the privacy
//! scrubber and the capture, which all sniff them.

/// What an HTTP/2 client sends first (RFC 9113 §3.4).
pub const CLIENT_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// HTTP/2 framing (RFC 9113 §4.1, §6.1) that both the decoder and the content scrubber walk.
pub const FRAME_HEADER_LEN: usize = 9;
pub const FRAME_DATA: u8 = 0x0;
pub const FLAG_END_STREAM: u8 = 0x1;
pub const FLAG_PADDED: u8 = 0x8;

/// Whether `payload` opens like an HTTP/1 request line (a WebSocket upgrade, on a port that
/// should carry HTTP/2).
pub fn starts_like_http1_request(payload: &[u8]) -> bool {
    const METHODS: [&[u8]; 4] = [b"GET ", b"POST ", b"PUT ", b"HEAD "];
    METHODS.iter().any(|method| payload.starts_with(method))
}
