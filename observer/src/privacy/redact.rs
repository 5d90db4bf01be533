//! Credentials in HTTP/1 bytes: the WebSocket upgrade's `token` query value and the
//! `Authorization` / `Cookie` headers, overwritten in place wherever captured bytes may go.

/// Header names whose values are credentials, compared case-insensitively.
const SECRET_HEADERS: [&[u8]; 4] = [
    b"authorization",
    b"proxy-authorization",
    b"cookie",
    b"set-cookie",
];

/// Overwrites credentials in `payload` with `*`, in place, keeping its length: every `token=`
/// query value (up to `&`, space, CR, LF, `#` or the end) and the values of `Authorization`,
/// `Proxy-Authorization`, `Cookie` and `Set-Cookie` header lines (up to CR, LF or the end).
///
/// Matches are deliberately loose (`xtoken=` is redacted too, names in any case): redacting a
/// harmless value costs nothing, leaking a credential is what must never happen.
pub fn redact_secrets(payload: &mut [u8]) {
    redact_token_values(payload);
    redact_secret_headers(payload);
}

/// Every `=` is a candidate (memchr finds them many bytes at a time) and only those after
/// `token` are values to redact: the same matches as a case-insensitive search for `token=`,
/// which compared six bytes at every position (a tenth of the engine's instructions under a
/// wave of WebSocket upgrades).
fn redact_token_values(payload: &mut [u8]) {
    const NAME: &[u8] = b"token";
    let mut search_from = 0usize;
    while let Some(found) = memchr::memchr(b'=', payload.get(search_from..).unwrap_or_default()) {
        let equals = search_from + found;
        let value_start = equals + 1;
        search_from = value_start;
        let names_token = equals
            .checked_sub(NAME.len())
            .and_then(|name_start| payload.get(name_start..equals))
            .is_some_and(|name| name.eq_ignore_ascii_case(NAME));
        if !names_token {
            continue;
        }
        let rest = payload.get_mut(value_start..).unwrap_or_default();
        let value_len = rest
            .iter()
            .position(|&byte| matches!(byte, b'&' | b' ' | b'\r' | b'\n' | b'#'))
            .unwrap_or(rest.len());
        rest.iter_mut()
            .take(value_len)
            .for_each(|byte| *byte = b'*');
        search_from = value_start + value_len;
    }
}

fn redact_secret_headers(payload: &mut [u8]) {
    let mut line_start = 0usize;
    while line_start < payload.len() {
        let line = payload.get_mut(line_start..).unwrap_or_default();
        let line_len = memchr::memchr(b'\n', line).unwrap_or(line.len());
        let line = line.get_mut(..line_len).unwrap_or_default();
        if let Some(colon) = memchr::memchr(b':', line) {
            let name = line.get(..colon).unwrap_or_default().trim_ascii();
            if SECRET_HEADERS
                .iter()
                .any(|secret| name.eq_ignore_ascii_case(secret))
            {
                line.iter_mut()
                    .skip(colon + 1)
                    .take_while(|byte| **byte != b'\r')
                    .for_each(|byte| *byte = b'*');
            }
        }
        line_start += line_len + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redacted(input: &str) -> String {
        let mut bytes = input.as_bytes().to_vec();
        redact_secrets(&mut bytes);
        assert_eq!(bytes.len(), input.len());
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn redacts_token_values() {
        assert_eq!(
            redacted("GET /?sendID=1&token=abc&x=1 HTTP/1.1"),
            "GET /?sendID=1&token=***&x=1 HTTP/1.1"
        );
        assert_eq!(
            redacted("GET /?token=abc HTTP/1.1"),
            "GET /?token=*** HTTP/1.1"
        );
        // Cut mid-value at the end of the buffer.
        assert_eq!(
            redacted("GET /?sendID=1&token=eyJhbGci"),
            "GET /?sendID=1&token=********"
        );
        assert_eq!(redacted("GET /?token="), "GET /?token=");
        assert_eq!(
            redacted("?token=a&TOKEN=bb&Token=ccc#x"),
            "?token=*&TOKEN=**&Token=***#x"
        );
        assert_eq!(redacted("token=x\r\nHost: h"), "token=*\r\nHost: h");
        // A key cut before its `=` holds no value yet.
        assert_eq!(redacted("GET /?sendID=1&tok"), "GET /?sendID=1&tok");
    }

    /// The `=` scan finds exactly what a case-insensitive search for `token=` at every
    /// position finds, on inputs built from the pieces that matter.
    #[test]
    fn token_values_are_found_as_by_a_search_for_token_equals() {
        fn by_search(payload: &mut [u8]) {
            let mut start = 0;
            while let Some(found) = payload
                .get(start..)
                .unwrap_or_default()
                .windows(6)
                .position(|window| window.eq_ignore_ascii_case(b"token="))
            {
                let value_start = start + found + 6;
                let rest = &mut payload[value_start..];
                let len = rest
                    .iter()
                    .position(|&byte| matches!(byte, b'&' | b' ' | b'\r' | b'\n' | b'#'))
                    .unwrap_or(rest.len());
                rest[..len].fill(b'*');
                start = value_start + len;
            }
        }
        let pieces: [&[u8]; 9] = [
            b"token",
            b"=",
            b"TOKEN=",
            b"xtoken=a",
            b"&",
            b"tok",
            b"en=v",
            b"==",
            b"\r\n",
        ];
        for seed in 0u32..20_000 {
            let mut state = seed;
            let mut input = Vec::new();
            for _ in 0..6 {
                state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                input.extend_from_slice(pieces[(state >> 16) as usize % pieces.len()]);
            }
            let mut expected = input.clone();
            by_search(&mut expected);
            let mut actual = input.clone();
            redact_token_values(&mut actual);
            assert_eq!(
                actual,
                expected,
                "input {:?}",
                String::from_utf8_lossy(&input)
            );
        }
    }

    #[test]
    fn redacts_secret_headers() {
        let input = "GET / HTTP/1.1\r\nHost: gw\r\nauthorization: Bearer x\r\nCOOKIE: a=b; c=d\r\n\
                     Proxy-Authorization: Basic y\r\nX-Cookie-Note: keep\r\n\r\n";
        let expected = "GET / HTTP/1.1\r\nHost: gw\r\nauthorization:*********\r\nCOOKIE:*********\r\n\
                        Proxy-Authorization:********\r\nX-Cookie-Note: keep\r\n\r\n";
        assert_eq!(redacted(input), expected);
        // Cut inside the value, at the end of the buffer.
        assert_eq!(
            redacted("Host: gw\r\nAuthorization: Bear"),
            "Host: gw\r\nAuthorization:*****"
        );
        assert_eq!(redacted("Cookie:"), "Cookie:");
        assert_eq!(redacted("Set-Cookie: s=1\n"), "Set-Cookie:****\n");
    }

    #[test]
    fn redaction_never_panics_on_any_length() {
        let sample = b"GET /?token=abc&token=def HTTP/1.1\r\nCookie: zz\r\nAuthorization: q";
        for end in 0..=sample.len() {
            let mut bytes = sample[..end].to_vec();
            redact_secrets(&mut bytes);
            let text = String::from_utf8(bytes).unwrap();
            assert!(!text.contains("abc") && !text.contains("def") && !text.contains("zz"));
        }
    }
}
