//! Links the engine (synchronous, fast) and the store (async, may be slow or gone): the
//! engine's facts go to the store's queue, its placement lookups and the dedup claims of its
//! alerts go to two worker tasks (one each), and what they bring back (`Done`) is fed to the
//! engine or printed. Redis being down never blocks the engine: lookups are answered with nothing,
//! claims are skipped (the alert is printed by whoever saw it), and `capture_degraded` says so.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::{sync::mpsc, task::JoinHandle};

use super::{
    ClusterConfig,
    keys::{self, ConnectionKey, SharedPlacement},
    lookups::{Lookups, lookup_connection},
    recovery,
    store::{Fact, LinkEvent, SharedState, StoreError},
};
use crate::{
    alert::{Alert, AlertBody, DegradedReason, DegradedState, RouteMismatch},
    correlate::{Engine, PlacementLookup, RemotePlacement, SharedFact, SharedRingEvidence},
    model::rfc3339,
    openim::{diagnosis, members::RingDivergenceState},
};

/// Bounds the jobs waiting for each worker; a lookup that finds its queue full is answered with
/// nothing at once, a claim is printed unclaimed (both counted).
const MAX_JOBS: usize = 4_096;
/// Bounds the jobs a worker takes at once: the lookups of a round share one pipeline, and so do
/// the claims of a round. Half the queue: a cached lookup costs Redis nothing, so a round is
/// bounded by the lookups it must read.
const MAX_JOBS_PER_ROUND: usize = 2_048;
/// Sets how often the shared ring evidence is merged (a fraction of the ring settle time, so every
/// node reaches the same verdict before it is claimed).
const RING_MERGE_INTERVAL: Duration = Duration::from_secs(1);
/// Bounds the grace after start: Redis unreachable this long after start, before it ever answered,
/// is a degradation.
const START_GRACE: Duration = Duration::from_secs(3);
/// Bounds the won claims remembered (their windows' summaries are printed by the winner only).
const MAX_WON_CLAIMS: usize = 262_144;

/// Asks the claim worker to claim an alert's print cluster-wide for `ttl`.
struct Claim {
    key: String,
    ttl: Duration,
    alert: Box<Alert>,
}

/// Holds what the workers bring back.
pub enum Done {
    Joined {
        id: u64,
        /// The users with other nodes' live placements, each with them.
        found: Vec<(String, Arc<[RemotePlacement]>)>,
    },
    Claimed {
        key: String,
        /// `None`: Redis did not answer.
        won: Option<bool>,
        alert: Box<Alert>,
    },
    /// `None`: Redis did not answer.
    RingEvidence(Option<SharedRingEvidence>),
}

/// Links the engine to the shared state: queues its facts and runs its lookups and claims on
/// worker tasks.
pub struct ClusterLink {
    state: Arc<SharedState>,
    lookups_queue: mpsc::Sender<PlacementLookup>,
    claims: mpsc::Sender<Claim>,
    done: mpsc::Receiver<Done>,
    /// For the ring evidence reads, each a task of its own.
    done_sender: mpsc::Sender<Done>,
    ring_read_in_flight: bool,
    /// The lookup worker and the claim worker.
    workers: [JoinHandle<()>; 2],
    fold_window: Duration,
    /// Jobs sent whose answer has not been applied yet.
    outstanding: usize,
    /// Answers made without a worker (its queue was full).
    pending_now: Vec<Done>,
    facts: Vec<SharedFact>,
    lookups: Vec<PlacementLookup>,
    /// Mismatch claims this node won, until their window ends.
    won: HashMap<String, Instant>,
    /// Alerts whose claim this node won, to print without claiming them again (a second
    /// `SET NX` would lose to this node's own first one); see `release_won`.
    released: Vec<Alert>,
    last_ring_merge: Option<Instant>,
    started: Instant,
    ever_up: bool,
    /// Since when Redis is down, and whether that was said.
    down_since_ns: Option<u64>,
    degraded_said: bool,
}

impl Drop for ClusterLink {
    fn drop(&mut self) {
        for worker in &self.workers {
            worker.abort();
        }
    }
}

