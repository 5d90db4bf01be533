//! Reads and writes the JSON-lines form of events: what `observer run --events` prints and what
//! `--record` writes, so that `observer replay` can read a capture back without root.
//!
//! One object per line, with `kind` (`tcp_connect`, `tcp_state`, `data`, `close`), `ts`
//! (RFC 3339) and `ts_ns` (Unix nanoseconds, exact), the process and the 4-tuple, and for data
//! `direction`, `offset`, `len`, `call_len`, `truncated` and `payload_b64`. WebSocket
//! payloads were scrubbed of credentials before they became events; `PrivateLines` zeroes
//! message content out of gRPC payloads before they are written anywhere.

use std::{
    borrow::Cow,
    collections::HashMap,
    fs::{File, OpenOptions, Permissions},
    io,
    net::IpAddr,
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

// SIMD base64: decoding payloads was a seventh of replaying a recording, one symbol at a time.
use base64_simd::STANDARD as BASE64;
use bytes::Bytes;
use serde::{Deserialize, Deserializer, Serialize};
use thiserror::Error;

use crate::model::rfc3339;
use crate::model::{ConnectionId, Direction, Event, EventKind, PortClass, TcpState};
use crate::privacy::OutputWhitelist;

mod plain;

/// Says why a recording cannot be written or a line of one read.
#[derive(Debug, Error)]
pub enum RecordingError {
    #[error("line {line}: not an observer event ({reason})")]
    BadLine { line: usize, reason: String },
    #[error("{}: already exists (pass --overwrite to replace it)", path.display())]
    Exists { path: PathBuf },
    #[error("{}: is a symbolic link or not a regular file; a recording is never written through \
        one", path.display())]
    NotARegularFile { path: PathBuf },
    #[error("cannot create {}: {source}", path.display())]
    Create { path: PathBuf, source: io::Error },
}

/// Sets a recording's mode: captures of other programs' traffic are readable by their owner only.
pub const RECORDING_MODE: u32 = 0o600;

/// Refuses a recording path early, before anything is attached: an existing entry unless
/// `overwrite`, and whatever is not a regular file (a link could point the privileged
/// observer at any file on the host). `create` checks again when it opens the file.
///
/// # Errors
///
/// Fails with [`RecordingError::Exists`] when `path` exists and `overwrite` is not set,
/// [`RecordingError::NotARegularFile`] when it is a link or not a regular file, and
/// [`RecordingError::Create`] when it cannot be looked at.
pub fn check_target(path: &Path, overwrite: bool) -> Result<(), RecordingError> {
    match std::fs::symlink_metadata(path) {
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(RecordingError::Create {
            path: path.to_owned(),
            source,
        }),
        Ok(metadata) if !metadata.file_type().is_file() => Err(RecordingError::NotARegularFile {
            path: path.to_owned(),
        }),
        Ok(_) if !overwrite => Err(RecordingError::Exists {
            path: path.to_owned(),
        }),
        Ok(_) => Ok(()),
    }
}

/// Creates the recording mode 0600 without following a symbolic link at `path`: a new file,
/// or with `overwrite` an existing regular file truncated (and made 0600).
///
/// # Errors
///
/// Fails as [`check_target`] does, and with [`RecordingError::Exists`],
/// [`RecordingError::NotARegularFile`] or [`RecordingError::Create`] when opening, checking or
/// setting the mode of what was opened fails.
pub fn create(path: &Path, overwrite: bool) -> Result<File, RecordingError> {
    check_target(path, overwrite)?;
    let mut options = OpenOptions::new();
    options
        .write(true)
        .mode(RECORDING_MODE)
        // ELOOP on a link at `path`, ENXIO/EAGAIN rather than a hang on a FIFO swapped in.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC);
    if overwrite {
        options.create(true).truncate(true);
    } else {
        options.create_new(true);
    }
    let create_error = |source: io::Error| match source.raw_os_error() {
        Some(libc::ELOOP) => RecordingError::NotARegularFile {
            path: path.to_owned(),
        },
        _ if source.kind() == io::ErrorKind::AlreadyExists => RecordingError::Exists {
            path: path.to_owned(),
        },
        _ => RecordingError::Create {
            path: path.to_owned(),
            source,
        },
    };
    let file = options.open(path).map_err(create_error)?;
    // What was opened, not what the path names now: the check above raced with the open.
    let metadata = file.metadata().map_err(create_error)?;
    if !metadata.file_type().is_file() {
        return Err(RecordingError::NotARegularFile {
            path: path.to_owned(),
        });
    }
    // An overwritten file keeps its old mode unless told.
    file.set_permissions(Permissions::from_mode(RECORDING_MODE))
        .map_err(create_error)?;
    Ok(file)
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum LineKind {
    TcpConnect,
    TcpState,
    Data,
    Close,
}

/// Holds a line's fields; text fields borrow from the line when it has no escapes in them (what
/// `to_json_line` writes), so reading a line allocates only its payload.
#[derive(Serialize, Deserialize)]
struct EventLine<'a> {
    kind: LineKind,
    /// For people and tools reading the file; a replay takes `ts_ns`, and skips this unread.
    #[serde(borrow, skip_deserializing)]
    ts: Cow<'a, str>,
    ts_ns: u64,
    /// Kernel socket address in hex: too large for a JSON number to carry exactly.
    #[serde(borrow)]
    connection: Cow<'a, str>,
    pid: u32,
    #[serde(borrow)]
    comm: Cow<'a, str>,
    cgroup_id: u64,
    saddr: IpAddr,
    sport: u16,
    daddr: IpAddr,
    dport: u16,
    port_class: PortClass,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    old_state: Option<TcpState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    new_state: Option<TcpState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    direction: Option<Direction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    offset: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    len: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    call_len: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    truncated: Option<bool>,
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    payload_b64: Option<Base64Text<'a>>,
}

/// Holds base64 text as it lies in the line, read as bytes: serde_json then finds a string's end
/// with `memchr` instead of eight bytes at a time, and skips the UTF-8 check (the decoder refuses
/// anything but base64 anyway). Borrowed unless the line escaped a character in it.
struct Base64Text<'a>(Cow<'a, [u8]>);

