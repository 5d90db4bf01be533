//! Reads the protobuf messages of the gateway's push methods by walking their wire format.
//!
//! Only the fields an alert reads are read: the recipients, each user's answer, and in
//! `MsgData` (declared with `prost`) the fields that identify a message. `MsgData`'s field 12
//! (`content`, the private message body) is deliberately absent, and so are the sender, the
//! group and the rest no alert reads: undeclared fields are skipped, so they are never decoded,
//! copied into a field, or printable.
//!
//! The recipient lists and answers are walked (`protobuf_wire`) rather than decoded into `prost`
//! messages: a worst-case batch carries forty users each way, and `prost` would allocate a
//! vector of intermediate values (or, for `Bytes`, take a reference count) per user before the
//! ids are checked and copied; walked, a round of the engine bench takes 9-10% fewer
//! instructions. The walk reads the same fields with the same rules (a declared field of
//! another wire type is an error, a repeated scalar's last value wins, a repeated message
//! merges), which the `protobuf` fuzz target checks against `prost` on arbitrary bytes.
//!
//! A request cut by the capture budget is read over its complete prefix: protobuf fields are
//! self-delimiting, so the fields that end before the cut form a valid message on their own.

use prost::Message;

pub use super::protobuf_wire::ProtobufError;
use super::protobuf_wire::{Fields, split_complete_fields};
use crate::model::{MessageIds, PlatformResult, UserId, UserResult, wire};

/// Holds the fields of OpenIM's `MsgData` that identify a message.
#[derive(Clone, PartialEq, Message)]
pub struct MsgData {
    #[prost(string, tag = "4")]
    pub client_msg_id: String,
    #[prost(string, tag = "5")]
    pub server_msg_id: String,
    #[prost(int32, tag = "9")]
    pub session_type: i32,
    #[prost(int64, tag = "14")]
    pub seq: i64,
}

/// Names the gateway methods whose bodies are decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushMethod {
    /// `SuperGroupOnlineBatchPushOneMsg` and `OnlineBatchPushOneMsg`.
    Batch,
    /// `OnlinePushMsg`: one recipient.
    Single,
}

/// Describes what a call's `:path` says about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathKind {
    /// A push method, whatever the package its service is in.
    Push(PushMethod),
    /// A method known to carry no push.
    Other,
    /// A method this observer does not know: its first request message decides, by its shape.
    Unknown,
}

impl PushMethod {
    /// Names the service OpenIM 3.5 and 3.6 call (protocol package `OpenIMServer.msggateway`).
    pub const SERVICE_V35: &str = "OpenIMServer.msggateway.msgGateway";
    /// Names the service OpenIM 3.7 and later call (the package was renamed in protocol v0.0.58).
    pub const SERVICE_V37: &str = "openim.msggateway.msgGateway";
    /// Names the methods of the gateway's service that carry no push.
    const OTHER_GATEWAY_METHODS: [&str; 3] = [
        "GetUsersOnlineStatus",
        "KickUserOffline",
        "MultiTerminalLoginCheck",
    ];

    /// Classifies a `:path` by its method's name, so that both package names (and a future
    /// rename of the package) are read; gRPC's own services (`grpc.*`) carry no push.
    pub fn classify(path: &str) -> PathKind {
        let Some((service, method)) = path.strip_prefix('/').and_then(|path| path.split_once('/'))
        else {
            return PathKind::Unknown;
        };
        match method {
            "SuperGroupOnlineBatchPushOneMsg" | "OnlineBatchPushOneMsg" => {
                PathKind::Push(Self::Batch)
            }
            "OnlinePushMsg" => PathKind::Push(Self::Single),
            _ if Self::OTHER_GATEWAY_METHODS.contains(&method) || service.starts_with("grpc.") => {
                PathKind::Other
            }
            _ => PathKind::Unknown,
        }
    }

    /// Returns the push method a `:path` names, if it names one.
    pub fn from_path(path: &str) -> Option<Self> {
        match Self::classify(path) {
            PathKind::Push(method) => Some(method),
            PathKind::Other | PathKind::Unknown => None,
        }
    }
}

/// Returns the service part of a gRPC `:path` (`/service/method`), if it has one.
pub fn service_of(path: &str) -> Option<&str> {
    let (service, _) = path.strip_prefix('/')?.split_once('/')?;
    (!service.is_empty()).then_some(service)
}

/// Takes `MsgData`'s identifying fields, absent when empty or zero (never its content).
impl From<MsgData> for MessageIds {
    fn from(data: MsgData) -> Self {
        let text = |value: String| (!value.is_empty()).then(|| value.into());
        Self {
            client_msg_id: text(data.client_msg_id),
            server_msg_id: text(data.server_msg_id),
            seq: (data.seq != 0).then_some(data.seq),
            session_type: (data.session_type != 0).then_some(data.session_type),
        }
    }
}

/// Describes a push request: which message, to whom.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PushCall {
    pub message: MessageIds,
    /// The capture ended inside `msgData`: only its fields before the cut are in `message`.
    pub message_truncated: bool,
    pub recipients: Vec<UserId>,
    /// The capture ended inside the request: more recipients may have followed those listed.
    pub recipients_truncated: bool,
}

/// Reads a user id from the wire: checked as UTF-8 (as prost checks a `string`), held inline when
/// it is short, as OpenIM's ids are.
fn user_id(bytes: &[u8]) -> Result<UserId, ProtobufError> {
    wire::utf8(bytes)
        .map(UserId::new)
        .map_err(|_| ProtobufError::UserIdNotUtf8)
}

