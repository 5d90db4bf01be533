//! Rebuilds the two consistent-hash rings from what crosses the wire, and decides from the
//! proxy's actual placements which ring it hashes with.
//!
//! Push's ring is read directly: its members are the `:authority` values it dials, tied to the
//! IPs dialled. The proxy's ring is not: the `Host` it sends is the address it dials, which the
//! correct fix (hash on `…:88`, dial port 80) makes differ from the string it hashes. So the
//! proxy's ring is inferred: over the same gateways, one candidate spells each member as the
//! proxy's `Host` does, the other as push does; the candidate that predicts where the proxy
//! really placed users is the proxy's ring.

use std::collections::BTreeMap;
use std::net::IpAddr;

use compact_str::CompactString;
use hashbrown::HashMap;

use crate::openim::hashring::{Ring, sample_user_ids};
use crate::openim::{diagnosis::Divergence, members::describe_member_difference};

/// Placements remembered as evidence (user → gateway IP of its latest placement).
const MAX_EVIDENCE: usize = 100_000;
/// Users whose two candidate picks differ that must agree with one candidate before a verdict.
const MIN_DECIDING_USERS: usize = 3;
/// Keys hashed to estimate the share of all users the two rings split.
const SAMPLE_KEYS: usize = 10_000;

#[derive(Debug, Default)]
pub struct LearnedRings {
    /// Gateway names as the proxy's `Host` spells them → IP dialled.
    proxy_hosts: BTreeMap<String, IpAddr>,
    /// Push's ring members (`:authority`) → IP dialled.
    push_members: BTreeMap<String, IpAddr>,
    /// Looked up once per placement: foldhash and inline ids, as the engine's other tables.
    evidence: HashMap<CompactString, IpAddr>,
    pub evidence_dropped: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Not enough placements that tell the candidates apart (always so with one gateway).
    Undetermined,
    /// The proxy places users where push's ring sends them.
    Agree,
    Diverge(Divergence),
}

impl LearnedRings {
    /// Records a name; returns whether the ring changed.
    pub fn learn_proxy_host(&mut self, name: &str, ip: IpAddr) -> bool {
        learn(&mut self.proxy_hosts, name, ip)
    }

    pub fn learn_push_member(&mut self, name: &str, ip: IpAddr) -> bool {
        learn(&mut self.push_members, name, ip)
    }

    /// Records where `user` was placed; returns whether that is news.
    pub fn record_placement(&mut self, user: &str, ip: IpAddr) -> bool {
        if let Some(known) = self.evidence.get_mut(user) {
            let moved = *known != ip;
            *known = ip;
            moved
        } else if self.evidence.len() < MAX_EVIDENCE {
            self.evidence.insert(user.into(), ip);
            true
        } else {
            self.evidence_dropped += 1;
            false
        }
    }

    /// A pair of names one gateway (one IP) goes by on the two sides, if they differ.
    pub fn spelling_difference(&self) -> Option<(String, String)> {
        self.proxy_hosts.iter().find_map(|(host, ip)| {
            self.push_members
                .iter()
                .find(|(member, member_ip)| *member_ip == ip && *member != host)
                .map(|(member, _)| (host.clone(), member.clone()))
        })
    }

    pub fn verdict(&self) -> Verdict {
        let Some((proxy_example, push_example)) = self.spelling_difference() else {
            // Same spelling on both sides (or nothing learned yet): nothing to split them.
            return Verdict::Undetermined;
        };
        let push_ring = Ring::new(self.push_members.keys().cloned());
        let proxy_members: Vec<String> = self
            .push_members
            .iter()
            .map(|(member, ip)| self.proxy_spelling(member, *ip, &proxy_example, &push_example))
            .collect();
        let proxy_ring = Ring::new(proxy_members.iter().cloned());
        // Both candidates have push's gateways in push's order: index i is the same gateway.
        let gateway_ips: Vec<IpAddr> = self.push_members.values().copied().collect();
        let pick = |ring: &Ring, user: &str| ring.get_index(user).ok().map(|i| gateway_ips[i]);

        let (mut follows_proxy, mut follows_push, mut split) = (0, 0, 0);
        for (user, placed) in &self.evidence {
            let (by_proxy, by_push) = (pick(&proxy_ring, user), pick(&push_ring, user));
            if by_proxy == by_push {
                continue;
            }
            split += 1;
            follows_proxy += usize::from(by_proxy == Some(*placed));
            follows_push += usize::from(by_push == Some(*placed));
        }
        if follows_push >= MIN_DECIDING_USERS && follows_push >= 2 * follows_proxy {
            return Verdict::Agree;
        }
        if follows_proxy < MIN_DECIDING_USERS || follows_proxy < 2 * follows_push {
            return Verdict::Undetermined;
        }
        let sample_split = sample_user_ids(SAMPLE_KEYS)
            .iter()
            .filter(|user| pick(&proxy_ring, user) != pick(&push_ring, user))
            .count();
        Verdict::Diverge(Divergence {
            difference: describe_member_difference(&proxy_example, &push_example),
            proxy_members,
            push_members: self.push_members.keys().cloned().collect(),
            proxy_example,
            push_example,
            placements_seen: self.evidence.len(),
            placements_split: split,
            sample_split_share: round3(sample_split as f64 / SAMPLE_KEYS as f64),
        })
    }

