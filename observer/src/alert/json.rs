//! Writes alert lines as compact JSON, byte for byte what `serde_json::to_writer` writes, with
//! strings checked for escapes sixteen bytes at a time (a short string as a word or two).
//!
//! Under a misrouting the alert lines were a sixth of the engine's instructions, three quarters
//! of that serde_json's escaping loop, which looks every byte up in a table: a route mismatch is
//! about 1.3 KB, nearly all of it text (member names, RFC 3339 times, the diagnosis) with
//! nothing to escape. serde_json offers no way to replace that loop, so this serializer writes
//! the structure itself and leaves numbers to `itoa` and serde_json (floats, for their `null`
//! when not finite). Measured on the worst-case engine bench (scale 0.3, callgrind): the lines
//! 407 M -> 283 M instructions, the whole round 2.32 G -> 2.17 G; in time, the per-event p99
//! 7% and p99.9 15% lower (median of 5 alternating pairs), events/s within this VM's noise.
//! It covers serde's whole data model as serde_json does, except map keys, which must be
//! strings (alerts have no other); the tests hold it to serde_json's output. Text from a
//! `Display` (`collect_str`, how a route mismatch's diagnosis is written) is escaped as it is
//! written, as serde_json does, without a string built first.

use serde::ser::{self, Serialize};

use crate::model::json_text;

/// Appends `value` as one compact JSON value to `line`.
///
/// # Errors
///
/// Fails with [`JsonError`] when `value` holds a map whose key does not serialize as a string.
pub fn append<T: Serialize + ?Sized>(line: &mut Vec<u8>, value: &T) -> Result<(), JsonError> {
    value.serialize(&mut JsonWriter { out: line })
}

/// Describes a value with no JSON form here: a map key that is not a string.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct JsonError(String);

impl ser::Error for JsonError {
    fn custom<T: std::fmt::Display>(message: T) -> Self {
        JsonError(message.to_string())
    }
}

/// Writes into the line being built: nothing here can fail but a key that is not a string.
struct JsonWriter<'a> {
    out: &'a mut Vec<u8>,
}

impl JsonWriter<'_> {
    fn integer(&mut self, value: impl itoa::Integer) -> Result<(), JsonError> {
        self.out
            .extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
        Ok(())
    }

    fn float(&mut self, value: impl Serialize) -> Result<(), JsonError> {
        serde_json::to_writer(&mut *self.out, &value).map_err(ser::Error::custom)
    }

    fn string(&mut self, text: &str) -> Result<(), JsonError> {
        write_escaped(self.out, text);
        Ok(())
    }

    fn raw(&mut self, text: &[u8]) -> Result<(), JsonError> {
        self.out.extend_from_slice(text);
        Ok(())
    }

    /// Writes `{"variant":` before the value of an externally tagged enum variant.
    fn open_variant(&mut self, variant: &str) -> Result<(), JsonError> {
        self.raw(b"{")?;
        self.string(variant)?;
        self.raw(b":")
    }

    fn compound(&mut self, open: u8, close: &'static [u8]) -> Result<Compound<'_>, JsonError> {
        self.out.push(open);
        Ok(Compound {
            out: &mut *self.out,
            first: true,
            close,
        })
    }
}

/// Holds an array or object being written: `close` ends it (`]`, `}`, and a variant's `}` after
/// it).
struct Compound<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
    close: &'static [u8],
}

impl Compound<'_> {
    fn separate(&mut self) {
        if !std::mem::replace(&mut self.first, false) {
            self.out.push(b',');
        }
    }

    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), JsonError> {
        self.separate();
        value.serialize(&mut JsonWriter {
            out: &mut *self.out,
        })
    }

    fn field<T: Serialize + ?Sized>(&mut self, name: &str, value: &T) -> Result<(), JsonError> {
        self.separate();
        write_escaped(self.out, name);
        self.out.push(b':');
        value.serialize(&mut JsonWriter {
            out: &mut *self.out,
        })
    }

    fn end(self) -> Result<(), JsonError> {
        self.out.extend_from_slice(self.close);
        Ok(())
    }
}

