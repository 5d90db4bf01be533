//! Decides when to compare the learned rings (`rings`): once membership has settled, at most once a
//! settle period, a divergence reported once per membership and closed once the rings agree
//! again; and why one user's push missed its WebSocket (`cause`).

use std::{net::IpAddr, sync::Arc};

use crate::{
    alert::{Alert, AlertBody, PushRoutingMode},
    model::{MismatchCause, NANOS_PER_SEC},
    openim::{
        diagnosis,
        members::{RingDivergenceState, describe_member_difference},
    },
};

use super::{
    rings::{Candidate, Learned, LearnedRings, Verdict, VerdictKind},
    shared::SharedRingEvidence,
};

/// Counts the placements that must arrive before `cause` compares the rings again while they have
/// not decided (at least this many, and at least a quarter of the evidence: amortised, a
/// comparison costs a few lookups per placement).
const MIN_PLACEMENTS_BEFORE_REJUDGING: usize = 32;

/// Decides when the learned rings are compared, reports their divergence, and explains a user's
/// miss.
pub struct RingVerdicts {
    /// Learned ring membership must be stable this long before a verdict.
    settle_secs: u64,
    rings: LearnedRings,
    /// When a learned member last changed; a verdict waits for membership to settle.
    members_changed_ns: Option<u64>,
    /// Placements arrived since the last verdict.
    evidence_since_verdict: bool,
    /// Verdicts rehash every placement seen: at most one per settle period.
    last_verdict_ns: u64,
    reported_divergence: Option<(Vec<String>, Vec<String>)>,
    /// How the two sides spell one gateway differently, computed once per membership change
    /// (every mismatch quotes it, and a misrouting incident produces mismatches by the
    /// thousand): `None` until computed, `Some(None)` when no gateway is spelled two ways.
    spelling_difference: Option<Option<Arc<str>>>,
    /// What the last comparison of the rings found, for `cause`; `None` after the members
    /// changed.
    judged: Option<VerdictKind>,
    /// Placements recorded since `judged`.
    placements_since_judged: usize,
    push_routing: PushRoutingMode,
    /// The divergence reported and not yet resolved.
    incident: Option<Incident>,
}

/// Records a reported divergence, open until the rings agree again.
#[derive(Clone, Copy, Debug)]
struct Incident {
    since_ns: u64,
    placements_checked: u64,
    pushes_checked: u64,
}

impl RingVerdicts {
    /// Builds the verdicts; membership must settle for `settle_secs` before one.
    pub fn new(settle_secs: u64) -> Self {
        Self {
            settle_secs,
            rings: LearnedRings::default(),
            members_changed_ns: None,
            evidence_since_verdict: false,
            last_verdict_ns: 0,
            reported_divergence: None,
            spelling_difference: None,
            judged: None,
            placements_since_judged: 0,
            push_routing: PushRoutingMode::Ring,
            incident: None,
        }
    }

    /// Records that the proxy placed `user` on `ip`, addressing it as `host`.
    pub fn placement(&mut self, host: Option<&str>, ip: IpAddr, user: &str, ts_ns: u64) {
        if let Some(host) = host {
            let learned = self.rings.learn_proxy_host(host, ip);
            self.members_changed(learned, ts_ns);
        }
        self.rings.record_placement(user, ip, ts_ns);
        self.evidence_since_verdict = true;
        self.placements_since_judged += 1;
        if let Some(incident) = &mut self.incident {
            incident.placements_checked += 1;
        }
    }

    /// Records that push called the gateway at `ip`, addressing it as `authority`.
    pub fn push_call(&mut self, authority: Option<&str>, ip: IpAddr, ts_ns: u64) {
        if let Some(authority) = authority {
            let learned = self.rings.learn_push_member(authority, ip);
            self.members_changed(learned, ts_ns);
        }
        if let Some(incident) = &mut self.incident {
            incident.pushes_checked += 1;
        }
    }

    /// Merges the cluster's shared evidence (cluster mode): members and placements other nodes
    /// saw count as if seen here; only news starts a new verdict.
    pub fn merge(&mut self, evidence: &SharedRingEvidence, ts_ns: u64) {
        let mut learned = Learned::Nothing;
        for (host, ip) in &evidence.proxy {
            learned = learned.max(self.rings.learn_proxy_host(host, *ip));
        }
        for (member, ip) in &evidence.push {
            learned = learned.max(self.rings.learn_push_member(member, *ip));
        }
        self.members_changed(learned, ts_ns);
        // Oldest first, so the newest placement of a user wins.
        for (user, ip) in evidence.placements.iter().rev() {
            if self.rings.record_placement(user, *ip, ts_ns) {
                self.evidence_since_verdict = true;
                self.placements_since_judged += 1;
            }
        }
    }

    /// Says what separates the two sides' spelling of one gateway, in plain words, if they differ.
    pub fn spelling_difference(&mut self) -> Option<Arc<str>> {
        let rings = &self.rings;
        self.spelling_difference
            .get_or_insert_with(|| {
                rings.spelling_difference().map(|(proxy_name, push_name)| {
                    describe_member_difference(&proxy_name, &push_name).into()
                })
            })
            .clone()
    }

