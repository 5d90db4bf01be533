//! Helps the kernel tests with what they read out of `observer run --events`, and the sockets they
//! read it from.

use std::{
    io::Write,
    net::TcpListener,
    sync::{Mutex, MutexGuard},
};

use base64::{Engine, engine::general_purpose::STANDARD as BASE64};
use serde_json::Value;

/// Names the lock every kernel test of a test binary holds: they share kernel state (attached
/// programs), so they run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Takes the kernel tests' lock, one per test binary, also after a test failed holding it.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// Selects the records of connections to `port`.
pub fn events_on_port(lines: &[Value], port: u16) -> Vec<&Value> {
    lines
        .iter()
        .filter(|line| line["dport"] == u64::from(port))
        .collect()
}

/// Reassembles one direction of captured data, checking that chunks are in stream order.
pub fn captured_stream(lines: &[&Value], direction: &str) -> Vec<u8> {
    let mut bytes = Vec::new();
    for line in lines
        .iter()
        .filter(|line| line["kind"] == "data" && line["direction"] == direction)
    {
        let offset = line["offset"].as_u64().unwrap();
        assert_eq!(offset, bytes.len() as u64, "chunks out of order: {line}");
        let payload = BASE64
            .decode(line["payload_b64"].as_str().unwrap())
            .unwrap();
        assert_eq!(payload.len() as u64, line["len"].as_u64().unwrap());
        bytes.extend_from_slice(&payload);
    }
    bytes
}

/// Tells whether `line` is the last record of a watched connection to `port`: its
/// descriptor's close (syscall hook), or its socket's TCP_CLOSE (either hook; the only one with
/// the packet hook).
pub fn is_end_of(line: &Value, port: u16) -> bool {
    line["dport"] == port
        && (line["kind"] == "close"
            || (line["kind"] == "tcp_state" && line["new_state"] == "CLOSE"))
}

/// Returns bytes `0..len` of a pattern that shows any reordering or loss.
pub fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|index| ((index * 31 + seed * 7) % 251) as u8)
        .collect()
}

/// Listens on 127.0.0.1:`port`.
pub fn listen(port: u16) -> TcpListener {
    TcpListener::bind(("127.0.0.1", port)).unwrap_or_else(|err| panic!("bind {port}: {err}"))
}

/// Checks a raw syscall's return value, naming `what` failed and why.
pub fn check(ret: isize, what: &str) -> usize {
    assert!(ret >= 0, "{what}: {}", std::io::Error::last_os_error());
    ret as usize
}

/// Builds iovec entries over `parts`, one each.
pub fn iovecs(parts: &mut [&mut [u8]]) -> Vec<libc::iovec> {
    parts
        .iter_mut()
        .map(|part| libc::iovec {
            iov_base: part.as_mut_ptr().cast(),
            iov_len: part.len(),
        })
        .collect()
}

/// Builds a `msghdr` over `iov`, with no name and no control data.
pub fn msghdr(iov: &mut [libc::iovec]) -> libc::msghdr {
    // SAFETY: an all-zero msghdr is valid (no name, no control data).
    let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
    header.msg_iov = iov.as_mut_ptr();
    header.msg_iovlen = iov.len();
    header
}

/// Writes a line on stderr past the harness's capture: figures a passing run shows.
pub fn report(text: &str) {
    let _ = writeln!(std::io::stderr(), "{text}");
}

/// Returns the running kernel's major and minor version.
pub fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut numbers = release
        .split(|character: char| !character.is_ascii_digit())
        .map(|number| number.parse::<u32>().unwrap_or(0));
    (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0))
}

/// Returns `--capture-hook packets` at the root of `cgroups`.
pub fn packet_hook_args(cgroups: &crate::cgroup2::Cgroup2Mount) -> [String; 4] {
    [
        "--capture-hook".to_owned(),
        "packets".to_owned(),
        "--cgroup-root".to_owned(),
        cgroups.root().display().to_string(),
    ]
}

/// Checks the kernel's count of the programs' skipped runs (`recursion_misses`, Linux 5.12 on)
/// on the stop line's `kernel`: a number where the kernel keeps it, `null` (unknown) before.
pub fn skipped_runs_are_read_where_counted(kernel: &Value) {
    let skipped = &kernel["program_runs_skipped"];
    if kernel_version() < (5, 12) {
        assert!(skipped.is_null(), "{kernel}");
    } else {
        assert!(skipped.is_u64(), "{kernel}");
    }
}