impl ClusterLink {
    /// Starts the store and the workers; needs a tokio runtime. `fold_window` is how long one
    /// `route_mismatch` claim holds.
    ///
    /// # Errors
    ///
    /// Fails with [`StoreError::Redis`] when no client can be set up for the configured Redis.
    pub fn start(config: &ClusterConfig, fold_window: Duration) -> Result<Self, StoreError> {
        let state = Arc::new(SharedState::start(config)?);
        let lookups = Lookups::new(lookup_connection(config)?, config.redis.clone());
        let (lookups_queue, queue) = mpsc::channel(MAX_JOBS);
        let (claims, claim_queue) = mpsc::channel(MAX_JOBS);
        let (done_sender, done) = mpsc::channel(2 * MAX_JOBS);
        let workers = [
            tokio::spawn(work(
                Arc::clone(&state),
                lookups,
                queue,
                done_sender.clone(),
            )),
            tokio::spawn(claim_work(
                Arc::clone(&state),
                claim_queue,
                done_sender.clone(),
            )),
        ];
        Ok(Self {
            state,
            lookups_queue,
            done_sender,
            ring_read_in_flight: false,
            claims,
            done,
            workers,
            fold_window,
            outstanding: 0,
            pending_now: Vec::new(),
            facts: Vec::new(),
            lookups: Vec::new(),
            won: HashMap::new(),
            released: Vec::new(),
            last_ring_merge: None,
            started: Instant::now(),
            ever_up: false,
            down_since_ns: None,
            degraded_said: false,
        })
    }

    /// Returns the shared state this link writes to.
    pub fn state(&self) -> &SharedState {
        &self.state
    }

    /// Returns this node's name.
    pub fn node(&self) -> &str {
        self.state.node()
    }

