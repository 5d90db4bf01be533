//! Runs `openim-lab`: a stand-in OpenIM msggateway cluster (3.5.1 by default, `--openim` for later
//! releases) in network namespaces.
//!
//! `openim-lab run --mode v3.5.1 --replicas 5 --users 50 [--scale-from 1] [--truth-file F]`
//! `openim-lab demo --openim 3.7` (any of 3.5, 3.6, 3.7, 3.8, main; `--discovery etcd` too)
//! `openim-lab push-loop --duration 10 [--replicas 5] [--users 20]`
//! `openim-lab bench --observer target/release/observer [--rounds 3] [--seconds 8]`
//! `openim-lab soak --minutes 60 [--interval-secs 60]` (what `cargo xtask soak` runs)
//! The `gateway`, `proxy` and `push` subcommands are the pod roles the lab starts itself.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tests::lab::gateway::GatewayArgs;
use tests::lab::proxy::ProxyArgs;
use tests::lab::push::PushArgs;
use tests::lab::release::{Discovery, OpenImRelease};
use tests::lab::stack::{AddressFamily, ClientStack};
use tests::{Lab, LabConfig, ProxyMode};

#[derive(Parser, Debug)]
#[command(
    name = "openim-lab",
    about = "A stand-in OpenIM msggateway cluster (3.5 to main) in network namespaces"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the scenario and print the ground truth (JSON lines) on stdout.
    Run(RunArgs),
    /// Run the scale-out scenario with the real observer watching, and show what it caught
    /// against the lab's ground truth (what `cargo xtask demo` runs; needs root).
    Demo(DemoArgs),
    /// Push at full speed and print pushes/s and call latency percentiles.
    PushLoop(PushLoopArgs),
    /// Measure what watching costs: push throughput and latency, and nanoseconds per write(2),
    /// with no observer, the real observer, and a bpftrace peer (what `cargo xtask bench` runs).
    Bench(BenchArgs),
    /// Run the lab at a steady mixed load in cluster mode (three nodes, three observers, one
    /// redis-server restarted halfway), print per interval what each observer and Redis hold,
    /// and end with a verdict: exit 0 on a pass, 1 naming the failing criterion (what
    /// `cargo xtask soak` runs; needs root).
    Soak(SoakArgs),
    #[command(hide = true)]
    Gateway(GatewayArgs),
    /// Place users for the memory bench: print how many once placed, hold them until
    /// standard input closes.
    #[command(hide = true)]
    PlaceUsers(PlaceUsersArgs),
    #[command(hide = true)]
    Proxy(ProxyArgs),
    #[command(hide = true)]
    Push(PushArgs),
}

#[derive(clap::Args, Debug)]
struct ClusterArgs {
    #[arg(long, value_enum, default_value = "v3.5.1")]
    mode: ProxyMode,
    /// Gateway replicas (after the scale-out, if any).
    #[arg(long, default_value_t = 5)]
    replicas: usize,
    #[arg(long, default_value = "demo")]
    instance: String,
    #[arg(long, default_value = "chat")]
    namespace: String,
    /// The OpenIM release the gateways and push speak: its gRPC service name, push's
    /// connection reuse (3.6 on), the gateway's answer order (3.8 on) and routing (main
    /// broadcasts).
    #[arg(long, value_enum, default_value = "3.5")]
    openim: OpenImRelease,
    /// Where push learns the gateways from: kubernetes hashes recipients over the `…:88` ring
    /// (before main), etcd sends every recipient to every gateway.
    #[arg(long, value_enum, default_value = "kubernetes")]
    discovery: Discovery,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    #[arg(long, default_value_t = 50)]
    users: usize,
    /// Start with this many replicas, connect the users, then scale out to --replicas.
    #[arg(long)]
    scale_from: Option<usize>,
    /// Users that connect after the scale-out.
    #[arg(long, default_value_t = 0)]
    late_users: usize,
    #[arg(long, default_value_t = 1)]
    messages: usize,
    /// Real-time window for a message, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    timeout_ms: u64,
    /// Also write the ground truth (JSON lines) here.
    #[arg(long)]
    truth_file: Option<PathBuf>,
    /// The libraries of push's gRPC client and the users' WebSocket clients.
    #[arg(long, value_enum, default_value = "rust")]
    client_stack: ClientStack,
    /// The sockets those clients connect from.
    #[arg(long, value_enum, default_value = "ipv4")]
    family: AddressFamily,
}

#[derive(clap::Args, Debug)]
struct DemoArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Users in all: half connect before the scale-out, half after.
    #[arg(long, default_value_t = 50)]
    users: usize,
    /// Gateways before the scale-out (equal to --replicas for none).
    #[arg(long, default_value_t = 1)]
    scale_from: usize,
    /// Group messages pushed to everyone after the scale-out.
    #[arg(long, default_value_t = 5)]
    messages: usize,
    /// Simulated nodes: proxy on the first, push on the second, gateways spread over all; one
    /// observer per node, each seeing only its node's pods, sharing state through a lab Redis.
    #[arg(
        long,
        default_value_t = 1,
        value_parser = clap::value_parser!(u16).range(1..=tests::lab::MAX_NODES as i64),
    )]
    nodes: u16,
    /// The observer binary [default: `observer` beside this one, or $OBSERVER_BIN].
    #[arg(long)]
    observer: Option<PathBuf>,
    /// Where alerts, the observer's capture and the ground truth are written.
    #[arg(long, default_value = "target/demo")]
    out: PathBuf,
}

