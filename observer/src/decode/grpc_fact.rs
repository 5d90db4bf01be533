//! Defines [`GrpcFact`], what [`super::grpc::GrpcConnectionDecoder`] reports of a push
//! connection (calls, answers, trailers), with the bodies it decoded or why it could not.

use crate::model::UserResult;

use super::HeaderText;
use super::http2::Undecodable;
use super::protobuf::{ProtobufError, PushCall};

/// Records what a push connection's decoder found: a call, its answer, its trailers, or where
/// decoding stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GrpcFact {
    /// A call and its request body. Reported once per stream, when its first message is
    /// complete or the capture lost it.
    Request {
        stream_id: u32,
        method: HeaderText,
        authority: Option<HeaderText>,
        body: RequestBody,
    },
    /// The first response message of a push call.
    Response {
        stream_id: u32,
        http_status: Option<u16>,
        body: ResponseBody,
    },
    Trailers {
        stream_id: u32,
        grpc_status: Option<i32>,
        grpc_message: Option<String>,
    },
    /// The connection (send side cut or not HTTP/2 from its start) or one direction stops
    /// decoding here; facts reported before stay valid.
    Undecodable(Undecodable),
}

/// Says what a call's first request message held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestBody {
    /// A push method's request: complete, or what the captured prefix says for sure (see
    /// `PushCall::recipients_truncated`).
    Push(PushCall),
    /// Not a push method: the body is not read.
    OtherMethod,
    /// The message has the compressed flag: it can't be read without the codec.
    Compressed,
    /// The request stream ended without a message.
    Missing,
    Malformed(BodyError),
}

/// Says what the first response message of a push call held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResponseBody {
    /// Per-user results; `truncated` when the capture ended inside the message and only the
    /// users whose entries are complete are listed.
    Push {
        results: Vec<UserResult>,
        truncated: bool,
    },
    Compressed,
    Malformed(BodyError),
}

/// Says why a message body could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("protobuf: {0}")]
    Protobuf(#[from] ProtobufError),
    #[error("gRPC compressed flag {0} is neither 0 nor 1")]
    InvalidCompressedFlag(u8),
    #[error("stream ended inside a gRPC message")]
    EndedInsideMessage,
}
