//! Lists what a node shares: the facts its engine hands to the store's writer, and the writer's
//! limits.

use std::{net::IpAddr, time::Duration};

use super::keys::{ConnectionKey, RingSide, SharedPlacement};

/// Counts the facts per pipeline: large enough to amortise a round trip, small enough that one slow
/// batch does not hold the queue long.
pub(super) const MAX_BATCH: usize = 512;
/// Bounds the own placements remembered for refreshing (one per online connection of this node's
/// proxies); more are written once and left to expire, and counted.
pub(super) const MAX_OWN_PLACEMENTS: usize = 1 << 20;
/// Bounds the ring members remembered (gateways × two spellings; a cluster has at most hundreds).
pub(super) const MAX_OWN_RING_MEMBERS: usize = 4_096;
/// Bounds how often a ring member seen again is rewritten.
pub(super) const RING_MEMBER_REWRITE: Duration = Duration::from_secs(60);

/// Records what this node saw that the other nodes need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fact {
    /// The proxy on this node placed a user (also feeds the shared ring evidence).
    Placed(SharedPlacement),
    /// A placement made before this observer started, still live: kept and refreshed again.
    Adopted(SharedPlacement),
    /// A placement's connection closed (or was found gone after a restart).
    Unplaced {
        user: String,
        connection: ConnectionKey,
    },
    /// One side dialled a gateway IP under this member string.
    RingMember {
        side: RingSide,
        member: String,
        ip: IpAddr,
    },
}
