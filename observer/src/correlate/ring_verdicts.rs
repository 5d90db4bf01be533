//! When to compare the learned rings (`rings`): once membership has settled, at most once a
//! settle period, and a divergence reported once per membership.

use std::{net::IpAddr, sync::Arc};

use crate::{
    alert::{Alert, AlertBody},
    model::NANOS_PER_SEC,
    openim::{diagnosis, members::describe_member_difference},
};

use super::{
    rings::{LearnedRings, Verdict},
    shared::SharedRingEvidence,
};

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
}

impl RingVerdicts {
    pub fn new(settle_secs: u64) -> Self {
        Self {
            settle_secs,
            rings: LearnedRings::default(),
            members_changed_ns: None,
            evidence_since_verdict: false,
            last_verdict_ns: 0,
            reported_divergence: None,
            spelling_difference: None,
        }
    }

    /// The proxy placed `user` on `ip`, addressing it as `host`.
    pub fn placement(&mut self, host: Option<&str>, ip: IpAddr, user: &str, ts_ns: u64) {
        if let Some(host) = host
            && self.rings.learn_proxy_host(host, ip)
        {
            self.members_changed(ts_ns);
        }
        self.rings.record_placement(user, ip);
        self.evidence_since_verdict = true;
    }

    /// Push called the gateway at `ip`, addressing it as `authority`.
    pub fn push_call(&mut self, authority: Option<&str>, ip: IpAddr, ts_ns: u64) {
        if let Some(authority) = authority
            && self.rings.learn_push_member(authority, ip)
        {
            self.members_changed(ts_ns);
        }
    }

    /// Merges the cluster's shared evidence (cluster mode): members and placements other nodes
    /// saw count as if seen here; only news starts a new verdict.
    pub fn merge(&mut self, evidence: &SharedRingEvidence, ts_ns: u64) {
        let mut changed = false;
        for (host, ip) in &evidence.proxy {
            changed |= self.rings.learn_proxy_host(host, *ip);
        }
        for (member, ip) in &evidence.push {
            changed |= self.rings.learn_push_member(member, *ip);
        }
        if changed {
            self.members_changed(ts_ns);
        }
        // Oldest first, so the newest placement of a user wins.
        for (user, ip) in evidence.placements.iter().rev() {
            self.evidence_since_verdict |= self.rings.record_placement(user, *ip);
        }
    }

    /// What separates the two sides' spelling of one gateway, in plain words, if they differ.
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

    /// A learned member changed: texts quoting the members must be rebuilt.
    fn members_changed(&mut self, ts_ns: u64) {
        self.spelling_difference = None;
        self.members_changed_ns = Some(ts_ns);
    }

    /// Compares the rings if membership has settled (or `force`, at the end of input), and
    /// reports a divergence not reported yet.
    pub fn evaluate(&mut self, now_ns: u64, force: bool, alerts: &mut Vec<Alert>) {
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
        // Agree and Undetermined wait for new evidence; only a divergence is reported.
        let Verdict::Diverge(divergence) = self.rings.verdict() else {
            return;
        };
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
                proxy_members: divergence.proxy_members,
                push_members: divergence.push_members,
                difference: divergence.difference,
                placements_seen: divergence.placements_seen,
                placements_split: divergence.placements_split,
                sample_split_share: divergence.sample_split_share,
                diagnosis,
            },
        ));
        self.reported_divergence = Some(key);
    }
}

#[cfg(test)]
mod tests {
    use super::super::detectors::testing::*;

    #[test]
    fn differently_spelled_rings_diverge_once_settled() {
        let mut table = Detectors::new(RouteLimits::default());
        let mut alerts = Vec::new();
        // As shipped: the proxy places with a ring over its own spelling; push learns its
        // members from its calls.
        let place_users = |table: &mut Detectors, replicas: u8, from: u64, ts: u64| {
            let ring = crate::openim::hashring::Ring::new((0..replicas).map(proxy_name));
            for number in from..from + 30 {
                let user = (4_000_000_000 + number * 7_777).to_string();
                let index = ring.get_index(&user).unwrap() as u8;
                place(table, 10_000 + number, &user, index, ts);
            }
        };
        for index in 0..3u8 {
            alerts.extend(push(
                &mut table,
                100 + u64::from(index),
                &[],
                index,
                SEC,
                true,
            ));
        }
        place_users(&mut table, 3, 0, SEC);
        table.tick(2 * SEC, &mut alerts);
        assert!(alerts.is_empty(), "not settled yet");
        table.tick(5 * SEC, &mut alerts);
        assert_eq!(kinds(&alerts), ["ring_divergence"]);
        let AlertBody::RingDivergence {
            difference,
            proxy_members,
            push_members,
            sample_split_share,
            ..
        } = &*alerts[0].body
        else {
            unreachable!()
        };
        assert_eq!(difference, "push members carry ':88', proxy members do not");
        assert_eq!(proxy_members, &(0..3).map(proxy_name).collect::<Vec<_>>());
        assert_eq!(push_members.len(), 3);
        assert!(*sample_split_share > 0.3, "{sample_split_share}");
        table.tick(20 * SEC, &mut alerts);
        assert_eq!(alerts.len(), 1, "reported once while membership holds");
        // Scale-out: a fourth gateway appears on both sides.
        push(&mut table, 150, &[], 3, 30 * SEC, true);
        place_users(&mut table, 4, 1000, 30 * SEC);
        table.tick(40 * SEC, &mut alerts);
        assert_eq!(kinds(&alerts), ["ring_divergence", "ring_divergence"]);
    }
}
