//! Rebuilds the two consistent-hash rings from what crosses the wire, as upstream builds them,
//! and decides from the proxy's actual placements which ring it hashes with.
//!
//! Upstream (push's `kubernetes.go`, the proxy's `common/consistentHash.go`) adds the gateways
//! `0..MY_MSGGATEWAY_REPLICACOUNT-1` in index order, whether or not each pod is up. The wire
//! shows only the names each side dials: push's `:authority`, the proxy's `Host`. Both name a
//! StatefulSet pod, whose ordinal is the number after the last `-` of the first DNS label
//! (`demo-openim-msggateway-12.demo-openim-msggateway-headless.chat.svc.cluster.local:88` →
//! 12). So both rings are rebuilt by ordinal: the replica count is the highest ordinal seen on
//! either side plus one, and a gateway no side has dialled yet is spelled as the seen ones are,
//! its ordinal replaced in the first label. Its IP is unknown: a pick landing on it is an
//! unknown gateway, neither a match nor a split. Names without an ordinal (or sides that spell
//! it in several ways) fall back to the names seen, in text order.
//!
//! The proxy's ring is not read directly: the `Host` it sends is the address it dials, which the
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

/// Bounds the placements remembered as evidence (user → gateway IP of its latest placement).
const MAX_EVIDENCE: usize = 100_000;
/// Counts the users whose two candidate picks differ that must agree with one candidate before a
/// verdict.
const MIN_DECIDING_USERS: usize = 3;
/// Counts the keys hashed to estimate the share of all users the two rings split.
const SAMPLE_KEYS: usize = 10_000;
/// Bounds the names remembered per side: OpenIM runs tens of gateways; a flood of names must not
/// grow this without bound.
const MAX_NAMES: usize = 4096;
/// Bounds the StatefulSet ordinals: ones at or above this are not read as such, so that one odd
/// name cannot make the rebuilt rings huge.
const MAX_REPLICAS: u32 = 1024;

/// Holds the gateway names each side dialled and the placements seen, and rebuilds the two
/// candidate rings from them.
#[derive(Debug, Default)]
pub struct LearnedRings {
    /// Gateway names as the proxy's `Host` spells them.
    proxy: Side,
    /// Push's ring members (`:authority`).
    push: Side,
    /// User → gateway IP and time of its latest placement. Looked up once per placement:
    /// foldhash and inline ids, as the engine's other tables.
    evidence: HashMap<CompactString, (IpAddr, u64)>,
    pub evidence_dropped: u64,
    /// The rebuilt rings, built when first needed after a name or address was learned.
    candidates: Option<Candidates>,
}

/// Holds the names one side dialled, and how they spell an ordinal.
#[derive(Debug, Default)]
struct Side {
    /// Name → IP dialled.
    names: BTreeMap<String, IpAddr>,
    spelling: Spelling,
    /// Highest ordinal seen plus one, while `spelling` is [`Spelling::Ordinal`].
    replicas: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
enum Spelling {
    /// No name yet.
    #[default]
    Empty,
    /// Every name is `prefix`, an ordinal, then `suffix`.
    Ordinal { prefix: String, suffix: String },
    /// Some name has no ordinal, or names disagree around it: the names, in text order.
    Unordered,
}

/// Says what learning a name changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Learned {
    Nothing,
    /// A name or an IP is new, but the rings' members are the same strings in the same order.
    Address,
    /// The rings' members changed: a replica count, a spelling, or an unordered name.
    Membership,
}

/// Holds the two candidate rings over the same gateways: gateway `i` is member `i` of both.
#[derive(Debug)]
struct Candidates {
    /// Gateway `i`'s IP, when a side dialled it.
    gateways: Vec<Option<IpAddr>>,
    proxy_spelled: Ring,
    push_spelled: Ring,
    /// Every gateway `0..n-1` seen on both sides.
    complete: bool,
    /// Each candidate over members `0..k` for every `k` below the replica count, built when
    /// first asked for (see [`LearnedRings::older_membership_picks`]).
    older_proxy_spelled: Option<Vec<Ring>>,
    older_push_spelled: Option<Vec<Ring>>,
}

