//! Handles the programs' side of start-up: which program serves which tracepoint, loading them (and
//! naming what the verifier refused), attaching them, and forwarding their log.

use std::fs::File;

use aya::{
    Ebpf,
    maps::{MapError, ProgramArray},
    programs::{
        CgroupAttachMode, CgroupSkb, CgroupSkbAttachType, Program, ProgramError, RawTracePoint,
        TracePoint,
    },
};
use tokio::io::unix::AsyncFd;

use super::{error::CaptureError, sock_layout::StateTracepoint};

/// Says which program serves which tracepoints. One program may serve several syscalls whose
/// arguments share a layout (write and sendto both start with fd, buf, len). Attached in this
/// order, each syscall's exit before its entry: an entry's claim (`PENDING_CONNECTS`,
/// `IN_FLIGHT`) is removed by its exit, and a claim made while the exit was not yet attached
/// would stay, since neither table is LRU.
pub(super) const ATTACHMENTS: &[(&str, &str, &str)] = &[
    ("sys_exit_io", "syscalls", "sys_exit_write"),
    ("sys_exit_io", "syscalls", "sys_exit_sendto"),
    ("sys_exit_io", "syscalls", "sys_exit_read"),
    ("sys_exit_io", "syscalls", "sys_exit_recvfrom"),
    ("sys_exit_io", "syscalls", "sys_exit_writev"),
    ("sys_exit_io", "syscalls", "sys_exit_readv"),
    ("sys_exit_io", "syscalls", "sys_exit_sendmsg"),
    ("sys_exit_io", "syscalls", "sys_exit_recvmsg"),
    ("sys_enter_send_buffer", "syscalls", "sys_enter_write"),
    ("sys_enter_send_buffer", "syscalls", "sys_enter_sendto"),
    ("sys_enter_recv_buffer", "syscalls", "sys_enter_read"),
    ("sys_enter_recv_buffer", "syscalls", "sys_enter_recvfrom"),
    ("sys_enter_send_iovec", "syscalls", "sys_enter_writev"),
    ("sys_enter_recv_iovec", "syscalls", "sys_enter_readv"),
    ("sys_enter_sendmsg", "syscalls", "sys_enter_sendmsg"),
    ("sys_enter_recvmsg", "syscalls", "sys_enter_recvmsg"),
    ("sys_enter_close", "syscalls", "sys_enter_close"),
    ("inet_sock_set_state", "sock", "inet_sock_set_state"),
    ("sys_exit_connect", "syscalls", "sys_exit_connect"),
    ("sys_enter_connect", "syscalls", "sys_enter_connect"),
];

/// Lists the tracepoints of `CaptureHook::Packets`: connections become watched at SYN_SENT, the
/// bytes come from `PACKET_PROGRAMS`.
const PACKET_TRACEPOINTS: &[(&str, &str, &str)] = &[STATE_CHANGES];

/// Names the formatted tracepoint of TCP state changes, in both hooks' lists; with
/// `StateTracepoint::Raw`, `RAW_STATE_PROGRAM` serves them instead.
const STATE_CHANGES: (&str, &str, &str) = ("inet_sock_set_state", "sock", "inet_sock_set_state");

/// Names the raw tracepoint's program, and the tracepoint it attaches to.
const RAW_STATE_PROGRAM: (&str, &str) = ("raw_sock_state", "inet_sock_set_state");

/// Lists the `cgroup_skb` programs of `CaptureHook::Packets`, attached at `--cgroup-root` before
/// the tracepoint that feeds them.
const PACKET_PROGRAMS: &[(&str, CgroupSkbAttachType)] = &[
    ("packet_egress", CgroupSkbAttachType::Egress),
    ("packet_ingress", CgroupSkbAttachType::Ingress),
];

/// Says where the kernel copies the bytes of watched connections: what `HookChoice` came to.
/// Serialised by its `name`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureHook {
    /// Tracepoints of the read and write syscalls: works everywhere the observer does; every
    /// read and write on the node pays a little, a watched one the copy.
    Syscalls,
    /// `cgroup_skb` programs on the packets of watched connections: no syscall pays anything.
    /// Needs the node's cgroup v2 hierarchy (`--cgroup-root`) and CAP_NET_ADMIN.
    Packets,
}

