//! Decodes the gRPC calls of one HTTP/2 client connection (push → gateway): the method and
//! authority of each stream, its first request message decoded as a push call, the first response
//! message as per-user results, and the trailers.
//!
//! The calls are unary, so only the first message per direction and stream is read.

use bytes::Bytes;

use crate::model::Direction;

pub use super::grpc_fact::{BodyError, GrpcFact, RequestBody, ResponseBody};
use super::grpc_stream::{ReadMessage, StreamState, request_body_for_flag, response_body_for_flag};
use super::open_streams::OpenStreams;

use super::http2::{Http2Direction, MidStreamCounts, StreamEvent, Undecodable};
use super::protobuf::{self, PushCall, PushMethod};
use super::{DecodeCounters, HeaderText, Limits};
use crate::hpack::HeaderField;

/// Names the method of a call on a connection joined mid-stream whose `:path` referred to an HPACK
/// entry made before the join, and whose request has the shape of a batch push
/// (`OnlineBatchPushOneMsgReq`: `msgData` and recipients; `OnlinePushMsg`'s one recipient has
/// the same wire shape). It names no service: the package differs between releases.
pub const BATCH_PUSH_BY_SHAPE: &str = "(method unseen: a batch push by its shape)";

/// Decodes one push → gateway connection. Feed every `Data` event of the connection in order,
/// then call `finish` when the connection closes. A `Data` event marked `truncated` needs no
/// special care: the next event's offset shows the gap, and `finish` reports a cut at the end.
#[derive(Clone)]
pub struct GrpcConnectionDecoder {
    limits: Limits,
    send: Http2Direction,
    recv: Http2Direction,
    /// Set when the send side was not decodable from its start: nothing is reported then.
    connection_undecodable: bool,
    /// Adopted after it was established (`joined_mid_stream`).
    joined_mid_stream: bool,
    streams: OpenStreams<StreamState>,
    counters: DecodeCounters,
    events: Vec<StreamEvent>,
}

