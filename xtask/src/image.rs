//! Builds the container image of `cargo xtask image` on this machine without a Docker daemon and
//! without pulling anything.
//!
//! The image holds the release observer and the shared libraries it loads (glibc, libgcc_s and
//! the dynamic loader, as `ldd` lists them) and nothing else: no shell, no package manager.
//! `deploy/Dockerfile` describes it once for both ways of building it. Its builder stage runs
//! `cargo xtask image --rootfs /out/rootfs`, which lays out exactly these files; its runtime
//! stage copies them into an empty (`scratch`) image and sets the labels, user and entrypoint.
//! Here buildah runs that runtime stage alone, with the builder stage replaced by the files laid
//! out on this machine (`--build-context builder=…`), so the builder's base image is never
//! needed and both builds produce the same image contents.
//!
//! Both builds name the commit they were built from: the release observer is compiled with
//! `OPENIM_OBSERVER_COMMIT` (its `build_info` series' `commit` label) and the image is labelled
//! `org.opencontainers.image.revision` with it, from `git rev-parse --short HEAD`, or from the
//! variable itself where there is no git (the Dockerfile's build argument of that name).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::{Toolchain, apt, capture, host_cargo, step, workspace_root};

/// Tells tests/tests/image.rs which archive to run.
pub const ARCHIVE_ENV: &str = "OPENIM_IMAGE_ARCHIVE";
/// Names the variable of the commit the observer reports in `build_info`, read when it is compiled
/// (observer/src/metrics.rs); also deploy/Dockerfile's build argument.
pub const COMMIT_ENV: &str = "OPENIM_OBSERVER_COMMIT";
/// Holds what `build_info` says when the commit is not known.
const UNKNOWN_COMMIT: &str = "unknown";

/// Says where deploy/Dockerfile's runtime stage finds the root filesystem in the builder stage.
const ROOTFS_IN_BUILDER: &str = "out/rootfs";
/// Holds the entrypoint deploy/Dockerfile names.
const BINARY_IN_IMAGE: &str = "usr/local/bin/observer";
const IMAGE_NAME: &str = "openim-observer";

#[derive(clap::Args)]
pub struct ImageArgs {
    /// Then run the image under runc with the DaemonSet's security contexts
    /// (tests/tests/image.rs; needs root, loads the eBPF programs).
    #[arg(long, conflicts_with = "rootfs")]
    test: bool,
    /// Only build the release observer and lay out the image's root filesystem in DIR (what
    /// deploy/Dockerfile's builder stage runs); no buildah.
    #[arg(long, value_name = "DIR")]
    rootfs: Option<PathBuf>,
}

/// Builds the image, and with `--test` runs its test; with `--rootfs`, builds only the release
/// observer and the image's root filesystem.
///
/// # Errors
///
/// Fails when a build, the root filesystem's layout or the image's test fails.
pub fn image(toolchain: &Toolchain, args: &ImageArgs) -> Result<()> {
    if let Some(rootfs) = &args.rootfs {
        build_release(toolchain, &commit())?;
        return lay_out_rootfs(&release_binary(), rootfs);
    }
    let archive = build(toolchain)?;
    if args.test {
        step(
            "running the image under runc (tests/tests/image.rs)",
            host_cargo("test")
                .args(["--package", "tests", "--test", "image"])
                .args(["--", "--test-threads=1"])
                .env(ARCHIVE_ENV, &archive),
        )?;
    }
    Ok(())
}

/// Builds the release observer and the image around it; returns the OCI archive's path. Also
/// installs runc, which the image's test runs it with.
///
/// # Errors
///
/// Fails when buildah or runc is missing and cannot be installed, the release build, the root
/// filesystem's layout or buildah fails, or `observer --version` prints no version.
pub fn build(toolchain: &Toolchain) -> Result<PathBuf> {
    apt::ensure("buildah", "buildah")?;
    apt::ensure("runc", "runc")?;
    let started = Instant::now();
    let commit = commit();
    build_release(toolchain, &commit)?;
    let release_build = started.elapsed();

    let dir = workspace_root().join("target/image");
    let work = WorkDirs::new(&dir)?;
    lay_out_rootfs(&release_binary(), &work.builder.join(ROOTFS_IN_BUILDER))?;
    let version = capture(Command::new(release_binary()).arg("--version"))?;
    let version = version
        .split_whitespace()
        .nth(1)
        .context("`observer --version` printed no version")?;
    let tag = format!("{IMAGE_NAME}:{version}");

    // Storage of its own, on vfs (plain directories, no mounts), so the build neither needs nor
    // touches the machine's container storage and leaves nothing behind.
    let buildah = || {
        let mut command = Command::new("buildah");
        command
            .arg("--root")
            .arg(&work.storage)
            .arg("--runroot")
            .arg(&work.runroot)
            .args(["--storage-driver", "vfs"]);
        command
    };
    step(
        "building the image (buildah, deploy/Dockerfile's runtime stage)",
        buildah()
            .args(["bud", "--quiet", "--pull=never", "--layers=false"])
            // Reproducible: the same files give the same image digest (file times and the
            // creation date are the epoch; no builder version label).
            .args(["--timestamp", "0", "--identity-label=false"])
            .arg("--build-arg")
            .arg(format!("{COMMIT_ENV}={commit}"))
            .arg("--build-context")
            .arg(format!("builder={}", work.builder.display()))
            .arg("--file")
            .arg(workspace_root().join("deploy/Dockerfile"))
            .args(["--tag", &tag])
            .arg(&work.builder),
    )?;
    let archive = dir.join(format!("{IMAGE_NAME}.oci.tar"));
    let _ = std::fs::remove_file(&archive);
    let digest_file = work.runroot.join("digest");
    step(
        "writing the OCI archive",
        buildah()
            .args(["push", "--quiet", "--digestfile"])
            .arg(&digest_file)
            .arg(&tag)
            .arg(format!("oci-archive:{}:{tag}", archive.display())),
    )?;
    let digest = std::fs::read_to_string(&digest_file)
        .with_context(|| format!("reading {}", digest_file.display()))?;
    eprintln!(
        "xtask: image {tag} ({digest}, commit {commit}) in {}; release build {:.0?}, image {:.0?}",
        archive.display(),
        release_build,
        started.elapsed() - release_build,
    );
    Ok(archive)
}

