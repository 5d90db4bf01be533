//! Reports blindness as an alert: when the observer loses sight of watched traffic it says so
//! (`capture_degraded`), and again when it sees again (`"state":"recovered"`).
//!
//! Two sources: totals that only grow (the kernel's ring-full drops and skipped runs;
//! evictions and memory sheds), read once a second, and `BlindSpots`, what the decoders lost
//! since the last read, by process. A reason whose count grows by `min_events` in one read
//! starts an episode (one `degraded` alert); while it keeps growing, a summary with the totals
//! so far follows once per fold window; after `quiet_secs` without growth the episode ends
//! with `recovered` and its totals. So a flood is a few lines, like a folded alert, however
//! long it lasts.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::{
    alert::{Affected, AffectedProcess, Alert, AlertBody, DegradedReason, DegradedState},
    capture::kernel_counters::KernelCounters,
    model::{ConnectionId, NANOS_PER_SEC, Process, rfc3339},
    openim::diagnosis::{self, CaptureSettings},
};

use super::EngineCounters;

use observer_records::Counter;

/// Bounds the processes remembered per reason between two reads; more are summed without a name.
const MAX_PROCESSES_PER_REASON: usize = 32;
/// Bounds the distinct connections counted per reason between two reads.
const MAX_CONNECTIONS_PER_REASON: usize = 65_536;

/// Records what the decoders lost since the last `take`, by reason and process.
#[derive(Debug, Default)]
pub struct BlindSpots {
    by_reason: BTreeMap<DegradedReason, ReasonSpots>,
}

#[derive(Debug, Default)]
struct ReasonSpots {
    events: u64,
    bytes: u64,
    connections: HashSet<ConnectionId>,
    processes: HashMap<u32, ProcessSpots>,
}

#[derive(Debug)]
struct ProcessSpots {
    process: Process,
    connections: u64,
    bytes: u64,
}

impl BlindSpots {
    /// Records that `connection` of `process` lost sight for `reason`, `bytes` of payload (0 if
    /// unknown).
    pub fn record(
        &mut self,
        reason: DegradedReason,
        connection: ConnectionId,
        process: &Process,
        bytes: u64,
    ) {
        let spots = self.by_reason.entry(reason).or_default();
        spots.events += 1;
        spots.bytes += bytes;
        let new_connection = spots.connections.len() < MAX_CONNECTIONS_PER_REASON
            && spots.connections.insert(connection);
        if let Some(tally) = spots.processes.get_mut(&process.pid) {
            tally.connections += u64::from(new_connection);
            tally.bytes += bytes;
        } else if spots.processes.len() < MAX_PROCESSES_PER_REASON {
            spots.processes.insert(
                process.pid,
                ProcessSpots {
                    process: process.clone(),
                    connections: u64::from(new_connection),
                    bytes,
                },
            );
        }
    }

    /// Says whether nothing was lost since the last `take`.
    pub fn is_empty(&self) -> bool {
        self.by_reason.is_empty()
    }
}

/// Holds the thresholds of `capture_degraded` (`observer run` flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlindnessLimits {
    /// Growth of a reason's count within one read (a second) that starts an episode.
    pub min_events: u64,
    /// Seconds without growth after which an episode is over (`recovered`).
    pub quiet_secs: u64,
    /// While an episode goes on, a summary at most this often.
    pub summary_secs: u64,
}

impl Default for BlindnessLimits {
    fn default() -> Self {
        Self {
            min_events: 1,
            quiet_secs: 10,
            summary_secs: 60,
        }
    }
}

struct Episode {
    since_ns: u64,
    last_growth_ns: u64,
    last_summary_ns: u64,
    affected: Affected,
    processes: BTreeMap<u32, AffectedProcess>,
}

/// Watches the capture for blindness, one episode per reason.
pub struct CaptureHealth {
    limits: BlindnessLimits,
    settings: CaptureSettings,
    /// Totals at the last read, to see what grew.
    last: Totals,
    episodes: BTreeMap<DegradedReason, Episode>,
    /// Per reason: episodes started, and events counted.
    raised: BTreeMap<DegradedReason, u64>,
    events: BTreeMap<DegradedReason, u64>,
}

/// Holds the totals that only grow, at one read.
#[derive(Clone, Copy, Debug, Default)]
struct Totals {
    ring_full_drops: u64,
    runs_skipped: u64,
    connections_dropped: u64,
    users_dropped: u64,
    calls_dropped: u64,
}

