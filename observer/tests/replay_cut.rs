//! A recording cut mid-line (a crash or a full disk while `--record` writes) replays to every
//! alert of its valid part, then exits 2 with one line naming the cut line.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use openim_test_kit::synthetic;

/// The lines of a synthetic recording whose alerts include folded windows (a first line and a
/// closing line per window), more lines than replay's periodic flush.
fn recording_lines() -> Vec<String> {
    let traffic = synthetic::generate(&synthetic::Scenario {
        gateways: 3,
        users: 60,
        push_calls: 200,
        recipients_per_call: 6,
        ..synthetic::Scenario::default()
    });
    assert!(traffic.misrouted_users > 0);
    let lines: Vec<String> = traffic
        .events
        .iter()
        .map(observer::capture::recording::to_json_line)
        .collect();
    assert!(lines.len() > 2048, "{} lines", lines.len());
    lines
}

fn replay(path: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_observer"))
        .args(["replay", path.to_str().expect("UTF-8 temp path")])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("the observer binary starts")
}

/// The alert lines a replay printed, in order.
fn alerts(output: &Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

fn kinds(alerts: &[String]) -> Vec<String> {
    let mut kinds: Vec<String> = alerts
        .iter()
        .map(|line| {
            let alert: serde_json::Value = serde_json::from_str(line).expect("JSON alert lines");
            alert["kind"].as_str().unwrap_or_default().to_owned()
        })
        .collect();
    kinds.sort();
    kinds.dedup();
    kinds
}

#[test]
fn a_recording_cut_mid_line_replays_to_the_alerts_of_its_valid_part() {
    let dir = tempfile::tempdir().unwrap();
    let lines = recording_lines();
    // Cut inside a line early on, inside one past a periodic flush, and inside the last one;
    // each a few bytes in, halfway, and one byte short of the whole line.
    for full_lines in [700, 1500, lines.len() - 1] {
        let cut_line = &lines[full_lines];
        for cut_at in [1, cut_line.len() / 2, cut_line.len() - 1] {
            let mut valid = lines[..full_lines].join("\n");
            valid.push('\n');
            let whole = dir.path().join("valid.jsonl");
            std::fs::write(&whole, &valid).unwrap();
            let cut = dir.path().join("cut.jsonl");
            std::fs::write(&cut, format!("{valid}{}", &cut_line[..cut_at])).unwrap();

            let expected = replay(&whole);
            assert!(expected.status.success(), "{expected:?}");
            let actual = replay(&cut);
            assert_eq!(actual.status.code(), Some(2), "{actual:?}");
            let stderr = String::from_utf8_lossy(&actual.stderr);
            assert_eq!(stderr.lines().count(), 1, "{stderr}");
            let line = format!("line {}: not an observer event", full_lines + 1);
            assert!(stderr.contains(&line), "{line} not in {stderr}");

            let expected = alerts(&expected);
            assert!(!expected.is_empty(), "{full_lines} lines raise no alert");
            assert_eq!(
                alerts(&actual),
                expected,
                "cut {cut_at} bytes into line {}",
                full_lines + 1
            );
        }
    }
    let whole = dir.path().join("whole.jsonl");
    std::fs::write(&whole, lines.join("\n") + "\n").unwrap();
    let all = alerts(&replay(&whole));
    let kinds = kinds(&all);
    assert!(kinds.len() > 1, "{kinds:?}");
    // Windows close only when the replay finishes (the traffic is shorter than one).
    let closing = all
        .iter()
        .filter(|line| line.contains("\"window_secs\":") && !line.contains("\"window_secs\":0"))
        .count();
    assert!(closing > 0, "no closing line among {} alerts", all.len());
}
