//! Which hook the observer takes: `packets` needs a cgroup v2 root, and `auto` takes the packet
//! hook where it can and the syscalls elsewhere, saying why each time.
//!
//! Each test starts the real `observer` binary (which loads and attaches the eBPF programs),
//! makes real loopback connections, and checks what comes out. They need root and an observer
//! built with its programs: without them they skip and say why, except under `cargo xtask test`
//! (`OBSERVER_REQUIRE_EBPF`), where they fail. They share kernel state (attached programs), so
//! they take `serial()` and run one at a time; each asks `free_port()` for its ports. The
//! harness is in the test kit (`openim_test_kit::{observer_process, captured, privileges}`).

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    process::Command,
    thread,
};

use openim_test_kit::{
    captured::{captured_stream, events_on_port, is_end_of, listen, pattern, serial},
    cgroup2::Cgroup2Mount,
    observer_process::Observer,
    ports::free_port,
    privileges::can_run,
};
use serde_json::Value;

const OBSERVER: &str = env!("CARGO_BIN_EXE_observer");

/// Without a cgroup v2 hierarchy at `--cgroup-root`, and without CAP_SYS_ADMIN to mount one
/// of its own (the DaemonSet grants none), `--capture-hook packets` refuses in one line.
#[test]
fn the_packet_hook_needs_a_cgroup2_root_and_says_so_in_one_line() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    let not_cgroup2 = tempfile::tempdir().unwrap();
    let output = without_cap_sys_admin()
        .args(["run", "--capture-hook", "packets", "--cgroup-root"])
        .arg(not_cgroup2.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("observer: --cgroup-root ")
            && stderr.contains("not a cgroup v2")
            && stderr
                .trim_end()
                .ends_with("mounting one privately needs CAP_SYS_ADMIN"),
        "{stderr}"
    );
}

/// The observer as root without CAP_SYS_ADMIN (`setpriv`, from util-linux), as the DaemonSet
/// runs it: every other capability a root process holds.
fn without_cap_sys_admin() -> Command {
    let mut command = Command::new("setpriv");
    command
        .args(["--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin"])
        .arg(OBSERVER);
    command
}

/// `auto`, the default, takes the packet hook at the root of a cgroup v2 hierarchy, with
/// CAP_SYS_ADMIN or without (as the DaemonSet runs it), and where `--cgroup-root` holds none (a
/// cgroup v1 node) at the root of one it mounts itself; the
/// syscall hook below a root (a container's own cgroup namespace shows its cgroup as the root),
/// or without a hierarchy and CAP_SYS_ADMIN to mount one; saying why each time. Whichever it
/// takes, the bytes written are captured.
#[test]
fn auto_takes_the_packet_hook_at_a_cgroup2_root_and_says_why_it_falls_back_elsewhere() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    let mut cgroups = Cgroup2Mount::mount();
    let root = cgroups.root().display().to_string();
    let below_root = cgroups.child("auto").display().to_string();
    let not_cgroup2 = tempfile::tempdir().unwrap();
    let not_cgroup2 = not_cgroup2.path().display().to_string();
    let cases = [
        (
            &root,
            true,
            "packets",
            format!("auto: CAP_NET_ADMIN held and {root} is the root of a cgroup v2 hierarchy"),
        ),
        // As the DaemonSet runs it, on Debian's kernels too (the guests): the packet hook's
        // programs attach without perf_event_open, which their kernel.perf_event_paranoid
        // (3) refuses without CAP_SYS_ADMIN.
        (
            &root,
            false,
            "packets",
            format!("auto: CAP_NET_ADMIN held and {root} is the root of a cgroup v2 hierarchy"),
        ),
        (
            &below_root,
            true,
            "syscalls",
            format!(
                "auto: --cgroup-root {below_root} is a cgroup below its hierarchy's root (a \
                container's own /sys/fs/cgroup is its cgroup), so programs there would see only \
                its sockets; mount the node's /sys/fs/cgroup and pass it"
            ),
        ),
        (
            &not_cgroup2,
            true,
            "packets",
            format!(
                "auto: CAP_NET_ADMIN held and --cgroup-root {not_cgroup2} holds no cgroup v2 \
                hierarchy, as on a cgroup v1 node, so attached at the root of one mounted privately"
            ),
        ),
        (
            &not_cgroup2,
            false,
            "syscalls",
            format!(
                "auto: --cgroup-root {not_cgroup2}: not a cgroup v2 directory (mount one with \
                `mount -t cgroup2 none DIR`); mounting one privately needs CAP_SYS_ADMIN"
            ),
        ),
    ];
    for (cgroup_root, sys_admin, hook, reason) in cases {
        let port = free_port();
        if hook == "syscalls" && !sys_admin && perf_event_paranoid() > 2 {
            tracepoints_refused_without_cap_sys_admin(port, cgroup_root);
            continue;
        }
        let listener = listen(port);
        let (observer, started) = start_auto(port, cgroup_root, sys_admin);
        assert_eq!(started["capture_hook"], hook, "{started}");
        assert_eq!(started["capture_hook_reason"], reason.as_str(), "{started}");
        sixty_four_written_bytes_are_captured(observer, listener, port);
    }
}

