//! `--cgroup-scope`: only the processes inside the scope are watched, also among the
//! connections found at start, and a scope that is not a cgroup v2 directory is refused.
//!
//! Each test starts the real `observer` binary (which loads and attaches the eBPF programs),
//! makes real loopback connections, and checks what comes out. They need root and an observer
//! built with its programs: without them they skip and say why, except under `cargo xtask test`
//! (`OBSERVER_REQUIRE_EBPF`), where they fail. They share kernel state (attached programs), so
//! they take `serial()` and run one at a time; each asks `free_port()` for its ports. The
//! harness is in the test kit (`openim_test_kit::{observer_process, captured, privileges}`).

use std::{
    io::{Read, Write},
    net::TcpStream,
    process::Command,
    thread,
};

use openim_test_kit::{
    captured::{captured_stream, events_on_port, is_end_of, listen, serial},
    cgroup2::Cgroup2Mount,
    observer_process::Observer,
    ports::free_port,
    privileges::can_run,
};

const OBSERVER: &str = env!("CARGO_BIN_EXE_observer");

/// A forked copy of this test that joins `cgroup`, connects to 127.0.0.1:`port`, writes
/// `before`, waits for a byte from the test, writes `after` and exits: plain syscalls on one
/// descriptor, the way a pod's process talks.
struct ForkedWriter {
    pid: libc::pid_t,
    /// Write end of the pipe the child waits on.
    go: libc::c_int,
}

impl ForkedWriter {
    fn start(cgroup: &std::path::Path, port: u16) -> Self {
        let procs =
            std::ffi::CString::new(cgroup.join("cgroup.procs").as_os_str().as_encoded_bytes())
                .unwrap();
        let address = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
            },
            sin_zero: [0; 8],
        };
        let mut pipe = [0; 2];
        // SAFETY: pipe2 writes two fds into the array.
        assert_eq!(
            unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) },
            0
        );
        // SAFETY: the child makes only async-signal-safe calls on memory prepared before the
        // fork, and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: as above.
            unsafe { libc::_exit(forked_writer(&procs, &address, pipe[0])) };
        }
        // SAFETY: the read end is the child's.
        unsafe { libc::close(pipe[0]) };
        Self { pid, go: pipe[1] }
    }

    fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// Lets the child write `after`, and returns its exit status.
    fn finish(mut self) -> i32 {
        let mut status = 0;
        // SAFETY: our pipe and our child.
        unsafe {
            libc::write(self.go, c"g".as_ptr().cast(), 1);
            libc::close(self.go);
            libc::waitpid(self.pid, &mut status, 0);
        }
        self.pid = 0;
        status
    }
}

/// A test that failed before `finish` kills the child, which would otherwise wait on its pipe
/// for ever, holding the test harness's output open.
impl Drop for ForkedWriter {
    fn drop(&mut self) {
        if self.pid > 0 {
            // SAFETY: our child and our pipe.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
                libc::waitpid(self.pid, std::ptr::null_mut(), 0);
                libc::close(self.go);
            }
        }
    }
}

/// The child's side of `ForkedWriter`; the exit code says which step failed.
///
/// # Safety
/// Only async-signal-safe calls: it runs between fork and _exit.
unsafe fn forked_writer(
    procs: &std::ffi::CStr,
    address: &libc::sockaddr_in,
    go: libc::c_int,
) -> libc::c_int {
    unsafe {
        let file = libc::open(procs.as_ptr(), libc::O_WRONLY);
        // "0" moves the writer.
        if file < 0 || libc::write(file, c"0".as_ptr().cast(), 1) != 1 {
            return 10;
        }
        libc::close(file);
        let socket = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        if socket < 0 {
            return 11;
        }
        let length = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        if libc::connect(socket, (address as *const libc::sockaddr_in).cast(), length) != 0 {
            return 12;
        }
        if libc::write(socket, c"before".as_ptr().cast(), 6) != 6 {
            return 13;
        }
        let mut byte = 0u8;
        if libc::read(go, (&mut byte as *mut u8).cast(), 1) != 1 {
            return 14;
        }
        if libc::write(socket, c"after".as_ptr().cast(), 5) != 5 {
            return 15;
        }
        libc::close(socket);
        0
    }
}

