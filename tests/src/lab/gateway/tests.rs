use super::*;

fn batch(users: &[&str]) -> GrpcRequest<OnlineBatchPushOneMsgReq> {
    GrpcRequest::new(OnlineBatchPushOneMsgReq {
        msg_data: Some(MsgData {
            client_msg_id: "m1".to_owned(),
            seq: 1,
            ..Default::default()
        }),
        push_to_user_ids: users.iter().map(|user| (*user).to_owned()).collect(),
    })
}

fn service(sessions: &Sessions, release: OpenImRelease) -> GatewayService {
    GatewayService {
        sessions: sessions.clone(),
        release,
    }
}

#[tokio::test]
async fn answers_as_upstream_lists_platforms() {
    let sessions = Sessions::default();
    let (_, mut android) = sessions.open("alice", ANDROID, false);
    let (_, mut web) = sessions.open("alice", 5, false);
    let (_, mut windows) = sessions.open("carol", 3, false);
    let (_, mut ios) = sessions.open("dave", IOS, true);
    let results = service(&sessions, OpenImRelease::V3_5)
        .super_group_online_batch_push_one_msg(batch(&["alice", "bob", "carol", "dave"]))
        .await
        .expect("push answered")
        .into_inner()
        .single_push_result;
    let entries = |index: usize| -> Vec<(i32, i64)> {
        results[index]
            .resp
            .iter()
            .map(|entry| (entry.recv_platform_id, entry.result_code))
            .collect()
    };
    // Android is a push terminal: listed; Web is written to but not listed.
    assert!(results[0].online_push);
    assert_eq!(entries(0), [(ANDROID, RESULT_OK)]);
    // Not connected here, and delivered to Windows only, look the same on the wire.
    for index in [1, 2] {
        assert!(!results[index].online_push);
        assert!(results[index].resp.is_empty());
    }
    // An iOS client in the background is not written to.
    assert!(!results[3].online_push);
    assert_eq!(entries(3), [(IOS, RESULT_IOS_BACKGROUND)]);
    for frames in [&mut android, &mut web, &mut windows] {
        let frame = frames.try_recv().expect("frame written");
        assert!(
            frame
                .to_text()
                .expect("text")
                .contains("\"clientMsgID\":\"m1\"")
        );
    }
    assert!(ios.try_recv().is_err());
}

#[tokio::test]
async fn later_releases_answer_out_of_order() {
    let sessions = Sessions::default();
    let users: Vec<String> = service(&sessions, OpenImRelease::V3_8)
        .super_group_online_batch_push_one_msg(batch(&["a", "b", "c"]))
        .await
        .expect("push answered")
        .into_inner()
        .single_push_result
        .into_iter()
        .map(|result| result.user_id)
        .collect();
    assert_eq!(users, ["c", "b", "a"]);
}

#[test]
fn serves_the_release_service_name_only() {
    let path = |release, path: &str| {
        let request = http::Request::builder()
            .uri(format!("http://gw:88{path}"))
            .body(tonic::body::Body::empty())
            .expect("request");
        serve_release_service(release, request)
            .uri()
            .path()
            .to_owned()
    };
    let renamed = "/openim.msggateway.msgGateway/SuperGroupOnlineBatchPushOneMsg";
    let old = "/OpenIMServer.msggateway.msgGateway/SuperGroupOnlineBatchPushOneMsg";
    assert_eq!(path(OpenImRelease::V3_7, renamed), old);
    assert_eq!(path(OpenImRelease::V3_7, old), format!("/unserved{old}"));
    assert_eq!(path(OpenImRelease::V3_6, old), old);
    assert_eq!(path(OpenImRelease::V3_6, renamed), renamed);
}

#[test]
fn reads_is_background_as_go_does() {
    assert_eq!(parse_go_bool("true"), Some(true));
    assert_eq!(parse_go_bool("1"), Some(true));
    assert_eq!(parse_go_bool("False"), Some(false));
    assert_eq!(parse_go_bool("yes"), None);
}
