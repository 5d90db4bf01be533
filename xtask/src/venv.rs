//! Makes Python virtualenvs for the tools xtask installs from PyPI (kubectl, the Python client
//! stack).

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};

use crate::{apt, step};

/// Makes a fresh virtualenv at `venv` and runs `pip install PIP_ARGS…` in it; `purpose` names
/// what it is for in progress lines and errors.
///
/// # Errors
///
/// Fails when python3-venv is missing and cannot be installed, or `python3 -m venv` or
/// `pip install` fails.
pub fn create(venv: &Path, purpose: &str, pip_args: &[&OsStr]) -> Result<()> {
    let how = format!("{purpose} needs python3 with venv and access to PyPI");
    // Debian splits venv's pip bootstrap into python3-venv (which pulls in python3).
    let has_venv = Command::new("python3")
        .args(["-c", "import ensurepip, venv"])
        .output()
        .is_ok_and(|output| output.status.success());
    if !has_venv {
        apt::install("python3-venv").context(how.clone())?;
    }
    step(
        &format!("creating a virtualenv for {purpose} (python3 -m venv)"),
        Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(venv),
    )
    .context(how.clone())?;
    step(
        &format!("installing {purpose} (pip install {})", join(pip_args)),
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .args(pip_args),
    )
    .context(how)
}

fn join(args: &[&OsStr]) -> String {
    args.iter()
        .map(|arg| arg.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}
