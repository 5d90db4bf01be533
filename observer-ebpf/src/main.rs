//! Holds the kernel programs of the OpenIM observer: which TCP connections go to a watched gateway
//! port, and a bounded copy of the bytes their owners write and read. The records they send to
//! userspace are defined in `observer-records` (`records/`).
//!
//! Tracepoints only (no kprobes: not every kernel we run on has CONFIG_KPROBES), all of them
//! present since 4.16, with maps and helpers of 5.8 (ring buffer). TCP state changes come from
//! `inet_sock_set_state`'s raw tracepoint where the kernel's BTF tells userspace where the
//! socket's fields are (no perf event to open), else from its formatted record (`connect`).
//!
//! How a connection becomes watched (`connect`):
//! 1. `sys_enter_connect` sees a sockaddr whose port is in `WATCHED_PORTS` and remembers the
//!    thread's (fd, port class) in `PENDING_CONNECTS`.
//! 2. `inet_sock_set_state` → SYN_SENT runs inside that `connect`, so the same thread is
//!    current: it ties the kernel socket to the thread's pending connect, records the owner in
//!    `CONNECTIONS` and emits `tcp_connect`.
//! 3. `sys_exit_connect` (0 or -EINPROGRESS) moves it to `SOCKETS`, keyed by (tgid, fd), and
//!    marks the process in `WATCHING`: from then on the process's reads and writes on that fd
//!    are captured (`io`, `copy`) under the port class's policy. A connect to a watched port over
//!    UDP never reaches step 2 and is dropped.
//!
//! With `--capture-hook packets` (`packet`), no syscall is hooked: SYN_SENT alone makes the
//! connection watched (the connecting thread is current there too, and the port is the one
//! the socket connects to), recorded in `PACKET_STREAMS` instead of `CONNECTIONS`, and
//! `cgroup_skb` programs copy its segments' bytes.
//!
//! With `--cgroup-scope`, step 1 and every read or write also require the current task to be
//! inside one of the scope's cgroup v2 directories (`scope`): the kernel ignores the rest.
//!
//! Built for the host (`cargo check --workspace`), the crate is an empty binary: the programs
//! need `aya-ebpf`, which only builds for BPF.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]
// `atomic_xadd` for the claim counts (`maps::add_claims`): the BPF target has no atomic
// read-modify-write methods.
#![cfg_attr(
    target_arch = "bpf",
    feature(core_intrinsics),
    allow(internal_features)
)]

#[cfg(target_arch = "bpf")]
mod connect;
#[cfg(target_arch = "bpf")]
mod copy;
#[cfg(target_arch = "bpf")]
mod copy_state;
#[cfg(target_arch = "bpf")]
mod io;
#[cfg(target_arch = "bpf")]
mod maps;
#[cfg(target_arch = "bpf")]
mod packet;
#[cfg(target_arch = "bpf")]
mod ring;
#[cfg(target_arch = "bpf")]
mod scope;
#[cfg(target_arch = "bpf")]
mod tracepoint;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!("observer-ebpf holds eBPF programs: build them with `cargo xtask build`");
    std::process::exit(2);
}