impl serde::Serialize for CaptureHook {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl CaptureHook {
    /// Returns its name as `observer_started` and `--capture-hook` spell it.
    pub fn name(self) -> &'static str {
        match self {
            CaptureHook::Syscalls => "syscalls",
            CaptureHook::Packets => "packets",
        }
    }

    /// Lists the formatted tracepoints this hook attaches, whose layouts are checked before
    /// loading: all of them, but TCP state changes only from the formatted one.
    pub(super) fn tracepoints(
        self,
        state: StateTracepoint,
    ) -> Vec<(&'static str, &'static str, &'static str)> {
        let all = match self {
            CaptureHook::Syscalls => ATTACHMENTS,
            CaptureHook::Packets => PACKET_TRACEPOINTS,
        };
        all.iter()
            .copied()
            .filter(|attachment| {
                *attachment != STATE_CHANGES || state == StateTracepoint::Formatted
            })
            .collect()
    }

    /// Returns the hook as the programs number it (`observer_records::CaptureHook`).
    pub(super) fn kernel(self) -> observer_records::CaptureHook {
        match self {
            CaptureHook::Syscalls => observer_records::CaptureHook::Syscalls,
            CaptureHook::Packets => observer_records::CaptureHook::Packets,
        }
    }
}

/// Names the exit program of `ATTACHMENTS`, which stands for one of two, chosen at load
/// (`CopyWalk`).
const EXIT_PROGRAM: &str = "sys_exit_io";

/// Names the variant of `EXIT_PROGRAM` for kernels without `bpf_loop`, and the program its copy
/// continues in.
const EXIT_PROGRAM_BOUNDED: &str = "sys_exit_io_bounded";

const COPY_CONTINUE_PROGRAM: &str = "copy_continue";

/// Numbers the slot of `COPY_CONTINUE_PROGRAM` in the `COPY_PROGRAMS` map (`maps::COPY_CONTINUE`).
const COPY_CONTINUE_SLOT: u32 = 0;

/// Lists the names of our programs as the kernel lists them (truncated to 15 bytes by the kernel),
/// so a check can tell whether any is still loaded.
pub fn program_names() -> impl Iterator<Item = &'static str> {
    tracepoint_program_names()
        .chain(PACKET_PROGRAMS.iter().map(|(program, _)| *program))
        .chain([RAW_STATE_PROGRAM.0])
}

/// Lists the names of the programs attached to tracepoints, whose reads `tracepoint_format` checks.
pub(super) fn tracepoint_program_names() -> impl Iterator<Item = &'static str> {
    let mut names: Vec<&str> = ATTACHMENTS.iter().map(|(program, _, _)| *program).collect();
    names.dedup();
    names.extend([EXIT_PROGRAM_BOUNDED, COPY_CONTINUE_PROGRAM]);
    names.into_iter()
}

/// Says how the kernel walks a call's buffers (observer-ebpf/src/copy.rs). Both follow every iovec
/// entry a call may have (`IOV_MAX`); they differ in what the kernel must offer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyWalk {
    /// `bpf_loop` where the kernel has it (5.17+), else tail calls.
    Auto,
    /// The `bpf_loop` helper (Linux 5.17+); refuse to start without it.
    BpfLoop,
    /// Bounded loops chained by tail calls (any supported kernel).
    TailCalls,
}

/// Loads and attaches the packet programs at `cgroup_root`, then the tracepoint that makes
/// connections watched.
///
/// # Errors
///
/// Fails with [`CaptureError::ProgramRejected`] when the verifier refuses a program,
/// [`CaptureError::TracepointAttach`] when a tracepoint does not attach, and
/// [`CaptureError::Setup`] when a program is missing or does not attach at `cgroup_root`.
pub(super) fn attach_packet_hook(
    ebpf: &mut Ebpf,
    cgroup_root: &File,
    state: StateTracepoint,
) -> Result<(), CaptureError> {
    for (program_name, attach_type) in PACKET_PROGRAMS {
        let program: &mut CgroupSkb = typed_program(ebpf, program_name)?;
        program.load().map_err(|err| rejected(program_name, &err))?;
        // Beside any other program there (a CNI's, systemd's): ours only looks. On 5.7+ aya
        // attaches through a BPF link, which runs beside every program attached through a link
        // or with BPF_F_ALLOW_MULTI (not beside one attached without), and refuses any mode
        // flag ("Invalid argument" for `AllowMultiple`): `Single` is the flag-less mode.
        program
            .attach(cgroup_root, *attach_type, CgroupAttachMode::Single)
            .map_err(|err| {
                let cause = with_cause(&err);
                // With CAP_NET_ADMIN checked before, EPERM here is the cgroup's own refusal.
                let hint = if last_cause(&err)
                    .downcast_ref::<std::io::Error>()
                    .and_then(std::io::Error::raw_os_error)
                    == Some(libc::EPERM)
                {
                    " (a program attached there without BPF_F_ALLOW_MULTI admits no other)"
                } else {
                    ""
                };
                CaptureError::Setup(format!("attaching {program_name}: {cause}{hint}"))
            })?;
    }
    for (program_name, category, tracepoint) in PACKET_TRACEPOINTS {
        attach(ebpf, program_name, category, tracepoint, state)?;
    }
    Ok(())
}

