//! The container image under a real OCI runtime, with the DaemonSet's security contexts.
//!
//! `cargo xtask image` writes target/image/openim-observer.oci.tar (`cargo xtask test` and
//! `cargo xtask image --test` build it first and name it in `OPENIM_IMAGE_ARCHIVE`). Each test
//! unpacks it into an OCI bundle whose config.json is the pod of deploy/kubernetes (the base
//! DaemonSet, or the base with the privileged overlay's patch or the syscall-hook component's)
//! translated the way containerd's CRI plugin translates a pod, and runs it with runc:
//! - the container's `securityContext`: capabilities (from containerd's default set, `drop`
//!   then `add`), `privileged` (every capability the runtime holds, no seccomp filter, no masked
//!   or read-only /proc and /sys paths, writable /sys, every device allowed),
//!   `allowPrivilegeEscalation` (no_new_privs), `readOnlyRootFilesystem`,
//!   `runAsUser`/`runAsGroup`, and `seccompProfile` (`RuntimeDefault` is resolved below from the
//!   runtime's default profile for the held capabilities, `Unconfined` is none);
//! - the pod's `hostPID` and `hostNetwork` (without it, a network namespace of its own on a
//!   bridge, like a pod IP), the hostPath volumes and their mounts (read-only ones read-only),
//!   the resource requests and limits (cgroup), the args with `$(VAR)` taken from env and the
//!   ConfigMap, and the image's entrypoint, user and environment;
//! - containerd's defaults for everything the pod leaves out: /proc, /dev, /sys and cgroup
//!   mounts, masked and read-only paths, the device cgroup.
//!
//! Left out, because the observer touches none of it: the kubelet's /etc/hosts, /etc/hostname,
//! /etc/resolv.conf and /dev/termination-log bind mounts, the pause container (its namespaces
//! are created here directly), and AppArmor (this kernel has none; the runtime applies its
//! default profile only where the kernel has AppArmor).
//!
//! Needs root, runc and the containers-common package (both come with `cargo xtask image`), and
//! loads the eBPF programs: tests share kernel state, so they take `SERIAL`; run them under the
//! machine lock.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::sync::mpsc::{self, Receiver};
use std::thread;
use std::time::{Duration, Instant};

use k8s_openapi::DeepMerge;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, PodSpec};
use openim_test_kit::cgroup2::Cgroup2Mount;
use serde_json::{Value, json};
use tests::lab::netns::{self, Network, PodNet};
use tests::privileges::{Needs, can_run};

static SERIAL: Mutex<()> = Mutex::new(());

/// Loading and verifying the programs takes a few seconds; a busy CI machine gets more.
const WAIT: Duration = Duration::from_secs(30);

const ARCHIVE_ENV: &str = "OPENIM_IMAGE_ARCHIVE";
const CONTAINER: &str = "observer";
/// The ConfigMap's values in these tests: ports no other test watches.
const GRPC_PORT: u16 = 18961;
const WS_PORT: u16 = 18962;
/// The pod's address on the test bridge (10.244.X.`POD_HOST`).
const POD_HOST: u8 = 2;

/// containers-common's default profile: the file podman, buildah and CRI-O of its generation
/// (Debian 12 ships 0.50) resolve for each container. It allows bpf() and perf_event_open()
/// only with CAP_SYS_ADMIN.
const CONTAINERS_COMMON_SECCOMP: &str = "/usr/share/containers/seccomp.json";

