use super::*;

const REQUEST: &str = "GET /?sendID=3355700821&token=eyJhbGciOiJIUzI1NiJ9.e30.sig&platformID=2\
        &operationID=op%2D1&isBackground=false&compression=gzip HTTP/1.1\r\n\
        Host: im-openim-msggateway-0.im-openim-msggateway-headless.ns.svc.cluster.local\r\n\
        Upgrade: websocket\r\nConnection: Upgrade\r\nAuthorization: Bearer secret\r\n\
        Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

fn expected_request() -> WebSocketFact {
    WebSocketFact::UpgradeRequest(UpgradeRequest {
        method: "GET".into(),
        path: "/".into(),
        send_id: Some("3355700821".into()),
        platform_id: Some(2),
        is_background: Some(false),
        operation_id: Some("op-1".into()),
        host: Some(
            "im-openim-msggateway-0.im-openim-msggateway-headless.ns.svc.cluster.local".into(),
        ),
        upgrade: Some("websocket".into()),
        connection: Some("Upgrade".into()),
    })
}

#[test]
fn parses_the_upgrade_request_split_anywhere() {
    let bytes = REQUEST.as_bytes();
    for split in 0..bytes.len() {
        let mut decoder = WebSocketDecoder::new(Limits::default());
        let first = decoder.feed(Direction::Send, 0, &bytes[..split]);
        let second = decoder.feed(Direction::Send, split as u64, &bytes[split..]);
        assert_eq!(first, None, "split {split}");
        let fact = second.unwrap();
        assert_eq!(fact, expected_request());
        let debug = format!("{fact:?}");
        assert!(!debug.contains("eyJ") && !debug.contains("secret"));
    }
}

#[test]
fn parses_the_response_and_reports_errors() {
    let mut decoder = WebSocketDecoder::new(Limits::default());
    let answer = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n";
    assert_eq!(decoder.feed(Direction::Recv, 0, &answer[..10]), None);
    assert_eq!(
        decoder.feed(Direction::Recv, 10, &answer[10..]),
        Some(WebSocketFact::UpgradeResponse { status: 101 })
    );
    assert_eq!(
        decoder.feed(Direction::Recv, answer.len() as u64, b"junk"),
        None
    );

    let mut decoder = WebSocketDecoder::new(Limits::default());
    assert_eq!(
        decoder.feed(Direction::Send, 5, b"GET / HTTP/1.1\r\n\r\n"),
        Some(WebSocketFact::Undecodable {
            direction: Direction::Send,
            reason: Http1Error::JoinedMidStream(5)
        })
    );
    // The gRPC port's answer to an HTTP/1.1 request is not HTTP/1.1.
    let mut decoder = WebSocketDecoder::new(Limits::default());
    let fact = decoder.feed(Direction::Recv, 0, b"\x00\x00\x12\x04\x00\x00\x00\x00\x00");
    assert!(matches!(
        fact,
        Some(WebSocketFact::Undecodable {
            reason: Http1Error::Parse(_),
            ..
        })
    ));
    assert_eq!(decoder.counters().http1_failures, 1);

    let mut decoder = WebSocketDecoder::new(Limits {
        max_http1_head_bytes: 8,
        ..Limits::default()
    });
    assert!(matches!(
        decoder.feed(Direction::Send, 0, b"GET / HTTP/1.1\r\n"),
        Some(WebSocketFact::Undecodable {
            reason: Http1Error::HeadTooLarge(8),
            ..
        })
    ));
}

/// The upgrade request a proxy sends with `query`.
fn upgrade_with(query: &str) -> UpgradeRequest {
    let head = format!("GET /?{query} HTTP/1.1\r\nHost: gw-0\r\n\r\n");
    match parse_request(head.as_bytes()) {
        Ok(Some(WebSocketFact::UpgradeRequest(upgrade))) => upgrade,
        other => panic!("{query}: {other:?}"),
    }
}

fn read(query: &str) -> (Option<String>, Option<i32>, Option<bool>, Option<String>) {
    let upgrade = upgrade_with(query);
    (
        upgrade.send_id,
        upgrade.platform_id,
        upgrade.is_background,
        upgrade.operation_id,
    )
}

