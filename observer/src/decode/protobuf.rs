//! The protobuf messages of the gateway's push methods, declared by hand with `prost`.
//!
//! `MsgData` declares only the fields that identify a message in an alert. Its field 12
//! (`content`, the private message body) is deliberately absent, and so are the sender, the
//! group and the rest no alert reads: prost skips undeclared fields, so they are never decoded,
//! copied into a field, or printable (and three strings a call are not allocated).
//!
//! A request cut by the capture budget is read over its complete prefix: protobuf fields are
//! self-delimiting, so the fields that end before the cut form a valid message on their own.

use bytes::Bytes;
use prost::Message;

use crate::model::{MessageIds, PlatformResult, UserId, UserResult};

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

#[derive(Clone, PartialEq, Message)]
pub struct OnlineBatchPushOneMsgReq {
    #[prost(message, optional, tag = "1")]
    pub msg_data: Option<MsgData>,
    /// Strings on the wire, declared as bytes: decoded from a `Bytes` message they are slices
    /// of it, not allocations, until `user_id` checks them as UTF-8.
    #[prost(bytes = "bytes", repeated, tag = "2")]
    pub push_to_user_ids: Vec<Bytes>,
}

#[derive(Clone, PartialEq, Message)]
pub struct OnlinePushMsgReq {
    #[prost(message, optional, tag = "1")]
    pub msg_data: Option<MsgData>,
    #[prost(bytes = "bytes", tag = "2")]
    pub push_to_user_id: Bytes,
}

#[derive(Clone, PartialEq, Message)]
pub struct SingleMsgToUserPlatform {
    #[prost(int64, tag = "1")]
    pub result_code: i64,
    #[prost(bytes = "bytes", tag = "2")]
    pub recv_id: Bytes,
    #[prost(int32, tag = "3")]
    pub recv_platform_id: i32,
}

/// `SingleMsgToUserPlatform` inside a batch answer's user entry: its `recvID` (2) repeats the
/// entry's `userID`, so it is not declared and prost skips it instead of allocating it.
#[derive(Clone, PartialEq, Message)]
pub struct PlatformOfUserResult {
    #[prost(int64, tag = "1")]
    pub result_code: i64,
    #[prost(int32, tag = "3")]
    pub recv_platform_id: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct SingleMsgToUserResults {
    #[prost(bytes = "bytes", tag = "1")]
    pub user_id: Bytes,
    #[prost(message, repeated, tag = "2")]
    pub resp: Vec<PlatformOfUserResult>,
    #[prost(bool, tag = "3")]
    pub online_push: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct OnlineBatchPushOneMsgResp {
    #[prost(message, repeated, tag = "1")]
    pub single_push_result: Vec<SingleMsgToUserResults>,
}

#[derive(Clone, PartialEq, Message)]
pub struct OnlinePushMsgResp {
    #[prost(message, repeated, tag = "1")]
    pub resp: Vec<SingleMsgToUserPlatform>,
}

/// The gateway methods whose bodies are decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushMethod {
    /// `SuperGroupOnlineBatchPushOneMsg` and `OnlineBatchPushOneMsg`.
    Batch,
    /// `OnlinePushMsg`: one recipient.
    Single,
}

impl PushMethod {
    pub const SERVICE_PREFIX: &str = "/OpenIMServer.msggateway.msgGateway/";

