//! Privacy: what keeps credentials and message content out of every output. The capture,
//! the decoders' buffers and the recordings all call it; nothing else rewrites captured bytes.
//!
//! - `redact`: credentials in HTTP/1 bytes (the upgrade's `token`, `Authorization`, `Cookie`).
//! - `scrub`: `MsgData.content` zeroed in gRPC push bytes, followed per connection.

mod redact;
mod scrub;

pub use redact::redact_secrets;
pub use scrub::ContentScrubber;