/// Loads the exit program `wanted` asks for, then every program, and attaches each to its
/// tracepoints. Returns the walk loaded.
///
/// # Errors
///
/// Fails with [`CaptureError::ProgramRejected`] when the verifier refuses a program,
/// [`CaptureError::TracepointAttach`] when a tracepoint does not attach, and
/// [`CaptureError::Setup`] when a program or the tail-call map cannot be set up.
pub(super) fn attach_syscall_hook(
    ebpf: &mut Ebpf,
    wanted: CopyWalk,
    state: StateTracepoint,
) -> Result<CopyWalk, CaptureError> {
    let copy_walk = load_exit_program(ebpf, wanted)?;
    let exit_program = match copy_walk {
        CopyWalk::TailCalls => EXIT_PROGRAM_BOUNDED,
        _ => EXIT_PROGRAM,
    };
    for (program_name, category, tracepoint) in ATTACHMENTS {
        let program_name = if *program_name == EXIT_PROGRAM {
            exit_program
        } else {
            program_name
        };
        attach(ebpf, program_name, category, tracepoint, state)?;
    }
    Ok(copy_walk)
}

/// Loads the exit program `wanted` asks for; with `CopyWalk::Auto`, the `bpf_loop` one if this
/// kernel's verifier accepts it (5.17+), else the bounded one. Returns the walk loaded.
fn load_exit_program(ebpf: &mut Ebpf, wanted: CopyWalk) -> Result<CopyWalk, CaptureError> {
    if wanted != CopyWalk::TailCalls {
        match load_program(ebpf, EXIT_PROGRAM) {
            Ok(()) => return Ok(CopyWalk::BpfLoop),
            Err(err) if wanted == CopyWalk::BpfLoop => return Err(err),
            Err(err) => tracing::info!("copying in tail calls: no bpf_loop here ({err})"),
        }
    }
    load_program(ebpf, EXIT_PROGRAM_BOUNDED)?;
    load_program(ebpf, COPY_CONTINUE_PROGRAM)?;
    let continuation = typed_program::<TracePoint>(ebpf, COPY_CONTINUE_PROGRAM)?
        .fd()
        .map_err(|err| CaptureError::Setup(format!("{COPY_CONTINUE_PROGRAM}: {err}")))?
        .try_clone()
        .map_err(|err| CaptureError::Setup(format!("{COPY_CONTINUE_PROGRAM}: {err}")))?;
    // Borrowed, not taken: the map stays with `Ebpf`, whose fd keeps its entries (the kernel
    // empties a program array once userspace closes it).
    let map = ebpf
        .map_mut("COPY_PROGRAMS")
        .ok_or_else(|| CaptureError::Setup("map COPY_PROGRAMS is missing".to_owned()))?;
    let mut programs = ProgramArray::try_from(map)
        .map_err(|err| CaptureError::Setup(format!("map COPY_PROGRAMS: {err}")))?;
    programs
        .set(COPY_CONTINUE_SLOT, &continuation, 0)
        .map_err(|err| CaptureError::Setup(format!("COPY_PROGRAMS: {err}")))?;
    Ok(CopyWalk::TailCalls)
}