/// Says which candidate a user's gateway comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Candidate {
    /// Push's members, spelled as the proxy's `Host` spells them.
    ProxySpelled,
    /// Push's members as push spells them.
    PushSpelled,
}

/// Describes a gateway one candidate ring picks for a user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pick {
    pub member: String,
    /// `None` for a gateway no side has dialled yet.
    pub ip: Option<IpAddr>,
}

/// Says what comparing the candidate rings over the placements found, with the evidence.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Not enough placements that tell the candidates apart (always so with one gateway), or no
    /// gateway seen on both sides yet.
    Undetermined,
    /// Both sides spell the gateways they both dialled the same way: there is one ring.
    SameSpelling,
    /// The proxy places users where push's ring sends them.
    Agree,
    Diverge {
        divergence: Divergence,
        /// Every gateway `0..n-1` of the rebuilt rings was seen on both sides.
        complete: bool,
    },
}

/// Holds a [`Verdict`] without its evidence, as `ring_verdicts` remembers it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VerdictKind {
    #[default]
    Undetermined,
    SameSpelling,
    Agree,
    Diverge,
}

impl Verdict {
    /// Returns what the verdict says, without its evidence.
    pub fn kind(&self) -> VerdictKind {
        match self {
            Self::Undetermined => VerdictKind::Undetermined,
            Self::SameSpelling => VerdictKind::SameSpelling,
            Self::Agree => VerdictKind::Agree,
            Self::Diverge { .. } => VerdictKind::Diverge,
        }
    }
}

/// Counts how the evidence falls between the two candidates.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    /// Placements made under the current members.
    seen: usize,
    follows_proxy: usize,
    follows_push: usize,
    split: usize,
}

impl Tally {
    fn kind(self) -> VerdictKind {
        if self.follows_push >= MIN_DECIDING_USERS && self.follows_push >= 2 * self.follows_proxy {
            VerdictKind::Agree
        } else if self.follows_proxy < MIN_DECIDING_USERS
            || self.follows_proxy < 2 * self.follows_push
        {
            VerdictKind::Undetermined
        } else {
            VerdictKind::Diverge
        }
    }
}

impl LearnedRings {
    /// Records a name the proxy's `Host` gave the gateway at `ip`.
    pub fn learn_proxy_host(&mut self, name: &str, ip: IpAddr) -> Learned {
        self.learn(false, name, ip)
    }

    /// Records a name push's `:authority` gave the gateway at `ip`.
    pub fn learn_push_member(&mut self, name: &str, ip: IpAddr) -> Learned {
        self.learn(true, name, ip)
    }

    fn learn(&mut self, push: bool, name: &str, ip: IpAddr) -> Learned {
        let before = self.layout();
        let side = if push {
            &mut self.push
        } else {
            &mut self.proxy
        };
        let names = side.names.len();
        match side.names.get_mut(name) {
            Some(known) if *known == ip => return Learned::Nothing,
            Some(known) => *known = ip,
            None if names >= MAX_NAMES => return Learned::Nothing,
            None => {
                side.names.insert(name.to_owned(), ip);
                side.admit(name);
            }
        }
        self.candidates = None;
        if self.layout() == before {
            Learned::Address
        } else {
            Learned::Membership
        }
    }

    /// Returns what the rings' member lists depend on: the replica count and both spellings (and,
    /// for names without ordinals, how many there are).
    fn layout(&self) -> (u32, Spelling, Spelling, usize, usize) {
        let unordered = |side: &Side| match side.spelling {
            Spelling::Unordered => side.names.len(),
            _ => 0,
        };
        (
            self.replicas(),
            self.push.spelling.clone(),
            self.proxy.spelling.clone(),
            unordered(&self.push),
            unordered(&self.proxy),
        )
    }

    /// Returns the replica count the ordinals show: the highest seen on either side plus one.
    fn replicas(&self) -> u32 {
        self.push
            .ordinal_replicas()
            .max(self.proxy.ordinal_replicas())
    }

    /// Returns how many gateways the proxy's names show (its highest ordinal plus one, or its
    /// names); `None` before it named one.
    pub fn proxy_replicas(&self) -> Option<usize> {
        self.proxy.replicas_shown()
    }

    /// Returns how many gateways push's names show (its highest ordinal plus one, or its names);
    /// `None` before it named one.
    pub fn push_replicas(&self) -> Option<usize> {
        self.push.replicas_shown()
    }

