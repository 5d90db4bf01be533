//! Says where the programs find their arguments in the tracepoint records, and the kernel numbers
//! they compare against.

// Where the tracepoint records hold what the programs read: defined once in the records crate,
// because userspace checks the same offsets against this kernel's tracefs before loading.
pub use observer_records::tracepoint::{
    SOCK_DADDR, SOCK_DADDR_V6, SOCK_DPORT, SOCK_FAMILY, SOCK_NEWSTATE, SOCK_OLDSTATE,
    SOCK_PROTOCOL, SOCK_SADDR, SOCK_SADDR_V6, SOCK_SKADDR, SOCK_SPORT, SYSCALL_ARG0, SYSCALL_ARG1,
    SYSCALL_ARG2, SYSCALL_RET,
};

// `struct user_msghdr` on 64-bit: msg_iov at 16, msg_iovlen at 24.
/// Locates `msg_iov` in `struct user_msghdr`.
pub const MSGHDR_IOV: u64 = 16;
/// Locates `msg_iovlen` in `struct user_msghdr`.
pub const MSGHDR_IOVLEN: u64 = 24;

/// Numbers the error a non-blocking `connect` returns while it is in progress.
pub const EINPROGRESS: i64 = 115;