/// Returns the object's program `program_name`, as the program type it was built as.
fn typed_program<'a, P>(ebpf: &'a mut Ebpf, program_name: &str) -> Result<&'a mut P, CaptureError>
where
    &'a mut P: TryFrom<&'a mut Program, Error = ProgramError>,
{
    ebpf.program_mut(program_name)
        .ok_or_else(|| CaptureError::Setup(format!("program {program_name} is missing")))?
        .try_into()
        .map_err(|err: ProgramError| CaptureError::Setup(err.to_string()))
}

/// Says in a line why the kernel refused to load `program_name`.
fn rejected(program_name: &str, err: &ProgramError) -> CaptureError {
    CaptureError::ProgramRejected {
        program: program_name.to_owned(),
        reason: verifier_summary(err),
    }
}

/// Loads a program into the kernel once (one program may serve several tracepoints).
fn load_program(ebpf: &mut Ebpf, program_name: &str) -> Result<(), CaptureError> {
    let program = typed_program::<TracePoint>(ebpf, program_name)?;
    if program.fd().is_ok() {
        return Ok(());
    }
    program.load().map_err(|err| rejected(program_name, &err))?;
    // The verifier's work (5.16+), against its limit of 1 000 000 instructions.
    if let Some(verified) = program
        .info()
        .ok()
        .and_then(|info| info.verified_instruction_count())
    {
        tracing::debug!(program = program_name, verified, "program loaded");
    }
    Ok(())
}

/// Attaches `program_name` to a formatted tracepoint; TCP state changes to the raw one instead
/// with `StateTracepoint::Raw`.
fn attach(
    ebpf: &mut Ebpf,
    program_name: &str,
    category: &str,
    tracepoint: &str,
    state: StateTracepoint,
) -> Result<(), CaptureError> {
    if (program_name, category, tracepoint) == STATE_CHANGES
        && let StateTracepoint::Raw(_) = state
    {
        return attach_raw_state_program(ebpf);
    }
    load_program(ebpf, program_name)?;
    typed_program::<TracePoint>(ebpf, program_name)?
        .attach(category, tracepoint)
        .map_err(|err| CaptureError::TracepointAttach {
            category: category.to_owned(),
            name: tracepoint.to_owned(),
            reason: attach_failure(&err),
        })?;
    Ok(())
}

/// Attaches the raw tracepoint of TCP state changes: BPF_RAW_TRACEPOINT_OPEN, no perf event.
fn attach_raw_state_program(ebpf: &mut Ebpf) -> Result<(), CaptureError> {
    let (program_name, tracepoint) = RAW_STATE_PROGRAM;
    let program: &mut RawTracePoint = typed_program(ebpf, program_name)?;
    program.load().map_err(|err| rejected(program_name, &err))?;
    program
        .attach(tracepoint)
        .map_err(|err| CaptureError::TracepointAttach {
            category: "raw".to_owned(),
            name: tracepoint.to_owned(),
            reason: with_cause(&err),
        })?;
    Ok(())
}

/// Says why a tracepoint did not attach, in one line: the failed call and its errno (aya's error
/// and its source), and for a refusal what on the node decides it.
fn attach_failure(err: &(dyn std::error::Error + 'static)) -> String {
    let refused = last_cause(err)
        .downcast_ref::<std::io::Error>()
        .and_then(std::io::Error::raw_os_error)
        .is_some_and(|errno| errno == libc::EACCES || errno == libc::EPERM);
    let cause = with_cause(err);
    if refused {
        let paranoid = std::fs::read_to_string(PERF_EVENT_PARANOID).ok();
        format!("{cause}{}", perf_paranoia_hint(paranoid.as_deref()))
    } else {
        cause
    }
}

const PERF_EVENT_PARANOID: &str = "/proc/sys/kernel/perf_event_paranoid";

/// Hints at what refused `perf_event_open`: Debian's kernels (and kernels built like them) read
/// `kernel.perf_event_paranoid` above 2 as "perf_event_open for CAP_SYS_ADMIN only", CAP_PERFMON or
/// not, and default it to 3: every tracepoint the programs attach through is then refused to the
/// least-privileged pod.
fn perf_paranoia_hint(paranoid: Option<&str>) -> String {
    match paranoid.and_then(|text| text.trim().parse::<i32>().ok()) {
        Some(level) if level > 2 => format!(
            " (kernel.perf_event_paranoid is {level}, which kernels with Debian's patch read as \
            CAP_SYS_ADMIN only: set it to 2 on the node, `sysctl kernel.perf_event_paranoid=2`, or \
            run with CAP_SYS_ADMIN)"
        ),
        _ => " (perf_event_open needs CAP_PERFMON or CAP_SYS_ADMIN; a seccomp profile or LSM may \
            refuse it too)"
            .to_owned(),
    }
}

/// Shortens the verifier log, which can run to thousands of lines: a feature this kernel lacks is
/// named as such, otherwise the log's last lines say what went wrong. The statistics the verifier
/// appends ("processed N insns", "verification time", stack depth) are left out: they would
/// push the refusal itself out of the summary.
fn verifier_summary(err: &ProgramError) -> String {
    let text = match err {
        ProgramError::LoadError { verifier_log, .. } => verifier_log.to_string(),
        other => other.to_string(),
    };
    if let Some(feature) = super::kernel_features::missing_feature(&text) {
        return feature;
    }
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| !line.trim().is_empty() && !is_verifier_statistics(line))
        .collect();
    let tail = &lines[lines.len().saturating_sub(3)..];
    tail.join(" | ")
}