#[test]
fn a_cgroup_scope_watches_only_the_processes_inside_it() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    let port = free_port();
    let listener = listen(port);
    let mut cgroups = Cgroup2Mount::mount();
    let inside = cgroups.child("inside");
    let server = thread::spawn(move || {
        // The outside connection, then the inside one: each read to its end.
        let mut received = Vec::new();
        for _ in 0..2 {
            let (mut socket, _) = listener.accept().unwrap();
            let mut bytes = Vec::new();
            socket.read_to_end(&mut bytes).unwrap();
            received.push(bytes);
        }
        received
    });
    let mut observer = Observer::start(
        OBSERVER,
        &[
            "--grpc-port",
            &port.to_string(),
            "--cgroup-scope",
            inside.to_str().unwrap(),
        ],
    );
    let started = observer
        .wait_for(|line| line["kind"] == "observer_started")
        .unwrap();
    assert_eq!(started["cgroup_scope"][0], inside.to_str().unwrap());

    // This test process is outside the scope.
    let mut outside = TcpStream::connect(("127.0.0.1", port)).unwrap();
    outside.write_all(b"outside").unwrap();
    drop(outside);
    // A process inside writes, then (moved out of the scope while connected) writes again.
    let child = ForkedWriter::start(&inside, port);
    let child_pid = child.pid();
    let before = observer.wait_for(|line| {
        line["kind"] == "data" && line["pid"] == child_pid && line["direction"] == "send"
    });
    assert!(
        before.is_some(),
        "the process inside the scope was not captured"
    );
    cgroups.move_to_root(child_pid);
    assert_eq!(child.finish(), 0, "the forked writer failed");
    // It closes its socket after the last write.
    assert!(
        observer
            .wait_for(|line| line["kind"] == "close" && line["pid"] == child_pid)
            .is_some()
    );
    let received = server.join().unwrap();
    assert_eq!(received, [b"outside".to_vec(), b"beforeafter".to_vec()]);

    let (lines, _) = observer.stop();
    let ours = events_on_port(&lines, port);
    assert!(
        ours.iter().all(|line| line["pid"] != std::process::id()),
        "a process outside the scope was watched: {ours:?}"
    );
    let connects: Vec<_> = ours
        .iter()
        .filter(|line| line["kind"] == "tcp_connect")
        .collect();
    assert_eq!(connects.len(), 1, "{connects:?}");
    assert_eq!(connects[0]["pid"], child_pid);
    // Written after leaving the scope: not captured.
    assert_eq!(captured_stream(&ours, "send"), b"before");
}

/// A connection established before the start is adopted only when its process is inside
/// `--cgroup-scope`: the programs test the scope as they see a connection being made, and no
/// program saw these. With either hook, the one outside stays unwatched; and so from a cgroup
/// namespace of the observer's own, where /proc spells the process's cgroup `/../…`.
#[test]
fn connections_found_at_start_are_adopted_only_inside_the_cgroup_scope() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    let mut cgroups = Cgroup2Mount::mount();
    let inside = cgroups.child("adopted-inside");
    let observer_namespace = cgroups.child("observer-namespace");
    let cases = [
        (free_port(), "packets", None),
        (free_port(), "syscalls", None),
        (free_port(), "packets", Some(&observer_namespace)),
    ];
    for (port, hook, namespace) in cases {
        let listener = listen(port);
        // This test process, outside the scope, and a process inside: both connected and
        // written before the observer starts.
        let mut outside = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (mut outside_server, _) = listener.accept().unwrap();
        let child = ForkedWriter::start(&inside, port);
        let child_pid = child.pid();
        let (mut inside_server, _) = listener.accept().unwrap();
        let mut before = [0u8; 6];
        inside_server.read_exact(&mut before).unwrap();

        let port_arg = port.to_string();
        let root = cgroups.root().display().to_string();
        let scope = inside.display().to_string();
        let args = [
            "--grpc-port",
            &port_arg,
            "--capture-hook",
            hook,
            "--cgroup-root",
            &root,
            "--cgroup-scope",
            &scope,
        ];
        let mut observer = match namespace {
            Some(cgroup) => Observer::start_in_cgroup_namespace(OBSERVER, cgroup, &args),
            None => Observer::start(OBSERVER, &args),
        };
        let started = observer
            .wait_for(|line| line["kind"] == "observer_started")
            .unwrap();
        let adopted = &started["adopted_connections"];
        assert_eq!(adopted["grpc"], 1, "{hook}: {started}");
        assert_eq!(adopted["outside_scope"], 1, "{hook}: {started}");

        outside.write_all(b"outside").unwrap();
        let mut received = [0u8; 7];
        outside_server.read_exact(&mut received).unwrap();
        assert_eq!(child.finish(), 0, "{hook}: the forked writer failed");
        let mut after = Vec::new();
        inside_server.read_to_end(&mut after).unwrap();
        assert_eq!(after, b"after");
        drop((outside, outside_server, inside_server));
        assert!(
            observer
                .wait_for(|line| line["pid"] == child_pid && is_end_of(line, port))
                .is_some(),
            "{hook}: the adopted connection's end"
        );
        let (lines, _) = observer.stop();
        let ours = events_on_port(&lines, port);
        assert!(
            ours.iter().all(|line| line["pid"] == child_pid),
            "{hook}: a connection outside the scope was adopted: {ours:?}"
        );
        // Its process's cgroup, as the programs would have named it at connect.
        let cgroup_id = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&inside).unwrap());
        assert!(
            ours.iter().all(|line| line["cgroup_id"] == cgroup_id),
            "{hook}: {ours:?}"
        );
        let sent: usize = ours
            .iter()
            .filter(|line| line["kind"] == "data" && line["direction"] == "send")
            .map(|line| line["len"].as_u64().unwrap() as usize)
            .sum();
        assert_eq!(
            sent, 5,
            "{hook}: the inside process's write after the start"
        );
    }
}

#[test]
fn a_cgroup_scope_that_is_not_cgroup2_is_a_one_line_error_with_exit_code_two() {
    // Without the programs the observer stops before reading its scope; no root needed.
    if !observer::capture::kernel::PROGRAMS_EMBEDDED {
        return;
    }
    let plain = tempfile::tempdir().unwrap();
    for scope in [plain.path(), std::path::Path::new("/nonexistent/scope")] {
        let output = Command::new(OBSERVER)
            .args(["run", "--cgroup-scope"])
            .arg(scope)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with(&format!("observer: --cgroup-scope {}: ", scope.display())),
            "{stderr}"
        );
        assert!(output.stdout.is_empty());
    }
}
