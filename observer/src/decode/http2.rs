//! Reads the HTTP/2 framing (RFC 9113) of one direction of a client connection: reassembles frames
//! across chunks, strips padding, joins CONTINUATIONs, decompresses header blocks with the
//! direction's HPACK state and hands out per-stream HEADERS and DATA.
//!
//! The direction's HPACK table depends on every header block before, so any missing byte (a
//! capture gap, a start past position 0) or protocol error ends decoding of that direction for
//! good; what was decoded before stays valid.
//!
//! A connection the observer adopted at start (`Http2Direction::joined_mid_stream`) is the
//! exception: its first captured byte is wherever the stream was, so the direction first finds
//! a frame boundary (`find_frame_boundary`), then decodes frames as usual with an HPACK table
//! that knows only the entries added since (`HpackDecoder::joined_mid_stream`).

use bytes::Bytes;

use crate::model::{
    Direction,
    wire::{
        CLIENT_PREFACE, FLAG_END_HEADERS, FLAG_END_STREAM, FLAG_PADDED, FLAG_PRIORITY,
        FRAME_CONTINUATION, FRAME_DATA, FRAME_GOAWAY, FRAME_HEADER_LEN, FRAME_HEADERS, FRAME_PING,
        FRAME_PRIORITY, FRAME_PUSH_PROMISE, FRAME_RST_STREAM, FRAME_SETTINGS, FRAME_WINDOW_UPDATE,
    },
};

use super::Limits;
use crate::hpack::{HeaderField, HpackDecoder, HpackError};

/// Says why a connection or one of its directions can't be (further) decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Undecodable {
    #[error("joined mid-stream: first captured {direction:?} byte at position {first_offset}")]
    JoinedMidStream {
        direction: Direction,
        first_offset: u64,
    },
    #[error("send side does not start with the HTTP/2 client preface")]
    NoClientPreface,
    #[error("{direction:?} lost sync: {missing} bytes not captured at position {position}")]
    Gap {
        direction: Direction,
        position: u64,
        missing: u64,
    },
    #[error("{direction:?} needs more than {limit} buffered bytes")]
    BufferOverflow { direction: Direction, limit: usize },
    #[error("{direction:?} HTTP/2 framing error: {error}")]
    Framing {
        direction: Direction,
        error: FrameError,
    },
    #[error("{direction:?} HPACK error: {error}")]
    Hpack {
        direction: Direction,
        error: HpackError,
    },
}

/// Says how a direction's frames break HTTP/2 framing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame type {frame_type} while a header block awaits CONTINUATION")]
    ContinuationExpected { frame_type: u8 },
    #[error("CONTINUATION without an open header block")]
    UnexpectedContinuation,
    #[error("frame type {frame_type} on stream 0")]
    StreamZero { frame_type: u8 },
    #[error("padding or priority longer than the frame")]
    FrameTooShort,
    #[error("header block over {0} bytes")]
    HeaderBlockTooLarge(usize),
}