/// Decodes a whole request.
///
/// # Errors
///
/// Fails with a [`ProtobufError`] when the bytes are not valid wire format (or hold a group), a
/// field has another wire type than its declaration, or a recipient id is not UTF-8.
pub fn decode_request(method: PushMethod, message: &[u8]) -> Result<PushCall, ProtobufError> {
    let mut msg_data: Option<MsgData> = None;
    let mut recipients = Vec::new();
    // `OnlinePushMsgReq.pushToUserID` is a single string: its last value wins.
    let mut single_recipient: &[u8] = &[];
    for field in Fields::of(message) {
        match field? {
            (1, value) => msg_data
                .get_or_insert_default()
                .merge(value.delimited(1)?)?,
            (2, value) => {
                let id = value.delimited(2)?;
                match method {
                    PushMethod::Batch => recipients.push(user_id(id)?),
                    PushMethod::Single => single_recipient = id,
                }
            }
            _ => {}
        }
    }
    if !single_recipient.is_empty() {
        recipients.push(user_id(single_recipient)?);
    }
    Ok(PushCall {
        message: msg_data.map(MessageIds::from).unwrap_or_default(),
        message_truncated: false,
        recipients,
        recipients_truncated: false,
    })
}

/// Reads what a request's captured `prefix` says for sure: complete fields, and the complete
/// fields of a `msgData` the cut fell into.
///
/// # Errors
///
/// Fails as [`decode_request`] does, on the complete fields of the prefix and of a cut `msgData`.
pub fn decode_request_prefix(method: PushMethod, prefix: &[u8]) -> Result<PushCall, ProtobufError> {
    let split = split_complete_fields(prefix)?;
    let mut call = decode_request(method, split.complete)?;
    call.recipients_truncated = true;
    if let Some(cut) = split
        .cut_length_delimited
        .filter(|cut| cut.field_number == 1)
    {
        call.message_truncated = true;
        let inner = split_complete_fields(cut.partial_value)?;
        call.message = MsgData::decode(inner.complete)?.into();
    } else if call.message == MessageIds::default() {
        // Cut before or inside msgData's tag/length: nothing known of the message.
        call.message_truncated = true;
    }
    Ok(call)
}

/// Decodes a whole answer.
///
/// # Errors
///
/// Fails with a [`ProtobufError`] when the bytes are not valid wire format (or hold a group), a
/// field has another wire type than its declaration, or a user id is not UTF-8.
pub fn decode_response(
    method: PushMethod,
    message: &[u8],
) -> Result<Vec<UserResult>, ProtobufError> {
    let mut results: Vec<UserResult> = Vec::new();
    for field in Fields::of(message) {
        let (1, value) = field? else {
            continue;
        };
        let entry = value.delimited(1)?;
        match method {
            PushMethod::Batch => results.push(user_results(entry)?),
            // `OnlinePushMsgResp` lists platform results with their user (`RecvID`) and no
            // `onlinePush` flag: group by user, delivered when any platform reports 0.
            PushMethod::Single => {
                let (recv_id, platform) = platform_result(entry)?;
                let index = match results.iter().position(|r| r.user_id.as_bytes() == recv_id) {
                    Some(index) => index,
                    None => {
                        results.push(UserResult {
                            user_id: user_id(recv_id)?,
                            ..UserResult::default()
                        });
                        results.len() - 1
                    }
                };
                if let Some(result) = results.get_mut(index) {
                    result.online_push |= platform.result_code == 0;
                    result.platforms.push(platform);
                }
            }
        }
    }
    Ok(results)
}

/// Decodes a `SingleMsgToUserResults`: 1 `userID`, 2 each platform's result, 3 `onlinePush`.
fn user_results(entry: &[u8]) -> Result<UserResult, ProtobufError> {
    let mut id: &[u8] = &[];
    let mut platforms = Vec::new();
    let mut online_push = false;
    for field in Fields::of(entry) {
        match field? {
            (1, value) => id = value.delimited(1)?,
            // The platform's `recvID` repeats the entry's `userID`: not read.
            (2, value) => platforms.push(platform_result(value.delimited(2)?)?.1),
            (3, value) => online_push = value.varint(3)? != 0,
            _ => {}
        }
    }
    Ok(UserResult {
        user_id: user_id(id)?,
        online_push,
        platforms,
    })
}

/// Decodes a `SingleMsgToUserPlatform`: 1 `ResultCode` (int64), 2 `RecvID`, 3 `RecvPlatFormID`
/// (int32).
fn platform_result(message: &[u8]) -> Result<(&[u8], PlatformResult), ProtobufError> {
    let mut recv_id: &[u8] = &[];
    let mut platform = PlatformResult::default();
    for field in Fields::of(message) {
        match field? {
            // As protobuf reads int64 and int32 varints: two's complement, truncated.
            (1, value) => platform.result_code = value.varint(1)? as i64,
            (2, value) => recv_id = value.delimited(2)?,
            (3, value) => platform.platform_id = value.varint(3)? as i32,
            _ => {}
        }
    }
    Ok((recv_id, platform))
}

/// Decodes the results of the users whose entries end before the cut.
///
/// # Errors
///
/// Fails as [`decode_response`] does, on the entries that end before the cut.
pub fn decode_response_prefix(
    method: PushMethod,
    prefix: &[u8],
) -> Result<Vec<UserResult>, ProtobufError> {
    decode_response(method, split_complete_fields(prefix)?.complete)
}

#[cfg(test)]
pub(crate) mod tests;