/// Shows state and counters only: the buffers hold message bodies.
impl std::fmt::Debug for GrpcConnectionDecoder {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("GrpcConnectionDecoder")
            .field("connection_undecodable", &self.connection_undecodable)
            .field("send_lost", &self.send.is_lost())
            .field("recv_lost", &self.recv.is_lost())
            .field("open_streams", &self.streams.len())
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl GrpcConnectionDecoder {
    /// Builds a decoder for a connection captured from its start.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            send: Http2Direction::new(Direction::Send, limits),
            recv: Http2Direction::new(Direction::Recv, limits),
            connection_undecodable: false,
            joined_mid_stream: false,
            streams: OpenStreams::default(),
            counters: DecodeCounters::default(),
            events: Vec::new(),
        }
    }

    /// Builds a decoder for a connection adopted after it was established: frames are found by
    /// their boundaries, header fields decoded where the HPACK table allows, and a call whose
    /// method is unseen is recognised as a push by its request's shape (`BATCH_PUSH_BY_SHAPE`).
    /// What cannot be attributed is counted (`DecodeCounters::mid_stream_*`).
    pub fn joined_mid_stream(limits: Limits) -> Self {
        Self {
            send: Http2Direction::joined_mid_stream(Direction::Send, limits),
            recv: Http2Direction::joined_mid_stream(Direction::Recv, limits),
            joined_mid_stream: true,
            ..Self::new(limits)
        }
    }

    fn update_mid_stream_counters(&mut self) {
        if !self.joined_mid_stream {
            return;
        }
        let send = self.send.mid_stream_counts();
        let recv = self.recv.mid_stream_counts();
        let sum = |field: fn(&MidStreamCounts) -> u64| field(&send) + field(&recv);
        self.counters.mid_stream_skipped_bytes = sum(|counts| counts.skipped_bytes);
        self.counters.mid_stream_unknown_header_fields = sum(|counts| counts.unknown_header_fields);
        self.counters.mid_stream_header_blocks_lost = sum(|counts| counts.header_blocks_lost);
    }

    /// Feeds one captured chunk that starts at stream position `offset` of `direction`, and
    /// appends the facts it completes to `facts`. The chunk is shared, not copied: DATA
    /// payloads whole in it are read as slices of it. `facts` is the caller's, reused from
    /// chunk to chunk: a list allocated per chunk and freed at once made the allocator take a
    /// fresh page and retire it again nearly every push call (9% of the engine's instructions
    /// on its worst-case bench).
    pub fn feed(
        &mut self,
        direction: Direction,
        offset: u64,
        payload: &Bytes,
        facts: &mut Vec<GrpcFact>,
    ) {
        if self.connection_undecodable {
            return;
        }
        let mut events = std::mem::take(&mut self.events);
        match direction {
            Direction::Send => self.send.feed(offset, payload, &mut events),
            Direction::Recv => self.recv.feed(offset, payload, &mut events),
        }
        self.handle_events(direction, &mut events, facts);
        self.events = events;
        self.update_mid_stream_counters();
    }

    /// Reports the end of the connection's capture: requests and responses still incomplete are
    /// appended to `facts` as cut.
    pub fn finish(&mut self, facts: &mut Vec<GrpcFact>) {
        if self.connection_undecodable {
            return;
        }
        let mut events = std::mem::take(&mut self.events);
        self.send.finish(&mut events);
        self.handle_events(Direction::Send, &mut events, facts);
        self.recv.finish(&mut events);
        self.handle_events(Direction::Recv, &mut events, facts);
        self.events = events;
        self.report_cut_requests(facts);
        self.report_cut_responses(facts);
        self.streams.clear();
    }

    /// Returns what went wrong or was cut on this connection so far.
    pub fn counters(&self) -> &DecodeCounters {
        &self.counters
    }

    /// Counts the heap bytes the decoder holds beyond its fixed size: both directions' buffers and
    /// HPACK tables, and the partial messages of open streams (at most `Limits::max_streams`).
    pub fn buffered_bytes(&self) -> usize {
        let streams: usize = self
            .streams
            .iter()
            .map(|(_, stream)| {
                stream.request.pending.capacity()
                    + stream.response.pending.capacity()
                    + stream.method.len()
                    + stream
                        .authority
                        .as_ref()
                        .map_or(0, |authority| authority.len())
            })
            .sum();
        self.send.buffered_bytes() + self.recv.buffered_bytes() + streams
    }

    fn handle_events(
        &mut self,
        direction: Direction,
        events: &mut Vec<StreamEvent>,
        facts: &mut Vec<GrpcFact>,
    ) {
        for event in events.drain(..) {
            match (direction, event) {
                (_, StreamEvent::Lost(reason)) => self.handle_lost(direction, reason, facts),
                (_, StreamEvent::Reset { stream_id }) => {
                    if let Some(mut stream) = self.streams.remove(stream_id) {
                        stream.report_request_at_end(stream_id, facts, &mut self.counters);
                    }
                }
                (
                    Direction::Send,
                    StreamEvent::Headers {
                        stream_id,
                        fields,
                        end_stream,
                    },
                ) => {
                    self.handle_request_headers(stream_id, &fields, end_stream, facts);
                }
                (
                    Direction::Send,
                    StreamEvent::Data {
                        stream_id,
                        data,
                        end_stream,
                    },
                ) => {
                    self.handle_request_data(stream_id, &data, facts);
                    if end_stream && let Some(stream) = self.streams.get_mut(stream_id) {
                        stream.report_request_at_end(stream_id, facts, &mut self.counters);
                    }
                    self.remove_if_done(stream_id);
                }
                (Direction::Send, StreamEvent::DataCut { stream_id, data }) => {
                    self.handle_request_data(stream_id, &data, facts);
                }
                (
                    Direction::Recv,
                    StreamEvent::Headers {
                        stream_id,
                        fields,
                        end_stream,
                    },
                ) => {
                    self.handle_response_headers(stream_id, &fields, end_stream, facts);
                }
                (
                    Direction::Recv,
                    StreamEvent::Data {
                        stream_id, data, ..
                    },
                )
                | (Direction::Recv, StreamEvent::DataCut { stream_id, data }) => {
                    self.handle_response_data(stream_id, &data, facts);
                }
            }
        }
    }

    fn handle_lost(
        &mut self,
        direction: Direction,
        reason: Undecodable,
        facts: &mut Vec<GrpcFact>,
    ) {
        match &reason {
            Undecodable::JoinedMidStream { .. } => self.counters.undecodable_joined_mid_stream += 1,
            Undecodable::NoClientPreface => self.counters.undecodable_no_client_preface += 1,
            Undecodable::Gap { .. } => self.counters.lost_sync_gap += 1,
            Undecodable::BufferOverflow { .. } => self.counters.buffer_overflow += 1,
            Undecodable::Framing { .. } => self.counters.http2_failures += 1,
            Undecodable::Hpack { .. } => self.counters.hpack_failures += 1,
        }
        let joined_late = matches!(
            reason,
            Undecodable::JoinedMidStream { .. } | Undecodable::NoClientPreface
        );
        if direction == Direction::Send && joined_late && self.streams.is_empty() {
            self.connection_undecodable = true;
        }
        facts.push(GrpcFact::Undecodable(reason));
        match direction {
            Direction::Send => self.report_cut_requests(facts),
            Direction::Recv => self.report_cut_responses(facts),
        }
    }

    fn handle_request_headers(
        &mut self,
        stream_id: u32,
        fields: &[HeaderField],
        end_stream: bool,
        facts: &mut Vec<GrpcFact>,
    ) {
        if !self.streams.contains(stream_id) {
            let authority = header_text(fields, ":authority");
            let stream = match header_text(fields, ":path") {
                Some(method) => StreamState::new(method, authority),
                None if self.joined_mid_stream => StreamState::unnamed(authority),
                None => {
                    self.counters.grpc_failures += 1;
                    return;
                }
            };
            if self.streams.len() >= self.limits.max_streams {
                self.counters.streams_over_limit += 1;
                return;
            }
            // A stream whose method is unseen or unknown waits for its first message to say.
            if stream.push_method.is_none() && !stream.awaits_shape {
                facts.push(stream.request_fact(stream_id, RequestBody::OtherMethod));
            }
            self.streams.insert(stream_id, stream);
        }
        if end_stream && let Some(stream) = self.streams.get_mut(stream_id) {
            stream.report_request_at_end(stream_id, facts, &mut self.counters);
        }
        self.remove_if_done(stream_id);
    }

    fn handle_request_data(&mut self, stream_id: u32, data: &Bytes, facts: &mut Vec<GrpcFact>) {
        let cap = self.message_cap(Direction::Send, stream_id);
        let Some(stream) = self.streams.get_mut(stream_id) else {
            if self.joined_mid_stream {
                // A call already under way when the connection was adopted.
                self.counters.mid_stream_unattributed_frames += 1;
            }
            return;
        };
        if stream.request_reported {
            return;
        }
        match stream.request.push(data, cap) {
            Some(ReadMessage::Complete { flag, body }) => {
                let body = match (flag, stream.push_method) {
                    (0, Some(method)) => match protobuf::decode_request(method, &body) {
                        Ok(call) => RequestBody::Push(call),
                        Err(error) => {
                            self.counters.protobuf_failures += 1;
                            RequestBody::Malformed(error.into())
                        }
                    },
                    (0, None) if stream.awaits_shape => match push_by_shape(&body) {
                        Some(call) => {
                            self.counters.calls_recognised_by_shape += 1;
                            if stream.method.is_empty() {
                                stream.method = HeaderText::from_static(BATCH_PUSH_BY_SHAPE);
                            }
                            stream.push_method = Some(PushMethod::Batch);
                            stream.by_shape = true;
                            RequestBody::Push(call)
                        }
                        None => {
                            stream.response.done = true;
                            RequestBody::OtherMethod
                        }
                    },
                    _ => request_body_for_flag(flag, &mut self.counters),
                };
                stream.report_request(stream_id, body, facts);
            }
            Some(ReadMessage::Cut) => {
                self.counters.buffer_overflow += 1;
                stream.report_request_cut(stream_id, facts, &mut self.counters);
            }
            None => {}
        }
    }

    fn handle_response_headers(
        &mut self,
        stream_id: u32,
        fields: &[HeaderField],
        end_stream: bool,
        facts: &mut Vec<GrpcFact>,
    ) {
        let Some(stream) = self.streams.get_mut(stream_id) else {
            return;
        };
        if let Some(status) = header_text(fields, ":status") {
            stream.http_status = status.parse().ok();
        }
        let grpc_status = header_text(fields, "grpc-status");
        if grpc_status.is_some() || end_stream {
            facts.push(GrpcFact::Trailers {
                stream_id,
                grpc_status: grpc_status.and_then(|status| status.parse().ok()),
                grpc_message: header_text(fields, "grpc-message")
                    .map(|message| message.to_string()),
            });
        }
        if end_stream {
            if stream.response.has_partial_message() {
                self.counters.grpc_failures += 1;
                let body = ResponseBody::Malformed(BodyError::EndedInsideMessage);
                stream.report_response(stream_id, body, facts);
            }
            stream.response.done = true;
            stream.response_ended = true;
        }
        self.remove_if_done(stream_id);
    }

    fn handle_response_data(&mut self, stream_id: u32, data: &Bytes, facts: &mut Vec<GrpcFact>) {
        let cap = self.message_cap(Direction::Recv, stream_id);
        let Some(stream) = self.streams.get_mut(stream_id) else {
            return;
        };
        let Some(method) = stream.push_method else {
            return;
        };
        let by_shape = stream.by_shape;
        match stream.response.push(data, cap) {
            Some(ReadMessage::Complete { flag: 0, body }) => {
                let decoded = protobuf::decode_response(method, &body).or_else(|error| {
                    // Recognised by shape: `OnlinePushMsg`'s answer has another shape.
                    if by_shape {
                        protobuf::decode_response(PushMethod::Single, &body)
                    } else {
                        Err(error)
                    }
                });
                let body = match decoded {
                    Ok(results) => ResponseBody::Push {
                        results,
                        truncated: false,
                    },
                    Err(error) => {
                        self.counters.protobuf_failures += 1;
                        ResponseBody::Malformed(error.into())
                    }
                };
                stream.report_response(stream_id, body, facts);
            }
            Some(ReadMessage::Complete { flag, .. }) => {
                let body = response_body_for_flag(flag, &mut self.counters);
                stream.report_response(stream_id, body, facts);
            }
            Some(ReadMessage::Cut) => {
                self.counters.buffer_overflow += 1;
                stream.report_response_cut(stream_id, facts, &mut self.counters);
            }
            None => {}
        }
    }

    /// Reports every request not yet reported as cut: the capture lost the rest of the send side.
    fn report_cut_requests(&mut self, facts: &mut Vec<GrpcFact>) {
        for (stream_id, stream) in self.streams.iter_mut() {
            if !stream.request_reported {
                stream.report_request_cut(stream_id, facts, &mut self.counters);
            }
        }
    }

    fn report_cut_responses(&mut self, facts: &mut Vec<GrpcFact>) {
        for (stream_id, stream) in self.streams.iter_mut() {
            if stream.response.has_partial_message() {
                stream.report_response_cut(stream_id, facts, &mut self.counters);
            }
            stream.response.done = true;
        }
    }

    fn remove_if_done(&mut self, stream_id: u32) {
        if self
            .streams
            .get(stream_id)
            .is_some_and(|stream| stream.request_reported && stream.response_ended)
        {
            self.streams.remove(stream_id);
        }
    }

    /// Returns how many bytes `stream_id`'s message in `direction` may hold: what is left of the
    /// direction's buffer budget after the frame buffer's worst case and the other streams.
    fn message_cap(&self, direction: Direction, stream_id: u32) -> usize {
        let others: usize = self
            .streams
            .iter()
            .filter(|(id, _)| *id != stream_id)
            .map(|(_, stream)| match direction {
                Direction::Send => stream.request.pending.len(),
                Direction::Recv => stream.response.pending.len(),
            })
            .sum();
        self.limits.max_buffered_bytes.saturating_sub(others)
    }
}

/// Reads a request message of a call whose method was not seen, as a push if it has the shape
/// of one: a `msgData` with identifying fields and at least one recipient.
fn push_by_shape(body: &[u8]) -> Option<PushCall> {
    protobuf::decode_request(PushMethod::Batch, body)
        .ok()
        .filter(|call| !call.recipients.is_empty() && call.message != Default::default())
}

/// Returns the value of header `name` as text that shares its decoded bytes (repaired into a copy
/// when not UTF-8): what a stream keeps (its `:path` and `:authority`) costs no copy, and the
/// status headers are only parsed.
fn header_text(fields: &[HeaderField], name: &str) -> Option<HeaderText> {
    let field = fields.iter().find(|field| field.name == name.as_bytes())?;
    Some(HeaderText::new(&field.value))
}

#[cfg(test)]
mod tests;
