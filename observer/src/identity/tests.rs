use super::*;
use k8s_openapi::{
    api::core::v1::{PodIP, PodSpec, PodStatus},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

/// Answers the watcher as an API server with no pods would: an empty list, then a watch
/// that stays open with nothing to say.
async fn serve_no_pods(listener: tokio::net::TcpListener) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        tokio::spawn(async move {
            let mut buffer = vec![0u8; 8192];
            loop {
                let Ok(read) = stream.read(&mut buffer).await else {
                    return;
                };
                if read == 0 {
                    return;
                }
                let request = String::from_utf8_lossy(&buffer[..read]);
                if request.contains("watch=true") {
                    let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                                    Transfer-Encoding: chunked\r\n\r\n";
                    let _ = stream.write_all(head.as_bytes()).await;
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    return;
                }
                let body = r#"{"apiVersion":"v1","kind":"PodList","metadata":{"resourceVersion":"1"},"items":[]}"#;
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: \
                    {}\r\n\r\n{body}",
                    body.len()
                );
                if stream.write_all(response.as_bytes()).await.is_err() {
                    return;
                }
            }
        });
    }
}

#[tokio::test]
async fn every_namespace_counts_as_loaded_once_its_list_is_in() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(serve_no_pods(listener));
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{addr}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
             users:\n- name: fake\n  user: {{}}\ncurrent-context: fake\n"
        ))
        .unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let pods = PodIndex::shared(10);
    assert_eq!(read(&pods).lists_loaded(), 0);
    let namespaces = vec!["chat".to_owned(), "im".to_owned()];
    let watch = tokio::spawn(watch_pods(client, Arc::clone(&pods), namespaces));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while read(&pods).lists_loaded() < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(read(&pods).lists_loaded(), 2);
    watch.abort();
    server.abort();
}

fn pod(uid: &str, name: &str, ip: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            uid: Some(uid.into()),
            namespace: Some("chat".into()),
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec::default()),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some(ip.into()),
            pod_ips: Some(vec![PodIP { ip: ip.into() }]),
            ..PodStatus::default()
        }),
    }
}

fn named(name: &str) -> Option<PodRef> {
    Some(PodRef::new("chat", name))
}

#[test]
fn a_namespace_relist_replaces_that_namespace_only() {
    let in_namespace = |uid: &str, namespace: &str, name: &str, ip: &str| {
        let mut pod = pod(uid, name, ip);
        pod.metadata.namespace = Some(namespace.into());
        pod
    };
    let mut index = PodIndex::new(10);
    index.apply(&in_namespace("a-1", "chat", "gateway-0", "10.0.0.1"));
    index.apply(&in_namespace("a-2", "chat", "push-old", "10.0.0.2"));
    index.apply(&in_namespace("b-1", "infra", "redis-0", "10.0.1.1"));

    let mut relisted = PodIndex::new(10);
    relisted.apply(&in_namespace("a-1", "chat", "gateway-0", "10.0.0.1"));
    relisted.apply(&in_namespace("a-3", "chat", "push-new", "10.0.0.3"));
    index.replace_namespace("chat", relisted);

    assert_eq!(index.pod_count(), 3);
    assert_eq!(
        index.pod_by_ip("10.0.0.1".parse().unwrap()),
        named("gateway-0")
    );
    assert_eq!(
        index.pod_by_ip("10.0.0.3".parse().unwrap()),
        named("push-new")
    );
    assert!(index.pod_by_ip("10.0.0.2".parse().unwrap()).is_none());
    assert_eq!(
        index.pod_by_ip("::ffff:10.0.0.1".parse().unwrap()),
        named("gateway-0"),
        "an IPv4-mapped spelling is the same endpoint"
    );
    assert!(index.pod_by_uid("a-2").is_none());
    assert_eq!(
        index.pod_by_uid("b-1").map(|pod| pod.name),
        Some("redis-0".to_owned()),
        "another namespace's pods survive the relist"
    );
}

