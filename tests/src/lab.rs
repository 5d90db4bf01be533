//! Runs the lab: builds the pods, runs a scenario, collects ground truth, and removes everything it
//! created when dropped (also when a scenario fails or its future is dropped on Ctrl-C).

pub mod cgroups;
pub mod client;
pub mod control;
pub mod external;
pub mod gateway;
pub mod names;
pub mod netns;
pub mod pod;
pub mod proxy;
pub mod push;
pub mod release;
pub mod stack;
pub mod truth;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use observer::openim::hashring::{
    MemberTemplate, PROXY_MEMBER_TEMPLATE, PUSH_MEMBER_TEMPLATE, Ring,
};
use serde::{Deserialize, Serialize};

use crate::lab::cgroups::NodeCgroups;
use crate::lab::client::{Arrivals, Client};
use crate::lab::control::{PodEvent, PushCommand, PushOutcome};
use crate::lab::external::ExternalUsers;
use crate::lab::names::{NameTable, random_bytes};
use crate::lab::netns::{Network, PodNet};
use crate::lab::pod::{Observations, PodProcess, SharedObservations};
use crate::lab::proxy::PROXY_PORT;
use crate::lab::release::{Discovery, OpenImRelease, PushRouting};
use crate::lab::stack::{AddressFamily, ClientStack};
use crate::lab::truth::{
    FloodReport, GatewayTruth, GroundTruth, MissCause, Placement, PushTruth, Summary, UserTruth,
};

/// Bounds the gateway replicas: pod addresses are 10.244.X.(10 + index), so this keeps the last
/// octet in range.
pub const MAX_REPLICAS: usize = 200;
/// Bounds the simulated nodes (one observer and one cgroup per node).
pub const MAX_NODES: usize = 16;
const PROXY_HOST: u8 = 2;
const PUSH_HOST: u8 = 3;
const FIRST_GATEWAY_HOST: u8 = 10;
const PUSH_REPLY_TIMEOUT: Duration = Duration::from_secs(20);
const SESSION_SETTLE_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_BATCH: usize = 100;
/// Bounds how long a client program may take to report a batch of users' connections.
const EXTERNAL_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Numbers the lab's users from here: lab user ids look like OpenIM's random 10-digit user ids, yet
/// are the same every run, so a given configuration always splits users over gateways the same way:
/// index × a prime (odd, not dividing the modulus, so ids never repeat) scattered over 10-digit
/// numbers. Sequential ids would hash in clumps.
const USER_ID_BASE: u64 = 1_000_000_000;
const USER_ID_SPAN: u64 = 9_000_000_000;
const USER_ID_STRIDE: u64 = 2_654_435_761;
const SENDER_ID: &str = "3355699999";

/// Says how the proxy spells and dials its members.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, Serialize, Deserialize)]
pub enum ProxyMode {
    /// As shipped: hash on members without port, dial port 80.
    #[value(name = "v3.5.1")]
    #[serde(rename = "v3.5.1")]
    V351,
    /// The incident report's fix: hash on `…:88` and dial it, hitting the gRPC port.
    #[value(name = "report-fix")]
    #[serde(rename = "report-fix")]
    ReportFix,
    /// Hash on `…:88` (same ring as push) but dial the WebSocket port.
    #[value(name = "correct")]
    #[serde(rename = "correct")]
    Correct,
}

impl ProxyMode {
    /// Returns the mode as `--mode` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V351 => "v3.5.1",
            Self::ReportFix => "report-fix",
            Self::Correct => "correct",
        }
    }
}

/// Describes a lab: its OpenIM release and proxy mode, its pods, users and scenario.
#[derive(Clone, Debug)]
pub struct LabConfig {
    pub mode: ProxyMode,
    /// OpenIM instance name (pod-name prefix), e.g. `demo`.
    pub instance: String,
    /// Kubernetes namespace, e.g. `chat`.
    pub namespace: String,
    /// Gateways when the users connect.
    pub replicas_initial: usize,
    /// Gateways after the scale-out (equal to `replicas_initial` for no scale-out).
    pub replicas_final: usize,
    /// Users that connect before the scale-out.
    pub users: usize,
    /// Users that connect after the scale-out.
    pub late_users: usize,
    /// Group messages pushed to every user (after the scale-out, if any).
    pub messages_per_user: usize,
    /// Group messages pushed to the early users before the scale-out, when they all still sit
    /// on the first gateways and routing agrees.
    pub messages_before_scale: usize,
    /// A message is real-time if it arrives within this long after push was asked to send it.
    pub realtime_timeout: Duration,
    /// The `openim-lab` binary pods run from; `None` finds it (see [`find_lab_binary`]).
    pub lab_binary: Option<PathBuf>,
    /// Print progress on stderr.
    pub progress: bool,
    /// Simulated Kubernetes nodes the pods are spread over (see [`Lab::node_of`]): the proxy on
    /// the first, push on the second, gateways round-robin over all. 1 is one node.
    pub nodes: usize,
    /// Push keeps one long-lived gRPC connection per gateway and reuses it for every call
    /// (later OpenIM versions), instead of 3.5.1's new connection per call. Releases from 3.6
    /// on do so whatever this says (see [`LabConfig::reuses_push_connections`]).
    pub push_reuses_connections: bool,
    /// The OpenIM release the gateways and push speak: service name, connection reuse, answer
    /// order and, with `discovery`, routing.
    pub openim: OpenImRelease,
    /// Where push learns the gateways from: `Etcd` broadcasts on every release.
    pub discovery: Discovery,
    /// The libraries of push's gRPC client and the users' WebSocket clients (see
    /// [`stack`]); gateways and proxy are always the lab's own.
    pub client_stack: ClientStack,
    /// The sockets those clients connect from.
    pub family: AddressFamily,
}

