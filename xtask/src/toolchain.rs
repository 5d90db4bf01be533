//! Finds and installs the nightly that builds the eBPF programs. Its one pin is
//! `observer-ebpf/rust-toolchain.toml`; xtask (and CI through it) and deploy/Dockerfile all read
//! the channel from there.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{capture, status, workspace_root};

/// Names where the pin lives, relative to the workspace root.
pub const TOOLCHAIN_FILE: &str = "observer-ebpf/rust-toolchain.toml";

/// Returns the pinned channel, e.g. `nightly-2026-05-20`: the name to pass as `cargo +<pin>`.
///
/// # Errors
///
/// Fails when the toolchain file cannot be read or names no `channel`.
pub fn pinned_nightly() -> Result<String> {
    let path = workspace_root().join(TOOLCHAIN_FILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    channel(&text).with_context(|| format!("{} names no `channel = \"…\"`", path.display()))
}

/// Makes sure the pinned nightly is installed, with rust-src, and returns its name.
///
/// In order: the pinned toolchain itself; else the floating `nightly` when it is the same build
/// (its commit-date is the day before the pin's date), registered under the pin's name, so
/// machines without a route to the toolchain servers work; else `rustup toolchain install`.
///
/// # Errors
///
/// Fails when the pin cannot be read, or registering or installing the toolchain, finding its
/// sysroot or adding rust-src to it fails.
pub fn install_pinned_nightly() -> Result<String> {
    let pin = pinned_nightly()?;
    if !is_installed(&pin) {
        match floating_nightly_matching(&pin) {
            Some(sysroot) => register(&pin, &sysroot)?,
            None => install(&pin)?,
        }
    }
    let sysroot = sysroot(&pin)?;
    if !has_rust_src(&sysroot) {
        eprintln!("xtask: adding rust-src to {pin} (needed to build core for BPF)");
        status(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", &pin]))
            .with_context(|| format!("`rustup component add rust-src --toolchain {pin}` failed"))?;
    }
    Ok(pin)
}

/// Returns the value of the first `channel = "…"` line.
fn channel(toolchain_file: &str) -> Option<String> {
    toolchain_file.lines().find_map(|line| {
        let value = line
            .trim()
            .strip_prefix("channel")?
            .trim_start()
            .strip_prefix('=')?;
        let value = value.trim().strip_prefix('"')?.strip_suffix('"')?;
        (!value.is_empty()).then(|| value.to_owned())
    })
}

fn rustc(toolchain: &str) -> Command {
    let mut command = Command::new("rustc");
    command
        .arg(format!("+{toolchain}"))
        // Asking about a toolchain must never start a download.
        .env("RUSTUP_AUTO_INSTALL", "0");
    command
}

fn is_installed(toolchain: &str) -> bool {
    rustc(toolchain)
        .arg("-vV")
        .output()
        .is_ok_and(|output| output.status.success())
}

fn sysroot(toolchain: &str) -> Result<PathBuf> {
    let sysroot = capture(rustc(toolchain).args(["--print", "sysroot"]))?;
    Ok(PathBuf::from(sysroot.trim()))
}

fn has_rust_src(sysroot: &Path) -> bool {
    sysroot.join("lib/rustlib/src/rust/library/core").is_dir()
}

/// Returns the floating `nightly`'s sysroot when that toolchain is the pinned build.
fn floating_nightly_matching(pin: &str) -> Option<PathBuf> {
    let pinned_date = pin.strip_prefix("nightly-")?;
    let version = capture(rustc("nightly").arg("-vV")).ok()?;
    let commit_date = version
        .lines()
        .find_map(|line| line.strip_prefix("commit-date:"))?;
    if next_day(commit_date.trim())? != pinned_date {
        return None;
    }
    sysroot("nightly").ok()
}

/// Registers the floating nightly's directory under the pin's name. `rustup toolchain link`
/// refuses names of official channels, but rustup knows a toolchain by nothing more than its
/// directory under `toolchains/`, so a symlink named `<pin>-<host>` is a complete registration.
fn register(pin: &str, nightly_sysroot: &Path) -> Result<()> {
    if !has_rust_src(nightly_sysroot) {
        eprintln!("xtask: adding rust-src to nightly (needed to build core for BPF)");
        status(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))
        .context("`rustup component add rust-src --toolchain nightly` failed")?;
    }
    let version = capture(rustc("nightly").arg("-vV"))?;
    let host = version
        .lines()
        .find_map(|line| line.strip_prefix("host:"))
        .map(str::trim)
        .context("`rustc +nightly -vV` names no host")?;
    let toolchains = nightly_sysroot
        .parent()
        .context("the nightly's sysroot has no parent directory")?;
    let link = toolchains.join(format!("{pin}-{host}"));
    eprintln!(
        "xtask: registering the installed nightly (the same build) as {pin}: {} -> {}",
        link.display(),
        nightly_sysroot.display()
    );
    std::os::unix::fs::symlink(nightly_sysroot, &link)
        .with_context(|| format!("linking {}", link.display()))?;
    if !is_installed(pin) {
        bail!("{} does not make {pin} usable", link.display());
    }
    Ok(())
}

fn install(pin: &str) -> Result<()> {
    eprintln!("xtask: installing {pin}, the nightly pinned in {TOOLCHAIN_FILE}");
    status(Command::new("rustup").args([
        "toolchain",
        "install",
        pin,
        "--profile",
        "minimal",
        "--component",
        "rust-src",
    ]))
    .with_context(|| {
        format!(
            "{pin} (pinned in {TOOLCHAIN_FILE}) is not installed and `rustup toolchain install \
            {pin}` failed"
        )
    })
}

/// Returns the day after `date` (`YYYY-MM-DD`), in the same format.
fn next_day(date: &str) -> Option<String> {
    let mut parts = date.splitn(3, '-').map(str::parse::<u32>);
    let (year, month, day) = (
        parts.next()?.ok()?,
        parts.next()?.ok()?,
        parts.next()?.ok()?,
    );
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return None,
    };
    let (year, month, day) = match (month, day) {
        (_, day) if day == 0 || day > days_in_month => return None,
        (12, 31) => (year + 1, 1, 1),
        (month, day) if day == days_in_month => (year, month + 1, 1),
        (month, day) => (year, month, day + 1),
    };
    Some(format!("{year:04}-{month:02}-{day:02}"))
}

#[cfg(test)]
mod tests;