    /// The proxy's name for one of push's gateways: the `Host` seen for its IP, else push's
    /// name with the difference seen on another gateway applied (a suffix added or removed).
    fn proxy_spelling(
        &self,
        push_name: &str,
        ip: IpAddr,
        proxy_example: &str,
        push_example: &str,
    ) -> String {
        if let Some((host, _)) = self.proxy_hosts.iter().find(|(_, host_ip)| **host_ip == ip) {
            return host.clone();
        }
        if let Some(extra) = push_example.strip_prefix(proxy_example)
            && let Some(stripped) = push_name.strip_suffix(extra)
        {
            return stripped.to_owned();
        }
        if let Some(extra) = proxy_example.strip_prefix(push_example) {
            return format!("{push_name}{extra}");
        }
        push_name.to_owned()
    }
}

fn learn(members: &mut BTreeMap<String, IpAddr>, name: &str, ip: IpAddr) -> bool {
    if members.get(name) == Some(&ip) {
        return false;
    }
    // OpenIM runs tens of gateways; a flood of names must not grow this without bound.
    if members.len() >= 4096 && !members.contains_key(name) {
        return false;
    }
    members.insert(name.to_owned(), ip);
    true
}

fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openim::hashring::{MemberTemplate, PROXY_MEMBER_TEMPLATE, PUSH_MEMBER_TEMPLATE};

    fn members(template: &str, replicas: usize) -> Vec<String> {
        MemberTemplate::parse(template)
            .unwrap()
            .members("demo", "chat", replicas)
    }

    fn ip(index: usize) -> IpAddr {
        IpAddr::from([10, 244, 0, 10 + index as u8])
    }

    /// A cluster where the proxy hashes over `hashed` and sends `Host: dialled`.
    fn cluster(hashed: &[String], dialled: &[String], users: usize) -> LearnedRings {
        let push = members(PUSH_MEMBER_TEMPLATE, hashed.len());
        let mut rings = LearnedRings::default();
        for (index, member) in push.iter().enumerate() {
            rings.learn_push_member(member, ip(index));
        }
        let proxy_ring = Ring::new(hashed.iter().cloned());
        for user in 0..users {
            let user = format!("{}", 4_000_000_000u64 + user as u64 * 7_777);
            let index = proxy_ring.get_index(&user).unwrap();
            rings.learn_proxy_host(&dialled[index], ip(index));
            rings.record_placement(&user, ip(index));
        }
        rings
    }

    #[test]
    fn as_shipped_the_proxy_follows_its_own_spelling() {
        let proxy = members(PROXY_MEMBER_TEMPLATE, 5);
        let Verdict::Diverge(divergence) = cluster(&proxy, &proxy, 100).verdict() else {
            panic!("no divergence");
        };
        assert_eq!(
            divergence.difference,
            "push members carry ':88', proxy members do not"
        );
        assert_eq!(divergence.proxy_members, proxy);
        assert!(divergence.sample_split_share > 0.5);
    }

    #[test]
    fn the_correct_fix_hashes_like_push_whatever_host_it_sends() {
        let push = members(PUSH_MEMBER_TEMPLATE, 5);
        let host = members(PROXY_MEMBER_TEMPLATE, 5);
        assert_eq!(cluster(&push, &host, 100).verdict(), Verdict::Agree);
    }

    #[test]
    fn one_gateway_never_decides() {
        let proxy = members(PROXY_MEMBER_TEMPLATE, 1);
        assert_eq!(
            cluster(&proxy, &proxy, 100).verdict(),
            Verdict::Undetermined
        );
    }

    #[test]
    fn a_gateway_without_placements_gets_the_inferred_spelling() {
        let proxy = members(PROXY_MEMBER_TEMPLATE, 5);
        // Only two users: not every gateway has been seen from the proxy side.
        let mut rings = cluster(&proxy, &proxy, 2);
        assert_eq!(
            rings.verdict(),
            Verdict::Undetermined,
            "too little evidence"
        );
        for user in ["u-a", "u-b", "u-c", "u-d", "u-e", "u-f", "u-g", "u-h"] {
            let index = Ring::new(proxy.clone()).get_index(user).unwrap();
            rings.record_placement(user, ip(index));
        }
        let Verdict::Diverge(divergence) = rings.verdict() else {
            panic!("no divergence");
        };
        assert_eq!(divergence.proxy_members, proxy);
    }
}
