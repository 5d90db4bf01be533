//! Words every diagnosis the observer prints, in one place: the engine's alerts (what happened,
//! what it costs OpenIM's users, the fix) and the offline tools' explanations. The texts quote
//! facts; deciding that something happened is the detectors' and the tools' job.

use std::{
    fmt::{self, Display, Formatter},
    net::IpAddr,
};

use serde::Serialize;

use crate::alert::PushRoutingMode;
use crate::model::{Gateway, GatewayAnswer, IpText, MismatchCause};

/// Records what the two rings learned from the wire disagree on, as a ring divergence quotes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Divergence {
    /// The proxy's ring as inferred (its `Host` spelling of push's gateways).
    pub proxy_members: Vec<String>,
    pub push_members: Vec<String>,
    /// What separates the spellings, in plain words.
    pub difference: String,
    pub proxy_example: String,
    pub push_example: String,
    /// Placements seen, and how many of them the two rings would have put apart.
    pub placements_seen: usize,
    pub placements_split: usize,
    /// Share of a uniform sample of user ids the two rings send to different gateways.
    pub sample_split_share: f64,
}

/// Explains that a push for `user` went to a gateway other than those holding its WebSocket, in
/// words (`spelling_difference` is what separates the two rings' member strings, when learnt).
/// Written where it is printed, piece by piece, never kept as text: see `alert::RouteMismatch`.
pub struct RouteMismatchDiagnosis<'a, Placed> {
    pub user: &'a str,
    pub placed_on: Placed,
    pub pushed_to: &'a Gateway,
    pub answer: GatewayAnswer,
    pub spelling_difference: Option<&'a str>,
    pub cause: MismatchCause,
}