    pub fn from_path(path: &str) -> Option<Self> {
        match path.strip_prefix(Self::SERVICE_PREFIX)? {
            "SuperGroupOnlineBatchPushOneMsg" | "OnlineBatchPushOneMsg" => Some(Self::Batch),
            "OnlinePushMsg" => Some(Self::Single),
            _ => None,
        }
    }
}

/// `MsgData`'s identifying fields, absent when empty or zero (never its content).
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

/// A push request: which message, to whom.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PushCall {
    pub message: MessageIds,
    /// The capture ended inside `msgData`: only its fields before the cut are in `message`.
    pub message_truncated: bool,
    pub recipients: Vec<UserId>,
    /// The capture ended inside the request: more recipients may have followed those listed.
    pub recipients_truncated: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtobufError {
    #[error("{0}")]
    Decode(#[from] prost::DecodeError),
    #[error("invalid wire format in the captured prefix")]
    InvalidWire,
    #[error("a user id is not UTF-8")]
    UserIdNotUtf8,
}

/// A user id from the wire: checked as UTF-8 (as prost checks a `string`), held inline when
/// it is short, as OpenIM's ids are.
fn user_id(bytes: &[u8]) -> Result<UserId, ProtobufError> {
    UserId::from_utf8(bytes).map_err(|_| ProtobufError::UserIdNotUtf8)
}

/// Decodes a whole request. `message` is shared, not copied: the recipients are read as
/// slices of it.
pub fn decode_request(method: PushMethod, message: Bytes) -> Result<PushCall, ProtobufError> {
    Ok(match method {
        PushMethod::Batch => {
            let request = OnlineBatchPushOneMsgReq::decode(message)?;
            PushCall {
                message: request.msg_data.map(MessageIds::from).unwrap_or_default(),
                message_truncated: false,
                recipients: request
                    .push_to_user_ids
                    .iter()
                    .map(|id| user_id(id))
                    .collect::<Result<_, _>>()?,
                recipients_truncated: false,
            }
        }
        PushMethod::Single => {
            let request = OnlinePushMsgReq::decode(message)?;
            PushCall {
                message: request.msg_data.map(MessageIds::from).unwrap_or_default(),
                message_truncated: false,
                recipients: if request.push_to_user_id.is_empty() {
                    Vec::new()
                } else {
                    vec![user_id(&request.push_to_user_id)?]
                },
                recipients_truncated: false,
            }
        }
    })
}

/// Reads what a request's captured `prefix` says for sure: complete fields, and the complete
/// fields of a `msgData` the cut fell into.
pub fn decode_request_prefix(method: PushMethod, prefix: Bytes) -> Result<PushCall, ProtobufError> {
    let split = split_complete_fields(&prefix)?;
    let mut call = decode_request(method, prefix.slice_ref(split.complete))?;
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

/// Decodes a whole answer; like `decode_request`, the user ids are read as slices of `message`.
pub fn decode_response(
    method: PushMethod,
    message: Bytes,
) -> Result<Vec<UserResult>, ProtobufError> {
    Ok(match method {
        PushMethod::Batch => OnlineBatchPushOneMsgResp::decode(message)?
            .single_push_result
            .into_iter()
            .map(|result| {
                Ok(UserResult {
                    user_id: user_id(&result.user_id)?,
                    online_push: result.online_push,
                    // Collected in place: the two element types have one layout.
                    platforms: result
                        .resp
                        .into_iter()
                        .map(|platform| PlatformResult {
                            result_code: platform.result_code,
                            platform_id: platform.recv_platform_id,
                        })
                        .collect(),
                })
            })
            .collect::<Result<_, ProtobufError>>()?,
        // `OnlinePushMsgResp` lists platform results with their user (`RecvID`) and no
        // `onlinePush` flag: group by user, delivered when any platform reports 0.
        PushMethod::Single => {
            let mut results: Vec<UserResult> = Vec::new();
            for platform in OnlinePushMsgResp::decode(message)?.resp {
                let index = match results
                    .iter()
                    .position(|r| r.user_id.as_bytes() == platform.recv_id)
                {
                    Some(index) => index,
                    None => {
                        results.push(UserResult {
                            user_id: user_id(&platform.recv_id)?,
                            ..UserResult::default()
                        });
                        results.len() - 1
                    }
                };
                if let Some(result) = results.get_mut(index) {
                    result.online_push |= platform.result_code == 0;
                    result.platforms.push(PlatformResult {
                        result_code: platform.result_code,
                        platform_id: platform.recv_platform_id,
                    });
                }
            }
            results
        }
    })
}

/// The results of the users whose entries end before the cut.
pub fn decode_response_prefix(
    method: PushMethod,
    prefix: Bytes,
) -> Result<Vec<UserResult>, ProtobufError> {
    let complete = split_complete_fields(&prefix)?.complete;
    decode_response(method, prefix.slice_ref(complete))
}

struct CutField<'a> {
    field_number: u64,
    partial_value: &'a [u8],
}

struct SplitFields<'a> {
    /// The fields that end before the cut.
    complete: &'a [u8],
    /// The length-delimited field the cut fell into, when its tag and length were captured.
    cut_length_delimited: Option<CutField<'a>>,
}

/// Walks the protobuf wire format over `bytes` up to the first field that does not end in it.
fn split_complete_fields(bytes: &[u8]) -> Result<SplitFields<'_>, ProtobufError> {
    let mut position = 0usize;
    loop {
        let complete = bytes.get(..position).unwrap_or_default();
        let cut = |cut_length_delimited| {
            Ok(SplitFields {
                complete,
                cut_length_delimited,
            })
        };
        let rest = bytes.get(position..).unwrap_or_default();
        if rest.is_empty() {
            return cut(None);
        }
        let Some((key, key_len)) = read_varint(rest)? else {
            return cut(None);
        };
        let field_number = key >> 3;
        if field_number == 0 {
            return Err(ProtobufError::InvalidWire);
        }
        let after_key = rest.get(key_len..).unwrap_or_default();
        let value_len = match key & 7 {
            0 => match read_varint(after_key)? {
                Some((_, len)) => len,
                None => return cut(None),
            },
            1 => 8,
            5 => 4,
            2 => {
                let Some((length, length_len)) = read_varint(after_key)? else {
                    return cut(None);
                };
                let value = after_key.get(length_len..).unwrap_or_default();
                let length = usize::try_from(length).map_err(|_| ProtobufError::InvalidWire)?;
                if value.len() < length {
                    return cut(Some(CutField {
                        field_number,
                        partial_value: value,
                    }));
                }
                length_len + length
            }
            // Groups (3, 4) are not used by these messages; 6 and 7 are not wire types.
            _ => return Err(ProtobufError::InvalidWire),
        };
        if after_key.len() < value_len {
            return cut(None);
        }
        position += key_len + value_len;
    }
}

