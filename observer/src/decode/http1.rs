//! The WebSocket upgrade from msggateway-proxy to a gateway (port 80): the HTTP/1.1 request
//! that places a user, and the gateway's answer.
//!
//! The request's query carries the user's `token` and may come with `Authorization` or `Cookie`
//! headers. They are credentials: `privacy::redact_secrets` overwrites them in captured bytes
//! and in what the decoder buffers, and the typed `UpgradeRequest` has no field that could hold
//! them.

use crate::{
    model::{Direction, wire},
    privacy::redact_secrets,
};

use super::{DecodeCounters, Limits};

/// Headers httparse may return; an upgrade request has about ten.
const MAX_HEADERS: usize = 64;

/// What the proxy asked for when it opened a user's WebSocket. Holds no credential.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpgradeRequest {
    pub method: String,
    /// The request target's path, without the query.
    pub path: String,
    pub send_id: Option<String>,
    pub platform_id: Option<i32>,
    pub is_background: Option<bool>,
    pub operation_id: Option<String>,
    pub host: Option<String>,
    pub upgrade: Option<String>,
    pub connection: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WebSocketFact {
    UpgradeRequest(UpgradeRequest),
    UpgradeResponse {
        status: u16,
    },
    Undecodable {
        direction: Direction,
        reason: Http1Error,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Http1Error {
    #[error("joined mid-stream: first captured byte at position {0}")]
    JoinedMidStream(u64),
    #[error("bytes missing at position {position} before the head was complete")]
    Gap { position: u64 },
    #[error("head longer than {0} bytes")]
    HeadTooLarge(usize),
    #[error("invalid HTTP/1.1: {0}")]
    Parse(String),
}

/// Decodes one proxy → gateway WebSocket connection: the first request head on the send side,
/// the first response head on the receive side. Later bytes are ignored.
#[derive(Clone)]
pub struct WebSocketDecoder {
    max_head_bytes: usize,
    send: HeadReader,
    recv: HeadReader,
    counters: DecodeCounters,
}

#[derive(Clone, Default)]
struct HeadReader {
    buffer: Vec<u8>,
    /// Stream position of the next byte expected; `None` before the first chunk.
    next_offset: Option<u64>,
    done: bool,
}

/// Shows progress and counters only: the buffers hold raw request bytes.
impl std::fmt::Debug for WebSocketDecoder {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("WebSocketDecoder")
            .field("request_done", &self.send.done)
            .field("response_done", &self.recv.done)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl WebSocketDecoder {
    pub fn new(limits: Limits) -> Self {
        Self {
            max_head_bytes: limits.max_http1_head_bytes,
            send: HeadReader::default(),
            recv: HeadReader::default(),
            counters: DecodeCounters::default(),
        }
    }

    /// Feeds one captured chunk that starts at stream position `offset` of `direction`; returns
    /// a fact once that direction's head is complete (or can't be). Chunks come as the capture
    /// layer hands them on, credentials redacted in each: a head whole in one chunk is parsed as
    /// it is, one joined from several is redacted again once joined (a token may straddle two).
    pub fn feed(
        &mut self,
        direction: Direction,
        offset: u64,
        payload: &[u8],
    ) -> Option<WebSocketFact> {
        let max_head_bytes = self.max_head_bytes;
        let reader = match direction {
            Direction::Send => &mut self.send,
            Direction::Recv => &mut self.recv,
        };
        if reader.done {
            return None;
        }
        let parse = |head: &[u8]| {
            match direction {
                Direction::Send => parse_request(head).transpose(),
                Direction::Recv => parse_response(head).transpose(),
            }
            .map(|parsed| match parsed {
                Ok(fact) => fact,
                Err(reason) => WebSocketFact::Undecodable { direction, reason },
            })
        };
        let fact = match reader.accept(offset, payload.len(), max_head_bytes) {
            Err(reason) => Some(WebSocketFact::Undecodable { direction, reason }),
            // Nearly every head comes whole in one chunk: it is parsed where it lies, and only
            // an incomplete one is buffered.
            Ok(()) if reader.buffer.is_empty() => {
                let fact = parse(payload);
                if fact.is_none() {
                    reader.keep(payload);
                }
                fact
            }
            Ok(()) => {
                reader.keep(payload);
                parse(&reader.buffer)
            }
        };
        if fact.is_some() {
            reader.done = true;
            reader.buffer = Vec::new();
        }
        if matches!(fact, Some(WebSocketFact::Undecodable { .. })) {
            self.counters.http1_failures += 1;
        }
        fact
    }

    /// Both heads are read (or cannot be): later bytes of the connection are never looked at.
    pub fn is_done(&self) -> bool {
        self.send.done && self.recv.done
    }

    pub fn counters(&self) -> &DecodeCounters {
        &self.counters
    }

    /// Heap bytes of the two partial heads.
    pub fn buffered_bytes(&self) -> usize {
        self.send.buffer.capacity() + self.recv.buffer.capacity()
    }
}

impl HeadReader {
    /// Checks that a chunk of `len` bytes at `offset` continues the head within its limit, and
    /// moves past it.
    fn accept(&mut self, offset: u64, len: usize, max_head_bytes: usize) -> Result<(), Http1Error> {
        let expected = self.next_offset.unwrap_or(0);
        if offset != expected {
            self.done = true;
            return Err(match self.next_offset {
                None => Http1Error::JoinedMidStream(offset),
                Some(position) => Http1Error::Gap { position },
            });
        }
        if self.buffer.len() + len > max_head_bytes {
            return Err(Http1Error::HeadTooLarge(max_head_bytes));
        }
        self.next_offset = Some(expected + len as u64);
        Ok(())
    }

    /// Buffers a chunk of an incomplete head.
    fn keep(&mut self, chunk: &[u8]) {
        self.buffer.extend_from_slice(chunk);
        // The capture layer redacts each chunk; a token split across chunks is only visible
        // once they are joined.
        redact_secrets(&mut self.buffer);
    }
}

/// `Ok(None)` while the head is incomplete.
fn parse_request(buffer: &[u8]) -> Result<Option<WebSocketFact>, Http1Error> {
    if buffer.is_empty() {
        return Ok(None);
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(buffer) {
        Ok(httparse::Status::Partial) => return Ok(None),
        Ok(httparse::Status::Complete(_)) => {}
        Err(error) => return Err(Http1Error::Parse(error.to_string())),
    }
    let target = request.path.unwrap_or_default();
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut upgrade = UpgradeRequest {
        method: request.method.unwrap_or_default().to_owned(),
        path: path.to_owned(),
        ..UpgradeRequest::default()
    };
    // Split as bytes: `str::split` on a char goes through memchr, whose setup costs more than
    // these few short pairs do to scan.
    for pair in query.as_bytes().split(|&byte| byte == b'&') {
        let equals = pair.iter().position(|&byte| byte == b'=');
        let (name, value) = pair.split_at(equals.unwrap_or(pair.len()));
        let value = value.get(1..).unwrap_or_default();
        match name {
            b"sendID" => upgrade.send_id = Some(percent_decode(value)),
            b"platformID" => upgrade.platform_id = percent_decode(value).parse().ok(),
            b"isBackground" => upgrade.is_background = percent_decode(value).parse().ok(),
            b"operationID" => upgrade.operation_id = Some(percent_decode(value)),
            // `token` and everything else is dropped here.
            _ => {}
        }
    }
    for header in request.headers.iter() {
        let value = || Some(utf8_text(header.value.to_vec()));
        if header.name.eq_ignore_ascii_case("host") {
            upgrade.host = value();
        } else if header.name.eq_ignore_ascii_case("upgrade") {
            upgrade.upgrade = value();
        } else if header.name.eq_ignore_ascii_case("connection") {
            upgrade.connection = value();
        }
    }
    Ok(Some(WebSocketFact::UpgradeRequest(upgrade)))
}

fn parse_response(buffer: &[u8]) -> Result<Option<WebSocketFact>, Http1Error> {
    if buffer.is_empty() {
        return Ok(None);
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    match response.parse(buffer) {
        Ok(httparse::Status::Partial) => Ok(None),
        Ok(httparse::Status::Complete(_)) => Ok(Some(WebSocketFact::UpgradeResponse {
            status: response.code.unwrap_or_default(),
        })),
        Err(error) => Err(Http1Error::Parse(error.to_string())),
    }
}

/// Query values are percent-encoded (`%XX`, `+` for space); invalid escapes stay as they are.
fn percent_decode(value: &[u8]) -> String {
    utf8_text(wire::percent_decode(value))
}

/// The bytes as text, kept without a copy when they are UTF-8 (the lossy repair, which copies,
/// only for those that are not).
fn utf8_text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes)
        .unwrap_or_else(|error| String::from_utf8_lossy(error.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
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
}
