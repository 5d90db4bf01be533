//! Decodes the captured bytes: turns one connection's per-direction chunks into facts.
//!
//! - `http1`: the proxy's WebSocket upgrade (gateway port 80) and the gateway's answer.
//! - `http2` + `hpack`: HTTP/2 framing and header decompression of push's gRPC connections
//!   (gateway port 88).
//! - `grpc`: gRPC messages inside HTTP/2 DATA, decoded with `protobuf` into push calls and results
//!   (`protobuf_wire` walks their wire format).
//!
//! A correlation engine keeps one decoder per connection id (`WebSocketDecoder` or
//! `GrpcConnectionDecoder`) and feeds it every `Data` event in order. No decoder panics on any
//! input, and each bounds what it buffers by `Limits`; what can't be decoded is reported, never
//! guessed.

pub mod grpc;
mod grpc_fact;
mod grpc_stream;
mod header_text;
pub mod http1;
pub mod http2;
mod open_streams;
pub mod protobuf;
mod protobuf_wire;
#[cfg(test)]
pub(crate) mod test_streams;

pub use grpc::{BodyError, GrpcConnectionDecoder, GrpcFact, RequestBody, ResponseBody};
pub use header_text::HeaderText;
pub use http1::{Http1Error, UpgradeRequest, WebSocketDecoder, WebSocketFact};
pub use http2::Undecodable;
pub use protobuf::PushCall;

/// Bounds the memory of one connection's decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes buffered per direction, once for an incomplete HTTP/2 frame and once for the
    /// incomplete gRPC messages of all streams. A frame that needs more loses the direction; a
    /// message that needs more is reported as cut. Buffers never grow past it.
    pub max_buffered_bytes: usize,
    /// A header block, CONTINUATIONs included, and its decoded header list.
    pub max_header_block_bytes: usize,
    /// The largest HPACK dynamic table a peer may ask for. The peer's SETTINGS are not
    /// followed, so this is a cap, not the negotiated size.
    pub max_dynamic_table_size: usize,
    /// Streams tracked at once on one connection; more are counted and ignored.
    pub max_streams: usize,
    /// An HTTP/1.1 request or response head (the upgrade request is at most 4 KiB captured).
    pub max_http1_head_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_buffered_bytes: 1 << 20,
            max_header_block_bytes: 64 << 10,
            max_dynamic_table_size: 64 << 10,
            max_streams: 64,
            max_http1_head_bytes: 16 << 10,
        }
    }
}

/// Counts what went wrong or was cut, per decoder; `add` sums decoders for a global view.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DecodeCounters {
    /// The first captured byte of a direction was not stream position 0.
    pub undecodable_joined_mid_stream: u64,
    /// The send side started at position 0 but not with the HTTP/2 client preface.
    pub undecodable_no_client_preface: u64,
    /// A direction skipped bytes (capture budget) and lost sync from there on.
    pub lost_sync_gap: u64,
    /// A direction needed more than `Limits::max_buffered_bytes`.
    pub buffer_overflow: u64,
    /// Streams beyond `Limits::max_streams`, ignored.
    pub streams_over_limit: u64,
    /// Push calls reported with `recipients_truncated`.
    pub truncated_calls: u64,
    /// gRPC messages with the compressed flag, reported but not parsed.
    pub compressed_messages: u64,
    pub http1_failures: u64,
    pub http2_failures: u64,
    pub hpack_failures: u64,
    pub grpc_failures: u64,
    pub protobuf_failures: u64,
    /// Connections adopted at start (joined mid-stream): bytes before the first frame boundary.
    pub mid_stream_skipped_bytes: u64,
    /// … header fields that referred to HPACK entries made before the join.
    pub mid_stream_unknown_header_fields: u64,
    /// … header blocks that could not be decoded (the HPACK table starts over after one).
    pub mid_stream_header_blocks_lost: u64,
    /// … DATA frames of calls already under way at the join, not attributed to any call.
    pub mid_stream_unattributed_frames: u64,
    /// Calls whose method was not seen, recognised as pushes by their request's shape.
    pub calls_recognised_by_shape: u64,
}

impl DecodeCounters {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &DecodeCounters) {
        self.undecodable_joined_mid_stream += other.undecodable_joined_mid_stream;
        self.undecodable_no_client_preface += other.undecodable_no_client_preface;
        self.lost_sync_gap += other.lost_sync_gap;
        self.buffer_overflow += other.buffer_overflow;
        self.streams_over_limit += other.streams_over_limit;
        self.truncated_calls += other.truncated_calls;
        self.compressed_messages += other.compressed_messages;
        self.http1_failures += other.http1_failures;
        self.http2_failures += other.http2_failures;
        self.hpack_failures += other.hpack_failures;
        self.grpc_failures += other.grpc_failures;
        self.protobuf_failures += other.protobuf_failures;
        self.mid_stream_skipped_bytes += other.mid_stream_skipped_bytes;
        self.mid_stream_unknown_header_fields += other.mid_stream_unknown_header_fields;
        self.mid_stream_header_blocks_lost += other.mid_stream_header_blocks_lost;
        self.mid_stream_unattributed_frames += other.mid_stream_unattributed_frames;
        self.calls_recognised_by_shape += other.calls_recognised_by_shape;
    }
}
