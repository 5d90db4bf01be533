//! Reads a recording's line without serde_json when it is plain, as `to_json_line` writes it: one
//! object, no whitespace, each known key once, strings without escapes or control characters,
//! numbers as unsigned integers. Anything else (or anything this reader is unsure of) is left
//! to serde_json, which then reads the line or says why not: so this reader only ever answers
//! what serde_json would, which the `recording_line` fuzz target checks.
//!
//! Replaying a worst-case recording, serde_json spent about 8,850 instructions a line, a fifth
//! of them finding where each of its two dozen short strings ends and most of the rest matching
//! keys and dispatching values through serde's visitors: nearly half of a replay's time.

use std::{borrow::Cow, net::IpAddr};

use serde::{
    Deserialize,
    de::value::{BorrowedStrDeserializer, Error as ValueError},
};

use super::{Base64Text, EventLine, LineKind};
use crate::model::{Direction, PortClass, TcpState, json_text};

/// Reads the line's fields as serde_json would fill `EventLine`, or `None` to leave the line to it.
pub(super) fn read(text: &str) -> Option<EventLine<'_>> {
    let mut cursor = Cursor { text, position: 0 };
    cursor.byte(b'{')?;
    let mut line = Fields::default();
    loop {
        let key = cursor.string()?;
        cursor.byte(b':')?;
        // A known key twice is refused by serde: `first` leaves that line to it.
        match key {
            "kind" => first(&mut line.kind, cursor.variant()?)?,
            // Skipped unread by serde too, however often it comes (a replay takes `ts_ns`).
            "ts" => {
                cursor.string()?;
            }
            "ts_ns" => first(&mut line.ts_ns, cursor.unsigned()?)?,
            "connection" => first(&mut line.connection, cursor.string()?)?,
            "pid" => first(&mut line.pid, cursor.unsigned()?.try_into().ok()?)?,
            "comm" => first(&mut line.comm, cursor.string()?)?,
            "cgroup_id" => first(&mut line.cgroup_id, cursor.unsigned()?)?,
            "saddr" => first(&mut line.saddr, cursor.string()?.parse().ok()?)?,
            "sport" => first(&mut line.sport, cursor.unsigned()?.try_into().ok()?)?,
            "daddr" => first(&mut line.daddr, cursor.string()?.parse().ok()?)?,
            "dport" => first(&mut line.dport, cursor.unsigned()?.try_into().ok()?)?,
            "port_class" => first(&mut line.port_class, cursor.variant()?)?,
            "old_state" => first(&mut line.old_state, cursor.variant()?)?,
            "new_state" => first(&mut line.new_state, cursor.variant()?)?,
            "direction" => first(&mut line.direction, cursor.variant()?)?,
            "offset" => first(&mut line.offset, cursor.unsigned()?)?,
            "len" => first(&mut line.len, cursor.unsigned()?.try_into().ok()?)?,
            "call_len" => first(&mut line.call_len, cursor.unsigned()?)?,
            "truncated" => first(&mut line.truncated, cursor.boolean()?)?,
            "payload_b64" => first(&mut line.payload_b64, cursor.base64()?)?,
            // serde_json skips an unknown key's value, whatever it holds.
            _ => return None,
        }
        match cursor.next()? {
            b',' => continue,
            b'}' if cursor.rest().is_empty() => break,
            _ => return None,
        }
    }
    Some(EventLine {
        kind: line.kind?,
        ts: Cow::Borrowed(""),
        ts_ns: line.ts_ns?,
        connection: Cow::Borrowed(line.connection?),
        pid: line.pid?,
        comm: Cow::Borrowed(line.comm?),
        cgroup_id: line.cgroup_id?,
        saddr: line.saddr?,
        sport: line.sport?,
        daddr: line.daddr?,
        dport: line.dport?,
        port_class: line.port_class?,
        old_state: line.old_state,
        new_state: line.new_state,
        direction: line.direction,
        offset: line.offset,
        len: line.len,
        call_len: line.call_len,
        truncated: line.truncated,
        payload_b64: line.payload_b64.map(|text| Base64Text(Cow::Borrowed(text))),
    })
}

