//! Follows the protobuf side of the output whitelist: a stream's DATA bytes read as gRPC messages,
//! and each message's fields kept only where the engine reads them (`Schema`), whatever the
//! chunking. A masked field keeps its framing: a length-delimited value is zeroed, a varint becomes
//! an over-long zero of the same length, a fixed one is zeroed. What cannot be walked (a compressed
//! message, protobuf that does not parse) is zeroed to the message's end.

const GRPC_MESSAGE_HEADER_LEN: usize = 5;

/// Records where a stream's DATA bytes are in its gRPC messages.
#[derive(Clone, Debug)]
pub(super) enum MessagePosition {
    Header {
        bytes: [u8; GRPC_MESSAGE_HEADER_LEN],
        filled: usize,
    },
    Body(BodyScan),
    /// A body that can't be read (compressed, or its protobuf broke): zeroed to its end.
    ZeroedBody {
        left: u64,
    },
}

impl Default for MessagePosition {
    fn default() -> Self {
        Self::Header {
            bytes: [0; GRPC_MESSAGE_HEADER_LEN],
            filled: 0,
        }
    }
}

impl MessagePosition {
    pub(super) fn filter(&mut self, schema: Schema, mut data: &mut [u8]) {
        while !data.is_empty() {
            let used = match self {
                Self::Header { bytes, filled } => {
                    let used = (GRPC_MESSAGE_HEADER_LEN - *filled).min(data.len());
                    bytes[*filled..*filled + used].copy_from_slice(&data[..used]);
                    *filled += used;
                    if *filled == GRPC_MESSAGE_HEADER_LEN {
                        let [flag, l0, l1, l2, l3] = *bytes;
                        let length = u64::from(u32::from_be_bytes([l0, l1, l2, l3]));
                        *self = if length == 0 {
                            Self::default()
                        } else if flag == 0 {
                            Self::Body(BodyScan::new(length, schema))
                        } else {
                            // Compressed bytes can't be walked field by field.
                            Self::ZeroedBody { left: length }
                        };
                    }
                    used
                }
                Self::ZeroedBody { left } => {
                    let used = usize::try_from(*left).unwrap_or(usize::MAX).min(data.len());
                    data[..used].fill(0);
                    *left -= used as u64;
                    if *left == 0 {
                        *self = Self::default();
                    }
                    used
                }
                Self::Body(scan) => {
                    let used = scan.filter(data);
                    if scan.broken {
                        let left = scan.body_left;
                        *self = if left == 0 {
                            Self::default()
                        } else {
                            Self::ZeroedBody { left }
                        };
                    } else if scan.body_left == 0 {
                        *self = Self::default();
                    }
                    used
                }
            };
            data = &mut data[used..];
        }
    }
}

/// Names the protobuf messages the engine reads, and which of their fields it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Schema {
    /// `OnlineBatchPushOneMsgReq` / `OnlinePushMsgReq`: 1 `msgData`, 2 the recipients.
    PushRequest,
    /// `MsgData`: 4 clientMsgID, 5 serverMsgID, 9 sessionType, 14 seq (what an alert names a
    /// message by). Not 12 (content), 19 (offlinePushInfo, the notification preview), 1
    /// (sendID), 3 (groupID), 7 (senderNickname), 21 (attachedInfo), 22 (ex) or any other.
    MsgData,
    /// `OnlineBatchPushOneMsgResp` / `OnlinePushMsgResp`: 1 the per-user results.
    PushAnswer,
    /// `SingleMsgToUserResults` (1 userID, 2 each platform's result, 3 onlinePush) or, in
    /// the single-recipient answer, `SingleMsgToUserPlatform` (1 resultCode, 2 recvID, 3
    /// recvPlatformID): result codes and ids either way.
    UserResult,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rule {
    Keep,
    /// A nested message whose own fields are judged.
    Walk(Schema),
    Mask,
}

impl Schema {
    fn rule(self, field_number: u64) -> Rule {
        match (self, field_number) {
            (Schema::PushRequest, 1) => Rule::Walk(Schema::MsgData),
            (Schema::PushRequest, 2) => Rule::Keep,
            (Schema::MsgData, 4 | 5 | 9 | 14) => Rule::Keep,
            (Schema::PushAnswer, 1) => Rule::Walk(Schema::UserResult),
            (Schema::UserResult, 1..=3) => Rule::Keep,
            _ => Rule::Mask,
        }
    }
}

/// Holds the protobuf walk of one message body: its fields, and those of the one level of nested
/// message its schema walks, each kept or masked by its rule.
#[derive(Clone, Debug)]
pub(super) struct BodyScan {
    body_left: u64,
    schema: Schema,
    /// The nested message being walked, and its bytes still to come.
    inner: Option<(Schema, u64)>,
    field: FieldPosition,
    /// The protobuf does not parse: the caller zeroes the rest of the body.
    broken: bool,
}

#[derive(Clone, Copy, Debug)]
enum FieldPosition {
    Key {
        value: u64,
        shift: u32,
    },
    Length {
        field_number: u64,
        value: u64,
        shift: u32,
    },
    VarintValue {
        shift: u32,
        masked: bool,
    },
    Skip {
        left: u64,
    },
    Zero {
        left: u64,
    },
}

const KEY_START: FieldPosition = FieldPosition::Key { value: 0, shift: 0 };

impl BodyScan {
    fn new(length: u64, schema: Schema) -> Self {
        Self {
            body_left: length,
            schema,
            inner: None,
            field: KEY_START,
            broken: false,
        }
    }