    /// Records where `user` was placed at `ts_ns`; returns whether that is news.
    pub fn record_placement(&mut self, user: &str, ip: IpAddr, ts_ns: u64) -> bool {
        if let Some(known) = self.evidence.get_mut(user) {
            let moved = known.0 != ip;
            *known = (ip, ts_ns);
            moved
        } else if self.evidence.len() < MAX_EVIDENCE {
            self.evidence.insert(user.into(), (ip, ts_ns));
            true
        } else {
            self.evidence_dropped += 1;
            false
        }
    }

    /// Counts the placements remembered as evidence.
    pub fn evidence_len(&self) -> usize {
        self.evidence.len()
    }

    /// Returns a pair of names one gateway (one IP) goes by on the two sides, if they differ.
    pub fn spelling_difference(&self) -> Option<(String, String)> {
        self.proxy.names.iter().find_map(|(host, ip)| {
            self.push
                .names
                .iter()
                .find(|(member, member_ip)| *member_ip == ip && *member != host)
                .map(|(member, _)| (host.clone(), member.clone()))
        })
    }

    /// Says whether some gateway goes by the same name on both sides.
    fn spelled_alike(&self) -> bool {
        self.proxy
            .names
            .iter()
            .any(|(host, ip)| self.push.names.get(host) == Some(ip))
    }

    /// Says whether every gateway `0..n-1` of the rebuilt rings was seen on both sides.
    pub fn complete(&mut self) -> bool {
        self.candidates()
            .is_some_and(|candidates| candidates.complete)
    }

    /// Tells whether a ring of `candidate`'s spelling over fewer gateways than now (an older
    /// membership, members `0..k` for some `k` below the replica count) puts `user` on one of
    /// `gateways`: the evidence that a placement predates the membership, or that a push
    /// followed a ring that lags it. Builds those rings once per membership.
    pub fn older_membership_picks(
        &mut self,
        candidate: Candidate,
        user: &str,
        gateways: &[IpAddr],
    ) -> bool {
        let Some(candidates) = self.candidates.as_mut() else {
            return false;
        };
        let members = candidates.ring(candidate).members().to_vec();
        let older = match candidate {
            Candidate::ProxySpelled => &mut candidates.older_proxy_spelled,
            Candidate::PushSpelled => &mut candidates.older_push_spelled,
        };
        let older = older.get_or_insert_with(|| {
            (1..members.len())
                .map(|count| Ring::new(members[..count].iter().cloned()))
                .collect()
        });
        older.iter().any(|ring| {
            ring.get_index(user)
                .ok()
                .and_then(|index| candidates.gateways.get(index).copied().flatten())
                .is_some_and(|ip| gateways.contains(&ip))
        })
    }

    /// Returns the gateway `candidate` picks for `user`, if push's side is known.
    pub fn pick(&mut self, candidate: Candidate, user: &str) -> Option<Pick> {
        let candidates = self.candidates()?;
        let ring = candidates.ring(candidate);
        let index = ring.get_index(user).ok()?;
        Some(Pick {
            member: ring.members()[index].clone(),
            ip: candidates.gateways[index],
        })
    }

    /// Returns the rings' members, proxy-spelled then push-spelled, in the order they are added.
    pub fn members(&mut self) -> Option<(Vec<String>, Vec<String>)> {
        let candidates = self.candidates()?;
        Some((
            candidates.proxy_spelled.members().to_vec(),
            candidates.push_spelled.members().to_vec(),
        ))
    }