    /// Recovers after a restart: this node's placements in Redis whose connections the kernel still
    /// holds are adopted by the engine (and kept in Redis); the rest are deleted. Returns how
    /// many were recovered; 0 when Redis does not answer within a few seconds.
    pub async fn recover(&mut self, engine: &mut Engine) -> usize {
        let mut stored = None;
        for _ in 0..3 {
            match self.state.own_placements().await {
                Ok(placements) => {
                    stored = Some(placements);
                    break;
                }
                Err(error) => {
                    tracing::warn!(%error, "restart recovery: reading this node's placements");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
        let Some(stored) = stored else {
            return 0;
        };
        if stored.is_empty() {
            return 0;
        }
        let established = recovery::established_connections();
        self.adopt(stored, &established, engine)
    }

    /// Adopts the `stored` placements whose connection is in `established`; deletes the rest.
    pub fn adopt(
        &mut self,
        stored: Vec<SharedPlacement>,
        established: &HashSet<ConnectionKey>,
        engine: &mut Engine,
    ) -> usize {
        let mut adopted = Vec::new();
        for placement in stored {
            if established.contains(&placement.connection.canonical()) {
                adopted.push((placement.user.clone(), placement.to_remote()));
                self.state.record(Fact::Adopted(placement));
            } else {
                self.state.record(Fact::Unplaced {
                    user: placement.user,
                    connection: placement.connection,
                });
            }
        }
        let count = adopted.len();
        tracing::info!(recovered = count, "restart recovery: placements adopted");
        engine.adopt(adopted);
        count
    }

    /// Forwards what the engine produced: its facts go to the store, its lookups to the lookup
    /// worker, and its alerts that must be printed once cluster-wide to a claim (removed from
    /// `alerts` until won). Every other alert stays in `alerts`, to print now.
    pub fn forward(&mut self, engine: &mut Engine, alerts: &mut Vec<Alert>) {
        engine.take_shared(&mut self.facts, &mut self.lookups);
        let node = self.state.node().to_owned();
        for fact in self.facts.drain(..) {
            self.state.record(store_fact(fact, &node));
        }
        for lookup in std::mem::take(&mut self.lookups) {
            if self.state.health().is_up() {
                self.send_lookup(lookup);
            } else {
                // Local detection only while Redis is down: nothing to wait for.
                engine.joined(lookup.id, Vec::new(), alerts);
            }
        }
        if !self.state.health().is_up() {
            return;
        }
        let mut kept = Vec::with_capacity(alerts.len());
        for alert in alerts.drain(..) {
            match self.claim_key(&alert) {
                Some((key, ttl, true)) => self.send_claim(Claim {
                    key,
                    ttl,
                    alert: Box::new(alert),
                }),
                // A window's summary: printed by the node whose first alert won.
                Some((key, _, false)) => {
                    if self.won.contains_key(&key) {
                        kept.push(alert);
                    } else {
                        self.state.health().count(LinkEvent::MismatchDeduplicated);
                    }
                }
                None => kept.push(alert),
            }
        }
        *alerts = kept;
    }

    /// Appends the alerts whose claims this node won since the last call: they are printed
    /// as they are, after `forward` (which would claim them again).
    pub fn release_won(&mut self, alerts: &mut Vec<Alert>) {
        alerts.append(&mut self.released);
    }

    /// Returns the claim an alert needs, if any, and whether it is a first alert (a summary is not
    /// claimed again).
    fn claim_key(&self, alert: &Alert) -> Option<(String, Duration, bool)> {
        let keys = self.state.keys();
        match &*alert.body {
            AlertBody::RouteMismatch(RouteMismatch {
                user,
                placed_on,
                pushed_to,
                count,
                ..
            }) => {
                let placed: Vec<_> = placed_on
                    .iter()
                    .map(|info| info.gateway.gateway.ip)
                    .collect();
                let key = keys.mismatch_claim(user, &placed, pushed_to.gateway.gateway.ip);
                Some((key, self.fold_window, *count <= 1))
            }
            AlertBody::RingDivergence {
                state,
                proxy_members,
                push_members,
                ..
            } => Some((
                match state {
                    RingDivergenceState::Diverged => {
                        keys.divergence_claim(proxy_members, push_members)
                    }
                    // Its own claim: the divergence's would swallow it.
                    RingDivergenceState::Resolved => {
                        keys.divergence_resolved_claim(proxy_members, push_members)
                    }
                },
                keys::DIVERGENCE_CLAIM_TTL,
                true,
            )),
            _ => None,
        }
    }

    fn send_lookup(&mut self, lookup: PlacementLookup) {
        self.outstanding += 1;
        if let Err(
            mpsc::error::TrySendError::Full(lookup) | mpsc::error::TrySendError::Closed(lookup),
        ) = self.lookups_queue.try_send(lookup)
        {
            // The worker is behind: answer as if Redis were down.
            self.state.health().count(LinkEvent::LookupFailed);
            self.pending_now.push(Done::Joined {
                id: lookup.id,
                found: Vec::new(),
            });
        }
    }

    /// Reads the shared ring evidence in a task of its own, so that no lookup round waits for
    /// it (a thousand recent placements and every member, once a second); one read at a time.
    fn read_ring_evidence(&mut self) {
        if self.ring_read_in_flight {
            return;
        }
        self.ring_read_in_flight = true;
        self.outstanding += 1;
        let state = Arc::clone(&self.state);
        let done = self.done_sender.clone();
        tokio::spawn(async move {
            let evidence = ring_evidence(&state).await;
            // The link is gone when this fails: nobody waits for the answer.
            let _ = done.send(Done::RingEvidence(evidence)).await;
        });
    }

    fn send_claim(&mut self, claim: Claim) {
        self.outstanding += 1;
        if let Err(
            mpsc::error::TrySendError::Full(claim) | mpsc::error::TrySendError::Closed(claim),
        ) = self.claims.try_send(claim)
        {
            // The worker is behind: print unclaimed, as if Redis were down.
            self.state.health().count(LinkEvent::ClaimFailed);
            self.pending_now.push(Done::Claimed {
                key: claim.key,
                won: None,
                alert: claim.alert,
            });
        }
    }

    /// Returns the workers' next answer (cancel-safe, for `select!`).
    pub async fn next(&mut self) -> Done {
        if let Some(done) = self.pending_now.pop() {
            return done;
        }
        match self.done.recv().await {
            Some(done) => done,
            None => std::future::pending().await,
        }
    }

    /// Feeds an answer to the engine, or releases a claimed alert into `alerts` if won.
    pub fn apply(&mut self, done: Done, engine: &mut Engine, alerts: &mut Vec<Alert>) {
        self.outstanding = self.outstanding.saturating_sub(1);
        // What the engine raises now goes through `forward` like any other of its alerts.
        let mut raised = Vec::new();
        match done {
            Done::Joined { id, found } => engine.joined(id, found, &mut raised),
            Done::Claimed { key, won, alert } => {
                let is_mismatch = matches!(*alert.body, AlertBody::RouteMismatch { .. });
                match won {
                    Some(false) => self.state.health().count(if is_mismatch {
                        LinkEvent::MismatchDeduplicated
                    } else {
                        LinkEvent::DivergenceDeduplicated
                    }),
                    Some(true) | None => {
                        if is_mismatch && won.is_some() && self.won.len() < MAX_WON_CLAIMS {
                            self.won.insert(key, Instant::now() + self.fold_window);
                        }
                        self.released.push(*alert);
                    }
                }
            }
            Done::RingEvidence(evidence) => {
                self.ring_read_in_flight = false;
                if let Some(evidence) = evidence {
                    engine.merge_ring_evidence(&evidence);
                }
            }
        }
        self.forward(engine, &mut raised);
        alerts.append(&mut raised);
    }

    /// Counts the jobs sent whose answer was not applied yet.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// Says whether facts this node recorded still wait to be written while Redis is up; among
    /// them its latest placements, which an observer restarted on this node recovers.
    pub fn facts_unwritten(&self) -> bool {
        let health = self.state.health();
        health.is_up() && health.unwritten() > 0
    }

    /// Runs once a second: says when Redis is lost or back (`capture_degraded`), merges the shared
    /// ring evidence, forgets ended claims.
    pub fn tick(&mut self, now_ns: u64, alerts: &mut Vec<Alert>) {
        let up = self.state.health().is_up();
        self.ever_up |= up;
        if up {
            if self.degraded_said {
                alerts.push(self.degraded_alert(now_ns, DegradedState::Recovered));
                self.degraded_said = false;
            }
            self.down_since_ns = None;
            let due = self
                .last_ring_merge
                .is_none_or(|last| last.elapsed() >= RING_MERGE_INTERVAL);
            if due {
                self.last_ring_merge = Some(Instant::now());
                self.read_ring_evidence();
            }
        } else {
            self.down_since_ns.get_or_insert(now_ns);
            let lost = self.ever_up || self.started.elapsed() >= START_GRACE;
            if lost && !self.degraded_said {
                alerts.push(self.degraded_alert(now_ns, DegradedState::Degraded));
                self.degraded_said = true;
            }
        }
        let now = Instant::now();
        self.won.retain(|_, until| *until > now);
    }

    fn degraded_alert(&self, now_ns: u64, state: DegradedState) -> Alert {
        let since = self.down_since_ns.unwrap_or(now_ns);
        let mut alert = Alert::new(
            now_ns,
            AlertBody::CaptureDegraded {
                reason: DegradedReason::SharedStateUnreachable,
                state,
                since: rfc3339(since),
                affects: "route_mismatch whose placement and push were seen on different nodes; \
                          cluster-wide deduplication; the shared ring evidence; restart recovery"
                    .to_owned(),
                affected: None,
                diagnosis: diagnosis::shared_state_unreachable(state == DegradedState::Recovered),
            },
        );
        alert.node = Some(self.state.node().to_owned());
        alert
    }
}

fn store_fact(fact: SharedFact, node: &str) -> Fact {
    match fact {
        SharedFact::Placed {
            user,
            connection,
            gateway,
            platform,
            since_ns,
            proxy,
        } => Fact::Placed(SharedPlacement {
            user,
            node: node.to_owned(),
            connection,
            gateway_ip: gateway.ip,
            gateway_port: gateway.port,
            gateway_name: gateway.name.as_deref().map(str::to_owned),
            platform,
            since_ns,
            proxy_pid: proxy.pid,
            proxy_comm: proxy.comm.into_string(),
        }),
        SharedFact::Unplaced { user, connection } => Fact::Unplaced { user, connection },
        SharedFact::RingMember { side, member, ip } => Fact::RingMember { side, member, ip },
    }
}

/// Answers lookups in rounds: the lookups of one round share one pipelined round trip.
async fn work(
    state: Arc<SharedState>,
    mut placements: Lookups,
    mut lookups: mpsc::Receiver<PlacementLookup>,
    done: mpsc::Sender<Done>,
) {
    let mut round = Vec::with_capacity(MAX_JOBS_PER_ROUND);
    let mut comebacks_seen = state.health().comebacks();
    while lookups.recv_many(&mut round, MAX_JOBS_PER_ROUND).await > 0 {
        let comebacks = state.health().comebacks();
        if !state.health().is_up() || comebacks != comebacks_seen {
            // Redis may come back without what was cached (restarted, failed over).
            comebacks_seen = comebacks;
            placements.forget();
        }
        for answer in look_up(&mut placements, &state, std::mem::take(&mut round)).await {
            if done.send(answer).await.is_err() {
                return;
            }
        }
    }
}

/// Reads every node's ring evidence; `None` when Redis did not answer.
async fn ring_evidence(state: &SharedState) -> Option<SharedRingEvidence> {
    match state.ring_evidence().await {
        Ok(evidence) => Some(SharedRingEvidence {
            proxy: evidence
                .proxy
                .into_iter()
                .map(|(member, seen)| (member, seen.ip))
                .collect(),
            push: evidence
                .push
                .into_iter()
                .map(|(member, seen)| (member, seen.ip))
                .collect(),
            placements: evidence.placements,
        }),
        Err(error) => {
            tracing::debug!(%error, "shared state: ring evidence");
            None
        }
    }
}

/// Answers claims in rounds of their own, beside the lookups': a mismatch's claim, sent once its
/// lookup came back, never waits for the next lookup round.
async fn claim_work(
    state: Arc<SharedState>,
    mut claims: mpsc::Receiver<Claim>,
    done: mpsc::Sender<Done>,
) {
    let mut round = Vec::with_capacity(MAX_JOBS_PER_ROUND);
    while claims.recv_many(&mut round, MAX_JOBS_PER_ROUND).await > 0 {
        for answer in claim(&state, std::mem::take(&mut round)).await {
            if done.send(answer).await.is_err() {
                return;
            }
        }
    }
}

/// Sends a round's claims in one pipeline; unanswered, every one of them is printed unclaimed (and
/// counted).
async fn claim(state: &SharedState, claims: Vec<Claim>) -> Vec<Done> {
    let keys: Vec<(&str, Duration)> = claims
        .iter()
        .map(|claim| (claim.key.as_str(), claim.ttl))
        .collect();
    let won: Vec<Option<bool>> = match state.claims(&keys).await {
        Ok(won) => won.into_iter().map(Some).collect(),
        Err(error) => {
            tracing::debug!(%error, claims = claims.len(), "shared state: claims failed");
            for _ in &claims {
                state.health().count(LinkEvent::ClaimFailed);
            }
            vec![None; claims.len()]
        }
    };
    claims
        .into_iter()
        .zip(won)
        .map(|(claim, won)| Done::Claimed {
            key: claim.key,
            won,
            alert: claim.alert,
        })
        .collect()
}

/// Runs one round for every user of `lookups`; each lookup gets its users' placements on
/// other nodes (this node's own are in the engine already), shared with the cache.
async fn look_up(
    cache: &mut Lookups,
    state: &SharedState,
    lookups: Vec<PlacementLookup>,
) -> Vec<Done> {
    let found = {
        let mut users: Vec<&str> = lookups
            .iter()
            .flat_map(|lookup| lookup.users.iter().map(String::as_str))
            .collect();
        users.sort_unstable();
        users.dedup();
        match cache.placements_of(state, &users).await {
            Ok(found) => found,
            Err(error) => {
                tracing::debug!(%error, "shared state: placement lookup failed");
                state.health().count(LinkEvent::LookupFailed);
                cache.forget();
                HashMap::new()
            }
        }
    };
    let found: Vec<Option<Arc<[RemotePlacement]>>> = lookups
        .iter()
        .flat_map(|lookup| &lookup.users)
        .map(|user| found.get(user.as_str()).cloned())
        .collect();
    let mut found = found.into_iter();
    lookups
        .into_iter()
        .map(|lookup| Done::Joined {
            id: lookup.id,
            found: lookup
                .users
                .into_iter()
                .zip(found.by_ref())
                .filter_map(|(user, placements)| Some((user, placements?)))
                .collect(),
        })
        .collect()
}
