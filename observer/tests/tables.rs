//! The kernel's ring and tables when they fill: drops and failed inserts are counted and said
//! (`capture_degraded`, `table_full`), no entry outlives a killed process, and a reconciliation
//! of the tables unwatches nothing live.
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
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use base64::{Engine, engine::general_purpose::STANDARD as BASE64};
use observer_records::{SocketKey, SocketState};
use openim_test_kit::{
    captured::{check, listen, report, serial},
    observer_process::{Observer, WAIT, stopped_line},
    ports::free_port,
    privileges::can_run,
};

const OBSERVER: &str = env!("CARGO_BIN_EXE_observer");

#[test]
fn a_full_ring_counts_its_drops() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    let port = free_port();
    let listener = listen(port);
    // One page cannot hold a single full data record (header + 4 KiB), so every full chunk
    // is dropped, and must be counted.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.to_string();
    let mut observer = Observer::start(
        OBSERVER,
        &["--grpc-port", &port.to_string(), "--ring-bytes", &page],
    );
    let server = thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        let mut sink = Vec::new();
        socket.read_to_end(&mut sink).unwrap();
    });
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    for _ in 0..20 {
        client.write_all(&[7u8; 4096]).unwrap();
    }
    drop(client);
    server.join().unwrap();
    let _ = observer.wait_for(|line| line["kind"] == "close" && line["dport"] == port);
    let (_, stderr) = observer.stop();
    let stopped = stopped_line(&stderr);
    let drops = stopped["kernel"]["ring_full_drops"].as_u64().unwrap();
    assert!(drops >= 20, "{stopped}");
}

/// More watched connections than the kernel's tables hold: the ones past it go unwatched, and
/// the observer counts them and says so (`capture_degraded`, `table_full`) instead of silently
/// forgetting live ones.
#[test]
fn a_full_table_of_watched_connections_is_counted_and_said() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    const TABLE: usize = 64;
    const CONNECTIONS: usize = 100;
    let port = free_port();
    let listener = listen(port);
    let mut observer = Observer::start(
        OBSERVER,
        &[
            "--grpc-port",
            &port.to_string(),
            "--max-watched-connections",
            &TABLE.to_string(),
        ],
    );
    let server = thread::spawn(move || {
        (0..CONNECTIONS)
            .map(|_| listener.accept().unwrap().0)
            .collect::<Vec<_>>()
    });
    let clients: Vec<TcpStream> = (0..CONNECTIONS)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let accepted = server.join().unwrap();
    let said = observer
        .wait_for(|line| line["kind"] == "capture_degraded" && line["reason"] == "table_full");
    drop((clients, accepted));
    let (_, stderr) = observer.stop();
    let said = said.expect("capture_degraded table_full");
    assert!(
        said["diagnosis"]
            .as_str()
            .is_some_and(|text| text.contains("--max-watched-connections")),
        "{said}"
    );
    let failures = stopped_line(&stderr)["kernel"]["map_insert_failures"]
        .as_u64()
        .unwrap();
    assert!(
        failures >= (CONNECTIONS - TABLE) as u64,
        "{failures} inserts failed"
    );
}

/// Threads blocked in reads on one watched connection, more of them than the kernel's table
/// of calls in flight holds: the calls it cannot hold are counted and said (`table_full`)
/// instead of silently evicting others, as the LRU table did. The table is not LRU, so it must
/// not leak either: the process is killed with its threads inside their reads, and every claim
/// must be gone with it (the interrupted calls still reach the syscall exit).
#[test]
fn calls_in_flight_past_the_table_are_counted_and_none_outlive_a_killed_process() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    let port = free_port();
    let listener = listen(port);
    blocked_threads_fill_a_table::<IN_FLIGHT_VALUE_SIZE, _>(
        port,
        Blocked::Read,
        "IN_FLIGHT",
        || {
            let (accepted, _) = listener.accept().unwrap();
            accepted
        },
    );
}

/// The same for connects in progress (`PENDING_CONNECTS`): threads blocked in `connect` to a
/// listener whose accept queue is full (its SYNs are dropped, so each connect waits).
#[test]
fn connects_in_progress_past_the_table_are_counted_and_none_outlive_a_killed_process() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    let port = free_port();
    let listener = listen_with_full_queue(port);
    blocked_threads_fill_a_table::<PENDING_CONNECTS_VALUE_SIZE, _>(
        port,
        Blocked::Connect,
        "PENDING_CONNECTS",
        || listener,
    );
}

