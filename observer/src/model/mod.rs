//! Defines the shared vocabulary: what every layer above speaks, and the only place each of these
//! types is defined. No module here imports from another layer.
//!
//! - `event`: what the capture saw, one typed event per kernel record.
//! - `wire`: how a connection's first bytes say what it carries.
//! - `routing`: gateways and processes, and what a push call carries and gets back.
//! - `json_text`: the bytes a JSON string cannot hold as they are, found sixteen at a time.
//! - `time_text`: instants as RFC 3339 text.
//! - `prefetch`: loading a table's bucket ahead of its lookup.

mod event;
pub mod json_text;
mod prefetch;
mod routing;
mod time_text;
pub mod wire;

pub use event::{ConnectionId, ConnectionKey, Direction, Event, EventKind, PortClass, TcpState};
pub use prefetch::{likely_bucket, prefetch, prefetch_bucket};
pub use routing::{
    Gateway, GatewayAnswer, IpText, MessageIds, MismatchCause, PlatformResult, Process, UserId,
    UserResult,
};
pub use time_text::{Rfc3339, rfc3339};

/// Counts the nanoseconds in a second; timestamps are Unix nanoseconds throughout.
pub const NANOS_PER_SEC: u64 = 1_000_000_000;
