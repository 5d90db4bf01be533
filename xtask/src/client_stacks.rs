//! The lab's Go and Python client stacks (tests/src/lab/stack.rs), which the client-matrix tests
//! run: Go and Debian's grpc-go and gorilla/websocket sources (GOPATH mode), and a virtualenv
//! with the pinned grpcio and websockets. Installed once; later runs find them.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};

use crate::{apt, step, workspace_root};

/// Where Debian's `golang-*-dev` packages put their sources, and the package of each source the
/// Go stack imports.
const DEBIAN_GOPATH_SRC: &str = "/usr/share/gocode/src";
const GO_SOURCES: [(&str, &str); 2] = [
    ("google.golang.org/grpc", "golang-google-grpc-dev"),
    (
        "github.com/gorilla/websocket",
        "golang-github-gorilla-websocket-dev",
    ),
];
/// The same paths as `PYTHON_VENV` and `PYTHON_REQUIREMENTS` in tests/src/lab/stack.rs.
const PYTHON_VENV: &str = "target/tools/python-clients";
const PYTHON_REQUIREMENTS: &str = "tests/clients/python/requirements.txt";

pub fn ensure() -> Result<()> {
    ensure_go()?;
    ensure_python()
}

fn ensure_go() -> Result<()> {
    apt::ensure_with("go", "version", "golang-go")?;
    for (source, package) in GO_SOURCES {
        if !Path::new(DEBIAN_GOPATH_SRC).join(source).is_dir() {
            apt::install(package)?;
        }
    }
    Ok(())
}

/// The virtualenv, made anew when the requirements changed since it was made (a copy of them
/// inside it says which it holds).
fn ensure_python() -> Result<()> {
    let root = workspace_root();
    let venv = root.join(PYTHON_VENV);
    let requirements = std::fs::read_to_string(root.join(PYTHON_REQUIREMENTS))
        .with_context(|| format!("read {PYTHON_REQUIREMENTS}"))?;
    let installed = venv.join("requirements.txt");
    if std::fs::read_to_string(&installed).is_ok_and(|held| held == requirements) {
        return Ok(());
    }
    let how = "the Python client stack needs python3 with venv and access to PyPI";
    // Debian splits venv's pip bootstrap into python3-venv (which pulls in python3).
    let has_venv = Command::new("python3")
        .args(["-c", "import ensurepip, venv"])
        .output()
        .is_ok_and(|output| output.status.success());
    if !has_venv {
        apt::install("python3-venv").context(how)?;
    }
    step(
        "creating a virtualenv for the Python client stack (python3 -m venv)",
        Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(&venv),
    )
    .context(how)?;
    step(
        &format!("installing the Python client stack (pip install -r {PYTHON_REQUIREMENTS})"),
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
            .arg(root.join(PYTHON_REQUIREMENTS)),
    )
    .context(how)?;
    std::fs::write(&installed, requirements)
        .with_context(|| format!("write {}", installed.display()))
}
