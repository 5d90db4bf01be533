//! Names pods for alerts (`observer run --kube`): which pod holds a gateway IP, and which pod
//! a pusher or proxy process runs in.
//!
//! Pods come from a watch on the Kubernetes API and are kept in a bounded [`PodIndex`]. A
//! process is tied to its pod through its cgroup: events carry the cgroup v2 id, which is the
//! inode number of the cgroup's directory, and the kubelet names pod cgroups after the pod UID.
//! Alerts are enriched at output time ([`PodDirectory::enrich`]) so the correlation engine knows
//! nothing of Kubernetes, and a replay without `--kube` prints exactly what it did before.

use std::{
    collections::HashMap,
    net::IpAddr,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
    time::{Duration, Instant},
};

use futures_util::TryStreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{WatchStreamExt, watcher};
use thiserror::Error;

use crate::alert::{
    Alert, AlertBody, GatewayInfo, PodRef, ProcessInfo, RouteMismatch, WorkloadRef,
};

/// Describes why `--kube` cannot build a Kubernetes client.
#[derive(Debug, Error)]
pub enum IdentityError {
    #[error("--kube: no in-cluster service account and no kubeconfig: {0}")]
    NoConfig(String),
    #[error("--kube: cannot build a Kubernetes client: {0}")]
    Client(String),
}

/// Names the environment variable the DaemonSet sets from `spec.nodeName` (the downward API).
pub const NODE_NAME_ENV: &str = "NODE_NAME";

/// Returns the name of the node this observer runs on, as every alert names it: `explicit`
/// (`--node-name`) when given, else `NODE_NAME`, else the hostname, else `unknown`.
pub fn node_name(explicit: Option<&str>) -> String {
    let given = explicit
        .map(str::to_owned)
        .or_else(|| std::env::var(NODE_NAME_ENV).ok());
    given
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .or_else(hostname)
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Returns the kernel's hostname (the UTS namespace's), without a system call's buffer to size.
fn hostname() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim();
    (!name.is_empty()).then(|| name.to_owned())
}

/// Connects a client to the cluster the observer runs in (its service account), or the
/// kubeconfig's.
///
/// # Errors
///
/// Fails with [`IdentityError::NoConfig`] when there is neither an in-cluster service account nor a
/// kubeconfig, and [`IdentityError::Client`] when no client can be built from the config found.
pub async fn connect() -> Result<kube::Client, IdentityError> {
    let config = kube::Config::infer()
        .await
        .map_err(|error| IdentityError::NoConfig(one_line(&error)))?;
    kube::Client::try_from(config).map_err(|error| IdentityError::Client(one_line(&error)))
}

/// Writes an error and its causes on one line.
fn one_line(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        // Many errors already print their cause: say it once.
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = cause.source();
    }
    line.replace('\n', " ")
}

/// Shares the pod index between the watch task (writer) and the output (reader).
pub type SharedPods = Arc<RwLock<PodIndex>>;

/// Keeps `pods` in step with the pods of `namespaces` (every namespace when empty) until the
/// process ends: one watch per namespace, so the service account needs read access to those
/// namespaces only. Restarts and relists are the watcher's (with backoff); a relist replaces
/// its namespace's pods only once complete, so lookups keep answering from the previous state
/// meanwhile and pods deleted while the watch was down disappear.
pub async fn watch_pods(client: kube::Client, pods: SharedPods, namespaces: Vec<String>) {
    if namespaces.is_empty() {
        return watch_scope(kube::Api::all(client), &pods, None).await;
    }
    let watches = namespaces.iter().map(|namespace| {
        let api = kube::Api::namespaced(client.clone(), namespace);
        watch_scope(api, &pods, Some(namespace.as_str()))
    });
    futures_util::future::join_all(watches).await;
}

