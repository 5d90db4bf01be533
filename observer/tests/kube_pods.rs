//! `--kube` against a fake API server: a plain HTTP/1.1 server in the test that answers the
//! pod list and watch requests a real kube-apiserver would, with Kubernetes JSON built from
//! k8s-openapi types. The observer's own watch code and a real `kube::Client` talk to it.

use std::{
    net::IpAddr,
    os::unix::fs::MetadataExt,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::{
    List,
    api::core::v1::{Pod, PodIP, PodSpec, PodStatus},
    apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta, Status, WatchEvent},
};
use observer::{
    alert::{Alert, AlertBody, PlacementInfo, PushInfo, RouteMismatch},
    identity::{self, CgroupIndex, PodDirectory, PodIndex, SharedPods},
    model::{Gateway, GatewayAnswer, MessageIds, MismatchCause, Process},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::mpsc,
};

const GATEWAY_0: &str = "00000000-0000-4000-8000-000000000000";
const GATEWAY_1: &str = "11111111-1111-4111-8111-111111111111";
const GATEWAY_2: &str = "22222222-2222-4222-8222-222222222222";
/// The push pod before the watch expired; it was replaced (new UID) while the watch was down.
const PUSH_BEFORE: &str = "33333333-3333-4333-8333-333333333333";
const PUSH: &str = "55555555-5555-4555-8555-555555555555";
const PROXY: &str = "44444444-4444-4444-8444-444444444444";

fn pod(uid: &str, name: &str, ip: &str, resource_version: u32) -> Pod {
    Pod {
        metadata: ObjectMeta {
            uid: Some(uid.into()),
            namespace: Some("chat".into()),
            name: Some(name.into()),
            resource_version: Some(resource_version.to_string()),
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

/// What the fake API server sends on the open watch.
enum WatchLine {
    Event(Box<WatchEvent<Pod>>),
    /// Ends the watch response, as the API server does after an ERROR event.
    End,
}

/// The API server's state: the pods a list returns, and the watch events still to send.
struct FakeApiServer {
    pods: Mutex<(Vec<Pod>, u32)>,
    /// The paths of the requests, without their query.
    requested: Mutex<Vec<String>>,
    watch: tokio::sync::Mutex<mpsc::UnboundedReceiver<WatchLine>>,
}

impl FakeApiServer {
    /// Serves `pods` (listed at `resource_version`) and then `watch_lines` on a loopback port;
    /// returns the server and a client of it.
    async fn start(
        pods: Vec<Pod>,
        resource_version: u32,
        watch_lines: mpsc::UnboundedReceiver<WatchLine>,
    ) -> (Arc<Self>, kube::Client) {
        let server = Arc::new(FakeApiServer {
            pods: Mutex::new((pods, resource_version)),
            watch: tokio::sync::Mutex::new(watch_lines),
            requested: Mutex::default(),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        tokio::spawn(Arc::clone(&server).serve(listener));
        let config = kube::Config::new(url.parse().expect("a URI"));
        (server, kube::Client::try_from(config).expect("a client"))
    }

    async fn serve(self: Arc<Self>, listener: TcpListener) {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(Arc::clone(&self).connection(stream));
        }
    }

    /// One keep-alive connection: GET requests, no bodies.
    async fn connection(self: Arc<Self>, mut stream: TcpStream) {
        let mut buffer = Vec::new();
        loop {
            let head_end = loop {
                if let Some(at) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
                    break at + 4;
                }
                let mut chunk = [0; 4096];
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(read) => buffer.extend_from_slice(&chunk[..read]),
                }
            };
            let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
            buffer.drain(..head_end);
            let target = head.split(' ').nth(1).unwrap_or_default().to_owned();
            let path = target.split('?').next().unwrap_or_default().to_owned();
            self.requested
                .lock()
                .expect("requests lock")
                .push(path.clone());
            let answered = if path != "/api/v1/pods" && path != "/api/v1/namespaces/chat/pods" {
                respond(&mut stream, "404 Not Found", b"{}").await
            } else if target.contains("watch=true") || target.contains("watch=1") {
                self.stream_watch(&mut stream).await
            } else {
                self.list(&mut stream).await
            };
            if answered.is_err() {
                return;
            }
        }
    }

    async fn list(&self, stream: &mut TcpStream) -> std::io::Result<()> {
        let body = {
            let pods = self.pods.lock().expect("pods lock");
            let list = List {
                items: pods.0.clone(),
                metadata: ListMeta {
                    resource_version: Some(pods.1.to_string()),
                    ..ListMeta::default()
                },
            };
            serde_json::to_vec(&list).expect("a PodList serialises")
        };
        respond(stream, "200 OK", &body).await
    }

    async fn stream_watch(&self, stream: &mut TcpStream) -> std::io::Result<()> {
        stream
            .write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
            )
            .await?;
        stream.flush().await?;
        let mut lines = self.watch.lock().await;
        while let Some(WatchLine::Event(event)) = lines.recv().await {
            let mut line = serde_json::to_vec(&event).expect("a WatchEvent serialises");
            line.push(b'\n');
            stream
                .write_all(format!("{:x}\r\n", line.len()).as_bytes())
                .await?;
            stream.write_all(&line).await?;
            stream.write_all(b"\r\n").await?;
            stream.flush().await?;
        }
        stream.write_all(b"0\r\n\r\n").await?;
        stream.flush().await
    }
}

async fn respond(stream: &mut TcpStream, status: &str, body: &[u8]) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    stream.flush().await
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("an IP")
}

