//! Capture: what the kernel programs saw, as typed events.
//!
//! `event` is the boundary every later stage consumes, whether the events come live from the
//! kernel (`kernel`) or from a recording (`recording`).

pub mod event;
pub mod kernel;
mod kernel_features;
pub mod recording;
pub mod tracepoint_format;

pub use event::{Direction, Event, EventKind, PortClass, TcpState};
