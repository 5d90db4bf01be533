//! Scrubs private message bodies out of captured gRPC bytes before they are printed or
//! recorded (`observer run --events` / `--record`), so that no output and no replay ever holds
//! `MsgData.content`.
//!
//! `ContentScrubber` follows one push → gateway connection's send side as its chunks arrive, in
//! order: HTTP/2 frames, the gRPC messages in each stream's DATA, and the protobuf fields of
//! each message down to `msgData` (field 1 of both `OnlineBatchPushOneMsgReq` and
//! `OnlinePushMsgReq`) and its `content` (`MsgData` field 12). The content bytes are overwritten
//! with zeros in place; lengths, framing and every other field stay as they were, so the
//! decoders read a scrubbed stream into the same push calls.
//!
//! It never needs HPACK (DATA frames carry no header state), so it does not know a stream's
//! method: every send-side gRPC message is read as if it were a push request. What the scrubber
//! can't follow is zeroed rather than passed: a compressed message's body, the rest of a message
//! whose protobuf does not parse, a DATA frame with impossible padding, and after a gap or a
//! start past position 0 (frame sync lost), every later byte of the direction.
//!
//! The receive side (the gateway's answers: user ids and result codes, no message bodies) is
//! passed through. A connection whose first bytes are an HTTP/1 request instead of the HTTP/2
//! preface (a WebSocket upgrade sent to the gRPC port) gets `redact_secrets` on both sides, as
//! the capture layer does for WebSocket ports. A connection that starts with neither is not
//! gRPC (no push message can be in it) and is passed as captured.
//!
//! Memory per connection is bounded: a few counters per stream, at most `MAX_STREAMS` streams.

use crate::model::{
    Direction,
    wire::{
        CLIENT_PREFACE, FLAG_END_STREAM, FLAG_PADDED, FRAME_DATA, FRAME_HEADER_LEN,
        starts_like_http1_request,
    },
};

use super::redact_secrets;

const GRPC_MESSAGE_HEADER_LEN: usize = 5;
/// Streams followed at once; DATA of streams beyond it is zeroed. Push opens one per call.
const MAX_STREAMS: usize = 64;
/// `OnlineBatchPushOneMsgReq.msgData` and `OnlinePushMsgReq.msgData`.
const MSG_DATA_FIELD: u64 = 1;
/// `MsgData.content`: the message body.
const CONTENT_FIELD: u64 = 12;

/// Per-connection scrubber state: keep one per connection id, feed every `Data` event's payload
/// in capture order through `scrub`, and drop it when the connection closes.
#[derive(Clone, Debug, Default)]
pub struct ContentScrubber {
    protocol: Protocol,
    send: SendSide,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Protocol {
    /// Nothing seen on the send side yet.
    #[default]
    Undetermined,
    Http2,
    /// The send side began with an HTTP/1 request line.
    Http1,
    /// The send side was first seen past position 0: if it is HTTP/2, frame sync is unknown,
    /// so nothing can be followed and all of it is zeroed.
    Opaque,
    /// The send side began at position 0 with neither the HTTP/2 preface nor an HTTP/1
    /// request: not gRPC, so it holds no push message, and it is passed as captured.
    NotGrpc,
}

impl ContentScrubber {
    pub fn new() -> Self {
        Self::default()
    }

    /// Scrubs one captured chunk in place. `offset` is the chunk's stream position in
    /// `direction`, as in `EventKind::Data`.
    pub fn scrub(&mut self, direction: Direction, offset: u64, payload: &mut [u8]) {
        if self.protocol == Protocol::Undetermined && direction == Direction::Send {
            self.protocol = if offset != 0 {
                Protocol::Opaque
            } else if starts_like_http1_request(payload) {
                Protocol::Http1
            } else if CLIENT_PREFACE
                .starts_with(&payload[..payload.len().min(CLIENT_PREFACE.len())])
            {
                Protocol::Http2
            } else {
                Protocol::NotGrpc
            };
        }
        match (self.protocol, direction) {
            (Protocol::Http1, _) => redact_secrets(payload),
            (Protocol::Opaque, Direction::Send) => payload.fill(0),
            (Protocol::NotGrpc, _) => {}
            (Protocol::Http2, Direction::Send) => self.send.scrub(offset, payload),
            // Answers carry results, not message bodies; before the send side says what the
            // connection is, a client connection has nothing to answer yet.
            (_, Direction::Recv) | (Protocol::Undetermined, Direction::Send) => {}
        }
    }
}

/// The send side of an HTTP/2 connection, followed byte by byte.
#[derive(Clone, Debug, Default)]
struct SendSide {
    /// Stream position of the next byte expected.
    next_offset: u64,
    /// Preface bytes still to pass.
    preface_left: usize,
    started: bool,
    frame: FramePosition,
    streams: Vec<(u32, MessagePosition)>,
    /// Frame sync is lost (gap, overlap or impossible frame): everything from here is zeroed.
    lost: bool,
}

#[derive(Clone, Debug)]
enum FramePosition {
    Header {
        bytes: [u8; FRAME_HEADER_LEN],
        filled: usize,
    },
    /// A non-DATA frame's payload: no message bytes, passed.
    OtherPayload { left: usize },
    /// A DATA frame's pad-length byte.
    DataPadLength {
        stream_id: u32,
        payload_left: usize,
        end_stream: bool,
    },
    Data {
        stream_id: u32,
        data_left: usize,
        padding_left: usize,
        end_stream: bool,
    },
    /// A DATA frame's payload that can't be followed (no stream slot, bad padding): zeroed.
    ZeroedPayload { left: usize },
}

impl Default for FramePosition {
    fn default() -> Self {
        Self::Header {
            bytes: [0; FRAME_HEADER_LEN],
            filled: 0,
        }
    }
}

impl SendSide {
    fn scrub(&mut self, offset: u64, payload: &mut [u8]) {
        if !self.started {
            self.started = true;
            self.preface_left = CLIENT_PREFACE.len();
        }
        // A chunk must continue exactly where the last ended: after a gap the frame
        // boundaries are unknown, and a repeated range may hold content already zeroed once.
        if offset != self.next_offset {
            self.lost = true;
        }
        self.next_offset = offset.saturating_add(payload.len() as u64);
        if self.lost {
            payload.fill(0);
            return;
        }
        let mut rest = payload;
        while !rest.is_empty() {
            let used = self.step(rest);
            rest = &mut rest[used..];
        }
    }

