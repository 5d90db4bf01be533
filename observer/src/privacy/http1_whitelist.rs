//! Decides what of an HTTP/1 head may leave the process: a whitelist, followed byte by byte across
//! chunks (a token split over two writes or two iovec entries is masked all the same).
//!
//! Kept: the request line's method and path, the query values the engine reads and only those
//! (`sendID`, `platformID`, `isBackground`, `operationID`, read as `decode::http1` reads them,
//! after Go's `ParseQuery` and `Values.Get`: keys compared percent-decoded, the first valid pair
//! of a key kept and later ones masked, a kept value masked from a bad escape or a `;` on, which
//! are left in place so the pair is still dropped), the response's status line, header names,
//! and the values of `Host`, `Upgrade`, `Connection` and `Sec-WebSocket-Version`. Every other
//! query value, the fragment, every other header value, folded continuation lines, everything
//! after the head (WebSocket frames, a chunked body, a pipelined request) and everything from a
//! byte that is not text on is overwritten with `*` in place, so lengths and line structure
//! stay and the decoders read the same facts from the head.

use crate::decode::http1::{QUERY_KEYS, QueryKey, hex_digit, query_unescape};

/// Names the header values the engine reads, and the WebSocket version (a number), compared
/// case-insensitively. Not `Sec-WebSocket-Protocol`, where applications put tokens, nor the key.
const KEPT_HEADERS: [&[u8]; 4] = [b"host", b"upgrade", b"connection", b"sec-websocket-version"];
/// Bounds the names buffered: a longer name is never a kept one and is not buffered further. A
/// kept query key spelled wholly in `%XX` escapes (`isBackground`, 36 bytes) still fits.
const MAX_NAME: usize = 36;
const MASK: u8 = b'*';

/// Follows one direction of one connection. `request` for what the client sends.
#[derive(Clone, Debug)]
pub struct Http1Whitelist {
    state: State,
    /// The query key or header name being read (up to `MAX_NAME` bytes, then `overlong`).
    name: Vec<u8>,
    overlong: bool,
    /// Query keys whose first valid pair was let through: the decoder reads only that one, so
    /// later pairs of the key are masked.
    taken: [bool; QUERY_KEYS.len()],
    /// Hex digits still due after a `%` in a kept query value.
    escape_due: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Method,
    Path,
    QueryKey,
    /// The value of a pair; `kept` names the key while the value is let through.
    QueryValue {
        kept: Option<QueryKey>,
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
    /// Builds the whitelist of what a client sends.
    pub fn request() -> Self {
        Self::starting_at(State::Method)
    }

    /// Builds the whitelist of what a server answers.
    pub fn response() -> Self {
        Self::starting_at(State::StatusLine)
    }

    fn starting_at(state: State) -> Self {
        Self {
            state,
            name: Vec::new(),
            overlong: false,
            taken: [false; QUERY_KEYS.len()],
            escape_due: 0,
        }
    }

    /// Marks a gap: the position in the head is no longer known, so everything from here is masked.
    pub fn lose(&mut self) {
        self.state = State::Body;
    }

    /// Masks in place what of the next chunk of the direction is not kept.
    pub fn filter(&mut self, chunk: &mut [u8]) {
        for byte in chunk {
            *byte = self.step(*byte);
        }
    }

    /// Filters one byte of a head and moves to the next state.
    ///
    /// Longer than 100 lines on purpose: one `match` whose arms are the states of an HTTP/1
    /// head, so every transition of the whitelist reads in one place.
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
                    let kept = self.kept_key();
                    self.escape_due = 0;
                    self.state = State::QueryValue { kept };
                    byte
                }
                b'&' => {
                    self.end_bare_key();
                    self.start_name(State::QueryKey);
                    byte
                }
                _ if is_query_end(byte) => {
                    self.end_bare_key();
                    self.query_end(byte)
                }
                _ => {
                    self.push_name(byte);
                    byte
                }
            },
            State::QueryValue { kept: None } => match byte {
                b'&' => {
                    self.start_name(State::QueryKey);
                    byte
                }
                _ if is_query_end(byte) => self.query_end(byte),
                _ => MASK,
            },
            State::QueryValue { kept: Some(key) } => self.kept_value(key, byte),
            State::Fragment if is_query_end(byte) => self.query_end(byte),
            State::Fragment => MASK,
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

    /// Passes a byte of the value of `key`'s first pair: let through, unless it breaks the pair (a
    /// bad escape, masked; a `;`, kept, as Go drops the pair either way).
    fn kept_value(&mut self, key: QueryKey, byte: u8) -> u8 {
        let broken = |whitelist: &mut Self| {
            whitelist.state = State::QueryValue { kept: None };
        };
        if byte == b'&' || is_query_end(byte) {
            // The pair is whole and valid: later pairs of the key are not read.
            if self.escape_due == 0 {
                self.taken[key as usize] = true;
            }
            if byte == b'&' {
                self.start_name(State::QueryKey);
                return byte;
            }
            return self.query_end(byte);
        }
        if self.escape_due > 0 {
            if hex_digit(byte).is_some() {
                self.escape_due -= 1;
                return byte;
            }
            broken(self);
            return MASK;
        }
        match byte {
            b'%' => self.escape_due = 2,
            b';' => broken(self),
            _ => {}
        }
        byte
    }

    /// Returns the key just read, if it is one the engine reads and its first pair is still to
    /// come.
    fn kept_key(&self) -> Option<QueryKey> {
        if self.overlong || self.name.contains(&b';') {
            return None;
        }
        let key = QueryKey::of(&query_unescape(&self.name)?)?;
        (!self.taken[key as usize]).then_some(key)
    }

    /// Ends a pair without `=`, which is its key with the empty value: the first of that key.
    fn end_bare_key(&mut self) {
        if let Some(key) = self.kept_key() {
            self.taken[key as usize] = true;
        }
    }

    /// Reads the end of the request target: it ends at a space (then the version), a fragment or a
    /// line end.
    fn query_end(&mut self, byte: u8) -> u8 {
        match byte {
            b' ' => self.state = State::Version,
            b'#' => self.state = State::Fragment,
            b'\n' => return self.end_line(byte),
            _ => {}
        }
        byte
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

/// Says whether `byte` ends the request target's query: a space (the version follows), a fragment,
/// or a line end.
fn is_query_end(byte: u8) -> bool {
    matches!(byte, b' ' | b'#' | b'\r' | b'\n')
}

#[cfg(test)]
mod tests;
