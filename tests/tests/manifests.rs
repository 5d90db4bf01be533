//! Checks the Kubernetes manifests under deploy/kubernetes without a cluster or the kustomize
//! binary:
//! - every object, and every strategic-merge patch, is the k8s-openapi type of its `kind` with no
//!   field that type lacks. k8s-openapi silently ignores unknown fields, so each document is read
//!   into the typed struct, written back, and compared with the original: whatever the round trip
//!   lost was not a field of that type (a typo, or a field at the wrong level);
//! - every kustomization uses only the fields modelled here and names files that exist;
//! - the DaemonSet each overlay produces, built by a small model of kustomize that covers what
//!   these files use, runs with exactly the privileges deploy/README.md documents.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use k8s_openapi::DeepMerge;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, Namespace, PodSpec, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::Value;

/// The base's image name, which overlays replace through `images:`.
const IMAGE_PLACEHOLDER: &str = "openim-observer";
/// components/pod-names/rbac.yaml binds the service account in this namespace, and kustomize
/// does not rewrite that subject, so every kustomization must keep it.
const NAMESPACE: &str = "openim-observer";
const CONTAINER: &str = "observer";

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
    serde_norway::Deserializer::from_str(&text)
        .enumerate()
        .map(|(index, document)| {
            Value::deserialize(document).unwrap_or_else(|err| {
                panic!("{} document {}: not YAML: {err}", shown(path), index + 1)
            })
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
        Some("Role") => through::<Role>(document),
        Some("RoleBinding") => through::<RoleBinding>(document),
        Some("NetworkPolicy") => through::<NetworkPolicy>(document),
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

/// One operation of a JSON patch (RFC 6902) file.
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
enum JsonPatchOp {
    /// The only operation these files use, so the only one modelled: any other fails to parse
    /// here instead of going unchecked.
    Add { path: String, value: Value },
}

/// The subset of kustomization.yaml these files use. Any other field fails the parse: extend
/// this struct, and `build`, when a kustomization needs more.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Kustomization {
    api_version: String,
    kind: String,
    namespace: Option<String>,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    components: Vec<String>,
    #[serde(default)]
    patches: Vec<PatchRef>,
    #[serde(default)]
    images: Vec<ImageOverride>,
    #[serde(default)]
    config_map_generator: Vec<ConfigMapGenerator>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchRef {
    path: String,
    /// Present for JSON patches, which do not name their target themselves.
    target: Option<PatchTarget>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchTarget {
    group: String,
    version: String,
    kind: String,
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ImageOverride {
    name: String,
    new_name: String,
    new_tag: Option<String>,
    digest: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigMapGenerator {
    name: String,
    behavior: Option<String>,
    literals: Vec<String>,
}

fn read_kustomization(dir: &Path) -> Kustomization {
    let path = dir.join("kustomization.yaml");
    let documents = documents(&path);
    let [document] = documents.as_slice() else {
        panic!("{}: expected one document", shown(&path));
    };
    serde_json::from_value(document.clone()).unwrap_or_else(|err| {
        panic!(
            "{}: {err} (only the fields in tests/tests/manifests.rs `Kustomization` are checked)",
            shown(&path)
        )
    })
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
            let place = format!("{} document {}", shown(path), index + 1);
            if document.is_array() {
                if let Err(err) = serde_json::from_value::<Vec<JsonPatchOp>>(document.clone()) {
                    failures.push(format!(
                        "{place}: not a JSON patch of `add` operations: {err}"
                    ));
                }
                continue;
            }
            match round_trip(document) {
                Err(err) => failures.push(format!("{place} ({}): {err}", describe(document))),
                Ok(typed) => {
                    let mut lost = Vec::new();
                    lost_fields(document, &typed, "", &mut lost);
                    failures.extend(
                        lost.into_iter()
                            .map(|problem| format!("{place} ({}): {problem}", describe(document))),
                    );
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "manifest problems:\n{}",
        failures.join("\n")
    );
}

#[test]
fn kustomizations_name_existing_files_and_keep_the_namespace() {
    let mut checked = 0;
    for path in yaml_files(&kubernetes_dir())
        .iter()
        .filter(|path| is_kustomization(path))
    {
        let dir = path.parent().expect("a file has a parent");
        let place = shown(path);
        let kustomization = read_kustomization(dir);
        let expected_api = match kustomization.kind.as_str() {
            "Kustomization" => "kustomize.config.k8s.io/v1beta1",
            "Component" => "kustomize.config.k8s.io/v1alpha1",
            other => panic!("{place}: `kind` is {other}, not Kustomization or Component"),
        };
        assert_eq!(
            kustomization.api_version, expected_api,
            "{place}: `apiVersion` of a {}",
            kustomization.kind
        );
        if let Some(namespace) = &kustomization.namespace {
            assert_eq!(namespace, NAMESPACE, "{place}: `namespace`");
        }
        for resource in &kustomization.resources {
            assert!(
                dir.join(resource).exists(),
                "{place}: resource {resource} does not exist"
            );
        }
        for component in &kustomization.components {
            let component_dir = dir.join(component);
            assert_eq!(
                read_kustomization(&component_dir).kind,
                "Component",
                "{place}: components entry {component} is not a Component"
            );
        }
        for patch in &kustomization.patches {
            assert!(
                dir.join(&patch.path).is_file(),
                "{place}: patch {} does not exist",
                patch.path
            );
        }
        for image in &kustomization.images {
            assert_eq!(
                image.name, IMAGE_PLACEHOLDER,
                "{place}: `images[].name` must be the base's image name or nothing is replaced"
            );
            assert!(
                image.new_tag.is_some() || image.digest.is_some(),
                "{place}: image {} needs `newTag` or `digest`, so nodes do not pull `latest`",
                image.new_name
            );
        }
        for generator in &kustomization.config_map_generator {
            // The base creates the ConfigMap; anything else that names it must merge into it.
            let in_base = dir.ends_with("base");
            assert_eq!(
                generator.behavior.as_deref(),
                (!in_base).then_some("merge"),
                "{place}: `configMapGenerator` {} `behavior`",
                generator.name
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 4, "expected base, one component and two overlays");
}

/// What kustomize would output for the DaemonSet, and the keys of the generated ConfigMaps.
#[derive(Default)]
struct Built {
    daemonset: Option<Value>,
    config_keys: BTreeMap<String, BTreeSet<String>>,
}

/// A model of `kustomize build dir`, for the DaemonSet only and for the features these files
/// use: resources, components, JSON patches (`add`), strategic-merge patches (merged with
/// k8s-openapi's `DeepMerge`, which merges the same lists by the same keys, e.g. containers
/// by name), images, namespace, and the keys of generated ConfigMaps.
fn build(dir: &Path, built: &mut Built) {
    let place = shown(&dir.join("kustomization.yaml"));
    let kustomization = read_kustomization(dir);
    for resource in &kustomization.resources {
        let path = dir.join(resource);
        if path.is_dir() {
            build(&path, built);
            continue;
        }
        for document in documents(&path) {
            if document.get("kind").and_then(Value::as_str) == Some("DaemonSet") {
                assert!(
                    built.daemonset.replace(document).is_none(),
                    "{place}: more than one DaemonSet"
                );
            }
        }
    }
    for component in &kustomization.components {
        build(&dir.join(component), built);
    }
    for generator in &kustomization.config_map_generator {
        let keys = generator.literals.iter().map(|literal| {
            let (key, _) = literal.split_once('=').unwrap_or_else(|| {
                panic!("{place}: literal {literal:?} is not key=value");
            });
            key.to_owned()
        });
        built
            .config_keys
            .entry(generator.name.clone())
            .or_default()
            .extend(keys);
    }
    let daemonset = built
        .daemonset
        .as_mut()
        .unwrap_or_else(|| panic!("{place}: no DaemonSet among the resources"));
    for patch in &kustomization.patches {
        let path = dir.join(&patch.path);
        let patch_place = shown(&path);
        let documents = documents(&path);
        let [document] = documents.as_slice() else {
            panic!("{patch_place}: expected one document");
        };
        match &patch.target {
            Some(target) => {
                let expected = (
                    format!("{}/{}", target.group, target.version),
                    target.kind.as_str(),
                    target.name.as_str(),
                );
                let actual = (
                    daemonset["apiVersion"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    daemonset["kind"].as_str().unwrap_or_default(),
                    daemonset["metadata"]["name"].as_str().unwrap_or_default(),
                );
                assert_eq!(
                    expected, actual,
                    "{place}: the target of {patch_place} is not the DaemonSet"
                );
                let operations: Vec<JsonPatchOp> = serde_json::from_value(document.clone())
                    .unwrap_or_else(|err| panic!("{patch_place}: {err}"));
                for JsonPatchOp::Add { path, value } in operations {
                    add(daemonset, &path, value)
                        .unwrap_or_else(|err| panic!("{patch_place}: add {path}: {err}"));
                }
            }
            None => {
                assert_eq!(
                    describe(document),
                    describe(daemonset),
                    "{patch_place}: a strategic-merge patch must name the DaemonSet"
                );
                let mut merged = typed(daemonset, &place);
                merged.merge_from(typed(document, &patch_place));
                *daemonset = serde_json::to_value(merged).expect("a DaemonSet serialises");
            }
        }
    }
    for image in &kustomization.images {
        let replacement = match (&image.new_tag, &image.digest) {
            (_, Some(digest)) => format!("{}@{digest}", image.new_name),
            (Some(tag), None) => format!("{}:{tag}", image.new_name),
            (None, None) => image.new_name.clone(),
        };
        for container in daemonset["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            if container["image"] == image.name.as_str() {
                container["image"] = Value::String(replacement.clone());
            }
        }
    }
    if let Some(namespace) = &kustomization.namespace {
        daemonset["metadata"]["namespace"] = Value::String(namespace.clone());
    }
}

/// RFC 6902 `add` for the two forms these files use: a new object member, and `-` (append).
fn add(document: &mut Value, path: &str, value: Value) -> Result<(), String> {
    let (parent, last) = path
        .rsplit_once('/')
        .ok_or("the path does not start with /")?;
    let last = last.replace("~1", "/").replace("~0", "~");
    match document.pointer_mut(parent) {
        Some(Value::Array(items)) if last == "-" => items.push(value),
        Some(Value::Object(fields)) => {
            fields.insert(last, value);
        }
        Some(_) => {
            return Err(format!(
                "`{parent}` is neither an object nor an array (with -)"
            ));
        }
        None => return Err(format!("`{parent}` does not exist in the DaemonSet")),
    }
    Ok(())
}

fn typed(document: &Value, place: &str) -> DaemonSet {
    serde_json::from_value(document.clone()).unwrap_or_else(|err| panic!("{place}: {err}"))
}

/// Builds `dir` (relative to deploy/kubernetes) and checks what every variant shares: the
/// container reads the ports from env that exists, the env from ConfigMap keys that exist,
/// and the probes from the declared metrics port.
fn build_variant(dir: &str) -> (DaemonSet, String) {
    let place = format!("deploy/kubernetes/{dir}");
    let mut built = Built::default();
    build(&kubernetes_dir().join(dir), &mut built);
    let daemonset = typed(&built.daemonset.expect("build found a DaemonSet"), &place);
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
        let known = built.config_keys.get(&key_ref.name);
        assert!(
            known.is_some_and(|keys| keys.contains(&key_ref.key)),
            "{place}: env {} reads key {} of ConfigMap {}, which no configMapGenerator makes",
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
    (daemonset, place)
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
        added,
        ["BPF", "PERFMON"],
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
}

/// What the pod-names component adds, seen through the example overlay.
fn assert_pod_names_and_image(daemonset: &DaemonSet, place: &str) {
    let container = container(daemonset, place);
    assert_eq!(
        container.image.as_deref(),
        Some("registry.example.com/openim-observer:0.1.0"),
        "{place}: image"
    );
    assert_eq!(
        container.args.as_ref().and_then(|args| args.last()),
        Some(&"--kube".to_owned()),
        "{place}: the pod-names component appends --kube"
    );
    assert_eq!(
        pod(daemonset, place).automount_service_account_token,
        Some(true),
        "{place}: the pod-names component mounts the service account token"
    );
    // The observer finds a process's pod from its cgroup in the node's hierarchy, read-only.
    let cgroup_root = container
        .args
        .iter()
        .flatten()
        .find_map(|arg| arg.strip_prefix("--cgroup-root="))
        .unwrap_or_else(|| panic!("{place}: the pod-names component passes no --cgroup-root="));
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
    let volume = pod(daemonset, place)
        .volumes
        .into_iter()
        .flatten()
        .find(|volume| volume.name == mount.name)
        .and_then(|volume| volume.host_path)
        .unwrap_or_else(|| panic!("{place}: volume {} is not a hostPath", mount.name));
    assert_eq!(volume.path, "/sys/fs/cgroup", "{place}: cgroup hostPath");
}

#[test]
fn base_runs_with_least_privilege_and_no_api_access() {
    let (daemonset, place) = build_variant("base");
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
}

#[test]
fn example_overlay_keeps_least_privilege_and_adds_pod_names() {
    let (daemonset, place) = build_variant("overlays/example");
    assert_least_privilege(&daemonset, &place);
    assert_pod_names_and_image(&daemonset, &place);
}

#[test]
fn privileged_overlay_is_the_example_made_privileged() {
    let (daemonset, place) = build_variant("overlays/privileged");
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
fn probes_ask_healthz_not_metrics() {
    for variant in ["base", "overlays/example", "overlays/privileged"] {
        let (daemonset, place) = build_variant(variant);
        let container = container(&daemonset, &place);
        for (name, probe) in [
            ("startupProbe", &container.startup_probe),
            ("livenessProbe", &container.liveness_probe),
            ("readinessProbe", &container.readiness_probe),
        ] {
            let path = probe
                .as_ref()
                .and_then(|probe| probe.http_get.as_ref())
                .and_then(|get| get.path.as_deref());
            assert_eq!(path, Some("/healthz"), "{place}: {name}.httpGet.path");
        }
    }
}

#[test]
fn only_the_scraper_reaches_the_metrics_port() {
    let file = "overlays/example/networkpolicy.yaml";
    assert!(
        read_kustomization(&kubernetes_dir().join("overlays/example"))
            .resources
            .iter()
            .any(|resource| resource == "networkpolicy.yaml"),
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
    let (daemonset, place) = build_variant("overlays/example");
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
    let (daemonset, place) = build_variant("overlays/example");
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
