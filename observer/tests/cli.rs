//! The `observer` binary's edge: output on stdout, one-line errors on stderr with exit code 2.

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn observer(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_observer"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the observer binary starts");
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(stdin.as_bytes())
        .expect("observer reads its stdin");
    child.wait_with_output().expect("observer finishes")
}

#[test]
fn ring_reads_user_ids_from_stdin() {
    let members = std::env::temp_dir().join(format!("observer-cli-{}-members", std::process::id()));
    std::fs::write(&members, "gw-0\ngw-1\n").expect("temp folder is writable");
    let output = observer(
        &[
            "ring",
            "--members-file",
            members.to_str().expect("UTF-8 temp path"),
        ],
        "3355700821\n\n12877\n",
    );
    let _ = std::fs::remove_file(&members);

    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).expect("UTF-8 output");
    let users: Vec<String> = stdout
        .lines()
        .map(|line| {
            let pick: serde_json::Value = serde_json::from_str(line).expect("JSON lines");
            assert!(
                pick["member"]
                    .as_str()
                    .is_some_and(|member| member.starts_with("gw-"))
            );
            pick["user"].as_str().expect("user is a string").to_owned()
        })
        .collect();
    assert_eq!(users, ["3355700821", "12877"]);
}

#[test]
fn user_errors_are_one_line_on_stderr_with_exit_code_2() {
    let output = observer(
        &[
            "audit",
            "--replicas",
            "0",
            "--instance",
            "demo",
            "--namespace",
            "chat",
        ],
        "",
    );
    assert_eq!(output.status.code(), Some(2));
    assert!(output.stdout.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "observer: invalid value '0' for '--replicas <N>': 0 is not in 1..=1024\n"
    );
}

#[test]
fn explain_prints_both_picks() {
    let output = observer(
        &[
            "explain",
            "--user",
            "3355700821",
            "--replicas",
            "3",
            "--instance",
            "demo",
            "--namespace",
            "chat",
        ],
        "",
    );
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("proxy (WebSocket placement) picks gateway"),
        "{stdout}"
    );
    assert!(
        stdout.contains("push  (online delivery)     picks gateway"),
        "{stdout}"
    );
}

/// A capture from an earlier run, which a refused or failed start must leave as it was.
fn earlier_recording(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let path = dir.path().join("cap.jsonl");
    std::fs::write(&path, "earlier capture\n").expect("temp folder is writable");
    path
}

fn assert_one_line_exit_2(output: &Output, expected: &str) {
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(expected), "{stderr}");
}

#[test]
fn record_refuses_an_existing_file_unless_told() {
    let dir = tempfile::tempdir().unwrap();
    let path = earlier_recording(&dir);
    let output = observer(&["run", "--record", path.to_str().unwrap()], "");
    assert_one_line_exit_2(&output, "already exists (pass --overwrite to replace it)");
    assert_eq!(std::fs::read(&path).unwrap(), b"earlier capture\n");
}

#[test]
fn record_never_writes_through_a_symbolic_link() {
    let dir = tempfile::tempdir().unwrap();
    let victim = earlier_recording(&dir);
    let link = dir.path().join("link.jsonl");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    for extra in [&[][..], &["--overwrite"][..]] {
        let mut args = vec!["run", "--record", link.to_str().unwrap()];
        args.extend_from_slice(extra);
        let output = observer(&args, "");
        assert_one_line_exit_2(&output, "is a symbolic link or not a regular file");
    }
    assert_eq!(std::fs::read(&victim).unwrap(), b"earlier capture\n");
}

#[test]
fn a_start_that_fails_leaves_the_recording_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = earlier_recording(&dir);
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy_addr = busy.local_addr().unwrap().to_string();
    let output = observer(
        &[
            "run",
            "--record",
            path.to_str().unwrap(),
            "--overwrite",
            "--metrics-addr",
            &busy_addr,
        ],
        "",
    );
    assert_one_line_exit_2(&output, &format!("cannot serve metrics on {busy_addr}"));
    assert_eq!(std::fs::read(&path).unwrap(), b"earlier capture\n");
}

#[test]
fn overwrite_needs_record() {
    let output = observer(&["run", "--overwrite"], "");
    assert_one_line_exit_2(&output, "--record");
}