    /// Handles bytes at the front of `bytes`, returns how many (at least one).
    fn step(&mut self, bytes: &mut [u8]) -> usize {
        if self.lost {
            bytes.fill(0);
            return bytes.len();
        }
        if self.preface_left > 0 {
            let used = self.preface_left.min(bytes.len());
            self.preface_left -= used;
            return used;
        }
        match &mut self.frame {
            FramePosition::Header {
                bytes: header,
                filled,
            } => {
                let used = (FRAME_HEADER_LEN - *filled).min(bytes.len());
                header[*filled..*filled + used].copy_from_slice(&bytes[..used]);
                *filled += used;
                if *filled == FRAME_HEADER_LEN {
                    let header = *header;
                    self.frame = self.frame_after_header(header);
                }
                used
            }
            FramePosition::OtherPayload { left } => {
                let used = (*left).min(bytes.len());
                *left -= used;
                if *left == 0 {
                    self.frame = FramePosition::default();
                }
                used
            }
            FramePosition::ZeroedPayload { left } => {
                let used = (*left).min(bytes.len());
                bytes[..used].fill(0);
                *left -= used;
                if *left == 0 {
                    self.frame = FramePosition::default();
                }
                used
            }
            FramePosition::DataPadLength {
                stream_id,
                payload_left,
                end_stream,
            } => {
                let padding = usize::from(bytes[0]);
                let data_and_padding = *payload_left - 1;
                self.frame = match data_and_padding.checked_sub(padding) {
                    Some(data_left) => FramePosition::Data {
                        stream_id: *stream_id,
                        data_left,
                        padding_left: padding,
                        end_stream: *end_stream,
                    },
                    // The decoder rejects this frame too; its bytes are nobody's business.
                    None => FramePosition::ZeroedPayload {
                        left: data_and_padding,
                    },
                };
                self.finish_frame_if_empty();
                1
            }
            FramePosition::Data {
                stream_id,
                data_left,
                padding_left,
                ..
            } => {
                let stream_id = *stream_id;
                if *data_left == 0 {
                    let used = (*padding_left).min(bytes.len());
                    // Padding should be zero already; making sure costs nothing.
                    bytes[..used].fill(0);
                    *padding_left -= used;
                    self.finish_frame_if_empty();
                    return used;
                }
                let used = (*data_left).min(bytes.len());
                *data_left -= used;
                if let Some((_, message)) = self.streams.iter_mut().find(|(id, _)| *id == stream_id)
                {
                    message.scrub(&mut bytes[..used]);
                } else {
                    bytes[..used].fill(0);
                }
                self.finish_frame_if_empty();
                used
            }
        }
    }

    fn frame_after_header(&mut self, header: [u8; FRAME_HEADER_LEN]) -> FramePosition {
        let [l0, l1, l2, frame_type, flags, s0, s1, s2, s3] = header;
        let length = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
        let stream_id = u32::from_be_bytes([s0 & 0x7f, s1, s2, s3]);
        let end_stream = flags & FLAG_END_STREAM != 0;
        if frame_type != FRAME_DATA {
            return if length == 0 {
                FramePosition::default()
            } else {
                FramePosition::OtherPayload { left: length }
            };
        }
        let has_slot = self.streams.iter().any(|(id, _)| *id == stream_id)
            || (self.streams.len() < MAX_STREAMS && {
                self.streams.push((stream_id, MessagePosition::default()));
                true
            });
        if !has_slot {
            return if length == 0 {
                FramePosition::default()
            } else {
                FramePosition::ZeroedPayload { left: length }
            };
        }
        let position = if flags & FLAG_PADDED != 0 {
            if length == 0 {
                // PADDED without its length byte: the decoder gives up on the direction.
                self.lost = true;
                return FramePosition::default();
            }
            FramePosition::DataPadLength {
                stream_id,
                payload_left: length,
                end_stream,
            }
        } else {
            FramePosition::Data {
                stream_id,
                data_left: length,
                padding_left: 0,
                end_stream,
            }
        };
        if length == 0 && end_stream {
            self.streams.retain(|(id, _)| *id != stream_id);
            return FramePosition::default();
        }
        if length == 0 {
            return FramePosition::default();
        }
        position
    }

