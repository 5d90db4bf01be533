//! Decides what of a watched connection's captured bytes may leave the process (`observer run
//! --events` / `--record`, and so `observer replay`): a whitelist of what the engine reads,
//! applied per connection as its chunks arrive in order, in place, keeping every length, so the
//! decoders read a filtered stream into the same facts.
//!
//! - HTTP/1 (a WebSocket port, or an upgrade sent to a gRPC port): `Http1Whitelist`.
//! - HTTP/2, both directions: frames are followed; header blocks (HEADERS, CONTINUATION) go
//!   through a `HeaderWhitelist` per direction; GOAWAY's debug text is masked; DATA is read as
//!   gRPC messages whose protobuf fields are kept only where the engine reads them
//!   (`protobuf_whitelist::Schema`): in a push request, `msgData`'s message ids, seq and
//!   session type, and the recipients; in an answer, each user's id, results and online flag.
//!   Every other field is masked at any nesting: a length-delimited value zeroed, a varint
//!   rewritten as an over-long zero of the same length, a fixed one zeroed.
//! - What cannot be followed is zeroed rather than passed: a compressed message's body, the rest
//!   of a message whose protobuf does not parse, a DATA frame with impossible padding, and
//!   after a gap, or a direction first seen past position 0 (frame sync lost), every later byte
//!   of the direction.
//!
//! A connection whose send side starts at position 0 with neither an HTTP/1 request nor the
//! HTTP/2 preface is not OpenIM traffic (no push message or upgrade can be in it) and passes as
//! captured, so the capture of any watched port can still be checked with `--events`.
//!
//! Memory per connection is bounded: a few counters per stream, at most `MAX_STREAMS` streams,
//! and each direction's HPACK table mirror (names and sizes, bounded by the table size).

use crate::model::{
    Direction, PortClass,
    wire::{
        CLIENT_PREFACE, FLAG_END_STREAM, FLAG_PADDED, FLAG_PRIORITY, FRAME_CONTINUATION,
        FRAME_DATA, FRAME_GOAWAY, FRAME_HEADER_LEN, FRAME_HEADERS, FRAME_PING, FRAME_PRIORITY,
        FRAME_RST_STREAM, FRAME_SETTINGS, FRAME_WINDOW_UPDATE,
    },
};

use super::{
    header_whitelist::HeaderWhitelist,
    http1_whitelist::Http1Whitelist,
    protobuf_whitelist::{MessagePosition, Schema},
};

/// Bounds the streams followed at once; DATA of streams beyond it is zeroed. Push opens one per
/// call.
const MAX_STREAMS: usize = 64;
/// Counts the bytes of GOAWAY's last stream id and error code, before its debug data.
const GOAWAY_FIXED_LEN: usize = 8;

/// Holds the per-connection whitelist state: keep one per connection id, feed every `Data` event's
/// payload in capture order through `filter`, and drop it when the connection closes.
#[derive(Clone, Debug)]
pub struct OutputWhitelist {
    protocol: Protocol,
    send: Side,
    recv: Side,
}

#[derive(Clone, Debug)]
enum Protocol {
    /// Nothing seen on the send side yet.
    Undetermined,
    Http2,
    /// A WebSocket port, or a send side that began with an HTTP/1 request line.
    Http1 {
        request: Http1Whitelist,
        response: Http1Whitelist,
        next_offsets: [u64; 2],
    },
    /// The send side was first seen past position 0: frame sync is unknown, so nothing can be
    /// followed and all of it is zeroed.
    Opaque,
    /// The send side began at position 0 with neither the HTTP/2 preface nor an HTTP/1
    /// request: not OpenIM traffic, passed as captured.
    NotOpenIm,
}

impl OutputWhitelist {
    /// Builds the state for a connection to a port of `port_class`.
    pub fn new(port_class: PortClass) -> Self {
        Self {
            protocol: if port_class == PortClass::WebSocket {
                Protocol::http1()
            } else {
                Protocol::Undetermined
            },
            send: Side::new(Schema::PushRequest, true),
            recv: Side::new(Schema::PushAnswer, false),
        }
    }

