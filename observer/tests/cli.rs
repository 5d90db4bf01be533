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
