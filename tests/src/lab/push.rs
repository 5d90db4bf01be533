//! Runs the push pod, as OpenIM 3.5.1 push in Kubernetes mode: hashes every recipient over the
//! `…:88` members, groups recipients by member, and for each member opens a **new** gRPC connection
//! (`:authority` = member string) and calls `SuperGroupOnlineBatchPushOneMsg`. The connections are
//! never closed (3.5.1's leak): the channels stay in a Vec. With `--reuse-connections`, as later
//! OpenIM versions and pooled clients do, it keeps one connection per member instead and makes
//! every call on it. `--openim` picks the call's `:path` (the release's service name); where the
//! release and `--discovery` broadcast (see [`OpenImRelease::routing`]), push sends every recipient
//! to every gateway, dialled by its pod address (`:authority` `ip:88`), the calls made
//! concurrently.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use http::uri::PathAndQuery;
use hyper_util::rt::TokioIo;
use observer::openim::hashring::{MemberTemplate, PUSH_MEMBER_TEMPLATE, Ring};
use prost::Message;
use tokio::io::{AsyncBufReadExt, BufReader};
use tonic::transport::{Channel, Endpoint};

use crate::lab::client::connect_tcp;
use crate::lab::control::{PodEvent, PushCall, PushCommand, PushOutcome, UserPushResult, emit};
use crate::lab::external::ExternalPush;
use crate::lab::gateway::GRPC_PORT;
use crate::lab::names::{GatewayDeployment, NameTable};
use crate::lab::release::{Discovery, OpenImRelease, PushRouting};
use crate::lab::stack::{AddressFamily, ClientProgram};
use crate::lab::truth::FloodReport;
use crate::proto::msggateway::{OnlineBatchPushOneMsgReq, OnlineBatchPushOneMsgResp};
use crate::proto::sdkws::MsgData;

const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Numbers OpenIM's SuperGroupChatType.
const SUPER_GROUP_SESSION: i32 = 3;
/// Numbers OpenIM's Text content type.
const TEXT_CONTENT: i32 = 101;

#[derive(clap::Args, Debug, Clone)]
pub struct PushArgs {
    #[command(flatten)]
    pub gateways: GatewayDeployment,
    /// One long-lived connection per member, reused for every call.
    #[arg(long)]
    pub reuse_connections: bool,
    /// The release whose service name push calls and whose routing it follows.
    #[arg(long, value_enum, default_value = "3.5")]
    pub openim: OpenImRelease,
    /// Where push learns the gateways from (etcd broadcasts on every release).
    #[arg(long, value_enum, default_value = "kubernetes")]
    pub discovery: Discovery,
    /// The sockets tonic connects from (the lab's own stack).
    #[arg(long, value_enum, default_value = "ipv4")]
    pub family: AddressFamily,
    /// A client program that makes the push calls instead of tonic (the Go or Python stack,
    /// see `lab::stack`); its arguments follow as `--client-arg`.
    #[arg(long)]
    pub client_program: Option<PathBuf>,
    #[arg(long = "client-arg", allow_hyphen_values = true)]
    pub client_args: Vec<String>,
}

/// Holds one call's destination: the `:authority`, the address dialled, the recipients carried.
struct Target {
    member: String,
    address: SocketAddr,
    users: Vec<String>,
}

struct Pusher {
    ring: Ring,
    /// Ring or broadcast, from the release and the discovery.
    routing: PushRouting,
    /// The call's `:path`.
    path: PathAndQuery,
    names: NameTable,
    family: AddressFamily,
    /// Every channel ever opened, kept open like 3.5.1 push does.
    leaked: Vec<Channel>,
    /// With `--reuse-connections`: the one channel of each member.
    reused: Option<BTreeMap<String, Channel>>,
    /// The client program making the calls, when it is not tonic.
    external: Option<ExternalPush>,
}