impl Default for LabConfig {
    fn default() -> Self {
        Self {
            mode: ProxyMode::V351,
            instance: "demo".to_owned(),
            namespace: "chat".to_owned(),
            replicas_initial: 5,
            replicas_final: 5,
            users: 50,
            late_users: 0,
            messages_per_user: 1,
            messages_before_scale: 0,
            realtime_timeout: Duration::from_secs(2),
            lab_binary: None,
            progress: false,
            nodes: 1,
            push_reuses_connections: false,
            openim: OpenImRelease::default(),
            discovery: Discovery::default(),
            client_stack: ClientStack::Rust,
            family: AddressFamily::Ipv4,
        }
    }
}

impl LabConfig {
    /// Tells whether push keeps one connection per gateway: asked for, or the release does.
    pub fn reuses_push_connections(&self) -> bool {
        self.push_reuses_connections || self.openim.reuses_push_connections()
    }

    /// Returns how push routes messages in this configuration.
    pub fn routing(&self) -> PushRouting {
        self.openim.routing(self.discovery)
    }
}

/// Finds the `openim-lab` binary: `$OPENIM_LAB_BIN`, else this executable if it is `openim-lab`,
/// else the one cargo built beside this executable (see [`crate::sibling_binary`]).
///
/// # Errors
///
/// Fails when `$OPENIM_LAB_BIN` is not set, this executable is not `openim-lab`, and cargo built
/// none beside it.
pub fn find_lab_binary() -> anyhow::Result<PathBuf> {
    let current = std::env::current_exe().context("current executable")?;
    if std::env::var_os("OPENIM_LAB_BIN").is_none()
        && current.file_name().is_some_and(|name| name == "openim-lab")
    {
        return Ok(current);
    }
    crate::sibling_binary("openim-lab", "OPENIM_LAB_BIN")
}

/// Names a pod of the lab, for placing it on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodRole {
    Proxy,
    Push,
    Gateway(usize),
}

impl PodRole {
    fn node(self, nodes: usize) -> usize {
        let nodes = nodes.max(1);
        match self {
            Self::Proxy => 0,
            Self::Push => 1 % nodes,
            Self::Gateway(index) => index % nodes,
        }
    }
}

struct GatewayPod {
    net: PodNet,
    process: PodProcess,
}

/// Holds a running lab. Fields drop in order: clients, pods, then the network.
pub struct Lab {
    clients: Vec<Client>,
    /// The program holding the users' WebSockets, for the Go and Python stacks.
    external_users: Option<ExternalUsers>,
    push: PodProcess,
    proxy: PodProcess,
    /// Replaced proxies that keep relaying the WebSockets they accepted.
    draining_proxies: Vec<PodProcess>,
    gateways: Vec<GatewayPod>,
    /// With more than one node: each node's cgroup, which its pods join (after the pods in
    /// drop order, so they are killed first).
    cgroups: Option<NodeCgroups>,
    network: Network,
    config: LabConfig,
    binary: PathBuf,
    proxy_net: PodNet,
    push_net: PodNet,
    observations: SharedObservations,
    arrivals: Arrivals,
    connect_errors: HashMap<String, String>,
    late_users: HashSet<String>,
    generation: usize,
}

/// Names a step of [`Lab::run_scenario_with`]'s scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScenarioStep {
    /// The first users are connected; nothing is pushed yet.
    Connected,
    /// Round `round` (from 0) of the messages to every user was pushed.
    Pushed { round: usize },
}

