use super::*;

#[test]
fn an_adopted_connections_requests_are_zeroed_whole() {
    let mut lines = PrivateLines::new(4);
    let request = b"\0\0\x05\0\x01\0\0\0\x03private message body";
    let mut event = sample(EventKind::Data {
        direction: Direction::Send,
        offset: 0,
        call_len: request.len() as u64,
        truncated: false,
        payload: Bytes::from_static(request),
    });
    event.port_class = PortClass::Grpc;
    event.connection = observer_records::adopted_connection_id(99);
    let line = lines.line(&event);
    let value: serde_json::Value = serde_json::from_str(&line).unwrap();
    let payload = BASE64
        .decode_to_vec(value["payload_b64"].as_str().unwrap())
        .unwrap();
    assert_eq!(payload, vec![0; request.len()]);
}

/// A data event of the payload `abc` (`YWJj` in base64), as its line.
fn abc_line() -> String {
    to_json_line(&sample(EventKind::Data {
        direction: Direction::Send,
        offset: 0,
        call_len: 3,
        truncated: false,
        payload: Bytes::from_static(b"abc"),
    }))
}

fn sample(kind: EventKind) -> Event {
    Event {
        ts_ns: 1_764_500_000_123_456_789,
        connection: 0xffff_8880_1234_5678,
        pid: 4242,
        comm: "openim-push".into(),
        cgroup_id: 7,
        saddr: "10.244.0.9".parse().unwrap(),
        sport: 40000,
        daddr: "fd00::1".parse().unwrap(),
        dport: 88,
        port_class: PortClass::Grpc,
        kind,
    }
}

#[test]
fn every_kind_round_trips() {
    for kind in [
        EventKind::TcpConnect,
        EventKind::TcpState {
            old: TcpState::SynSent,
            new: TcpState::Established,
        },
        EventKind::Data {
            direction: Direction::Recv,
            offset: 4096,
            call_len: 9000,
            truncated: true,
            payload: Bytes::from_static(b"\x00\x01PRI * HTTP/2.0"),
        },
        EventKind::Close,
    ] {
        let event = sample(kind);
        let line = to_json_line(&event);
        assert!(plain::read(&line).is_some(), "not plain: {line}");
        assert_eq!(from_json_line(&line, 1).unwrap(), event, "{line}");
        assert_eq!(from_json_line_by_serde(&line, 1).unwrap(), event, "{line}");
    }
}