/// The runtime's default seccomp profile, which `seccompProfile: RuntimeDefault` means.
#[derive(Clone, Copy)]
enum DefaultProfile {
    /// containerd 1.7+ and Docker 23+: the same Docker-derived rules, plus the two that allow
    /// bpf() to holders of CAP_BPF and perf_event_open() to holders of CAP_PERFMON.
    Containerd,
    /// CRI-O and older containerd: bpf() and perf_event_open() with CAP_SYS_ADMIN only.
    ContainersCommon,
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn archive() -> PathBuf {
    std::env::var_os(ARCHIVE_ENV).map_or_else(
        || workspace().join("target/image/openim-observer.oci.tar"),
        PathBuf::from,
    )
}

/// Whether these tests can run here: as root, with the archive `cargo xtask image` wrote. On a
/// plain `cargo test` they skip and say why; under `cargo xtask test` (which builds the image
/// and sets `OBSERVER_REQUIRE_EBPF`) a missing archive fails them.
fn ready() -> bool {
    if !can_run(Needs::RootAndPrograms) {
        return false;
    }
    let path = archive();
    if path.is_file() {
        return true;
    }
    let reason = format!(
        "no image at {}: build it with `cargo xtask image` (or run `cargo xtask image --test`)",
        path.display()
    );
    if std::env::var_os("OBSERVER_REQUIRE_EBPF").is_some() {
        panic!("{reason}");
    }
    // Past the harness's capture, so a passing run shows it.
    let _ = writeln!(std::io::stderr(), "skipped image tests: {reason}");
    false
}

/// Checks that `commit`, which `what` names, is a commit (abbreviated hex) when these tests run
/// in a git checkout, where `cargo xtask image` builds the image from git. Elsewhere (a source
/// archive) the image may say `unknown` and is not checked.
fn assert_names_a_commit(commit: &str, what: &str) {
    let in_git = Command::new("git")
        .current_dir(workspace())
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .is_ok_and(|output| output.status.success());
    if !in_git {
        return;
    }
    assert!(
        commit.len() >= 7 && commit.bytes().all(|byte| byte.is_ascii_hexdigit()),
        "{what} is {commit:?}, not the commit the image was built from (`cargo xtask image` \
         sets OPENIM_OBSERVER_COMMIT from git)"
    );
}

/// The `commit` label of the `openim_observer_build_info` sample in a /metrics body.
fn build_info_commit(metrics: &str) -> Option<&str> {
    let sample = metrics
        .lines()
        .find(|line| line.starts_with("openim_observer_build_info{"))?;
    let (_, rest) = sample.split_once("commit=\"")?;
    rest.split_once('"').map(|(commit, _)| commit)
}

fn run(command: &mut Command) -> String {
    let output = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|err| panic!("starting {command:?}: {err}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|err| panic!("reading {}: {err}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// A scratch directory under target/tmp, removed when dropped.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(name: &str) -> Self {
        let path =
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|err| panic!("creating {}: {err}", path.display()));
        Self(path)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The parts of the image's configuration a runtime uses.
struct ImageConfig {
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    env: Vec<String>,
    user: String,
    /// The `org.opencontainers.image.revision` label.
    revision: String,
}

/// Unpacks the OCI archive: its layers into `dir/rootfs`, and its configuration.
fn unpack(archive: &Path, dir: &Path) -> ImageConfig {
    let layout = dir.join("layout");
    std::fs::create_dir_all(&layout).expect("create the layout directory");
    run(Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(&layout));
    let blob = |digest: &Value| {
        let digest = digest.as_str().expect("a digest is a string");
        let (algorithm, hex) = digest.split_once(':').expect("algorithm:hex");
        layout.join("blobs").join(algorithm).join(hex)
    };
    let index = read_json(&layout.join("index.json"));
    let manifests = index["manifests"]
        .as_array()
        .expect("index.json: manifests");
    assert_eq!(manifests.len(), 1, "the archive holds one image");
    let manifest = read_json(&blob(&manifests[0]["digest"]));
    let config = read_json(&blob(&manifest["config"]["digest"]));
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], "amd64");

    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(&rootfs).expect("create the rootfs directory");
    for layer in manifest["layers"].as_array().expect("manifest: layers") {
        // GNU tar recognises a compressed layer by itself.
        run(Command::new("tar")
            .arg("-xf")
            .arg(blob(&layer["digest"]))
            .arg("-C")
            .arg(&rootfs));
    }
    std::fs::remove_dir_all(&layout).expect("remove the unpacked layout");