/// Serves the push pod: runs the lab's commands from stdin and reports each outcome on stdout.
///
/// # Errors
///
/// Fails when its arguments (member template, path, name table, client program) are unusable or
/// stdin cannot be read; a failed command is reported, not returned.
pub async fn run(args: PushArgs) -> anyhow::Result<()> {
    let members = MemberTemplate::parse(PUSH_MEMBER_TEMPLATE)?.members(
        &args.gateways.instance,
        &args.gateways.namespace,
        args.gateways.replicas,
    );
    let external = args
        .client_program
        .map(|program| {
            ExternalPush::start(&ClientProgram {
                program,
                args: args.client_args,
            })
        })
        .transpose()?;
    let mut pusher = Pusher {
        ring: Ring::new(members),
        routing: args.openim.routing(args.discovery),
        path: args.openim.push_path().parse()?,
        names: NameTable::parse_arg(&args.gateways.names)?,
        family: args.family,
        leaked: Vec::new(),
        reused: args.reuse_connections.then(BTreeMap::new),
        external,
    };
    emit(&PodEvent::Ready);
    let mut commands = BufReader::new(tokio::io::stdin()).lines();
    // The lab closing stdin means it is done with this pod.
    while let Some(line) = commands.next_line().await.context("read command")? {
        let event = match serde_json::from_str::<PushCommand>(&line) {
            Ok(PushCommand::Push {
                client_msg_id,
                seq,
                send_id,
                recipients,
            }) => {
                let msg = message(client_msg_id, seq, send_id);
                match pusher.push(msg, &recipients).await {
                    Ok(outcome) => PodEvent::PushDone(outcome),
                    Err(error) => PodEvent::CommandFailed {
                        error: format!("{error:#}"),
                    },
                }
            }
            Ok(PushCommand::Flood {
                duration_ms,
                recipients,
            }) => match pusher
                .flood(Duration::from_millis(duration_ms), &recipients)
                .await
            {
                Ok(report) => PodEvent::FloodDone(report),
                Err(error) => PodEvent::CommandFailed {
                    error: format!("{error:#}"),
                },
            },
            Err(error) => PodEvent::CommandFailed {
                error: format!("bad command: {error}"),
            },
        };
        emit(&event);
    }
    Ok(())
}

fn message(client_msg_id: String, seq: i64, send_id: String) -> MsgData {
    let content = serde_json::json!({ "content": format!("lab message {seq}") }).to_string();
    MsgData {
        send_id,
        group_id: "lab-group".to_owned(),
        client_msg_id,
        sender_platform_id: 5,
        session_type: SUPER_GROUP_SESSION,
        content_type: TEXT_CONTENT,
        content: content.into_bytes(),
        seq,
        send_time: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| {
                i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
            }),
        ..Default::default()
    }
}

fn request(msg: &MsgData, users: &[String]) -> OnlineBatchPushOneMsgReq {
    OnlineBatchPushOneMsgReq {
        msg_data: Some(msg.clone()),
        push_to_user_ids: users.to_vec(),
    }
}

/// Returns the gateway's answer per recipient, in the order it answered.
fn user_results(response: OnlineBatchPushOneMsgResp) -> Vec<UserPushResult> {
    response
        .single_push_result
        .into_iter()
        .map(|result| UserPushResult {
            user_id: result.user_id,
            online_push: result.online_push,
            platform_results: result.resp.len(),
        })
        .collect()
}

/// Opens a new connection to `member`: `:authority` is the member string, while the TCP connection
/// goes to the pod address from the lab's name table (the cluster DNS stand-in).
async fn connect(
    member: &str,
    address: SocketAddr,
    family: AddressFamily,
) -> anyhow::Result<Channel> {
    let endpoint = Endpoint::from_shared(format!("http://{member}"))?
        .connect_timeout(CALL_TIMEOUT)
        .timeout(CALL_TIMEOUT);
    // Without TCP_NODELAY the HTTP/2 handshake stalls on delayed ACKs (~40 ms per call); Go's
    // gRPC sets it too.
    let connector = tower::service_fn(move |_: http::Uri| async move {
        let stream = connect_tcp(address, family).await?;
        stream.set_nodelay(true)?;
        std::io::Result::Ok(TokioIo::new(stream))
    });
    endpoint
        .connect_with_connector(connector)
        .await
        .with_context(|| format!("connect {member} at {address}"))
}

/// Makes push's group call on `channel` under the release's `path`, as the generated client
/// would under its own.
async fn unary_call(
    channel: Channel,
    path: PathAndQuery,
    request: OnlineBatchPushOneMsgReq,
) -> anyhow::Result<OnlineBatchPushOneMsgResp> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|error| anyhow::anyhow!("gateway channel not ready: {error}"))?;
    let codec =
        tonic_prost::ProstCodec::<OnlineBatchPushOneMsgReq, OnlineBatchPushOneMsgResp>::default();
    let response = grpc
        .unary(tonic::Request::new(request), path, codec)
        .await?;
    Ok(response.into_inner())
}

impl Pusher {
    /// Returns each call's destination: per ring member with its recipients (in member order), or
    /// every gateway by address with every recipient.
    fn targets(&self, recipients: &[String]) -> anyhow::Result<Vec<Target>> {
        let mut targets = Vec::new();
        match self.routing {
            PushRouting::Ring => {
                let mut groups: BTreeMap<usize, Vec<String>> = BTreeMap::new();
                for user in recipients {
                    groups
                        .entry(self.ring.get_index(user)?)
                        .or_default()
                        .push(user.clone());
                }
                for (index, users) in groups {
                    let member = self.ring.members()[index].clone();
                    let address = self.names.resolve(&member, GRPC_PORT)?;
                    targets.push(Target {
                        member,
                        address,
                        users,
                    });
                }
            }
            PushRouting::Broadcast => {
                for member in self.ring.members() {
                    let address = self.names.resolve(member, GRPC_PORT)?;
                    targets.push(Target {
                        member: address.to_string(),
                        address,
                        users: recipients.to_vec(),
                    });
                }
            }
        }
        Ok(targets)
    }

