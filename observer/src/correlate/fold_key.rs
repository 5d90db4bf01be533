//! What makes two alerts of the folding kinds "the same" within a fold window, and a mismatch's
//! key by borrowed parts: in a misrouted cluster most mismatches repeat one already alerted,
//! and a repeat is then looked up without building (allocating) its key.

use std::{
    hash::{Hash, Hasher},
    net::IpAddr,
};

use compact_str::CompactString;
use smallvec::SmallVec;

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

/// `FoldKey::Mismatch` by reference; hashes exactly as the key it stands for.
#[derive(Clone, Copy, Debug)]
pub struct MismatchKey<'a> {
    pub user: &'a str,
    /// Sorted, without repeats.
    pub placed: &'a [IpAddr],
    pub pushed: IpAddr,
}

impl MismatchKey<'_> {
    pub fn to_owned_key(self) -> FoldKey {
        FoldKey::Mismatch {
            user: CompactString::new(self.user),
            placed: SmallVec::from_slice(self.placed),
            pushed: self.pushed,
        }
    }
}

/// Two writes: the user's bytes, then every gateway folded into one word. Hashing each part as
/// std derives it took eight writes (a tag, the text and its end, the list's length, each
/// address's variant and octets), 140 instructions a lookup against 90 now, and a lookup is
/// made for every misrouted recipient of every push call. Keys told apart by equality alone
/// (an address's family, the order) may collide here: that costs a comparison, never a wrong
/// fold.
impl Hash for MismatchKey<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let bits = |ip: IpAddr| match ip {
            IpAddr::V4(v4) => u128::from(v4.to_bits()),
            IpAddr::V6(v6) => v6.to_bits(),
        };
        let gateways = self.placed.iter().fold(bits(self.pushed), |folded, &ip| {
            folded.rotate_left(32) ^ bits(ip)
        });
        state.write(self.user.as_bytes());
        state.write_u128(gateways);
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
mod tests {
    use std::hash::BuildHasher;

    use super::*;

    #[test]
    fn a_borrowed_mismatch_key_hashes_and_compares_as_its_owned_key() {
        let placed = ["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()];
        let borrowed = MismatchKey {
            user: "u1",
            placed: &placed,
            pushed: "10.0.0.3".parse().unwrap(),
        };
        let owned = borrowed.to_owned_key();
        let hasher = hashbrown::DefaultHashBuilder::default();
        assert_eq!(hasher.hash_one(borrowed), hasher.hash_one(&owned));
        assert!(hashbrown::Equivalent::equivalent(&borrowed, &owned));
        let other_user = MismatchKey {
            user: "u2",
            ..borrowed
        };
        assert!(!hashbrown::Equivalent::equivalent(&other_user, &owned));
        let upgrade = FoldKey::UpgradeOnGrpc {
            gateway: placed[0],
            port: 88,
            proxy_pid: 1,
        };
        assert!(!hashbrown::Equivalent::equivalent(&borrowed, &upgrade));
    }
}
