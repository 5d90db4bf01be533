//! Defines [`CaptureError`], what starting or reading the kernel programs can fail with; every
//! file of `capture` that loads, attaches or checks something returns it.

use thiserror::Error;

use super::{
    cgroup_scope::ScopeError, sock_layout::SockLayoutError, tracepoint_format::LayoutError,
};

/// Says why starting or reading the kernel programs failed.
#[derive(Debug, Error)]
pub enum CaptureError {
    #[error("built without the eBPF programs: build with `cargo xtask build`")]
    BuiltWithoutPrograms,
    #[error(
        "loading eBPF programs needs root or CAP_BPF + CAP_PERFMON (+ CAP_NET_ADMIN for \
        --capture-hook packets) (missing: {missing}); run with sudo or grant them"
    )]
    MissingPrivileges { missing: String },
    #[error(
        "tracefs is not mounted at {path} and mounting it failed ({reason}); mount it with `mount \
        -t tracefs tracefs {path}`"
    )]
    TracefsUnavailable { path: &'static str, reason: String },
    #[error("this kernel has no BPF ring buffer (Linux 5.8 or newer is needed): {0}")]
    NoRingBuffer(String),
    #[error(
        "eBPF setup failed: {detail} (Linux before 5.11 charges BPF memory to RLIMIT_MEMLOCK, \
        {limit_kib} KiB here, which the observer cannot lift without CAP_SYS_RESOURCE: grant it, \
        or start it with `ulimit -l unlimited`)"
    )]
    MemlockTooLow { detail: String, limit_kib: u64 },
    /// Its existence is checked before (`tracepoint_format::check`).
    #[error("attaching tracepoint {category}/{name} failed: {reason}")]
    TracepointAttach {
        category: String,
        name: String,
        reason: String,
    },
    #[error(transparent)]
    TracepointLayout(#[from] LayoutError),
    #[error("the kernel rejected program {program}: {reason}")]
    ProgramRejected { program: String, reason: String },
    #[error("too many watched ports ({count}); at most {max}")]
    TooManyPorts { count: usize, max: u32 },
    #[error("port {0} is both a gRPC and a WebSocket port")]
    PortInBothClasses(u16),
    #[error("--ring-bytes must be a power of two multiple of the page size, got {0}")]
    BadRingSize(u32),
    #[error(transparent)]
    Scope(#[from] ScopeError),
    #[error(transparent)]
    SockLayout(#[from] SockLayoutError),
    #[error("eBPF setup failed: {0}")]
    Setup(String),
    /// The packet hook's programs failed to load or attach here.
    #[error(transparent)]
    PacketHook(Box<CaptureError>),
    #[error("reading the ring buffer failed: {0}")]
    Read(#[from] std::io::Error),
}
