//! What the host must offer before the programs load: the privileges to load them, tracefs
//! to attach them, and (before Linux 5.11) a memlock limit their maps fit in.

use std::path::Path;

use super::kernel::{CaptureError, CaptureHook};

pub(super) const TRACEFS: &str = "/sys/kernel/tracing";

/// Capabilities from /proc/self/status (`CapEff`); bit numbers from linux/capability.h.
/// The capabilities the programs of `hook` need: CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN),
/// and for the packet hook's cgroup programs CAP_NET_ADMIN too (the kernel loads network
/// program types only for it or CAP_SYS_ADMIN).
pub(super) fn check_privileges(hook: CaptureHook) -> Result<(), CaptureError> {
    const CAP_NET_ADMIN: u32 = 12;
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let effective = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                line.strip_prefix("CapEff:")
                    .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            })
        })
        .unwrap_or(0);
    let has = |cap: u32| effective & (1u64 << cap) != 0;
    let mut needed = vec![(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")];
    if hook == CaptureHook::Packets {
        needed.push((CAP_NET_ADMIN, "CAP_NET_ADMIN"));
    }
    if has(CAP_SYS_ADMIN) || needed.iter().all(|(cap, _)| has(*cap)) {
        return Ok(());
    }
    let missing: Vec<&str> = needed
        .into_iter()
        .filter(|(cap, _)| !has(*cap))
        .map(|(_, name)| name)
        .collect();
    Err(CaptureError::MissingPrivileges {
        missing: missing.join(", "),
    })
}

/// Tracepoint attachment reads ids from tracefs. Hosts and containers often have it
/// unmounted; as root we can mount it ourselves.
pub(super) fn ensure_tracefs() -> Result<(), CaptureError> {
    if Path::new(TRACEFS).join("events").is_dir() {
        return Ok(());
    }
    let status = std::process::Command::new("mount")
        .args(["-t", "tracefs", "tracefs", TRACEFS])
        .stderr(std::process::Stdio::piped())
        .output();
    match status {
        Ok(output) if output.status.success() => Ok(()),
        Ok(output) => Err(CaptureError::TracefsUnavailable {
            reason: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        }),
        Err(err) => Err(CaptureError::TracefsUnavailable {
            reason: err.to_string(),
        }),
    }
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK, whose default is far too small for
/// the ring buffer. Newer kernels ignore it, so a failure here is not an error.
pub(super) fn raise_memlock_limit() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads the struct we pass and nothing else.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) } != 0 {
        tracing::debug!("could not raise RLIMIT_MEMLOCK; fine on Linux 5.11+");
    }
}
