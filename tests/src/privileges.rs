//! The lab and end-to-end tests need root (network namespaces; the observer loads eBPF
//! programs), the cluster tests a `redis-server`. On a normal user's plain `cargo test` they skip
//! and say why; under `cargo xtask test`, which sets `OBSERVER_REQUIRE_EBPF` and installs
//! redis-server, they fail instead, so CI never skips them silently. The client-matrix tests
//! also need their stack's toolchain (Go, or the Python virtualenv), which `cargo xtask setup`
//! and `cargo xtask test` install.

use std::io::Write;

use crate::lab::stack::ClientStack;

/// What a privileged test needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    /// Root: the lab's network namespaces.
    Root,
    /// Root and an observer built with its eBPF programs, which it loads.
    RootAndPrograms,
    /// A `redis-server` binary (cluster mode's store; no root needed).
    RedisServer,
}

/// Whether the calling test can run here. When it cannot, it says so on stderr (written past
/// the test harness's capture, so a passing run shows it) and the test should return early;
/// with `OBSERVER_REQUIRE_EBPF` set it panics with the reason instead.
pub fn can_run(needs: Needs) -> bool {
    let reason = if needs == Needs::RedisServer {
        let installed = std::process::Command::new("redis-server")
            .arg("--version")
            .output()
            .is_ok_and(|output| output.status.success());
        if installed {
            return true;
        }
        "no redis-server (Debian: apt-get install redis-server)".to_owned()
    } else if let Err(error) = crate::lab::netns::require_root() {
        error.to_string()
    } else if needs == Needs::RootAndPrograms && !observer::capture::kernel::PROGRAMS_EMBEDDED {
        "the observer was built without its eBPF programs (build with `cargo xtask build`)".into()
    } else {
        return true;
    };
    skip(&reason)
}

/// Whether a client-matrix test of `stack` can run here: root, the observer's programs and the
/// stack's toolchain (see [`ClientStack::unavailable`]); skips or panics like [`can_run`].
pub fn can_run_stack(stack: ClientStack) -> bool {
    if !can_run(Needs::RootAndPrograms) {
        return false;
    }
    match stack.unavailable() {
        Some(reason) => skip(&reason),
        None => true,
    }
}

/// Says why the calling test cannot run and returns false, or panics under
/// `OBSERVER_REQUIRE_EBPF`.
fn skip(reason: &str) -> bool {
    let test = caller_name();
    if std::env::var_os("OBSERVER_REQUIRE_EBPF").is_some() {
        panic!("{test} cannot run: {reason} (OBSERVER_REQUIRE_EBPF is set)");
    }
    let _ = writeln!(std::io::stderr(), "skipped {test}: {reason}");
    false
}

/// Who is skipped: a test's thread bears the test's name; a harness-less bench runs on `main`,
/// so it is named after its executable, without the hash cargo appends (`cluster-<16 hex>`).
fn caller_name() -> String {
    if let Some(name) = std::thread::current().name().filter(|name| *name != "main") {
        return name.to_owned();
    }
    let executable = std::env::current_exe().ok();
    let stem = executable
        .as_deref()
        .and_then(std::path::Path::file_stem)
        .and_then(|stem| stem.to_str())
        .unwrap_or("test");
    match stem.rsplit_once('-') {
        Some((name, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            name.to_owned()
        }
        _ => stem.to_owned(),
    }
}
