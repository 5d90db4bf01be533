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
