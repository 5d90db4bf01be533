use super::*;

#[test]
fn without_cap_net_admin_auto_takes_the_syscall_hook_and_says_why() {
    let chosen = choose_automatically(Path::new("/sys/fs/cgroup"), Capabilities::NONE);
    assert_eq!(chosen.hook, CaptureHook::Syscalls);
    assert!(chosen.cgroup_root.is_none());
    assert_eq!(
        chosen.reason,
        "auto: no CAP_NET_ADMIN, which the packet hook's cgroup programs need"
    );
}

/// What the DaemonSet grants does not let `auto` mount a hierarchy of its own.
#[test]
fn without_a_cgroup2_root_or_cap_sys_admin_auto_takes_the_syscall_hook_and_says_why() {
    // Neither the directory nor its `unified` (here a plain directory) is cgroup v2.
    let plain = tempfile::tempdir().unwrap();
    std::fs::create_dir(plain.path().join("unified")).unwrap();
    let chosen = choose_automatically(plain.path(), Capabilities::DAEMONSET);
    assert_eq!(chosen.hook, CaptureHook::Syscalls);
    assert_eq!(
        chosen.reason,
        format!(
            "auto: --cgroup-root {}: not a cgroup v2 directory (mount one with `mount -t cgroup2 \
            none DIR`); mounting one privately needs CAP_SYS_ADMIN",
            plain.path().display()
        )
    );
}

/// A node whose cgroups are all v1: as root, `auto` reaches the hierarchy's root through a
/// mount of its own. Skipped without root.
#[test]
fn without_a_cgroup2_root_auto_as_root_mounts_one_privately() {
    // SAFETY: geteuid(2) has no failure mode.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    let plain = tempfile::tempdir().unwrap();
    let chosen = choose_automatically(plain.path(), Capabilities::effective());
    assert_eq!(chosen.hook, CaptureHook::Packets);
    assert!(chosen.cgroup_root.is_some());
    assert_eq!(
        chosen.reason,
        format!(
            "auto: CAP_NET_ADMIN held and --cgroup-root {} holds no cgroup v2 hierarchy, as on a \
            cgroup v1 node, so attached at the root of one mounted privately",
            plain.path().display()
        )
    );
}

#[test]
fn asked_for_syscalls_needs_no_cgroup_root() {
    let chosen = choose(
        HookChoice::Syscalls,
        Path::new("/nonexistent"),
        Capabilities::effective(),
    )
    .unwrap();
    assert_eq!(chosen.hook, CaptureHook::Syscalls);
    assert_eq!(chosen.reason, "--capture-hook syscalls");
}

#[test]
fn asked_for_packets_without_a_cgroup2_hierarchy_or_cap_sys_admin_refuses_in_one_line() {
    let plain = tempfile::tempdir().unwrap();
    std::fs::create_dir(plain.path().join("unified")).unwrap();
    let refusal = choose(HookChoice::Packets, plain.path(), Capabilities::DAEMONSET)
        .unwrap_err()
        .to_string();
    assert_eq!(
        refusal,
        format!(
            "--cgroup-root {}: not a cgroup v2 directory (mount one with `mount -t cgroup2 none \
            DIR`); mounting one privately needs CAP_SYS_ADMIN",
            plain.path().display()
        )
    );
}

/// As root, `packets` mounts a hierarchy of its own where `--cgroup-root` holds none.
/// Skipped without root.
#[test]
fn asked_for_packets_without_a_cgroup2_hierarchy_as_root_mounts_one_privately() {
    // SAFETY: geteuid(2) has no failure mode.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    let plain = tempfile::tempdir().unwrap();
    let chosen = choose(HookChoice::Packets, plain.path(), Capabilities::effective()).unwrap();
    assert_eq!(chosen.hook, CaptureHook::Packets);
    assert_eq!(
        chosen.reason,
        format!(
            "--capture-hook packets, attached at the root of the cgroup v2 hierarchy, mounted \
            privately ({} holds none)",
            plain.path().display()
        )
    );
}

/// On a hybrid layout (a directory that is not cgroup v2, with the hierarchy at `unified`),
/// `packets` attaches at `unified`, as `auto` would, and says so. Needs root to mount;
/// skipped without.
#[test]
fn asked_for_packets_on_a_hybrid_layout_attaches_at_unified() {
    let Some(layout) = cgroup_scope::HybridLayout::mount() else {
        return;
    };
    let chosen = choose(
        HookChoice::Packets,
        layout.host(),
        Capabilities::effective(),
    )
    .unwrap();
    assert_eq!(chosen.hook, CaptureHook::Packets);
    assert!(chosen.cgroup_root.is_some());
    assert_eq!(
        chosen.reason,
        format!(
            "--capture-hook packets, attached at {}",
            layout.unified().display()
        )
    );
}