    fn finish_frame_if_empty(&mut self) {
        if let FramePosition::Data {
            stream_id,
            data_left: 0,
            padding_left: 0,
            end_stream,
        } = self.frame
        {
            if end_stream {
                self.streams.retain(|(id, _)| *id != stream_id);
            }
            self.frame = FramePosition::default();
        }
    }
}

/// Where a stream's DATA bytes are in its gRPC messages.
#[derive(Clone, Debug)]
enum MessagePosition {
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
    fn scrub(&mut self, mut data: &mut [u8]) {
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
                            Self::Body(BodyScan::new(length))
                        } else {
                            // Compressed bytes can't be searched for the content field.
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
                    let used = scan.scrub(data);
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

/// The protobuf walk of one message body: top-level fields, and inside field 1 (`msgData`)
/// its fields, zeroing field 12's value.
#[derive(Clone, Debug)]
struct BodyScan {
    body_left: u64,
    /// Bytes of `msgData` still to come while inside it.
    msg_data_left: Option<u64>,
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
    fn new(length: u64) -> Self {
        Self {
            body_left: length,
            msg_data_left: None,
            field: KEY_START,
            broken: false,
        }
    }

    /// Walks `data` up to the body's end or a parse failure; returns the bytes used.
    fn scrub(&mut self, data: &mut [u8]) -> usize {
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
                    self.read_byte(data[index]);
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
        if let Some(left) = self.msg_data_left {
            // A field may not straddle msgData's end.
            match left.checked_sub(used) {
                Some(0) => {
                    self.msg_data_left = None;
                    if !matches!(self.field, FieldPosition::Key { value: 0, shift: 0 }) {
                        self.broken = true;
                    }
                }
                Some(left) => self.msg_data_left = Some(left),
                None => self.broken = true,
            }
        }
        if self.body_left == 0 && !matches!(self.field, FieldPosition::Key { value: 0, shift: 0 }) {
            self.broken = true;
        }
    }

    /// One byte of a key, a length or a varint value.
    fn read_byte(&mut self, byte: u8) {
        let more = byte & 0x80 != 0;
        let bits = u64::from(byte & 0x7f);
        match self.field {
            FieldPosition::Key { value, shift } => {
                let Some(value) = accumulate(value, shift, bits) else {
                    self.broken = true;
                    return;
                };
                if more {
                    self.field = FieldPosition::Key {
                        value,
                        shift: shift + 7,
                    };
                    return;
                }
                let field_number = value >> 3;
                if field_number == 0 {
                    self.broken = true;
                    return;
                }
                self.field = match value & 7 {
                    0 => FieldPosition::VarintValue { shift: 0 },
                    1 => FieldPosition::Skip { left: 8 },
                    5 => FieldPosition::Skip { left: 4 },
                    2 => FieldPosition::Length {
                        field_number,
                        value: 0,
                        shift: 0,
                    },
                    // Groups (3, 4) are not used by these messages; 6 and 7 are not wire types.
                    _ => {
                        self.broken = true;
                        return;
                    }
                };
            }
            FieldPosition::VarintValue { shift } => {
                if shift >= 63 && more {
                    self.broken = true;
                } else if more {
                    self.field = FieldPosition::VarintValue { shift: shift + 7 };
                } else {
                    self.field = KEY_START;
                }
            }
            FieldPosition::Length {
                field_number,
                value,
                shift,
            } => {
                let Some(value) = accumulate(value, shift, bits) else {
                    self.broken = true;
                    return;
                };
                if more {
                    self.field = FieldPosition::Length {
                        field_number,
                        value,
                        shift: shift + 7,
                    };
                    return;
                }
                self.start_length_delimited(field_number, value);
            }
            FieldPosition::Skip { .. } | FieldPosition::Zero { .. } => {}
        }
    }

    /// The value of a length-delimited field starts after the current byte.
    fn start_length_delimited(&mut self, field_number: u64, length: u64) {
        // `consumed` has not yet counted the length's last byte.
        let room = match self.msg_data_left {
            Some(left) => left.saturating_sub(1),
            None => self.body_left.saturating_sub(1),
        };
        if length > room {
            self.broken = true;
            return;
        }
        let inside_msg_data = self.msg_data_left.is_some();
        self.field = if length == 0 {
            KEY_START
        } else if !inside_msg_data && field_number == MSG_DATA_FIELD {
            // Its fields are walked; it ends `length` bytes after this byte.
            self.msg_data_left = Some(length + 1);
            KEY_START
        } else if inside_msg_data && field_number == CONTENT_FIELD {
            FieldPosition::Zero { left: length }
        } else {
            FieldPosition::Skip { left: length }
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

#[cfg(test)]
#[path = "scrub_tests.rs"]
mod tests;
