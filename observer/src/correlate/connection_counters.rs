//! Defines [`ConnectionCounters`], what the connection table and its decoders counted; shared
//! by [`super::connections`], which owns them, and [`super::fact_observations`], which adds
//! to them.

use crate::decode::DecodeCounters;

/// Counts what the connection table and its decoders tracked, dropped, adopted and could not read.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ConnectionCounters {
    pub tracked: usize,
    /// Connections dropped from a full table, least recently active first.
    pub evicted: u64,
    /// Data on gRPC connections beyond the capture budget (`truncated` records): calls,
    /// and the bytes the kernel did not copy.
    pub budget_truncated_calls: u64,
    pub budget_truncated_bytes: u64,
    pub upgrades_without_user: u64,
    /// WebSockets closed with an upgrade request or answer begun but never whole: the rest
    /// of the head was not captured (the programs take a WebSocket's first write and read, or
    /// first pushed segment each way), so a placement went unseen (`lost_sync`).
    pub heads_incomplete: u64,
    pub calls_not_push: u64,
    pub calls_compressed: u64,
    pub calls_malformed: u64,
    pub answers_unreadable: u64,
    /// Connections adopted at start (established before the observer watched), and of them
    /// the WebSockets, whose users are unknown.
    pub adopted: u64,
    pub adopted_websockets_without_user: u64,
    /// Connections found gone by reconciling with the kernel, their close never seen.
    pub closes_reconciled: u64,
    pub decode: DecodeCounters,
}