impl Serialize for Base64Text<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let text = std::str::from_utf8(&self.0).map_err(serde::ser::Error::custom)?;
        serializer.serialize_str(text)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Base64Text<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Text;
        impl<'de> serde::de::Visitor<'de> for Text {
            type Value = Cow<'de, [u8]>;
            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("base64 text")
            }
            fn visit_borrowed_bytes<E>(self, bytes: &'de [u8]) -> Result<Self::Value, E> {
                Ok(Cow::Borrowed(bytes))
            }
            fn visit_bytes<E>(self, bytes: &[u8]) -> Result<Self::Value, E> {
                Ok(Cow::Owned(bytes.to_vec()))
            }
            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Self::Value, E> {
                Ok(Cow::Borrowed(text.as_bytes()))
            }
            fn visit_str<E>(self, text: &str) -> Result<Self::Value, E> {
                Ok(Cow::Owned(text.as_bytes().to_vec()))
            }
        }
        deserializer.deserialize_bytes(Text).map(Base64Text)
    }
}

/// Writes the event as one line of JSON (without the newline).
pub fn to_json_line(event: &Event) -> String {
    let mut line = EventLine {
        kind: LineKind::Close,
        ts: rfc3339(event.ts_ns).into(),
        ts_ns: event.ts_ns,
        connection: format!("{:#x}", event.connection).into(),
        pid: event.pid,
        comm: event.comm.as_str().into(),
        cgroup_id: event.cgroup_id,
        saddr: event.saddr,
        sport: event.sport,
        daddr: event.daddr,
        dport: event.dport,
        port_class: event.port_class,
        old_state: None,
        new_state: None,
        direction: None,
        offset: None,
        len: None,
        call_len: None,
        truncated: None,
        payload_b64: None,
    };
    match &event.kind {
        EventKind::TcpConnect => line.kind = LineKind::TcpConnect,
        EventKind::TcpState { old, new } => {
            line.kind = LineKind::TcpState;
            line.old_state = Some(*old);
            line.new_state = Some(*new);
        }
        EventKind::Data {
            direction,
            offset,
            call_len,
            truncated,
            payload,
        } => {
            line.kind = LineKind::Data;
            line.direction = Some(*direction);
            line.offset = Some(*offset);
            line.len = Some(payload.len());
            line.call_len = Some(*call_len);
            line.truncated = Some(*truncated);
            line.payload_b64 = Some(Base64Text(
                BASE64.encode_to_string(payload).into_bytes().into(),
            ));
        }
        EventKind::Close => line.kind = LineKind::Close,
    }
    serde_json::to_string(&line).expect("event lines contain only serialisable fields")
}

/// Writes events as lines holding only what the engine reads: every `Data` payload passes its
/// connection's `OutputWhitelist` first (credentials, message content and every header value or
/// field the engine does not read are masked).
pub struct PrivateLines {
    /// Each connection's whitelist, and whether its socket reached TCP_CLOSE: reads of what
    /// arrived before a reset still follow, so it is kept until the descriptor's close, and is
    /// the first to go when the table is full.
    whitelists: HashMap<ConnectionId, (OutputWhitelist, bool)>,
    max_connections: usize,
}

impl PrivateLines {
    /// Builds the writer, following the whitelists of at most `max_connections` connections.
    pub fn new(max_connections: usize) -> Self {
        Self {
            whitelists: HashMap::new(),
            max_connections,
        }
    }

