use super::*;
use crate::decode::{Limits, WebSocketDecoder, WebSocketFact};
use crate::model::Direction;

fn request(query: &str) -> Vec<u8> {
    format!("GET /?{query} HTTP/1.1\r\nHost: gw-0\r\nUpgrade: websocket\r\n\r\n").into_bytes()
}

fn filtered(head: &[u8], chunk_len: usize) -> Vec<u8> {
    let mut whitelist = Http1Whitelist::request();
    let mut out = head.to_vec();
    for chunk in out.chunks_mut(chunk_len) {
        whitelist.filter(chunk);
    }
    out
}

fn fact(head: &[u8]) -> Option<WebSocketFact> {
    WebSocketDecoder::new(Limits::default()).feed(Direction::Send, 0, head)
}

#[test]
fn only_the_values_the_decoder_reads_get_through() {
    for (query, kept) in [
        (
            "sendID=u1&sendID=SECRET&token=SECRET",
            "sendID=u1&sendID=******&token=******",
        ),
        ("sendID&sendID=SECRET", "sendID&sendID=******"),
        ("sendID=%zzSECRET&sendID=u2", "sendID=%********&sendID=u2"),
        ("sendID=u1;SECRET&sendID=u2", "sendID=u1;******&sendID=u2"),
        ("send%49D=u1&sendID=SECRET", "send%49D=u1&sendID=******"),
        ("send%4ID=SECRET&sendID=u2", "send%4ID=******&sendID=u2"),
        (
            "%69%73%42%61%63%6B%67%72%6F%75%6E%64=1&isBackground=SECRET",
            "%69%73%42%61%63%6B%67%72%6F%75%6E%64=1&isBackground=******",
        ),
        ("platformID=5#SECRET", "platformID=5#******"),
    ] {
        let head = request(query);
        for chunk_len in [1, 3, head.len()] {
            let out = filtered(&head, chunk_len);
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&request(kept)),
                "{query} in chunks of {chunk_len}"
            );
            assert_eq!(fact(&out), fact(&head), "{query}");
        }
    }
}

/// Queries built from the pieces Go's parser treats specially read into the same facts
/// filtered and unfiltered.
#[test]
fn filtered_queries_read_into_the_same_facts() {
    const PIECES: [&str; 20] = [
        "sendID",
        "send%49D",
        "platformID",
        "isBackground",
        "operationID",
        "token",
        "=",
        "=",
        "&",
        "&",
        ";",
        "%",
        "%4",
        "%zz",
        "%41",
        "+",
        "1",
        "t",
        "x",
        "#",
    ];
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..20_000 {
        let mut query = String::new();
        for _ in 0..12 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            query.push_str(PIECES[(state % PIECES.len() as u64) as usize]);
        }
        let head = request(&query);
        let out = filtered(&head, 5);
        assert_eq!(fact(&out), fact(&head), "{query}");
    }
}
