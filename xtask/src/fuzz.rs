//! Runs the fuzz smoke of `cargo xtask test`: every target of observer/fuzz (a cargo-fuzz crate
//! outside the workspace) built with the pinned nightly and run for a few seconds from a fixed seed
//! over its checked-in seeds and its local corpus, so that a target that stops building or trips on
//! its first inputs fails CI.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{Toolchain, capture, data_dir, status, step, workspace_root};

/// Names the cargo-fuzz release xtask installs (from crates.io, `--locked`) and caches.
const CARGO_FUZZ_VERSION: &str = "0.13.1";
/// Names the fuzz crate, relative to the workspace root.
const FUZZ_DIR: &str = "observer/fuzz";
/// Counts the mutations per target after the seeds and corpus are replayed: the engine target, the
/// slowest, does them in about 12 s on a busy 2-core machine, the others in 1 to 3 s.
const SMOKE_RUNS: &str = "20000";
/// Bounds each target's run, whatever its speed.
const SMOKE_MAX_SECONDS: &str = "30";

/// Returns where cargo-fuzz is installed: outside target/, so `cargo clean` keeps it.
fn cargo_fuzz_root() -> Result<PathBuf> {
    Ok(data_dir()?.join(format!("cargo-fuzz-{CARGO_FUZZ_VERSION}")))
}

/// Installs cargo-fuzz once; later runs find it.
fn install_cargo_fuzz() -> Result<PathBuf> {
    let root = cargo_fuzz_root()?;
    let bin = root.join("bin");
    let installed = Command::new(bin.join("cargo-fuzz"))
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success());
    if !installed {
        step(
            &format!(
                "installing cargo-fuzz {CARGO_FUZZ_VERSION} into {} (once)",
                root.display()
            ),
            Command::new("cargo")
                .args(["install", "cargo-fuzz", "--locked", "--version"])
                .arg(CARGO_FUZZ_VERSION)
                .arg("--root")
                .arg(&root),
        )?;
    }
    Ok(bin)
}

/// Builds a `cargo +<pinned nightly> fuzz …` command in the fuzz crate, cargo-fuzz first on PATH.
fn cargo_fuzz(toolchain: &Toolchain, cargo_fuzz_bin: &Path) -> Command {
    let mut path = OsString::from(cargo_fuzz_bin);
    if let Some(existing) = std::env::var_os("PATH") {
        path.push(":");
        path.push(existing);
    }
    let mut command = Command::new("cargo");
    command
        .current_dir(workspace_root().join(FUZZ_DIR))
        .env("PATH", path)
        // The stable toolchain's cargo sets these for xtask; they must not leak into nightly.
        .env_remove("RUSTC")
        .env_remove("RUSTDOC")
        .env_remove("CARGO")
        .arg(format!("+{}", toolchain.nightly))
        .arg("fuzz");
    command
}

/// Builds every fuzz target with the pinned nightly and runs each over its seeds and corpus for a
/// bounded number of mutations.
///
/// # Errors
///
/// Fails when cargo-fuzz cannot be installed, `cargo fuzz list` names no target, the build fails, a
/// target has no seeds, or a target's run fails.
pub fn smoke(toolchain: &Toolchain) -> Result<()> {
    let cargo_fuzz_bin = install_cargo_fuzz()?;
    let listed = capture(cargo_fuzz(toolchain, &cargo_fuzz_bin).arg("list"))?;
    let targets: Vec<&str> = listed
        .lines()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect();
    if targets.is_empty() {
        bail!("`cargo fuzz list` in {FUZZ_DIR} names no target");
    }
    step(
        "building the fuzz targets (pinned nightly, cargo-fuzz)",
        cargo_fuzz(toolchain, &cargo_fuzz_bin).arg("build"),
    )?;
    let fuzz_dir = workspace_root().join(FUZZ_DIR);
    for target in &targets {
        let seeds = fuzz_dir.join("seeds").join(target);
        if !seeds.is_dir() {
            bail!("fuzz target {target} has no seeds in {}", seeds.display());
        }
        // New inputs land in the (git-ignored) corpus, which later smokes replay too.
        let corpus = fuzz_dir.join("corpus").join(target);
        std::fs::create_dir_all(&corpus)
            .with_context(|| format!("creating {}", corpus.display()))?;
        eprintln!("xtask: fuzz smoke: {target}");
        status(
            cargo_fuzz(toolchain, &cargo_fuzz_bin)
                .args(["run", target])
                .arg(&corpus)
                .arg(&seeds)
                .args(["--", "-seed=1", "-timeout=10"])
                .arg(format!("-runs={SMOKE_RUNS}"))
                .arg(format!("-max_total_time={SMOKE_MAX_SECONDS}")),
        )
        .with_context(|| {
            format!(
                "fuzz target {target} failed its smoke run; reproduce with `cd {FUZZ_DIR} && cargo \
                +{} fuzz run {target} <artifact>`",
                toolchain.nightly
            )
        })?;
    }
    Ok(())
}