/// Where the helper process's threads block.
#[derive(Clone, Copy, Debug)]
enum Blocked {
    /// In `read` on the one watched connection the process makes.
    Read,
    /// In `connect` to the watched port.
    Connect,
}

/// Starts an observer whose kernel tables hold 64 entries, and a process (this binary again,
/// `blocked_threads_process`) whose 100 threads block in `blocked` calls on `port`; requires
/// `table` to fill, the calls it could not hold to be counted and said as `table_full`, and,
/// once the process is killed inside those calls, every entry it held to be gone.
/// `accept` takes what the server side must keep open while the threads block.
fn blocked_threads_fill_a_table<const VALUE_SIZE: usize, T>(
    port: u16,
    blocked: Blocked,
    table: &str,
    accept: impl FnOnce() -> T,
) {
    const TABLE: usize = 64;
    const THREADS: usize = 100;
    let mut observer = Observer::start(
        OBSERVER,
        &[
            "--grpc-port",
            &port.to_string(),
            "--max-watched-connections",
            &TABLE.to_string(),
        ],
    );
    let mut process = KilledOnDrop(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "blocked_threads_process",
                "--ignored",
                "--nocapture",
            ])
            .env(BLOCKED_CALLS, format!("{blocked:?}"))
            .env(BLOCKED_PORT, port.to_string())
            .env(BLOCKED_THREADS, THREADS.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the blocked threads"),
    );
    let _server_side = accept();
    let entries = observer_table::<VALUE_SIZE>(table, TABLE as u32);
    let entries = || entries.keys().filter(Result::is_ok).count();
    let filled = wait_until(|| entries() >= TABLE);
    let said = observer
        .wait_for(|line| line["kind"] == "capture_degraded" && line["reason"] == "table_full");
    let held = entries();
    process.0.kill().unwrap();
    process.0.wait().unwrap();
    let emptied = wait_until(|| entries() == 0);
    let left = entries();
    let (_, stderr) = observer.stop();
    assert!(filled, "{table}: {held} of {TABLE} entries held");
    said.expect("capture_degraded table_full");
    assert!(
        emptied,
        "{table}: {left} entries outlived the killed process"
    );
    let failures = stopped_line(&stderr)["kernel"]["map_insert_failures"]
        .as_u64()
        .unwrap();
    assert!(
        failures >= (THREADS - TABLE) as u64,
        "{failures} inserts failed"
    );
}

/// A helper process, killed if the test fails before it does.
struct KilledOnDrop(Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const BLOCKED_CALLS: &str = "OBSERVER_TEST_BLOCKED_CALLS";

const BLOCKED_PORT: &str = "OBSERVER_TEST_BLOCKED_PORT";

const BLOCKED_THREADS: &str = "OBSERVER_TEST_BLOCKED_THREADS";

/// Not a test of its own: the process `blocked_threads_fill_a_table` starts (this binary again,
/// with `BLOCKED_CALLS` set) to hold threads blocked in reads or connects until it is killed.
#[test]
#[ignore = "a helper process of the tests that fill the kernel's tables with blocked threads"]
fn blocked_threads_process() {
    let (Ok(calls), Ok(port), Ok(threads)) = (
        std::env::var(BLOCKED_CALLS),
        std::env::var(BLOCKED_PORT),
        std::env::var(BLOCKED_THREADS),
    ) else {
        return;
    };
    let port: u16 = port.parse().unwrap();
    let threads: usize = threads.parse().unwrap();
    if calls == format!("{:?}", Blocked::Connect) {
        for _ in 0..threads {
            thread::spawn(move || TcpStream::connect(("127.0.0.1", port)));
        }
    } else {
        // One descriptor, the watched one, shared by every reader (a clone would be a new,
        // unwatched descriptor).
        let stream = std::sync::Arc::new(TcpStream::connect(("127.0.0.1", port)).unwrap());
        for _ in 0..threads {
            let stream = stream.clone();
            thread::spawn(move || {
                let mut byte = [0u8; 1];
                let _ = (&*stream).read(&mut byte);
            });
        }
    }
    loop {
        thread::park();
    }
}

/// A listener on `port` whose accept queue is full: backlog 0 holds the one connection made
/// here, never accepted, so the kernel drops the SYNs of every later connect, which then waits.
fn listen_with_full_queue(port: u16) -> (std::os::fd::OwnedFd, TcpStream) {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket calls on a descriptor this function owns from creation; the address
    // is a fully initialised sockaddr_in.
    let listener = unsafe {
        let fd = check(
            // Close-on-exec, as std's sockets: the helper process must not inherit it.
            libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) as isize,
            "socket",
        );
        let listener = std::os::fd::OwnedFd::from_raw_fd(fd as i32);
        let reuse: libc::c_int = 1;
        check(
            libc::setsockopt(
                fd as i32,
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                (&reuse as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            ) as isize,
            "setsockopt",
        );
        let address = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
            },
            sin_zero: [0; 8],
        };
        check(
            libc::bind(
                fd as i32,
                (&address as *const libc::sockaddr_in).cast(),
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            ) as isize,
            &format!("bind {port}"),
        );
        check(libc::listen(fd as i32, 0) as isize, "listen");
        listener
    };
    let queued = TcpStream::connect(("127.0.0.1", port)).unwrap();
    (listener, queued)
}