/// Runs one watch: the whole cluster (`namespace` None) or one namespace.
async fn watch_scope(api: kube::Api<Pod>, pods: &SharedPods, namespace: Option<&str>) {
    let (capacity, label_keys) = {
        let shared = read(pods);
        (shared.capacity, Arc::clone(&shared.label_keys))
    };
    let events = watcher(api, watcher::Config::default()).default_backoff();
    futures_util::pin_mut!(events);
    let mut relisted: Option<PodIndex> = None;
    let mut loaded_once = false;
    loop {
        match events.try_next().await {
            Ok(Some(watcher::Event::Init)) => {
                relisted = Some(PodIndex::with_labels(capacity, label_keys.to_vec()));
            }
            Ok(Some(watcher::Event::InitApply(pod))) => {
                if let Some(index) = &mut relisted {
                    index.apply(&pod);
                }
            }
            Ok(Some(watcher::Event::InitDone)) => {
                if let Some(index) = relisted.take() {
                    tracing::info!(
                        namespace = namespace.unwrap_or("(all)"),
                        pods = index.pod_count(),
                        turned_away = index.turned_away,
                        "pod list loaded"
                    );
                    let mut shared = write(pods);
                    let lists_loaded = shared.lists_loaded + usize::from(!loaded_once);
                    match namespace {
                        Some(namespace) => shared.replace_namespace(namespace, index),
                        None => *shared = index,
                    }
                    shared.lists_loaded = lists_loaded;
                    loaded_once = true;
                }
            }
            Ok(Some(watcher::Event::Apply(pod))) => write(pods).apply(&pod),
            Ok(Some(watcher::Event::Delete(pod))) => write(pods).delete(&pod),
            Ok(None) => return,
            // The backoff spaces the retries; every failure is worth a line.
            Err(error) => tracing::warn!("pod watch: {}", one_line(&error)),
        }
    }
}

// A panic while the lock is held leaves at worst one pod's entries stale, which the next event
// for that pod repairs: a poisoned lock is still worth reading.
fn read(pods: &SharedPods) -> std::sync::RwLockReadGuard<'_, PodIndex> {
    pods.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write(pods: &SharedPods) -> std::sync::RwLockWriteGuard<'_, PodIndex> {
    pods.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[derive(Debug)]
struct PodEntry {
    /// Without `container`: which one depends on who asks.
    pod: PodRef,
    ips: Vec<IpAddr>,
    containers: Vec<ContainerEntry>,
}

/// Describes a container of a pod: its name, the id its runtime gives it (the cgroup names it), the
/// ports it declares.
#[derive(Debug)]
struct ContainerEntry {
    name: String,
    id: Option<String>,
    ports: Vec<u16>,
}

impl PodEntry {
    /// Returns the pod, naming the container whose runtime id is `container_id`.
    fn with_container_id(&self, container_id: Option<&str>) -> PodRef {
        let container = container_id.and_then(|id| {
            self.containers
                .iter()
                .find(|container| container.id.as_deref() == Some(id))
        });
        self.with_container(container)
    }

    /// Returns the pod, naming the container that declares `port`, else its only container.
    fn with_port(&self, port: u16) -> PodRef {
        let declaring = self
            .containers
            .iter()
            .find(|container| container.ports.contains(&port));
        let only = match self.containers.as_slice() {
            [only] => Some(only),
            _ => None,
        };
        self.with_container(declaring.or(only))
    }

    fn with_container(&self, container: Option<&ContainerEntry>) -> PodRef {
        PodRef {
            container: container.map(|container| container.name.clone()),
            ..self.pod.clone()
        }
    }
}

/// Indexes pods by UID and by IP, at most `capacity` pods; pods beyond it are counted and not
/// named.
#[derive(Debug)]
pub struct PodIndex {
    capacity: usize,
    /// `--pod-labels`: the label keys alerts carry.
    label_keys: Arc<[String]>,
    by_uid: HashMap<String, PodEntry>,
    /// IP → UID of the pod holding it.
    by_ip: HashMap<IpAddr, String>,
    /// Pods not indexed because the index was full.
    pub turned_away: u64,
    /// Scopes of the watch (namespaces, or the whole cluster) whose pod list has loaded.
    lists_loaded: usize,
}

impl PodIndex {
    /// Builds an empty index of at most `capacity` pods that keeps no labels.
    pub fn new(capacity: usize) -> Self {
        Self::with_labels(capacity, Vec::new())
    }

