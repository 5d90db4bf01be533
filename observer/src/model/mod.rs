//! The shared vocabulary: what every layer above speaks, and the only place each of these
//! types is defined. No module here imports from another layer.
//!
//! - `event`: what the capture saw, one typed event per kernel record.

mod event;

pub use event::{ConnectionId, Direction, Event, EventKind, PortClass, TcpState};
