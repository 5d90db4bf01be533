//! Installs the lab's Go and Python client stacks (tests/src/lab/stack.rs), which the client-matrix
//! tests run: Go and Debian's grpc-go and gorilla/websocket sources (GOPATH mode), and a virtualenv
//! with the pinned grpcio and websockets. Installed once; later runs find them.

use std::path::Path;

use anyhow::{Context, Result};

use crate::{apt, venv, workspace_root};

/// Names where Debian's `golang-*-dev` packages put their sources, and the package of each source
/// the Go stack imports.
const DEBIAN_GOPATH_SRC: &str = "/usr/share/gocode/src";
const GO_SOURCES: [(&str, &str); 2] = [
    ("google.golang.org/grpc", "golang-google-grpc-dev"),
    (
        "github.com/gorilla/websocket",
        "golang-github-gorilla-websocket-dev",
    ),
];
/// Names the same paths as `PYTHON_VENV` and `PYTHON_REQUIREMENTS` in tests/src/lab/stack.rs.
const PYTHON_VENV: &str = "target/tools/python-clients";
const PYTHON_REQUIREMENTS: &str = "tests/clients/python/requirements.txt";

/// Installs Go with the grpc-go and gorilla/websocket sources, and the Python virtualenv, unless
/// they are in place.
///
/// # Errors
///
/// Fails when apt cannot install a missing package, or the requirements cannot be read, the
/// virtualenv made or its copy of the requirements written.
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

/// Ensures the virtualenv, made anew when the requirements changed since it was made (a copy of
/// them inside it says which it holds).
fn ensure_python() -> Result<()> {
    let root = workspace_root();
    let venv = root.join(PYTHON_VENV);
    let requirements = std::fs::read_to_string(root.join(PYTHON_REQUIREMENTS))
        .with_context(|| format!("read {PYTHON_REQUIREMENTS}"))?;
    let installed = venv.join("requirements.txt");
    if std::fs::read_to_string(&installed).is_ok_and(|held| held == requirements) {
        return Ok(());
    }
    let requirements_path = root.join(PYTHON_REQUIREMENTS);
    venv::create(
        &venv,
        "the Python client stack",
        &["-r".as_ref(), requirements_path.as_os_str()],
    )?;
    std::fs::write(&installed, requirements)
        .with_context(|| format!("write {}", installed.display()))
}