    /// Builds an index that keeps, of each pod's labels, those named in `label_keys`.
    pub fn with_labels(capacity: usize, label_keys: Vec<String>) -> Self {
        Self {
            capacity,
            label_keys: label_keys.into(),
            by_uid: HashMap::new(),
            by_ip: HashMap::new(),
            turned_away: 0,
            lists_loaded: 0,
        }
    }

    /// Tells how many of the watch's scopes (namespaces, or the whole cluster) have loaded
    /// their pod list at least once: `/readyz` waits for all of them.
    pub fn lists_loaded(&self) -> usize {
        self.lists_loaded
    }

    /// Builds an empty shared index of at most `capacity` pods that keeps no labels.
    pub fn shared(capacity: usize) -> SharedPods {
        Self::shared_with_labels(capacity, Vec::new())
    }

    /// Builds a shared index that keeps the labels named in `label_keys` (`--pod-labels`).
    pub fn shared_with_labels(capacity: usize, label_keys: Vec<String>) -> SharedPods {
        Arc::new(RwLock::new(Self::with_labels(capacity, label_keys)))
    }

    /// Counts the pods indexed.
    pub fn pod_count(&self) -> usize {
        self.by_uid.len()
    }

    /// Records a pod as added or modified.
    pub fn apply(&mut self, pod: &Pod) {
        let (Some(uid), Some(namespace), Some(name)) = (
            pod.metadata.uid.as_ref(),
            pod.metadata.namespace.as_ref(),
            pod.metadata.name.as_ref(),
        ) else {
            return;
        };
        if !self.by_uid.contains_key(uid) && self.by_uid.len() >= self.capacity {
            self.turned_away += 1;
            return;
        }
        self.forget_ips(uid);
        let ips = ips_of(pod);
        for ip in &ips {
            // The newest pod to claim an IP holds it: IPs are reused once a pod is gone.
            self.by_ip.insert(*ip, uid.clone());
        }
        let labels = pod.metadata.labels.iter().flatten();
        let pod_ref = PodRef {
            namespace: namespace.clone(),
            name: name.clone(),
            container: None,
            workload: workload_of(pod),
            labels: labels
                .filter(|(key, _)| self.label_keys.contains(key))
                .map(|(key, value)| (key.clone(), value.clone()))
                .collect(),
        };
        let entry = PodEntry {
            pod: pod_ref,
            ips,
            containers: containers_of(pod),
        };
        self.by_uid.insert(uid.clone(), entry);
    }

    /// Forgets a deleted pod and its IPs.
    pub fn delete(&mut self, pod: &Pod) {
        if let Some(uid) = &pod.metadata.uid {
            self.forget_ips(uid);
            self.by_uid.remove(uid);
        }
    }

    /// Replaces the pods of `namespace` with those of `relisted` (a fresh list of that
    /// namespace), leaving other namespaces' pods as they are.
    pub fn replace_namespace(&mut self, namespace: &str, relisted: PodIndex) {
        let stale: Vec<String> = self
            .by_uid
            .iter()
            .filter(|(_, entry)| entry.pod.namespace == namespace)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in &stale {
            self.forget_ips(uid);
            self.by_uid.remove(uid);
        }
        self.turned_away += relisted.turned_away;
        for (uid, entry) in relisted.by_uid {
            if !self.by_uid.contains_key(&uid) && self.by_uid.len() >= self.capacity {
                self.turned_away += 1;
                continue;
            }
            self.forget_ips(&uid);
            for ip in &entry.ips {
                self.by_ip.insert(*ip, uid.clone());
            }
            self.by_uid.insert(uid, entry);
        }
    }

    /// Drops the IPs `uid` holds, unless another pod has claimed them since.
    fn forget_ips(&mut self, uid: &str) {
        let Some(entry) = self.by_uid.get(uid) else {
            return;
        };
        for ip in &entry.ips {
            if self.by_ip.get(ip).is_some_and(|holder| holder == uid) {
                self.by_ip.remove(ip);
            }
        }
    }

