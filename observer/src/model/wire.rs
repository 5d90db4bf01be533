//! How a connection's first bytes say what it carries: shared by the decoders, the privacy
//! scrubber and the capture, which all sniff them.

/// What an HTTP/2 client sends first (RFC 9113 §3.4).
pub const CLIENT_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether `payload` opens like an HTTP/1 request line (a WebSocket upgrade, on a port that
/// should carry HTTP/2).
pub fn starts_like_http1_request(payload: &[u8]) -> bool {
    const METHODS: [&[u8]; 4] = [b"GET ", b"POST ", b"PUT ", b"HEAD "];
    METHODS.iter().any(|method| payload.starts_with(method))
}
