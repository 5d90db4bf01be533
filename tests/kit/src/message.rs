//! OpenIM's messages as the sender encodes them, content included: the library's `MsgData`
//! omits field 12 on purpose, so only test code can produce a body to check it never leaks.

use prost::Message;

/// `sdkws.MsgData` (field numbers are OpenIM's) with the private body in `content`.
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

/// `msggateway.OnlineBatchPushOneMsgReq`: one message and the users push sends it to.
#[derive(Clone, PartialEq, Message)]
pub struct BatchPushRequestWithContent {
    #[prost(message, optional, tag = "1")]
    pub msg_data: Option<MsgDataWithContent>,
    #[prost(string, repeated, tag = "2")]
    pub push_to_user_ids: Vec<String>,
}

/// `msggateway.SingleMsgToUserResults` as a gateway encodes it: each platform's result
/// repeats the user in `recvID`, a field the library's batch answer does not declare.
#[derive(Clone, PartialEq, Message)]
pub struct UserResultsAsSent {
    #[prost(string, tag = "1")]
    pub user_id: String,
    #[prost(message, repeated, tag = "2")]
    pub resp: Vec<observer::decode::protobuf::SingleMsgToUserPlatform>,
    #[prost(bool, tag = "3")]
    pub online_push: bool,
}

/// `msggateway.OnlineBatchPushOneMsgResp` as a gateway encodes it.
#[derive(Clone, PartialEq, Message)]
pub struct BatchPushAnswerAsSent {
    #[prost(message, repeated, tag = "1")]
    pub single_push_result: Vec<UserResultsAsSent>,
}
