//! Tracks one stream of a gRPC connection: its call, and the first message of each direction as
//! it is reassembled (`MessageReader`) and reported as a `GrpcFact`.

use bytes::Bytes;

use super::grpc_fact::{BodyError, GrpcFact, RequestBody, ResponseBody};
use super::protobuf::{self, PathKind, PushMethod};
use super::{DecodeCounters, HeaderText};

/// Counts the bytes of a message header: 1 byte compressed flag and 4 bytes big-endian length.
const MESSAGE_HEADER_LEN: usize = 5;

/// Describes a first request message that is not decoded as a push call by its compressed flag: an
/// uncompressed one (0) belongs to another method, 1 is compressed, anything else malformed.
pub(super) fn request_body_for_flag(flag: u8, counters: &mut DecodeCounters) -> RequestBody {
    match flag {
        0 => RequestBody::OtherMethod,
        1 => {
            counters.compressed_messages += 1;
            RequestBody::Compressed
        }
        other => {
            counters.grpc_failures += 1;
            RequestBody::Malformed(BodyError::InvalidCompressedFlag(other))
        }
    }
}

/// Describes a first response message that is not decoded by its compressed flag: 1 is compressed,
/// anything else malformed (an uncompressed answer to a push call is decoded instead).
pub(super) fn response_body_for_flag(flag: u8, counters: &mut DecodeCounters) -> ResponseBody {
    if flag == 1 {
        counters.compressed_messages += 1;
        ResponseBody::Compressed
    } else {
        counters.grpc_failures += 1;
        ResponseBody::Malformed(BodyError::InvalidCompressedFlag(flag))
    }
}

/// Tracks one stream of a gRPC connection: its call, and the first message of each direction.
#[derive(Clone)]
pub(super) struct StreamState {
    pub(super) method: HeaderText,
    pub(super) authority: Option<HeaderText>,
    pub(super) push_method: Option<PushMethod>,
    /// The method is not known: the first request message decides by its shape.
    pub(super) awaits_shape: bool,
    /// Recognised as a push by its request's shape: the answer may have either push shape.
    pub(super) by_shape: bool,
    pub(super) request: MessageReader,
    pub(super) request_reported: bool,
    pub(super) http_status: Option<u16>,
    pub(super) response: MessageReader,
    pub(super) response_ended: bool,
}

impl StreamState {
    /// Starts a stream of a call to `method` (its `:path`): a push, another method, or unknown.
    pub(super) fn new(method: HeaderText, authority: Option<HeaderText>) -> Self {
        let kind = PushMethod::classify(&method);
        let (push_method, awaits_shape) = match kind {
            PathKind::Push(push) => (Some(push), false),
            PathKind::Other => (None, false),
            PathKind::Unknown => (None, true),
        };
        let skipped = kind == PathKind::Other;
        Self {
            push_method,
            awaits_shape,
            by_shape: false,
            request_reported: skipped,
            response: MessageReader {
                done: skipped,
                ..MessageReader::default()
            },
            method,
            authority,
            request: MessageReader::default(),
            http_status: None,
            response_ended: false,
        }
    }

    /// Starts a call on a connection joined mid-stream whose `:path` is unknown: its first request
    /// message decides (`push_by_shape`).
    pub(super) fn unnamed(authority: Option<HeaderText>) -> Self {
        Self {
            method: HeaderText::default(),
            authority,
            push_method: None,
            awaits_shape: true,
            by_shape: false,
            request: MessageReader::default(),
            request_reported: false,
            http_status: None,
            response: MessageReader::default(),
            response_ended: false,
        }
    }

    /// Builds the stream's request fact with `body`.
    pub(super) fn request_fact(&self, stream_id: u32, body: RequestBody) -> GrpcFact {
        GrpcFact::Request {
            stream_id,
            method: self.method.clone(),
            authority: self.authority.clone(),
            body,
        }
    }

    /// Reports the request's first message with `body`; later bytes of the request are ignored.
    pub(super) fn report_request(
        &mut self,
        stream_id: u32,
        body: RequestBody,
        facts: &mut Vec<GrpcFact>,
    ) {
        self.request_reported = true;
        self.request.done = true;
        self.request.pending = Vec::new();
        facts.push(self.request_fact(stream_id, body));
    }

    /// Reports a request stream that ended (END_STREAM or RST_STREAM) before its first message was
    /// whole.
    pub(super) fn report_request_at_end(
        &mut self,
        stream_id: u32,
        facts: &mut Vec<GrpcFact>,
        counters: &mut DecodeCounters,
    ) {
        if self.request_reported {
            return;
        }
        let body = if self.request.pending.is_empty() {
            RequestBody::Missing
        } else {
            counters.grpc_failures += 1;
            RequestBody::Malformed(BodyError::EndedInsideMessage)
        };
        self.report_request(stream_id, body, facts);
    }