    /// Returns the pod that holds `ip`, without a container.
    pub fn pod_by_ip(&self, ip: IpAddr) -> Option<PodRef> {
        let uid = self.by_ip.get(&ip.to_canonical())?;
        self.pod_by_uid(uid)
    }

    /// Returns the pod that holds `ip`, naming the container that serves `port`.
    pub fn pod_by_endpoint(&self, ip: IpAddr, port: u16) -> Option<PodRef> {
        let uid = self.by_ip.get(&ip.to_canonical())?;
        self.by_uid.get(uid).map(|entry| entry.with_port(port))
    }

    /// Returns the pod `uid`, without a container.
    pub fn pod_by_uid(&self, uid: &str) -> Option<PodRef> {
        self.by_uid.get(uid).map(|entry| entry.pod.clone())
    }

    /// Returns the pod `uid`, naming the container whose runtime id is `container_id`.
    pub fn pod_by_container(&self, uid: &str, container_id: Option<&str>) -> Option<PodRef> {
        self.by_uid
            .get(uid)
            .map(|entry| entry.with_container_id(container_id))
    }
}

/// Returns the controller that owns `pod`, as `kubectl` names it: a ReplicaSet whose name ends in
/// the pod's `pod-template-hash` is its Deployment's (the hash stripped); any other controller
/// (StatefulSet, DaemonSet, Job, a bare ReplicaSet) by its own kind and name.
fn workload_of(pod: &Pod) -> Option<WorkloadRef> {
    let owner = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|owner| owner.controller == Some(true))?;
    let hash = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get("pod-template-hash"));
    let deployment = match (owner.kind.as_str(), hash) {
        ("ReplicaSet", Some(hash)) => owner
            .name
            .strip_suffix(hash.as_str())
            .and_then(|name| name.strip_suffix('-')),
        _ => None,
    };
    Some(match deployment {
        Some(name) => WorkloadRef {
            kind: "Deployment".to_owned(),
            name: name.to_owned(),
        },
        None => WorkloadRef {
            kind: owner.kind.clone(),
            name: owner.name.clone(),
        },
    })
}

/// Lists the containers of `pod` (init containers too: a process may run in one), with the runtime
/// ids the status gives them (`containerd://<id>`, kept without the scheme) and their ports.
fn containers_of(pod: &Pod) -> Vec<ContainerEntry> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    let statuses = pod.status.as_ref().into_iter().flat_map(|status| {
        let running = status.container_statuses.iter().flatten();
        running.chain(status.init_container_statuses.iter().flatten())
    });
    let ids: HashMap<&str, &str> = statuses
        .filter_map(|status| {
            let id = status.container_id.as_deref()?;
            let id = id.split_once("://").map_or(id, |(_, id)| id);
            Some((status.name.as_str(), id))
        })
        .collect();
    let declared = spec.containers.iter();
    declared
        .chain(spec.init_containers.iter().flatten())
        .map(|container| ContainerEntry {
            name: container.name.clone(),
            id: ids.get(container.name.as_str()).map(|id| (*id).to_owned()),
            ports: container
                .ports
                .iter()
                .flatten()
                .filter_map(|port| u16::try_from(port.container_port).ok())
                .collect(),
        })
        .collect()
}

/// Lists the IPs that identify `pod`: none for host-network pods (they share the node's IP) and for
/// finished pods (their IPs go to new pods).
fn ips_of(pod: &Pod) -> Vec<IpAddr> {
    if pod
        .spec
        .as_ref()
        .and_then(|spec| spec.host_network)
        .unwrap_or(false)
    {
        return Vec::new();
    }
    let Some(status) = &pod.status else {
        return Vec::new();
    };
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return Vec::new();
    }
    let listed = status.pod_ips.iter().flatten().map(|pod_ip| &pod_ip.ip);
    let mut ips: Vec<IpAddr> = listed
        .chain(status.pod_ip.as_ref())
        .filter_map(|ip| ip.parse::<IpAddr>().ok())
        // A pod's IPv4 address is one identity, however an API server spells it.
        .map(|ip| ip.to_canonical())
        .collect();
    ips.sort_unstable();
    ips.dedup();
    ips
}