/// Polls `condition` on the index until it holds, for at most 20 s (a relist waits out the
/// watcher's first backoff).
async fn eventually(pods: &SharedPods, what: &str, condition: impl Fn(&PodIndex) -> bool) {
    for _ in 0..200 {
        if condition(&pods.read().expect("pods lock")) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "the pod index never saw {what}: {:?}",
        pods.read().expect("pods lock")
    );
}

fn named(name: &str) -> Option<observer::alert::PodRef> {
    Some(observer::alert::PodRef::new("chat", name))
}

fn route_mismatch(proxy_cgroup: u64, pusher_cgroup: u64) -> Alert {
    let gateway = |address: &str, port: u16| {
        Gateway {
            ip: ip(address),
            port,
            name: None,
        }
        .into()
    };
    let process = |pid: u32, comm: &str, cgroup_id: u64| {
        Process {
            pid,
            comm: comm.into(),
            cgroup_id,
        }
        .into()
    };
    Alert::new(
        1,
        AlertBody::RouteMismatch(RouteMismatch {
            user: "4360894025".into(),
            placed_on: vec![PlacementInfo {
                gateway: gateway("10.244.1.11", 80),
                platforms: vec![1],
                since_ns: 1_796_045_032_382_672_000,
                proxy: process(30589, "msggw-proxy", proxy_cgroup),
                node: None,
            }],
            pushed_to: PushInfo {
                gateway: gateway("10.244.1.12", 88),
                method: "SuperGroupOnlineBatchPushOneMsg".into(),
                message: MessageIds::default(),
                pusher: process(30592, "openim-push", pusher_cgroup),
                answer: GatewayAnswer::EmptyEntry,
                answer_platforms: Vec::new(),
                node: None,
            },
            count: 1,
            window_secs: 60,
            spelling_difference: None,
            cause: MismatchCause::Undetermined,
        }),
    )
}