/// Reports what one direction's frames say about its streams. Not `Debug`: DATA holds message
/// bodies.
#[derive(Clone, PartialEq, Eq)]
pub enum StreamEvent {
    Headers {
        stream_id: u32,
        fields: Vec<HeaderField>,
        end_stream: bool,
    },
    /// A DATA frame's payload: a slice of the captured chunk when the frame lay whole in it,
    /// else copied out of the buffer that joined its pieces.
    Data {
        stream_id: u32,
        data: Bytes,
        end_stream: bool,
    },
    /// The start of a DATA frame that a gap cut: its payload up to the cut.
    DataCut {
        stream_id: u32,
        data: Bytes,
    },
    Reset {
        stream_id: u32,
    },
    /// The direction stops here; nothing more comes from it.
    Lost(Undecodable),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HeaderBlockKind {
    Headers,
    /// Server push: decoded only to keep the HPACK table in step.
    PushPromise,
}

/// Records what the frame that opened a header block said about it.
#[derive(Clone, Copy)]
struct BlockHead {
    stream_id: u32,
    kind: HeaderBlockKind,
    end_stream: bool,
}

/// Gathers a header block continued in CONTINUATION frames, until its last.
#[derive(Clone)]
struct OpenHeaderBlock {
    head: BlockHead,
    fragments: Vec<u8>,
}

/// Says where the frames being handled lie, for what a DATA event holds.
#[derive(Clone, Copy)]
enum FrameBytes<'a> {
    /// In the captured chunk itself: a DATA payload is a slice of it, no copy. The chunk is
    /// the event's, dropped once the event is decoded, so nothing outlives it.
    Chunk(&'a Bytes),
    /// In the direction's buffer (a frame split across chunks): a DATA payload is copied out.
    Buffered,
}

/// Decodes one direction of an HTTP/2 client connection. Not `Debug`: its buffer holds raw bytes.
#[derive(Clone)]
pub struct Http2Direction {
    direction: Direction,
    limits: Limits,
    /// Stream position of the next byte expected; `None` before the first chunk.
    next_offset: Option<u64>,
    preface_pending: bool,
    /// A partial frame (or bytes before a boundary) waiting for the rest.
    buffer: Vec<u8>,
    hpack: HpackDecoder,
    open_header_block: Option<OpenHeaderBlock>,
    lost: bool,
    /// Joined mid-stream and no frame boundary found yet.
    syncing: bool,
    joined_mid_stream: bool,
    mid_stream: MidStreamCounts,
}

/// Counts what joining a direction mid-stream cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MidStreamCounts {
    /// Bytes before the first frame boundary found.
    pub skipped_bytes: u64,
    /// Header fields that referred to HPACK entries made before the join.
    pub unknown_header_fields: u64,
    /// Header blocks that could not be decoded (after which the table starts over).
    pub header_blocks_lost: u64,
}

impl Http2Direction {
    /// Builds a direction read from its start: the send side must begin with the client preface;
    /// the receive side begins with frames.
    pub fn new(direction: Direction, limits: Limits) -> Self {
        Self {
            direction,
            limits,
            next_offset: None,
            preface_pending: direction == Direction::Send,
            buffer: Vec::new(),
            hpack: HpackDecoder::new(limits.max_dynamic_table_size, limits.max_header_block_bytes),
            open_header_block: None,
            lost: false,
            syncing: false,
            joined_mid_stream: false,
            mid_stream: MidStreamCounts::default(),
        }
    }

    /// Builds a direction of a connection adopted after it was established: no preface, the first
    /// captured byte anywhere in a frame, an HPACK table partly unknown.
    pub fn joined_mid_stream(direction: Direction, limits: Limits) -> Self {
        Self {
            preface_pending: false,
            syncing: true,
            joined_mid_stream: true,
            hpack: HpackDecoder::joined_mid_stream(
                limits.max_dynamic_table_size,
                limits.max_header_block_bytes,
            ),
            ..Self::new(direction, limits)
        }
    }

    /// Says whether this direction stopped decoding (it reported `StreamEvent::Lost`).
    pub fn is_lost(&self) -> bool {
        self.lost
    }

    /// Returns what joining this direction mid-stream cost so far.
    pub fn mid_stream_counts(&self) -> MidStreamCounts {
        MidStreamCounts {
            unknown_header_fields: self.hpack.unknown_fields(),
            ..self.mid_stream
        }
    }

    /// Counts the heap bytes held: the frame buffer, an open header block and the HPACK table.
    pub fn buffered_bytes(&self) -> usize {
        self.buffer.capacity()
            + self
                .open_header_block
                .as_ref()
                .map_or(0, |block| block.fragments.capacity())
            + self.hpack.table_bytes()
    }