#[test]
fn the_first_value_of_a_repeated_key_wins_as_in_go() {
    assert_eq!(
        read("sendID=1&platformID=2&sendID=3&platformID=5&isBackground=true&isBackground=0"),
        (Some("1".into()), Some(2), Some(true), None)
    );
    // A key without `=` is the empty value, and is the first.
    assert_eq!(read("sendID&sendID=7").0, Some(String::new()));
    // An empty pair is skipped.
    assert_eq!(read("&&sendID=7&").0, Some("7".into()));
    // A first value Go cannot parse still wins: the gateway rejects the upgrade.
    assert_eq!(read("platformID=x&platformID=2").1, None);
}

#[test]
fn keys_and_values_are_percent_decoded() {
    assert_eq!(
        read("send%49D=4%32&platform%49D=%35&is%42ackground=%74&operation%49D=a+b%2Bc"),
        (Some("42".into()), Some(5), Some(true), Some("a b+c".into()))
    );
    // An encoded key is the same key: the first of the two still wins.
    assert_eq!(read("send%49D=1&sendID=2").0, Some("1".into()));
    assert_eq!(read("sendID=a%2fb%2F").0, Some("a/b/".into()));
    assert_eq!(read("send+ID=1").0, None, "'+' is a space in keys too");
}

#[test]
fn a_pair_with_a_bad_escape_is_dropped_and_the_rest_kept() {
    for bad in ["%zz", "%4", "%", "1%g0", "%%41"] {
        assert_eq!(
            read(&format!("sendID={bad}&platformID=2&sendID=9")),
            (Some("9".into()), Some(2), None, None),
            "{bad}"
        );
    }
    // A bad escape in the key drops the pair too.
    assert_eq!(read("send%4ID=1&sendID=2").0, Some("2".into()));
    assert_eq!(read("sendID=1&token=%zz&platformID=3").1, Some(3));
}

#[test]
fn a_pair_with_a_semicolon_is_dropped_as_since_go_1_17() {
    assert_eq!(
        read("sendID=1;platformID=2&platformID=3&sendID=4"),
        (Some("4".into()), Some(3), None, None)
    );
    assert_eq!(read("sendID=1&x;=y").0, Some("1".into()));
    // An encoded `;` is only a character.
    assert_eq!(read("sendID=1%3B2").0, Some("1;2".into()));
}

#[test]
fn is_background_reads_as_go_parse_bool() {
    for yes in ["1", "t", "T", "TRUE", "true", "True"] {
        assert_eq!(read(&format!("isBackground={yes}")).2, Some(true), "{yes}");
    }
    for no in ["0", "f", "F", "FALSE", "false", "False"] {
        assert_eq!(read(&format!("isBackground={no}")).2, Some(false), "{no}");
    }
    // `+` is a space: " true" is not a boolean.
    for error in ["", "yes", "tRUE", "2", "+true", "true%20"] {
        assert_eq!(read(&format!("isBackground={error}")).2, None, "{error:?}");
    }
}

#[test]
fn platform_id_reads_as_go_atoi() {
    for (text, id) in [
        ("2", Some(2)),
        ("%2B5", Some(5)),
        ("-1", Some(-1)),
        ("007", Some(7)),
    ] {
        assert_eq!(read(&format!("platformID={text}")).1, id, "{text}");
    }
    // `+5` is " 5" once decoded.
    for error in ["", "2.0", "0x2", "+5", "2+", "99999999999"] {
        assert_eq!(read(&format!("platformID={error}")).1, None, "{error:?}");
    }
}

#[test]
fn the_query_ends_at_a_fragment() {
    assert_eq!(read("sendID=1#&sendID=2").0, Some("1".into()));
    assert_eq!(upgrade_with("sendID=1").path, "/");
}

#[test]
fn garbage_never_panics() {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..2000 {
        let mut decoder = WebSocketDecoder::new(Limits::default());
        let mut offset = 0u64;
        for _ in 0..4 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let len = (state % 64) as usize;
            let chunk: Vec<u8> = (0..len)
                .map(|i| {
                    let alphabet = b"GET /?&=token HTTP/1.1\r\n:Cookie%2";
                    alphabet[((state >> (i % 56)) as usize + i) % alphabet.len()]
                })
                .collect();
            let direction = if state & 1 == 0 {
                Direction::Send
            } else {
                Direction::Recv
            };
            decoder.feed(direction, offset, &chunk);
            offset += chunk.len() as u64;
            redact_secrets(&mut chunk.clone());
        }
    }
}