/// Bounds the cgroups remembered: far more than the containers of one node.
const MAX_CGROUPS: usize = 65_536;
/// Bounds the directories one scan visits, so a huge hierarchy costs a bounded amount of work.
const MAX_SCANNED_DIRECTORIES: usize = 200_000;
/// Bounds the scan's depth: the kubelet's pod cgroups sit a few levels down (`kubepods.slice/
/// kubepods-burstable.slice/kubepods-burstable-pod….slice/cri-containerd-….scope`), deeper when
/// the node itself is nested.
const MAX_SCAN_DEPTH: usize = 8;

/// Maps cgroup id → pod UID, learned by scanning the cgroup v2 hierarchy for the kubelet's pod
/// directories. A miss rescans, at most once per `min_rescan_interval`: processes outside pods
/// miss every time, and a new pod's cgroup appears between two scans.
#[derive(Debug)]
pub struct CgroupIndex {
    root: PathBuf,
    /// cgroup id → the pod's UID, and the container's runtime id for a container's cgroup.
    pod_uids: HashMap<u64, (String, Option<String>)>,
    last_scan: Option<Instant>,
    min_rescan_interval: Duration,
}

impl CgroupIndex {
    /// Builds an empty index of the cgroup hierarchy at `root`, rescanned at most once per
    /// `min_rescan_interval`.
    pub fn new(root: PathBuf, min_rescan_interval: Duration) -> Self {
        Self {
            root,
            pod_uids: HashMap::new(),
            last_scan: None,
            min_rescan_interval,
        }
    }

    /// Returns the UID of the pod whose cgroup (or a container cgroup inside it) has id
    /// `cgroup_id`.
    pub fn pod_uid(&mut self, cgroup_id: u64) -> Option<&str> {
        self.pod_container(cgroup_id).map(|(uid, _)| uid)
    }

    /// Returns the UID of the pod whose cgroup has id `cgroup_id`, and the runtime id of the
    /// container when the cgroup is a container's.
    pub fn pod_container(&mut self, cgroup_id: u64) -> Option<(&str, Option<&str>)> {
        let due = self
            .last_scan
            .is_none_or(|last| last.elapsed() >= self.min_rescan_interval);
        if !self.pod_uids.contains_key(&cgroup_id) && due {
            self.rescan();
        }
        let (uid, container) = self.pod_uids.get(&cgroup_id)?;
        Some((uid.as_str(), container.as_deref()))
    }

    fn rescan(&mut self) {
        self.last_scan = Some(Instant::now());
        self.pod_uids.clear();
        let mut pending = vec![(self.root.clone(), 0)];
        let mut visited = 0;
        while let Some((directory, depth)) = pending.pop() {
            visited += 1;
            if visited > MAX_SCANNED_DIRECTORIES || self.pod_uids.len() >= MAX_CGROUPS {
                tracing::debug!(root = %self.root.display(), "cgroup scan stopped at its bound");
                break;
            }
            let relative = directory.strip_prefix(&self.root).unwrap_or(&directory);
            if let Some(uid) = pod_uid_from_cgroup_path(relative)
                && let Ok(metadata) = std::fs::metadata(&directory)
            {
                let container = container_id_from_cgroup_path(relative);
                self.pod_uids.insert(metadata.ino(), (uid, container));
            }
            // Below the top level only the kubelet's subtree holds pods.
            let descend = depth == 0 || relative.to_string_lossy().contains("kubepods");
            if depth >= MAX_SCAN_DEPTH || !descend {
                continue;
            }
            // Cgroups come and go while we read: an unreadable directory is skipped.
            let Ok(entries) = std::fs::read_dir(&directory) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                    pending.push((entry.path(), depth + 1));
                }
            }
        }
    }
}