    /// Feeds the chunk that starts at stream position `offset`.
    pub fn feed(&mut self, offset: u64, chunk: &Bytes, events: &mut Vec<StreamEvent>) {
        if self.lost {
            return;
        }
        let expected = match self.next_offset {
            Some(expected) => expected,
            None if offset == 0 || self.joined_mid_stream => offset,
            None => {
                return self.lose(
                    Undecodable::JoinedMidStream {
                        direction: self.direction,
                        first_offset: offset,
                    },
                    events,
                );
            }
        };
        let payload = if offset > expected {
            self.report_cut_data(events);
            return self.lose(
                Undecodable::Gap {
                    direction: self.direction,
                    position: expected,
                    missing: offset - expected,
                },
                events,
            );
        } else {
            // Bytes seen already (an overlapping chunk) are skipped.
            let seen = usize::try_from(expected - offset).unwrap_or(usize::MAX);
            chunk.slice(seen.min(chunk.len())..)
        };
        self.next_offset = Some(expected + payload.len() as u64);
        let mut rest: &[u8] = &payload;
        if self.buffer.is_empty() {
            // A chunk usually holds whole frames (a call's HEADERS and DATA are one write):
            // they are handled where they lie; only a partial frame at its end is buffered.
            let consumed = self.drain_frames(&payload, FrameBytes::Chunk(&payload), events);
            rest = rest.get(consumed..).unwrap_or_default();
        }
        // Appended piecewise so complete frames leave the buffer before more bytes come in.
        while !rest.is_empty() && !self.lost {
            let room = self
                .limits
                .max_buffered_bytes
                .saturating_sub(self.buffer.len());
            if room == 0 {
                return self.lose(
                    Undecodable::BufferOverflow {
                        direction: self.direction,
                        limit: self.limits.max_buffered_bytes,
                    },
                    events,
                );
            }
            let (taken, remaining) = rest.split_at(room.min(rest.len()));
            self.buffer.extend_from_slice(taken);
            rest = remaining;
            self.drain(events);
        }
    }

    /// Reports the partial DATA frame buffered when the capture ends (no more chunks will come).
    pub fn finish(&mut self, events: &mut Vec<StreamEvent>) {
        if !self.lost {
            self.report_cut_data(events);
        }
    }

    fn lose(&mut self, reason: Undecodable, events: &mut Vec<StreamEvent>) {
        self.lost = true;
        self.buffer = Vec::new();
        self.open_header_block = None;
        events.push(StreamEvent::Lost(reason));
    }

    fn drain(&mut self, events: &mut Vec<StreamEvent>) {
        // Frames are handled straight from the buffer, which is taken out meanwhile; it goes
        // back (capacity kept) unless the direction was lost.
        let buffer = std::mem::take(&mut self.buffer);
        let consumed = self.drain_frames(&buffer, FrameBytes::Buffered, events);
        if !self.lost {
            self.buffer = buffer;
            self.buffer.drain(..consumed);
        }
    }

    /// Handles the complete frames at the front of `buffer`; returns the bytes they took.
    fn drain_frames(
        &mut self,
        buffer: &[u8],
        source: FrameBytes<'_>,
        events: &mut Vec<StreamEvent>,
    ) -> usize {
        let mut consumed = 0usize;
        if self.syncing {
            match find_frame_boundary(buffer) {
                Boundary::At(position) => {
                    self.syncing = false;
                    consumed = position;
                }
                Boundary::NotBefore(position) => {
                    self.mid_stream.skipped_bytes += position as u64;
                    return position;
                }
            }
            self.mid_stream.skipped_bytes += consumed as u64;
        }
        if self.preface_pending {
            let available = buffer.len().min(CLIENT_PREFACE.len());
            if buffer.get(..available) != CLIENT_PREFACE.get(..available) {
                self.lose(Undecodable::NoClientPreface, events);
                return consumed;
            }
            if available < CLIENT_PREFACE.len() {
                return consumed;
            }
            self.preface_pending = false;
            consumed = CLIENT_PREFACE.len();
        }
        while let Some(header) = buffer.get(consumed..).and_then(FrameHeader::parse) {
            let frame_len = FRAME_HEADER_LEN + header.length;
            if frame_len > self.limits.max_buffered_bytes {
                self.lose(
                    Undecodable::BufferOverflow {
                        direction: self.direction,
                        limit: self.limits.max_buffered_bytes,
                    },
                    events,
                );
                return consumed;
            }
            let Some(frame) = buffer.get(consumed..consumed + frame_len) else {
                break;
            };
            let payload = frame.get(FRAME_HEADER_LEN..).unwrap_or_default();
            consumed += frame_len;
            if let Err(reason) = self.handle_frame(&header, payload, source, events) {
                self.lose(reason, events);
                return consumed;
            }
        }
        consumed
    }

