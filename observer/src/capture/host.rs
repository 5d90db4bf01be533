//! Checks what the host must offer before the programs load: the privileges to load them, tracefs
//! to attach them, and (before Linux 5.11) a memlock limit their maps fit in.

use std::path::Path;

use aya::util::KernelVersion;

use super::{error::CaptureError, programs::CaptureHook};

/// Names the directory tracefs is read from (and mounted at when it is missing).
pub(super) const TRACEFS: &str = "/sys/kernel/tracing";

/// Numbers the capability bits, from linux/capability.h.
const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Holds this process's effective capabilities (`CapEff` in /proc/self/status).
#[derive(Clone, Copy, Debug)]
pub(super) struct Capabilities(u64);

impl Capabilities {
    /// Reads this process's effective capabilities; none where /proc/self/status does not say.
    pub(super) fn effective() -> Self {
        let effective = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|status| {
                status.lines().find_map(|line| {
                    line.strip_prefix("CapEff:")
                        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
                })
            })
            .unwrap_or(0);
        Self(effective)
    }

    fn has(self, cap: u32) -> bool {
        self.0 & (1u64 << cap) != 0
    }

    /// Says whether the kernel lets this process load and attach network program types, the packet
    /// hook's `cgroup_skb` ones: CAP_NET_ADMIN or CAP_SYS_ADMIN.
    pub(super) fn may_attach_network_programs(self) -> bool {
        self.has(CAP_NET_ADMIN) || self.has(CAP_SYS_ADMIN)
    }

    /// Says whether this process may mount a filesystem (a cgroup v2 hierarchy of its own).
    pub(super) fn may_mount(self) -> bool {
        self.has(CAP_SYS_ADMIN)
    }
}

#[cfg(test)]
impl Capabilities {
    /// Holds what the DaemonSet grants the observer, for the choices that depend on it.
    pub(super) const DAEMONSET: Self = Self(1 << CAP_BPF | 1 << CAP_PERFMON | 1 << CAP_NET_ADMIN);
    pub(super) const NONE: Self = Self(0);
}

/// Checks that this process holds the capabilities the programs of `hook` need: CAP_BPF and
/// CAP_PERFMON (or CAP_SYS_ADMIN), and for the packet hook's cgroup programs CAP_NET_ADMIN too (the
/// kernel loads network program types only for it or CAP_SYS_ADMIN).
///
/// # Errors
///
/// Fails with [`CaptureError::MissingPrivileges`], naming those missing, unless CAP_SYS_ADMIN or
/// all of them are held.
pub(super) fn check_privileges(
    capabilities: Capabilities,
    hook: CaptureHook,
) -> Result<(), CaptureError> {
    let mut needed = vec![(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")];
    if hook == CaptureHook::Packets {
        needed.push((CAP_NET_ADMIN, "CAP_NET_ADMIN"));
    }
    if capabilities.has(CAP_SYS_ADMIN) || needed.iter().all(|(cap, _)| capabilities.has(*cap)) {
        return Ok(());
    }
    let missing: Vec<&str> = needed
        .into_iter()
        .filter(|(cap, _)| !capabilities.has(*cap))
        .map(|(_, name)| name)
        .collect();
    Err(CaptureError::MissingPrivileges {
        missing: missing.join(", "),
    })
}

/// Mounts tracefs at `TRACEFS` unless it is there: tracepoint attachment reads ids from it.
/// Hosts and containers often have it unmounted; as root we can mount it ourselves.
///
/// # Errors
///
/// Fails with [`CaptureError::TracefsUnavailable`] when tracefs is not mounted and `mount` fails or
/// cannot run.
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
            path: TRACEFS,
            reason: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        }),
        Err(err) => Err(CaptureError::TracefsUnavailable {
            path: TRACEFS,
            reason: err.to_string(),
        }),
    }
}

/// Lifts RLIMIT_MEMLOCK: kernels before 5.11 charge BPF maps and programs to RLIMIT_MEMLOCK, whose
/// default is far too small for the ring buffer; newer ones ignore it. Returns the limit, in bytes,
/// where it stays in the way: it could not be lifted (no CAP_SYS_RESOURCE) on a kernel that charges
/// it (an unreadable kernel version is taken for a newer one, which needs nothing).
pub(super) fn raise_memlock_limit() -> Option<u64> {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads the struct we pass and nothing else.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) } == 0 {
        return None;
    }
    let mut limit = unlimited;
    // SAFETY: getrlimit writes the struct we pass and nothing else.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } == 0;
    let charged =
        KernelVersion::current().is_ok_and(|version| version < KernelVersion::new(5, 11, 0));
    tracing::debug!("could not raise RLIMIT_MEMLOCK; needed before Linux 5.11: {charged}");
    (read && limit.rlim_cur != libc::RLIM_INFINITY && charged).then_some(limit.rlim_cur)
}