    let strings = |value: &Value| -> Vec<String> {
        value
            .as_array()
            .into_iter()
            .flatten()
            .map(|item| item.as_str().expect("a string").to_owned())
            .collect()
    };
    let config = &config["config"];
    ImageConfig {
        entrypoint: strings(&config["Entrypoint"]),
        cmd: strings(&config["Cmd"]),
        env: strings(&config["Env"]),
        user: config["User"].as_str().unwrap_or("0:0").to_owned(),
        revision: config["Labels"]["org.opencontainers.image.revision"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    }
}

/// Which DaemonSet of deploy/kubernetes runs.
#[derive(Clone, Copy, Debug)]
enum Variant {
    /// The base: the least-privilege pod every overlay but `privileged` keeps.
    Base,
    /// The base with overlays/privileged's patch.
    Privileged,
    /// The base with components/syscall-hook's JSON patch.
    SyscallHook,
}

/// A YAML file of deploy/kubernetes, parsed.
fn read_manifest<T: serde::de::DeserializeOwned>(relative: &str) -> T {
    let path = workspace().join("deploy/kubernetes").join(relative);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("reading {}: {err}", path.display()));
    serde_norway::from_str(&text).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

fn daemonset(variant: Variant) -> DaemonSet {
    let mut daemonset: DaemonSet = read_manifest("base/daemonset.yaml");
    match variant {
        Variant::Base => {}
        // A strategic-merge patch; tests/tests/manifests.rs checks that the overlay is exactly
        // this merge on top of the base.
        Variant::Privileged => {
            daemonset.merge_from(read_manifest(
                "overlays/privileged/daemonset-privileged.yaml",
            ));
        }
        Variant::SyscallHook => {
            let operations: Vec<Value> =
                read_manifest("components/syscall-hook/daemonset-syscalls.yaml");
            let mut object = serde_json::to_value(&daemonset).expect("a DaemonSet serialises");
            for operation in &operations {
                apply_json_patch(&mut object, operation);
            }
            daemonset = serde_json::from_value(object).expect("the patched DaemonSet parses");
        }
    }
    daemonset
}

/// One `add` or `replace` operation of a JSON patch (RFC 6902), as kustomize applies a
/// component's: `add` to an object member or appended to an array (`-`), `replace` of a value
/// that exists. Any other operation fails the test, so a component that starts using one is
/// noticed here.
fn apply_json_patch(document: &mut Value, operation: &Value) {
    let path = operation["path"].as_str().expect("an operation has a path");
    let value = operation["value"].clone();
    match operation["op"].as_str() {
        Some("replace") => {
            *document
                .pointer_mut(path)
                .unwrap_or_else(|| panic!("{path} is not in the base DaemonSet")) = value;
        }
        Some("add") => {
            let (parent, last) = path.rsplit_once('/').expect("a path below the root");
            let target = document
                .pointer_mut(parent)
                .unwrap_or_else(|| panic!("{parent} is not in the base DaemonSet"));
            match target {
                Value::Array(items) if last == "-" => items.push(value),
                Value::Object(members) => {
                    members.insert(last.to_owned(), value);
                }
                other => panic!("add at {path}: not translated for {other}"),
            }
        }
        _ => panic!("only add and replace are translated: {operation}"),
    }
}

fn pod_and_container(daemonset: &DaemonSet) -> (PodSpec, Container) {
    let pod = daemonset
        .spec
        .as_ref()
        .and_then(|spec| spec.template.spec.clone())
        .expect("the DaemonSet has a pod spec");
    let container = pod
        .containers
        .iter()
        .find(|container| container.name == CONTAINER)
        .cloned()
        .expect("the DaemonSet has the observer container");
    (pod, container)
}

/// containerd's capabilities for a container that asks for no change (its `DefaultUnixSpec`).
const CONTAINERD_DEFAULT_CAPABILITIES: [&str; 14] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// Capability names without `CAP_`, in bit order (linux/capability.h).
const CAPABILITY_NAMES: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// The capabilities this process holds, which a privileged container gets: containerd gives it
/// every capability the runtime itself has (`WithAllCurrentCapabilities`), not every one the
/// kernel knows.
fn current_capabilities() -> BTreeSet<String> {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let effective = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .expect("CapEff in /proc/self/status");
    CAPABILITY_NAMES
        .iter()
        .enumerate()
        .filter(|(bit, _)| effective & (1 << bit) != 0)
        .map(|(_, name)| format!("CAP_{name}"))
        .collect()
}

/// The capabilities a container's `securityContext` leaves it.
fn capabilities(container: &Container) -> BTreeSet<String> {
    let security = container.security_context.clone().unwrap_or_default();
    if security.privileged == Some(true) {
        return current_capabilities();
    }
    let asked = security.capabilities.unwrap_or_default();
    let named = |list: Option<Vec<String>>| -> Vec<String> {
        list.into_iter()
            .flatten()
            .map(|name| format!("CAP_{name}"))
            .collect()
    };
    let drop = named(asked.drop);
    let mut held: BTreeSet<String> = if drop.iter().any(|name| name == "CAP_ALL") {
        BTreeSet::new()
    } else {
        CONTAINERD_DEFAULT_CAPABILITIES
            .iter()
            .map(|name| (*name).to_owned())
            .filter(|name| !drop.contains(name))
            .collect()
    };
    held.extend(named(asked.add));
    held
}

/// The seccomp filter the runtime derives from its default profile for a container holding
/// `held`, as the OCI runtime spec writes it: a rule applies when the container holds every
/// capability it `includes` and none it `excludes`, and its architectures fit this machine.
fn runtime_default_seccomp(held: &BTreeSet<String>, profile: DefaultProfile) -> Value {
    const ARCH: &str = "amd64";
    let source = read_json(Path::new(CONTAINERS_COMMON_SECCOMP));
    let listed = |value: &Value| -> Vec<String> {
        value
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect()
    };
    let architectures: Vec<String> = source["archMap"]
        .as_array()
        .expect("the profile maps architectures")
        .iter()
        .find(|entry| entry["architecture"] == "SCMP_ARCH_X86_64")
        .map(|entry| {
            std::iter::once("SCMP_ARCH_X86_64".to_owned())
                .chain(listed(&entry["subArchitectures"]))
                .collect()
        })
        .expect("the profile covers x86_64");
    let mut rules: Vec<Value> = Vec::new();
    for rule in source["syscalls"]
        .as_array()
        .expect("the profile's syscalls")
    {
        let includes = &rule["includes"];
        let excludes = &rule["excludes"];
        let arches = listed(&includes["arches"]);
        let applies = listed(&includes["caps"])
            .iter()
            .all(|cap| held.contains(cap))
            && (arches.is_empty() || arches.iter().any(|arch| arch == ARCH))
            && !listed(&excludes["caps"])
                .iter()
                .any(|cap| held.contains(cap))
            && !listed(&excludes["arches"]).iter().any(|arch| arch == ARCH);
        if applies {
            let mut resolved = json!({
                "names": rule["names"],
                "action": rule["action"],
                "args": rule.get("args").cloned().unwrap_or(json!([])),
            });
            if let Some(errno) = rule.get("errnoRet") {
                resolved["errnoRet"] = errno.clone();
            }
            rules.push(resolved);
        }
    }
    if let DefaultProfile::Containerd = profile {
        for (syscall, capability) in [("bpf", "CAP_BPF"), ("perf_event_open", "CAP_PERFMON")] {
            if !held.contains(capability) {
                continue;
            }
            // One action per syscall: the allow replaces the EPERM rule.
            for rule in &mut rules {
                if rule["action"] != "SCMP_ACT_ALLOW"
                    && let Some(names) = rule["names"].as_array_mut()
                {
                    names.retain(|name| name != syscall);
                }
            }
            rules.push(json!({"names": [syscall], "action": "SCMP_ACT_ALLOW", "args": []}));
        }
        rules.retain(|rule| {
            rule["names"]
                .as_array()
                .is_some_and(|names| !names.is_empty())
        });
    }
    json!({
        "defaultAction": source["defaultAction"],
        "defaultErrnoRet": source["defaultErrnoRet"],
        "architectures": architectures,
        "syscalls": rules,
    })
}

/// CPU in millicores: `500m` or whole cores.
fn millicores(quantity: &str) -> u64 {
    match quantity.strip_suffix('m') {
        Some(milli) => milli.parse().expect("millicores"),
        None => quantity.parse::<u64>().expect("cores") * 1000,
    }
}

/// Memory in bytes, for the binary suffixes the manifests use.
fn bytes(quantity: &str) -> u64 {
    for (suffix, unit) in [("Ki", 1u64 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30)] {
        if let Some(number) = quantity.strip_suffix(suffix) {
            return number.parse::<u64>().expect("a memory quantity") * unit;
        }
    }
    quantity.parse().expect("a memory quantity in bytes")
}

/// What the test, playing the cluster, supplies to the pod.
struct Cluster<'a> {
    rootfs: &'a Path,
    /// The pod's network namespace when it has no `hostNetwork`.
    netns: Option<&'a str>,
    config_map: BTreeMap<&'static str, String>,
    seccomp: DefaultProfile,
    /// Appended to the container's args.
    extra_args: &'a [&'a str],
}