    fn handle_frame(
        &mut self,
        header: &FrameHeader,
        payload: &[u8],
        source: FrameBytes<'_>,
        events: &mut Vec<StreamEvent>,
    ) -> Result<(), Undecodable> {
        let framing = |error| Undecodable::Framing {
            direction: self.direction,
            error,
        };
        if self.open_header_block.is_some() && header.frame_type != FRAME_CONTINUATION {
            return Err(framing(FrameError::ContinuationExpected {
                frame_type: header.frame_type,
            }));
        }
        let needs_stream = matches!(
            header.frame_type,
            FRAME_DATA | FRAME_HEADERS | FRAME_PUSH_PROMISE | FRAME_CONTINUATION | FRAME_RST_STREAM
        );
        if needs_stream && header.stream_id == 0 {
            return Err(framing(FrameError::StreamZero {
                frame_type: header.frame_type,
            }));
        }
        match header.frame_type {
            FRAME_DATA => {
                let data = unpad(header.flags, payload).map_err(framing)?;
                events.push(StreamEvent::Data {
                    stream_id: header.stream_id,
                    data: match source {
                        FrameBytes::Chunk(chunk) => chunk.slice_ref(data),
                        FrameBytes::Buffered => Bytes::copy_from_slice(data),
                    },
                    end_stream: header.flags & FLAG_END_STREAM != 0,
                });
            }
            FRAME_HEADERS => {
                let mut fragment = unpad(header.flags, payload).map_err(framing)?;
                if header.flags & FLAG_PRIORITY != 0 {
                    fragment = fragment
                        .get(5..)
                        .ok_or(framing(FrameError::FrameTooShort))?;
                }
                self.open_block(header, HeaderBlockKind::Headers, fragment, events)?;
            }
            FRAME_PUSH_PROMISE => {
                let unpadded = unpad(header.flags, payload).map_err(framing)?;
                // The promised stream id precedes the header block.
                let fragment = unpadded
                    .get(4..)
                    .ok_or(framing(FrameError::FrameTooShort))?;
                self.open_block(header, HeaderBlockKind::PushPromise, fragment, events)?;
            }
            FRAME_CONTINUATION => {
                let Some(block) = self.open_header_block.as_mut() else {
                    return Err(framing(FrameError::UnexpectedContinuation));
                };
                if block.head.stream_id != header.stream_id {
                    return Err(framing(FrameError::ContinuationExpected {
                        frame_type: header.frame_type,
                    }));
                }
                block.fragments.extend_from_slice(payload);
                if block.fragments.len() > self.limits.max_header_block_bytes {
                    return Err(framing(FrameError::HeaderBlockTooLarge(
                        self.limits.max_header_block_bytes,
                    )));
                }
                if header.flags & FLAG_END_HEADERS != 0 {
                    self.close_block(events)?;
                }
            }
            FRAME_RST_STREAM => events.push(StreamEvent::Reset {
                stream_id: header.stream_id,
            }),
            // SETTINGS, PING, GOAWAY, WINDOW_UPDATE, PRIORITY and unknown types carry nothing
            // about calls or the HPACK state.
            _ => {}
        }
        Ok(())
    }

