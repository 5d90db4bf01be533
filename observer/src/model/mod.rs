//! The shared vocabulary: what every layer above speaks, and the only place each of these
//! types is defined. No module here imports from another layer.
//!
//! - `event`: what the capture saw, one typed event per kernel record.
//! - `wire`: how a connection's first bytes say what it carries.

mod event;
pub mod wire;

pub use event::{ConnectionId, Direction, Event, EventKind, PortClass, TcpState};
