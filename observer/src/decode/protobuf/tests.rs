use openim_test_kit::message::{
    BatchPushRequestWithContent, MsgDataWithContent, OnlinePushMsgReq, OnlinePushMsgResp,
    SingleMsgToUserPlatform, SingleMsgToUserResults,
};

use super::*;

#[test]
fn paths_are_classified_by_their_method_whatever_the_package() {
    for path in [
        "/OpenIMServer.msggateway.msgGateway/SuperGroupOnlineBatchPushOneMsg",
        "/openim.msggateway.msgGateway/SuperGroupOnlineBatchPushOneMsg",
        "/openim.msggateway.msgGateway/OnlineBatchPushOneMsg",
    ] {
        assert_eq!(
            PushMethod::classify(path),
            PathKind::Push(PushMethod::Batch)
        );
    }
    assert_eq!(
        PushMethod::classify("/openim.msggateway.msgGateway/OnlinePushMsg"),
        PathKind::Push(PushMethod::Single)
    );
    for path in [
        "/openim.msggateway.msgGateway/GetUsersOnlineStatus",
        "/grpc.health.v1.Health/Check",
    ] {
        assert_eq!(PushMethod::classify(path), PathKind::Other, "{path}");
    }
    assert_eq!(PushMethod::classify("/x.Y/Z"), PathKind::Unknown);
    assert_eq!(PushMethod::classify("no-slash"), PathKind::Unknown);
    assert_eq!(
        service_of("/openim.msggateway.msgGateway/OnlinePushMsg"),
        Some(PushMethod::SERVICE_V37)
    );
    assert_eq!(service_of("(method unseen)"), None);
}

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
    let call = decode_request(PushMethod::Batch, &bytes).unwrap();
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
        msg_data: Some(openim_test_kit::message::MsgData {
            client_msg_id: "c1".into(),
            seq: 7,
            ..openim_test_kit::message::MsgData::default()
        }),
        push_to_user_id: "u9".into(),
    };
    let call = decode_request(PushMethod::Single, &request.encode_to_vec()).unwrap();
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
    let results = decode_response(PushMethod::Batch, &wire).unwrap();
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
    let results = decode_response(PushMethod::Single, &single.encode_to_vec()).unwrap();
    assert_eq!(results.len(), 1);
    assert!(results[0].online_push);
    assert_eq!(results[0].platforms.len(), 2);
}

#[test]
fn every_prefix_decodes_without_guessing() {
    let bytes = sample_request(&[7u8; 300], &["alice", "bob", "carol"]);
    let full = decode_request(PushMethod::Batch, &bytes).unwrap();
    for cut in 0..bytes.len() {
        let call = decode_request_prefix(PushMethod::Batch, &bytes[..cut]).unwrap();
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
    let call = decode_request_prefix(PushMethod::Batch, &bytes[..bytes.len() - 2]).unwrap();
    assert_eq!(call.message, full.message);
    assert!(!call.message_truncated);
    assert_eq!(call.recipients, vec!["alice".to_owned(), "bob".to_owned()]);
    // Cut inside the content: ids before field 12 are known, seq (14) is not.
    let call = decode_request_prefix(PushMethod::Batch, &bytes[..100]).unwrap();
    assert!(call.message_truncated);
    assert_eq!(call.message.client_msg_id.as_deref(), Some("client-abc"));
    assert_eq!(call.message.seq, None);
    assert!(call.recipients.is_empty());
}

#[test]
fn invalid_wire_is_an_error() {
    assert!(decode_request_prefix(PushMethod::Batch, &[0x07]).is_err());
    assert!(decode_request_prefix(PushMethod::Batch, &[0x00]).is_err());
    // Unknown field 3 (varint) twice, then a cut key.
    assert!(decode_request_prefix(PushMethod::Batch, &[0x18, 0x01, 0x18, 0x01, 0x18]).is_ok());
    let eleven_byte_varint = [
        0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    ];
    assert!(decode_request_prefix(PushMethod::Batch, &eleven_byte_varint).is_err());
}

/// The rules `prost` reads these messages by, which the fuzz target checks on arbitrary
/// bytes; here the ones a gateway's answer depends on, each on its own.
#[test]
fn the_walk_reads_fields_as_prost_does() {
    let batch = |bytes: &[u8]| decode_request(PushMethod::Batch, bytes);
    // A declared field of another wire type is an error: a batch answer's shape read as
    // `OnlinePushMsgResp` (and the reverse) fails, so the decoder can try the other.
    assert_eq!(batch(&[0x10, 0x01]), Err(ProtobufError::WrongWireType(2)));
    let single_answer = OnlinePushMsgResp {
        resp: vec![SingleMsgToUserPlatform {
            result_code: -2,
            recv_id: "u9".into(),
            recv_platform_id: 1,
        }],
    }
    .encode_to_vec();
    assert_eq!(
        decode_response(PushMethod::Batch, &single_answer),
        Err(ProtobufError::WrongWireType(1))
    );
    // An undeclared field of any wire type is skipped: varint, fixed64, fixed32, bytes.
    let mut skipped = vec![
        0x18, 0x96, 0x01, 0x21, 1, 2, 3, 4, 5, 6, 7, 8, 0x2d, 1, 2, 3, 4,
    ];
    skipped.extend([0x3a, 2, b'h', b'i', 0x12, 2, b'u', b'1']);
    assert_eq!(batch(&skipped).unwrap().recipients, vec!["u1".to_owned()]);
    // A repeated `msgData` merges into the first, and a single recipient's last value wins.
    let mut repeated = Vec::new();
    prost::encoding::message::encode(
        1,
        &MsgDataWithContent {
            seq: 7,
            ..Default::default()
        },
        &mut repeated,
    );
    let second = MsgDataWithContent {
        client_msg_id: "c1".into(),
        ..Default::default()
    };
    prost::encoding::message::encode(1, &second, &mut repeated);
    prost::encoding::bytes::encode(2, &b"first".to_vec(), &mut repeated);
    prost::encoding::bytes::encode(2, &b"last".to_vec(), &mut repeated);
    let call = decode_request(PushMethod::Single, &repeated).unwrap();
    assert_eq!(
        (call.message.seq, call.message.client_msg_id.as_deref()),
        (Some(7), Some("c1"))
    );
    assert_eq!(call.recipients, vec!["last".to_owned()]);
    // Groups are proto2: refused by name. A key beyond 32 bits or a varint's tenth byte
    // beyond the value's top bit is invalid, as prost has it.
    assert_eq!(batch(&[0x1b, 0x1c]), Err(ProtobufError::Group));
    let key_beyond_32_bits = [0x80, 0x80, 0x80, 0x80, 0x10, 0x00];
    assert_eq!(batch(&key_beyond_32_bits), Err(ProtobufError::InvalidWire));
    let tenth_byte_overflows = [
        0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02,
    ];
    assert_eq!(
        batch(&tenth_byte_overflows),
        Err(ProtobufError::InvalidWire)
    );
    let tenth_byte_top_bit = [
        0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
    ];
    assert!(batch(&tenth_byte_top_bit).is_ok());
    // A field that runs past the end of a whole message is an error.
    assert_eq!(batch(&[0x12, 0x05, b'u']), Err(ProtobufError::InvalidWire));
}
