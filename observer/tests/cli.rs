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
        "observer: --replicas must be at least 1: OpenIM runs one msggateway or more\n"
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