    /// Returns the schema of the message the next field belongs to.
    fn current_schema(&self) -> Schema {
        self.inner.map_or(self.schema, |(schema, _)| schema)
    }

    /// Walks `data` up to the body's end or a parse failure; returns the bytes used.
    fn filter(&mut self, data: &mut [u8]) -> usize {
        let limit = usize::try_from(self.body_left)
            .unwrap_or(usize::MAX)
            .min(data.len());
        let mut index = 0usize;
        while index < limit && !self.broken {
            let used = match self.field {
                FieldPosition::Skip { left } | FieldPosition::Zero { left } => {
                    let used = usize::try_from(left)
                        .unwrap_or(usize::MAX)
                        .min(limit - index);
                    if let FieldPosition::Zero { .. } = self.field {
                        data[index..index + used].fill(0);
                    }
                    let left = left - used as u64;
                    self.field = if left == 0 {
                        KEY_START
                    } else if let FieldPosition::Zero { .. } = self.field {
                        FieldPosition::Zero { left }
                    } else {
                        FieldPosition::Skip { left }
                    };
                    used
                }
                _ => {
                    data[index] = self.read_byte(data[index]);
                    1
                }
            };
            index += used;
            self.consumed(used as u64);
        }
        index
    }

    fn consumed(&mut self, used: u64) {
        self.body_left -= used;
        if let Some((schema, left)) = self.inner {
            // A field may not straddle the nested message's end.
            match left.checked_sub(used) {
                Some(0) => {
                    self.inner = None;
                    if !matches!(self.field, FieldPosition::Key { value: 0, shift: 0 }) {
                        self.broken = true;
                    }
                }
                Some(left) => self.inner = Some((schema, left)),
                None => self.broken = true,
            }
        }
        if self.body_left == 0 && !matches!(self.field, FieldPosition::Key { value: 0, shift: 0 }) {
            self.broken = true;
        }
    }

    /// Reads one byte of a key, a length or a varint value; returns what to write in its place.
    fn read_byte(&mut self, byte: u8) -> u8 {
        let more = byte & 0x80 != 0;
        let bits = u64::from(byte & 0x7f);
        match self.field {
            FieldPosition::Key { value, shift } => {
                let Some(value) = accumulate(value, shift, bits) else {
                    self.broken = true;
                    return byte;
                };
                if more {
                    self.field = FieldPosition::Key {
                        value,
                        shift: shift + 7,
                    };
                    return byte;
                }
                let field_number = value >> 3;
                if field_number == 0 {
                    self.broken = true;
                    return byte;
                }
                let masked = self.current_schema().rule(field_number) == Rule::Mask;
                self.field = match value & 7 {
                    0 => FieldPosition::VarintValue { shift: 0, masked },
                    1 if masked => FieldPosition::Zero { left: 8 },
                    1 => FieldPosition::Skip { left: 8 },
                    5 if masked => FieldPosition::Zero { left: 4 },
                    5 => FieldPosition::Skip { left: 4 },
                    2 => FieldPosition::Length {
                        field_number,
                        value: 0,
                        shift: 0,
                    },
                    // Groups (3, 4) are not used by these messages; 6 and 7 are not wire types.
                    _ => {
                        self.broken = true;
                        return byte;
                    }
                };
                byte
            }
            FieldPosition::VarintValue { shift, masked } => {
                if shift >= 63 && more {
                    self.broken = true;
                } else if more {
                    self.field = FieldPosition::VarintValue {
                        shift: shift + 7,
                        masked,
                    };
                } else {
                    self.field = KEY_START;
                }
                match (masked, more) {
                    // An over-long zero, as long as the value was: the framing stays.
                    (true, true) => 0x80,
                    (true, false) => 0,
                    (false, _) => byte,
                }
            }
            FieldPosition::Length {
                field_number,
                value,
                shift,
            } => {
                let Some(value) = accumulate(value, shift, bits) else {
                    self.broken = true;
                    return byte;
                };
                if more {
                    self.field = FieldPosition::Length {
                        field_number,
                        value,
                        shift: shift + 7,
                    };
                    return byte;
                }
                self.start_length_delimited(field_number, value);
                byte
            }
            FieldPosition::Skip { .. } | FieldPosition::Zero { .. } => byte,
        }
    }

    /// Starts the value of a length-delimited field after the current byte.
    fn start_length_delimited(&mut self, field_number: u64, length: u64) {
        // `consumed` has not yet counted the length's last byte.
        let room = match self.inner {
            Some((_, left)) => left.saturating_sub(1),
            None => self.body_left.saturating_sub(1),
        };
        if length > room {
            self.broken = true;
            return;
        }
        self.field = if length == 0 {
            KEY_START
        } else {
            match (self.inner, self.current_schema().rule(field_number)) {
                // Its fields are walked; it ends `length` bytes after this byte.
                (None, Rule::Walk(schema)) => {
                    self.inner = Some((schema, length + 1));
                    KEY_START
                }
                (_, Rule::Keep) => FieldPosition::Skip { left: length },
                // Masked, or a message nested deeper than the schemas walk.
                _ => FieldPosition::Zero { left: length },
            }
        };
    }
}

/// Adds 7 more bits to a varint; `None` past 64 bits.
fn accumulate(value: u64, shift: u32, bits: u64) -> Option<u64> {
    if shift > 63 || (shift == 63 && bits > 1) {
        return None;
    }
    Some(value | bits << shift)
}