    /// Returns why `user`, placed on `placed` (its gateways' IPs) since `placed_since_ns`, was
    /// pushed to `pushed` instead, as far as the learned rings tell.
    ///
    /// - [`MismatchCause::RingSpelling`]: the sides spell gateways differently, the proxy hashes
    ///   its own spelling (the verdict says so, or, before one, this user's placement under the
    ///   current members shows it), and that ring puts the user where it is.
    /// - [`MismatchCause::StalePlacement`]: the proxy's ring over the current members picks
    ///   the gateway push called, and the placement predates those members.
    /// - [`MismatchCause::PushRingLags`] / [`MismatchCause::ProxyRingLags`]: the proxy's names
    ///   show more (fewer) gateways than push's.
    ///
    /// Never a cause while push broadcasts: it has no ring.
    pub fn cause(&mut self, user: &str, placed: &[IpAddr], pushed: IpAddr) -> MismatchCause {
        if self.push_routing == PushRoutingMode::Broadcast {
            return MismatchCause::Undetermined;
        }
        let judged = self.judged_for_cause();
        let spelled_differently = self.spelling_difference().is_some();
        let proxy_spelled = self.pick_ip(Candidate::ProxySpelled, user);
        let push_pick = self.pick_ip(Candidate::PushSpelled, user);
        let is_placed = |pick: Option<IpAddr>| pick.is_some_and(|ip| placed.contains(&ip));
        // Push sent the user where only a ring over fewer gateways than push's would.
        if push_pick.is_some()
            && push_pick != Some(pushed)
            && self
                .rings
                .older_membership_picks(Candidate::PushSpelled, user, &[pushed])
        {
            return MismatchCause::PushRingLags;
        }
        // Which ring the proxy hashes with: its own spelling once the verdict says so, or
        // while undetermined when this user sits where that spelling (and not push's) puts it.
        let own_spelling = spelled_differently
            && match judged {
                VerdictKind::Diverge => true,
                VerdictKind::Agree | VerdictKind::SameSpelling => false,
                VerdictKind::Undetermined => {
                    is_placed(proxy_spelled)
                        && !is_placed(push_pick)
                        && !self
                            .rings
                            .older_membership_picks(Candidate::PushSpelled, user, placed)
                }
            };
        let (candidate, proxy_pick) = if own_spelling {
            (Candidate::ProxySpelled, proxy_spelled)
        } else {
            (Candidate::PushSpelled, push_pick)
        };
        // The two rings disagree for this user now.
        if own_spelling && proxy_pick.is_some() && proxy_pick != push_pick {
            return MismatchCause::RingSpelling;
        }
        if proxy_pick != Some(pushed) || is_placed(proxy_pick) {
            return MismatchCause::Undetermined;
        }
        // The rings agree now, and the user sits elsewhere: the proxy's names show fewer
        // gateways than push dials (it still hashes over them), or a ring over fewer gateways
        // put the user there before the membership grew.
        match self.rings.proxy_replicas().zip(self.rings.push_replicas()) {
            Some((proxy, push)) if proxy < push => MismatchCause::ProxyRingLags,
            _ if self.rings.older_membership_picks(candidate, user, placed) => {
                MismatchCause::StalePlacement
            }
            _ => MismatchCause::Undetermined,
        }
    }

    /// Returns the gateway IP one candidate ring picks for `user`, if known.
    fn pick_ip(&mut self, candidate: Candidate, user: &str) -> Option<IpAddr> {
        self.rings.pick(candidate, user).and_then(|pick| pick.ip)
    }

    /// Returns the last verdict, compared again while it is undetermined once enough placements
    /// came (the first mismatches of a scale-out come before the settled verdict does).
    fn judged_for_cause(&mut self) -> VerdictKind {
        let enough = MIN_PLACEMENTS_BEFORE_REJUDGING.max(self.rings.evidence_len() / 4);
        let rejudge = match self.judged {
            None => true,
            Some(VerdictKind::Undetermined) => self.placements_since_judged >= enough,
            Some(_) => false,
        };
        if rejudge {
            self.judged = Some(self.rings.verdict_kind());
            self.placements_since_judged = 0;
        }
        self.judged.unwrap_or_default()
    }

    /// Learns how push routes messages: with [`PushRoutingMode::Broadcast`] push has no ring,
    /// so no divergence is reported and no mismatch has a ring cause while it lasts; back to
    /// [`PushRoutingMode::Ring`], the rings are compared again.
    pub fn push_routing_learned(&mut self, mode: PushRoutingMode) {
        if mode == PushRoutingMode::Ring && self.push_routing == PushRoutingMode::Broadcast {
            self.evidence_since_verdict = true;
        }
        self.push_routing = mode;
    }

    /// Notes that a learned member changed: texts quoting the members must be rebuilt, and a
    /// verdict waits for membership to settle.
    fn members_changed(&mut self, learned: Learned, ts_ns: u64) {
        if learned == Learned::Nothing {
            return;
        }
        self.spelling_difference = None;
        self.members_changed_ns = Some(ts_ns);
        if learned == Learned::Membership {
            self.judged = None;
        }
    }