/// `Ok(None)` when the varint runs past the end of `bytes`.
fn read_varint(bytes: &[u8]) -> Result<Option<(u64, usize)>, ProtobufError> {
    let mut value = 0u64;
    for (index, &byte) in bytes.iter().enumerate().take(10) {
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

#[cfg(test)]
pub(crate) mod tests {
    use openim_test_kit::message::{BatchPushRequestWithContent, MsgDataWithContent};

    use super::*;

    pub(crate) fn sample_request(content: &[u8], recipients: &[&str]) -> Vec<u8> {
        BatchPushRequestWithContent {
            msg_data: Some(MsgDataWithContent {
                send_id: "sender-1".into(),
                group_id: "group-9".into(),
                client_msg_id: "client-abc".into(),
                server_msg_id: "server-def".into(),
                session_type: 3,
                content: content.to_vec(),
                seq: 42,
                ..MsgDataWithContent::default()
            }),
            push_to_user_ids: recipients.iter().map(|&r| r.to_owned()).collect(),
        }
        .encode_to_vec()
    }

    pub(crate) fn sample_ids() -> MessageIds {
        MessageIds {
            client_msg_id: Some("client-abc".into()),
            server_msg_id: Some("server-def".into()),
            seq: Some(42),
            session_type: Some(3),
        }
    }

    #[test]
    fn batch_request_round_trips_without_content() {
        let bytes = sample_request(b"CANARY-secret-body", &["u1", "u2"]);
        let call = decode_request(PushMethod::Batch, Bytes::copy_from_slice(&bytes)).unwrap();
        assert_eq!(
            call,
            PushCall {
                message: sample_ids(),
                message_truncated: false,
                recipients: vec!["u1".into(), "u2".into()],
                recipients_truncated: false,
            }
        );
        assert!(!format!("{call:?}").contains("CANARY"));
    }

    #[test]
    fn single_request_and_responses_round_trip() {
        let request = OnlinePushMsgReq {
            msg_data: Some(MsgData {
                client_msg_id: "c1".into(),
                seq: 7,
                ..MsgData::default()
            }),
            push_to_user_id: "u9".into(),
        };
        let call = decode_request(
            PushMethod::Single,
            Bytes::copy_from_slice(&request.encode_to_vec()),
        )
        .unwrap();
        assert_eq!(call.recipients, vec!["u9".to_owned()]);
        assert_eq!(call.message.seq, Some(7));

        // As a gateway sends it: each platform's result repeats the user in `recvID`.
        let first = SingleMsgToUserResults {
            user_id: "u1".into(),
            resp: vec![],
            online_push: false,
        };
        let mut second = SingleMsgToUserResults {
            user_id: "u2".into(),
            resp: vec![],
            online_push: true,
        }
        .encode_to_vec();
        let platform = SingleMsgToUserPlatform {
            result_code: 0,
            recv_id: "u2".into(),
            recv_platform_id: 2,
        };
        prost::encoding::message::encode(2, &platform, &mut second);
        let mut wire = Vec::new();
        prost::encoding::message::encode(1, &first, &mut wire);
        prost::encoding::bytes::encode(1, &second, &mut wire);
        let results = decode_response(PushMethod::Batch, Bytes::copy_from_slice(&wire)).unwrap();
        assert_eq!(
            results,
            vec![
                UserResult {
                    user_id: "u1".into(),
                    online_push: false,
                    platforms: vec![]
                },
                UserResult {
                    user_id: "u2".into(),
                    online_push: true,
                    platforms: vec![PlatformResult {
                        result_code: 0,
                        platform_id: 2
                    }],
                },
            ]
        );

        let single = OnlinePushMsgResp {
            resp: vec![
                SingleMsgToUserPlatform {
                    result_code: -2,
                    recv_id: "u9".into(),
                    recv_platform_id: 1,
                },
                SingleMsgToUserPlatform {
                    result_code: 0,
                    recv_id: "u9".into(),
                    recv_platform_id: 5,
                },
            ],
        };
        let results = decode_response(
            PushMethod::Single,
            Bytes::copy_from_slice(&single.encode_to_vec()),
        )
        .unwrap();
        assert_eq!(results.len(), 1);
        assert!(results[0].online_push);
        assert_eq!(results[0].platforms.len(), 2);
    }

    #[test]
    fn every_prefix_decodes_without_guessing() {
        let bytes = sample_request(&[7u8; 300], &["alice", "bob", "carol"]);
        let full = decode_request(PushMethod::Batch, Bytes::copy_from_slice(&bytes)).unwrap();
        for cut in 0..bytes.len() {
            let call =
                decode_request_prefix(PushMethod::Batch, Bytes::copy_from_slice(&bytes[..cut]))
                    .unwrap();
            assert!(call.recipients_truncated);
            // Recipients found are exactly a prefix of the real list.
            assert!(
                full.recipients.starts_with(&call.recipients),
                "cut {cut}: {call:?}"
            );
            if !call.message_truncated {
                assert_eq!(call.message, full.message);
            }
        }
        // Cut in the last recipient: msgData complete, two recipients known.
        let call = decode_request_prefix(
            PushMethod::Batch,
            Bytes::copy_from_slice(&bytes[..bytes.len() - 2]),
        )
        .unwrap();
        assert_eq!(call.message, full.message);
        assert!(!call.message_truncated);
        assert_eq!(call.recipients, vec!["alice".to_owned(), "bob".to_owned()]);
        // Cut inside the content: ids before field 12 are known, seq (14) is not.
        let call = decode_request_prefix(PushMethod::Batch, Bytes::copy_from_slice(&bytes[..100]))
            .unwrap();
        assert!(call.message_truncated);
        assert_eq!(call.message.client_msg_id.as_deref(), Some("client-abc"));
        assert_eq!(call.message.seq, None);
        assert!(call.recipients.is_empty());
    }

    #[test]
    fn invalid_wire_is_an_error() {
        assert!(decode_request_prefix(PushMethod::Batch, Bytes::copy_from_slice(&[0x07])).is_err());
        assert!(decode_request_prefix(PushMethod::Batch, Bytes::copy_from_slice(&[0x00])).is_err());
        // Unknown field 3 (varint) twice, then a cut key.
        assert!(
            decode_request_prefix(
                PushMethod::Batch,
                Bytes::copy_from_slice(&[0x18, 0x01, 0x18, 0x01, 0x18])
            )
            .is_ok()
        );
        assert!(
            decode_request_prefix(
                PushMethod::Batch,
                Bytes::copy_from_slice(&[
                    0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff
                ])
            )
            .is_err()
        );
    }
}