/// Builds the OCI runtime configuration for `container` of `pod`, as containerd's CRI plugin
/// makes it.
///
/// Longer than 100 lines on purpose: one field of the configuration after another, in the
/// order of the runtime spec, so each can be checked against containerd's translation.
fn runtime_config(
    pod: &PodSpec,
    container: &Container,
    image: &ImageConfig,
    cluster: &Cluster,
) -> Value {
    let security = container.security_context.clone().unwrap_or_default();
    let privileged = security.privileged == Some(true);
    let held = capabilities(container);

    // Env first: args name it as $(VAR).
    let mut env: BTreeMap<String, String> = image
        .env
        .iter()
        .filter_map(|pair| pair.split_once('='))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect();
    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (Some(value), _) => value.clone(),
            (None, Some(from)) => {
                let key = &from
                    .config_map_key_ref
                    .as_ref()
                    .expect("env comes from a value or a ConfigMap key")
                    .key;
                cluster
                    .config_map
                    .get(key.as_str())
                    .unwrap_or_else(|| panic!("the test's ConfigMap has no key {key}"))
                    .clone()
            }
            (None, None) => String::new(),
        };
        env.insert(var.name.clone(), value);
    }
    let expand = |arg: &String| -> String {
        arg.strip_prefix("$(")
            .and_then(|rest| rest.strip_suffix(')'))
            .and_then(|name| env.get(name))
            .cloned()
            .unwrap_or_else(|| arg.clone())
    };
    let mut args: Vec<String> = container
        .command
        .clone()
        .unwrap_or_else(|| image.entrypoint.clone());
    match &container.args {
        Some(container_args) => args.extend(container_args.iter().map(expand)),
        None => args.extend(image.cmd.iter().cloned()),
    }
    args.extend(cluster.extra_args.iter().map(|arg| (*arg).to_owned()));

    let (image_uid, image_gid) = image.user.split_once(':').unwrap_or((&image.user, "0"));
    let uid = security
        .run_as_user
        .unwrap_or_else(|| image_uid.parse().expect("a numeric image user"));
    let gid = security
        .run_as_group
        .unwrap_or_else(|| image_gid.parse().expect("a numeric image group"));

    let mut namespaces = vec![
        json!({"type": "mount"}),
        json!({"type": "ipc"}),
        json!({"type": "uts"}),
    ];
    if pod.host_pid != Some(true) {
        namespaces.push(json!({"type": "pid"}));
    }
    if pod.host_network != Some(true) {
        let netns = cluster
            .netns
            .expect("a pod without hostNetwork needs a namespace");
        namespaces.push(json!({"type": "network", "path": format!("/run/netns/{netns}")}));
    }
    // containerd gives a container a cgroup namespace of its own on cgroup v2 hosts.
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        namespaces.push(json!({"type": "cgroup"}));
    }

    let sys_access = if privileged { "rw" } else { "ro" };
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc",
               "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
               "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
               "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
        json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
               "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs",
               "options": ["nosuid", "noexec", "nodev", sys_access]}),
        json!({"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
               "options": ["nosuid", "noexec", "nodev", "relatime", sys_access]}),
    ];
    for mount in container.volume_mounts.iter().flatten() {
        let volume = pod
            .volumes
            .iter()
            .flatten()
            .find(|volume| volume.name == mount.name)
            .unwrap_or_else(|| panic!("volumeMount {} names no volume", mount.name));
        let host_path = volume.host_path.as_ref().unwrap_or_else(|| {
            panic!(
                "volume {}: only hostPath volumes are translated",
                volume.name
            )
        });
        let mut options = vec!["rbind", "rprivate"];
        if mount.read_only == Some(true) {
            options.push("ro");
        }
        mounts.push(json!({"destination": mount.mount_path, "type": "bind",
                           "source": host_path.path, "options": options}));
    }

    let resources = container.resources.clone().unwrap_or_default();
    let quantity = |map: &Option<
        BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >,
                    name: &str| {
        map.as_ref()
            .and_then(|map| map.get(name))
            .map(|quantity| quantity.0.clone())
    };
    let mut cgroup = json!({
        "devices": [{"allow": privileged, "access": "rwm"}],
    });
    if let Some(memory) = quantity(&resources.limits, "memory") {
        cgroup["memory"] = json!({"limit": bytes(&memory)});
    }
    const CPU_PERIOD: u64 = 100_000;
    let mut cpu = json!({"period": CPU_PERIOD});
    if let Some(limit) = quantity(&resources.limits, "cpu") {
        cpu["quota"] = json!(millicores(&limit) * CPU_PERIOD / 1000);
    }
    if let Some(request) = quantity(&resources.requests, "cpu") {
        cpu["shares"] = json!((millicores(&request) * 1024 / 1000).max(2));
    }
    cgroup["cpu"] = cpu;

    let capability_list: Vec<&String> = held.iter().collect();
    let mut linux = json!({
        "namespaces": namespaces,
        "resources": cgroup,
    });
    if !privileged {
        linux["maskedPaths"] = json!([
            "/proc/acpi",
            "/proc/asound",
            "/proc/kcore",
            "/proc/keys",
            "/proc/latency_stats",
            "/proc/timer_list",
            "/proc/timer_stats",
            "/proc/sched_debug",
            "/sys/firmware",
            "/sys/devices/virtual/powercap",
            "/proc/scsi",
        ]);
        linux["readonlyPaths"] = json!([
            "/proc/bus",
            "/proc/fs",
            "/proc/irq",
            "/proc/sys",
            "/proc/sysrq-trigger",
        ]);
        match security
            .seccomp_profile
            .as_ref()
            .map(|profile| profile.type_.as_str())
        {
            Some("RuntimeDefault") => {
                linux["seccomp"] = runtime_default_seccomp(&held, cluster.seccomp);
            }
            // Kubernetes' default without the SeccompDefault kubelet option.
            Some("Unconfined") | None => {}
            Some(other) => panic!("seccompProfile type {other} is not translated"),
        }
    }

    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": uid, "gid": gid},
            "args": args,
            "env": env.iter().map(|(name, value)| format!("{name}={value}")).collect::<Vec<_>>(),
            "cwd": "/",
            "capabilities": {
                "bounding": capability_list,
                "effective": capability_list,
                "permitted": capability_list,
            },
            // Kubernetes leaves no_new_privs off unless asked.
            "noNewPrivileges": security.allow_privilege_escalation == Some(false),
        },
        "root": {
            "path": cluster.rootfs,
            "readonly": security.read_only_root_filesystem == Some(true),
        },
        "hostname": "openim-observer",
        "mounts": mounts,
        "linux": linux,
    })
}

