//! Correlate: turns decoded traffic into routing facts and checks the two routing paths
//! against each other.
//!
//! `Engine` is the whole pipeline after capture: events in (live or replayed, in time order),
//! alerts out. It needs no privileges, so replays and tests drive it directly. Events go
//! through one decoder per connection (`connections`) into `Observation`s, which `detectors`
//! dispatches to one detector per alert kind.

mod churn;
pub mod connections;
mod detectors;
mod observation;
mod placements;
mod push_calls;
mod ring_verdicts;
mod rings;
mod upgrade_on_grpc;

use crate::{
    alert::Alert,
    decode::Limits,
    model::{Event, NANOS_PER_SEC},
};

use connections::{ConnectionCounters, ConnectionDecoders};
use detectors::{Detectors, FoldKey};
pub use detectors::{RouteCounters, RouteLimits};
pub use observation::Observation;

#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub routes: RouteLimits,
    pub decode: Limits,
    /// Connections decoded at once; more are counted and ignored.
    pub max_connections: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            routes: RouteLimits::default(),
            decode: Limits::default(),
            max_connections: 65_536,
        }
    }
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct EngineCounters {
    pub events: u64,
    pub connections: ConnectionCounters,
    pub routes: RouteCounters,
    pub users_tracked: usize,
}

pub struct Engine {
    decoders: ConnectionDecoders,
    detectors: Detectors,
    observations: Vec<Observation>,
    events: u64,
    latest_ts_ns: u64,
    last_tick_ns: u64,
}

impl Engine {
    pub fn new(config: EngineConfig) -> Self {
        Self {
            decoders: ConnectionDecoders::new(config.decode, config.max_connections),
            detectors: Detectors::new(config.routes),
            observations: Vec::new(),
            events: 0,
            latest_ts_ns: 0,
            last_tick_ns: 0,
        }
    }

    /// Feeds one event; alerts it raises are appended to `alerts`. Time advances with the
    /// events' timestamps, so a replay ticks as the live run did.
    pub fn on_event(&mut self, event: &Event, alerts: &mut Vec<Alert>) {
        self.events += 1;
        self.latest_ts_ns = self.latest_ts_ns.max(event.ts_ns);
        self.decoders.on_event(event, &mut self.observations);
        for observation in self.observations.drain(..) {
            self.detectors.observe(observation, alerts);
        }
        if self.latest_ts_ns.saturating_sub(self.last_tick_ns) >= NANOS_PER_SEC {
            self.tick(self.latest_ts_ns, alerts);
        }
    }

    /// Lets time pass without events (the live daemon calls it every second).
    pub fn tick(&mut self, now_ns: u64, alerts: &mut Vec<Alert>) {
        self.last_tick_ns = now_ns;
        self.detectors.tick(now_ns, alerts);
    }

    /// End of input: judges pending calls and emits what windows were holding back.
    pub fn finish(&mut self, alerts: &mut Vec<Alert>) {
        self.detectors.finish(self.latest_ts_ns, alerts);
    }

    pub fn counters(&self) -> EngineCounters {
        EngineCounters {
            events: self.events,
            connections: self.decoders.counters(),
            routes: self.detectors.counters(),
            users_tracked: self.detectors.tracked_users(),
        }
    }
}