fn perf_event_paranoid() -> i32 {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Debian's kernels (the 5.10, 6.1 and 6.12 guests) default `kernel.perf_event_paranoid` to 3
/// and then refuse perf_event_open, by which every formatted tracepoint attaches, to all but
/// CAP_SYS_ADMIN: the syscall hook stops in one line that names the setting and the fix.
fn tracepoints_refused_without_cap_sys_admin(port: u16, cgroup_root: &str) {
    let output = without_cap_sys_admin()
        .args(["run", "--capture-hook", "auto", "--grpc-port"])
        .arg(port.to_string())
        .args(["--cgroup-root", cgroup_root])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let refusal = stderr
        .lines()
        .filter(|line| line.starts_with("observer: "))
        .collect::<Vec<_>>();
    assert_eq!(refusal.len(), 1, "{stderr}");
    assert!(
        refusal[0].contains("Permission denied (os error 13)")
            && refusal[0].contains(&format!(
                "kernel.perf_event_paranoid is {}",
                perf_event_paranoid()
            ))
            && refusal[0].contains("sysctl kernel.perf_event_paranoid=2"),
        "{stderr}"
    );
}

/// An observer of gRPC port `port` with `--capture-hook auto` at `cgroup_root`, and its
/// `observer_started` line.
fn start_auto(port: u16, cgroup_root: &str, sys_admin: bool) -> (Observer, Value) {
    let port = port.to_string();
    let args = [
        "--grpc-port",
        &port,
        "--capture-hook",
        "auto",
        "--cgroup-root",
        cgroup_root,
    ];
    let mut observer = if sys_admin {
        Observer::start(OBSERVER, &args)
    } else {
        Observer::spawn(without_cap_sys_admin(), &args)
    };
    let started = observer
        .wait_for(|line| line["kind"] == "observer_started")
        .unwrap();
    (observer, started)
}

/// 64 bytes written on a new connection to `port` are captured by `observer`, which then
/// stops; returns its stderr.
fn sixty_four_written_bytes_are_captured(
    mut observer: Observer,
    listener: TcpListener,
    port: u16,
) -> String {
    let written = pattern(3, 64);
    let server = thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        let mut received = Vec::new();
        socket.read_to_end(&mut received).unwrap();
        received
    });
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    client.write_all(&written).unwrap();
    drop(client);
    assert_eq!(server.join().unwrap(), written);
    assert!(observer.wait_for(|line| is_end_of(line, port)).is_some());
    let (lines, stderr) = observer.stop();
    assert_eq!(
        captured_stream(&events_on_port(&lines, port), "send"),
        written
    );
    stderr
}

/// A `cgroup_skb` program that lets every packet through, attached at a cgroup's egress in the
/// exclusive mode (`BPF_PROG_ATTACH` without `BPF_F_ALLOW_MULTI`), as a tool older than BPF
/// links may hold one: no program can attach beside it there. Detached on drop.
struct ExclusiveEgressProgram {
    cgroup: std::fs::File,
    program: std::os::fd::OwnedFd,
}

impl ExclusiveEgressProgram {
    /// linux/bpf.h: commands, the program type and the attach type.
    const BPF_PROG_LOAD: libc::c_long = 5;
    const BPF_PROG_ATTACH: libc::c_long = 8;
    const BPF_PROG_DETACH: libc::c_long = 9;
    const BPF_PROG_TYPE_CGROUP_SKB: u32 = 8;
    const BPF_CGROUP_INET_EGRESS: u32 = 1;