impl<'a> ser::Serializer for &'a mut JsonWriter<'_> {
    type Ok = ();
    type Error = JsonError;
    type SerializeSeq = Compound<'a>;
    type SerializeTuple = Compound<'a>;
    type SerializeTupleStruct = Compound<'a>;
    type SerializeTupleVariant = Compound<'a>;
    type SerializeMap = Compound<'a>;
    type SerializeStruct = Compound<'a>;
    type SerializeStructVariant = Compound<'a>;

    fn serialize_bool(self, value: bool) -> Result<(), JsonError> {
        self.raw(if value { b"true" } else { b"false" })
    }
    fn serialize_i8(self, value: i8) -> Result<(), JsonError> {
        self.integer(value)
    }
    fn serialize_i16(self, value: i16) -> Result<(), JsonError> {
        self.integer(value)
    }
    fn serialize_i32(self, value: i32) -> Result<(), JsonError> {
        self.integer(value)
    }
    fn serialize_i64(self, value: i64) -> Result<(), JsonError> {
        self.integer(value)
    }
    fn serialize_i128(self, value: i128) -> Result<(), JsonError> {
        self.integer(value)
    }
    fn serialize_u8(self, value: u8) -> Result<(), JsonError> {
        self.integer(value)
    }
    fn serialize_u16(self, value: u16) -> Result<(), JsonError> {
        self.integer(value)
    }
    fn serialize_u32(self, value: u32) -> Result<(), JsonError> {
        self.integer(value)
    }
    fn serialize_u64(self, value: u64) -> Result<(), JsonError> {
        self.integer(value)
    }
    fn serialize_u128(self, value: u128) -> Result<(), JsonError> {
        self.integer(value)
    }
    fn serialize_f32(self, value: f32) -> Result<(), JsonError> {
        self.float(value)
    }
    fn serialize_f64(self, value: f64) -> Result<(), JsonError> {
        self.float(value)
    }
    fn serialize_char(self, value: char) -> Result<(), JsonError> {
        self.string(value.encode_utf8(&mut [0; 4]))
    }
    fn serialize_str(self, value: &str) -> Result<(), JsonError> {
        self.string(value)
    }
    fn collect_str<T: std::fmt::Display + ?Sized>(self, value: &T) -> Result<(), JsonError> {
        write_display_escaped(self.out, value).map_err(ser::Error::custom)
    }
    /// Writes bytes as serde_json does: an array of numbers.
    fn serialize_bytes(self, value: &[u8]) -> Result<(), JsonError> {
        use ser::SerializeSeq;
        let mut array = self.serialize_seq(Some(value.len()))?;
        value
            .iter()
            .try_for_each(|byte| array.serialize_element(byte))?;
        array.end()
    }
    fn serialize_none(self) -> Result<(), JsonError> {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), JsonError> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), JsonError> {
        self.raw(b"null")
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), JsonError> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), JsonError> {
        self.string(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), JsonError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), JsonError> {
        self.open_variant(variant)?;
        value.serialize(&mut *self)?;
        self.raw(b"}")
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Compound<'a>, JsonError> {
        self.compound(b'[', b"]")
    }
    fn serialize_tuple(self, len: usize) -> Result<Compound<'a>, JsonError> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        len: usize,
    ) -> Result<Compound<'a>, JsonError> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'a>, JsonError> {
        self.open_variant(variant)?;
        self.compound(b'[', b"]}")
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Compound<'a>, JsonError> {
        self.compound(b'{', b"}")
    }
    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Compound<'a>, JsonError> {
        self.compound(b'{', b"}")
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'a>, JsonError> {
        self.open_variant(variant)?;
        self.compound(b'{', b"}}")
    }
}

/// Writes serde's four kinds of array alike, as they differ only in their names here: each element
/// goes to `element`.
macro_rules! array_traits {
    ($($array:ident::$add:ident),*) => {$(
        impl ser::$array for Compound<'_> {
            type Ok = ();
            type Error = JsonError;
            fn $add<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), JsonError> {
                self.element(value)
            }
            fn end(self) -> Result<(), JsonError> {
                Compound::end(self)
            }
        }
    )*};
}

array_traits!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

impl ser::SerializeMap for Compound<'_> {
    type Ok = ();
    type Error = JsonError;
    /// Writes a key as any value is written, then refuses it unless it came out a string (what
    /// `#[serde(flatten)]` and every alert map has) rather than a line that is not JSON.
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), JsonError> {
        self.separate();
        let start = self.out.len();
        key.serialize(&mut JsonWriter {
            out: &mut *self.out,
        })?;
        if self.out.get(start) != Some(&b'"') {
            return Err(JsonError("a map key that is not a string".to_owned()));
        }
        self.out.push(b':');
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), JsonError> {
        value.serialize(&mut JsonWriter {
            out: &mut *self.out,
        })
    }
    fn end(self) -> Result<(), JsonError> {
        Compound::end(self)
    }
}

/// Writes a struct's and a struct variant's fields alike: name, then value.
macro_rules! struct_traits {
    ($($object:ident),*) => {$(
        impl ser::$object for Compound<'_> {
            type Ok = ();
            type Error = JsonError;
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                name: &'static str,
                value: &T,
            ) -> Result<(), JsonError> {
                self.field(name, value)
            }
            fn end(self) -> Result<(), JsonError> {
                Compound::end(self)
            }
        }
    )*};
}

struct_traits!(SerializeStruct, SerializeStructVariant);

