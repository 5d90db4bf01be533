//! Reads what the kernel accounts to each of the observer's programs (`bpf_prog_info`): the runs it
//! skipped, and the runs it timed.
//!
//! Skipped runs. A tracing program does not run again on a CPU where it is already running: a
//! raw tracepoint program since Linux 6.1 or 6.2 (per program; 5.19 runs it nested), a
//! formatted tracepoint program where any kprobe or tracepoint program of any tool is running
//! (a per-CPU guard of the kernel's since long before; its skips are counted since 6.7). So a
//! TCP state change that an interrupt makes while the state program runs on that CPU is lost,
//! or with the syscall hook a read or write inside another program's run: a connection
//! unwatched, its end unseen, or bytes not copied. The kernel counts the skips per program
//! (`recursion_misses` of `bpf_prog_info`, since 5.12); `capture_degraded` reports them.
//!
//! Timed runs. The programs run inside other processes' syscalls and softirqs, so their CPU is
//! not in the observer's own, and under the lab's push flood it is about as much as the
//! daemon's. The kernel times them only while its BPF statistics are on (`sysctl
//! kernel.bpf_stats_enabled=1`, or a `BPF_ENABLE_STATS` descriptor held open), which costs every
//! BPF program run on the node two clock reads: the observer never switches them on, it reports
//! what the kernel counted (`/metrics`, the stop line).

use std::{
    io, mem,
    os::fd::{AsFd, AsRawFd},
};

use aya_obj::generated::{bpf_attr, bpf_attr__bindgen_ty_9, bpf_cmd, bpf_prog_info};

/// Records what the kernel counted of one program's runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgramRuns {
    /// Runs timed, and their time: counted only while the kernel's BPF statistics are on.
    pub timed: u64,
    pub time_ns: u64,
    /// Runs skipped, or `None` on a kernel that does not count them (before 5.12: its
    /// `bpf_prog_info` ends earlier).
    pub skipped: Option<u64>,
}

/// Reads what the kernel counted so far of the runs of the program behind `program`.
///
/// # Errors
///
/// Fails with the system call's error when the kernel will not give the program's info
/// (`BPF_OBJ_GET_INFO_BY_FD`).
pub fn program_runs(program: impl AsFd) -> io::Result<ProgramRuns> {
    // SAFETY: `bpf_prog_info` is plain integers; zero is what the kernel expects in every field
    // it does not fill, and in the tail past its own version of the struct.
    let mut info: bpf_prog_info = unsafe { mem::zeroed() };
    // SAFETY: as above; the kernel also wants the rest of the union zeroed.
    let mut attr: bpf_attr = unsafe { mem::zeroed() };
    attr.info = bpf_attr__bindgen_ty_9 {
        bpf_fd: program.as_fd().as_raw_fd() as u32,
        info_len: mem::size_of::<bpf_prog_info>() as u32,
        info: (&raw mut info) as u64,
    };
    // SAFETY: `attr` names a live, writable `info` of the size it says, for the call's length.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            bpf_cmd::BPF_OBJ_GET_INFO_BY_FD as libc::c_long,
            &raw mut attr,
            mem::size_of::<bpf_attr>(),
        )
    };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel wrote back how much of `info` it filled, in the field set above.
    let filled = unsafe { attr.info.info_len } as usize;
    let skips_counted = mem::offset_of!(bpf_prog_info, recursion_misses) + mem::size_of::<u64>();
    Ok(ProgramRuns {
        // Kept since Linux 5.1, before any kernel the observer loads on.
        timed: info.run_cnt,
        time_ns: info.run_time_ns,
        skipped: (filled >= skips_counted).then_some(info.recursion_misses),
    })
}
