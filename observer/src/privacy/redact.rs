//! Overwrites credentials in HTTP/1 bytes: the WebSocket upgrade's `token` query value and the
//! `Authorization` / `Cookie` headers, overwritten in place wherever captured bytes may go.

/// Names the headers whose values are credentials, compared case-insensitively.
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

/// Redacts `token` values. Every `=` is a candidate (memchr finds them many bytes at a time) and
/// only those after `token` are values to redact: the same matches as a case-insensitive search for
/// `token=`, which compared six bytes at every position (a tenth of the engine's instructions under
/// a wave of WebSocket upgrades).
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
mod tests;
