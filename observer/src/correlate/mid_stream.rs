//! Tracks the placements the observer could not see: WebSockets adopted at start were upgraded
//! before it watched, so whose they are is unknown. While any is open, a push to a user without a
//! seen placement may be a misroute the observer cannot judge: it says so once with
//! `capture_degraded` (`joined_mid_stream`), and again (`recovered`) when the last of them
//! closed.

use std::collections::HashSet;

use crate::{
    alert::{Alert, AlertBody, DegradedReason, DegradedState},
    model::{ConnectionId, rfc3339},
    openim::diagnosis,
};

/// Tracks the adopted WebSockets whose user is unknown, and the pushes they leave unjudged.
#[derive(Default)]
pub struct MidStream {
    /// Adopted WebSocket connections still open, their user unknown. Bounded by what the
    /// decoders track (`max_connections * UPGRADED_PER_SLOT`): they are added from there.
    unseen: HashSet<ConnectionId>,
    /// While degraded: since when, and the recipients not judged meanwhile.
    degraded_since_ns: Option<u64>,
    recipients_unjudged: u64,
}

impl MidStream {
    /// Records a WebSocket adopted at start, its user unknown.
    pub fn websocket_adopted(&mut self, connection: ConnectionId) {
        self.unseen.insert(connection);
    }

    /// Returns the adopted WebSockets still open whose user is unknown.
    pub fn unseen_connections(&self) -> impl Iterator<Item = ConnectionId> + '_ {
        self.unseen.iter().copied()
    }

    /// Notes a push to `recipients_without_placement` users whose placement was not seen.
    pub fn unjudged(
        &mut self,
        recipients_without_placement: usize,
        ts_ns: u64,
        alerts: &mut Vec<Alert>,
    ) {
        if self.unseen.is_empty() || recipients_without_placement == 0 {
            return;
        }
        self.recipients_unjudged += recipients_without_placement as u64;
        if self.degraded_since_ns.is_some() {
            return;
        }
        self.degraded_since_ns = Some(ts_ns);
        alerts.push(self.alert(ts_ns, ts_ns, DegradedState::Degraded));
    }

    /// Forgets `connection`; the last of them closing ends the degraded episode.
    pub fn closed(&mut self, connection: ConnectionId, ts_ns: u64, alerts: &mut Vec<Alert>) {
        if !self.unseen.remove(&connection) || !self.unseen.is_empty() {
            return;
        }
        if let Some(since_ns) = self.degraded_since_ns.take() {
            alerts.push(self.alert(since_ns, ts_ns, DegradedState::Recovered));
            self.recipients_unjudged = 0;
        }
    }

    fn alert(&self, since_ns: u64, ts_ns: u64, state: DegradedState) -> Alert {
        let affects = format!(
            "{} WebSocket connection(s) adopted at start, upgraded before the observer watched: \
             their users' placements are unknown, so pushes to users without a seen placement \
             cannot be judged ({} recipient(s) so far)",
            self.unseen.len(),
            self.recipients_unjudged,
        );
        Alert::new(
            ts_ns,
            AlertBody::CaptureDegraded {
                reason: DegradedReason::JoinedMidStream,
                state,
                since: rfc3339(since_ns),
                affects,
                affected: None,
                diagnosis: diagnosis::joined_mid_stream(state == DegradedState::Recovered),
            },
        )
    }
}

#[cfg(test)]
mod tests;