/// The running observer's table `name` (the only one of that size loaded), to count its
/// entries; `VALUE_SIZE` is its value's size, a kernel-only type the test never reads.
fn observer_table<const VALUE_SIZE: usize>(
    name: &str,
    max_entries: u32,
) -> aya::maps::HashMap<aya::maps::MapData, u64, [u8; VALUE_SIZE]> {
    // The kernel keeps 15 bytes of a map's name (`PENDING_CONNECT`).
    let kernel_name = &name[..name.len().min(15)];
    let info = aya::maps::loaded_maps()
        .filter_map(Result::ok)
        .filter(|info| info.name_as_str() == Some(kernel_name) && info.max_entries() == max_entries)
        .max_by_key(aya::maps::MapInfo::id)
        .unwrap_or_else(|| panic!("the observer's {name} map is loaded"));
    assert_eq!(
        info.value_size() as usize,
        VALUE_SIZE,
        "the programs' {name} value changed size"
    );
    let data = aya::maps::MapData::from_id(info.id())
        .unwrap_or_else(|err| panic!("open {name} by id: {err}"));
    aya::maps::HashMap::try_from(aya::maps::Map::HashMap(data))
        .unwrap_or_else(|err| panic!("{name} is a hash map: {err}"))
}

/// Bytes of the programs' `IoCall` and `PendingConnect` (observer-ebpf/src/maps.rs).
const IN_FLIGHT_VALUE_SIZE: usize = 24;

const PENDING_CONNECTS_VALUE_SIZE: usize = 16;

/// Polls `condition` every 10 ms for up to `WAIT`; whether it became true.
fn wait_until(mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        thread::sleep(Duration::from_millis(10));
    }
    condition()
}

/// The running observer's `SOCKETS` table (the only one of that size loaded), to stuff it.
fn observer_sockets_table(
    max_entries: u32,
) -> aya::maps::HashMap<aya::maps::MapData, SocketKey, SocketState> {
    let info = aya::maps::loaded_maps()
        .filter_map(Result::ok)
        .filter(|info| info.name_as_str() == Some("SOCKETS") && info.max_entries() == max_entries)
        .max_by_key(aya::maps::MapInfo::id)
        .expect("the observer's SOCKETS map is loaded");
    let data = aya::maps::MapData::from_id(info.id()).expect("open SOCKETS by id");
    aya::maps::HashMap::try_from(aya::maps::Map::HashMap(data)).expect("SOCKETS is a hash map")
}