impl Lab {
    /// Creates the network and the pods with `replicas_initial` gateways, and waits until every
    /// pod listens.
    ///
    /// # Errors
    ///
    /// Fails without root, on a configuration out of bounds, when the `openim-lab` binary is not
    /// found, or when the network, a cgroup, a pod or a client cannot be set up.
    ///
    /// Longer than 100 lines on purpose: the cluster comes up in the order a real one does
    /// (network, gateways, proxy, push, clients), each step using what the ones before made.
    pub async fn start(config: LabConfig) -> anyhow::Result<Self> {
        ensure!(config.replicas_initial >= 1, "at least one gateway replica");
        ensure!(
            config.replicas_final >= config.replicas_initial,
            "replicas_final must be at least replicas_initial"
        );
        ensure!(
            config.replicas_final <= MAX_REPLICAS,
            "at most {MAX_REPLICAS} replicas"
        );
        ensure!(
            (1..=MAX_NODES).contains(&config.nodes),
            "between 1 and {MAX_NODES} nodes"
        );
        netns::require_root()?;
        netns::sweep_leftovers();
        let binary = match &config.lab_binary {
            Some(path) => path.clone(),
            None => find_lab_binary()?,
        };
        let mut network = Network::create(&netns::new_prefix())?;
        let cgroups = if config.nodes > 1 {
            Some(NodeCgroups::create(network.prefix(), config.nodes)?)
        } else {
            None
        };
        let procs = |role: PodRole| {
            cgroups
                .as_ref()
                .map(|cgroups| cgroups.procs_file(role.node(config.nodes)))
        };
        let proxy_net = network.add_pod("proxy", PROXY_HOST)?;
        let push_net = network.add_pod("push", PUSH_HOST)?;
        netns::reuse_time_wait_ports(&push_net.netns)?;
        if config.family == AddressFamily::Ipv4 {
            // An IPv4 run must not hand push a dual-stack socket behind its back (grpcio would).
            netns::disable_ipv6(&push_net.netns)?;
        }
        let observations: SharedObservations = Arc::new(Mutex::new(Observations::default()));
        let mut gateways = Vec::new();
        for index in 0..config.replicas_initial {
            gateways.push(start_gateway(
                &mut network,
                &binary,
                config.openim,
                index,
                procs(PodRole::Gateway(index)).as_deref(),
                &observations,
            )?);
        }
        for gateway in &mut gateways {
            gateway.process.wait_ready().await?;
        }
        let names = name_table(&config, &gateways);
        let mut proxy = spawn_proxy(
            &config,
            &binary,
            PodHome {
                net: &proxy_net,
                cgroup_procs: procs(PodRole::Proxy).as_deref(),
            },
            &names,
            0,
            gateways.len(),
            &observations,
        )?;
        let mut push = spawn_push(
            &config,
            &binary,
            PodHome {
                net: &push_net,
                cgroup_procs: procs(PodRole::Push).as_deref(),
            },
            &names,
            0,
            gateways.len(),
            &observations,
        )?;
        proxy.wait_ready().await?;
        push.wait_ready().await?;
        let arrivals = Arrivals::default();
        let external_users = config
            .client_stack
            .program("users", config.family)?
            .map(|program| ExternalUsers::start(&program, arrivals.clone()))
            .transpose()?;
        let lab = Self {
            clients: Vec::new(),
            external_users,
            push,
            proxy,
            draining_proxies: Vec::new(),
            gateways,
            cgroups,
            network,
            config,
            binary,
            proxy_net,
            push_net,
            observations,
            arrivals,
            connect_errors: HashMap::new(),
            late_users: HashSet::new(),
            generation: 0,
        };
        lab.progress(format!(
            "lab {}: OpenIM {} ({} discovery, push {}), {} gateway(s), proxy {} ({}), push {}, {} \
            clients over {}",
            lab.prefix(),
            lab.config.openim.as_str(),
            lab.config.discovery.as_str(),
            lab.config.routing().as_str(),
            lab.gateways.len(),
            lab.proxy_addr(),
            lab.config.mode.as_str(),
            lab.push_net.ip,
            lab.config.client_stack.as_str(),
            lab.config.family.as_str()
        ));
        Ok(lab)
    }

    fn progress(&self, line: String) {
        if self.config.progress {
            eprintln!("openim-lab: {line}");
        }
    }

    /// Returns the name prefix of everything this lab created (`ip netns list`, `ip link`).
    pub fn prefix(&self) -> &str {
        self.network.prefix()
    }

    /// Returns the tokens the connected clients sent, for tests that prove none leaks.
    pub fn client_tokens(&self) -> Vec<String> {
        self.clients
            .iter()
            .map(|client| client.token.clone())
            .collect()
    }

    /// Returns where clients connect: the proxy pod's WebSocket port.
    pub fn proxy_addr(&self) -> SocketAddr {
        SocketAddr::from((self.proxy_net.ip, PROXY_PORT))
    }

    /// Returns the pids of every pod process (gateways, proxies including draining ones, push).
    pub fn pod_pids(&self) -> Vec<u32> {
        self.gateways
            .iter()
            .map(|gateway| &gateway.process)
            .chain(self.draining_proxies.iter())
            .chain([&self.proxy, &self.push])
            .filter_map(PodProcess::pid)
            .collect()
    }

    /// Returns the number of gateway replicas running now.
    pub fn replicas(&self) -> usize {
        self.gateways.len()
    }

    /// Returns the node (0-based, below `config.nodes`) a pod runs on: the proxy (and the proxies
    /// that replace it) on the first, push on the second, gateway `i` on node `i % nodes`, so with
    /// two nodes or more no node sees both halves of a join.
    pub fn node_of(&self, pod: PodRole) -> usize {
        pod.node(self.config.nodes)
    }

    /// Returns the number of simulated nodes (`LabConfig::nodes`).
    pub fn nodes(&self) -> usize {
        self.config.nodes
    }

    /// Returns the node's name as its observer reports it (`node-1`, `node-2`, …).
    pub fn node_name(node: usize) -> String {
        format!("node-{}", node + 1)
    }

    /// Returns the pids of the pod processes on one node.
    pub fn node_pids(&self, node: usize) -> Vec<u32> {
        let proxies = self
            .draining_proxies
            .iter()
            .chain([&self.proxy])
            .filter(|_| self.node_of(PodRole::Proxy) == node);
        let push = [&self.push]
            .into_iter()
            .filter(|_| self.node_of(PodRole::Push) == node);
        self.gateways
            .iter()
            .enumerate()
            .filter(|(index, _)| self.node_of(PodRole::Gateway(*index)) == node)
            .map(|(_, gateway)| &gateway.process)
            .chain(proxies)
            .chain(push)
            .filter_map(PodProcess::pid)
            .collect()
    }

    /// Returns the node's cgroup v2 directory, which holds its pods and their children (what the
    /// node's observer is scoped to); `None` with a single node, where nothing is scoped.
    pub fn node_cgroup(&self, node: usize) -> Option<&std::path::Path> {
        self.cgroups.as_ref().map(|cgroups| cgroups.node_dir(node))
    }

    /// Returns the pids the kernel lists in the node's cgroup (empty with a single node).
    pub fn node_cgroup_pids(&self, node: usize) -> Vec<u32> {
        self.cgroups
            .as_ref()
            .map(|cgroups| cgroups.pids(node))
            .unwrap_or_default()
    }