    /// Masks in place what of one captured chunk may not leave. `offset` is the chunk's stream
    /// position in `direction`, as in `EventKind::Data`.
    pub fn filter(&mut self, direction: Direction, offset: u64, payload: &mut [u8]) {
        if matches!(self.protocol, Protocol::Undetermined) && direction == Direction::Send {
            self.protocol = if offset != 0 {
                Protocol::Opaque
            } else {
                Protocol::sniffed(payload)
            };
        }
        match (&mut self.protocol, direction) {
            (
                Protocol::Http1 {
                    request,
                    response,
                    next_offsets,
                },
                _,
            ) => {
                let (whitelist, next) = if direction == Direction::Send {
                    (request, &mut next_offsets[0])
                } else {
                    (response, &mut next_offsets[1])
                };
                if offset != *next {
                    // Position lost: from here on nothing is known to be the head.
                    whitelist.lose();
                }
                *next = offset.saturating_add(payload.len() as u64);
                whitelist.filter(payload);
            }
            (Protocol::NotOpenIm, _) => {}
            (Protocol::Http2, Direction::Send) => self.send.filter(offset, payload),
            // An HTTP/2 server may speak first (its SETTINGS): followed as HTTP/2, whose frame
            // walk passes nothing it does not know.
            (Protocol::Http2 | Protocol::Undetermined, Direction::Recv) => {
                self.recv.filter(offset, payload)
            }
            // (Undetermined cannot meet a send chunk: the first one decides above.)
            (Protocol::Opaque | Protocol::Undetermined, _) => payload.fill(0),
        }
    }
}

impl Protocol {
    /// Reads what a send side's first chunk says, however short it is: the start of the HTTP/2
    /// preface (checked byte by byte as it goes on: a `P` that goes on as `POST` loses the
    /// direction), else of a request line, else neither.
    fn sniffed(first: &[u8]) -> Self {
        const METHODS: [&[u8]; 9] = [
            b"GET ",
            b"POST ",
            b"PUT ",
            b"HEAD ",
            b"DELETE ",
            b"OPTIONS ",
            b"PATCH ",
            b"CONNECT ",
            b"TRACE ",
        ];
        let is_prefix_of = |whole: &[u8]| {
            let len = first.len().min(whole.len());
            whole[..len] == first[..len]
        };
        if is_prefix_of(&CLIENT_PREFACE) {
            Protocol::Http2
        } else if METHODS.iter().any(|method| is_prefix_of(method)) {
            Protocol::http1()
        } else {
            Protocol::NotOpenIm
        }
    }

    fn http1() -> Self {
        Protocol::Http1 {
            request: Http1Whitelist::request(),
            response: Http1Whitelist::response(),
            next_offsets: [0, 0],
        }
    }
}

/// Follows one direction of an HTTP/2 connection, byte by byte.
#[derive(Clone, Debug)]
struct Side {
    /// What its gRPC messages are.
    schema: Schema,
    /// Stream position of the next byte expected.
    next_offset: u64,
    /// Preface bytes still to pass (the client's side starts with it).
    preface_left: usize,
    frame: FramePosition,
    streams: Vec<(u32, MessagePosition)>,
    headers: HeaderWhitelist,
    /// Frame sync is lost (gap, overlap or impossible frame): everything from here is zeroed.
    lost: bool,
}

#[derive(Clone, Debug)]
enum FramePosition {
    Header {
        bytes: [u8; FRAME_HEADER_LEN],
        filled: usize,
    },
    /// A frame whose payload holds numbers only (SETTINGS, PING, WINDOW_UPDATE, RST_STREAM,
    /// PRIORITY): passed.
    NumbersPayload { left: usize },
    /// A HEADERS or CONTINUATION payload: its pad length and priority fields pass, its
    /// block fragment goes through the header whitelist, its padding is zeroed.
    HeaderPayload {
        pad_length_pending: bool,
        priority_left: usize,
        /// Bytes of the payload still to come, padding included.
        left: usize,
        padding: usize,
    },
    /// GOAWAY: the last stream id and error code pass, the debug text is masked.
    GoAway { fixed_left: usize, left: usize },
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
    /// A payload that can't be vouched for (no stream slot, bad padding, a frame type the
    /// engine does not read): zeroed.
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

impl Side {
    fn new(schema: Schema, starts_with_preface: bool) -> Self {
        Self {
            schema,
            next_offset: 0,
            preface_left: if starts_with_preface {
                CLIENT_PREFACE.len()
            } else {
                0
            },
            frame: FramePosition::default(),
            streams: Vec::new(),
            headers: HeaderWhitelist::default(),
            lost: false,
        }
    }

