//! OpenIM observer: catches the moment OpenIM's WebSocket placement (msggateway-proxy) and its
//! push delivery (push) disagree about which msggateway holds a user.
//!
//! Data path: `capture` (kernel records → typed events) → `decode` (HTTP/1 upgrades, HTTP/2 +
//! gRPC push calls) → `correlate` (placements, deliveries, learned rings) → `alert` (JSON).

pub mod alert;
pub mod capture;
pub mod cluster;
pub mod correlate;
pub mod daemon;
pub mod decode;
pub mod hashring;
pub mod identity;
pub mod metrics;
pub mod tools;