    fn open_block(
        &mut self,
        header: &FrameHeader,
        kind: HeaderBlockKind,
        fragment: &[u8],
        events: &mut Vec<StreamEvent>,
    ) -> Result<(), Undecodable> {
        if fragment.len() > self.limits.max_header_block_bytes {
            return Err(Undecodable::Framing {
                direction: self.direction,
                error: FrameError::HeaderBlockTooLarge(self.limits.max_header_block_bytes),
            });
        }
        let head = BlockHead {
            stream_id: header.stream_id,
            kind,
            end_stream: header.flags & FLAG_END_STREAM != 0,
        };
        if header.flags & FLAG_END_HEADERS != 0 {
            // Nearly every block fits in one frame: decoded where it lies, without a copy.
            return self.decode_block(head, fragment, events);
        }
        self.open_header_block = Some(OpenHeaderBlock {
            head,
            fragments: fragment.to_vec(),
        });
        Ok(())
    }

    fn close_block(&mut self, events: &mut Vec<StreamEvent>) -> Result<(), Undecodable> {
        let Some(block) = self.open_header_block.take() else {
            return Ok(());
        };
        self.decode_block(block.head, &block.fragments, events)
    }

    /// Decodes a whole header block, in one frame or gathered from its CONTINUATIONs.
    fn decode_block(
        &mut self,
        head: BlockHead,
        fragments: &[u8],
        events: &mut Vec<StreamEvent>,
    ) -> Result<(), Undecodable> {
        let fields = match self.hpack.decode(fragments) {
            Ok(fields) => fields,
            Err(_) if self.joined_mid_stream => {
                // Most likely a reference this decoder misread: what the block added to the
                // table is unknown, so nothing in it is trusted from here on.
                self.mid_stream.header_blocks_lost += 1;
                self.hpack.forget_table();
                return Ok(());
            }
            Err(error) => {
                return Err(Undecodable::Hpack {
                    direction: self.direction,
                    error,
                });
            }
        };
        if head.kind == HeaderBlockKind::Headers {
            events.push(StreamEvent::Headers {
                stream_id: head.stream_id,
                fields,
                end_stream: head.end_stream,
            });
        }
        Ok(())
    }

    /// Reports the DATA frame a gap cut: it still carries its first bytes, which may hold
    /// recipients.
    fn report_cut_data(&mut self, events: &mut Vec<StreamEvent>) {
        let Some(header) = FrameHeader::parse(&self.buffer) else {
            return;
        };
        if header.frame_type != FRAME_DATA || header.stream_id == 0 || self.preface_pending {
            return;
        }
        let available = self.buffer.get(FRAME_HEADER_LEN..).unwrap_or_default();
        let available = available.get(..header.length).unwrap_or(available);
        let data = if header.flags & FLAG_PADDED != 0 {
            match available.split_first() {
                Some((&pad_len, rest)) => {
                    let data_len = header.length.saturating_sub(1 + usize::from(pad_len));
                    rest.get(..data_len).unwrap_or(rest)
                }
                None => return,
            }
        } else {
            available
        };
        if !data.is_empty() {
            events.push(StreamEvent::DataCut {
                stream_id: header.stream_id,
                data: Bytes::copy_from_slice(data),
            });
        }
    }
}

/// Says where frames start in bytes joined mid-stream.
#[derive(Debug, PartialEq, Eq)]
enum Boundary {
    /// A frame starts here, and the bytes after it agree.
    At(usize),
    /// Not before this position: the bytes before it can go, the rest must wait for more.
    NotBefore(usize),
}

/// Sizes the largest frame a peer sends without having raised SETTINGS_MAX_FRAME_SIZE (which gRPC
/// clients and servers leave alone): a bound on what a frame header found by scanning may say.
const DEFAULT_MAX_FRAME_SIZE: usize = 16_384;