/// Pods added, moved to another IP and deleted in the fake API server name the alerts' pods
/// as the watch delivers them.
///
/// Longer than 100 lines on purpose: one scenario told in order, start to end; its steps
/// depend on the ones before.
#[tokio::test]
async fn pod_names_follow_the_watch_and_reach_the_alerts() {
    let (watch_events, watch_lines) = mpsc::unbounded_channel();
    let (server, client) = FakeApiServer::start(
        vec![
            pod(GATEWAY_0, "demo-openim-msggateway-0", "10.244.1.10", 1),
            pod(PUSH_BEFORE, "demo-openim-push-7d9f", "10.244.2.5", 2),
        ],
        2,
        watch_lines,
    )
    .await;
    let pods = PodIndex::shared(100);
    tokio::spawn(identity::watch_pods(client, Arc::clone(&pods), Vec::new()));

    eventually(&pods, "the listed gateway", |index| {
        index.pod_by_ip(ip("10.244.1.10")) == named("demo-openim-msggateway-0")
    })
    .await;

    // A scale-out adds gateway 1, gateway 0 moves to another IP, then is deleted.
    let send = |line| watch_events.send(line).expect("the server is listening");
    let send_event = |event| send(WatchLine::Event(Box::new(event)));
    send_event(WatchEvent::Added(pod(
        GATEWAY_1,
        "demo-openim-msggateway-1",
        "10.244.1.11",
        3,
    )));
    send_event(WatchEvent::Modified(pod(
        GATEWAY_0,
        "demo-openim-msggateway-0",
        "10.244.1.20",
        4,
    )));
    eventually(&pods, "the modification", |index| {
        index.pod_by_ip(ip("10.244.1.20")) == named("demo-openim-msggateway-0")
            && index.pod_by_ip(ip("10.244.1.10")).is_none()
            && index.pod_by_ip(ip("10.244.1.11")) == named("demo-openim-msggateway-1")
    })
    .await;
    send_event(WatchEvent::Deleted(pod(
        GATEWAY_0,
        "demo-openim-msggateway-0",
        "10.244.1.20",
        5,
    )));
    eventually(&pods, "the deletion", |index| {
        index.pod_by_ip(ip("10.244.1.20")).is_none() && index.pod_by_uid(GATEWAY_0).is_none()
    })
    .await;

    // The watch expires (410 Gone) while pods changed: the relist replaces what was known, so
    // the push pod deleted meanwhile is forgotten, with its IP, and the new pods are named.
    {
        let mut state = server.pods.lock().expect("pods lock");
        *state = (
            vec![
                pod(GATEWAY_1, "demo-openim-msggateway-1", "10.244.1.11", 3),
                pod(GATEWAY_2, "demo-openim-msggateway-2", "10.244.1.12", 6),
                pod(PUSH, "demo-openim-push-8c1a", "10.244.2.6", 7),
                pod(PROXY, "demo-openim-msggateway-proxy-5b6c", "10.244.2.7", 8),
            ],
            8,
        );
    }
    send_event(WatchEvent::ErrorStatus(Status {
        code: Some(410),
        reason: Some("Expired".into()),
        message: Some("too old resource version: 5 (8)".into()),
        status: Some("Failure".into()),
        ..Status::default()
    }));
    send(WatchLine::End);
    eventually(&pods, "the relist", |index| {
        index.pod_by_ip(ip("10.244.1.12")) == named("demo-openim-msggateway-2")
            && index.pod_by_ip(ip("10.244.2.5")).is_none()
            && index.pod_by_uid(PUSH_BEFORE).is_none()
            && index.pod_count() == 4
    })
    .await;

    // The processes' cgroups, laid out as the systemd driver does.
    let cgroup_root = tempfile::tempdir().expect("temp dir");
    let container_cgroup = |uid: &str| {
        let path = cgroup_root
            .path()
            .join("kubepods.slice/kubepods-burstable.slice")
            .join(format!(
                "kubepods-burstable-pod{}.slice",
                uid.replace('-', "_")
            ))
            .join("cri-containerd-0123abcd.scope");
        std::fs::create_dir_all(&path).expect("create cgroup dirs");
        std::fs::metadata(&path).expect("stat").ino()
    };
    let (proxy_cgroup, pusher_cgroup) = (container_cgroup(PROXY), container_cgroup(PUSH));
    let cgroups = CgroupIndex::new(cgroup_root.path().to_owned(), Duration::from_secs(10));
    let mut directory = PodDirectory::new(Arc::clone(&pods), cgroups);

    let mut alert = route_mismatch(proxy_cgroup, pusher_cgroup);
    directory.enrich(&mut alert);
    let line = alert.to_json_line();
    for expected in [
        r#""gateway":{"ip":"10.244.1.11","port":80,"pod":{"namespace":"chat","name":"demo-openim-msggateway-1"}}"#,
        r#""gateway":{"ip":"10.244.1.12","port":88,"pod":{"namespace":"chat","name":"demo-openim-msggateway-2"}}"#,
        r#""proxy":{"pid":30589,"comm":"msggw-proxy","pod":{"namespace":"chat","name":"demo-openim-msggateway-proxy-5b6c"}}"#,
        r#""pusher":{"pid":30592,"comm":"openim-push","pod":{"namespace":"chat","name":"demo-openim-push-8c1a"}}"#,
    ] {
        assert!(line.contains(expected), "{expected} not in {line}");
    }

    // Without a pod for them, IPs and processes print as before: no `pod` key.
    let mut unknown = route_mismatch(1, 2);
    if let AlertBody::RouteMismatch(RouteMismatch { pushed_to, .. }) = unknown.body_mut() {
        pushed_to.gateway.gateway.ip = ip("10.9.9.9");
    }
    directory.enrich(&mut unknown);
    let line = unknown.to_json_line();
    assert!(
        line.contains(r#""gateway":{"ip":"10.9.9.9","port":88},"#),
        "{line}"
    );
    assert!(
        line.contains(r#""pusher":{"pid":30592,"comm":"openim-push"},"#),
        "{line}"
    );
}

#[tokio::test]
async fn a_namespaced_watch_asks_only_for_that_namespace() {
    let (_watch_events, watch_lines) = mpsc::unbounded_channel();
    let (server, client) = FakeApiServer::start(
        vec![pod(GATEWAY_0, "demo-openim-msggateway-0", "10.244.1.10", 1)],
        1,
        watch_lines,
    )
    .await;
    let pods = PodIndex::shared(100);
    tokio::spawn(identity::watch_pods(
        client,
        Arc::clone(&pods),
        vec!["chat".to_owned()],
    ));
    eventually(&pods, "the listed gateway", |index| {
        index.pod_by_ip(ip("10.244.1.10")) == named("demo-openim-msggateway-0")
    })
    .await;
    let requested = server.requested.lock().expect("requests lock").clone();
    assert!(!requested.is_empty());
    assert!(
        requested
            .iter()
            .all(|path| path == "/api/v1/namespaces/chat/pods"),
        "{requested:?}"
    );
}