/// A pod network (bridge and namespace) and an unpacked image, for one test.
struct Pod {
    _scratch: ScratchDir,
    bundle: PathBuf,
    image: ImageConfig,
    net: PodNet,
    _network: Network,
}

impl Pod {
    fn new(name: &str) -> Self {
        netns::require_root().expect("these tests run containers: run them as root");
        netns::sweep_leftovers();
        mount_host_tracefs();
        let scratch = ScratchDir::new(&format!("image-{name}"));
        let image = unpack(&archive(), &scratch.0);
        let mut network = Network::create(&netns::new_prefix()).expect("create the pod network");
        let net = network
            .add_pod("obs", POD_HOST)
            .expect("create the pod namespace");
        Self {
            bundle: scratch.0.clone(),
            _scratch: scratch,
            image,
            net,
            _network: network,
        }
    }

    /// Writes config.json for `daemonset` and starts it with `runc run`.
    fn run(&self, daemonset: &DaemonSet, seccomp: DefaultProfile) -> Running {
        let (pod, container) = pod_and_container(daemonset);
        let cluster = Cluster {
            rootfs: &self.bundle.join("rootfs"),
            netns: Some(&self.net.netns),
            config_map: BTreeMap::from([
                ("grpc-port", GRPC_PORT.to_string()),
                ("ws-port", WS_PORT.to_string()),
            ]),
            seccomp,
            // Every captured record on stdout, so a test can see the capture work.
            extra_args: &["--events"],
        };
        let config = runtime_config(&pod, &container, &self.image, &cluster);
        std::fs::write(
            self.bundle.join("config.json"),
            serde_json::to_vec_pretty(&config).expect("config.json serialises"),
        )
        .expect("write config.json");
        Running::start(&self.bundle)
    }

    /// The metrics address the DaemonSet's probes use, on the pod IP.
    fn metrics_addr(&self, daemonset: &DaemonSet) -> (Ipv4Addr, u16) {
        let (_, container) = pod_and_container(daemonset);
        let port = container
            .ports
            .iter()
            .flatten()
            .find(|port| port.name.as_deref() == Some("metrics"))
            .expect("the container declares its metrics port")
            .container_port;
        (self.net.ip, u16::try_from(port).expect("a TCP port"))
    }
}

/// The node's tracefs, which the DaemonSet mounts read-only, must be mounted on the host
/// (docs/install.md's requirement; systemd does it at boot).
fn mount_host_tracefs() {
    if !Path::new("/sys/kernel/tracing/events").is_dir() {
        run(Command::new("mount").args(["-t", "tracefs", "tracefs", "/sys/kernel/tracing"]));
    }
}

/// `runc run` of one bundle, its stdout read line by line on a thread.
struct Running {
    id: String,
    child: Child,
    lines: Receiver<Value>,
    seen: Vec<Value>,
}

