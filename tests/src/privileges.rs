//! Says whether a privileged test can run: the lab and end-to-end tests need root (network
//! namespaces; the observer loads eBPF programs), the cluster tests a `redis-server`. On a normal
//! user's plain `cargo test` they skip and say why; under `cargo xtask test`, which sets
//! `OBSERVER_REQUIRE_EBPF` and installs redis-server, they fail instead, so CI never skips them
//! silently. The client-matrix tests also need their stack's toolchain (Go, or the Python
//! virtualenv), which `cargo xtask setup` and `cargo xtask test` install.

use openim_test_kit::privileges::{programs_missing, skip};

use crate::lab::stack::ClientStack;

/// Names what a privileged test needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    /// Root: the lab's network namespaces.
    Root,
    /// Root and an observer built with its eBPF programs, which it loads.
    RootAndPrograms,
    /// A `redis-server` binary (cluster mode's store; no root needed).
    RedisServer,
}

/// Says whether the calling test can run here. When it cannot, it says so on stderr (written past
/// the test harness's capture, so a passing run shows it) and the test should return early; with
/// `OBSERVER_REQUIRE_EBPF` set it panics with the reason instead.
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
    } else if needs == Needs::RootAndPrograms
        && let Some(reason) = programs_missing()
    {
        reason.to_owned()
    } else {
        return true;
    };
    skip(&reason)
}

/// Says whether a client-matrix test of `stack` can run here: root, the observer's programs and the
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