    fn filter(&mut self, offset: u64, payload: &mut [u8]) {
        // A chunk must continue exactly where the last ended: after a gap the frame
        // boundaries are unknown, and a repeated range may hold bytes already masked once.
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
    ///
    /// Longer than 100 lines on purpose: one `match` over the stream's states (preface, frame
    /// header, headers, data, skipped), so every transition of the whitelist reads in one place.
    fn step(&mut self, bytes: &mut [u8]) -> usize {
        if self.lost || self.headers.is_lost() {
            self.lost = true;
            bytes.fill(0);
            return bytes.len();
        }
        if self.preface_left > 0 {
            let used = self.preface_left.min(bytes.len());
            let at = CLIENT_PREFACE.len() - self.preface_left;
            if bytes[..used] != CLIENT_PREFACE[at..at + used] {
                // Not the preface after all (a first chunk of `P` that went on as `POST`).
                self.lost = true;
                bytes.fill(0);
                return bytes.len();
            }
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
            FramePosition::NumbersPayload { left } => {
                let used = (*left).min(bytes.len());
                *left -= used;
                if *left == 0 {
                    self.frame = FramePosition::default();
                }
                used
            }
            FramePosition::HeaderPayload { .. } => self.header_payload_step(bytes),
            FramePosition::GoAway { fixed_left, left } => {
                let used = (*left).min(bytes.len());
                let passed = (*fixed_left).min(used);
                bytes[passed..used].fill(b'*');
                *fixed_left -= passed;
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
                    message.filter(self.schema, &mut bytes[..used]);
                } else {
                    bytes[..used].fill(0);
                }
                self.finish_frame_if_empty();
                used
            }
        }
    }

    fn header_payload_step(&mut self, bytes: &mut [u8]) -> usize {
        let FramePosition::HeaderPayload {
            mut pad_length_pending,
            mut priority_left,
            mut left,
            mut padding,
        } = self.frame
        else {
            return 0;
        };
        let used = if pad_length_pending {
            pad_length_pending = false;
            padding = usize::from(bytes[0]);
            if padding + priority_left > left - 1 {
                // More padding than payload: the decoder gives up on the direction too.
                self.lost = true;
            }
            1
        } else if priority_left > 0 {
            let used = priority_left.min(bytes.len());
            priority_left -= used;
            used
        } else if left > padding {
            let used = (left - padding).min(bytes.len());
            self.headers.filter(&mut bytes[..used]);
            used
        } else {
            let used = left.min(bytes.len());
            bytes[..used].fill(0);
            used
        };
        left -= used;
        self.frame = if left == 0 {
            FramePosition::default()
        } else {
            FramePosition::HeaderPayload {
                pad_length_pending,
                priority_left,
                left,
                padding,
            }
        };
        used
    }

    fn frame_after_header(&mut self, header: [u8; FRAME_HEADER_LEN]) -> FramePosition {
        let [l0, l1, l2, frame_type, flags, s0, s1, s2, s3] = header;
        let length = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
        let stream_id = u32::from_be_bytes([s0 & 0x7f, s1, s2, s3]);
        let end_stream = flags & FLAG_END_STREAM != 0;
        if length == 0 {
            if frame_type == FRAME_DATA && end_stream {
                self.streams.retain(|(id, _)| *id != stream_id);
            }
            return FramePosition::default();
        }
        match frame_type {
            FRAME_DATA => {}
            FRAME_HEADERS | FRAME_CONTINUATION => {
                let padded = frame_type == FRAME_HEADERS && flags & FLAG_PADDED != 0;
                let priority = if frame_type == FRAME_HEADERS && flags & FLAG_PRIORITY != 0 {
                    5
                } else {
                    0
                };
                if !padded && priority > length {
                    self.lost = true;
                }
                return FramePosition::HeaderPayload {
                    pad_length_pending: padded,
                    priority_left: priority,
                    left: length,
                    padding: 0,
                };
            }
            FRAME_GOAWAY => {
                return FramePosition::GoAway {
                    fixed_left: GOAWAY_FIXED_LEN,
                    left: length,
                };
            }
            FRAME_PRIORITY | FRAME_RST_STREAM | FRAME_SETTINGS | FRAME_PING
            | FRAME_WINDOW_UPDATE => return FramePosition::NumbersPayload { left: length },
            // PUSH_PROMISE (never sent to a client that disabled it, as gRPC does) would add
            // to the HPACK table without a HEADERS frame; unknown types carry who knows what.
            _ => return FramePosition::ZeroedPayload { left: length },
        }
        let has_slot = self.streams.iter().any(|(id, _)| *id == stream_id)
            || (self.streams.len() < MAX_STREAMS && {
                self.streams.push((stream_id, MessagePosition::default()));
                true
            });
        if !has_slot {
            return FramePosition::ZeroedPayload { left: length };
        }
        if flags & FLAG_PADDED != 0 {
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
        }
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

#[cfg(test)]
mod tests;