/// Fills a field met for the first time; `None` for a second time.
fn first<T>(field: &mut Option<T>, value: T) -> Option<()> {
    field.is_none().then(|| *field = Some(value))
}

/// Holds every field of a line, until found.
#[derive(Default)]
struct Fields<'a> {
    kind: Option<LineKind>,
    ts_ns: Option<u64>,
    connection: Option<&'a str>,
    pid: Option<u32>,
    comm: Option<&'a str>,
    cgroup_id: Option<u64>,
    saddr: Option<IpAddr>,
    sport: Option<u16>,
    daddr: Option<IpAddr>,
    dport: Option<u16>,
    port_class: Option<PortClass>,
    old_state: Option<TcpState>,
    new_state: Option<TcpState>,
    direction: Option<Direction>,
    offset: Option<u64>,
    len: Option<usize>,
    call_len: Option<u64>,
    truncated: Option<bool>,
    payload_b64: Option<&'a [u8]>,
}

struct Cursor<'a> {
    text: &'a str,
    position: usize,
}

impl<'a> Cursor<'a> {
    fn rest(&self) -> &'a [u8] {
        self.text
            .as_bytes()
            .get(self.position..)
            .unwrap_or_default()
    }

    fn next(&mut self) -> Option<u8> {
        let byte = *self.rest().first()?;
        self.position += 1;
        Some(byte)
    }

    fn byte(&mut self, expected: u8) -> Option<()> {
        (self.next()? == expected).then_some(())
    }

    /// Reads a string as serde_json borrows it: no escape, and no control character, which
    /// serde_json refuses in text.
    fn string(&mut self) -> Option<&'a str> {
        self.byte(b'"')?;
        let length = json_text::first_special(self.rest())?;
        self.quoted(length)
    }

    /// Reads base64 text as bytes, as `Base64Text` asks serde_json to: only an escape is left to
    /// serde_json (a control character in it is then refused by the base64 decoder either way).
    fn base64(&mut self) -> Option<&'a [u8]> {
        self.byte(b'"')?;
        let length = memchr::memchr2(b'"', b'\\', self.rest())?;
        self.quoted(length).map(str::as_bytes)
    }

    /// Reads the `length` bytes before the closing quote, which must follow them.
    fn quoted(&mut self, length: usize) -> Option<&'a str> {
        let start = self.position;
        self.position += length;
        self.byte(b'"')?;
        self.text.get(start..start + length)
    }

    /// Reads a unit variant by its name, through the enum's own `Deserialize`.
    fn variant<T: Deserialize<'a>>(&mut self) -> Option<T> {
        T::deserialize(BorrowedStrDeserializer::<ValueError>::new(self.string()?)).ok()
    }

    /// Reads digits as JSON writes an unsigned integer: no sign, no fraction or exponent, no
    /// leading zero, nothing past `u64`.
    fn unsigned(&mut self) -> Option<u64> {
        let digits = self
            .rest()
            .iter()
            .position(|byte| !byte.is_ascii_digit())
            .unwrap_or(self.rest().len());
        let text = self.rest().get(..digits)?;
        if digits == 0 || (text[0] == b'0' && digits > 1) {
            return None;
        }
        let value = text.iter().try_fold(0u64, |value, &digit| {
            value.checked_mul(10)?.checked_add(u64::from(digit - b'0'))
        })?;
        self.position += digits;
        // What follows (a fraction, an exponent) can only be something other than `,` or `}`,
        // which the line's loop leaves to serde_json.
        Some(value)
    }

    fn boolean(&mut self) -> Option<bool> {
        for (word, value) in [(&b"true"[..], true), (b"false", false)] {
            if self.rest().starts_with(word) {
                self.position += word.len();
                return Some(value);
            }
        }
        None
    }
}
