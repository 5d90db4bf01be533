//! Keeps credentials and message content out of every output.
//!
//! - `redact`: credentials in HTTP/1 bytes (the upgrade's `token`, `Authorization`, `Cookie`),
//!   overwritten at capture so no layer above holds them.
//! - `whitelist`: what of a connection's captured bytes may leave the process at all
//!   (`--events`, `--record`), per connection and across chunks: `http1_whitelist` for HTTP/1
//!   heads, `header_whitelist` for HTTP/2 header blocks, `protobuf_whitelist` for gRPC bodies.

mod header_whitelist;
mod http1_whitelist;
mod protobuf_whitelist;
mod redact;
mod whitelist;

pub use redact::redact_secrets;
pub use whitelist::OutputWhitelist;