/// Holds a piece of a route mismatch's paragraph. The alert writer copies the paragraph's own words
/// as they are (none needs a JSON escape; the tests hold every variant to serde_json), escapes
/// what it quotes, and keeps each gateway's words, the same few in every line, rather than
/// spelling the IP afresh.
pub enum DiagnosisPart<'p> {
    /// The paragraph's own words.
    Words(&'static str),
    /// A value from the wire: the user's id, the rings' spelling difference.
    Quoted(&'p str),
    /// A gateway, by its member string and IP, or its IP alone.
    Gateway(&'p Gateway),
}

impl<'a, Placed> RouteMismatchDiagnosis<'a, Placed>
where
    Placed: Iterator<Item = &'a Gateway> + Clone,
{
    /// Writes the paragraph, piece by piece, in order.
    ///
    /// # Errors
    ///
    /// Fails with the first error `write` returns, and writes nothing after it.
    pub fn write_parts<E>(
        &self,
        mut write: impl FnMut(DiagnosisPart<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        use DiagnosisPart::{Gateway, Quoted, Words};
        let consequence = match self.answer {
            GatewayAnswer::EmptyEntry => {
                "that gateway listed no delivery for the user, so the message missed real time on \
                that WebSocket (offline push instead)"
            }
            GatewayAnswer::Delivered => {
                "that gateway still reported a delivery (the user also has a connection there the \
                observer did not see)"
            }
            GatewayAnswer::DeliveryFailed => "that gateway failed to deliver it",
            GatewayAnswer::Unknown => {
                "the gateway's answer was not seen; the user's connection is not on that gateway, \
                so real-time delivery most likely failed"
            }
        };
        write(Words("user "))?;
        write(Quoted(self.user))?;
        write(Words(" holds its WebSocket on "))?;
        for (index, gateway) in self.placed_on.clone().enumerate() {
            if index > 0 {
                write(Words(" and "))?;
            }
            write(Gateway(gateway))?;
        }
        write(Words(" but push delivered to "))?;
        write(Gateway(self.pushed_to))?;
        write(Words(": "))?;
        write(Words(consequence))?;
        match (self.cause, self.spelling_difference) {
            (MismatchCause::RingSpelling, Some(difference)) => {
                write(Words(
                    "; the proxy's and push's rings spell gateways differently (",
                ))?;
                write(Quoted(difference))?;
                write(Words("), so they hash user "))?;
                write(Quoted(self.user))?;
                write(Words(
                    " to different gateways. Make both hash the same member strings while the \
                    proxy keeps dialling the WebSocket port",
                ))?;
            }
            (MismatchCause::RingSpelling, None) => write(Words(
                "; the proxy's and push's rings hash the user to different gateways. Make both \
                hash the same member strings while the proxy keeps dialling the WebSocket port",
            ))?,
            (MismatchCause::StalePlacement, _) => write(Words(
                "; both rings agree on the current gateways, but this WebSocket was placed under \
                an older membership (a scale-out or scale-in), and OpenIM never moves a live \
                WebSocket when the ring changes. Reconnect the moved users, or have the gateways \
                drop connections that no longer hash to them",
            ))?,
            (MismatchCause::PushRingLags, _) => write(Words(
                "; push's ring does not hold every gateway the proxy's does (push has not caught \
                up with the membership). Restart push, or fix its replica count, so it builds its \
                ring over every gateway",
            ))?,
            (MismatchCause::ProxyRingLags, _) => write(Words(
                "; the proxy's ring does not hold every gateway push's does (the proxy has not \
                caught up with the membership). Restart msggateway-proxy, or fix its replica count",
            ))?,
            (MismatchCause::Undetermined, Some(difference)) => {
                write(Words(
                    "; the proxy's and push's rings spell gateways differently (",
                ))?;
                write(Quoted(difference))?;
                write(Words(
                    "), but too little is seen yet to say whether that or an older membership put \
                    the user there",
                ))?;
            }
            (MismatchCause::Undetermined, None) => {}
        }
        Ok(())
    }
}

impl<'a, Placed> Display for RouteMismatchDiagnosis<'a, Placed>
where
    Placed: Iterator<Item = &'a Gateway> + Clone,
{
    fn fmt(&self, text: &mut Formatter<'_>) -> fmt::Result {
        self.write_parts(|part| match part {
            DiagnosisPart::Words(piece) | DiagnosisPart::Quoted(piece) => text.write_str(piece),
            DiagnosisPart::Gateway(gateway) => GatewayInWords(gateway).fmt(text),
        })
    }
}

/// Words a gateway by its member string and IP, or its IP alone.
pub struct GatewayInWords<'g>(pub &'g Gateway);

impl Display for GatewayInWords<'_> {
    fn fmt(&self, text: &mut Formatter<'_>) -> fmt::Result {
        let ip = IpText::new(self.0.ip);
        if let Some(name) = &self.0.name {
            text.write_str(name)?;
            text.write_str(" (")?;
            text.write_str(ip.as_str())?;
            text.write_str(")")
        } else {
            text.write_str(ip.as_str())
        }
    }
}

/// Explains that the proxy sent a WebSocket upgrade (for `user`, when it named one) to a gRPC port.
pub fn ws_upgrade_on_grpc_port(user: Option<&str>, ip: IpAddr, port: u16) -> String {
    format!(
        "a WebSocket upgrade{} was sent to {ip}:{port}, a gRPC port: the proxy dials its ring \
        member literally, so members carrying the gRPC port (the incident report's fix as written) \
        send WebSockets to the gRPC server, which rejects them. Hash on the ':88' spelling but \
        dial the WebSocket port",
        user.map(|user| format!(" for user {user}"))
            .unwrap_or_default(),
    )
}

/// Explains that the proxy's and push's rings, as learnt from the wire, send users to different
/// gateways.
pub fn ring_divergence(divergence: &Divergence) -> String {
    format!(
        "msggateway-proxy places users with a ring over {} members like '{}', push delivers with a \
        ring over {} members like '{}' ({}); the two rings send {:.0}% of user ids to different \
        gateways ({} of the {} placements seen), and every such online user misses real-time \
        messages. Make both hash the same member strings while the proxy keeps dialling the \
        WebSocket port",
        divergence.proxy_members.len(),
        divergence.proxy_example,
        divergence.push_members.len(),
        divergence.push_example,
        divergence.difference,
        divergence.sample_split_share * 100.0,
        divergence.placements_split,
        divergence.placements_seen,
    )
}

/// Says what push's calls showed of its service and routing.
pub fn push_routing(service: &str, mode: PushRoutingMode) -> String {
    match mode {
        PushRoutingMode::Ring => format!(
            "push calls {service} and sends each recipient of a message to one gateway, the one \
            its consistent-hash ring picks (OpenIM 3.5 to 3.8.3 with Kubernetes discovery): a \
            recipient whose WebSocket the proxy placed on another gateway misses real time, so \
            route mismatches are judged per call"
        ),
        PushRoutingMode::Broadcast => format!(
            "push calls {service} and sends every recipient of a message to every gateway \
            (zookeeper or etcd discovery, OpenIM 3.8.4 and later): no push ring exists to diverge \
            from, and a recipient misses real time only when no gateway that received the message \
            holds its WebSocket"
        ),
    }
}

/// Describes what a pusher that opens a connection per call looks like, and what it costs.
pub struct Churn<'a> {
    pub comm: &'a str,
    pub pid: u32,
    pub new_connections: u64,
    pub window_secs: u64,
    pub calls_per_connection: f64,
    pub open_connections: u64,
}

