//! Names the client stacks: which libraries make push's gRPC calls and the users' WebSocket
//! connections, and over which socket family. The lab's own stack is Rust (tonic,
//! tokio-tungstenite); the Go stack (`tests/clients/go`: grpc-go and gorilla/websocket, what OpenIM
//! itself uses) and the Python stack (`tests/clients/python`: grpcio, the gRPC C-core, and
//! websockets) are separate programs the lab drives over JSON lines on their stdin and stdout.
//! Gateways and proxy stay the lab's own.
//!
//! The Go program is built in GOPATH mode against Debian's packages; the Python one runs from
//! the virtualenv `cargo xtask setup` makes under `target/tools`. [`ClientStack::unavailable`]
//! says what is missing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

/// Names where Debian's `golang-*-dev` packages put their sources (GOPATH mode).
pub const DEBIAN_GOPATH: &str = "/usr/share/gocode";
/// Lists the Debian packages the Go stack builds against, besides `golang-go`.
pub const GO_PACKAGES: [&str; 3] = [
    "golang-go",
    "golang-google-grpc-dev",
    "golang-github-gorilla-websocket-dev",
];
/// Names the Python stack's virtualenv, relative to the workspace (made by `cargo xtask setup`, see
/// xtask/src/client_stacks.rs).
pub const PYTHON_VENV: &str = "target/tools/python-clients";
/// Names the Python stack's pinned packages, relative to the workspace.
pub const PYTHON_REQUIREMENTS: &str = "tests/clients/python/requirements.txt";

/// Names the libraries behind the lab's clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClientStack {
    /// tonic and tokio-tungstenite, in the lab's own processes.
    Rust,
    /// grpc-go and gorilla/websocket.
    Go,
    /// grpcio (gRPC C-core) and websockets.
    Python,
}

/// Names the sockets the clients connect from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AddressFamily {
    /// AF_INET sockets to the pods' IPv4 addresses.
    Ipv4,
    /// AF_INET6 sockets to the pods' IPv4-mapped addresses (`::ffff:10.244.X.Y`).
    DualStack,
}

impl AddressFamily {
    /// Returns the family as `--family` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ipv4 => "ipv4",
            Self::DualStack => "dual-stack",
        }
    }
}

/// Holds a client program and its arguments, for one mode (`push` or `users`).
#[derive(Clone, Debug)]
pub struct ClientProgram {
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl ClientProgram {
    /// Returns a command that runs the program with its arguments.
    pub fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.args);
        command
    }
}

impl ClientStack {
    /// Returns the stack's name: `rust`, `go` or `python`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rust => "rust",
            Self::Go => "go",
            Self::Python => "python",
        }
    }

    /// Says why this machine cannot run the stack, if it cannot.
    pub fn unavailable(self) -> Option<String> {
        match self {
            Self::Rust => None,
            Self::Go => go_binary().err(),
            Self::Python => python().err(),
        }
    }

    /// Returns the external program for `mode` (`push` or `users`); `None` for the lab's own stack.
    ///
    /// # Errors
    ///
    /// Fails when the Go stack's binary cannot be built, or the Python stack's interpreter lacks
    /// its packages.
    pub fn program(
        self,
        mode: &str,
        family: AddressFamily,
    ) -> anyhow::Result<Option<ClientProgram>> {
        let mode_args = [mode.to_owned(), "--family".into(), family.as_str().into()];
        match self {
            Self::Rust => Ok(None),
            Self::Go => Ok(Some(ClientProgram {
                program: go_binary().map_err(anyhow::Error::msg)?,
                args: mode_args.to_vec(),
            })),
            Self::Python => {
                let script = workspace_root().join("tests/clients/python/lab_clients.py");
                let mut args = vec![script.to_string_lossy().into_owned()];
                args.extend(mode_args);
                Ok(Some(ClientProgram {
                    program: python().map_err(anyhow::Error::msg)?,
                    args,
                }))
            }
        }
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Builds the Go stack's binary, once per process (go's own cache makes rebuilds quick).
fn go_binary() -> Result<PathBuf, String> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| build_go().map_err(|error| format!("{error:#}")))
        .clone()
}

fn build_go() -> anyhow::Result<PathBuf> {
    let how = format!(
        "the Go client stack needs Go and Debian's Go packages (apt-get install {}; \
         cargo xtask setup installs them)",
        GO_PACKAGES.join(" ")
    );
    let gopath = Path::new(DEBIAN_GOPATH);
    let has_sources = ["google.golang.org/grpc", "github.com/gorilla/websocket"]
        .iter()
        .all(|package| gopath.join("src").join(package).is_dir());
    if !has_sources {
        bail!("{how}");
    }
    let tools = workspace_root().join("target/tools");
    let binary = tools.join("go-clients/openim-lab-go");
    let output = Command::new("go")
        .args(["build", "-o"])
        .arg(&binary)
        .arg(".")
        .current_dir(workspace_root().join("tests/clients/go"))
        .env("GOPATH", gopath)
        .env("GO111MODULE", "off")
        .env("GOCACHE", tools.join("go-cache"))
        .output()
        .with_context(|| how.clone())?;
    if !output.status.success() {
        bail!(
            "go build tests/clients/go failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(binary)
}

/// Finds the Python stack's interpreter: `$OPENIM_LAB_PYTHON`, else the project's virtualenv, as
/// long as it has grpcio and websockets.
fn python() -> Result<PathBuf, String> {
    let python = std::env::var_os("OPENIM_LAB_PYTHON").map_or_else(
        || workspace_root().join(PYTHON_VENV).join("bin/python"),
        PathBuf::from,
    );
    let importable = Command::new(&python)
        .args(["-c", "import grpc, websockets"])
        .output()
        .is_ok_and(|output| output.status.success());
    if importable {
        Ok(python)
    } else {
        Err(format!(
            "no Python with grpcio and websockets at {} (cargo xtask setup makes it: python3 -m \
             venv {PYTHON_VENV} && {PYTHON_VENV}/bin/pip install -r {PYTHON_REQUIREMENTS})",
            python.display()
        ))
    }
}