#[derive(clap::Args, Debug)]
struct PlaceUsersArgs {
    #[arg(long)]
    port: u16,
    /// The first user's number.
    #[arg(long)]
    first: usize,
    #[arg(long)]
    count: usize,
}

#[derive(clap::Args, Debug)]
struct PushLoopArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Seconds to push for.
    #[arg(long, default_value_t = 10)]
    duration: u64,
    #[arg(long, default_value_t = 20)]
    users: usize,
}

#[derive(clap::Args, Debug)]
struct BenchArgs {
    /// The observer under test, a release build [default: `observer` beside this one, or
    /// $OBSERVER_BIN].
    #[arg(long)]
    observer: Option<PathBuf>,
    /// Rounds; each runs every configuration once, in a rotated order.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Seconds of push flood per configuration and round.
    #[arg(long, default_value_t = 8)]
    seconds: u64,
    /// Gateway replicas.
    #[arg(long, default_value_t = 5)]
    replicas: usize,
    /// Connected users the pushes go to.
    #[arg(long, default_value_t = 20)]
    users: usize,
    /// 64-byte TCP writes per timed loop in the syscall benchmark (other calls: 5×).
    #[arg(long, default_value_t = 200_000)]
    writes: usize,
    /// Pairs of 1.5 s phases of one push flood, the observer (packet hook) watching in one and
    /// not in the other: watching's cost to about ±2.5% with 40 pairs, where separate rounds
    /// spread by ±10%; then as many with a thread burning the CPU watching added in one phase,
    /// the yardstick. 0 skips them.
    #[arg(long, default_value_t = 40)]
    watching_pairs: usize,
    /// Only the memory section (peak RSS under the garbage flood and with 100k users).
    #[arg(long)]
    memory_only: bool,
    /// Only the alert latency section (from traffic to alert line at low load).
    #[arg(long)]
    latency_only: bool,
    /// Only watching's cost within one flood (`--watching-pairs` of them, default 40, and as
    /// many with a thread burning the same CPU instead): the push flood's tightest figure, in
    /// about 4 minutes.
    #[arg(long, conflicts_with_all = ["memory_only", "latency_only"])]
    watching_only: bool,
}