/// Runs the observer with a bounded address space and wall time: a tool that reads without
/// bound fails the allocation (or the clock) instead of the machine.
fn bounded_observer(args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_observer"));
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit only, between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            let limit = libc::rlimit {
                rlim_cur: 1 << 30,
                rlim_max: 1 << 30,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let cpu = libc::rlimit {
                rlim_cur: 20,
                rlim_max: 20,
            };
            if libc::setrlimit(libc::RLIMIT_CPU, &cpu) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.output().expect("the observer binary starts")
}

const DEPLOYMENT: [&str; 4] = ["--instance", "demo", "--namespace", "chat"];

#[test]
fn replay_of_an_endless_line_stops_at_the_line_bound() {
    let output = bounded_observer(&["replay", "/dev/zero"]);
    assert_one_line_exit_2(&output, "/dev/zero: line 1 is longer than 65536 bytes");
}

#[test]
fn ring_and_audit_bound_the_lines_they_read() {
    let dir = tempfile::tempdir().unwrap();
    let members = dir.path().join("members");
    std::fs::write(&members, "gw-0\ngw-1\n").unwrap();
    let members = members.to_str().unwrap();
    for args in [
        &["ring", "--members-file", "/dev/zero"][..],
        &[
            "ring",
            "--members-file",
            members,
            "--users-file",
            "/dev/zero",
        ][..],
    ] {
        let output = bounded_observer(args);
        assert_one_line_exit_2(&output, "/dev/zero: line 1 is longer than 512 bytes");
    }
    let mut audit = vec!["audit", "--replicas", "2", "--users-file", "/dev/zero"];
    audit.extend(DEPLOYMENT);
    assert_one_line_exit_2(
        &bounded_observer(&audit),
        "/dev/zero: line 1 is longer than 512 bytes",
    );

    let many = dir.path().join("many-members");
    let text: String = (0..10_001).map(|i| format!("gw-{i}\n")).collect();
    std::fs::write(&many, text).unwrap();
    let output = bounded_observer(&["ring", "--members-file", many.to_str().unwrap()]);
    assert_one_line_exit_2(&output, "lists more than 10000 entries");
}

#[test]
fn ring_from_standard_input_bounds_the_line_too() {
    let dir = tempfile::tempdir().unwrap();
    let members = dir.path().join("members");
    std::fs::write(&members, "gw-0\n").unwrap();
    let output = observer(
        &["ring", "--members-file", members.to_str().unwrap()],
        &"7".repeat(4096),
    );
    assert_one_line_exit_2(
        &output,
        "cannot read user ids from standard input: line 1 is longer than 512 bytes",
    );
}

#[test]
fn numbers_out_of_range_are_one_line_usage_errors() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["audit", "--replicas", "18446744073709551615"],
            "'--replicas <N>': 18446744073709551615 is not in 1..=1024",
        ),
        (
            &["audit", "--replicas", "99999999999999999999999"],
            "'--replicas <N>'",
        ),
        (
            &["audit", "--replicas", "3", "--sample", "1099511627776"],
            "'--sample <K>': 1099511627776 is not in 1..=1000000",
        ),
        (
            &["audit", "--replicas", "3", "--sample", "0"],
            "'--sample <K>': 0 is not in 1..=1000000",
        ),
        (
            &["explain", "--user", "1", "--replicas", "1000000000"],
            "'--replicas <N>': 1000000000 is not in 1..=1024",
        ),
    ];
    for (args, expected) in cases {
        let mut args = args.to_vec();
        args.extend(DEPLOYMENT);
        assert_one_line_exit_2(&bounded_observer(&args), expected);
    }
    for flag in [
        "--max-connections",
        "--max-users",
        "--max-buffered-bytes",
        "--fold-window",
    ] {
        let output = bounded_observer(&["replay", "/dev/null", flag, "18446744073709551615"]);
        assert_one_line_exit_2(&output, &format!("'{flag} <"));
    }
}

#[test]
fn the_largest_accepted_numbers_finish() {
    let mut explain = vec!["explain", "--user", "1", "--replicas", "1024"];
    explain.extend(DEPLOYMENT);
    let output = bounded_observer(&explain);
    assert!(output.status.success(), "{output:?}");
}

#[test]
fn a_capture_cut_mid_line_still_prints_the_alerts_of_the_lines_before() {
    // Any capture that raises an alert, then half a line: the alerts come out, then the error.
    let dir = tempfile::tempdir().unwrap();
    let capture = dir.path().join("cut.jsonl");
    use openim_test_kit::synthetic;
    let traffic = synthetic::generate(&synthetic::Scenario {
        gateways: 3,
        users: 20,
        push_calls: 5,
        recipients_per_call: 4,
        ..synthetic::Scenario::default()
    });
    assert!(traffic.misrouted_users > 0);
    let lines: Vec<String> = traffic
        .events
        .iter()
        .map(observer::capture::recording::to_json_line)
        .collect();
    // Fewer lines than replay's periodic flush: only a flush on the error prints the alerts.
    assert!(lines.len() < 1024, "{} lines", lines.len());
    let mut text = lines.join("\n");
    text.push('\n');
    text.push_str(&lines[0][..lines[0].len() / 2]);
    std::fs::write(&capture, text).unwrap();
    let output = bounded_observer(&["replay", capture.to_str().unwrap()]);
    assert_one_line_exit_2(&output, "not an observer event");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout
            .lines()
            .any(|line| line.contains("\"kind\":\"route_mismatch\"")),
        "{stdout}"
    );
}