impl Totals {
    fn of(kernel: Option<&KernelCounters>, engine: &EngineCounters) -> Self {
        let routes = &engine.routes;
        let memory = &engine.memory;
        Self {
            ring_full_drops: kernel.map_or(0, |kernel| kernel[Counter::RingFullDrops]),
            runs_skipped: kernel.and_then(|kernel| kernel.runs_skipped).unwrap_or(0),
            // A full kernel table leaves a new connection unwatched (its insert fails).
            connections_dropped: engine.connections.evicted
                + memory.shed_undecoded_decoders
                + memory.shed_decoders
                + kernel.map_or(0, |kernel| kernel[Counter::MapInsertFailures]),
            users_dropped: routes.users_evicted + memory.shed_users,
            // A message forgotten early, or a miss judged before its message's other calls
            // could cover it, weakens the judgment of those calls.
            calls_dropped: routes.pending_calls_evicted
                + routes.routing.messages_evicted
                + routes.routing.misses_judged_early,
        }
    }
}

/// Describes where a reason stands, for `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReasonHealth {
    pub reason: DegradedReason,
    pub degraded: bool,
    /// Episodes raised so far.
    pub episodes: u64,
    /// Events (records, connections, entries) counted so far.
    pub events: u64,
}

/// Lists the capture reasons, in the order `/metrics` lists them.
pub const CAPTURE_REASONS: [DegradedReason; 6] = [
    DegradedReason::RingFull,
    DegradedReason::RunsSkipped,
    DegradedReason::LostSync,
    DegradedReason::Undecodable,
    DegradedReason::TableFull,
    DegradedReason::BudgetExhausted,
];

impl CaptureHealth {
    /// Builds the watch from the `capture_degraded` thresholds and the capture's settings.
    pub fn new(limits: BlindnessLimits, settings: CaptureSettings) -> Self {
        Self {
            limits,
            settings,
            last: Totals::default(),
            episodes: BTreeMap::new(),
            raised: BTreeMap::new(),
            events: BTreeMap::new(),
        }
    }

    /// Takes one read (the daemon's clock, once a second): the counters now and what the
    /// decoders lost since the last read. Raises, repeats or ends `capture_degraded` episodes.
    pub fn tick(
        &mut self,
        now_ns: u64,
        kernel: Option<&KernelCounters>,
        engine: &EngineCounters,
        spots: BlindSpots,
        alerts: &mut Vec<Alert>,
    ) {
        let totals = Totals::of(kernel, engine);
        let last = std::mem::replace(&mut self.last, totals);
        for (reason, growth) in growth_since(&last, &totals, spots) {
            self.grow(reason, growth, now_ns, alerts);
        }
        let quiet = self.limits.quiet_secs * NANOS_PER_SEC;
        let over: Vec<DegradedReason> = self
            .episodes
            .iter()
            .filter(|(_, episode)| now_ns.saturating_sub(episode.last_growth_ns) >= quiet)
            .map(|(reason, _)| *reason)
            .collect();
        for reason in over {
            alerts.push(self.alert(reason, now_ns, DegradedState::Recovered));
            self.episodes.remove(&reason);
        }
    }

    /// Adds one reason's losses of the last second: opens its episode once they reach
    /// `min_events`, and prints it when it opens and every summary period while it lasts.
    fn grow(
        &mut self,
        reason: DegradedReason,
        (events, affected, processes): Growth,
        now_ns: u64,
        alerts: &mut Vec<Alert>,
    ) {
        *self.events.entry(reason).or_default() += events;
        if events < self.limits.min_events && !self.episodes.contains_key(&reason) {
            return;
        }
        let episode = self.episodes.entry(reason).or_insert_with(|| Episode {
            since_ns: now_ns,
            last_growth_ns: now_ns,
            last_summary_ns: 0,
            affected: Affected::default(),
            processes: BTreeMap::new(),
        });
        episode.last_growth_ns = now_ns;
        add(&mut episode.affected, &affected);
        for process in processes {
            episode
                .processes
                .entry(process.process.process.pid)
                .and_modify(|known| {
                    known.connections += process.connections;
                    known.bytes += process.bytes;
                })
                .or_insert(process);
        }
        let first = episode.last_summary_ns == 0;
        if first
            || now_ns.saturating_sub(episode.last_summary_ns)
                >= self.limits.summary_secs * NANOS_PER_SEC
        {
            episode.last_summary_ns = now_ns;
            if first {
                *self.raised.entry(reason).or_default() += 1;
            }
            alerts.push(self.alert(reason, now_ns, DegradedState::Degraded));
        }
    }

