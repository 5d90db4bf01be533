//! Test kit: what the observer's tests, benches and fuzz seeds build their input from.
//!
//! - [`cgroup2`]: a cgroup v2 hierarchy mounted for a test (root only).
//! - [`http2`]: HTTP/2 frames, gRPC message framing and HPACK pieces, as byte vectors.
//! - [`message`]: OpenIM's `MsgData` with its content (field 12), which the library
//!   deliberately cannot represent, and the push request that carries it.
//! - [`synthetic`]: whole synthetic OpenIM 3.5.1 clusters as the capture layer delivers them
//!   (`Event`s with real byte streams), with what a correct observer should conclude.
//!
//! A crate of its own rather than a `testing` cargo feature of `observer`: it never ships in the
//! library, needs no `--features` flag (plain `cargo test` and `cargo bench` run everything), and
//! only the crates that use it depend on it (as a dev-dependency).

pub mod cgroup2;
pub mod http2;
pub mod message;
pub mod synthetic;