    /// Reports a request the capture ended inside of: what its captured prefix says for sure.
    pub(super) fn report_request_cut(
        &mut self,
        stream_id: u32,
        facts: &mut Vec<GrpcFact>,
        counters: &mut DecodeCounters,
    ) {
        let Some(method) = self.push_method else {
            return;
        };
        let body = match self.request.header() {
            Some((1, _)) => request_body_for_flag(1, counters),
            Some((0, _)) | None => {
                let prefix = self.request.take_body();
                match protobuf::decode_request_prefix(method, &prefix) {
                    Ok(call) => {
                        counters.truncated_calls += 1;
                        RequestBody::Push(call)
                    }
                    Err(error) => {
                        counters.protobuf_failures += 1;
                        RequestBody::Malformed(error.into())
                    }
                }
            }
            Some((flag, _)) => request_body_for_flag(flag, counters),
        };
        self.report_request(stream_id, body, facts);
    }

    /// Reports the first response message of the stream; later bytes of it are ignored.
    pub(super) fn report_response(
        &mut self,
        stream_id: u32,
        body: ResponseBody,
        facts: &mut Vec<GrpcFact>,
    ) {
        self.response.done = true;
        self.response.pending = Vec::new();
        facts.push(GrpcFact::Response {
            stream_id,
            http_status: self.http_status,
            body,
        });
    }

    /// Reports a push call's first response message cut where the capture ended: the users whose
    /// entries are complete.
    pub(super) fn report_response_cut(
        &mut self,
        stream_id: u32,
        facts: &mut Vec<GrpcFact>,
        counters: &mut DecodeCounters,
    ) {
        let Some(method) = self.push_method else {
            return;
        };
        let body = match self.response.header() {
            Some((0, _)) | None => {
                let prefix = self.response.take_body();
                match protobuf::decode_response_prefix(method, &prefix) {
                    Ok(results) => ResponseBody::Push {
                        results,
                        truncated: true,
                    },
                    Err(error) => {
                        counters.protobuf_failures += 1;
                        ResponseBody::Malformed(error.into())
                    }
                }
            }
            Some((flag, _)) => response_body_for_flag(flag, counters),
        };
        self.report_response(stream_id, body, facts);
    }
}

/// Says what reading a DATA frame gave: the first message whole, or cut.
pub(super) enum ReadMessage {
    /// A whole message: a slice of the DATA frame that held it all, or reassembled.
    Complete { flag: u8, body: Bytes },
    /// The message outgrew the byte budget: read what `pending` holds as a cut message.
    Cut,
}

/// Reassembles the first gRPC message of one direction of a stream.
#[derive(Clone, Default)]
pub(super) struct MessageReader {
    /// The message header and body bytes read so far.
    pub(super) pending: Vec<u8>,
    /// The first message was reported (or is not wanted): later bytes are ignored.
    pub(super) done: bool,
}

impl MessageReader {
    /// Adds a DATA frame's payload to the first message, within `cap` bytes; returns the message
    /// once whole, or cut past the cap.
    pub(super) fn push(&mut self, frame: &Bytes, cap: usize) -> Option<ReadMessage> {
        if self.done {
            return None;
        }
        // Nearly every push message comes whole in one DATA frame: it is read where it lies,
        // not copied into `pending` and out again.
        if self.pending.is_empty()
            && let Some((flag, length)) = message_header(frame)
            && let Some(end) = MESSAGE_HEADER_LEN.checked_add(length)
            && end <= cap
            && end <= frame.len()
        {
            self.done = true;
            return Some(ReadMessage::Complete {
                flag,
                body: frame.slice(MESSAGE_HEADER_LEN..end),
            });
        }
        let mut data: &[u8] = frame;
        loop {
            if let Some((flag, length)) = self.header()
                && self.body().len() >= length
            {
                self.done = true;
                return Some(ReadMessage::Complete {
                    flag,
                    body: self.take_body().slice(..length),
                });
            }
            if data.is_empty() {
                return None;
            }
            let target = match self.header() {
                Some((_, length)) => MESSAGE_HEADER_LEN.saturating_add(length),
                None => MESSAGE_HEADER_LEN,
            };
            let room = cap.saturating_sub(self.pending.len());
            if room == 0 {
                self.done = true;
                return Some(ReadMessage::Cut);
            }
            let take = target
                .saturating_sub(self.pending.len())
                .min(data.len())
                .min(room);
            let (taken, rest) = data.split_at(take);
            self.pending.extend_from_slice(taken);
            data = rest;
        }
    }

    fn header(&self) -> Option<(u8, usize)> {
        message_header(&self.pending)
    }

    fn body(&self) -> &[u8] {
        self.pending.get(MESSAGE_HEADER_LEN..).unwrap_or_default()
    }

    /// Takes the body read so far out of `pending` without a copy (the message is reported
    /// from it, so `pending` is done with).
    fn take_body(&mut self) -> Bytes {
        let pending = Bytes::from(std::mem::take(&mut self.pending));
        pending.slice(MESSAGE_HEADER_LEN.min(pending.len())..)
    }

    /// Says whether part of a first message is held, not yet reported.
    pub(super) fn has_partial_message(&self) -> bool {
        !self.done && !self.pending.is_empty()
    }
}

/// Reads a gRPC message's compression flag and length from the 5 bytes that precede its body.
fn message_header(bytes: &[u8]) -> Option<(u8, usize)> {
    let [flag, l0, l1, l2, l3] = *bytes.first_chunk::<MESSAGE_HEADER_LEN>()?;
    let length = usize::try_from(u32::from_be_bytes([l0, l1, l2, l3])).ok()?;
    Some((flag, length))
}