    fn cgroup_procs(&self, role: PodRole) -> Option<PathBuf> {
        self.cgroups
            .as_ref()
            .map(|cgroups| cgroups.procs_file(self.node_of(role)))
    }

    /// Returns the id of the lab's user `index`.
    pub fn user_id(index: usize) -> String {
        (USER_ID_BASE + (index as u64 * USER_ID_STRIDE) % USER_ID_SPAN).to_string()
    }

    /// Returns the platform of user `index`: platforms cycle iOS, Android, Windows, OSX, Web.
    fn platform_id(index: usize) -> i32 {
        (index % 5) as i32 + 1
    }

    /// Connects users `range` through the proxy; failures are remembered, not fatal.
    pub async fn connect_users(&mut self, range: std::ops::Range<usize>, late: bool) {
        let proxy = self.proxy_addr();
        let family = self.config.family;
        let indices: Vec<usize> = range.collect();
        for batch in indices.chunks(CONNECT_BATCH) {
            let results = if self.external_users.is_some() {
                self.connect_external(batch).await
            } else {
                let attempts = batch.iter().map(|&index| {
                    let user_id = Self::user_id(index);
                    let arrivals = self.arrivals.clone();
                    async move {
                        let platform = Self::platform_id(index);
                        let result =
                            client::connect(proxy, &user_id, platform, family, arrivals).await;
                        (user_id, result)
                    }
                });
                futures_util::future::join_all(attempts).await
            };
            for (user_id, result) in results {
                if late {
                    self.late_users.insert(user_id.clone());
                }
                match result {
                    Ok(client) => self.clients.push(client),
                    Err(error) => {
                        self.connect_errors.insert(user_id, format!("{error:#}"));
                    }
                }
            }
        }
        self.settle_sessions().await;
        self.progress(format!(
            "{} user(s) connected, {} failed",
            self.clients.len(),
            self.connect_errors.len()
        ));
    }

