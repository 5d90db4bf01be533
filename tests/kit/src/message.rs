//! Defines OpenIM's messages as the sender encodes them, content included: the library's `MsgData`
//! omits field 12 on purpose, so only test code can produce a body to check it never leaks. And the
//! push messages over only the fields the observer reads, declared with `prost`: the encoders of
//! tests, and the reference the observer's own wire walk is fuzzed against.

use bytes::Bytes;
pub use observer::decode::protobuf::MsgData;
use prost::Message;

/// Mirrors `sdkws.MsgData` (field numbers are OpenIM's) with the private body in `content`.
#[derive(Clone, PartialEq, Message)]
pub struct MsgDataWithContent {
    #[prost(string, tag = "1")]
    pub send_id: String,
    #[prost(string, tag = "3")]
    pub group_id: String,
    #[prost(string, tag = "4")]
    pub client_msg_id: String,
    #[prost(string, tag = "5")]
    pub server_msg_id: String,
    #[prost(int32, tag = "6")]
    pub sender_platform_id: i32,
    #[prost(int32, tag = "9")]
    pub session_type: i32,
    #[prost(int32, tag = "11")]
    pub content_type: i32,
    #[prost(bytes = "vec", tag = "12")]
    pub content: Vec<u8>,
    #[prost(int64, tag = "14")]
    pub seq: i64,
    #[prost(int64, tag = "15")]
    pub send_time: i64,
}

/// Mirrors `msggateway.OnlineBatchPushOneMsgReq`: one message and the users push sends it to.
#[derive(Clone, PartialEq, Message)]
pub struct BatchPushRequestWithContent {
    #[prost(message, optional, tag = "1")]
    pub msg_data: Option<MsgDataWithContent>,
    #[prost(string, repeated, tag = "2")]
    pub push_to_user_ids: Vec<String>,
}

/// Mirrors `msggateway.SingleMsgToUserResults` as a gateway encodes it: each platform's result
/// repeats the user in `recvID`, a field the library's batch answer does not declare.
#[derive(Clone, PartialEq, Message)]
pub struct UserResultsAsSent {
    #[prost(string, tag = "1")]
    pub user_id: String,
    #[prost(message, repeated, tag = "2")]
    pub resp: Vec<SingleMsgToUserPlatform>,
    #[prost(bool, tag = "3")]
    pub online_push: bool,
}

/// Mirrors `msggateway.OnlineBatchPushOneMsgResp` as a gateway encodes it.
#[derive(Clone, PartialEq, Message)]
pub struct BatchPushAnswerAsSent {
    #[prost(message, repeated, tag = "1")]
    pub single_push_result: Vec<UserResultsAsSent>,
}

/// Mirrors `msggateway.OnlineBatchPushOneMsgReq` as the observer reads it.
#[derive(Clone, PartialEq, Message)]
pub struct OnlineBatchPushOneMsgReq {
    #[prost(message, optional, tag = "1")]
    pub msg_data: Option<MsgData>,
    #[prost(bytes = "bytes", repeated, tag = "2")]
    pub push_to_user_ids: Vec<Bytes>,
}

/// Mirrors `msggateway.OnlinePushMsgReq` as the observer reads it.
#[derive(Clone, PartialEq, Message)]
pub struct OnlinePushMsgReq {
    #[prost(message, optional, tag = "1")]
    pub msg_data: Option<MsgData>,
    #[prost(bytes = "bytes", tag = "2")]
    pub push_to_user_id: Bytes,
}

/// Mirrors `msggateway.SingleMsgToUserPlatform`: one platform's result, with its user.
#[derive(Clone, PartialEq, Message)]
pub struct SingleMsgToUserPlatform {
    #[prost(int64, tag = "1")]
    pub result_code: i64,
    #[prost(bytes = "bytes", tag = "2")]
    pub recv_id: Bytes,
    #[prost(int32, tag = "3")]
    pub recv_platform_id: i32,
}

/// Mirrors `SingleMsgToUserPlatform` inside a batch answer's user entry, as the observer reads it:
/// without its `recvID` (2), which repeats the entry's `userID`.
#[derive(Clone, PartialEq, Message)]
pub struct PlatformOfUserResult {
    #[prost(int64, tag = "1")]
    pub result_code: i64,
    #[prost(int32, tag = "3")]
    pub recv_platform_id: i32,
}

/// Mirrors `msggateway.SingleMsgToUserResults` as the observer reads it.
#[derive(Clone, PartialEq, Message)]
pub struct SingleMsgToUserResults {
    #[prost(bytes = "bytes", tag = "1")]
    pub user_id: Bytes,
    #[prost(message, repeated, tag = "2")]
    pub resp: Vec<PlatformOfUserResult>,
    #[prost(bool, tag = "3")]
    pub online_push: bool,
}

/// Mirrors `msggateway.OnlineBatchPushOneMsgResp` as the observer reads it.
#[derive(Clone, PartialEq, Message)]
pub struct OnlineBatchPushOneMsgResp {
    #[prost(message, repeated, tag = "1")]
    pub single_push_result: Vec<SingleMsgToUserResults>,
}

/// Mirrors `msggateway.OnlinePushMsgResp`.
#[derive(Clone, PartialEq, Message)]
pub struct OnlinePushMsgResp {
    #[prost(message, repeated, tag = "1")]
    pub resp: Vec<SingleMsgToUserPlatform>,
}