#[derive(clap::Args, Debug)]
struct SoakArgs {
    /// Minutes of load (the setup and the drain after it come on top).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    minutes: u64,
    /// Seconds between two rows of the table.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    interval_secs: u64,
    /// Users connected throughout (a multiple of twice --batch).
    #[arg(long, default_value_t = 480)]
    users: usize,
    /// Users reconnected, and recipients of one group message, every second.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Minutes between scale-outs (the first at a tenth of the run).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    scale_every_mins: u64,
    /// The observer binary [default: `observer` beside this one, or $OBSERVER_BIN].
    #[arg(long)]
    observer: Option<PathBuf>,
    /// Where the observers' stderr is written.
    #[arg(long, default_value = "target/soak")]
    out: PathBuf,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) if err.use_stderr() => {
            eprintln!("openim-lab: {}", observer::daemon::usage_error_line(&err));
            return ExitCode::from(2);
        }
        Err(err) => {
            // --help.
            let _ = err.print();
            return ExitCode::SUCCESS;
        }
    };
    let outcome = match cli.command {
        Command::Gateway(args) => run_role("msggateway", tests::lab::gateway::run(args)),
        Command::Proxy(args) => run_role("msggw-proxy", tests::lab::proxy::run(args)),
        Command::Push(args) => run_role("openim-push", tests::lab::push::run(args)),
        Command::Run(args) => run_lab(scenario(args)),
        Command::Demo(args) => run_lab(demo(args)),
        Command::PushLoop(args) => run_lab(push_loop(args)),
        Command::Bench(args) => run_lab(bench(args)),
        Command::Soak(args) => run_lab(soak(args)),
        Command::PlaceUsers(args) => run_lab(place_users(args)),
    };
    match outcome {
        Ok(code) => code,
        Err(error) => {
            eprintln!("openim-lab: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs a pod role under its OpenIM process name, so per-process observers see `msggateway`,
/// `msggw-proxy` and `openim-push` (every thread carries the name, as comm is per thread).
fn run_role(
    name: &'static str,
    role: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<ExitCode> {
    let comm = std::ffi::CString::new(name)?;
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes, which `comm` is.
    unsafe { libc::prctl(libc::PR_SET_NAME, comm.as_ptr()) };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(name)
        .enable_all()
        .build()
        .context("tokio runtime")?;
    runtime.block_on(role)?;
    Ok(ExitCode::SUCCESS)
}

/// Runs lab work until it ends or Ctrl-C/SIGTERM arrives; either way the lab's guards remove
/// every namespace, link and process it created before this returns.
fn run_lab(work: impl Future<Output = anyhow::Result<()>>) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    runtime.block_on(async {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            done = work => done.map(|()| ExitCode::SUCCESS),
            _ = tokio::signal::ctrl_c() => {
                eprintln!("openim-lab: interrupted, cleaned up");
                Ok(ExitCode::from(130))
            }
            _ = terminate.recv() => {
                eprintln!("openim-lab: terminated, cleaned up");
                Ok(ExitCode::from(143))
            }
        }
    })
}

fn config(cluster: &ClusterArgs, users: usize) -> LabConfig {
    LabConfig {
        mode: cluster.mode,
        instance: cluster.instance.clone(),
        namespace: cluster.namespace.clone(),
        replicas_initial: cluster.replicas,
        replicas_final: cluster.replicas,
        users,
        openim: cluster.openim,
        discovery: cluster.discovery,
        progress: true,
        ..LabConfig::default()
    }
}

async fn scenario(args: RunArgs) -> anyhow::Result<()> {
    let config = LabConfig {
        replicas_initial: args.scale_from.unwrap_or(args.cluster.replicas),
        late_users: args.late_users,
        messages_per_user: args.messages,
        realtime_timeout: Duration::from_millis(args.timeout_ms),
        client_stack: args.client_stack,
        family: args.family,
        ..config(&args.cluster, args.users)
    };
    let mut lab = Lab::start(config).await?;
    let truth = lab.run_scenario().await?;
    drop(lab);
    if let Some(path) = &args.truth_file {
        truth
            .write_file(path)
            .with_context(|| format!("write {}", path.display()))?;
    }
    truth.write_json_lines(std::io::stdout().lock())?;
    Ok(())
}

async fn demo(args: DemoArgs) -> anyhow::Result<()> {
    let observer = match args.observer {
        Some(path) => path,
        None => tests::observed::find_observer_binary()?,
    };
    let scale_from = args.scale_from.clamp(1, args.cluster.replicas.max(1));
    let scaling = scale_from < args.cluster.replicas;
    let early_users = if scaling { args.users / 2 } else { args.users };
    let lab = LabConfig {
        replicas_initial: scale_from,
        late_users: args.users - early_users,
        messages_per_user: args.messages,
        messages_before_scale: usize::from(scaling),
        nodes: usize::from(args.nodes),
        ..config(&args.cluster, early_users)
    };
    let text = tests::demo::run(tests::demo::DemoConfig {
        lab,
        observer,
        out_dir: args.out,
    })
    .await?;
    println!("{text}");
    Ok(())
}

async fn push_loop(args: PushLoopArgs) -> anyhow::Result<()> {
    let mut lab = Lab::start(config(&args.cluster, args.users)).await?;
    lab.connect_users(0..args.users, false).await;
    eprintln!("openim-lab: pushing for {} s", args.duration);
    let report = lab.push_flood(Duration::from_secs(args.duration)).await?;
    drop(lab);
    println!(
        "pushes: {} in {:.1} s, {:.0} pushes/s, p50 {} us, p99 {} us, max {} us, errors {}",
        report.calls,
        report.seconds,
        report.pushes_per_second,
        report.p50_us,
        report.p99_us,
        report.max_us,
        report.errors
    );
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

async fn place_users(args: PlaceUsersArgs) -> anyhow::Result<()> {
    use tokio::io::AsyncReadExt;
    let users =
        tests::memory_load::place_users(args.port, args.first..args.first + args.count).await?;
    println!("{}", users.placed);
    // Held until the bench closes our standard input.
    let mut rest = Vec::new();
    tokio::io::stdin().read_to_end(&mut rest).await?;
    drop(users);
    Ok(())
}

async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let observer = match args.observer {
        Some(path) => path,
        None => tests::observed::find_observer_binary()?,
    };
    let text = tests::bench::run(tests::bench::BenchConfig {
        observer,
        rounds: args.rounds,
        seconds: args.seconds,
        replicas: args.replicas,
        users: args.users,
        writes: args.writes,
        watching_pairs: args.watching_pairs,
        memory_only: args.memory_only,
        latency_only: args.latency_only,
        watching_only: args.watching_only,
    })
    .await?;
    println!("{text}");
    Ok(())
}

async fn soak(args: SoakArgs) -> anyhow::Result<()> {
    let observer = match args.observer {
        Some(path) => path,
        None => tests::observed::find_observer_binary()?,
    };
    let failure = tests::soak::run(tests::soak::SoakConfig {
        observer,
        load: Duration::from_secs(args.minutes * 60),
        interval: Duration::from_secs(args.interval_secs),
        users: args.users,
        batch: args.batch,
        scale_every: Duration::from_secs(args.scale_every_mins * 60),
        out_dir: args.out,
    })
    .await?;
    match failure {
        None => Ok(()),
        Some(criterion) => anyhow::bail!("soak verdict: {criterion}"),
    }
}