impl Running {
    fn start(bundle: &Path) -> Self {
        // The bundle's directory name is unique to this test process and test.
        let id = format!(
            "openim-{}",
            bundle
                .file_name()
                .and_then(|name| name.to_str())
                .unwrap_or("pod")
        );
        let mut child = Command::new("runc")
            .args(["run", "--bundle"])
            .arg(bundle)
            .arg(&id)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start runc (installed by `cargo xtask image`)");
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let value: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|err| panic!("stdout line is not JSON ({err}): {line}"));
                if sender.send(value).is_err() {
                    break;
                }
            }
        });
        Self {
            id,
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Reads lines until one matches, or `WAIT` passes.
    fn wait_for(&mut self, mut predicate: impl FnMut(&Value) -> bool) -> Option<Value> {
        if let Some(found) = self.seen.iter().find(|line| predicate(line)) {
            return Some(found.clone());
        }
        let deadline = Instant::now() + WAIT;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let matched = predicate(&line);
                    self.seen.push(line.clone());
                    if matched {
                        return Some(line);
                    }
                }
                Err(_) => return None,
            }
        }
        None
    }

    /// Waits up to `WAIT` for the container to exit; its status and stderr.
    fn wait_exit(&mut self) -> (ExitStatus, String) {
        let deadline = Instant::now() + WAIT;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait for runc") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "the container still runs after {WAIT:?}"
            );
            thread::sleep(Duration::from_millis(100));
        };
        (status, self.stderr())
    }

    /// SIGTERM, as the kubelet stops a pod (runc passes it to the container); the exit status
    /// and stderr.
    fn stop(&mut self) -> (ExitStatus, String) {
        run(Command::new("runc").args(["kill", &self.id, "TERM"]));
        self.wait_exit()
    }

    /// The container's process as the host sees it (`runc state`).
    fn pid(&self) -> u32 {
        let state: Value =
            serde_json::from_str(&run(Command::new("runc").args(["state", &self.id])))
                .expect("runc state prints JSON");
        let pid = state["pid"].as_u64().expect("runc state names the pid");
        u32::try_from(pid).expect("a pid")
    }

    fn stderr(&mut self) -> String {
        let mut stderr = String::new();
        if let Some(mut pipe) = self.child.stderr.take() {
            let _ = pipe.read_to_string(&mut stderr);
        }
        stderr
    }

    /// `observer_started` on stdout, or a panic with what the container said.
    fn expect_started(&mut self) {
        if self
            .wait_for(|line| line["kind"] == "observer_started")
            .is_none()
        {
            let _ = Command::new("runc")
                .args(["kill", &self.id, "KILL"])
                .stderr(Stdio::null())
                .status();
            let (status, stderr) = self.wait_exit();
            panic!("the observer did not start ({status}): {stderr}");
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = Command::new("runc")
                .args(["kill", &self.id, "KILL"])
                .stderr(Stdio::null())
                .status();
            let _ = self.child.wait();
        }
        let _ = Command::new("runc")
            .args(["delete", "--force", &self.id])
            .stderr(Stdio::null())
            .status();
    }
}