/// Returns the pod UID in a kubelet cgroup path, from the innermost component that names one: the
/// systemd driver's `kubepods-besteffort-pod<uid with '_' for '-'>.slice` (or
/// `kubepods-pod….slice` for Guaranteed pods) or the cgroupfs driver's `pod<uid>`.
pub fn pod_uid_from_cgroup_path(path: &Path) -> Option<String> {
    path.components().rev().find_map(|component| {
        let component = component.as_os_str().to_str()?;
        let candidate = match component.strip_suffix(".slice") {
            Some(slice) => slice.rsplit_once("-pod")?.1.replace('_', "-"),
            None => component.strip_prefix("pod")?.to_owned(),
        };
        is_uid(&candidate).then_some(candidate)
    })
}

/// Returns the container runtime id in a kubelet cgroup path's last component: the systemd driver's
/// `cri-containerd-<id>.scope` (`crio-`, `docker-` alike) or the cgroupfs driver's `<id>`, where
/// the id is 64 hex digits; `None` for a pod's own cgroup.
pub fn container_id_from_cgroup_path(path: &Path) -> Option<String> {
    let last = path.file_name()?.to_str()?;
    let last = last.strip_suffix(".scope").unwrap_or(last);
    let id = last.rsplit_once('-').map_or(last, |(_, id)| id);
    let is_id = id.len() == 64 && id.bytes().all(|byte| byte.is_ascii_hexdigit());
    is_id.then(|| id.to_owned())
}

/// Says whether `text` is a UID as Kubernetes writes it: 8-4-4-4-12 hex digits.
fn is_uid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() == 5
        && groups.iter().zip([8, 4, 4, 4, 12]).all(|(group, length)| {
            group.len() == length && group.bytes().all(|byte| byte.is_ascii_hexdigit())
        })
}

/// Names pods for IPs and processes, from the watched pods and the node's cgroups.
#[derive(Debug)]
pub struct PodDirectory {
    pods: SharedPods,
    cgroups: CgroupIndex,
}

impl PodDirectory {
    /// Builds a directory over the watched `pods` and the node's `cgroups`.
    pub fn new(pods: SharedPods, cgroups: CgroupIndex) -> Self {
        Self { pods, cgroups }
    }

    /// Returns the pod that holds `ip`, without a container.
    pub fn pod_by_ip(&self, ip: IpAddr) -> Option<PodRef> {
        read(&self.pods).pod_by_ip(ip)
    }

    /// Returns the pod whose cgroup (or container cgroup inside it) has id `cgroup_id`, naming the
    /// container where the cgroup is one.
    pub fn pod_by_cgroup(&mut self, cgroup_id: u64) -> Option<PodRef> {
        let (uid, container) = self.cgroups.pod_container(cgroup_id)?;
        read(&self.pods).pod_by_container(uid, container)
    }

    /// Puts the pod next to every gateway IP and process of `alert` that it can name.
    pub fn enrich(&mut self, alert: &mut Alert) {
        match alert.body_mut() {
            AlertBody::RouteMismatch(RouteMismatch {
                placed_on,
                pushed_to,
                ..
            }) => {
                for placement in placed_on {
                    self.name_gateway(&mut placement.gateway);
                    self.name_process(&mut placement.proxy);
                }
                self.name_gateway(&mut pushed_to.gateway);
                self.name_process(&mut pushed_to.pusher);
            }
            AlertBody::RingDivergence { .. } | AlertBody::PushRouting { .. } => {}
            AlertBody::CaptureDegraded { affected, .. } => {
                for process in affected
                    .iter_mut()
                    .flat_map(|affected| &mut affected.processes)
                {
                    self.name_process(&mut process.process);
                }
            }
            AlertBody::WsUpgradeOnGrpcPort { gateway, proxy, .. } => {
                self.name_gateway(gateway);
                self.name_process(proxy);
            }
            AlertBody::PushConnectionChurn { pusher, .. } => self.name_process(pusher),
        }
    }

    fn name_gateway(&self, gateway: &mut GatewayInfo) {
        let endpoint = &gateway.gateway;
        gateway.pod = read(&self.pods)
            .pod_by_endpoint(endpoint.ip, endpoint.port)
            .map(Box::new);
    }

    fn name_process(&mut self, process: &mut ProcessInfo) {
        process.pod = self.pod_by_cgroup(process.process.cgroup_id).map(Box::new);
    }
}

#[cfg(test)]
mod tests;
