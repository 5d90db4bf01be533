//! Gathers what the decoders, the output whitelist and the capture all read on the wire: how a
//! connection's first bytes say what it carries, HTTP/2 framing, and query-text decoding.
//! HTTP/2's framing is defined once, in `observer_records::http2`, which the packet programs
//! follow too (to leave out the segments the decoder would not read).

pub use observer_records::http2::{
    CLIENT_PREFACE, FLAG_END_HEADERS, FLAG_END_STREAM, FLAG_PADDED, FLAG_PRIORITY,
    FRAME_CONTINUATION, FRAME_DATA, FRAME_GOAWAY, FRAME_HEADER_LEN, FRAME_HEADERS, FRAME_PING,
    FRAME_PRIORITY, FRAME_PUSH_PROMISE, FRAME_RST_STREAM, FRAME_SETTINGS, FRAME_WINDOW_UPDATE,
    is_call_frame,
};

/// Says whether `payload` opens like an HTTP/1 request line (a WebSocket upgrade, on a port that
/// should carry HTTP/2).
pub fn starts_like_http1_request(payload: &[u8]) -> bool {
    const METHODS: [&[u8]; 4] = [b"GET ", b"POST ", b"PUT ", b"HEAD "];
    METHODS.iter().any(|method| payload.starts_with(method))
}

/// Reads `bytes` as text, as `str::from_utf8` does, with ASCII (what user ids, header values and
/// addresses nearly always are) accepted by a plain ASCII check first: on a ten-digit user id
/// std's validation costs about a hundred instructions (callgrind), most of them its setup.
///
/// # Errors
///
/// Fails with a [`std::str::Utf8Error`] when `bytes` are not UTF-8.
pub fn utf8(bytes: &[u8]) -> Result<&str, std::str::Utf8Error> {
    if bytes.is_ascii() {
        // SAFETY: every sequence of ASCII bytes is UTF-8.
        Ok(unsafe { std::str::from_utf8_unchecked(bytes) })
    } else {
        std::str::from_utf8(bytes)
    }
}

/// Decodes `%XX` escapes and reads `+` as a space, as Go's `url.ParseQuery` reads query keys and
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
mod tests;