/// Explains that a pusher opens a new gRPC connection per call and does not close them.
pub fn push_connection_churn(churn: &Churn<'_>) -> String {
    let Churn {
        comm,
        pid,
        new_connections,
        window_secs,
        calls_per_connection,
        open_connections,
    } = churn;
    format!(
        "{comm} (pid {pid}) opened {new_connections} gRPC connections to gateways in \
        {window_secs}s, about {calls_per_connection:.1} call per connection, and holds \
        {open_connections} open: a new client connection per push call that is never closed, as \
        OpenIM 3.5.1 push does in Kubernetes mode. It leaks sockets and memory in push and in \
        every gateway until restart"
    )
}

/// Explains that cluster mode lost its shared state (`recovered`: got it back).
pub fn shared_state_unreachable(recovered: bool) -> String {
    if recovered {
        "Redis answers again: this node's placements and ring evidence were written back, and \
         joins across nodes and cluster-wide deduplication resumed. Mismatches whose halves were \
         seen on different nodes while it was down were missed."
            .to_owned()
    } else {
        "The shared-state Redis does not answer: each node now judges only what its own kernel \
         shows (a mismatch whose placement and push were seen on different nodes is missed, and \
         an alert may be printed by more than one node). Facts wait in a bounded queue, then are \
         dropped and counted (openim_observer_redis_facts_dropped). Check the Redis URL, \
         credentials, the NetworkPolicy egress rule and Redis itself."
            .to_owned()
    }
}

/// Explains that the observer started on a live node: WebSockets upgraded before the observer
/// watched have unknown users (`recovered`: the last of them closed).
pub fn joined_mid_stream(recovered: bool) -> String {
    if recovered {
        "Every WebSocket adopted at start has closed: every placement is seen again.".to_owned()
    } else {
        "The observer started on a live node: WebSockets upgraded before it watched have users it \
         does not know, so a push to such a user cannot be judged until the user reconnects. \
         Users who connect from now on are judged. Cluster mode (--redis-url) recovers the \
         placements an observer on this node saw before it restarted."
            .to_owned()
    }
}

/// Holds the settings a capture degradation's diagnosis quotes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaptureSettings {
    pub ring_bytes: u32,
    pub max_watched_connections: u32,
    pub grpc_budget: u32,
    pub memory_budget: usize,
}