/// Returns eight copies of `byte`, one per byte of a word.
const fn repeated(byte: u8) -> u64 {
    0x0101_0101_0101_0101 * byte as u64
}

/// Says whether any of the eight bytes of `word` needs escaping in a JSON string: a control
/// character (below 0x20), `"` or `\`. The usual zero-byte test (a byte's high bit set by
/// subtracting one from it only where it was below one) is exact for "any byte", which is all
/// the scan needs: a string with a flagged word is then written byte by byte.
fn word_needs_escape(word: u64) -> bool {
    let high_bits = repeated(0x80);
    let below = |word: u64, limit: u8| word.wrapping_sub(repeated(limit)) & !word & high_bits;
    below(word, 0x20) | below(word ^ repeated(b'"'), 1) | below(word ^ repeated(b'\\'), 1) != 0
}

/// Says whether any byte of `bytes` needs escaping. From sixteen bytes on, a block at a time
/// (`json_text`): the whole blocks, then the last sixteen bytes (overlapping the last whole
/// block) for those after it. A shorter string (most keys, a few values) is one or two words:
/// its first and last eight bytes, or four (overlapping), or below four its first, middle and
/// last byte padded with spaces, which need no escape. Byte by byte, a key cost about forty
/// instructions, and a key is written some thirty times an alert.
fn needs_escape(bytes: &[u8]) -> bool {
    const PAD: u8 = b' ';
    if let Some(last) = bytes.last_chunk::<16>() {
        let (blocks, _) = bytes.as_chunks::<16>();
        return blocks
            .iter()
            .chain([last])
            .any(|block| json_text::special_bytes(block) != 0);
    }
    let words = match (bytes.first_chunk::<8>(), bytes.last_chunk::<8>()) {
        (Some(first), Some(last)) => [*first, *last],
        _ => match (bytes.first_chunk::<4>(), bytes.last_chunk::<4>()) {
            (Some(&[a, b, c, d]), Some(&[e, f, g, h])) => [[a, b, c, d, e, f, g, h]; 2],
            _ => match (bytes.first(), bytes.get(bytes.len() / 2), bytes.last()) {
                (Some(&first), Some(&middle), Some(&last)) => {
                    [[first, middle, last, PAD, PAD, PAD, PAD, PAD]; 2]
                }
                _ => return false,
            },
        },
    };
    words
        .iter()
        .any(|word| word_needs_escape(u64::from_le_bytes(*word)))
}

/// Writes `text` as a JSON string: quoted, escaped as serde_json escapes (the short forms where
/// JSON has them, `\u00XX` for the other control characters, everything else as it is).
pub(super) fn write_escaped(out: &mut Vec<u8>, text: &str) {
    out.reserve(text.len() + 2);
    out.push(b'"');
    push_escaped(out, text);
    out.push(b'"');
}

/// Appends `text` escaped, without quotes. Nearly every string has nothing to escape and is copied
/// whole; the byte-by-byte escaping is its own function, so that this check (made for every
/// string of a line) does not pay for the loop's registers on every call.
pub(super) fn push_escaped(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    if needs_escape(bytes) {
        push_escaped_byte_by_byte(out, bytes);
    } else {
        out.extend_from_slice(bytes);
    }
}

#[cold]
#[inline(never)]
fn push_escaped_byte_by_byte(out: &mut Vec<u8>, bytes: &[u8]) {
    for &byte in bytes {
        match byte {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\x08' => out.extend_from_slice(b"\\b"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\x0c' => out.extend_from_slice(b"\\f"),
            b'\r' => out.extend_from_slice(b"\\r"),
            0x00..=0x1f => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let (high, low) = (usize::from(byte >> 4), usize::from(byte & 0xf));
                out.extend_from_slice(&[b'\\', b'u', b'0', b'0', HEX[high], HEX[low]]);
            }
            _ => out.push(byte),
        }
    }
}

/// Writes what `value` displays as a JSON string, escaped piece by piece as it is written, as
/// serde_json's `collect_str` does: no string is built first. Fails only where the `Display` itself
/// reports an error.
fn write_display_escaped(
    out: &mut Vec<u8>,
    value: &(impl std::fmt::Display + ?Sized),
) -> std::fmt::Result {
    out.push(b'"');
    push_display_escaped(out, value)?;
    out.push(b'"');
    Ok(())
}

/// Appends what `value` displays as, escaped, without quotes.
pub(super) fn push_display_escaped(
    out: &mut Vec<u8>,
    value: &(impl std::fmt::Display + ?Sized),
) -> std::fmt::Result {
    use std::fmt::Write as _;
    write!(EscapedText(out), "{value}")
}

/// Sends text written by a `Display` into the line escaped, piece by piece.
struct EscapedText<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for EscapedText<'_> {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        push_escaped(self.0, text);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
