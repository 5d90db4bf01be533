//! Counts, per pusher, how many gRPC connections it opens, holds and calls on: a pusher that opens
//! a connection per call and never closes them raises `push_connection_churn`.

use std::collections::VecDeque;

use compact_str::CompactString;
use hashbrown::HashMap;

use crate::{
    alert::{Alert, AlertBody},
    model::{ConnectionId, NANOS_PER_SEC, Process},
    openim::diagnosis,
};

use super::RouteLimits;

#[derive(Debug, Default)]
struct PusherActivity {
    comm: CompactString,
    cgroup_id: u64,
    opened_at: VecDeque<u64>,
    called_at: VecDeque<u64>,
    open: u64,
    last_alert_ns: Option<u64>,
}

/// Watches each pusher's gRPC connections for `push_connection_churn`.
pub struct Churn {
    min_new_connections: u64,
    window_secs: u64,
    /// An alert for one pusher is not repeated within this many seconds.
    repeat_after_secs: u64,
    max_connections: usize,
    pushers: HashMap<u32, PusherActivity>,
    /// The pusher of each gRPC connection, so that its close lowers the open count.
    pushers_by_connection: HashMap<ConnectionId, u32>,
    connections_evicted: u64,
}

impl Churn {
    /// Builds an empty watch with the limits' window, threshold and bound.
    pub fn new(limits: &RouteLimits) -> Self {
        Self {
            min_new_connections: limits.churn_min_new_connections,
            window_secs: limits.churn_window_secs,
            repeat_after_secs: limits.fold_window_secs,
            max_connections: limits.max_tracked_connections,
            pushers: HashMap::new(),
            pushers_by_connection: HashMap::new(),
            connections_evicted: 0,
        }
    }

    /// Returns the gRPC connections it counts as open.
    pub fn connections(&self) -> impl Iterator<Item = ConnectionId> + '_ {
        self.pushers_by_connection.keys().copied()
    }

    /// Counts the connections left untracked because the table was full.
    pub fn connections_evicted(&self) -> u64 {
        self.connections_evicted
    }

    /// Records a gRPC connection `pusher` opened, and assesses the pusher at once.
    pub fn opened(
        &mut self,
        connection: ConnectionId,
        ts_ns: u64,
        pusher: Process,
        alerts: &mut Vec<Alert>,
    ) {
        if self.pushers_by_connection.len() >= self.max_connections
            && !self.pushers_by_connection.contains_key(&connection)
        {
            self.connections_evicted += 1;
            return;
        }
        self.pushers_by_connection.insert(connection, pusher.pid);
        let activity = self.pushers.entry(pusher.pid).or_default();
        activity.comm = pusher.comm;
        activity.cgroup_id = pusher.cgroup_id;
        activity.open += 1;
        push_bounded(&mut activity.opened_at, ts_ns, self.window_secs);
        // At once, not at the next tick: a short burst may be over (and its connections torn
        // down) by then.
        self.assess_pusher(pusher.pid, ts_ns, alerts);
    }

    /// Records a call on `connection`, for its pusher's window.
    pub fn called(&mut self, connection: ConnectionId, ts_ns: u64) {
        if let Some(pusher_pid) = self.pushers_by_connection.get(&connection)
            && let Some(activity) = self.pushers.get_mut(pusher_pid)
        {
            push_bounded(&mut activity.called_at, ts_ns, self.window_secs);
        }
    }

    /// Records the close of `connection`: its pusher holds one connection fewer.
    pub fn closed(&mut self, connection: ConnectionId) {
        if let Some(pusher_pid) = self.pushers_by_connection.remove(&connection)
            && let Some(activity) = self.pushers.get_mut(&pusher_pid)
        {
            activity.open = activity.open.saturating_sub(1);
        }
    }

    /// Assesses every pusher (raising `push_connection_churn` where due).
    pub fn assess(&mut self, now_ns: u64, alerts: &mut Vec<Alert>) {
        let pids: Vec<u32> = self.pushers.keys().copied().collect();
        for pid in pids {
            self.assess_pusher(pid, now_ns, alerts);
        }
    }

    /// Raises `push_connection_churn` when a pusher opened many connections within the window,
    /// keeps most of them open, and makes about one call on each: a client per call, never
    /// closed.
    fn assess_pusher(&mut self, pid: u32, now_ns: u64, alerts: &mut Vec<Alert>) {
        let Some(activity) = self.pushers.get_mut(&pid) else {
            return;
        };
        let window_secs = self.window_secs;
        let horizon = now_ns.saturating_sub(window_secs * NANOS_PER_SEC);
        for times in [&mut activity.opened_at, &mut activity.called_at] {
            while times.front().is_some_and(|&time| time < horizon) {
                times.pop_front();
            }
        }
        let new_connections = activity.opened_at.len() as u64;
        if new_connections < self.min_new_connections {
            return;
        }
        let calls_per_connection = activity.called_at.len() as f64 / new_connections as f64;
        if activity.open < new_connections / 2 || calls_per_connection > 2.0 {
            return;
        }
        let repeat_after = self.repeat_after_secs * NANOS_PER_SEC;
        if activity
            .last_alert_ns
            .is_some_and(|last| now_ns.saturating_sub(last) < repeat_after)
        {
            return;
        }
        activity.last_alert_ns = Some(now_ns);
        let diagnosis = diagnosis::push_connection_churn(&diagnosis::Churn {
            comm: &activity.comm,
            pid,
            new_connections,
            window_secs,
            calls_per_connection,
            open_connections: activity.open,
        });
        let pusher = Process {
            pid,
            comm: activity.comm.clone(),
            cgroup_id: activity.cgroup_id,
        };
        alerts.push(Alert::new(
            now_ns,
            AlertBody::PushConnectionChurn {
                diagnosis,
                pusher: pusher.into(),
                new_connections,
                window_secs,
                per_second: new_connections as f64 / window_secs.max(1) as f64,
                open_connections: activity.open,
                calls_per_connection: (calls_per_connection * 100.0).round() / 100.0,
            },
        ));
    }
}

/// Appends a timestamp to a sliding window of `window_secs`, dropping what fell out of it; the
/// length cap keeps a flood from growing it.
fn push_bounded(times: &mut VecDeque<u64>, ts_ns: u64, window_secs: u64) {
    times.push_back(ts_ns);
    let horizon = ts_ns.saturating_sub(window_secs * NANOS_PER_SEC);
    while times.front().is_some_and(|&time| time < horizon) || times.len() > 100_000 {
        times.pop_front();
    }
}

#[cfg(test)]
mod tests;
