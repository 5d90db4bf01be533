//! Decodes the WebSocket upgrade from msggateway-proxy to a gateway (port 80): the HTTP/1.1 request
//! that places a user, and the gateway's answer.
//!
//! The request's query carries the user's `token` and may come with `Authorization` or `Cookie`
//! headers. They are credentials: `privacy::redact_secrets` overwrites them in captured bytes
//! and in what the decoder buffers, and the typed `UpgradeRequest` has no field that could hold
//! them.

use std::borrow::Cow;

use crate::{model::Direction, privacy::redact_secrets};

use super::{DecodeCounters, Limits};

/// Bounds the headers httparse may return; an upgrade request has about ten.
const MAX_HEADERS: usize = 64;

/// Records what the proxy asked for when it opened a user's WebSocket. Holds no credential.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpgradeRequest {
    pub method: String,
    /// The request target's path, without the query.
    pub path: String,
    /// The query's parameters as the gateway reads them (see `read_query`): `None` when
    /// absent, and for `platformID` and `isBackground` also when Go would not parse them (the
    /// gateway then rejects the upgrade, or reads `false`).
    pub send_id: Option<String>,
    pub platform_id: Option<i32>,
    pub is_background: Option<bool>,
    pub operation_id: Option<String>,
    pub host: Option<String>,
    pub upgrade: Option<String>,
    pub connection: Option<String>,
}

/// Records what a WebSocket connection's decoder found in one direction's head.
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

/// Says why a head could not be read.
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
    /// Builds a decoder for a connection captured from its start.
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

    /// Says whether both heads are read (or cannot be): later bytes of the connection are never
    /// looked at.
    pub fn is_done(&self) -> bool {
        self.send.done && self.recv.done
    }

    /// Returns what went wrong or was cut on this connection so far.
    pub fn counters(&self) -> &DecodeCounters {
        &self.counters
    }

    /// Counts the heap bytes of the two partial heads.
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

/// Parses a request head; `Ok(None)` while the head is incomplete.
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
    // The proxy's `url.Parse` ends the query at a fragment (and the whitelist masks it).
    let target = target.split_once('#').map_or(target, |(target, _)| target);
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut upgrade = UpgradeRequest {
        method: request.method.unwrap_or_default().to_owned(),
        path: path.to_owned(),
        ..UpgradeRequest::default()
    };
    read_query(query.as_bytes(), &mut upgrade);
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

/// Names the query parameters the engine reads, in the order of [`QueryKey`].
pub(crate) const QUERY_KEYS: [&[u8]; 4] =
    [b"sendID", b"platformID", b"isBackground", b"operationID"];

/// Names one of [`QUERY_KEYS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QueryKey {
    SendId,
    PlatformId,
    IsBackground,
    OperationId,
}

impl QueryKey {
    /// Returns the key a decoded query key names, if the engine reads it.
    pub(crate) fn of(decoded: &[u8]) -> Option<Self> {
        const KEYS: [QueryKey; 4] = [
            QueryKey::SendId,
            QueryKey::PlatformId,
            QueryKey::IsBackground,
            QueryKey::OperationId,
        ];
        QUERY_KEYS
            .iter()
            .position(|key| *key == decoded)
            .map(|index| KEYS[index])
    }
}

/// Reads the parameters the engine needs as OpenIM's Go code does (`url.ParseQuery`, then
/// `Values.Get`): pairs split at `&`; a pair holding a `;` (Go 1.17 on) or a bad escape in its
/// key or value is dropped and the rest kept; keys and values are percent-decoded (`+` is a
/// space); the first value of a repeated key wins; a key without `=` has the empty value.
fn read_query(query: &[u8], upgrade: &mut UpgradeRequest) {
    let mut seen = [false; QUERY_KEYS.len()];
    // Split as bytes: `str::split` on a char goes through memchr, whose setup costs more than
    // these few short pairs do to scan.
    for pair in query.split(|&byte| byte == b'&') {
        if pair.is_empty() || pair.contains(&b';') {
            continue;
        }
        let equals = pair.iter().position(|&byte| byte == b'=');
        let (key, value) = pair.split_at(equals.unwrap_or(pair.len()));
        let value = value.get(1..).unwrap_or_default();
        let Some(key) = query_unescape(key).as_deref().and_then(QueryKey::of) else {
            // `token` and everything else is dropped here.
            continue;
        };
        if seen[key as usize] {
            continue;
        }
        let Some(value) = query_unescape(value) else {
            continue;
        };
        seen[key as usize] = true;
        match key {
            QueryKey::SendId => upgrade.send_id = Some(utf8_text(value.into_owned())),
            // The gateway's `strconv.Atoi`: an optional sign, decimal digits.
            QueryKey::PlatformId => {
                upgrade.platform_id = std::str::from_utf8(&value)
                    .ok()
                    .and_then(|text| text.parse().ok());
            }
            QueryKey::IsBackground => upgrade.is_background = go_parse_bool(&value),
            QueryKey::OperationId => {
                upgrade.operation_id = Some(utf8_text(value.into_owned()));
            }
        }
    }
}

/// Decodes a query key or value as Go's `url.QueryUnescape` does: `%XX` (either case) is a
/// byte, `+` a space; `None` for a `%` without two hex digits after it. Borrows when there is
/// nothing to decode.
pub(crate) fn query_unescape(text: &[u8]) -> Option<Cow<'_, [u8]>> {
    if !text.iter().any(|&byte| byte == b'%' || byte == b'+') {
        return Some(Cow::Borrowed(text));
    }
    let mut decoded = Vec::with_capacity(text.len());
    let mut index = 0;
    while let Some(&byte) = text.get(index) {
        match byte {
            b'%' => {
                let high = hex_digit(*text.get(index + 1)?)?;
                let low = hex_digit(*text.get(index + 2)?)?;
                decoded.push(high << 4 | low);
                index += 3;
            }
            b'+' => {
                decoded.push(b' ');
                index += 1;
            }
            other => {
                decoded.push(other);
                index += 1;
            }
        }
    }
    Some(Cow::Owned(decoded))
}

/// Returns the value of one hex digit, either case.
pub(crate) fn hex_digit(byte: u8) -> Option<u8> {
    char::from(byte).to_digit(16).map(|digit| digit as u8)
}

/// Reads a boolean as Go's `strconv.ParseBool` does; anything else is an error, which the gateway
/// reads as `false` and the decoder as absent.
fn go_parse_bool(text: &[u8]) -> Option<bool> {
    match text {
        b"1" | b"t" | b"T" | b"TRUE" | b"true" | b"True" => Some(true),
        b"0" | b"f" | b"F" | b"FALSE" | b"false" | b"False" => Some(false),
        _ => None,
    }
}

/// Returns the bytes as text, kept without a copy when they are UTF-8 (the lossy repair, which
/// copies, only for those that are not).
fn utf8_text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes)
        .unwrap_or_else(|error| String::from_utf8_lossy(error.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests;
