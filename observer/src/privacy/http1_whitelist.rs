//! What of an HTTP/1 head may leave the process: a whitelist, followed byte by byte across
//! chunks (a token split over two writes or two iovec entries is masked all the same).
//!
//! Kept: the request line's method and path, the query parameters the engine reads (`sendID`,
//! `platformID`, `isBackground`, `operationID`, compared after percent-decoding as Go's
//! `ParseQuery` does), the response's status line, header names, and the values of `Host`,
//! `Upgrade`, `Connection` and `Sec-WebSocket-Version`. Every other query value, the fragment, every other header value,
//! folded continuation lines, everything after the head (WebSocket frames, a chunked body, a
//! pipelined request) and everything from a byte that is not text on is overwritten with `*` in
//! place, so lengths and line structure stay and
//! the decoders still read the head.

/// Query parameters the engine reads (`decode::http1`).
const KEPT_QUERY_KEYS: [&[u8]; 4] = [b"sendID", b"platformID", b"isBackground", b"operationID"];
/// Header values the engine reads, and the WebSocket version (a number), compared
/// case-insensitively. Not `Sec-WebSocket-Protocol`, where applications put tokens, nor the key.
const KEPT_HEADERS: [&[u8]; 4] = [b"host", b"upgrade", b"connection", b"sec-websocket-version"];
/// Longer names are never a kept one: they are not buffered further.
const MAX_NAME: usize = 32;
const MASK: u8 = b'*';

use crate::model::wire::percent_decode;

/// One direction of one connection. `request` for what the client sends.
#[derive(Clone, Debug)]
pub struct Http1Whitelist {
    state: State,
    /// The query key or header name being read (up to `MAX_NAME` bytes, then `overlong`).
    name: Vec<u8>,
    overlong: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Method,
    Path,
    QueryKey,
    QueryValue {
        kept: bool,
    },
    Fragment,
    Version,
    StatusLine,
    /// At the start of a header line.
    LineStart,
    HeaderName,
    HeaderValue {
        kept: bool,
    },
    /// A line starting with a space or tab (obsolete folding): never kept.
    Continuation,
    /// Past the head.
    Body,
}

impl Http1Whitelist {
    pub fn request() -> Self {
        Self::starting_at(State::Method)
    }

    pub fn response() -> Self {
        Self::starting_at(State::StatusLine)
    }

    fn starting_at(state: State) -> Self {
        Self {
            state,
            name: Vec::new(),
            overlong: false,
        }
    }

    /// The position in the head is no longer known (a gap): everything from here is masked.
    pub fn lose(&mut self) {
        self.state = State::Body;
    }

    /// Masks in place what of the next chunk of the direction is not kept.
    pub fn filter(&mut self, chunk: &mut [u8]) {
        for byte in chunk {
            *byte = self.step(*byte);
        }
    }

    fn step(&mut self, byte: u8) -> u8 {
        // A head is text: a byte that cannot be in one ends it (a binary stream on a WebSocket
        // port is masked whole), and so does a method that is not one.
        let text = byte.is_ascii_graphic() || matches!(byte, b' ' | b'\t' | b'\r' | b'\n');
        if !text || (self.state == State::Method && !byte.is_ascii_uppercase() && byte != b' ') {
            self.state = State::Body;
        }
        match self.state {
            State::Method => {
                if byte == b' ' {
                    self.state = State::Path;
                }
                byte
            }
            State::Path => match byte {
                b'?' => {
                    self.start_name(State::QueryKey);
                    byte
                }
                b'#' => {
                    self.state = State::Fragment;
                    byte
                }
                b' ' => {
                    self.state = State::Version;
                    byte
                }
                b'\n' => self.end_line(byte),
                _ => byte,
            },
            State::QueryKey => match byte {
                b'=' => {
                    let kept = !self.overlong
                        && KEPT_QUERY_KEYS
                            .iter()
                            .any(|key| percent_decode(&self.name) == *key);
                    self.state = State::QueryValue { kept };
                    byte
                }
                b'&' => {
                    self.start_name(State::QueryKey);
                    byte
                }
                _ => self.query_end(byte).unwrap_or_else(|| {
                    self.push_name(byte);
                    byte
                }),
            },
            State::QueryValue { kept } => match byte {
                b'&' => {
                    self.start_name(State::QueryKey);
                    byte
                }
                _ => self
                    .query_end(byte)
                    .unwrap_or(if kept { byte } else { MASK }),
            },
            State::Fragment => self.query_end(byte).unwrap_or(MASK),
            State::Version | State::StatusLine => {
                if byte == b'\n' {
                    return self.end_line(byte);
                }
                byte
            }
            State::LineStart => match byte {
                b'\r' => byte,
                b'\n' => {
                    self.state = State::Body;
                    byte
                }
                b' ' | b'\t' => {
                    self.state = State::Continuation;
                    MASK
                }
                _ => {
                    self.start_name(State::HeaderName);
                    self.push_name(byte);
                    byte
                }
            },
            State::HeaderName => match byte {
                b':' => {
                    let kept = !self.overlong
                        && KEPT_HEADERS
                            .iter()
                            .any(|header| self.name.eq_ignore_ascii_case(header));
                    self.state = State::HeaderValue { kept };
                    byte
                }
                b'\n' => self.end_line(byte),
                _ => {
                    self.push_name(byte);
                    byte
                }
            },
            State::HeaderValue { kept } => match byte {
                b'\r' => byte,
                b'\n' => self.end_line(byte),
                _ if kept => byte,
                _ => MASK,
            },
            State::Continuation => match byte {
                b'\r' => byte,
                b'\n' => self.end_line(byte),
                _ => MASK,
            },
            State::Body => MASK,
        }
    }

    /// The request target ends at a space (then the version) or a line end.
    fn query_end(&mut self, byte: u8) -> Option<u8> {
        match byte {
            b' ' => {
                self.state = State::Version;
                Some(byte)
            }
            b'#' => {
                self.state = State::Fragment;
                Some(byte)
            }
            b'\n' => Some(self.end_line(byte)),
            b'\r' => Some(byte),
            _ => None,
        }
    }

    fn end_line(&mut self, byte: u8) -> u8 {
        self.state = State::LineStart;
        byte
    }

    fn start_name(&mut self, state: State) {
        self.state = state;
        self.name.clear();
        self.overlong = false;
    }

    fn push_name(&mut self, byte: u8) {
        if self.name.len() < MAX_NAME {
            self.name.push(byte);
        } else {
            self.overlong = true;
        }
    }
}