    /// Compares the candidates over every placement remembered.
    pub fn verdict(&mut self) -> Verdict {
        let Some((proxy_example, push_example)) = self.spelling_difference() else {
            // Same spelling on both sides (or nothing learned yet): nothing to split them.
            return if self.spelled_alike() {
                Verdict::SameSpelling
            } else {
                Verdict::Undetermined
            };
        };
        let Some(tally) = self.tally() else {
            return Verdict::Undetermined;
        };
        match tally.kind() {
            VerdictKind::Diverge => {}
            VerdictKind::Agree => return Verdict::Agree,
            VerdictKind::Undetermined | VerdictKind::SameSpelling => return Verdict::Undetermined,
        }
        let Some(candidates) = self.candidates() else {
            return Verdict::Undetermined;
        };
        let sample_split = sample_user_ids(SAMPLE_KEYS)
            .iter()
            .filter(|user| {
                candidates.proxy_spelled.get_index(user).ok()
                    != candidates.push_spelled.get_index(user).ok()
            })
            .count();
        Verdict::Diverge {
            divergence: Divergence {
                difference: describe_member_difference(&proxy_example, &push_example),
                proxy_members: candidates.proxy_spelled.members().to_vec(),
                push_members: candidates.push_spelled.members().to_vec(),
                proxy_example,
                push_example,
                placements_seen: tally.seen,
                placements_split: tally.split,
                sample_split_share: round3(sample_split as f64 / SAMPLE_KEYS as f64),
            },
            complete: candidates.complete,
        }
    }

    /// Says which candidate the placements follow, as far as they tell, without the evidence a
    /// reported verdict quotes.
    pub fn verdict_kind(&mut self) -> VerdictKind {
        if self.spelling_difference().is_none() {
            return if self.spelled_alike() {
                VerdictKind::SameSpelling
            } else {
                VerdictKind::Undetermined
            };
        }
        self.tally().map_or(VerdictKind::Undetermined, Tally::kind)
    }

    /// Counts the placements made under the current members that the candidates put on
    /// different known gateways, and which candidate each of them followed.
    fn tally(&mut self) -> Option<Tally> {
        self.refresh();
        let candidates = self.candidates.as_ref()?;
        let mut tally = Tally::default();
        for (user, (placed, _)) in &self.evidence {
            tally.seen += 1;
            let (Ok(by_proxy), Ok(by_push)) = (
                candidates.proxy_spelled.get_index(user),
                candidates.push_spelled.get_index(user),
            ) else {
                continue;
            };
            let (Some(by_proxy), Some(by_push)) =
                (candidates.gateways[by_proxy], candidates.gateways[by_push])
            else {
                // A pick on a gateway no side has dialled yet: neither a match nor a split.
                continue;
            };
            if by_proxy == by_push {
                continue;
            }
            tally.split += 1;
            tally.follows_proxy += usize::from(by_proxy == *placed);
            tally.follows_push += usize::from(by_push == *placed);
        }
        Some(tally)
    }

    fn candidates(&mut self) -> Option<&Candidates> {
        self.refresh();
        self.candidates.as_ref()
    }

    /// Rebuilds the candidates if a name or address was learned since they were built.
    fn refresh(&mut self) {
        if self.candidates.is_none() {
            self.candidates = self.build();
        }
    }

    /// Builds both candidates over push's gateways, by ordinal when push's names have one.
    fn build(&self) -> Option<Candidates> {
        let (push_members, gateways): (Vec<String>, Vec<Option<IpAddr>>) = match &self.push.spelling
        {
            Spelling::Empty => return None,
            Spelling::Ordinal { prefix, suffix } => (0..self.replicas())
                .map(|ordinal| {
                    let member = format!("{prefix}{ordinal}{suffix}");
                    let ip = self
                        .push
                        .names
                        .get(&member)
                        .copied()
                        .or_else(|| self.proxy.ordinal_ip(ordinal));
                    (member, ip)
                })
                .unzip(),
            Spelling::Unordered => self
                .push
                .names
                .iter()
                .map(|(member, ip)| (member.clone(), Some(*ip)))
                .unzip(),
        };
        let proxy_members: Vec<String> = match (&self.push.spelling, &self.proxy.spelling) {
            (Spelling::Ordinal { .. }, Spelling::Ordinal { prefix, suffix }) => (0..self
                .replicas())
                .map(|ordinal| format!("{prefix}{ordinal}{suffix}"))
                .collect(),
            _ => {
                let example = self.spelling_difference();
                push_members
                    .iter()
                    .zip(&gateways)
                    .map(|(member, ip)| self.proxy_spelling(member, *ip, example.as_ref()))
                    .collect()
            }
        };
        let complete = matches!(self.push.spelling, Spelling::Ordinal { .. })
            && push_members.iter().zip(&proxy_members).zip(&gateways).all(
                |((push_member, proxy_member), ip)| {
                    self.push.names.contains_key(push_member)
                        && (self.proxy.names.contains_key(proxy_member)
                            || ip.is_some_and(|ip| self.proxy.names.values().any(|at| *at == ip)))
                },
            );
        Some(Candidates {
            gateways,
            proxy_spelled: Ring::new(proxy_members),
            push_spelled: Ring::new(push_members),
            complete,
            older_proxy_spelled: None,
            older_push_spelled: None,
        })
    }

