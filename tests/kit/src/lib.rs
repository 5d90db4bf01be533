//! Provides the test kit: what the observer's tests, benches and fuzz seeds build their input from.
//!
//! - [`captured`]: what the kernel tests read out of `observer run --events` (streams, ends of
//!   connections) and the raw sockets they make it from.
//! - [`cgroup2`]: a cgroup v2 hierarchy mounted for a test (root only).
//! - [`http2`]: HTTP/2 frames, gRPC message framing and HPACK pieces, as byte vectors.
//! - [`message`]: OpenIM's `MsgData` with its content (field 12), which the library
//!   deliberately cannot represent, and the push request that carries it.
//! - [`observer_process`]: the real `observer` binary run by a test, for the observer's kernel
//!   tests and the lab's alike.
//! - [`ports`]: free loopback ports, so test files need no ranges picked by hand.
//! - [`privileges`]: whether a test can load the observer's programs here, and how it skips.
//! - [`synthetic`]: whole synthetic OpenIM 3.5.1 clusters as the capture layer delivers them
//!   (`Event`s with real byte streams), with what a correct observer should conclude.
//!
//! A crate of its own rather than a `testing` cargo feature of `observer`: it never ships in the
//! library, needs no `--features` flag (plain `cargo test` and `cargo bench` run everything), and
//! only the crates that use it depend on it (as a dev-dependency; the lab crate `tests`, test
//! code itself, as a dependency).

pub mod captured;
pub mod cgroup2;
pub mod http2;
pub mod message;
pub mod observer_process;
pub mod ports;
pub mod privileges;
pub mod synthetic;
