use super::*;

/// A file under the system temp folder, removed when the test ends.
struct TempFile(PathBuf);

impl TempFile {
    fn with_text(name: &str, text: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("observer-tools-{}-{name}", std::process::id()));
        fs::write(&path, text).expect("temp folder is writable");
        Self(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

fn deployment(replicas: usize) -> DeploymentArgs {
    DeploymentArgs {
        replicas,
        instance: "demo".to_owned(),
        namespace: "chat".to_owned(),
        proxy_template: PROXY_MEMBER_TEMPLATE.to_owned(),
        push_template: PUSH_MEMBER_TEMPLATE.to_owned(),
    }
}

fn audit(deployment: DeploymentArgs, json: bool) -> AuditArgs {
    AuditArgs {
        deployment,
        users_file: None,
        sample: 2_000,
        json,
    }
}

fn output_of(run: impl FnOnce(&mut Vec<u8>) -> Result<(), ToolError>) -> String {
    let mut out = Vec::new();
    run(&mut out).expect("the tool succeeds");
    String::from_utf8(out).expect("the tools print UTF-8")
}

fn error_of(run: impl FnOnce(&mut Vec<u8>) -> Result<(), ToolError>) -> String {
    run(&mut Vec::new())
        .expect_err("the tool refuses")
        .to_string()
}

#[test]
fn ring_prints_one_user_member_object_per_user() {
    let members = TempFile::with_text("ring-members", "gw-a\r\n\n  \ngw-b  \ngw-c\n");
    let users = TempFile::with_text("ring-users", "3355700821\n\nuser_7\r\n12877\n");
    let args = RingArgs {
        members_file: members.0.clone(),
        users_file: Some(users.0.clone()),
    };
    let output = output_of(|out| args.run(out));

    let ring = Ring::new(["gw-a", "gw-b", "gw-c"]);
    let lines: Vec<&str> = output.lines().collect();
    assert_eq!(lines.len(), 3);
    for (line, user) in lines.iter().zip(["3355700821", "user_7", "12877"]) {
        let expected = serde_json::json!({"user": user, "member": ring.get(user).unwrap()});
        let actual: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(actual, expected, "{line}");
    }
}

#[test]
fn ring_names_the_file_it_cannot_use() {
    let missing = RingArgs {
        members_file: PathBuf::from("/nonexistent/members.txt"),
        users_file: None,
    };
    let message = error_of(|out| missing.run(out));
    assert!(
        message.starts_with("cannot read /nonexistent/members.txt: "),
        "{message}"
    );

    let blank = TempFile::with_text("ring-blank", "\n  \r\n");
    let no_members = RingArgs {
        members_file: blank.0.clone(),
        users_file: None,
    };
    let message = error_of(|out| no_members.run(out));
    assert!(message.contains("lists no members"), "{message}");

    let members = TempFile::with_text("ring-one", "gw-a\n");
    let missing_users = RingArgs {
        members_file: members.0.clone(),
        users_file: Some(PathBuf::from("/nonexistent/users.txt")),
    };
    let message = error_of(|out| missing_users.run(out));
    assert!(message.contains("/nonexistent/users.txt"), "{message}");
}

#[test]
fn audit_table_has_a_row_per_replica_count_and_says_why() {
    let output = output_of(|out| audit(deployment(4), false).run(out));
    let lines: Vec<&str> = output.lines().collect();
    assert_eq!(lines.len(), 7, "{output}");
    assert!(lines[0].contains("2000 synthetic"), "{output}");
    assert_eq!(lines[1], "replicas  users split   share");
    assert_eq!(lines[2], "       1            0    0.0%");
    for (row, replicas) in lines[2..6].iter().zip(1..) {
        assert!(row.starts_with(&format!("{replicas:>8}  ")), "{row}");
        assert_eq!(row.len(), lines[1].len(), "{row}");
    }
    assert!(
        lines[6].starts_with("Why: push members carry ':88', proxy members do not;"),
        "{output}"
    );
}

#[test]
fn audit_json_matches_the_rings() {
    let users = TempFile::with_text("audit-users", "3355700821\n12877\nuser_7\n39365\n");
    let mut args = audit(deployment(3), true);
    args.users_file = Some(users.0.clone());
    let output = output_of(|out| args.run(out));

    let ids = ["3355700821", "12877", "user_7", "39365"];
    let lines: Vec<&str> = output.lines().collect();
    assert_eq!(lines.len(), 3);
    for (line, replicas) in lines.iter().zip(1..) {
        let proxy = Ring::new(
            MemberTemplate::parse(PROXY_MEMBER_TEMPLATE)
                .unwrap()
                .members("demo", "chat", replicas),
        );
        let push = Ring::new(
            MemberTemplate::parse(PUSH_MEMBER_TEMPLATE)
                .unwrap()
                .members("demo", "chat", replicas),
        );
        let split = ids
            .iter()
            .filter(|id| proxy.get_index(id).unwrap() != push.get_index(id).unwrap())
            .count();
        let expected = serde_json::json!({
            "replicas": replicas,
            "users": 4,
            "split": split,
            "share": split as f64 / 4.0,
        });
        let actual: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(actual, expected, "{line}");
    }
}

#[test]
fn audit_of_matching_spellings_splits_nobody() {
    let mut same = deployment(5);
    same.proxy_template = PUSH_MEMBER_TEMPLATE.to_owned();
    let output = output_of(|out| audit(same, true).run(out));
    for line in output.lines() {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(row["split"], 0, "{line}");
    }
}

#[test]
fn audit_and_explain_refuse_bad_settings_with_one_clear_message() {
    assert_eq!(
        error_of(|out| audit(deployment(0), false).run(out)),
        "--replicas must be 1..=1024: OpenIM runs one msggateway or more"
    );
    let mut empty_sample = audit(deployment(2), false);
    empty_sample.sample = 0;
    assert_eq!(
        error_of(|out| empty_sample.run(out)),
        "--sample must be 1..=1000000"
    );
    let mut bad_push = deployment(2);
    bad_push.push_template = "gw.{namespace}:88".to_owned();
    assert_eq!(
        error_of(|out| audit(bad_push, false).run(out)),
        "bad --push-template: member template \"gw.{namespace}:88\" is missing the {i} placeholder"
    );
    let no_users = TempFile::with_text("audit-no-users", "\n");
    let mut args = audit(deployment(2), false);
    args.users_file = Some(no_users.0.clone());
    assert!(
        error_of(|out| args.run(out))
            .ends_with("lists no user ids (expected one user id per line)")
    );

    let mut bad_proxy = deployment(2);
    bad_proxy.proxy_template = "gw-{i}.{ns}".to_owned();
    let explain = ExplainArgs {
        user: "1".to_owned(),
        deployment: bad_proxy,
        json: false,
    };
    assert!(error_of(|out| explain.run(out)).starts_with("bad --proxy-template: "));
}

#[test]
fn explain_shows_both_picks_and_why_they_differ() {
    let proxy = Ring::new(
        MemberTemplate::parse(PROXY_MEMBER_TEMPLATE)
            .unwrap()
            .members("demo", "chat", 3),
    );
    let push = Ring::new(
        MemberTemplate::parse(PUSH_MEMBER_TEMPLATE)
            .unwrap()
            .members("demo", "chat", 3),
    );
    let users = sample_user_ids(100);
    let gateways = |user: &str| {
        (
            proxy.get_index(user).unwrap(),
            push.get_index(user).unwrap(),
        )
    };
    let split_user = users
        .iter()
        .find(|user| gateways(user).0 != gateways(user).1)
        .unwrap();
    let agreeing_user = users
        .iter()
        .find(|user| gateways(user).0 == gateways(user).1)
        .unwrap();

    let explain = |user: &str, json| ExplainArgs {
        user: user.to_owned(),
        deployment: deployment(3),
        json,
    };
    let text = output_of(|out| explain(split_user, false).run(out));
    let (proxy_gateway, push_gateway) = gateways(split_user);
    assert!(
        text.contains(&format!(
            "picks gateway {proxy_gateway}: {}",
            proxy.members()[proxy_gateway]
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "picks gateway {push_gateway}: {}",
            push.members()[push_gateway]
        )),
        "{text}"
    );
    assert!(text.contains("They disagree"), "{text}");
    assert!(
        text.contains("push members carry ':88', proxy members do not"),
        "{text}"
    );

    let text = output_of(|out| explain(agreeing_user, false).run(out));
    assert!(text.contains("They agree"), "{text}");
    assert!(text.contains("by chance"), "{text}");

    let json = output_of(|out| explain(split_user, true).run(out));
    let explanation: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(explanation["user"], split_user.as_str());
    assert_eq!(explanation["agree"], false);
    assert_eq!(explanation["proxy"]["gateway"], proxy_gateway);
    assert_eq!(
        explanation["push"]["member"],
        push.members()[push_gateway].as_str()
    );
    assert_eq!(
        explanation["difference"],
        "push members carry ':88', proxy members do not"
    );
}
