use super::*;

#[test]
fn each_release_names_its_service_and_routes_as_upstream() {
    assert_eq!(
        OpenImRelease::V3_6.push_path(),
        "/OpenIMServer.msggateway.msgGateway/SuperGroupOnlineBatchPushOneMsg"
    );
    assert_eq!(
        OpenImRelease::V3_7.push_path(),
        "/openim.msggateway.msgGateway/SuperGroupOnlineBatchPushOneMsg"
    );
    let ring: Vec<_> = [
        OpenImRelease::V3_5,
        OpenImRelease::V3_6,
        OpenImRelease::V3_7,
        OpenImRelease::V3_8,
    ]
    .into_iter()
    .map(|release| release.routing(Discovery::Kubernetes))
    .collect();
    assert_eq!(ring, [PushRouting::Ring; 4]);
    assert_eq!(
        OpenImRelease::Main.routing(Discovery::Kubernetes),
        PushRouting::Broadcast
    );
    assert_eq!(
        OpenImRelease::V3_5.routing(Discovery::Etcd),
        PushRouting::Broadcast
    );
    assert!(!OpenImRelease::V3_5.reuses_push_connections());
    assert!(OpenImRelease::V3_6.reuses_push_connections());
    assert!(!OpenImRelease::V3_7.reorders_answers());
    assert!(OpenImRelease::V3_8.reorders_answers());
}