/// The 5-second reconciliation reads the programs' descriptor table, then their connection
/// table, and removes the descriptors whose connection is gone. Read the other way round, it
/// unwatched the descriptors of connections made between the two reads, nothing counted (on a
/// node with 100,000 watched, a third of a burst of connects lost their upgrades). Here the
/// descriptor table is stuffed with orphans (no connection, as a process that exited without
/// closing leaves them) so that reading it takes long enough for connections made at a steady
/// pace to land between the two reads; every connection must still be watched afterwards.
#[test]
fn connections_made_while_a_reconciliation_reads_the_tables_stay_watched() {
    if !can_run() {
        return;
    }
    let _serial = serial();
    const TABLE: u32 = 1 << 18;
    const ORPHANS: u32 = 150_000;
    /// No such process: pids stop at 2^22.
    const ORPHAN_TGID: u32 = 1 << 30;
    const PACE: Duration = Duration::from_millis(2);
    // Two descriptors each, within what this process may open: 9,000 on this machine (20,000
    // descriptors), more in the guest kernels, where emulated connects are slower and a
    // reconciliation over the orphans took from connection 6,700 to past 9,000.
    let max_connections = (raise_descriptor_limit().saturating_sub(2_000) / 2).min(30_000);
    let port = free_port();
    let listener = listen(port);
    let mut observer = Observer::start(
        OBSERVER,
        &[
            "--grpc-port",
            &port.to_string(),
            "--max-watched-connections",
            &TABLE.to_string(),
        ],
    );
    let mut sockets = observer_sockets_table(TABLE);
    // SAFETY: SocketState is plain integers; all zero names no connection (`sock` 0).
    let orphan: SocketState = unsafe { std::mem::zeroed() };
    let orphan_key = |fd| SocketKey {
        tgid: ORPHAN_TGID,
        fd,
    };
    for fd in 0..ORPHANS {
        sockets
            .insert(orphan_key(fd), orphan, 0)
            .expect("insert an orphaned descriptor");
    }
    let (accepted_sender, accepted) = mpsc::channel();
    thread::spawn(move || {
        for stream in listener.incoming() {
            if accepted_sender.send(stream).is_err() {
                break;
            }
        }
    });

    // Connect at a steady pace until a reconciliation has removed every orphan (the second to
    // find them orphaned: two intervals away, or three if one ran during the inserts), and a
    // little longer: its reads then had
    // connections made all through them. `gone(step)`: every `step`-th orphan is gone; a
    // sample is checked as it goes, all of them before stopping.
    let gone = |step: usize| {
        (0..ORPHANS)
            .step_by(step)
            .all(|fd| sockets.get(&orphan_key(fd), 0).is_err())
    };
    let mut clients = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut reconciled_at = None;
    while clients.len() < max_connections && Instant::now() < deadline {
        clients.push(TcpStream::connect(("127.0.0.1", port)).expect("connect"));
        thread::sleep(PACE);
        if reconciled_at.is_none()
            && clients.len().is_multiple_of(25)
            && gone(ORPHANS as usize / 16)
            && gone(1)
        {
            reconciled_at = Some(clients.len());
        }
        if reconciled_at.is_some_and(|at| clients.len() >= at + 200) {
            break;
        }
    }
    let reconciled_at = reconciled_at.unwrap_or_else(|| {
        panic!(
            "no reconciliation removed the orphans within {} connections",
            clients.len()
        )
    });
    let server_ends: Vec<TcpStream> = (0..clients.len())
        .map(|_| accepted.recv().expect("accepted").expect("accept"))
        .collect();

    let tags: Vec<String> = (0..clients.len())
        .map(|index| format!("tag-{index:06}"))
        .collect();
    for (client, tag) in clients.iter_mut().zip(&tags) {
        client.write_all(tag.as_bytes()).expect("write a tag");
    }
    let mut captured = std::collections::HashSet::new();
    observer.wait_for(|line| {
        if line["kind"] == "data"
            && line["dport"] == u64::from(port)
            && let Some(payload) = line["payload_b64"].as_str()
            && let Ok(bytes) = BASE64.decode(payload)
        {
            captured.insert(String::from_utf8_lossy(&bytes).into_owned());
        }
        captured.len() == tags.len()
    });
    drop((clients, server_ends));
    let (_, stderr) = observer.stop();
    let missed: Vec<&String> = tags.iter().filter(|tag| !captured.contains(*tag)).collect();
    report(&format!(
        "reconciliation over {ORPHANS} orphans ran by connection {reconciled_at} of {}; {} tags \
        missed",
        tags.len(),
        missed.len()
    ));
    assert!(
        missed.is_empty(),
        "{} of {} connections were unwatched (first: {:?}); {}",
        missed.len(),
        tags.len(),
        missed.first(),
        stopped_line(&stderr)["kernel"]
    );
}

/// Raises this process's descriptor limit to at least 65,536, or to its hard limit where that
/// cannot be raised (the tests that hold thousands of connections need more than the usual soft
/// 1,024); returns the limit now in force.
fn raise_descriptor_limit() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the one struct we pass.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        // Root may raise the hard limit too (a guest kernel's init starts at 4,096).
        let wanted = libc::rlimit {
            rlim_cur: limit.rlim_max.max(1 << 16),
            rlim_max: limit.rlim_max.max(1 << 16),
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) != 0 {
            limit.rlim_cur = limit.rlim_max;
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
        }
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
    }
    usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
}