    /// Closes the WebSockets of `users` (the lab's own clients; a client program's users stay)
    /// and waits (bounded) until their gateways report the sessions closed, so a reconnect
    /// that lands on the same gateway is not mistaken for the closed one.
    pub async fn disconnect_users(&mut self, users: &[String]) {
        let leaving: HashSet<&str> = users.iter().map(String::as_str).collect();
        let before = self.clients.len();
        self.clients
            .retain(|client| !leaving.contains(client.user_id.as_str()));
        if self.clients.len() == before {
            return;
        }
        let deadline = Instant::now() + SESSION_SETTLE_TIMEOUT;
        while Instant::now() < deadline {
            let open = self.observations.lock().map_or(0, |observed| {
                users
                    .iter()
                    .filter(|user| observed.sessions.contains_key(user.as_str()))
                    .count()
            });
            if open == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Says whether `user_id` holds an open WebSocket that its gateway registered.
    pub fn is_connected(&self, user_id: &str) -> bool {
        self.clients.iter().any(|client| client.user_id == user_id)
            && self
                .observations
                .lock()
                .is_ok_and(|observed| observed.sessions.contains_key(user_id))
    }

    /// Counts the users with an open WebSocket, as the lab's clients hold them.
    pub fn connected_users(&self) -> usize {
        self.clients.len()
    }

    /// Connects users through the client program (Go or Python stack).
    async fn connect_external(&mut self, batch: &[usize]) -> Vec<(String, anyhow::Result<Client>)> {
        let proxy = self.proxy_addr();
        let mut tokens = HashMap::new();
        let mut requests = Vec::new();
        let mut results = Vec::new();
        for &index in batch {
            let user_id = Self::user_id(index);
            let url = client::token().and_then(|token| {
                let url = client::upgrade_url(proxy, &user_id, &token, Self::platform_id(index))?;
                tokens.insert(user_id.clone(), token);
                Ok(url)
            });
            match url {
                Ok(url) => requests.push((user_id, url)),
                Err(error) => results.push((user_id, Err(error))),
            }
        }
        let Some(users) = &mut self.external_users else {
            return results;
        };
        match users
            .connect(proxy, &requests, EXTERNAL_CONNECT_TIMEOUT)
            .await
        {
            Ok(outcomes) => {
                results.extend(outcomes.into_iter().map(|(user_id, outcome)| {
                    let token = tokens.remove(&user_id).unwrap_or_default();
                    let client = outcome
                        .map(|()| Client::external(user_id.clone(), token))
                        .map_err(anyhow::Error::msg);
                    (user_id, client)
                }));
            }
            Err(error) => {
                let error = format!("{error:#}");
                results.extend(
                    requests
                        .into_iter()
                        .map(|(user_id, _)| (user_id, Err(anyhow::anyhow!("{error}")))),
                );
            }
        }
        results
    }

    /// Waits (bounded) until the gateways have reported a session for every connected client.
    async fn settle_sessions(&self) {
        let deadline = Instant::now() + SESSION_SETTLE_TIMEOUT;
        while Instant::now() < deadline {
            let registered = self
                .observations
                .lock()
                .map_or(0, |observed| observed.sessions.len());
            if registered >= self.clients.len() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Scales the gateways to `replicas` the way a StatefulSet does: new pods appear with the
    /// next ordinals; the proxy (drained, not killed) and push restart with the new member
    /// count. Existing WebSockets stay where they are.
    ///
    /// # Errors
    ///
    /// Fails when `replicas` is fewer than now or over [`MAX_REPLICAS`], or a pod cannot be
    /// started, restarted or made ready.
    pub async fn scale_to(&mut self, replicas: usize) -> anyhow::Result<()> {
        ensure!(replicas >= self.gateways.len(), "the lab only scales out");
        ensure!(replicas <= MAX_REPLICAS, "at most {MAX_REPLICAS} replicas");
        let existing = self.gateways.len();
        for index in existing..replicas {
            let procs = self.cgroup_procs(PodRole::Gateway(index));
            let gateway = start_gateway(
                &mut self.network,
                &self.binary,
                self.config.openim,
                index,
                procs.as_deref(),
                &self.observations,
            )?;
            self.gateways.push(gateway);
        }
        for gateway in &mut self.gateways[existing..] {
            gateway.process.wait_ready().await?;
        }
        self.generation += 1;
        let names = name_table(&self.config, &self.gateways);
        self.proxy.terminate();
        self.proxy
            .wait_for("listener closed", Duration::from_secs(10), |event| {
                matches!(event, PodEvent::ListenerClosed).then_some(())
            })
            .await?;
        let proxy = spawn_proxy(
            &self.config,
            &self.binary,
            PodHome {
                net: &self.proxy_net,
                cgroup_procs: self.cgroup_procs(PodRole::Proxy).as_deref(),
            },
            &names,
            self.generation,
            replicas,
            &self.observations,
        )?;
        let drained = std::mem::replace(&mut self.proxy, proxy);
        self.draining_proxies.push(drained);
        self.proxy.wait_ready().await?;
        let push = spawn_push(
            &self.config,
            &self.binary,
            PodHome {
                net: &self.push_net,
                cgroup_procs: self.cgroup_procs(PodRole::Push).as_deref(),
            },
            &names,
            self.generation,
            replicas,
            &self.observations,
        )?;
        // The old push process goes away with its leaked connections, as a replaced pod does.
        drop(std::mem::replace(&mut self.push, push));
        self.push.wait_ready().await?;
        self.progress(format!("scaled out to {replicas} gateway(s)"));
        Ok(())
    }

    /// Returns the recipients of `outcome` that no call reached on the gateway holding their
    /// WebSocket (or that hold none): the misrouted ones. The gateway's answer cannot say it, since
    /// a delivery to Windows, OSX or Web is answered as "not here" is.
    pub fn misrouted(&self, outcome: &PushOutcome) -> std::collections::BTreeSet<String> {
        let Ok(observed) = self.observations.lock() else {
            return std::collections::BTreeSet::new();
        };
        let gateway_ip = |index: usize| self.gateways.get(index).map(|gateway| gateway.net.ip);
        let reached = |user: &str| {
            let placed = observed
                .sessions
                .get(user)
                .and_then(|(index, _)| gateway_ip(*index));
            outcome.calls.iter().any(|call| {
                call.recipients.iter().any(|recipient| recipient == user)
                    && call
                        .gateway_addr
                        .parse::<SocketAddr>()
                        .is_ok_and(|addr| Some(addr.ip()) == placed.map(std::net::IpAddr::from))
            })
        };
        outcome
            .calls
            .iter()
            .flat_map(|call| &call.recipients)
            .filter(|user| !reached(user))
            .cloned()
            .collect()
    }

    /// Asks push to deliver one group message to `recipients` and waits for its account.
    ///
    /// # Errors
    ///
    /// Fails when the command cannot be sent to push, or push refuses it, exits, or does not report
    /// the outcome in time.
    pub async fn push_message(
        &mut self,
        client_msg_id: &str,
        seq: i64,
        recipients: Vec<String>,
    ) -> anyhow::Result<PushOutcome> {
        self.push
            .send(&PushCommand::Push {
                client_msg_id: client_msg_id.to_owned(),
                seq,
                send_id: SENDER_ID.to_owned(),
                recipients,
            })
            .await?;
        let outcome = self
            .push
            .wait_for("push outcome", PUSH_REPLY_TIMEOUT, |event| match event {
                PodEvent::PushDone(outcome) if outcome.client_msg_id == client_msg_id => {
                    Some(outcome)
                }
                _ => None,
            })
            .await?;
        Ok(outcome)
    }

    /// Runs the scenario: connect users, scale out if configured, connect late users, push every
    /// message to every user, and report what happened.
    ///
    /// # Errors
    ///
    /// Fails as [`Lab::run_scenario_with`] does.
    pub async fn run_scenario(&mut self) -> anyhow::Result<GroundTruth> {
        self.run_scenario_with(|_, _| Ok(())).await
    }

    /// Runs [`Lab::run_scenario`], calling `at` at each [`ScenarioStep`]: once the first users are
    /// connected and before anything is pushed (e.g. to restart an observer or break Redis
    /// meanwhile), and after each round of the messages pushed to every user. It runs on the
    /// runtime's thread: wrap blocking work in `tokio::task::block_in_place`.
    ///
    /// # Errors
    ///
    /// Fails when `at` fails, the kernel's random bytes cannot be read, a push or the
    /// scale-out fails, or the ground truth cannot be put together.
    pub async fn run_scenario_with(
        &mut self,
        mut at: impl FnMut(&Self, ScenarioStep) -> anyhow::Result<()>,
    ) -> anyhow::Result<GroundTruth> {
        let scenario_started = Instant::now();
        self.connect_users(0..self.config.users, false).await;
        at(self, ScenarioStep::Connected)?;
        let run_tag: String = random_bytes::<4>()?
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        let mut sent = Vec::new();
        let mut scaled_out_at = None;
        if self.config.replicas_final > self.gateways.len() {
            let early: Vec<String> = (0..self.config.users).map(Self::user_id).collect();
            for _ in 0..self.config.messages_before_scale {
                self.push_round(&run_tag, &early, &mut sent).await?;
            }
            scaled_out_at = Some(std::time::SystemTime::now());
            self.scale_to(self.config.replicas_final).await?;
        }
        let all_users = self.config.users + self.config.late_users;
        if self.config.late_users > 0 {
            self.connect_users(self.config.users..all_users, true).await;
        }
        let recipients: Vec<String> = (0..all_users).map(Self::user_id).collect();
        for round in 0..self.config.messages_per_user {
            self.push_round(&run_tag, &recipients, &mut sent).await?;
            at(self, ScenarioStep::Pushed { round })?;
        }
        self.await_arrivals(&sent).await;
        let mut truth = self.ground_truth(&recipients, &sent)?;
        truth.scaled_out_at_unix_ms = scaled_out_at
            .and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok())
            .and_then(|since| u64::try_from(since.as_millis()).ok());
        self.progress(format!(
            "{} users, {} deliveries, {} real-time misses ({} users), {} connect failures, {:.1}s",
            truth.summary.users,
            truth.summary.deliveries,
            truth.summary.realtime_misses,
            truth.summary.users_missing,
            truth.summary.connect_failures,
            scenario_started.elapsed().as_secs_f64()
        ));
        Ok(truth)
    }

    /// Pushes one group message to `recipients`, numbered after those already `sent`.
    async fn push_round(
        &mut self,
        run_tag: &str,
        recipients: &[String],
        sent: &mut Vec<(i64, Instant, PushOutcome)>,
    ) -> anyhow::Result<()> {
        let round = sent.len();
        let client_msg_id = format!("lab-{run_tag}-{round}");
        let seq = i64::try_from(round)? + 1;
        let sent_at = Instant::now();
        let outcome = self
            .push_message(&client_msg_id, seq, recipients.to_vec())
            .await?;
        sent.push((seq, sent_at, outcome));
        Ok(())
    }

    /// Waits until every connected user has every message, or the real-time window closed.
    async fn await_arrivals(&self, sent: &[(i64, Instant, PushOutcome)]) {
        let Some((_, last_sent, _)) = sent.last() else {
            return;
        };
        let expected = self.clients.len() * sent.len();
        let deadline = *last_sent + self.config.realtime_timeout;
        while Instant::now() < deadline {
            let arrived = self.arrivals.lock().map_or(0, |arrivals| arrivals.len());
            if arrived >= expected {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn ground_truth(
        &self,
        recipients: &[String],
        sent: &[(i64, Instant, PushOutcome)],
    ) -> anyhow::Result<GroundTruth> {
        let Ok(observed) = self.observations.lock() else {
            bail!("observations lock poisoned");
        };
        let Ok(arrivals) = self.arrivals.lock() else {
            bail!("arrivals lock poisoned");
        };
        let gateways = self.gateway_truth()?;
        let rings = TruthRings::new(&self.config, gateways.len())?;
        let mut summary = Summary {
            users: recipients.len(),
            messages: sent.len(),
            realtime_timeout_ms: u64::try_from(self.config.realtime_timeout.as_millis())?,
            ..Summary::default()
        };
        summary.push_calls = observed.push_calls.values().sum();
        summary.authority_mismatches = observed
            .push_calls
            .iter()
            .filter(|((index, authority), _)| {
                gateways
                    .get(*index)
                    .is_none_or(|gateway| self.expected_authority(gateway) != *authority)
            })
            .map(|(_, calls)| calls)
            .sum();
        summary.answers_out_of_order = sent
            .iter()
            .flat_map(|(_, _, outcome)| &outcome.calls)
            .filter(|call| {
                let answered = call.results.iter().map(|result| &result.user_id);
                call.error.is_none() && !answered.eq(call.recipients.iter())
            })
            .count();
        let mut users = Vec::new();
        for (index, user_id) in recipients.iter().enumerate() {
            let user = self.user_truth(index, user_id, &observed, &arrivals, &gateways, sent);
            let misses = user
                .pushes
                .iter()
                .filter(|push| !push.arrived_in_time)
                .count();
            summary.deliveries += user.pushes.len();
            summary.realtime_misses += misses;
            summary.users_missing += usize::from(misses > 0);
            if let Some(placement) = &user.websocket {
                summary.connected += 1;
                summary.users_misrouted += usize::from(
                    user.pushes
                        .iter()
                        .any(|push| push.gateway_index != Some(placement.gateway_index)),
                );
            }
            summary.connect_failures += usize::from(user.connect_error.is_some());
            users.push(UserTruth {
                miss_cause: (misses > 0 && user.websocket.is_some())
                    .then(|| rings.cause(&self.config, &user)),
                ..user
            });
        }
        Ok(GroundTruth {
            mode: self.config.mode.as_str().to_owned(),
            openim: self.config.openim,
            discovery: self.config.discovery,
            routing: self.config.routing(),
            instance: self.config.instance.clone(),
            namespace: self.config.namespace.clone(),
            replicas_initial: self.config.replicas_initial,
            replicas_final: self.gateways.len(),
            proxy_addr: self.proxy_addr().to_string(),
            gateways,
            users,
            summary,
            scaled_out_at_unix_ms: None,
        })
    }

    /// Returns the `:authority` push's calls should carry to `gateway`: its ring member, or its pod
    /// address where push broadcasts.
    fn expected_authority(&self, gateway: &GatewayTruth) -> String {
        match self.config.routing() {
            PushRouting::Ring => gateway.push_member.clone(),
            PushRouting::Broadcast => format!("{}:{}", gateway.ip, gateway::GRPC_PORT),
        }
    }

    /// Builds one user's truth (its cause left for [`TruthRings::cause`]): where its WebSocket
    /// lives and, per message, the call that should have reached it (the one to its own gateway
    /// when push broadcast) and whether the message arrived in time.
    fn user_truth(
        &self,
        index: usize,
        user_id: &str,
        observed: &Observations,
        arrivals: &HashMap<(String, String), Instant>,
        gateways: &[GatewayTruth],
        sent: &[(i64, Instant, PushOutcome)],
    ) -> UserTruth {
        let websocket = observed
            .sessions
            .get(user_id)
            .map(|(gateway, host)| Placement {
                gateway_index: *gateway,
                gateway_ip: gateways
                    .get(*gateway)
                    .map(|truth| truth.ip.clone())
                    .unwrap_or_default(),
                host_header: host.clone(),
            });
        let connect_error = self.connect_errors.get(user_id).map(|error| {
            match observed.relay_failures.get(user_id) {
                Some(relay) => format!("{error}; proxy: {relay}"),
                None => error.clone(),
            }
        });
        let gateway_of = |addr: &str| {
            let ip = addr.rsplit_once(':').map_or(addr, |(ip, _)| ip);
            gateways.iter().find(|gateway| gateway.ip == ip)
        };
        let late = self.late_users.contains(user_id);
        let mut pushes = Vec::new();
        for (seq, sent_at, outcome) in sent {
            let carrying = || {
                outcome
                    .calls
                    .iter()
                    .filter(|call| call.recipients.iter().any(|user| user == user_id))
            };
            let call = carrying()
                .find(|call| {
                    gateway_of(&call.gateway_addr).map(|gateway| gateway.index)
                        == websocket.as_ref().map(|placement| placement.gateway_index)
                })
                .or_else(|| carrying().next());
            // Messages pushed before this user connected were not for it.
            if call.is_none() && late {
                continue;
            }
            let gateway = call.and_then(|call| gateway_of(&call.gateway_addr));
            let result =
                call.and_then(|call| call.results.iter().find(|result| result.user_id == user_id));
            let latency = arrivals
                .get(&(user_id.to_owned(), outcome.client_msg_id.clone()))
                .map(|arrived| arrived.saturating_duration_since(*sent_at));
            pushes.push(PushTruth {
                client_msg_id: outcome.client_msg_id.clone(),
                seq: *seq,
                member: call.map(|call| call.member.clone()),
                gateway_index: gateway.map(|gateway| gateway.index),
                gateway_ip: gateway.map(|gateway| gateway.ip.clone()),
                online_push: result.is_some_and(|result| result.online_push),
                arrived_in_time: latency
                    .is_some_and(|latency| latency <= self.config.realtime_timeout),
                latency_ms: latency.map(|latency| latency.as_secs_f64() * 1000.0),
                error: call.and_then(|call| call.error.clone()),
            });
        }
        UserTruth {
            user_id: user_id.to_owned(),
            platform_id: Self::platform_id(index),
            connected_after_scale: late,
            websocket,
            connect_error,
            pushes,
            miss_cause: None,
        }
    }

    fn gateway_truth(&self) -> anyhow::Result<Vec<GatewayTruth>> {
        let replicas = self.gateways.len();
        let proxy_members = MemberTemplate::parse(PROXY_MEMBER_TEMPLATE)?.members(
            &self.config.instance,
            &self.config.namespace,
            replicas,
        );
        let push_members = MemberTemplate::parse(PUSH_MEMBER_TEMPLATE)?.members(
            &self.config.instance,
            &self.config.namespace,
            replicas,
        );
        Ok(self
            .gateways
            .iter()
            .zip(proxy_members.into_iter().zip(push_members))
            .enumerate()
            .map(
                |(index, (gateway, (proxy_member, push_member)))| GatewayTruth {
                    index,
                    ip: gateway.net.ip.to_string(),
                    netns: gateway.net.netns.clone(),
                    pid: gateway.process.pid(),
                    proxy_member,
                    push_member,
                },
            )
            .collect())
    }

    /// Pushes at full speed for `duration` to every connected user (connect some first), one new
    /// gRPC connection per call; latency per call in the report.
    ///
    /// # Errors
    ///
    /// Fails when no user is connected, or push refuses, fails or does not report the flood.
    pub async fn push_flood(&mut self, duration: Duration) -> anyhow::Result<FloodReport> {
        let recipients: Vec<String> = self
            .clients
            .iter()
            .map(|client| client.user_id.clone())
            .collect();
        ensure!(!recipients.is_empty(), "connect users before a push flood");
        let duration_ms = u64::try_from(duration.as_millis())?;
        self.push
            .send(&PushCommand::Flood {
                duration_ms,
                recipients,
            })
            .await?;
        let report = self
            .push
            .wait_for(
                "flood report",
                duration + PUSH_REPLY_TIMEOUT,
                |event| match event {
                    PodEvent::FloodDone(report) => Some(report),
                    _ => None,
                },
            )
            .await?;
        Ok(report)
    }
}

/// Holds the proxy's ring (as the proxy mode spells its members) and push's ring over the gateways
/// at the end of a run, for naming why a user missed a message.
struct TruthRings {
    proxy: Ring,
    push: Ring,
}

impl TruthRings {
    fn new(config: &LabConfig, replicas: usize) -> anyhow::Result<Self> {
        let proxy_template = match config.mode {
            ProxyMode::V351 => PROXY_MEMBER_TEMPLATE,
            ProxyMode::ReportFix | ProxyMode::Correct => PUSH_MEMBER_TEMPLATE,
        };
        let members = |template| {
            anyhow::Ok(MemberTemplate::parse(template)?.members(
                &config.instance,
                &config.namespace,
                replicas,
            ))
        };
        Ok(Self {
            proxy: Ring::new(members(proxy_template)?),
            push: Ring::new(members(PUSH_MEMBER_TEMPLATE)?),
        })
    }

    /// Says why a connected `user` missed a message: the rings hash it apart now (spelling), or
    /// they agree now and the user was placed before the scale-out (stale placement); a broadcast
    /// has no ring to blame.
    fn cause(&self, config: &LabConfig, user: &UserTruth) -> MissCause {
        if config.routing() == PushRouting::Broadcast {
            return MissCause::Undetermined;
        }
        let picks = (
            self.proxy.get_index(&user.user_id),
            self.push.get_index(&user.user_id),
        );
        let scaled = config.replicas_final > config.replicas_initial;
        match picks {
            (Ok(proxy), Ok(push)) if proxy != push => MissCause::RingSpelling,
            (Ok(_), Ok(_)) if scaled && !user.connected_after_scale => MissCause::StalePlacement,
            _ => MissCause::Undetermined,
        }
    }
}

fn start_gateway(
    network: &mut Network,
    binary: &std::path::Path,
    release: OpenImRelease,
    index: usize,
    cgroup_procs: Option<&std::path::Path>,
    observations: &SharedObservations,
) -> anyhow::Result<GatewayPod> {
    let host = FIRST_GATEWAY_HOST + u8::try_from(index).context("gateway index")?;
    let net = network.add_pod(&format!("gw{index}"), host)?;
    let process = PodProcess::spawn(
        binary,
        &net.netns,
        &[
            "gateway".to_owned(),
            "--index".to_owned(),
            index.to_string(),
            "--openim".to_owned(),
            release.as_str().to_owned(),
        ],
        &format!("msggateway-{index}"),
        Some(index),
        cgroup_procs,
        observations.clone(),
    )?;
    Ok(GatewayPod { net, process })
}

/// Builds the cluster-DNS stand-in: each gateway's headless-service name → its pod address.
fn name_table(config: &LabConfig, gateways: &[GatewayPod]) -> NameTable {
    let mut names = NameTable::default();
    let hosts = MemberTemplate::parse(PROXY_MEMBER_TEMPLATE)
        .map(|template| template.members(&config.instance, &config.namespace, gateways.len()))
        .unwrap_or_default();
    for (host, gateway) in hosts.into_iter().zip(gateways) {
        names.insert(host, gateway.net.ip);
    }
    names
}

/// Says where a pod runs: its network namespace and, with several nodes, its node's cgroup.
struct PodHome<'a> {
    net: &'a PodNet,
    cgroup_procs: Option<&'a std::path::Path>,
}

/// Returns the proxy's and push's `GatewayDeployment` arguments.
fn gateway_deployment_args(config: &LabConfig, replicas: usize, names: &NameTable) -> [String; 8] {
    [
        "--instance".to_owned(),
        config.instance.clone(),
        "--namespace".to_owned(),
        config.namespace.clone(),
        "--replicas".to_owned(),
        replicas.to_string(),
        "--names".to_owned(),
        names.to_arg(),
    ]
}

fn spawn_proxy(
    config: &LabConfig,
    binary: &std::path::Path,
    home: PodHome<'_>,
    names: &NameTable,
    generation: usize,
    replicas: usize,
    observations: &SharedObservations,
) -> anyhow::Result<PodProcess> {
    let mut args = vec![
        "proxy".to_owned(),
        "--mode".to_owned(),
        config.mode.as_str().to_owned(),
    ];
    args.extend(gateway_deployment_args(config, replicas, names));
    Ok(PodProcess::spawn(
        binary,
        &home.net.netns,
        &args,
        &format!("msggw-proxy-gen{generation}"),
        None,
        home.cgroup_procs,
        observations.clone(),
    )?)
}

fn spawn_push(
    config: &LabConfig,
    binary: &std::path::Path,
    home: PodHome<'_>,
    names: &NameTable,
    generation: usize,
    replicas: usize,
    observations: &SharedObservations,
) -> anyhow::Result<PodProcess> {
    let mut args = vec!["push".to_owned()];
    args.extend(gateway_deployment_args(config, replicas, names));
    args.extend([
        "--family".to_owned(),
        config.family.as_str().to_owned(),
        "--openim".to_owned(),
        config.openim.as_str().to_owned(),
        "--discovery".to_owned(),
        config.discovery.as_str().to_owned(),
    ]);
    let reuse = config.reuses_push_connections();
    if reuse {
        args.push("--reuse-connections".to_owned());
    }
    if let Some(program) = config.client_stack.program("push", config.family)? {
        args.push("--client-program".to_owned());
        args.push(program.program.to_string_lossy().into_owned());
        for arg in program.args {
            args.push(format!("--client-arg={arg}"));
        }
        if reuse {
            args.push("--client-arg=--reuse".to_owned());
        }
    }
    Ok(PodProcess::spawn(
        binary,
        &home.net.netns,
        &args,
        &format!("openim-push-gen{generation}"),
        None,
        home.cgroup_procs,
        observations.clone(),
    )?)
}

#[cfg(test)]
mod tests;
