//! Walks protobuf's wire format over a message's bytes without decoding into a type: the
//! fields of a whole message one by one (`Fields`), or those of a captured prefix up to the
//! cut (`split_complete_fields`). Read as prost reads it, so that `protobuf`'s decoders agree
//! with prost on every input but groups (the `protobuf` fuzz target checks it).

/// Says why a message could not be read: the wire itself, or a field the decoders need.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtobufError {
    #[error("{0}")]
    Decode(#[from] prost::DecodeError),
    #[error("invalid protobuf wire format")]
    InvalidWire,
    #[error("field {0} has another wire type than its declaration")]
    WrongWireType(u32),
    #[error("a protobuf group (proto2 only; OpenIM's messages are proto3)")]
    Group,
    #[error("a user id is not UTF-8")]
    UserIdNotUtf8,
}

/// Holds a field's value on the wire.
#[derive(Clone, Copy)]
pub(super) enum Value<'a> {
    Varint(u64),
    /// A fixed64 or fixed32: no field read here has one, so it is only skipped.
    Fixed,
    Delimited(&'a [u8]),
}

impl<'a> Value<'a> {
    /// Returns the value of a varint.
    ///
    /// # Errors
    ///
    /// Fails with [`ProtobufError::WrongWireType`], naming `field`, for a value of another wire
    /// type.
    pub(super) fn varint(self, field: u32) -> Result<u64, ProtobufError> {
        match self {
            Self::Varint(value) => Ok(value),
            _ => Err(ProtobufError::WrongWireType(field)),
        }
    }

    /// Returns the bytes of a length-delimited value.
    ///
    /// # Errors
    ///
    /// Fails with [`ProtobufError::WrongWireType`], naming `field`, for a value of another wire
    /// type.
    pub(super) fn delimited(self, field: u32) -> Result<&'a [u8], ProtobufError> {
        match self {
            Self::Delimited(bytes) => Ok(bytes),
            _ => Err(ProtobufError::WrongWireType(field)),
        }
    }
}

/// Says what the start of some bytes holds.
enum FieldRead<'a> {
    Whole {
        number: u32,
        value: Value<'a>,
        /// The bytes the field took, its key included.
        len: usize,
    },
    /// The bytes end inside the field; the cut value when it is length-delimited and its
    /// key and length were read.
    Cut(Option<CutField<'a>>),
}

/// Holds a length-delimited field the cut fell into: its number and the bytes captured of its
/// value.
pub(super) struct CutField<'a> {
    pub(super) field_number: u32,
    pub(super) partial_value: &'a [u8],
}

/// Reads the field at the start of `bytes` (not empty). Inlined: most fields of these messages
/// take a one-byte key and a one-byte length or value, and a call costs as much as reading them.
#[inline(always)]
fn read_field(bytes: &[u8]) -> Result<FieldRead<'_>, ProtobufError> {
    let Some((key, key_len)) = read_varint(bytes)? else {
        return Ok(FieldRead::Cut(None));
    };
    // As prost: a key beyond 32 bits or a field number 0 is invalid.
    let number = u32::try_from(key)
        .ok()
        .map(|key| key >> 3)
        .filter(|&number| number != 0)
        .ok_or(ProtobufError::InvalidWire)?;
    let after_key = &bytes[key_len..];
    let whole = |value, value_len: usize| {
        Ok(FieldRead::Whole {
            number,
            value,
            len: key_len + value_len,
        })
    };
    match key & 7 {
        0 => match read_varint(after_key)? {
            Some((value, len)) => whole(Value::Varint(value), len),
            None => Ok(FieldRead::Cut(None)),
        },
        wire_type @ (1 | 5) => {
            let len = if wire_type == 1 { 8 } else { 4 };
            if after_key.len() < len {
                return Ok(FieldRead::Cut(None));
            }
            whole(Value::Fixed, len)
        }
        2 => {
            let Some((length, length_len)) = read_varint(after_key)? else {
                return Ok(FieldRead::Cut(None));
            };
            let value = &after_key[length_len..];
            match usize::try_from(length) {
                Ok(length) if length <= value.len() => {
                    whole(Value::Delimited(&value[..length]), length_len + length)
                }
                _ => Ok(FieldRead::Cut(Some(CutField {
                    field_number: number,
                    partial_value: value,
                }))),
            }
        }
        3 | 4 => Err(ProtobufError::Group),
        // 6 and 7 are not wire types.
        _ => Err(ProtobufError::InvalidWire),
    }
}

/// Iterates over the fields of a complete message, in order. A field that runs past the end is an
/// error, and the last item.
pub(super) struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    /// Walks the fields of `message`.
    pub(super) fn of(message: &'a [u8]) -> Self {
        Self { rest: message }
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Value<'a>), ProtobufError>;

    /// Reads the next field. Inlined into each decoder's loop, as `read_field` is: called, it cost
    /// the decoding of answers 13% more instructions.
    #[inline(always)]
    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        Some(match read_field(self.rest) {
            Ok(FieldRead::Whole { number, value, len }) => {
                self.rest = &self.rest[len..];
                Ok((number, value))
            }
            Ok(FieldRead::Cut(_)) => {
                self.rest = &[];
                Err(ProtobufError::InvalidWire)
            }
            Err(error) => {
                self.rest = &[];
                Err(error)
            }
        })
    }
}

/// Splits a captured prefix: the fields that end before the cut, and the field it fell into.
pub(super) struct SplitFields<'a> {
    /// The fields that end before the cut.
    pub(super) complete: &'a [u8],
    /// The length-delimited field the cut fell into, when its key and length were captured.
    pub(super) cut_length_delimited: Option<CutField<'a>>,
}

/// Walks `bytes` up to the first field that does not end in it.
///
/// # Errors
///
/// Fails with [`ProtobufError::InvalidWire`] on an overlong varint, a field number 0 or past 32
/// bits of key, or a wire type 6 or 7, and with [`ProtobufError::Group`] on a group.
pub(super) fn split_complete_fields(bytes: &[u8]) -> Result<SplitFields<'_>, ProtobufError> {
    let mut position = 0;
    while let Some(rest) = bytes.get(position..).filter(|rest| !rest.is_empty()) {
        match read_field(rest)? {
            FieldRead::Whole { len, .. } => position += len,
            FieldRead::Cut(cut_length_delimited) => {
                return Ok(SplitFields {
                    complete: &bytes[..position],
                    cut_length_delimited,
                });
            }
        }
    }
    Ok(SplitFields {
        complete: bytes,
        cut_length_delimited: None,
    })
}

/// Reads the varint at the start of `bytes`; `Ok(None)` when it runs past the end of `bytes`. As
/// prost reads them: at most ten bytes, the tenth adding at most the value's top bit.
#[inline(always)]
fn read_varint(bytes: &[u8]) -> Result<Option<(u64, usize)>, ProtobufError> {
    if let Some(&byte) = bytes.first().filter(|&&byte| byte < 0x80) {
        return Ok(Some((u64::from(byte), 1)));
    }
    let mut value = 0u64;
    for (index, &byte) in bytes.iter().enumerate().take(10) {
        if index == 9 && byte > 1 {
            return Err(ProtobufError::InvalidWire);
        }
        value |= u64::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            return Ok(Some((value, index + 1)));
        }
    }
    if bytes.len() >= 10 {
        Err(ProtobufError::InvalidWire)
    } else {
        Ok(None)
    }
}
