//! Finds, after a restart, which TCP connections are still established on this node, to tell the
//! placements stored before the restart that still hold from those that ended meanwhile, read
//! from every network namespace's socket table (`capture::socket_tables`).

use std::collections::HashSet;

use crate::{capture::socket_tables::table_sockets, model::ConnectionKey};

/// Returns every established connection in every network namespace of this node, canonical (IPv4 as
/// IPv4, not IPv4-mapped).
pub fn established_connections() -> HashSet<ConnectionKey> {
    table_sockets()
        .into_iter()
        .filter(|socket| socket.established)
        .map(|socket| socket.key.canonical())
        .collect()
}

#[cfg(test)]
mod tests;