    fn alert(&self, reason: DegradedReason, now_ns: u64, state: DegradedState) -> Alert {
        let episode = &self.episodes[&reason];
        let mut affected = episode.affected.clone();
        affected.processes = episode.processes.values().cloned().collect();
        Alert::new(
            now_ns,
            AlertBody::CaptureDegraded {
                reason,
                state,
                since: rfc3339(episode.since_ns),
                affects: affects(reason).to_owned(),
                affected: Some(affected),
                diagnosis: diagnosis::capture_degraded(
                    reason.name(),
                    state == DegradedState::Recovered,
                    &self.settings,
                ),
            },
        )
    }

    /// Returns every capture reason's state and totals.
    pub fn health(&self) -> Vec<ReasonHealth> {
        CAPTURE_REASONS
            .into_iter()
            .map(|reason| ReasonHealth {
                reason,
                degraded: self.episodes.contains_key(&reason),
                episodes: self.raised.get(&reason).copied().unwrap_or(0),
                events: self.events.get(&reason).copied().unwrap_or(0),
            })
            .collect()
    }
}

fn add(total: &mut Affected, more: &Affected) {
    let sum = |total: &mut Option<u64>, more: Option<u64>| {
        if let Some(more) = more {
            *total = Some(total.unwrap_or(0) + more);
        }
    };
    sum(&mut total.records, more.records);
    sum(&mut total.connections, more.connections);
    sum(&mut total.bytes, more.bytes);
    sum(&mut total.users, more.users);
    sum(&mut total.calls, more.calls);
    sum(&mut total.runs, more.runs);
}

/// Says what each capture reason hides, in words.
fn affects(reason: DegradedReason) -> &'static str {
    match reason {
        DegradedReason::RingFull => {
            "every alert kind: records of any watched connection were dropped in the kernel"
        }
        DegradedReason::LostSync => {
            "push calls and answers on the listed connections after the gap"
        }
        DegradedReason::Undecodable => "the listed connections: nothing on them is judged",
        DegradedReason::TableFull => {
            "route_mismatch for dropped users; push calls on dropped connections"
        }
        DegradedReason::BudgetExhausted => {
            "push calls past the capture budget on the listed connections"
        }
        DegradedReason::RunsSkipped => {
            "connections whose start or end fell in a skipped run (unwatched, or their end \
             unseen); with the syscall hook, the bytes of skipped reads and writes"
        }
        DegradedReason::SharedStateUnreachable => "cluster-wide joins and deduplication",
        DegradedReason::JoinedMidStream => {
            "pushes to users whose placement was made before the observer watched"
        }
    }
}

/// Holds what one reason lost in a second: events, what they affected, and the processes.
type Growth = (u64, Affected, Vec<AffectedProcess>);

/// Sorts what was lost between two reads by reason: ring drops, skipped runs and full tables
/// from the counters, the decoders' blind spots as they reported them.
fn growth_since(
    last: &Totals,
    totals: &Totals,
    spots: BlindSpots,
) -> BTreeMap<DegradedReason, Growth> {
    let grew = |now: u64, before: u64| now.saturating_sub(before);
    let ring_drops = grew(totals.ring_full_drops, last.ring_full_drops);
    let runs_skipped = grew(totals.runs_skipped, last.runs_skipped);
    let table = (
        grew(totals.connections_dropped, last.connections_dropped),
        grew(totals.users_dropped, last.users_dropped),
        grew(totals.calls_dropped, last.calls_dropped),
    );
    let mut growth = BTreeMap::new();
    if ring_drops > 0 {
        let affected = Affected {
            records: Some(ring_drops),
            ..Affected::default()
        };
        growth.insert(DegradedReason::RingFull, (ring_drops, affected, Vec::new()));
    }
    if runs_skipped > 0 {
        let affected = Affected {
            runs: Some(runs_skipped),
            ..Affected::default()
        };
        growth.insert(
            DegradedReason::RunsSkipped,
            (runs_skipped, affected, Vec::new()),
        );
    }
    let table_events = table.0 + table.1 + table.2;
    if table_events > 0 {
        let affected = Affected {
            connections: Some(table.0),
            users: Some(table.1),
            calls: Some(table.2),
            ..Affected::default()
        };
        growth.insert(
            DegradedReason::TableFull,
            (table_events, affected, Vec::new()),
        );
    }
    for (reason, spots) in spots.by_reason {
        let affected = Affected {
            connections: Some(spots.connections.len() as u64),
            bytes: (spots.bytes > 0).then_some(spots.bytes),
            ..Affected::default()
        };
        let processes = spots
            .processes
            .into_values()
            .map(|tally| AffectedProcess {
                process: tally.process.into(),
                connections: tally.connections,
                bytes: tally.bytes,
            })
            .collect();
        growth.insert(reason, (spots.events, affected, processes));
    }
    growth
}

#[cfg(test)]
mod tests;