/// Finds the first position where a plausible frame header starts and either the buffer ends right
/// after its frame or the next frame's header is plausible too. Writers hand whole frames to
/// the kernel, so a captured chunk usually starts on a boundary and this is position 0.
fn find_frame_boundary(buffer: &[u8]) -> Boundary {
    for position in 0..buffer.len() {
        let Some(header) = buffer.get(position..).and_then(FrameHeader::parse) else {
            return Boundary::NotBefore(position);
        };
        // A header block's continuation cannot start the decoding: its start was missed.
        if !header.plausible() || header.frame_type == FRAME_CONTINUATION {
            continue;
        }
        let next = position + FRAME_HEADER_LEN + header.length;
        if next == buffer.len() {
            return Boundary::At(position);
        }
        match buffer.get(next..).and_then(FrameHeader::parse) {
            Some(following) if following.plausible() => return Boundary::At(position),
            Some(_) => {}
            None => return Boundary::NotBefore(position),
        }
    }
    Boundary::NotBefore(buffer.len())
}

struct FrameHeader {
    length: usize,
    frame_type: u8,
    flags: u8,
    stream_id: u32,
}

impl FrameHeader {
    /// Says whether these 9 bytes could be a frame header of a gRPC connection: a known type whose
    /// flags, length and stream id (odd: streams are the client's) fit it.
    fn plausible(&self) -> bool {
        if self.length > DEFAULT_MAX_FRAME_SIZE {
            return false;
        }
        let client_stream = self.stream_id % 2 == 1;
        let (allowed_flags, fits) = match self.frame_type {
            FRAME_DATA => (FLAG_END_STREAM | FLAG_PADDED, client_stream),
            FRAME_HEADERS => (
                FLAG_END_STREAM | FLAG_END_HEADERS | FLAG_PADDED | FLAG_PRIORITY,
                client_stream,
            ),
            FRAME_PRIORITY => (0, self.stream_id != 0 && self.length == 5),
            FRAME_RST_STREAM => (0, self.stream_id != 0 && self.length == 4),
            FRAME_SETTINGS => (0x1, self.stream_id == 0 && self.length.is_multiple_of(6)),
            FRAME_PUSH_PROMISE => (FLAG_END_HEADERS | FLAG_PADDED, self.stream_id != 0),
            FRAME_PING => (0x1, self.stream_id == 0 && self.length == 8),
            FRAME_GOAWAY => (0, self.stream_id == 0 && self.length >= 8),
            FRAME_WINDOW_UPDATE => (0, self.length == 4),
            FRAME_CONTINUATION => (FLAG_END_HEADERS, client_stream),
            _ => return false,
        };
        fits && self.flags & !allowed_flags == 0
    }

    fn parse(bytes: &[u8]) -> Option<Self> {
        let header: &[u8; FRAME_HEADER_LEN] = bytes.get(..FRAME_HEADER_LEN)?.try_into().ok()?;
        let [l0, l1, l2, frame_type, flags, s0, s1, s2, s3] = *header;
        Some(Self {
            length: usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2),
            frame_type,
            flags,
            stream_id: u32::from_be_bytes([s0 & 0x7f, s1, s2, s3]),
        })
    }
}

/// Strips the PADDED flag's length byte and trailing padding.
fn unpad(flags: u8, payload: &[u8]) -> Result<&[u8], FrameError> {
    if flags & FLAG_PADDED == 0 {
        return Ok(payload);
    }
    let (&pad_len, rest) = payload.split_first().ok_or(FrameError::FrameTooShort)?;
    let data_len = rest
        .len()
        .checked_sub(usize::from(pad_len))
        .ok_or(FrameError::FrameTooShort)?;
    rest.get(..data_len).ok_or(FrameError::FrameTooShort)
}
