//! What the decoders, the output whitelist and the capture all read on the wire: how a
//! connection's first bytes say what it carries, HTTP/2 framing, and query-text decoding.

/// What an HTTP/2 client sends first (RFC 9113 §3.4).
pub const CLIENT_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// HTTP/2 framing (RFC 9113 §4.1, §6) that both the decoder and the output whitelist walk.
pub const FRAME_HEADER_LEN: usize = 9;
pub const FRAME_DATA: u8 = 0x0;
pub const FRAME_HEADERS: u8 = 0x1;
pub const FRAME_PRIORITY: u8 = 0x2;
pub const FRAME_RST_STREAM: u8 = 0x3;
pub const FRAME_SETTINGS: u8 = 0x4;
pub const FRAME_PUSH_PROMISE: u8 = 0x5;
pub const FRAME_PING: u8 = 0x6;
pub const FRAME_GOAWAY: u8 = 0x7;
pub const FRAME_WINDOW_UPDATE: u8 = 0x8;
pub const FRAME_CONTINUATION: u8 = 0x9;
pub const FLAG_END_STREAM: u8 = 0x1;
pub const FLAG_END_HEADERS: u8 = 0x4;
pub const FLAG_PADDED: u8 = 0x8;
pub const FLAG_PRIORITY: u8 = 0x20;

/// Whether `payload` opens like an HTTP/1 request line (a WebSocket upgrade, on a port that
/// should carry HTTP/2).
pub fn starts_like_http1_request(payload: &[u8]) -> bool {
    const METHODS: [&[u8]; 4] = [b"GET ", b"POST ", b"PUT ", b"HEAD "];
    METHODS.iter().any(|method| payload.starts_with(method))
}

/// `bytes` as text, as `str::from_utf8` reads it, with ASCII (what user ids, header values and
/// addresses nearly always are) accepted by a plain ASCII check first: on a ten-digit user id
/// std's validation costs about a hundred instructions (callgrind), most of them its setup.
pub fn utf8(bytes: &[u8]) -> Result<&str, std::str::Utf8Error> {
    if bytes.is_ascii() {
        // SAFETY: every sequence of ASCII bytes is UTF-8.
        Ok(unsafe { std::str::from_utf8_unchecked(bytes) })
    } else {
        std::str::from_utf8(bytes)
    }
}

/// `%XX` escapes decoded and `+` read as a space, as Go's `url.ParseQuery` reads query keys and
/// values; an invalid escape stays as it is.
pub fn percent_decode(text: &[u8]) -> Vec<u8> {
    let mut decoded = Vec::with_capacity(text.len());
    let mut index = 0;
    while let Some(&byte) = text.get(index) {
        let escaped = (byte == b'%')
            .then(|| text.get(index + 1..index + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match (byte, escaped) {
            (_, Some(escaped)) => {
                decoded.push(escaped);
                index += 3;
            }
            (b'+', None) => {
                decoded.push(b' ');
                index += 1;
            }
            (other, None) => {
                decoded.push(other);
                index += 1;
            }
        }
    }
    decoded
}

#[cfg(test)]
mod tests {
    #[test]
    fn utf8_reads_text_as_std_does() {
        let texts: [&[u8]; 7] = [
            b"",
            b"4360894025",
            b"\x00\x7f",
            "é€😀 user".as_bytes(),
            b"\xff",
            b"user\xc3",
            b"\xed\xa0\x80",
        ];
        for bytes in texts {
            assert_eq!(super::utf8(bytes), std::str::from_utf8(bytes), "{bytes:?}");
        }
    }
}
