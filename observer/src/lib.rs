//! Implements the OpenIM observer, which catches the moment OpenIM's WebSocket placement
//! (msggateway-proxy) and its push delivery (push) disagree about which msggateway holds a user.
//!
//! Data path: `capture` (kernel records → typed events) → `decode` (HTTP/1 upgrades, HTTP/2 +
//! gRPC push calls) → `correlate` (placements, deliveries, learned rings) → `alert` (JSON).
//!
//! Layers, bottom-up; each imports only from those before it in this list
//! (docs/architecture.md): `model`, `budget`, `table_memory`, `openim`, `hpack`, `privacy`,
//! `decode`, `capture`, `alert`, `correlate`, then
//! the edges `allocator`, `lines`, `cluster`, `identity`, `metrics`, `tools`, `daemon`.

// The shared vocabulary and OpenIM knowledge.
pub mod model;
// What every table draws on.
pub mod budget;
pub mod openim;
pub mod table_memory;
// Bytes: the HPACK codec, privacy, decoding, capture.
pub mod capture;
pub mod decode;
pub mod hpack;
pub mod privacy;
// Alerts and the engine that raises them.
pub mod alert;
pub mod correlate;
// Edges.
pub mod allocator;
pub mod cluster;
pub mod daemon;
pub mod identity;
pub mod lines;
pub mod metrics;
pub mod tools;