/// Returns the commit to build from: `$OPENIM_OBSERVER_COMMIT` when set (a Docker build, whose
/// context has no .git), else `git rev-parse --short HEAD`, else `unknown` (a tree outside git).
pub fn commit() -> String {
    if let Some(commit) = std::env::var(COMMIT_ENV)
        .ok()
        .filter(|commit| !commit.is_empty())
    {
        return commit;
    }
    let head = capture(Command::new("git").current_dir(workspace_root()).args([
        "rev-parse",
        "--short",
        "HEAD",
    ]));
    match head {
        Ok(head) if !head.trim().is_empty() => head.trim().to_owned(),
        _ => UNKNOWN_COMMIT.to_owned(),
    }
}

/// Builds the eBPF programs and the release observer, which reports `commit` in `build_info`.
fn build_release(toolchain: &Toolchain, commit: &str) -> Result<()> {
    crate::build_ebpf(toolchain)?;
    step(
        &format!("building the release observer (commit {commit})"),
        host_cargo("build")
            .args(["--package", "observer", "--release"])
            .env(COMMIT_ENV, commit),
    )
}

fn release_binary() -> PathBuf {
    workspace_root().join("target/release/observer")
}

/// Holds the scratch directories of one image build, removed when it ends however it ends.
struct WorkDirs {
    /// Stands in for deploy/Dockerfile's builder stage: holds `out/rootfs`.
    builder: PathBuf,
    storage: PathBuf,
    runroot: PathBuf,
}

impl WorkDirs {
    fn new(dir: &Path) -> Result<Self> {
        let work = Self {
            builder: dir.join("builder"),
            storage: dir.join("storage"),
            runroot: dir.join("run"),
        };
        // Whatever an interrupted build left.
        work.remove();
        for path in [&work.builder, &work.storage, &work.runroot] {
            std::fs::create_dir_all(path)
                .with_context(|| format!("creating {}", path.display()))?;
        }
        Ok(work)
    }

    fn remove(&self) {
        for path in [&self.builder, &self.storage, &self.runroot] {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

impl Drop for WorkDirs {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Lays out the image's files in `rootfs`, which is emptied first: `binary` as the entrypoint,
/// and every shared library it loads at the path the loader looks for it.
fn lay_out_rootfs(binary: &Path, rootfs: &Path) -> Result<()> {
    if rootfs.exists() {
        std::fs::remove_dir_all(rootfs)
            .with_context(|| format!("emptying {}", rootfs.display()))?;
    }
    let mut files = vec![(binary.to_path_buf(), rootfs.join(BINARY_IN_IMAGE))];
    for library in shared_libraries(binary)? {
        let inside = library
            .strip_prefix("/")
            .expect("shared_libraries returns absolute paths");
        files.push((library.clone(), rootfs.join(inside)));
    }
    for (source, destination) in &files {
        let parent = destination
            .parent()
            .expect("a file in the rootfs has a parent");
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
        // Libraries are usually symlinks to versioned files: the image gets the file itself,
        // at the name the loader asks for. fs::copy follows symlinks and keeps the mode.
        std::fs::copy(source, destination).with_context(|| {
            format!("copying {} to {}", source.display(), destination.display())
        })?;
    }
    eprintln!(
        "xtask: image root filesystem in {}: {}",
        rootfs.display(),
        files
            .iter()
            .map(|(_, destination)| format!(
                "/{}",
                destination
                    .strip_prefix(rootfs)
                    .unwrap_or(destination)
                    .display()
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

/// Returns the files the dynamic loader maps for `binary`: ldd's `name => /path (address)` lines
/// and the loader's own `/path (address)`. The vDSO has no file and is skipped.
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let listing = capture(Command::new("ldd").arg(binary))
        .with_context(|| format!("listing the shared libraries of {}", binary.display()))?;
    let mut libraries = Vec::new();
    for line in listing.lines().map(str::trim) {
        if line.contains("not found") {
            bail!(
                "{} needs a library this machine lacks: {line}",
                binary.display()
            );
        }
        let target = line.split_once("=>").map_or(line, |(_, target)| target);
        if let Some(path) = target
            .split_whitespace()
            .next()
            .filter(|path| path.starts_with('/'))
        {
            libraries.push(PathBuf::from(path));
        }
    }
    if libraries.is_empty() {
        bail!("ldd lists no shared library for {}", binary.display());
    }
    Ok(libraries)
}
