//! Defines what makes two alerts of the folding kinds "the same" within a fold window, and a
//! mismatch's key by borrowed parts: in a misrouted cluster most mismatches repeat one already
//! alerted, and a repeat is then looked up without building (allocating) its key.

use std::{
    hash::{Hash, Hasher},
    net::IpAddr,
};

use compact_str::CompactString;
use smallvec::SmallVec;

/// Says which alerts fold together within a fold window.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FoldKey {
    Mismatch {
        /// Inline for ids of up to 24 bytes, so comparing a looked-up key stays in the table.
        user: CompactString,
        placed: SmallVec<[IpAddr; 1]>,
        pushed: IpAddr,
    },
    UpgradeOnGrpc {
        gateway: IpAddr,
        port: u16,
        proxy_pid: u32,
    },
}

/// Borrows the parts of a `FoldKey::Mismatch`; hashes exactly as the key it stands for.
#[derive(Clone, Copy, Debug)]
pub struct MismatchKey<'a> {
    pub user: &'a str,
    /// Sorted, without repeats.
    pub placed: &'a [IpAddr],
    pub pushed: IpAddr,
}

impl MismatchKey<'_> {
    /// Copies the parts into the key this stands for.
    pub fn to_owned_key(self) -> FoldKey {
        FoldKey::Mismatch {
            user: CompactString::new(self.user),
            placed: SmallVec::from_slice(self.placed),
            pushed: self.pushed,
        }
    }
}

/// Hashes in two writes: the user's bytes and the gateway pushed to. Where the user is placed is
/// left out of the hash on purpose and only compared: judging a recipient looks its placements up
/// first, and a hash that needed them waited for that lookup's cache miss before this table's
/// lookup could start. Without them the CPU runs both lookups at once (the worst-case engine bench:
/// events/s ×1.12, per-event p99 −25%). A user pushed to the same gateway while placed on
/// different ones (rare: placements change on reconnects) shares a hash, which costs a
/// comparison, never a wrong fold; so do keys told apart by an address's family.
impl Hash for MismatchKey<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let bits = |ip: IpAddr| match ip {
            IpAddr::V4(v4) => u128::from(v4.to_bits()),
            IpAddr::V6(v6) => v6.to_bits(),
        };
        state.write(self.user.as_bytes());
        state.write_u128(bits(self.pushed));
    }
}

impl Hash for FoldKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        match self {
            FoldKey::Mismatch {
                user,
                placed,
                pushed,
            } => MismatchKey {
                user: user.as_str(),
                placed: placed.as_slice(),
                pushed: *pushed,
            }
            .hash(state),
            FoldKey::UpgradeOnGrpc {
                gateway,
                port,
                proxy_pid,
            } => {
                gateway.hash(state);
                port.hash(state);
                proxy_pid.hash(state);
            }
        }
    }
}

impl hashbrown::Equivalent<FoldKey> for MismatchKey<'_> {
    fn equivalent(&self, key: &FoldKey) -> bool {
        matches!(key, FoldKey::Mismatch { user, placed, pushed }
            if *pushed == self.pushed && user == self.user && placed.as_slice() == self.placed)
    }
}

#[cfg(test)]
mod tests;
