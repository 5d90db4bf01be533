//! Holds the kernel side's counters as userspace reads them (`KernelCapture::counters`): the
//! programs' own, one total per `Counter` summed over CPUs, and what the kernel counted of
//! their runs (`program_runs`).

use observer_records::{COUNTER_COUNT, Counter};

/// Names the skipped runs among the counters (stop line, `/metrics`).
const RUNS_SKIPPED: &str = "program_runs_skipped";
/// Names the timed runs and their time on the stop line.
const RUNS_TIMED: &str = "program_runs_timed";
const RUN_TIME_NS: &str = "program_run_time_ns";
/// Names the entries removed by userspace's sweeps on the stop line.
const STALE_ENTRIES_REMOVED: &str = "stale_entries_removed";

/// Holds the kernel-side counters, summed over CPUs; indexed by `Counter`, serialised as an object
/// keyed by `Counter::name`, `RUNS_SKIPPED`, `RUNS_TIMED`, `RUN_TIME_NS` and
/// `STALE_ENTRIES_REMOVED`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelCounters {
    programs: [u64; COUNTER_COUNT as usize],
    /// Runs of the observer's programs the kernel skipped (`program_runs`), summed over them;
    /// `None` where the kernel does not count them.
    pub runs_skipped: Option<u64>,
    /// Runs of the observer's programs the kernel timed, and their time, summed over them:
    /// counted only while the kernel's BPF statistics are on. Not in `iter`, whose counters
    /// `/metrics` exports as one family of losses: these have series of their own.
    pub runs_timed: u64,
    pub run_time_ns: u64,
    /// Connection entries userspace removed because their socket was gone, their end never
    /// handled by the programs (`stale_entries`): the cost of skipped runs already counted in
    /// `runs_skipped`, so not a loss of its own.
    pub stale_entries_removed: u64,
}

impl KernelCounters {
    /// Returns every counter the kernel has, by name: the programs' own, then the skipped runs
    /// where counted.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Counter::ALL
            .into_iter()
            .map(|counter| (counter.name(), self[counter]))
            .chain(self.runs_skipped.map(|skipped| (RUNS_SKIPPED, skipped)))
    }
}

impl std::ops::Index<Counter> for KernelCounters {
    type Output = u64;

    fn index(&self, counter: Counter) -> &u64 {
        &self.programs[counter as usize]
    }
}

impl std::ops::IndexMut<Counter> for KernelCounters {
    fn index_mut(&mut self, counter: Counter) -> &mut u64 {
        &mut self.programs[counter as usize]
    }
}

impl serde::Serialize for KernelCounters {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        for (name, value) in Counter::ALL
            .into_iter()
            .map(|counter| (counter.name(), self[counter]))
        {
            map.serialize_entry(name, &value)?;
        }
        // `null` where the kernel does not count them: unknown, not none.
        map.serialize_entry(RUNS_SKIPPED, &self.runs_skipped)?;
        map.serialize_entry(RUNS_TIMED, &self.runs_timed)?;
        map.serialize_entry(RUN_TIME_NS, &self.run_time_ns)?;
        map.serialize_entry(STALE_ENTRIES_REMOVED, &self.stale_entries_removed)?;
        map.end()
    }
}
