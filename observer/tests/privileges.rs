//! An observer short of privileges: without its capabilities, or under a locked-memory limit it
//! may not lift, it stops in one line that says what is missing.
//!
//! Each test starts the real `observer` binary (which loads and attaches the eBPF programs),
//! makes real loopback connections, and checks what comes out. They need root and an observer
//! built with its programs: without them they skip and say why, except under `cargo xtask test`
//! (`OBSERVER_REQUIRE_EBPF`), where they fail. They share kernel state (attached programs), so
//! they take `serial()` and run one at a time; each asks `free_port()` for its ports. The
//! harness is in the test kit (`openim_test_kit::{observer_process, captured, privileges}`).

use std::process::Command;

use openim_test_kit::{
    captured::{kernel_version, serial},
    privileges::can_run,
};

const OBSERVER: &str = env!("CARGO_BIN_EXE_observer");

#[test]
fn without_privileges_the_error_is_one_line_with_exit_code_two() {
    if !can_run() {
        return;
    }
    // A capture from an earlier run: the failed start must not truncate it.
    let dir = tempfile::tempdir().unwrap();
    let recording = dir.path().join("cap.jsonl");
    std::fs::write(&recording, "earlier capture\n").unwrap();
    // Root, but with every capability dropped: what an unprivileged container looks like.
    let output = Command::new("setpriv")
        .args([
            "--inh-caps=-all",
            "--ambient-caps=-all",
            "--bounding-set=-all",
            "--",
            OBSERVER,
            "run",
            "--duration",
            "1",
            "--record",
            recording.to_str().expect("UTF-8 temp path"),
            "--overwrite",
        ])
        .output()
        .expect("setpriv (util-linux)");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("CAP_BPF"), "{stderr}");
    assert_eq!(std::fs::read(&recording).unwrap(), b"earlier capture\n");
}

/// Before Linux 5.11 the kernel checks BPF memory against RLIMIT_MEMLOCK: an observer that may
/// not lift a small limit (no CAP_SYS_RESOURCE, as in a pod without it) says so and how to fix
/// it, in one line, rather than that the kernel has no ring buffer. Newer kernels ignore the
/// limit, and the same observer starts.
#[test]
fn a_memlock_limit_it_cannot_lift_is_named_before_linux_5_11_and_harmless_after() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    let output = Command::new("setpriv")
        .args([
            "--inh-caps=-sys_resource",
            "--bounding-set=-sys_resource",
            "--",
            "prlimit",
            "--memlock=65536:65536",
            OBSERVER,
            "run",
            "--duration",
            "1",
        ])
        .output()
        .expect("setpriv and prlimit (util-linux)");
    let stderr = String::from_utf8_lossy(&output.stderr);
    if kernel_version() < (5, 11) {
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains("Operation not permitted")
                && stderr.contains("charges BPF memory to RLIMIT_MEMLOCK, 64 KiB here")
                && stderr.contains("without CAP_SYS_RESOURCE"),
            "{stderr}"
        );
    } else {
        assert_eq!(output.status.code(), Some(0), "{stderr}");
        assert!(
            String::from_utf8_lossy(&output.stdout).contains("\"observer_started\""),
            "{stderr}"
        );
    }
}
