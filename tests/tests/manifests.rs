//! Checks the Kubernetes manifests under deploy/kubernetes:
//! - every object, and every strategic-merge patch, is the k8s-openapi type of its `kind` with no
//!   field that type lacks. k8s-openapi silently ignores unknown fields, so each document is read
//!   into the typed struct, written back, and compared with the original: whatever the round trip
//!   lost was not a field of that type (a typo, or a field at the wrong level). The Prometheus
//!   operator's PodMonitor and PrometheusRule (components/monitoring) go through types of their
//!   own, in `manifests/operator_kinds.rs`;
//! - every kustomization renders (`kubectl kustomize`, which itself rejects unknown kustomization
//!   fields, missing files, wrong `apiVersion`s and generators that clash with the base) into
//!   objects that pass the same round trip, all in the observer's namespace, with pinned images;
//! - the DaemonSet each variant renders runs with exactly the privileges docs/install.md
//!   documents.
//!
//! Rendering needs kubectl: `$KUBECTL`, else `kubectl` on PATH. `cargo xtask test` installs a
//! pinned one and sets `KUBECTL`; without any, the rendering checks skip and say why.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Namespace, PodSpec, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::Value;

#[path = "manifests/operator_kinds.rs"]
mod operator_kinds;

/// The base's image name, which overlays replace through `images:`.
const IMAGE_PLACEHOLDER: &str = "openim-observer";
/// components/pod-names/rbac.yaml binds the service account in this namespace, and kustomize
/// does not rewrite that subject, so every kustomization must keep it.
const NAMESPACE: &str = "openim-observer";
const CONTAINER: &str = "observer";
/// The kustomizations a user deploys or builds on, relative to deploy/kubernetes. Components are
/// rendered as part of the overlays that use them.
const VARIANTS: [&str; 5] = [
    "base",
    "overlays/cluster",
    "overlays/example",
    "overlays/privileged",
    "overlays/syscall-hook",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn kubernetes_dir() -> PathBuf {
    workspace().join("deploy/kubernetes")
}

/// A path as the repository names it, for failure messages.
fn shown(path: &Path) -> String {
    path.strip_prefix(workspace())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Every YAML file below `dir`, sorted so failures come in a stable order.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries =
            fs::read_dir(&dir).unwrap_or_else(|err| panic!("reading {}: {err}", shown(&dir)));
        for entry in entries {
            let path = entry
                .unwrap_or_else(|err| panic!("reading {}: {err}", shown(&dir)))
                .path();
            if path.is_dir() {
                pending.push(path);
            } else if matches!(
                path.extension().and_then(|ext| ext.to_str()),
                Some("yaml" | "yml")
            ) {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn is_kustomization(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|name| name == "kustomization.yaml")
}

/// The documents of a YAML file (several when it has `---` separators).
fn documents(path: &Path) -> Vec<Value> {
    let text =
        fs::read_to_string(path).unwrap_or_else(|err| panic!("reading {}: {err}", shown(path)));
    parse_documents(&text, &shown(path))
}

fn parse_documents(text: &str, place: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .enumerate()
        .map(|(index, document)| {
            Value::deserialize(document)
                .unwrap_or_else(|err| panic!("{place} document {}: not YAML: {err}", index + 1))
        })
        .filter(|document| !document.is_null())
        .collect()
}

/// `kind name` of an object, for failure messages.
fn describe(document: &Value) -> String {
    let field = |pointer: &str| document.pointer(pointer).and_then(Value::as_str);
    format!(
        "{} {}",
        field("/kind").unwrap_or("(no kind)"),
        field("/metadata/name").unwrap_or("(no name)")
    )
}

/// Reads `document` as the k8s-openapi type its `kind` names and writes it back.
fn round_trip(document: &Value) -> Result<Value, String> {
    fn through<T: DeserializeOwned + Serialize>(document: &Value) -> Result<Value, String> {
        let typed: T = serde_json::from_value(document.clone()).map_err(|err| err.to_string())?;
        serde_json::to_value(typed).map_err(|err| err.to_string())
    }
    match document.get("kind").and_then(Value::as_str) {
        Some("Namespace") => through::<Namespace>(document),
        Some("ServiceAccount") => through::<ServiceAccount>(document),
        Some("DaemonSet") => through::<DaemonSet>(document),
        Some("ConfigMap") => through::<ConfigMap>(document),
        Some("Role") => through::<Role>(document),
        Some("RoleBinding") => through::<RoleBinding>(document),
        Some("NetworkPolicy") => through::<NetworkPolicy>(document),
        Some(kind @ ("PodMonitor" | "PrometheusRule"))
            if document["apiVersion"] != operator_kinds::API_VERSION =>
        {
            Err(format!(
                "{kind} is {}, not {}",
                document["apiVersion"],
                operator_kinds::API_VERSION
            ))
        }
        Some("PodMonitor") => through::<operator_kinds::PodMonitor>(document),
        Some("PrometheusRule") => through::<operator_kinds::PrometheusRule>(document),
        Some(kind) => Err(format!(
            "kind {kind} has no typed check: add it to round_trip in tests/tests/manifests.rs"
        )),
        None => Err("no `kind` field".to_owned()),
    }
}

/// Fields of `original` that `typed` lacks or holds differently, as `spec.template…` paths.
/// Fields only `typed` has are fine: k8s-openapi fills in the required fields a partial
/// (patch) object leaves out.
fn lost_fields(original: &Value, typed: &Value, at: &str, lost: &mut Vec<String>) {
    match (original, typed) {
        (Value::Object(original), Value::Object(typed)) => {
            for (key, value) in original {
                let at = if at.is_empty() {
                    key.clone()
                } else {
                    format!("{at}.{key}")
                };
                match typed.get(key) {
                    Some(typed) => lost_fields(value, typed, &at, lost),
                    None => lost.push(format!(
                        "`{at}` is not a field of this type (misspelt, or at the wrong level)"
                    )),
                }
            }
        }
        (Value::Array(original), Value::Array(typed)) if original.len() == typed.len() => {
            for (index, (original, typed)) in original.iter().zip(typed).enumerate() {
                lost_fields(original, typed, &format!("{at}[{index}]"), lost);
            }
        }
        _ if original == typed => {}
        _ => lost.push(format!(
            "`{at}` reads back as {typed}, not as written ({original})"
        )),
    }
}

/// Problems of `document` that the typed round trip finds, prefixed with `place`.
fn type_problems(document: &Value, place: &str) -> Vec<String> {
    let mut lost = Vec::new();
    match round_trip(document) {
        Err(err) => lost.push(err),
        Ok(typed) => lost_fields(document, &typed, "", &mut lost),
    }
    lost.into_iter()
        .map(|problem| format!("{place} ({}): {problem}", describe(document)))
        .collect()
}

#[test]
fn every_object_and_patch_is_a_kubernetes_type_without_unknown_fields() {
    let files = yaml_files(&kubernetes_dir());
    assert!(
        files.len() >= 10,
        "found only {} YAML files under {}",
        files.len(),
        shown(&kubernetes_dir())
    );
    let mut failures = Vec::new();
    for path in files.iter().filter(|path| !is_kustomization(path)) {
        for (index, document) in documents(path).iter().enumerate() {
            // A JSON patch (a list of operations): kustomize applies it, and what it adds is
            // checked in the rendered objects.
            if !document.is_array() {
                let place = format!("{} document {}", shown(path), index + 1);
                failures.extend(type_problems(document, &place));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "manifest problems:\n{}",
        failures.join("\n")
    );
}

/// The objects `kubectl kustomize deploy/kubernetes/<dir>` outputs, or `None` (said on stderr)
/// when there is no kubectl to render with.
fn render(dir: &str) -> Option<Vec<Value>> {
    let kubectl = std::env::var_os("KUBECTL").unwrap_or_else(|| "kubectl".into());
    let output = match Command::new(&kubectl)
        .arg("kustomize")
        .arg(kubernetes_dir().join(dir))
        .output()
    {
        Ok(output) => output,
        Err(err) if std::env::var_os("KUBECTL").is_none() => {
            let _ = writeln!(
                std::io::stderr(),
                "skipped rendering deploy/kubernetes/{dir}: no kubectl ({err}); set KUBECTL or \
                 run `cargo xtask test`, which installs one"
            );
            return None;
        }
        Err(err) => panic!("running {}: {err}", kubectl.to_string_lossy()),
    };
    let place = format!("kubectl kustomize deploy/kubernetes/{dir}");
    assert!(
        output.status.success(),
        "{place} failed: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Some(parse_documents(
        &String::from_utf8_lossy(&output.stdout),
        &place,
    ))
}

#[test]
fn every_kustomization_renders_typed_objects_in_one_namespace() {
    let mut kustomizations: Vec<String> = yaml_files(&kubernetes_dir())
        .iter()
        .filter(|path| is_kustomization(path))
        .filter(|path| {
            documents(path)
                .first()
                .is_some_and(|doc| doc["kind"] == "Kustomization")
        })
        .filter_map(|path| {
            let dir = path.parent()?.strip_prefix(kubernetes_dir()).ok()?;
            Some(dir.display().to_string())
        })
        .collect();
    kustomizations.sort();
    assert_eq!(
        kustomizations, VARIANTS,
        "every Kustomization under deploy/kubernetes is a variant these tests render"
    );
    for dir in VARIANTS {
        let Some(objects) = render(dir) else { return };
        let place = format!("deploy/kubernetes/{dir}");
        let mut failures = Vec::new();
        for object in &objects {
            failures.extend(type_problems(object, &place));
            // Pod names read pods in OpenIM's namespaces: their Roles live there, bound to the
            // observer's service account (checked with the subjects below).
            let namespaced = !matches!(
                object["kind"].as_str(),
                Some("Namespace" | "Role" | "RoleBinding")
            );
            if namespaced && object["metadata"]["namespace"] != NAMESPACE {
                failures.push(format!(
                    "{place} ({}): not in namespace {NAMESPACE}",
                    describe(object)
                ));
            }
            for subject in object["subjects"].as_array().into_iter().flatten() {
                if subject["namespace"] != NAMESPACE {
                    failures.push(format!(
                        "{place} ({}): subject {} is not in namespace {NAMESPACE}",
                        describe(object),
                        subject["name"]
                    ));
                }
            }
            // The base leaves the image to overlays; an overlay must name one nodes can pin.
            let images = object
                .pointer("/spec/template/spec/containers")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|container| container["image"].as_str());
            for image in images.filter(|_| dir != "base") {
                let name = image.rsplit('/').next().unwrap_or(image);
                if image == IMAGE_PLACEHOLDER || !(name.contains(':') || name.contains('@')) {
                    failures.push(format!(
                        "{place} ({}): image {image} is not replaced with a tag or digest (`images:` \
                         names the base's image with `newTag` or `digest`), so nodes would pull `latest`",
                        describe(object)
                    ));
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}

/// Renders `dir` (relative to deploy/kubernetes) and checks what every variant's DaemonSet
/// shares: the container reads the ports from env that exists, the env from ConfigMap keys that
/// exist, and the probes from the declared metrics port. `None` when there is no kubectl.
fn build_variant(dir: &str) -> Option<(DaemonSet, String)> {
    let place = format!("deploy/kubernetes/{dir}");
    let objects = render(dir)?;
    let mut daemonsets = objects
        .iter()
        .filter(|object| object["kind"] == "DaemonSet");
    let (Some(daemonset), None) = (daemonsets.next(), daemonsets.next()) else {
        panic!("{place}: expected exactly one DaemonSet");
    };
    let daemonset: DaemonSet =
        serde_json::from_value(daemonset.clone()).unwrap_or_else(|err| panic!("{place}: {err}"));
    let container = container(&daemonset, &place);

    let env: BTreeSet<&str> = container
        .env
        .iter()
        .flatten()
        .map(|var| var.name.as_str())
        .collect();
    for arg in container.args.iter().flatten() {
        if let Some(name) = arg
            .strip_prefix("$(")
            .and_then(|rest| rest.strip_suffix(')'))
        {
            assert!(
                env.contains(name),
                "{place}: argument {arg} names no env variable of the container"
            );
        }
    }
    for var in container.env.iter().flatten() {
        let Some(key_ref) = var
            .value_from
            .as_ref()
            .and_then(|from| from.config_map_key_ref.as_ref())
        else {
            continue;
        };
        let known = objects.iter().find(|object| {
            object["kind"] == "ConfigMap" && object["metadata"]["name"] == key_ref.name.as_str()
        });
        assert!(
            known.is_some_and(|map| map["data"].get(&key_ref.key).is_some()),
            "{place}: env {} reads key {} of ConfigMap {}, which the build does not make",
            var.name,
            key_ref.key,
            key_ref.name
        );
    }

    let metrics_port = container
        .ports
        .iter()
        .flatten()
        .find(|port| port.name.as_deref() == Some("metrics"))
        .unwrap_or_else(|| panic!("{place}: no container port named metrics"));
    assert_eq!(metrics_port.container_port, 9400, "{place}: metrics port");
    let probes = [
        ("startupProbe", &container.startup_probe),
        ("livenessProbe", &container.liveness_probe),
        ("readinessProbe", &container.readiness_probe),
    ];
    for (name, probe) in probes {
        let get = probe
            .as_ref()
            .and_then(|probe| probe.http_get.as_ref())
            .unwrap_or_else(|| panic!("{place}: {name} is not an httpGet probe"));
        assert_eq!(
            get.port,
            IntOrString::String("metrics".into()),
            "{place}: {name}.httpGet.port"
        );
    }
    Some((daemonset, place))
}

fn pod(daemonset: &DaemonSet, place: &str) -> PodSpec {
    daemonset
        .spec
        .as_ref()
        .and_then(|spec| spec.template.spec.clone())
        .unwrap_or_else(|| panic!("{place}: DaemonSet has no spec.template.spec"))
}

fn container(daemonset: &DaemonSet, place: &str) -> Container {
    pod(daemonset, place)
        .containers
        .into_iter()
        .find(|container| container.name == CONTAINER)
        .unwrap_or_else(|| panic!("{place}: no container named {CONTAINER}"))
}

/// The security the base promises; the example overlay must keep all of it.
fn assert_least_privilege(daemonset: &DaemonSet, place: &str) {
    assert_least_privilege_with(daemonset, place, &["BPF", "NET_ADMIN", "PERFMON"]);
}

/// Asserts the base's security with exactly the capabilities `expected_added` (sorted) added.
///
/// Longer than 100 lines on purpose: one assertion per field of the pod's and container's
/// security, in the order the manifest writes them.
fn assert_least_privilege_with(daemonset: &DaemonSet, place: &str, expected_added: &[&str]) {
    let pod = pod(daemonset, place);
    assert_eq!(pod.host_pid, Some(true), "{place}: hostPID");
    assert_ne!(pod.host_network, Some(true), "{place}: hostNetwork");
    assert!(
        pod.tolerations
            .iter()
            .flatten()
            .any(
                |toleration| toleration.operator.as_deref() == Some("Exists")
                    && toleration.key.is_none()
            ),
        "{place}: tolerations must include `operator: Exists` (run on every node)"
    );

    let container = container(daemonset, place);
    assert_eq!(
        container.args.as_ref().and_then(|args| args.first()),
        Some(&"run".to_owned()),
        "{place}: args must start with the `run` subcommand"
    );
    let security = container
        .security_context
        .unwrap_or_else(|| panic!("{place}: container has no securityContext"));
    assert_ne!(
        security.privileged,
        Some(true),
        "{place}: securityContext.privileged"
    );
    assert_eq!(
        security.allow_privilege_escalation,
        Some(false),
        "{place}: securityContext.allowPrivilegeEscalation"
    );
    assert_eq!(
        security.read_only_root_filesystem,
        Some(true),
        "{place}: securityContext.readOnlyRootFilesystem"
    );
    assert_eq!(
        security.run_as_user,
        Some(0),
        "{place}: securityContext.runAsUser"
    );
    let capabilities = security
        .capabilities
        .unwrap_or_else(|| panic!("{place}: securityContext has no capabilities"));
    assert_eq!(
        capabilities.drop,
        Some(vec!["ALL".to_owned()]),
        "{place}: securityContext.capabilities.drop"
    );
    let mut added = capabilities.add.unwrap_or_default();
    added.sort();
    assert_eq!(
        added, expected_added,
        "{place}: securityContext.capabilities.add"
    );
    assert_eq!(
        security.seccomp_profile.map(|profile| profile.type_),
        Some("RuntimeDefault".to_owned()),
        "{place}: securityContext.seccompProfile.type"
    );

    let mount = container
        .volume_mounts
        .iter()
        .flatten()
        .find(|mount| mount.mount_path == "/sys/kernel/tracing")
        .unwrap_or_else(|| panic!("{place}: nothing is mounted at /sys/kernel/tracing"));
    assert_eq!(
        mount.read_only,
        Some(true),
        "{place}: tracefs mount readOnly"
    );
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|volume| volume.name == mount.name)
        .and_then(|volume| volume.host_path.clone())
        .unwrap_or_else(|| panic!("{place}: volume {} is not a hostPath", mount.name));
    assert_eq!(
        volume.path, "/sys/kernel/tracing",
        "{place}: tracefs hostPath"
    );
    assert_eq!(
        volume.type_.as_deref(),
        Some("Directory"),
        "{place}: tracefs hostPath type"
    );
    // The node's cgroup hierarchy, read-only: --kube finds a process's pod there, the packet
    // hook attaches there.
    let cgroup_root = container
        .args
        .iter()
        .flatten()
        .find_map(|arg| arg.strip_prefix("--cgroup-root="))
        .unwrap_or_else(|| panic!("{place}: no --cgroup-root="));
    let mount = container
        .volume_mounts
        .iter()
        .flatten()
        .find(|mount| mount.mount_path == cgroup_root)
        .unwrap_or_else(|| panic!("{place}: nothing is mounted at --cgroup-root {cgroup_root}"));
    assert_eq!(
        mount.read_only,
        Some(true),
        "{place}: cgroup mount readOnly"
    );
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|volume| volume.name == mount.name)
        .and_then(|volume| volume.host_path.clone())
        .unwrap_or_else(|| panic!("{place}: volume {} is not a hostPath", mount.name));
    assert_eq!(volume.path, "/sys/fs/cgroup", "{place}: cgroup hostPath");
}

/// What the pod-names component adds, seen through the example overlay.
fn assert_pod_names_and_image(daemonset: &DaemonSet, place: &str) {
    let container = container(daemonset, place);
    assert_eq!(
        container.image.as_deref(),
        Some("registry.example.com/openim-observer:0.1.0"),
        "{place}: image"
    );
    assert!(
        container.args.iter().flatten().any(|arg| arg == "--kube"),
        "{place}: the pod-names component appends --kube"
    );
    assert_eq!(
        pod(daemonset, place).automount_service_account_token,
        Some(true),
        "{place}: the pod-names component mounts the service account token"
    );
}

#[test]
fn base_runs_with_least_privilege_and_no_api_access() {
    let Some((daemonset, place)) = build_variant("base") else {
        return;
    };
    assert_least_privilege(&daemonset, &place);
    let pod = pod(&daemonset, &place);
    assert_eq!(
        pod.automount_service_account_token,
        Some(false),
        "{place}: the base needs no API token"
    );
    assert!(
        !container(&daemonset, &place)
            .args
            .unwrap_or_default()
            .contains(&"--kube".to_owned()),
        "{place}: --kube belongs to the pod-names component"
    );
    assert!(
        !container(&daemonset, &place)
            .args
            .unwrap_or_default()
            .iter()
            .any(|arg| arg.starts_with("--capture-hook")),
        "{place}: the base leaves the hook to `auto`, which falls back where packets cannot be had"
    );
}

#[test]
fn example_overlay_keeps_least_privilege_and_adds_pod_names() {
    let Some((daemonset, place)) = build_variant("overlays/example") else {
        return;
    };
    assert_least_privilege(&daemonset, &place);
    assert_pod_names_and_image(&daemonset, &place);
}

#[test]
fn syscall_hook_overlay_is_the_example_with_the_hook_and_without_net_admin() {
    let Some((daemonset, place)) = build_variant("overlays/syscall-hook") else {
        return;
    };
    assert_least_privilege_with(&daemonset, &place, &["BPF", "PERFMON"]);
    assert_pod_names_and_image(&daemonset, &place);
    let args = container(&daemonset, &place).args.unwrap_or_default();
    assert_eq!(
        args.iter()
            .filter(|arg| arg.starts_with("--capture-hook"))
            .collect::<Vec<_>>(),
        ["--capture-hook=syscalls"],
        "{place}: args"
    );
}

#[test]
fn privileged_overlay_is_the_example_made_privileged() {
    let Some((daemonset, place)) = build_variant("overlays/privileged") else {
        return;
    };
    assert_pod_names_and_image(&daemonset, &place);
    let security = container(&daemonset, &place)
        .security_context
        .unwrap_or_else(|| panic!("{place}: container has no securityContext"));
    assert_eq!(
        security.privileged,
        Some(true),
        "{place}: securityContext.privileged"
    );
    assert_eq!(
        security.allow_privilege_escalation,
        Some(true),
        "{place}: the API rejects privileged without allowPrivilegeEscalation"
    );
    assert_eq!(
        security.seccomp_profile.map(|profile| profile.type_),
        Some("Unconfined".to_owned()),
        "{place}: securityContext.seccompProfile.type"
    );
}

#[test]
fn cluster_overlay_reads_redis_from_a_secret_and_names_the_node() {
    let Some((daemonset, place)) = build_variant("overlays/cluster") else {
        return;
    };
    assert_least_privilege(&daemonset, &place);
    assert_pod_names_and_image(&daemonset, &place);
    let container = container(&daemonset, &place);
    let env: BTreeMap<&str, _> = container
        .env
        .iter()
        .flatten()
        .map(|var| (var.name.as_str(), var))
        .collect();
    let url = env
        .get("OPENIM_OBSERVER_REDIS_URL")
        .unwrap_or_else(|| panic!("{place}: no OPENIM_OBSERVER_REDIS_URL"));
    assert_eq!(
        url.value, None,
        "{place}: the Redis URL is never written inline"
    );
    let secret = url
        .value_from
        .as_ref()
        .and_then(|from| from.secret_key_ref.as_ref())
        .unwrap_or_else(|| panic!("{place}: the Redis URL comes from a Secret"));
    assert_eq!(
        (secret.name.as_str(), secret.key.as_str()),
        ("openim-observer-redis", "url")
    );
    let node = env
        .get("NODE_NAME")
        .and_then(|var| var.value_from.as_ref())
        .and_then(|from| from.field_ref.as_ref())
        .unwrap_or_else(|| panic!("{place}: NODE_NAME from the downward API"));
    assert_eq!(node.field_path, "spec.nodeName");
    assert!(
        !container
            .args
            .iter()
            .flatten()
            .any(|arg| arg.contains("redis://") || arg.contains("rediss://")),
        "{place}: no URL in args"
    );
    let policy: NetworkPolicy = serde_json::from_value(
        documents(&kubernetes_dir().join("components/cluster/networkpolicy.yaml")).remove(0),
    )
    .unwrap();
    let spec = policy.spec.expect("a NetworkPolicy spec");
    assert_eq!(spec.policy_types, Some(vec!["Egress".to_owned()]));
    let ports: Vec<i32> = spec
        .egress
        .iter()
        .flatten()
        .flat_map(|rule| rule.ports.iter().flatten())
        .filter_map(|port| match port.port {
            Some(IntOrString::Int(port)) => Some(port),
            _ => None,
        })
        .collect();
    assert!(ports.contains(&6379), "{place}: egress to Redis: {ports:?}");
}

/// The typed objects of one kind in a file under deploy/kubernetes.
fn objects<T: DeserializeOwned>(file: &str, kind: &str) -> Vec<T> {
    documents(&kubernetes_dir().join(file))
        .into_iter()
        .filter(|document| document["kind"] == kind)
        .map(|document| {
            serde_json::from_value(document).unwrap_or_else(|err| panic!("{file}: {kind}: {err}"))
        })
        .collect()
}

#[test]
fn probes_ask_healthz_and_readyz_not_metrics() {
    for variant in VARIANTS {
        let Some((daemonset, place)) = build_variant(variant) else {
            return;
        };
        let container = container(&daemonset, &place);
        // Liveness is the process answering; readiness waits for the programs (and pod lists).
        for (name, probe, expected) in [
            ("startupProbe", &container.startup_probe, "/healthz"),
            ("livenessProbe", &container.liveness_probe, "/healthz"),
            ("readinessProbe", &container.readiness_probe, "/readyz"),
        ] {
            let path = probe
                .as_ref()
                .and_then(|probe| probe.http_get.as_ref())
                .and_then(|get| get.path.as_deref());
            assert_eq!(path, Some(expected), "{place}: {name}.httpGet.path");
        }
    }
}

#[test]
fn only_the_scraper_reaches_the_metrics_port() {
    let file = "overlays/example/networkpolicy.yaml";
    let Some(rendered) = render("overlays/example") else {
        return;
    };
    assert!(
        rendered
            .iter()
            .any(|object| object["kind"] == "NetworkPolicy"),
        "overlays/example does not deploy {file}"
    );
    let [policy] = objects::<NetworkPolicy>(file, "NetworkPolicy")
        .try_into()
        .unwrap_or_else(|policies: Vec<_>| panic!("{file}: {} policies", policies.len()));
    assert_eq!(
        policy.metadata.namespace.as_deref(),
        Some(NAMESPACE),
        "{file}: namespace"
    );
    let spec = policy.spec.unwrap_or_else(|| panic!("{file}: no spec"));
    let Some((daemonset, place)) = build_variant("overlays/example") else {
        return;
    };
    let pod_labels = daemonset
        .spec
        .and_then(|spec| spec.template.metadata)
        .and_then(|metadata| metadata.labels)
        .unwrap_or_else(|| panic!("{place}: the pod has no labels"));
    let selected = spec
        .pod_selector
        .and_then(|selector| selector.match_labels)
        .unwrap_or_default();
    assert!(
        !selected.is_empty() && selected.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
        "{file}: podSelector {selected:?} does not select the observer's pods {pod_labels:?}"
    );
    assert_eq!(
        spec.policy_types,
        Some(vec!["Ingress".to_owned()]),
        "{file}: policyTypes"
    );
    let rules = spec.ingress.unwrap_or_default();
    assert!(!rules.is_empty(), "{file}: no ingress rule");
    for rule in rules {
        let ports: Vec<_> = rule.ports.unwrap_or_default();
        assert!(
            !ports.is_empty()
                && ports.iter().all(|port| {
                    port.port == Some(IntOrString::String("metrics".into()))
                        || port.port == Some(IntOrString::Int(9400))
                }),
            "{file}: an ingress rule opens more than the metrics port: {ports:?}"
        );
        let peers = rule.from.unwrap_or_default();
        assert!(!peers.is_empty(), "{file}: an ingress rule admits everyone");
        for peer in peers {
            let narrowed = |labels: Option<BTreeMap<String, String>>| {
                labels.is_some_and(|labels| !labels.is_empty())
            };
            assert!(
                peer.namespace_selector
                    .is_some_and(|selector| narrowed(selector.match_labels))
                    && peer
                        .pod_selector
                        .is_some_and(|selector| narrowed(selector.match_labels)),
                "{file}: every peer names the scraper's namespace and pods"
            );
        }
    }
}

#[test]
fn pod_names_read_pods_only_in_the_watched_namespaces() {
    let file = "components/pod-names/rbac.yaml";
    for document in documents(&kubernetes_dir().join(file)) {
        let kind = document["kind"].as_str().unwrap_or_default().to_owned();
        assert!(
            kind == "Role" || kind == "RoleBinding",
            "{file}: {kind}: pod names need namespaced read access only"
        );
    }
    let roles: Vec<Role> = objects(file, "Role");
    let bindings: Vec<RoleBinding> = objects(file, "RoleBinding");
    let mut role_namespaces = BTreeSet::new();
    for role in &roles {
        let namespace = role.metadata.namespace.clone().unwrap_or_default();
        let rules = role.rules.clone().unwrap_or_default();
        let [rule] = rules.as_slice() else {
            panic!("{file}: Role in {namespace}: expected one rule");
        };
        assert_eq!(rule.resources, Some(vec!["pods".to_owned()]), "{file}");
        assert_eq!(rule.verbs, ["get", "list", "watch"], "{file}");
        let bound = bindings.iter().any(|binding| {
            binding.metadata.namespace.as_deref() == Some(namespace.as_str())
                && binding.role_ref.kind == "Role"
                && binding.role_ref.name == role.metadata.name.clone().unwrap_or_default()
                && binding.subjects.iter().flatten().any(|subject| {
                    subject.kind == "ServiceAccount"
                        && subject.name == "openim-observer"
                        && subject.namespace.as_deref() == Some(NAMESPACE)
                })
        });
        assert!(
            bound,
            "{file}: the Role in {namespace} is not bound to the observer"
        );
        assert!(
            role_namespaces.insert(namespace.clone()),
            "{file}: two Roles in {namespace}"
        );
    }
    assert_eq!(
        bindings.len(),
        roles.len(),
        "{file}: a RoleBinding per Role"
    );
    let Some((daemonset, place)) = build_variant("overlays/example") else {
        return;
    };
    let watched: BTreeSet<String> = container(&daemonset, &place)
        .args
        .unwrap_or_default()
        .iter()
        .filter_map(|arg| arg.strip_prefix("--kube-namespace="))
        .map(str::to_owned)
        .collect();
    assert!(
        !watched.is_empty(),
        "{place}: no --kube-namespace: it would watch every namespace"
    );
    assert_eq!(
        watched, role_namespaces,
        "{place}: the namespaces watched are exactly those the Roles grant"
    );
}

/// What `cargo xtask manifests ARGS` prints, parsed, or `None` (said on stderr) without the
/// xtask binary (`$XTASK_BIN`, which `cargo xtask test` sets, else the one beside this test)
/// or without a kubectl to render with.
fn xtask_manifests(args: &[&str]) -> Option<Vec<Value>> {
    let place = format!("cargo xtask manifests {}", args.join(" "));
    let xtask = match tests::sibling_binary("xtask", "XTASK_BIN") {
        Ok(xtask) => xtask,
        Err(err) => {
            let _ = writeln!(std::io::stderr(), "skipped {place}: {err:#}");
            return None;
        }
    };
    let output = Command::new(xtask)
        .arg("manifests")
        .args(args)
        .output()
        .unwrap_or_else(|err| panic!("{place}: {err}"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() && std::env::var_os("KUBECTL").is_none() && stderr.contains("run ")
    {
        let _ = writeln!(std::io::stderr(), "skipped {place}: {}", stderr.trim());
        return None;
    }
    assert!(output.status.success(), "{place} failed: {}", stderr.trim());
    Some(parse_documents(
        &String::from_utf8_lossy(&output.stdout),
        &place,
    ))
}

/// The RBAC and arguments for each namespace, typed objects, least privilege, and the chosen
/// components, for the command docs/install.md gives.
#[test]
fn xtask_manifests_render_rbac_and_arguments_for_each_namespace() {
    let variants: [(&[&str], &[&str]); 4] = [
        (&[], &["BPF", "NET_ADMIN", "PERFMON"]),
        (&["--cluster"], &["BPF", "NET_ADMIN", "PERFMON"]),
        (&["--syscall-hook"], &["BPF", "PERFMON"]),
        (&["--prometheus-operator"], &["BPF", "NET_ADMIN", "PERFMON"]),
    ];
    for (flags, capabilities) in variants {
        let args = [&["--namespace", "chat", "--namespace", "im"][..], flags].concat();
        let Some(objects) = xtask_manifests(&args) else {
            return;
        };
        let place = format!("cargo xtask manifests {}", args.join(" "));
        let problems: Vec<String> = objects
            .iter()
            .flat_map(|object| type_problems(object, &place))
            .collect();
        let operator: Vec<&Value> = objects
            .iter()
            .filter(|object| object["apiVersion"] == operator_kinds::API_VERSION)
            .collect();
        assert!(problems.is_empty(), "{}", problems.join("\n"));
        assert_eq!(
            operator.len(),
            if flags.contains(&"--prometheus-operator") {
                2
            } else {
                0
            },
            "{place}: the PodMonitor and PrometheusRule"
        );
        for object in operator {
            assert_eq!(
                object["metadata"]["namespace"], NAMESPACE,
                "{place}: {object}"
            );
        }
        for namespace in ["chat", "im"] {
            for kind in ["Role", "RoleBinding"] {
                let found = objects.iter().any(|object| {
                    object["kind"] == kind && object["metadata"]["namespace"] == namespace
                });
                assert!(found, "{place}: no {kind} in {namespace}");
            }
        }
        for binding in objects
            .iter()
            .filter(|object| object["kind"] == "RoleBinding")
        {
            assert_eq!(binding["subjects"][0]["namespace"], NAMESPACE, "{place}");
            assert_eq!(binding["subjects"][0]["name"], "openim-observer", "{place}");
        }
        let daemonset = objects
            .iter()
            .find(|object| object["kind"] == "DaemonSet")
            .unwrap_or_else(|| panic!("{place}: no DaemonSet"));
        assert_eq!(daemonset["metadata"]["namespace"], NAMESPACE, "{place}");
        let daemonset: DaemonSet = serde_json::from_value(daemonset.clone())
            .unwrap_or_else(|err| panic!("{place}: {err}"));
        assert_least_privilege_with(&daemonset, &place, capabilities);
        let container = container(&daemonset, &place);
        let container_args = container.args.unwrap_or_default();
        for expected in ["--kube", "--kube-namespace=chat", "--kube-namespace=im"] {
            assert!(
                container_args.iter().any(|arg| arg == expected),
                "{place}: no {expected} in {container_args:?}"
            );
        }
        assert!(
            !container_args.iter().any(|arg| arg.starts_with("--output")),
            "{place}: alerts stay JSON in every manifest"
        );
        let image = container.image.unwrap_or_default();
        assert!(
            image.starts_with("openim-observer:"),
            "{place}: image {image}"
        );
        assert_eq!(
            pod(&daemonset, &place).automount_service_account_token,
            Some(true),
            "{place}: the pod watch needs the service account token"
        );
        let cluster = container
            .env
            .iter()
            .flatten()
            .any(|env| env.name == "OPENIM_OBSERVER_REDIS_URL");
        assert_eq!(
            cluster,
            flags.contains(&"--cluster"),
            "{place}: cluster mode"
        );
    }
}

#[test]
fn xtask_manifests_refuse_a_name_kubernetes_would_refuse() {
    let xtask = match tests::sibling_binary("xtask", "XTASK_BIN") {
        Ok(xtask) => xtask,
        Err(err) => {
            let _ = writeln!(std::io::stderr(), "skipped: {err:#}");
            return;
        }
    };
    let output = Command::new(xtask)
        .args(["manifests", "--namespace", "Chat: x"])
        .output()
        .expect("run xtask");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("not a Kubernetes namespace name"),
        "{stderr}"
    );
}