fn is_verifier_statistics(line: &str) -> bool {
    let line = line.trim_start();
    line.starts_with("processed ")
        || line.starts_with("verification time")
        || line.starts_with("stack depth")
}

/// Writes an error's message followed by its innermost cause's: aya's messages name the system call
/// that failed but not its answer ("Operation not permitted"), which says why.
fn with_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let cause = last_cause(err);
    if std::ptr::addr_eq(cause, err) {
        err.to_string()
    } else {
        format!("{err}: {cause}")
    }
}

/// Returns the end of `err`'s chain of sources: for a failed system call, its `io::Error`.
fn last_cause<'e>(
    err: &'e (dyn std::error::Error + 'static),
) -> &'e (dyn std::error::Error + 'static) {
    let mut cause = err;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause
}

/// Classifies a load error with `memlock_in_the_way`: the RLIMIT_MEMLOCK the kernel charges and the
/// observer could not lift (`host::raise_memlock_limit`). A map it refuses then fails with
/// "Operation not permitted", the ring buffer first, which would otherwise read as a kernel without
/// one.
pub(super) fn classify_load_error(
    err: &aya::EbpfError,
    memlock_in_the_way: Option<u64>,
) -> CaptureError {
    // aya's messages leave out the system call's answer, which is what tells a seccomp filter
    // or security module refusing bpf() ("Operation not permitted") from anything else. The
    // errors between hold no more than their Display already says.
    let text = with_cause(err);
    let refused = last_cause(err)
        .downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.raw_os_error() == Some(libc::EPERM));
    if refused && let Some(limit) = memlock_in_the_way {
        return CaptureError::MemlockTooLow {
            detail: text,
            limit_kib: limit / 1024,
        };
    }
    if let aya::EbpfError::MapError(MapError::CreateError { name, .. }) = err
        && name == "EVENTS"
    {
        return CaptureError::NoRingBuffer(text);
    }
    CaptureError::Setup(text)
}

/// Forwards the programs' aya-log records (debug-level, off unless RUST_LOG asks) to `log`,
/// which the tracing subscriber bridges to stderr. The logger owns the map the programs write
/// to: it must stay alive as long as they run, so the task keeps it.
///
/// # Errors
///
/// Fails with [`CaptureError::Setup`] when aya-log cannot take the programs' log map, and with
/// [`CaptureError::Read`] when its ring cannot be watched.
pub(super) fn spawn_kernel_log_reader(
    ebpf: &mut Ebpf,
) -> Result<tokio::task::JoinHandle<()>, CaptureError> {
    let logger = aya_log::EbpfLogger::init(ebpf)
        .map_err(|err| CaptureError::Setup(format!("aya-log: {err}")))?;
    // SAFETY: the logger owns its ring fd and keeps it open while the AsyncFd holds it.
    let mut logger =
        unsafe { AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE) }
            .map_err(|err| CaptureError::Read(err.into()))?;
    Ok(tokio::spawn(async move {
        while let Ok(mut guard) = logger.readable_mut().await {
            guard.get_inner_mut().flush();
            guard.clear_ready();
        }
    }))
}

#[cfg(test)]
mod tests;
