//! Runs, for `cargo xtask soak`, the lab at a steady mixed load in cluster mode for minutes
//! (`openim-lab soak`), and the short soak `cargo xtask test` runs.

use std::ffi::OsString;
use std::process::Command;

use anyhow::{Context, Result};

use super::{Toolchain, apt, build_ebpf, host_cargo, status, step, workspace_root};

/// Holds the arguments of the short soak of `cargo xtask test`: one minute of load with a row every
/// 10 s, the scale-out at 6 s and the Redis restart at 30 s; with the lab's setup and the drain
/// after, about 70 s.
const SHORT_SOAK: &[&str] = &["--minutes", "1", "--interval-secs", "10"];

/// Builds the eBPF object, the release observer and lab, and runs `openim-lab soak ARGS`: the
/// observer under a soak is the optimised one operators run.
///
/// # Errors
///
/// Fails when redis-server is missing and cannot be installed, a build fails, or the soak fails.
pub fn soak(toolchain: &Toolchain, args: &[OsString]) -> Result<()> {
    apt::ensure("redis-server", "redis-server")?;
    build_ebpf(toolchain)?;
    step(
        "building the observer and the lab (release)",
        host_cargo("build").args(["--release", "--package", "observer", "--package", "tests"]),
    )?;
    run("release", args.iter().map(OsString::as_os_str))
}

/// Runs the short soak of `cargo xtask test`, once its tests passed, with the debug observer and
/// lab `cargo test` built (the eBPF object and redis-server are in place by then).
///
/// # Errors
///
/// Fails when the build or the soak fails.
pub fn short_soak() -> Result<()> {
    step(
        "building the observer and the lab",
        host_cargo("build").args(["--package", "observer", "--package", "tests"]),
    )?;
    eprintln!(
        "xtask: short soak (openim-lab soak {})",
        SHORT_SOAK.join(" ")
    );
    run("debug", SHORT_SOAK.iter().map(std::ffi::OsStr::new))
}

/// Runs `target/<profile>/openim-lab soak` with that profile's observer and `args`.
fn run<'a>(profile: &str, args: impl Iterator<Item = &'a std::ffi::OsStr>) -> Result<()> {
    let root = workspace_root();
    let target = root.join("target").join(profile);
    status(
        Command::new(target.join("openim-lab"))
            .current_dir(&root)
            .arg("soak")
            .arg("--observer")
            .arg(target.join("observer"))
            .args(args),
    )
    .context("the soak failed")
}