    async fn push(&mut self, msg: MsgData, recipients: &[String]) -> anyhow::Result<PushOutcome> {
        let targets = self.targets(recipients)?;
        let answers = match (self.routing, self.external.is_some()) {
            (PushRouting::Broadcast, false) => self.call_concurrently(&msg, &targets).await,
            _ => {
                let mut answers = Vec::new();
                for target in &targets {
                    answers.push(self.call(target, &msg).await);
                }
                answers
            }
        };
        let calls = targets
            .into_iter()
            .zip(answers)
            .map(|(target, answer)| {
                let (results, error) = match answer {
                    Ok(results) => (results, None),
                    Err(error) => (Vec::new(), Some(format!("{error:#}"))),
                };
                PushCall {
                    member: target.member,
                    gateway_addr: target.address.to_string(),
                    recipients: target.users,
                    results,
                    error,
                }
            })
            .collect();
        Ok(PushOutcome {
            client_msg_id: msg.client_msg_id,
            calls,
        })
    }

    /// Returns the channel a call to `member` goes on: the member's kept one, or a new one (kept
    /// open).
    async fn channel(&mut self, member: &str, address: SocketAddr) -> anyhow::Result<Channel> {
        if let Some(reused) = self.reused.as_mut() {
            if let Some(channel) = reused.get(member) {
                return Ok(channel.clone());
            }
            let channel = connect(member, address, self.family).await?;
            reused.insert(member.to_owned(), channel.clone());
            return Ok(channel);
        }
        let channel = connect(member, address, self.family).await?;
        self.leaked.push(channel.clone());
        Ok(channel)
    }

    /// Calls every target at once, as upstream's errgroup does for a broadcast.
    async fn call_concurrently(
        &mut self,
        msg: &MsgData,
        targets: &[Target],
    ) -> Vec<anyhow::Result<Vec<UserPushResult>>> {
        let mut calls = Vec::new();
        for target in targets {
            let channel = self.channel(&target.member, target.address).await;
            let request = request(msg, &target.users);
            let path = self.path.clone();
            calls.push(async move { unary_call(channel?, path, request).await });
        }
        futures_util::future::join_all(calls)
            .await
            .into_iter()
            .map(|response| response.map(user_results))
            .collect()
    }

    async fn call(
        &mut self,
        target: &Target,
        msg: &MsgData,
    ) -> anyhow::Result<Vec<UserPushResult>> {
        let request = request(msg, &target.users);
        let response = if let Some(external) = &mut self.external {
            let response = external
                .call(
                    &target.address.to_string(),
                    &target.member,
                    self.path.as_str(),
                    &request.encode_to_vec(),
                    CALL_TIMEOUT,
                )
                .await?;
            OnlineBatchPushOneMsgResp::decode(response.as_slice())?
        } else {
            let channel = self.channel(&target.member, target.address).await?;
            unary_call(channel, self.path.clone(), request).await?
        };
        Ok(user_results(response))
    }

    /// Pushes round-robin over the member groups at full speed. Each call opens a new
    /// connection, as in 3.5.1, but drops it afterwards so a long benchmark stays within the
    /// file-descriptor limit.
    async fn flood(
        &self,
        duration: Duration,
        recipients: &[String],
    ) -> anyhow::Result<FloodReport> {
        let groups = self.targets(recipients)?;
        anyhow::ensure!(!groups.is_empty(), "flood needs recipients");
        let mut latencies = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
        let mut report = FloodReport::default();
        let started = Instant::now();
        let mut seq = 0i64;
        while started.elapsed() < duration {
            let target = &groups[usize::try_from(seq)? % groups.len()];
            seq += 1;
            let msg = message(format!("flood-{seq}"), seq, "lab-sender".to_owned());
            let call_started = Instant::now();
            let called = async {
                let channel = connect(&target.member, target.address, self.family).await?;
                unary_call(channel, self.path.clone(), request(&msg, &target.users)).await?;
                anyhow::Ok(())
            };
            match called.await {
                Ok(()) => {
                    let micros = u64::try_from(call_started.elapsed().as_micros())?;
                    latencies.saturating_record(micros.max(1));
                    report.calls += 1;
                }
                Err(_) => report.errors += 1,
            }
        }
        report.seconds = started.elapsed().as_secs_f64();
        report.pushes_per_second = report.calls as f64 / report.seconds.max(f64::EPSILON);
        report.p50_us = latencies.value_at_quantile(0.50);
        report.p99_us = latencies.value_at_quantile(0.99);
        report.max_us = latencies.max();
        Ok(report)
    }
}