#[test]
fn pods_name_their_workload_container_and_selected_labels() {
    use k8s_openapi::api::core::v1::{Container, ContainerPort, ContainerStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    let owned = |kind: &str, name: &str, hash: Option<&str>| {
        let mut pod = pod(UID, "push-7d9f8c6b5-x2x4q", "10.0.0.5");
        pod.metadata.owner_references = Some(vec![OwnerReference {
            kind: kind.into(),
            name: name.into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        let mut labels = std::collections::BTreeMap::from([
            ("app".to_owned(), "push".to_owned()),
            ("secret-ish".to_owned(), "not selected".to_owned()),
        ]);
        if let Some(hash) = hash {
            labels.insert("pod-template-hash".into(), hash.into());
        }
        pod.metadata.labels = Some(labels);
        pod
    };
    let mut deployed = owned("ReplicaSet", "push-7d9f8c6b5", Some("7d9f8c6b5"));
    let container = |name: &str, port: i32| Container {
        name: name.into(),
        ports: Some(vec![ContainerPort {
            container_port: port,
            ..ContainerPort::default()
        }]),
        ..Container::default()
    };
    deployed.spec = Some(PodSpec {
        containers: vec![container("push", 10170), container("sidecar", 9090)],
        ..PodSpec::default()
    });
    let id = "a".repeat(64);
    if let Some(status) = &mut deployed.status {
        status.container_statuses = Some(vec![ContainerStatus {
            name: "push".into(),
            container_id: Some(format!("containerd://{id}")),
            ..ContainerStatus::default()
        }]);
    }
    let mut index = PodIndex::with_labels(10, vec!["app".into(), "absent".into()]);
    index.apply(&deployed);
    let pod = index.pod_by_container(UID, Some(&id)).expect("the pod");
    assert_eq!(pod.container.as_deref(), Some("push"));
    let workload = pod.workload.expect("a workload");
    assert_eq!(
        (workload.kind.as_str(), workload.name.as_str()),
        ("Deployment", "push")
    );
    assert_eq!(
        pod.labels,
        std::collections::BTreeMap::from([("app".to_owned(), "push".to_owned())])
    );
    let ip = "10.0.0.5".parse().expect("ip");
    let by_port = index.pod_by_endpoint(ip, 9090).expect("the pod");
    assert_eq!(by_port.container.as_deref(), Some("sidecar"));
    assert_eq!(
        index.pod_by_endpoint(ip, 1).and_then(|pod| pod.container),
        None
    );

    for (kind, name, hash) in [
        ("StatefulSet", "openim-msggateway", None),
        ("ReplicaSet", "bare-rs", Some("other")),
    ] {
        let mut index = PodIndex::new(10);
        index.apply(&owned(kind, name, hash));
        let workload = index.pod_by_uid(UID).and_then(|pod| pod.workload);
        let workload = workload.expect("a workload");
        assert_eq!(
            (workload.kind.as_str(), workload.name.as_str()),
            (kind, name)
        );
    }
}

#[test]
fn container_ids_come_from_the_last_path_component() {
    let id = "4f2a".repeat(16);
    for path in [
        format!(
            "kubepods.slice/kubepods-pod{}.slice/cri-containerd-{id}.scope",
            "x"
        ),
        format!("kubepods/burstable/pod{UID}/{id}"),
        format!("kubepods.slice/x.slice/crio-{id}.scope"),
    ] {
        assert_eq!(
            container_id_from_cgroup_path(Path::new(&path)).as_deref(),
            Some(id.as_str()),
            "{path}"
        );
    }
    let pod_cgroup = format!("kubepods/burstable/pod{UID}");
    assert_eq!(container_id_from_cgroup_path(Path::new(&pod_cgroup)), None);
}

#[test]
fn systemd_driver_paths_name_the_pod_with_dashes_restored() {
    let path = Path::new(
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0.slice/cri-containerd-4f2a.scope",
    );
    assert_eq!(pod_uid_from_cgroup_path(path).as_deref(), Some(UID));
    let guaranteed =
        Path::new("kubepods.slice/kubepods-pod0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0.slice");
    assert_eq!(pod_uid_from_cgroup_path(guaranteed).as_deref(), Some(UID));
}

#[test]
fn cgroupfs_driver_paths_name_the_pod() {
    let path = Path::new("kubepods/burstable/pod0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0/8a9b");
    assert_eq!(pod_uid_from_cgroup_path(path).as_deref(), Some(UID));
    let guaranteed = Path::new("kubepods/pod0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0");
    assert_eq!(pod_uid_from_cgroup_path(guaranteed).as_deref(), Some(UID));
}

#[test]
fn paths_outside_pods_name_nothing() {
    for path in [
        "kubepods.slice/kubepods-besteffort.slice",
        "kubepods/besteffort",
        "system.slice/containerd.service",
        "user.slice/user-1000.slice/podman-pod.slice",
        "kubepods/podnot-a-uid",
    ] {
        assert_eq!(pod_uid_from_cgroup_path(Path::new(path)), None, "{path}");
    }
}

#[test]
fn cgroup_ids_resolve_through_directory_inodes_and_rescan_on_miss() {
    let root = tempfile::tempdir().expect("temp dir");
    let pod_dir = root
        .path()
        .join("kubepods.slice/kubepods-burstable.slice")
        .join("kubepods-burstable-pod0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0.slice");
    let container = pod_dir.join("cri-containerd-4f2a.scope");
    std::fs::create_dir_all(&container).expect("create cgroup dirs");
    let outside = root.path().join("system.slice/sshd.service");
    std::fs::create_dir_all(&outside).expect("create cgroup dirs");
    let inode = |path: &Path| std::fs::metadata(path).expect("stat").ino();

    let mut cgroups = CgroupIndex::new(root.path().to_owned(), Duration::ZERO);
    assert_eq!(cgroups.pod_uid(inode(&container)), Some(UID));
    assert_eq!(cgroups.pod_uid(inode(&pod_dir)), Some(UID));
    assert_eq!(cgroups.pod_uid(inode(&outside)), None);

    // A pod started after the last scan is found by the rescan its first miss triggers.
    let later = root
        .path()
        .join("kubepods.slice/kubepods-pod11111111_2222_3333_4444_555555555555.slice");
    std::fs::create_dir_all(&later).expect("create cgroup dir");
    assert_eq!(
        cgroups.pod_uid(inode(&later)),
        Some("11111111-2222-3333-4444-555555555555")
    );
}

#[test]
fn misses_rescan_at_most_once_per_interval() {
    let root = tempfile::tempdir().expect("temp dir");
    let mut cgroups = CgroupIndex::new(root.path().to_owned(), Duration::from_secs(3600));
    assert_eq!(cgroups.pod_uid(1), None);
    let pod_dir = root
        .path()
        .join("kubepods/pod0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0");
    std::fs::create_dir_all(&pod_dir).expect("create cgroup dir");
    let inode = std::fs::metadata(&pod_dir).expect("stat").ino();
    assert_eq!(
        cgroups.pod_uid(inode),
        None,
        "rescanned within the interval"
    );
}

#[test]
fn index_follows_modifications_deletions_and_ip_reuse() {
    let mut index = PodIndex::new(10);
    let ip: IpAddr = "10.244.1.7".parse().expect("ip");
    index.apply(&pod(UID, "gateway-0", "10.244.1.7"));
    assert_eq!(index.pod_by_ip(ip), named("gateway-0"));

    // The pod moves to another IP: the old one no longer names it.
    index.apply(&pod(UID, "gateway-0", "10.244.1.8"));
    assert_eq!(index.pod_by_ip(ip), None);

    // A new pod takes the IP; deleting the old pod does not take it away again.
    let other = "11111111-2222-3333-4444-555555555555";
    index.apply(&pod(other, "gateway-1", "10.244.1.8"));
    index.delete(&pod(UID, "gateway-0", "10.244.1.8"));
    assert_eq!(
        index.pod_by_ip("10.244.1.8".parse().expect("ip")),
        named("gateway-1")
    );
    assert_eq!(index.pod_by_uid(UID), None);
    assert_eq!(index.pod_count(), 1);
}

#[test]
fn host_network_and_finished_pods_hold_no_ip_and_the_index_is_bounded() {
    let mut index = PodIndex::new(2);
    let mut host = pod(UID, "node-agent", "192.168.0.5");
    host.spec = Some(PodSpec {
        host_network: Some(true),
        ..PodSpec::default()
    });
    index.apply(&host);
    assert_eq!(index.pod_by_ip("192.168.0.5".parse().expect("ip")), None);
    assert_eq!(index.pod_by_uid(UID), named("node-agent"));

    let mut finished = pod("11111111-2222-3333-4444-555555555555", "job", "10.0.0.9");
    if let Some(status) = &mut finished.status {
        status.phase = Some("Succeeded".into());
    }
    index.apply(&finished);
    assert_eq!(index.pod_by_ip("10.0.0.9".parse().expect("ip")), None);

    index.apply(&pod(
        "22222222-2222-3333-4444-555555555555",
        "third",
        "10.0.0.10",
    ));
    assert_eq!(index.pod_count(), 2);
    assert_eq!(index.turned_away, 1);
}
