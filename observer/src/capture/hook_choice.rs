//! Chooses, for `--capture-hook`, which programs copy the watched bytes. `auto` takes the packet
//! hook wherever the node allows it, since then no syscall on the node pays for the observer, and
//! says why not where it falls back to the syscall hook.

use std::{fs::File, path::Path};

use super::{
    cgroup_scope::{self, NoHierarchyRoot, ScopeError},
    error::CaptureError,
    host::Capabilities,
    programs::CaptureHook,
};

/// Says what `--capture-hook` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HookChoice {
    /// `packets` where this process holds CAP_NET_ADMIN and --cgroup-root is the root of the
    /// node's cgroup v2 hierarchy (or holds it at `unified`, as a hybrid host does), or holds
    /// none (a cgroup v1 node) and CAP_SYS_ADMIN lets it mount the hierarchy privately; else
    /// `syscalls`. `observer_started` says which, and why.
    Auto,
    /// Tracepoints of the read and write syscalls: works everywhere the observer does; every
    /// read and write on the node pays a little, a watched one the copy.
    Syscalls,
    /// `cgroup_skb` programs on the packets of watched connections: no syscall pays anything.
    /// Needs CAP_NET_ADMIN and a cgroup v2 hierarchy at --cgroup-root (or at its `unified`),
    /// or CAP_SYS_ADMIN to mount one privately; refuses to start without.
    Packets,
}

/// Records the hook chosen, where its programs attach, and why.
#[derive(Debug)]
pub(super) struct ChosenHook {
    pub hook: CaptureHook,
    /// The cgroup the packet programs attach at; `None` with the syscall hook.
    pub cgroup_root: Option<File>,
    /// For `observer_started` and the log: the flag, or what `auto` found.
    pub reason: String,
}

/// Chooses the hook `choice` asks for, and where its programs attach.
///
/// # Errors
///
/// Fails with [`CaptureError::Scope`] ([`ScopeError::RootUnusable`]) when `packets` is asked for
/// and `cgroup_root` holds no cgroup v2 hierarchy, nor can one be mounted privately.
pub(super) fn choose(
    choice: HookChoice,
    cgroup_root: &Path,
    capabilities: Capabilities,
) -> Result<ChosenHook, CaptureError> {
    Ok(match choice {
        HookChoice::Syscalls => ChosenHook {
            hook: CaptureHook::Syscalls,
            cgroup_root: None,
            reason: "--capture-hook syscalls".to_owned(),
        },
        HookChoice::Packets => match cgroup_scope::open_hierarchy(cgroup_root) {
            Ok((path, directory)) => ChosenHook {
                hook: CaptureHook::Packets,
                cgroup_root: Some(directory),
                reason: format!("--capture-hook packets, attached at {}", path.display()),
            },
            Err(reason) => {
                let directory = private_hierarchy(capabilities).map_err(|failure| {
                    ScopeError::RootUnusable {
                        path: cgroup_root.to_owned(),
                        reason: format!("{reason}; {failure}"),
                    }
                })?;
                ChosenHook {
                    hook: CaptureHook::Packets,
                    cgroup_root: Some(directory),
                    reason: format!(
                        "--capture-hook packets, attached at the root of the cgroup v2 hierarchy, \
                        mounted privately ({} holds none)",
                        cgroup_root.display()
                    ),
                }
            }
        },
        HookChoice::Auto => choose_automatically(cgroup_root, capabilities),
    })
}

/// Chooses the syscall hook after the kernel refused the packet hook that `auto` chose.
pub(super) fn after_packet_hook_refusal(refusal: &CaptureError) -> ChosenHook {
    ChosenHook {
        hook: CaptureHook::Syscalls,
        cgroup_root: None,
        reason: format!("auto: the packet hook failed here ({refusal})"),
    }
}

fn choose_automatically(cgroup_root: &Path, capabilities: Capabilities) -> ChosenHook {
    let syscalls = |why: String| ChosenHook {
        hook: CaptureHook::Syscalls,
        cgroup_root: None,
        reason: format!("auto: {why}"),
    };
    let packets = |directory: File, why: String| ChosenHook {
        hook: CaptureHook::Packets,
        cgroup_root: Some(directory),
        reason: format!("auto: CAP_NET_ADMIN held and {why}"),
    };
    if !capabilities.may_attach_network_programs() {
        return syscalls("no CAP_NET_ADMIN, which the packet hook's cgroup programs need".into());
    }
    match cgroup_scope::find_hierarchy_root(cgroup_root) {
        Ok((path, directory)) => packets(
            directory,
            format!("{} is the root of a cgroup v2 hierarchy", path.display()),
        ),
        Err(NoHierarchyRoot::NotCgroup2(why)) => match private_hierarchy(capabilities) {
            Ok(directory) => packets(
                directory,
                format!(
                    "--cgroup-root {} holds no cgroup v2 hierarchy, as on a cgroup v1 node, so \
                    attached at the root of one mounted privately",
                    cgroup_root.display()
                ),
            ),
            Err(failure) => syscalls(format!("--cgroup-root {why}; {failure}")),
        },
        Err(NoHierarchyRoot::BelowRoot(why)) => syscalls(format!("--cgroup-root {why}")),
    }
}

/// Opens the node's cgroup v2 hierarchy where `--cgroup-root` holds none (a node whose cgroups
/// are all v1), through a mount of this process's own; or says why not.
fn private_hierarchy(capabilities: Capabilities) -> Result<File, String> {
    if !capabilities.may_mount() {
        return Err("mounting one privately needs CAP_SYS_ADMIN".to_owned());
    }
    cgroup_scope::mount_private_hierarchy()
        .map_err(|failure| format!("mounting one privately failed ({failure})"))
}

#[cfg(test)]
mod tests;
