//! Builds, for `cargo xtask manifests`, the Kubernetes manifests for a given set of OpenIM
//! namespaces, rendered by `kubectl kustomize` from deploy/kubernetes, so installing needs no hand
//! edit: a Role and RoleBinding per namespace for the pod watch, the `--kube-namespace` argument
//! for each, and the chosen components.
//!
//! The kustomization is written to a directory of its own under target/ (kustomize takes
//! relative paths only), which names deploy/kubernetes's base and components, and is removed
//! after rendering.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use clap::Args;

/// Names the DaemonSet, service account and namespace the base defines.
const OBSERVER: &str = "openim-observer";

#[derive(Args, Debug)]
pub struct ManifestsArgs {
    /// A namespace OpenIM runs in (repeat for several): the observer may read its pods, and
    /// watches it only.
    #[arg(long = "namespace", value_name = "NS", required = true)]
    pub namespaces: Vec<String>,
    /// Cluster mode: the observers share state through Redis (components/cluster; the Secret
    /// `openim-observer-redis` holds the URL).
    #[arg(long)]
    pub cluster: bool,
    /// Capture at the syscalls instead of the packets, for clusters that refuse NET_ADMIN
    /// (components/syscall-hook).
    #[arg(long)]
    pub syscall_hook: bool,
    /// A PodMonitor and the alert rules as a PrometheusRule, for clusters that run the
    /// Prometheus operator (components/monitoring; its CRDs must be installed).
    #[arg(long)]
    pub prometheus_operator: bool,
    /// The observer's image, with a tag or digest. Default: openim-observer:VERSION, the
    /// name `cargo xtask image` builds.
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,
    /// Write the manifests here instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Renders the manifests `args` ask for, and prints or writes them.
///
/// # Errors
///
/// Fails when rendering fails (see [`render`]) or the output file cannot be written.
pub fn manifests(root: &Path, args: &ManifestsArgs) -> Result<()> {
    let rendered = render(root, args)?;
    match &args.output {
        Some(path) => {
            std::fs::write(path, rendered).with_context(|| format!("write {}", path.display()))
        }
        None => {
            print!("{rendered}");
            Ok(())
        }
    }
}

/// Returns the manifests as `kubectl kustomize` renders them (`$KUBECTL`, else `kubectl`).
///
/// # Errors
///
/// Fails when a namespace is not an RFC 1123 label, the image reference or the observer's version
/// cannot be read, or the kustomization cannot be written or rendered.
pub fn render(root: &Path, args: &ManifestsArgs) -> Result<String> {
    for namespace in &args.namespaces {
        check_namespace(namespace)?;
    }
    let image = match &args.image {
        Some(image) => image.clone(),
        None => format!("{OBSERVER}:{}", observer_version(root)?),
    };
    let (name, reference) = split_image(&image)?;
    let dir = root
        .join("target")
        .join(format!("manifests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let written = write_kustomization(&dir, args, name, reference);
    let rendered = written.and_then(|()| kustomize(&dir));
    let _ = std::fs::remove_dir_all(&dir);
    rendered
}

/// Checks that a namespace is one Kubernetes accepts (an RFC 1123 label), so it is safe in YAML as
/// well.
fn check_namespace(namespace: &str) -> Result<()> {
    let bytes = namespace.as_bytes();
    let valid = !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || *byte == b'-')
        && bytes.first() != Some(&b'-')
        && bytes.last() != Some(&b'-');
    if !valid {
        bail!(
            "--namespace {namespace:?}: not a Kubernetes namespace name (lowercase letters, digits \
            and '-', at most 63)"
        );
    }
    Ok(())
}

/// Splits `name:tag` or `name@digest` into the name, and `newTag: …` or `digest: …`.
fn split_image(image: &str) -> Result<(&str, String)> {
    if let Some((name, digest)) = image.split_once('@') {
        return Ok((name, format!("digest: {digest}")));
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.rsplit_once(':') {
        Some((_, tag)) if !tag.is_empty() => {
            let name = &image[..image.len() - tag.len() - 1];
            Ok((name, format!("newTag: \"{tag}\"")))
        }
        _ => bail!("--image {image}: give a tag or digest, so nodes do not pull `latest`"),
    }
}

/// Returns the observer crate's version, as `observer --version` prints it.
fn observer_version(root: &Path) -> Result<String> {
    let manifest = root.join("observer/Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .with_context(|| format!("read {}", manifest.display()))?;
    text.lines()
        .find_map(|line| line.strip_prefix("version = "))
        .map(|version| version.trim_matches('"').to_owned())
        .with_context(|| format!("{}: no version", manifest.display()))
}

/// Writes the kustomization into `dir`, a directory two levels below the workspace root.
fn write_kustomization(
    dir: &Path,
    args: &ManifestsArgs,
    image_name: &str,
    image_reference: String,
) -> Result<()> {
    let kubernetes = Path::new("../../deploy/kubernetes");
    let mut kustomization = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\n  - \
        rbac.yaml\n",
        kubernetes.join("base").display()
    );
    let components: Vec<PathBuf> = [
        (args.cluster, kubernetes.join("components/cluster")),
        (
            args.syscall_hook,
            kubernetes.join("components/syscall-hook"),
        ),
        (
            args.prometheus_operator,
            kubernetes.join("components/monitoring"),
        ),
    ]
    .into_iter()
    .filter_map(|(chosen, path)| chosen.then_some(path))
    .collect();
    if !components.is_empty() {
        kustomization.push_str("components:\n");
        for path in components {
            let _ = writeln!(kustomization, "  - {}", path.display());
        }
    }
    let _ = write!(
        kustomization,
        "patches:\n  - path: pod-names.yaml\n    target:\n      group: apps\n      version: \
        v1\n      kind: DaemonSet\n      name: {OBSERVER}\n"
    );
    let _ = write!(
        kustomization,
        "images:\n  - name: {OBSERVER}\n    newName: {image_name}\n    {image_reference}\n"
    );
    let files = [
        ("kustomization.yaml", kustomization),
        ("rbac.yaml", rbac(&args.namespaces)),
        ("pod-names.yaml", pod_names_patch(&args.namespaces)),
    ];
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}

/// Renders a Role (read pods) and its RoleBinding to the observer's service account, per namespace:
/// as components/pod-names/rbac.yaml, once for each.
fn rbac(namespaces: &[String]) -> String {
    let mut objects = Vec::new();
    for namespace in namespaces {
        objects.push(format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: \
            {OBSERVER}-pod-reader\n  namespace: {namespace}\nrules:\n  - apiGroups: \
            [\"\"]\n    resources: [\"pods\"]\n    verbs: [\"get\", \"list\", \"watch\"]\n"
        ));
        objects.push(format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: \
            {OBSERVER}-pod-reader\n  namespace: {namespace}\nroleRef:\n  apiGroup: \
            rbac.authorization.k8s.io\n  kind: Role\n  name: {OBSERVER}-pod-reader\nsubjects:\n  - \
            kind: ServiceAccount\n    name: {OBSERVER}\n    namespace: {OBSERVER}\n"
        ));
    }
    objects.join("---\n")
}

/// Renders the JSON patch components/pod-names/daemonset-kube.yaml makes, with one
/// `--kube-namespace` per namespace.
fn pod_names_patch(namespaces: &[String]) -> String {
    let mut patch = String::new();
    let args = namespaces
        .iter()
        .map(|namespace| format!("--kube-namespace={namespace}"))
        .chain(["--kube".to_owned()]);
    for arg in args {
        let _ = write!(
            patch,
            "- op: add\n  path: /spec/template/spec/containers/0/args/-\n  value: {arg}\n"
        );
    }
    patch.push_str(
        "- op: add\n  path: /spec/template/spec/automountServiceAccountToken\n  value: true\n",
    );
    patch
}

/// Runs `kubectl kustomize dir` and returns what it prints.
fn kustomize(dir: &Path) -> Result<String> {
    let kubectl = std::env::var_os("KUBECTL").unwrap_or_else(|| "kubectl".into());
    let output = Command::new(&kubectl)
        .arg("kustomize")
        .arg(dir)
        .output()
        .with_context(|| format!("run {} (set KUBECTL)", kubectl.to_string_lossy()))?;
    if !output.status.success() {
        bail!(
            "kubectl kustomize failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    String::from_utf8(output.stdout).context("kubectl kustomize printed something other than UTF-8")
}

#[cfg(test)]
mod tests;