/// `GET path` over HTTP/1.1; the status line and the body.
fn http_get(address: (Ipv4Addr, u16), path: &str) -> (String, String) {
    let mut stream = TcpStream::connect_timeout(&address.into(), WAIT)
        .unwrap_or_else(|err| panic!("connect to {address:?}: {err}"));
    stream
        .set_read_timeout(Some(WAIT))
        .expect("set a read timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: observer\r\nConnection: close\r\n\r\n"
    )
    .expect("send the request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .expect("read the response");
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.lines().next().unwrap_or_default().to_owned();
    (status, body.to_owned())
}

/// What the runtime applied, read from the host's /proc: exactly the capabilities the
/// `securityContext` leaves, no_new_privs, the seccomp filter, a read-only root.
fn assert_applied(running: &Running, container: &Container, filtered: bool) {
    let pid = running.pid();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("read the container process's status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(str::trim)
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
            .to_owned()
    };
    let held = capabilities(container);
    let bits = |hex: &str| u64::from_str_radix(hex, 16).expect("a capability mask");
    let expected = bits_of(&held);
    for set in ["CapEff:", "CapPrm:", "CapBnd:"] {
        assert_eq!(
            bits(&field(set)),
            expected,
            "{set} of the container's process: should be exactly {held:?}"
        );
    }
    let security = container.security_context.clone().unwrap_or_default();
    let no_new_privs = security.allow_privilege_escalation == Some(false);
    assert_eq!(field("NoNewPrivs:"), if no_new_privs { "1" } else { "0" });
    assert_eq!(
        field("Seccomp:"),
        if filtered { "2" } else { "0" },
        "seccomp mode"
    );
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .expect("read the container process's mountinfo");
    let root_options = mountinfo
        .lines()
        .rev()
        .map(|line| line.split(' ').collect::<Vec<_>>())
        .find(|fields| fields.get(4) == Some(&"/"))
        .map(|fields| fields[5].to_owned())
        .expect("the container's root mount");
    let read_only = security.read_only_root_filesystem == Some(true);
    assert_eq!(
        root_options.split(',').any(|option| option == "ro"),
        read_only,
        "root mount options {root_options}"
    );
}

/// A capability mask with the named capabilities' bits.
fn bits_of(capabilities: &BTreeSet<String>) -> u64 {
    CAPABILITY_NAMES
        .iter()
        .enumerate()
        .filter(|(_, name)| capabilities.contains(&format!("CAP_{name}")))
        .fold(0, |mask, (bit, _)| mask | 1 << bit)
}

/// The checks both runnable variants pass: it started (checked by the caller), the probes'
/// endpoints answer on the pod IP, a connection to a watched port from the host's network
/// namespace is captured with the host pid, and SIGTERM stops it with exit 0.
fn assert_runs_and_captures(pod: &Pod, daemonset: &DaemonSet, running: &mut Running) {
    let metrics = pod.metrics_addr(daemonset);
    let (status, body) = http_get(metrics, "/healthz");
    assert_eq!(status, "HTTP/1.1 200 OK", "/healthz on {metrics:?}");
    assert_eq!(body, "ok\n");
    // Started means every program is attached: the readiness probe's path says so too.
    let (status, body) = http_get(metrics, "/readyz");
    assert_eq!(status, "HTTP/1.1 200 OK", "/readyz on {metrics:?}");
    assert_eq!(body, "ready\n");
    let (status, body) = http_get(metrics, "/metrics");
    assert_eq!(
        status, "HTTP/1.1 200 OK",
        "/metrics on {metrics:?} (the probes' path)"
    );
    assert!(!body.is_empty(), "/metrics is empty");
    let commit = build_info_commit(&body)
        .unwrap_or_else(|| panic!("/metrics has no build_info with a commit: {body}"));
    assert_names_a_commit(commit, "build_info's commit");

    let listener = TcpListener::bind(("127.0.0.1", GRPC_PORT))
        .unwrap_or_else(|err| panic!("bind {GRPC_PORT}: {err}"));
    let mut client =
        TcpStream::connect(("127.0.0.1", GRPC_PORT)).expect("connect to the watched port");
    let (server_side, _) = listener.accept().expect("accept");
    let connect =
        running.wait_for(|line| line["kind"] == "tcp_connect" && line["dport"] == GRPC_PORT);
    let connect = connect.unwrap_or_else(|| {
        panic!(
            "the container captured no tcp_connect to the watched port; its stdout: {:?}",
            running.seen
        )
    });
    assert_eq!(
        connect["pid"],
        std::process::id(),
        "host pid of the connecting process"
    );
    assert_eq!(connect["daddr"], "127.0.0.1");
    // The bytes too, whichever hook copies them.
    const WRITTEN: usize = 64;
    client
        .write_all(&[b'x'; WRITTEN])
        .expect("write to the watched port");
    let data = running.wait_for(|line| {
        line["kind"] == "data" && line["dport"] == GRPC_PORT && line["direction"] == "send"
    });
    drop((client, server_side));
    let data = data.unwrap_or_else(|| {
        panic!(
            "the container captured no bytes sent to the watched port; its stdout: {:?}",
            running.seen
        )
    });
    assert_eq!(data["len"], WRITTEN, "the write's bytes, in one record");

    let (status, stderr) = running.stop();
    assert!(status.success(), "exit after SIGTERM: {status}: {stderr}");
    assert!(
        stderr.contains(r#""kind":"observer_stopped""#),
        "no final counters on stderr after SIGTERM: {stderr}"
    );
}

/// Exit code 2 and exactly one line on stderr, starting `observer: ` and containing `cause`.
fn assert_refused(running: &mut Running, cause: &str) {
    let (status, stderr) = running.wait_exit();
    assert_eq!(status.code(), Some(2), "exit status; stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stderr, got: {stderr}");
    assert!(
        lines[0].starts_with("observer: ") && lines[0].contains(cause),
        "the message names {cause:?}: {stderr}"
    );
    assert!(
        running
            .wait_for(|line| line["kind"] == "observer_started")
            .is_none(),
        "it said it started"
    );
}

#[test]
fn the_image_holds_the_observer_and_the_libraries_it_loads_only() {
    if !ready() {
        return;
    }
    let scratch = ScratchDir::new("image-contents");
    let image = unpack(&archive(), &scratch.0);
    assert_eq!(image.entrypoint, ["/usr/local/bin/observer"]);
    assert_eq!(image.cmd, ["run"]);
    assert_eq!(image.user, "0:0");
    assert_names_a_commit(&image.revision, "the image's revision label");

    let rootfs = scratch.0.join("rootfs");
    let mut files = Vec::new();
    let mut pending = vec![rootfs.clone()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read the rootfs") {
            let path = entry.expect("a directory entry").path();
            let kind = std::fs::symlink_metadata(&path).expect("stat").file_type();
            if kind.is_dir() {
                pending.push(path);
            } else {
                assert!(kind.is_file(), "{} is not a regular file", path.display());
                files.push(format!(
                    "/{}",
                    path.strip_prefix(&rootfs).unwrap().display()
                ));
            }
        }
    }
    files.sort();
    let (binaries, libraries): (Vec<&String>, Vec<&String>) = files
        .iter()
        .partition(|file| file.as_str() == "/usr/local/bin/observer");
    assert_eq!(
        binaries.len(),
        1,
        "the observer at its entrypoint: {files:?}"
    );
    for library in &libraries {
        assert!(
            library.contains(".so"),
            "only shared libraries besides the observer: {library}"
        );
    }
    for needed in ["libc.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2"] {
        assert!(
            libraries.iter().any(|library| library.ends_with(needed)),
            "{needed} missing from {files:?}"
        );
    }
}

#[test]
fn the_least_privilege_pod_starts_captures_from_packets_and_serves_its_probes() {
    if !ready() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    let pod = Pod::new("base");
    // The node's cgroup v2 hierarchy, where the packet programs attach: this host's services
    // may live in cgroup v1 only, so one mounted for the test stands in for it (every process,
    // this test's own, is in its root until moved).
    let hierarchy = Cgroup2Mount::mount();
    let mut daemonset = daemonset(Variant::Base);
    set_host_path(&mut daemonset, "cgroup", hierarchy.root());
    let (_, container) = pod_and_container(&daemonset);
    assert_eq!(
        capabilities(&container),
        BTreeSet::from([
            "CAP_BPF".to_owned(),
            "CAP_NET_ADMIN".to_owned(),
            "CAP_PERFMON".to_owned()
        ]),
        "the base holds BPF, NET_ADMIN and PERFMON only"
    );
    let mut running = pod.run(&daemonset, DefaultProfile::Containerd);
    running.expect_started();
    let started = running
        .wait_for(|line| line["kind"] == "observer_started")
        .expect("it started");
    assert_eq!(started["capture_hook"], "packets", "{started}");
    assert_eq!(
        started["capture_hook_reason"],
        "auto: CAP_NET_ADMIN held and /host/sys/fs/cgroup is the root of a cgroup v2 hierarchy",
        "{started}"
    );
    // The kernel's BTF is readable in the pod: TCP state changes come from the raw tracepoint,
    // so nothing of the packet hook goes through perf_event_open.
    assert_eq!(started["state_tracepoint"], "raw", "{started}");
    assert_applied(&running, &container, true);
    assert_runs_and_captures(&pod, &daemonset, &mut running);
}

#[test]
fn the_syscall_hook_component_starts_without_net_admin_and_captures_at_syscalls() {
    if !ready() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    let pod = Pod::new("syscalls");
    let daemonset = daemonset(Variant::SyscallHook);
    let (_, container) = pod_and_container(&daemonset);
    assert_eq!(
        capabilities(&container),
        BTreeSet::from(["CAP_BPF".to_owned(), "CAP_PERFMON".to_owned()]),
        "the component takes NET_ADMIN from the base's"
    );
    let mut running = pod.run(&daemonset, DefaultProfile::Containerd);
    running.expect_started();
    let started = running
        .wait_for(|line| line["kind"] == "observer_started")
        .expect("it started");
    assert_eq!(started["capture_hook"], "syscalls", "{started}");
    assert_eq!(
        started["capture_hook_reason"], "--capture-hook syscalls",
        "{started}"
    );
    assert_applied(&running, &container, true);
    assert_runs_and_captures(&pod, &daemonset, &mut running);
}

/// Points the hostPath volume `name` of `daemonset` at `path`.
fn set_host_path(daemonset: &mut DaemonSet, name: &str, path: &Path) {
    let volume = daemonset
        .spec
        .as_mut()
        .and_then(|spec| spec.template.spec.as_mut())
        .and_then(|pod| pod.volumes.as_mut())
        .and_then(|volumes| volumes.iter_mut().find(|volume| volume.name == name))
        .and_then(|volume| volume.host_path.as_mut())
        .unwrap_or_else(|| panic!("the DaemonSet has no hostPath volume {name}"));
    volume.path = path.display().to_string();
}

#[test]
fn with_one_capability_fewer_the_pod_exits_2_naming_it() {
    if !ready() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    let pod = Pod::new("no-perfmon");
    let mut daemonset = daemonset(Variant::Base);
    let added = daemonset
        .spec
        .as_mut()
        .and_then(|spec| spec.template.spec.as_mut())
        .and_then(|pod| pod.containers.first_mut())
        .and_then(|container| container.security_context.as_mut())
        .and_then(|security| security.capabilities.as_mut())
        .and_then(|capabilities| capabilities.add.as_mut())
        .expect("the base adds capabilities");
    added.retain(|capability| capability != "PERFMON");
    let mut running = pod.run(&daemonset, DefaultProfile::Containerd);
    assert_refused(&mut running, "missing: CAP_PERFMON");
}

#[test]
fn under_a_seccomp_profile_that_ties_bpf_to_sys_admin_the_pod_exits_2() {
    if !ready() {
        return;
    }
    // What docs/install.md sends to the privileged overlay: CRI-O's (and old containerd's)
    // default profile refuses bpf() to a container without CAP_SYS_ADMIN.
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    let pod = Pod::new("crio-seccomp");
    let daemonset = daemonset(Variant::Base);
    let mut running = pod.run(&daemonset, DefaultProfile::ContainersCommon);
    assert_refused(&mut running, "Operation not permitted");
}

#[test]
fn the_privileged_overlay_starts_captures_and_serves_its_probes() {
    if !ready() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    let pod = Pod::new("privileged");
    let daemonset = daemonset(Variant::Privileged);
    let (_, container) = pod_and_container(&daemonset);
    assert!(
        capabilities(&container).contains("CAP_SYS_ADMIN"),
        "the privileged overlay holds every capability"
    );
    // The profile does not matter: a privileged container runs without a filter.
    let mut running = pod.run(&daemonset, DefaultProfile::ContainersCommon);
    running.expect_started();
    assert_applied(&running, &container, false);
    assert_runs_and_captures(&pod, &daemonset, &mut running);
}