    /// Writes `event` as one line of JSON (without the newline), its payload masked as above.
    pub fn line(&mut self, event: &Event) -> String {
        match &event.kind {
            EventKind::Data {
                direction,
                offset,
                call_len,
                truncated,
                payload,
            } => {
                let mut bytes = payload.to_vec();
                if observer_records::is_adopted_connection(event.connection) {
                    // Adopted at start: its bytes do not begin where a head or the HTTP/2
                    // preface does, so nothing of them can be vouched for.
                    bytes.fill(0);
                } else {
                    match self.whitelist(event.connection, event.port_class) {
                        Some(whitelist) => whitelist.filter(*direction, *offset, &mut bytes),
                        // No room to follow this connection: nothing of it can be vouched for.
                        None => bytes.fill(0),
                    }
                }
                let filtered = Event {
                    kind: EventKind::Data {
                        direction: *direction,
                        offset: *offset,
                        call_len: *call_len,
                        truncated: *truncated,
                        payload: Bytes::from(bytes),
                    },
                    ..event.clone()
                };
                to_json_line(&filtered)
            }
            EventKind::TcpConnect | EventKind::Close => {
                // A socket address is reused by a later connection: start it afresh.
                self.whitelists.remove(&event.connection);
                to_json_line(event)
            }
            EventKind::TcpState {
                new: TcpState::Close,
                ..
            } => {
                if let Some((_, closed)) = self.whitelists.get_mut(&event.connection) {
                    *closed = true;
                }
                to_json_line(event)
            }
            _ => to_json_line(event),
        }
    }

    fn whitelist(
        &mut self,
        connection: ConnectionId,
        port_class: PortClass,
    ) -> Option<&mut OutputWhitelist> {
        if !self.whitelists.contains_key(&connection)
            && self.whitelists.len() >= self.max_connections
        {
            let closed = self
                .whitelists
                .iter()
                .find_map(|(id, (_, closed))| closed.then_some(*id))?;
            self.whitelists.remove(&closed);
        }
        let (whitelist, _) = self
            .whitelists
            .entry(connection)
            .or_insert_with(|| (OutputWhitelist::new(port_class), false));
        Some(whitelist)
    }
}

/// Parses a line written by `to_json_line` (or by another tool); `line_number` (1-based) goes
/// into errors. A line as `to_json_line` writes it is read without serde_json (`plain`).
///
/// # Errors
///
/// Fails with [`RecordingError::BadLine`] when the line is not JSON of an observer event, or holds
/// a field it cannot take (a connection not in hex, a payload not in base64, data without a
/// direction).
pub fn from_json_line(text: &str, line_number: usize) -> Result<Event, RecordingError> {
    match plain::read(text) {
        Some(line) => event_from_line(line, line_number),
        None => from_json_line_by_serde(text, line_number),
    }
}

/// Reads a line with serde_json alone: what `from_json_line` answers for every line, the reference
/// its plain reader is held to (by the tests and the `recording_line` fuzz target).
///
/// # Errors
///
/// Fails as [`from_json_line`] does.
pub fn from_json_line_by_serde(text: &str, line_number: usize) -> Result<Event, RecordingError> {
    let line = serde_json::from_str(text).map_err(|err| RecordingError::BadLine {
        line: line_number,
        reason: err.to_string(),
    })?;
    event_from_line(line, line_number)
}

fn event_from_line(line: EventLine, line_number: usize) -> Result<Event, RecordingError> {
    let bad = |reason: String| RecordingError::BadLine {
        line: line_number,
        reason,
    };
    let connection: ConnectionId = u64::from_str_radix(
        line.connection
            .strip_prefix("0x")
            .unwrap_or(&line.connection),
        16,
    )
    .map_err(|_| bad(format!("connection {:?} is not hex", line.connection)))?;
    let kind = match line.kind {
        LineKind::TcpConnect => EventKind::TcpConnect,
        LineKind::TcpState => EventKind::TcpState {
            old: line.old_state.unwrap_or(TcpState::Unknown),
            new: line.new_state.unwrap_or(TcpState::Unknown),
        },
        LineKind::Close => EventKind::Close,
        LineKind::Data => {
            let payload = BASE64
                .decode_to_vec(line.payload_b64.as_ref().map_or(&[][..], |text| &text.0))
                .map_err(|_| bad("payload_b64 is not base64".to_owned()))?;
            EventKind::Data {
                direction: line
                    .direction
                    .ok_or_else(|| bad("data without direction".into()))?,
                offset: line.offset.unwrap_or(0),
                call_len: line.call_len.unwrap_or(payload.len() as u64),
                truncated: line.truncated.unwrap_or(false),
                payload: Bytes::from(payload),
            }
        }
    };
    Ok(Event {
        ts_ns: line.ts_ns,
        connection,
        pid: line.pid,
        comm: line.comm.as_ref().into(),
        cgroup_id: line.cgroup_id,
        // Older recordings may spell the IPv4 peer of a dual-stack socket `::ffff:a.b.c.d`:
        // one identity per endpoint, as the programs record it now.
        saddr: line.saddr.to_canonical(),
        sport: line.sport,
        daddr: line.daddr.to_canonical(),
        dport: line.dport,
        port_class: line.port_class,
        kind,
    })
}

#[cfg(test)]
mod tests;
