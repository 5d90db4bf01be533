//! Counts the users misrouted right now, as the printed route_mismatch alerts tell: a user counts
//! from an alert until its fold window would have closed.

use std::{collections::HashMap, time::Instant};

use crate::model::UserId;

/// Bounds the users tracked; beyond it a new user is counted only once an old one expires, so
/// the gauge is a floor under a flood of mismatches, never unbounded memory.
const MAX_USERS: usize = 100_000;

/// Tracks the users with a route_mismatch alert printed within its fold window.
#[derive(Debug, Default)]
pub(super) struct MisroutedUsers {
    /// User → when its latest window closes.
    until: HashMap<UserId, Instant>,
    /// Gateway labels `misrouted_recipients_total` holds.
    pub(super) gateway_labels: usize,
}

impl MisroutedUsers {
    /// Counts `user` misrouted until `until`.
    pub(super) fn seen(&mut self, user: &UserId, until: Instant) {
        if let Some(known) = self.until.get_mut(user) {
            *known = (*known).max(until);
            return;
        }
        if self.until.len() >= MAX_USERS {
            self.expire(Instant::now());
        }
        if self.until.len() < MAX_USERS {
            self.until.insert(user.clone(), until);
        }
    }

    /// Counts the users still misrouted at `now`, dropping the others.
    pub(super) fn count(&mut self, now: Instant) -> usize {
        self.expire(now);
        self.until.len()
    }

    fn expire(&mut self, now: Instant) {
        self.until.retain(|_, until| *until > now);
    }
}

#[cfg(test)]
mod tests;