    /// Returns the proxy's name for one of push's gateways: the `Host` seen for its IP, else push's
    /// name with the difference seen on another gateway applied (a suffix added or removed).
    fn proxy_spelling(
        &self,
        push_name: &str,
        ip: Option<IpAddr>,
        example: Option<&(String, String)>,
    ) -> String {
        if let Some(ip) = ip
            && let Some((host, _)) = self.proxy.names.iter().find(|(_, host_ip)| **host_ip == ip)
        {
            return host.clone();
        }
        let Some((proxy_example, push_example)) = example else {
            return push_name.to_owned();
        };
        if let Some(extra) = push_example.strip_prefix(proxy_example.as_str())
            && let Some(stripped) = push_name.strip_suffix(extra)
        {
            return stripped.to_owned();
        }
        if let Some(extra) = proxy_example.strip_prefix(push_example.as_str()) {
            return format!("{push_name}{extra}");
        }
        push_name.to_owned()
    }
}

impl Side {
    /// Reads a new name's ordinal into the side's spelling.
    fn admit(&mut self, name: &str) {
        let parsed = split_ordinal(name);
        match (&self.spelling, parsed) {
            (Spelling::Empty, Some((prefix, ordinal, suffix))) => {
                self.spelling = Spelling::Ordinal {
                    prefix: prefix.to_owned(),
                    suffix: suffix.to_owned(),
                };
                self.replicas = ordinal + 1;
            }
            (Spelling::Ordinal { prefix, suffix }, Some((new_prefix, ordinal, new_suffix)))
                if prefix == new_prefix && suffix == new_suffix =>
            {
                self.replicas = self.replicas.max(ordinal + 1);
            }
            (Spelling::Unordered, _) => {}
            _ => {
                self.spelling = Spelling::Unordered;
                self.replicas = 0;
            }
        }
    }

    fn ordinal_replicas(&self) -> u32 {
        match self.spelling {
            Spelling::Ordinal { .. } => self.replicas,
            _ => 0,
        }
    }

    fn replicas_shown(&self) -> Option<usize> {
        match self.spelling {
            Spelling::Empty => None,
            Spelling::Ordinal { .. } => Some(self.replicas as usize),
            Spelling::Unordered => Some(self.names.len()),
        }
    }

    /// Returns the IP of the gateway with `ordinal`, if this side dialled it.
    fn ordinal_ip(&self, ordinal: u32) -> Option<IpAddr> {
        let Spelling::Ordinal { prefix, suffix } = &self.spelling else {
            return None;
        };
        self.names
            .get(&format!("{prefix}{ordinal}{suffix}"))
            .copied()
    }
}

impl Candidates {
    fn ring(&self, candidate: Candidate) -> &Ring {
        match candidate {
            Candidate::ProxySpelled => &self.proxy_spelled,
            Candidate::PushSpelled => &self.push_spelled,
        }
    }
}

/// Splits a member string around its StatefulSet ordinal, the number after the last `-` of the
/// first DNS label: `("demo-openim-msggateway-", 12, ".demo-….local:88")`. The ordinal is
/// written as Kubernetes writes it (decimal, no leading zero) and below [`MAX_REPLICAS`].
fn split_ordinal(name: &str) -> Option<(&str, u32, &str)> {
    let label_end = name.find(['.', ':']).unwrap_or(name.len());
    let dash = name[..label_end].rfind('-')?;
    let digits = &name[dash + 1..label_end];
    let canonical = !digits.is_empty()
        && digits.bytes().all(|byte| byte.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    let ordinal = digits
        .parse()
        .ok()
        .filter(|ordinal| canonical && *ordinal < MAX_REPLICAS)?;
    Some((&name[..=dash], ordinal, &name[label_end..]))
}

fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests;