/// Explains that the observer lost sight of watched traffic for a capture reason (`recovered`: it
/// sees again). `reason` is the alert's reason name.
pub fn capture_degraded(reason: &str, recovered: bool, settings: &CaptureSettings) -> String {
    let CaptureSettings {
        ring_bytes,
        max_watched_connections,
        grpc_budget,
        memory_budget,
    } = *settings;
    let cause = match reason {
        "ring_full" => format!(
            "The kernel's ring buffer ({ring_bytes} bytes) was full, so the kernel dropped \
            records: connections, upgrades and push calls in them were not seen, whichever process \
            made them. Raise --ring-bytes (a power of two, e.g. {}) and the pod's memory limit \
            with it; a busy node may also need more CPU for the observer.",
            u64::from(ring_bytes).saturating_mul(4).next_power_of_two()
        ),
        "lost_sync" => "Bytes of a connection were not captured (a dropped record or the capture \
        budget), so its decoder lost the stream from there: later push calls on those connections \
        are not seen until they reconnect. If ring_full is raised too, fix that first; otherwise \
        raise --grpc-budget."
            .to_owned(),
        "undecodable" => "Traffic on a watched port is not what OpenIM sends there (not HTTP/2 \
        from its start on a gRPC port, not an HTTP/1.1 upgrade on a WebSocket port, or a protocol \
        error): those connections are not judged. Check that --grpc-port and --ws-port name the \
        gateways' ports and nothing else; the processes listed are the ones writing it."
            .to_owned(),
        "table_full" => format!(
            "A full table or the memory budget ({memory_budget} bytes) dropped state: the \
            connections idle longest, then the users placed longest ago, or a kernel table of \
            watched connections or of the connects, reads and writes in progress on them \
            ({max_watched_connections} each) was full and new ones went unwatched. Pushes for \
            dropped or unwatched users are not judged. Raise --memory-budget and the pod's memory \
            limit with it (docs/install.md gives the sizing rule), --max-connections/--max-users \
            if they are what bounds, or --max-watched-connections if the kernel counts \
            map_insert_failures (stop line, /metrics)."
        ),
        "runs_skipped" => "The kernel skipped runs of the observer's programs: a tracepoint fired \
        on a CPU where one of them (or, for the syscall hook's tracepoints, any kprobe or \
        tracepoint program of any tool) was already running, as when an interrupt's TCP state \
        change lands inside the state program's run. Connections whose start was skipped are not \
        watched, those whose end was skipped keep their kernel table entry until a later \
        connection's socket reuses its memory, and with the syscall hook a skipped read or write \
        is not copied. A few under heavy load are expected; if they keep growing, look for other \
        BPF tracing tools on the node (`bpftool prog show` lists every program and its \
        recursion_misses)."
            .to_owned(),
        "budget_exhausted" => format!(
            "gRPC connections wrote more than the capture budget ({grpc_budget} bytes per \
            direction): the bytes past it were counted, not copied, so push calls there are not \
            seen. Raise --grpc-budget; long-lived pooled connections need the most."
        ),
        other => format!("Capture is degraded ({other})."),
    };
    if recovered {
        format!("Recovered: no more of it for a while. It was: {cause}")
    } else {
        cause
    }
}

/// Writes the last line of `observer audit`: why the two rings split users, or why they do not.
pub fn audit_why(spellings_differ: bool, difference: &str) -> String {
    if spellings_differ {
        format!(
            "Why: {difference}; the ring hashes the member text, so the two rings place \
             users independently and about 1 - 1/n of them land on different gateways.\n"
        )
    } else {
        format!("Why: {difference}, so both rings agree for every user.\n")
    }
}

/// Names the gateway one ring picks for a user, and that gateway's member string.
#[derive(Serialize, Debug)]
pub struct Pick<'a> {
    pub gateway: usize,
    pub member: &'a str,
}

/// Records where both rings send one user (`observer explain`; also its JSON form).
#[derive(Serialize, Debug)]
pub struct Explanation<'a> {
    pub user: &'a str,
    pub replicas: usize,
    pub proxy: Pick<'a>,
    pub push: Pick<'a>,
    pub agree: bool,
    pub difference: &'a str,
}

/// Words `observer explain`: both picks, and why they differ or agree.
pub fn explanation(explanation: &Explanation, spellings_differ: bool) -> String {
    let Explanation {
        user,
        replicas,
        proxy,
        push,
        agree,
        difference,
    } = explanation;
    let mut text = format!(
        "User {user} with {replicas} gateway{}:\n\
         \x20 proxy (WebSocket placement) picks gateway {}: {}\n\
         \x20 push  (online delivery)     picks gateway {}: {}\n",
        if *replicas == 1 { "" } else { "s" },
        proxy.gateway,
        proxy.member,
        push.gateway,
        push.member,
    );
    let verdict = if !agree {
        format!(
            "They disagree: push delivers to gateway {} but the user's WebSocket is on gateway \
             {}, which answers \"not online\", so the message falls back to offline push.\n\
             Why: {difference}; the ring hashes the member text, so the two rings place this \
             user independently.\n",
            push.gateway, proxy.gateway
        )
    } else if *replicas == 1 {
        format!(
            "They agree: with a single gateway every user is on gateway {}.\n",
            proxy.gateway
        )
    } else if spellings_differ {
        format!(
            "They agree: both send the user to gateway {}, so pushes reach the WebSocket.\n\
             Why they could differ: {difference}; the rings place users independently and \
             agree for this user by chance (about 1 user in {replicas}).\n",
            proxy.gateway
        )
    } else {
        format!(
            "They agree: both send the user to gateway {}.\nWhy: {difference}, so both rings \
             agree for every user.\n",
            proxy.gateway
        )
    };
    text.push_str(&verdict);
    text
}
