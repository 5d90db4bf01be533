//! Installs with apt the Debian/Ubuntu packages a task needs, when their program is missing.

use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::{capture, step};

/// Makes sure `program` runs, installing `package` with apt if it does not.
///
/// # Errors
///
/// Fails when `program` does not run and apt cannot install `package` (see [`install`]).
pub fn ensure(program: &str, package: &str) -> Result<()> {
    ensure_with(program, "--version", package)
}

/// Does what [`ensure`] does, for a program that prints its version with `version_arg`
/// (`go version`).
///
/// # Errors
///
/// Fails when `program` does not run and apt cannot install `package` (see [`install`]).
pub fn ensure_with(program: &str, version_arg: &str, package: &str) -> Result<()> {
    let installed = Command::new(program)
        .arg(version_arg)
        .output()
        .is_ok_and(|output| output.status.success());
    if installed {
        return Ok(());
    }
    install(package)
}

/// Runs `apt-get install -y PACKAGE`, refreshing the package lists first when apt does not know it.
///
/// # Errors
///
/// Fails when apt has no candidate for `package`, even after `apt-get update`, or when `apt-cache`,
/// the update or the install fails.
pub fn install(package: &str) -> Result<()> {
    let how =
        format!("{package} is missing: install it (Debian/Ubuntu: `apt-get install -y {package}`)");
    let available = || -> Result<bool> {
        let policy =
            capture(Command::new("apt-cache").args(["policy", package])).context(how.clone())?;
        Ok(policy
            .lines()
            .find_map(|line| line.trim().strip_prefix("Candidate:"))
            .map(str::trim)
            .is_some_and(|version| version != "(none)"))
    };
    if !available()? {
        // A fresh machine's package lists are empty until the first update.
        step(
            "refreshing the package lists (apt-get update)",
            Command::new("apt-get").args(["update", "-qq"]),
        )
        .context(how.clone())?;
        if !available()? {
            bail!("{how}");
        }
    }
    step(
        &format!("installing {package} (apt-get install -y {package})"),
        Command::new("apt-get")
            .args(["install", "-y", "-qq", package])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .context(how)
}