/// Lines as other tools may write them, or broken: each reads (or fails) as serde_json
/// alone reads it, whether the plain reader takes it or leaves it.
#[test]
fn every_line_reads_as_serde_json_reads_it() {
    let line = abc_line();
    let with = |from: &str, to: &str| {
        assert!(line.contains(from), "{from} not in {line}");
        line.replacen(from, to, 1)
    };
    let ts = line
        .split(r#""ts":""#)
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    let variants = [
        (
            with(r#""kind":"data","#, "").replacen('}', r#","kind":"data"}"#, 1),
            true,
        ),
        (with("{", "{ "), false),
        (format!("{line} "), false),
        (with("{", r#"{"extra":[1,{"a":null}],"#), false),
        (with(r#""truncated":false"#, r#""truncated":null"#), false),
        (with("{", r#"{"pid":1,"#), false),
        (with(r#""ts":""#, r#""ts":"x","ts":""#), true),
        (with(&format!(r#""ts":"{ts}""#), r#""ts":1"#), false),
        (with(r#""pid":4242"#, r#""pid":04242"#), false),
        (with(r#""pid":4242"#, r#""pid":4242.0"#), false),
        (with(r#""pid":4242"#, r#""pid":4e3"#), false),
        (with(r#""sport":40000"#, r#""sport":-1"#), false),
        (with(r#""dport":88"#, r#""dport":65536"#), false),
        (with(r#""pid":4242"#, r#""pid":4294967296"#), false),
        (
            with(r#""cgroup_id":7"#, r#""cgroup_id":18446744073709551616"#),
            false,
        ),
        (with(r#""pid":4242,"#, ""), false),
        (with(r#""kind":"data""#, r#""kind":"other""#), false),
        (with(r#""comm":"openim"#, "\"comm\":\"open\u{1}im"), false),
        (
            with(r#""saddr":"10.244.0.9""#, r#""saddr":"10.244.0.999""#),
            false,
        ),
        (with(r#""truncated":false"#, r#""truncated":fals"#), false),
        (
            with(r#""payload_b64":"YWJj""#, r#""payload_b64":"YW\u004aj""#),
            false,
        ),
        (
            with(r#""payload_b64":"YWJj""#, "\"payload_b64\":\"YW\u{1}Jj\""),
            true,
        ),
        (line[..line.len() - 1].to_owned(), false),
    ];
    let text = |result: Result<Event, RecordingError>| result.map_err(|err| err.to_string());
    for (variant, plain) in variants {
        assert_eq!(plain::read(&variant).is_some(), plain, "{variant}");
        assert_eq!(
            text(from_json_line(&variant, 1)),
            text(from_json_line_by_serde(&variant, 1)),
            "{variant}"
        );
    }
}

/// The text fields borrow from a line as this module writes it; a line another tool
/// rewrote with escapes (`\/`, `\u0041`) reads the same.
#[test]
fn escaped_text_fields_read_as_plain_ones() {
    let event = sample(EventKind::Data {
        direction: Direction::Send,
        offset: 0,
        call_len: 3,
        truncated: false,
        payload: Bytes::from_static(&[0xfb, 0xff]),
    });
    let line = to_json_line(&event);
    assert!(line.contains(r#""payload_b64":"+/8=""#), "{line}");
    let escaped = line
        .replace(r#""payload_b64":"+/8=""#, r#""payload_b64":"+\/8=""#)
        .replace(r#""comm":"o"#, r#""comm":"\u006f"#);
    assert_ne!(escaped, line);
    assert_eq!(from_json_line(&escaped, 1).unwrap(), event, "{escaped}");
}

#[test]
fn lines_carry_the_documented_fields() {
    let line = abc_line();
    let value: serde_json::Value = serde_json::from_str(&line).unwrap();
    for field in [
        "kind",
        "ts",
        "pid",
        "comm",
        "saddr",
        "sport",
        "daddr",
        "dport",
        "direction",
        "offset",
        "len",
        "truncated",
        "payload_b64",
    ] {
        assert!(value.get(field).is_some(), "{field} missing from {line}");
    }
    assert_eq!(value["kind"], "data");
    assert_eq!(value["direction"], "send");
    assert_eq!(value["payload_b64"], "YWJj");
    assert_eq!(value["ts"], "2025-11-30T10:53:20.123456Z");
}

#[test]
fn a_recording_is_private_and_new_unless_told() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cap.jsonl");
    create(&path, false).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    std::fs::write(&path, "earlier capture\n").unwrap();
    std::fs::set_permissions(&path, Permissions::from_mode(0o644)).unwrap();
    let refused = create(&path, false).unwrap_err();
    assert!(
        matches!(refused, RecordingError::Exists { .. }),
        "{refused}"
    );
    assert!(refused.to_string().contains("--overwrite"), "{refused}");
    assert_eq!(std::fs::read(&path).unwrap(), b"earlier capture\n");

    create(&path, true).unwrap();
    let metadata = std::fs::metadata(&path).unwrap();
    assert_eq!(metadata.len(), 0);
    assert_eq!(metadata.permissions().mode() & 0o777, 0o600);
}

#[test]
fn a_recording_never_goes_through_a_symbolic_link() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let link = dir.path().join("cap.jsonl");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    for overwrite in [false, true] {
        let refused = create(&link, overwrite).unwrap_err();
        assert!(
            matches!(refused, RecordingError::NotARegularFile { .. }),
            "{refused}"
        );
    }
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious\n");
    // A dangling link would otherwise create its target.
    let dangling = dir.path().join("dangling");
    std::os::unix::fs::symlink(dir.path().join("created-through-link"), &dangling).unwrap();
    assert!(create(&dangling, true).is_err());
    assert!(!dir.path().join("created-through-link").exists());
}

#[test]
fn ipv4_mapped_addresses_are_read_back_as_ipv4() {
    let mut event = sample(EventKind::Close);
    event.saddr = "::ffff:10.244.0.9".parse().unwrap();
    event.daddr = "::ffff:10.244.0.10".parse().unwrap();
    let read = from_json_line(&to_json_line(&event), 1).unwrap();
    assert_eq!(read.saddr, "10.244.0.9".parse::<IpAddr>().unwrap());
    assert_eq!(read.daddr, "10.244.0.10".parse::<IpAddr>().unwrap());
}

#[test]
fn junk_is_one_clear_error() {
    let err = from_json_line("{\"kind\":\"data\"}", 3).unwrap_err();
    assert!(err.to_string().starts_with("line 3: not an observer event"));
    // Payload text is read as bytes, unchecked as UTF-8: the decoder is what refuses
    // anything but base64, a control character or a raw non-ASCII byte included.
    let line = abc_line();
    for junk in [
        r"YW\u0001j",
        r"YW\u00e9j",
        r#"YW\"j"#,
        "YW\u{e9}j",
        "YWJj=",
        "not base64",
    ] {
        let bad = line.replace("YWJj", junk);
        let err = from_json_line(&bad, 7).unwrap_err();
        assert!(
            err.to_string().starts_with("line 7: not an observer event"),
            "{bad}: {err}"
        );
    }
    let err = from_json_line(&line.replace("YWJj", "YW-j"), 7).unwrap_err();
    assert_eq!(
        err.to_string(),
        "line 7: not an observer event (payload_b64 is not base64)"
    );
}
