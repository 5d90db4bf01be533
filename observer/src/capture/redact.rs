//! Scrubs credentials from captured WebSocket upgrade requests at the capture boundary, so no
//! later stage (decoders, `--events`, recordings, logs) ever holds them.
//!
//! Values are overwritten in place with `*`, keeping every length and offset intact.

/// Query parameters that carry credentials in OpenIM's SDK and in common gateways.
const SECRET_QUERY_PARAMETERS: &[&[u8]] = &[b"token", b"access_token"];
/// Header lines whose value is a credential.
const SECRET_HEADERS: &[&[u8]] = &[b"authorization", b"proxy-authorization", b"cookie"];

pub fn redact_secrets(payload: &mut [u8]) {
    redact_query_parameters(payload);
    redact_header_values(payload);
}

/// `token=VALUE` after `?` or `&` on the request line; the value ends at `&`, space, `#`, CR or
/// LF, or at the end of what was captured (a value cut off by the capture is still scrubbed).
fn redact_query_parameters(payload: &mut [u8]) {
    let line_end = payload
        .iter()
        .position(|&byte| byte == b'\n')
        .unwrap_or(payload.len());
    let mut position = 0;
    while position < line_end {
        let byte = payload[position];
        position += 1;
        if byte != b'?' && byte != b'&' {
            continue;
        }
        let name_end = payload[position..line_end]
            .iter()
            .position(|&byte| matches!(byte, b'=' | b'&' | b' ' | b'#' | b'\r'))
            .map_or(line_end, |offset| position + offset);
        let name = &payload[position..name_end];
        let is_secret = SECRET_QUERY_PARAMETERS
            .iter()
            .any(|secret| name.eq_ignore_ascii_case(secret));
        if is_secret && payload.get(name_end) == Some(&b'=') {
            let value_start = name_end + 1;
            let value_end = payload[value_start..line_end]
                .iter()
                .position(|&byte| matches!(byte, b'&' | b' ' | b'#' | b'\r'))
                .map_or(line_end, |offset| value_start + offset);
            payload[value_start..value_end].fill(b'*');
            position = value_end;
        } else {
            position = name_end;
        }
    }
}

/// `Authorization: VALUE` and friends, at the start of any header line.
fn redact_header_values(payload: &mut [u8]) {
    let mut line_start = 0;
    while line_start < payload.len() {
        let line_end = payload[line_start..]
            .iter()
            .position(|&byte| byte == b'\n')
            .map_or(payload.len(), |offset| line_start + offset);
        let line = &payload[line_start..line_end];
        if let Some(colon) = line.iter().position(|&byte| byte == b':') {
            let name = line[..colon].trim_ascii();
            if SECRET_HEADERS
                .iter()
                .any(|secret| name.eq_ignore_ascii_case(secret))
            {
                let value_end = if payload[..line_end].ends_with(b"\r") {
                    line_end - 1
                } else {
                    line_end
                };
                let value_start = (line_start + colon + 1).min(value_end);
                payload[value_start..value_end].fill(b'*');
            }
        }
        line_start = line_end + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redacted(text: &str) -> String {
        let mut bytes = text.as_bytes().to_vec();
        redact_secrets(&mut bytes);
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn scrubs_the_sdk_token_and_keeps_the_rest() {
        let request =
            "GET /?sendID=42&token=eyJhbGciOi.x.y&platformID=2 HTTP/1.1\r\nHost: gw\r\n\r\n";
        assert_eq!(
            redacted(request),
            "GET /?sendID=42&token=**************&platformID=2 HTTP/1.1\r\nHost: gw\r\n\r\n"
        );
    }

    #[test]
    fn scrubs_a_token_cut_off_by_the_capture() {
        assert_eq!(redacted("GET /?token=abcdef"), "GET /?token=******");
        assert_eq!(
            redacted("GET /?sendID=1&TOKEN=ab"),
            "GET /?sendID=1&TOKEN=**"
        );
    }

    #[test]
    fn scrubs_every_token_and_credential_headers() {
        let request = "GET /?token=a&x=1&token=bb HTTP/1.1\r\nauthorization: Bearer s3cr3t\r\nCookie: sid=1\r\nX-Token: ok\r\nProxy-Authorization: Basic zz";
        assert_eq!(
            redacted(request),
            "GET /?token=*&x=1&token=** HTTP/1.1\r\nauthorization:**************\r\nCookie:******\r\nX-Token: ok\r\nProxy-Authorization:*********"
        );
    }

    #[test]
    fn leaves_lookalikes_alone() {
        let request = "GET /?mytoken=1&tokens=2 HTTP/1.1\r\nHost: token=3\r\n";
        assert_eq!(redacted(request), request);
    }

    #[test]
    fn never_panics_on_junk() {
        const ALPHABET: &[u8] = b"?&=token:\r\n aAuthorizationCookie";
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for length in 0..300 {
            let mut bytes: Vec<u8> = (0..length)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    ALPHABET[(state % ALPHABET.len() as u64) as usize]
                })
                .collect();
            redact_secrets(&mut bytes);
        }
    }
}
