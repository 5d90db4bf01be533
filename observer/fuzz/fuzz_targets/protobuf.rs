//! The push messages, complete and as captured prefixes, over arbitrary bytes; and the
//! observer's own walk of their wire format against `prost` decoding the same fields.
#![no_main]

use libfuzzer_sys::fuzz_target;
use observer::decode::protobuf::{
    ProtobufError, PushCall, PushMethod, decode_request, decode_request_prefix, decode_response,
    decode_response_prefix,
};
use observer::model::{MessageIds, PlatformResult, UserId, UserResult};
use openim_test_kit::message::{
    OnlineBatchPushOneMsgReq, OnlineBatchPushOneMsgResp, OnlinePushMsgReq, OnlinePushMsgResp,
};
use prost::Message;

fuzz_target!(|data: &[u8]| {
    for method in [PushMethod::Batch, PushMethod::Single] {
        let complete = decode_request(method, data);
        agree(&complete, &reference_request(method, data));
        let prefix = decode_request_prefix(method, data);
        // A whole message read as a prefix knows no recipient the whole message lacks.
        if let (Ok(complete), Ok(prefix)) = (complete, prefix) {
            assert!(complete.recipients.starts_with(&prefix.recipients));
        }
        agree(
            &decode_response(method, data),
            &reference_response(method, data),
        );
        let _ = decode_response_prefix(method, data);
    }
});

/// The same value, or both an error; a group (proto2), which `prost` skips in an undeclared
/// field, is the walk's only refusal of a message `prost` reads.
fn agree<T: PartialEq + std::fmt::Debug, E: std::fmt::Debug>(
    walked: &Result<T, ProtobufError>,
    reference: &Result<T, E>,
) {
    match (walked, reference) {
        (Ok(walked), Ok(reference)) => assert_eq!(walked, reference),
        (Err(_), Err(_)) | (Err(ProtobufError::Group), Ok(_)) => {}
        _ => panic!("the walk read {walked:?}, prost {reference:?}"),
    }
}

fn user_id(bytes: &[u8]) -> Result<UserId, &'static str> {
    UserId::from_utf8(bytes).map_err(|_| "a user id is not UTF-8")
}

fn reference_request(method: PushMethod, data: &[u8]) -> Result<PushCall, String> {
    let (msg_data, recipients) = match method {
        PushMethod::Batch => {
            let request = OnlineBatchPushOneMsgReq::decode(data).map_err(|e| e.to_string())?;
            (request.msg_data, request.push_to_user_ids)
        }
        PushMethod::Single => {
            let request = OnlinePushMsgReq::decode(data).map_err(|e| e.to_string())?;
            let recipients = Some(request.push_to_user_id).filter(|id| !id.is_empty());
            (request.msg_data, recipients.into_iter().collect())
        }
    };
    Ok(PushCall {
        message: msg_data.map(MessageIds::from).unwrap_or_default(),
        message_truncated: false,
        recipients: recipients
            .iter()
            .map(|id| user_id(id))
            .collect::<Result<_, _>>()?,
        recipients_truncated: false,
    })
}

fn reference_response(method: PushMethod, data: &[u8]) -> Result<Vec<UserResult>, String> {
    match method {
        PushMethod::Batch => OnlineBatchPushOneMsgResp::decode(data)
            .map_err(|e| e.to_string())?
            .single_push_result
            .into_iter()
            .map(|result| {
                Ok(UserResult {
                    user_id: user_id(&result.user_id)?,
                    online_push: result.online_push,
                    platforms: result
                        .resp
                        .iter()
                        .map(|platform| PlatformResult {
                            result_code: platform.result_code,
                            platform_id: platform.recv_platform_id,
                        })
                        .collect(),
                })
            })
            .collect(),
        PushMethod::Single => {
            let mut results: Vec<UserResult> = Vec::new();
            for platform in OnlinePushMsgResp::decode(data)
                .map_err(|e| e.to_string())?
                .resp
            {
                let index = match results
                    .iter()
                    .position(|result| result.user_id.as_bytes() == platform.recv_id)
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
                results[index].online_push |= platform.result_code == 0;
                results[index].platforms.push(PlatformResult {
                    result_code: platform.result_code,
                    platform_id: platform.recv_platform_id,
                });
            }
            Ok(results)
        }
    }
}
