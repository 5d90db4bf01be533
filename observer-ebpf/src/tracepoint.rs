//! Where the programs find their arguments in the tracepoint records (see
//! /sys/kernel/tracing/events/*/*/format), and the kernel numbers they compare against.

// Syscall tracepoints: 8 bytes of common header, the syscall number, then every argument as
// 8 bytes.
pub const SYSCALL_ARG0: usize = 16;
pub const SYSCALL_ARG1: usize = 24;
pub const SYSCALL_ARG2: usize = 32;
pub const SYSCALL_RET: usize = 16;

// `sock/inet_sock_set_state`, unchanged since 4.16.
pub const SOCK_SKADDR: usize = 8;
pub const SOCK_OLDSTATE: usize = 16;
pub const SOCK_NEWSTATE: usize = 20;
pub const SOCK_SPORT: usize = 24;
pub const SOCK_DPORT: usize = 26;
pub const SOCK_FAMILY: usize = 28;
pub const SOCK_PROTOCOL: usize = 30;
pub const SOCK_SADDR: usize = 32;
pub const SOCK_DADDR: usize = 36;
pub const SOCK_SADDR_V6: usize = 40;
pub const SOCK_DADDR_V6: usize = 56;

// `struct user_msghdr` on 64-bit: msg_iov at 16, msg_iovlen at 24.
pub const MSGHDR_IOV: u64 = 16;
pub const MSGHDR_IOVLEN: u64 = 24;

pub const IPPROTO_TCP: u16 = 6;
pub const EINPROGRESS: i64 = 115;