    fn attach(cgroup: &std::path::Path) -> Self {
        use std::os::fd::{AsRawFd, FromRawFd};
        // Before Linux 5.11 a program's pages are charged to its user's locked memory and checked
        // against the loader's RLIMIT_MEMLOCK: EPERM once root's total (the observers of earlier
        // tests, their maps freed only later by a work queue) passes this process's default limit.
        // CI's 5.10 guest failed so. As the observer does, the limit is raised where the process
        // may (this host's root lacks CAP_SYS_RESOURCE, and its kernel ignores the limit).
        let unlimited = libc::rlimit {
            rlim_cur: libc::RLIM_INFINITY,
            rlim_max: libc::RLIM_INFINITY,
        };
        // SAFETY: setrlimit reads the struct we pass and nothing else.
        unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
        // The leading fields of `union bpf_attr` for BPF_PROG_LOAD; the kernel zero-fills the rest.
        #[repr(C)]
        struct ProgramLoad {
            prog_type: u32,
            insn_cnt: u32,
            insns: u64,
            license: u64,
            log_level: u32,
            log_size: u32,
            log_buf: u64,
            kern_version: u32,
            prog_flags: u32,
            prog_name: [u8; 16],
            prog_ifindex: u32,
            expected_attach_type: u32,
        }
        // r0 = 1 (let the packet pass); exit.
        let instructions: [u64; 2] = [
            u64::from_le_bytes([0xb7, 0, 0, 0, 1, 0, 0, 0]),
            u64::from_le_bytes([0x95, 0, 0, 0, 0, 0, 0, 0]),
        ];
        let license = c"GPL";
        let load = ProgramLoad {
            prog_type: Self::BPF_PROG_TYPE_CGROUP_SKB,
            insn_cnt: 2,
            insns: instructions.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: 0,
            log_size: 0,
            log_buf: 0,
            kern_version: 0,
            prog_flags: 0,
            prog_name: *b"test_exclusive\0\0",
            prog_ifindex: 0,
            expected_attach_type: Self::BPF_CGROUP_INET_EGRESS,
        };
        // SAFETY: bpf(2) reads `load` and the instructions and license it points to, all alive.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                Self::BPF_PROG_LOAD,
                &load as *const ProgramLoad,
                std::mem::size_of::<ProgramLoad>(),
            )
        };
        assert!(
            fd >= 0,
            "BPF_PROG_LOAD: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: a descriptor bpf(2) just returned to us.
        let program = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) };
        let cgroup = std::fs::File::open(cgroup).expect("open the cgroup");
        let result = Self::attachment(Self::BPF_PROG_ATTACH, &cgroup, program.as_raw_fd());
        assert_eq!(
            result,
            0,
            "BPF_PROG_ATTACH: {}",
            std::io::Error::last_os_error()
        );
        Self { cgroup, program }
    }

    /// BPF_PROG_ATTACH or BPF_PROG_DETACH of `program` at the cgroup's egress, flags 0.
    fn attachment(command: libc::c_long, cgroup: &std::fs::File, program: i32) -> libc::c_long {
        use std::os::fd::AsRawFd;
        // `union bpf_attr` for BPF_PROG_ATTACH/DETACH: target, program, type, flags.
        let attr: [u32; 4] = [
            cgroup.as_raw_fd() as u32,
            program as u32,
            Self::BPF_CGROUP_INET_EGRESS,
            0,
        ];
        // SAFETY: bpf(2) reads the 16 bytes of `attr`.
        unsafe { libc::syscall(libc::SYS_bpf, command, attr.as_ptr(), 16usize) }
    }
}

impl Drop for ExclusiveEgressProgram {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        Self::attachment(
            Self::BPF_PROG_DETACH,
            &self.cgroup,
            self.program.as_raw_fd(),
        );
    }
}

/// Where the kernel refuses the packet hook, `auto` hooks the syscalls and says why, and the
/// bytes are captured all the same; `packets` asked for by name refuses to start, in one line.
#[test]
fn auto_hooks_the_syscalls_where_the_kernel_refuses_the_packet_hook() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    let cgroups = Cgroup2Mount::mount();
    let root = cgroups.root().display().to_string();
    let _holder = ExclusiveEgressProgram::attach(cgroups.root());

    let output = Command::new(OBSERVER)
        .args(["run", "--capture-hook", "packets", "--cgroup-root", &root])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("observer: eBPF setup failed: attaching packet_egress: "),
        "{stderr}"
    );
    assert!(
        stderr.trim_end().ends_with(
            "Operation not permitted (os error 1) (a program attached there without \
            BPF_F_ALLOW_MULTI admits no other)"
        ),
        "{stderr}"
    );

    let port = free_port();
    let listener = listen(port);
    let (observer, started) = start_auto(port, &root, true);
    assert_eq!(started["capture_hook"], "syscalls", "{started}");
    let reason = started["capture_hook_reason"].as_str().unwrap();
    assert!(
        reason.starts_with(
            "auto: the packet hook failed here (eBPF setup failed: attaching packet_egress: "
        ),
        "{started}"
    );
    let stderr = sixty_four_written_bytes_are_captured(observer, listener, port);
    assert!(
        stderr.contains("hooking the syscalls instead"),
        "the fallback is logged: {stderr}"
    );
}