    /// Compares the rings if membership has settled (or `force`, at the end of input), reports
    /// a divergence not reported yet, and resolves a reported one once the rings agree.
    pub fn evaluate(&mut self, now_ns: u64, force: bool, alerts: &mut Vec<Alert>) {
        if self.push_routing == PushRoutingMode::Broadcast {
            return;
        }
        if self.members_changed_ns.is_none() && !self.evidence_since_verdict {
            return;
        }
        let settle = self.settle_secs * NANOS_PER_SEC;
        if !force {
            let membership_moving = self
                .members_changed_ns
                .is_some_and(|changed| now_ns.saturating_sub(changed) < settle);
            if membership_moving || now_ns.saturating_sub(self.last_verdict_ns) < settle {
                return;
            }
        }
        self.members_changed_ns = None;
        self.evidence_since_verdict = false;
        self.last_verdict_ns = now_ns;
        let verdict = self.rings.verdict();
        self.judged = Some(verdict.kind());
        self.placements_since_judged = 0;
        match verdict {
            Verdict::Diverge {
                divergence,
                complete,
            } => {
                let key = (
                    divergence.proxy_members.clone(),
                    divergence.push_members.clone(),
                );
                if self.reported_divergence.as_ref() == Some(&key) {
                    return;
                }
                let diagnosis = diagnosis::ring_divergence(&divergence);
                alerts.push(Alert::new(
                    now_ns,
                    AlertBody::RingDivergence {
                        state: RingDivergenceState::Diverged,
                        proxy_members: divergence.proxy_members,
                        push_members: divergence.push_members,
                        difference: divergence.difference,
                        complete,
                        placements_seen: divergence.placements_seen,
                        placements_split: divergence.placements_split,
                        sample_split_share: divergence.sample_split_share,
                        lasted_secs: None,
                        placements_checked: None,
                        pushes_checked: None,
                        diagnosis,
                    },
                ));
                self.reported_divergence = Some(key);
                self.incident.get_or_insert(Incident {
                    since_ns: now_ns,
                    placements_checked: 0,
                    pushes_checked: 0,
                });
            }
            Verdict::Agree | Verdict::SameSpelling => {
                if let Some(alert) = self.resolve(&verdict, now_ns) {
                    alerts.push(alert);
                }
            }
            Verdict::Undetermined => {}
        }
    }

    /// Closes the open incident, if any: its `resolved` line.
    fn resolve(&mut self, verdict: &Verdict, now_ns: u64) -> Option<Alert> {
        let incident = self.incident.take()?;
        self.reported_divergence = None;
        let (_, push_members) = self.rings.members().unwrap_or_default();
        let difference = match (verdict, self.rings.spelling_difference()) {
            (Verdict::Agree, Some((proxy_example, push_example))) => format!(
                "the proxy hashes push's member strings while addressing gateways as \
                '{proxy_example}' (push: '{push_example}')"
            ),
            _ => {
                let example = push_members.first().map_or("", String::as_str);
                describe_member_difference(example, example)
            }
        };
        let lasted_secs = now_ns.saturating_sub(incident.since_ns) / NANOS_PER_SEC;
        let diagnosis = resolved_diagnosis(&incident, lasted_secs);
        Some(Alert::new(
            now_ns,
            AlertBody::RingDivergence {
                state: RingDivergenceState::Resolved,
                // The proxy's ring is push's now.
                proxy_members: push_members.clone(),
                push_members,
                difference,
                complete: self.rings.complete(),
                placements_seen: self.rings.evidence_len(),
                placements_split: 0,
                sample_split_share: 0.0,
                lasted_secs: Some(lasted_secs),
                placements_checked: Some(incident.placements_checked),
                pushes_checked: Some(incident.pushes_checked),
                diagnosis,
            },
        ))
    }

    /// Returns the gateway push's rebuilt ring picks for `user`: its member and, once dialled, its
    /// IP.
    #[cfg(test)]
    pub(crate) fn push_ring_pick(&mut self, user: &str) -> Option<(String, Option<IpAddr>)> {
        self.rings
            .pick(Candidate::PushSpelled, user)
            .map(|pick| (pick.member, pick.ip))
    }

    /// Returns the gateway the proxy-spelled candidate ring picks for `user`.
    #[cfg(test)]
    pub(crate) fn proxy_ring_pick(&mut self, user: &str) -> Option<(String, Option<IpAddr>)> {
        self.rings
            .pick(Candidate::ProxySpelled, user)
            .map(|pick| (pick.member, pick.ip))
    }
}

/// Writes what a `resolved` line says. (Kept here until `openim::diagnosis` holds it with the
/// rest.)
fn resolved_diagnosis(incident: &Incident, lasted_secs: u64) -> String {
    format!(
        "Resolved: msggateway-proxy now places users where push's ring sends them. The divergence \
        lasted {lasted_secs}s; {} placements and {} push calls were checked since it was raised. \
        WebSockets placed while it lasted stay where the old ring put them until they reconnect \
        (route_mismatch names them)",
        incident.placements_checked, incident.pushes_checked
    )
}

#[cfg(test)]
mod tests;
