//! Says whether a test that loads the observer's eBPF programs can run here, and how it skips.
//!
//! On a normal user's plain `cargo test` such tests skip and say why; under `cargo xtask test`,
//! which sets `OBSERVER_REQUIRE_EBPF`, they fail instead, so a CI that cannot load the programs
//! is red rather than silently green.

use std::io::Write;

/// Says why the observer cannot load its programs here: not root, or built without them.
pub fn kernel_unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root".to_owned());
    }
    programs_missing().map(str::to_owned)
}

/// Says why the observer has no programs to load: it was built without them.
pub fn programs_missing() -> Option<&'static str> {
    (!observer::capture::kernel::PROGRAMS_EMBEDDED).then_some(
        "the observer was built without its eBPF programs (build with `cargo xtask build`)",
    )
}

/// Says whether the calling test can start the observer with its programs here (root, programs
/// embedded). When it cannot, it says so (see [`skip`]) and the test should return early.
pub fn can_run() -> bool {
    match kernel_unavailable() {
        Some(reason) => skip(&reason),
        None => true,
    }
}

/// Says why the calling test cannot run and returns false, or panics under
/// `OBSERVER_REQUIRE_EBPF`. The line goes to stderr past the test harness's capture, so a
/// passing run shows it.
pub fn skip(reason: &str) -> bool {
    let test = caller_name();
    if std::env::var_os("OBSERVER_REQUIRE_EBPF").is_some() {
        panic!("{test} cannot run: {reason} (OBSERVER_REQUIRE_EBPF is set)");
    }
    let _ = writeln!(std::io::stderr(), "skipped {test}: {reason}");
    false
}

/// Names who is skipped: a test's thread bears the test's name; a harness-less bench runs on
/// `main`, so it is named after its executable, without the hash cargo appends
/// (`cluster-<16 hex>`).
fn caller_name() -> String {
    if let Some(name) = std::thread::current().name().filter(|name| *name != "main") {
        return name.to_owned();
    }
    let executable = std::env::current_exe().ok();
    let stem = executable
        .as_deref()
        .and_then(std::path::Path::file_stem)
        .and_then(|stem| stem.to_str())
        .unwrap_or("test");
    match stem.rsplit_once('-') {
        Some((name, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            name.to_owned()
        }
        _ => stem.to_owned(),
    }
}
