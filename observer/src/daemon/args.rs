//! Declares the flags of `observer run` and `observer replay`, and what they make of them: the
//! capture's options and the engine's configuration.

use std::path::PathBuf;

use clap::{ArgAction, Args, Command, ValueEnum};

use crate::{
    budget::MemoryBudget,
    capture::{
        kernel::{CaptureOptions, CopyWalk, HookChoice},
        sock_layout::StateTracepointChoice,
    },
    cluster::ClusterArgs,
    correlate::{EngineConfig, RouteLimits},
    tools::in_range,
};

/// Writes a command-line usage error in one line, like every other error a user can cause: clap's
/// message up to its blank line (the usage and tips follow), its lines joined, without its
/// `error: `. For `observer` and the lab's `openim-lab` alike.
pub fn usage_error_line(error: &clap::Error) -> String {
    let detail = error.to_string();
    let message: Vec<&str> = detail
        .lines()
        .map(str::trim)
        .take_while(|line| !line.is_empty())
        .collect();
    message.join(" ").trim_start_matches("error: ").to_owned()
}

/// Names what every flag's environment variable starts with: `--grpc-port` is also
/// `OPENIM_OBSERVER_GRPC_PORT`.
pub const ENV_PREFIX: &str = "OPENIM_OBSERVER_";

/// Lists the flags read from an environment variable of their own, named in their help, rather than
/// from `ENV_PREFIX`'s: the Redis URLs' (`cluster::REDIS_URL_ENV` and its siblings, read when
/// neither flag gives one, so it cannot conflict with `--redis-url-file` and the like).
const OWN_ENVIRONMENT: &[&str] = &["redis-url", "redis-cluster", "redis-sentinel"];

/// Returns the environment variable that gives the flag `--long`.
pub fn env_name(long: &str) -> String {
    format!(
        "{ENV_PREFIX}{}",
        long.replace('-', "_").to_ascii_uppercase()
    )
}

impl RunArgs {
    /// Returns `command` (`run`, `replay`, any subcommand) with each of its long flags also read
    /// from the environment variable `env_name` gives, which `--help` shows. A flag given on
    /// the command line wins; a repeated flag takes several values from one variable,
    /// comma-separated. Flags that already name a variable (`--node-name`: `NODE_NAME`) keep
    /// theirs.
    pub fn with_env(command: Command) -> Command {
        with_env(command)
    }
}

fn with_env(command: Command) -> Command {
    command.mut_args(|arg| {
        let Some(long) = arg.get_long() else {
            return arg;
        };
        if arg.get_env().is_some() || OWN_ENVIRONMENT.contains(&long) {
            return arg;
        }
        let repeated = matches!(arg.get_action(), ArgAction::Append);
        // Built once per flag at start; clap keeps the names for the process's life.
        let name: &'static str = Box::leak(env_name(long).into_boxed_str());
        let arg = arg.env(name);
        if repeated {
            arg.value_delimiter(',')
        } else {
            arg
        }
    })
}

/// Names how alerts are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// One JSON object per line (docs/schema/ holds the schema).
    Json,
    /// One line a person reads: kind, user, gateways, cause, the diagnosis shortened.
    Text,
}

/// How alerts are printed, for `run` and `replay` alike.
#[derive(Args, Debug, Clone, Default)]
pub struct OutputArgs {
    /// How alerts are printed on stdout: `json` (one object per line) or `text` (one line a
    /// person reads). Default: `text` when stdout is a terminal, else `json`.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub output: Option<OutputFormat>,
}

impl OutputArgs {
    /// Returns the format asked for, else `text` on a terminal and `json` otherwise.
    pub fn format(&self) -> OutputFormat {
        self.output.unwrap_or_else(|| {
            if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
                OutputFormat::Text
            } else {
                OutputFormat::Json
            }
        })
    }
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Remote port of the gateways' gRPC server (push → gateway). Repeat for several.
    /// Default: 88.
    #[arg(
        long = "grpc-port",
        value_name = "PORT",
        value_parser = clap::value_parser!(u16).range(1..),
    )]
    pub grpc_ports: Vec<u16>,
    /// Remote port of the gateways' WebSocket server (proxy → gateway). Repeat for several.
    /// Default: 80.
    #[arg(
        long = "ws-port",
        value_name = "PORT",
        value_parser = clap::value_parser!(u16).range(1..),
    )]
    pub websocket_ports: Vec<u16>,
    /// Bytes captured per direction of each gRPC connection in a burst; the budget refills
    /// at --grpc-budget-refill, and what it cuts is counted (`bytes_over_budget`), not copied.
    #[arg(long, value_name = "BYTES", default_value_t = observer_records::DEFAULT_GRPC_BUDGET)]
    pub grpc_budget: u32,
    /// Bytes per second each direction's --grpc-budget regains, so long-lived connections stay
    /// watched while bulk transfers are copied at this rate at most; 0: never (the budget then
    /// counts from a connection's first byte).
    #[arg(
        long,
        value_name = "BYTES_PER_SEC",
        default_value_t = observer_records::DEFAULT_GRPC_BUDGET_REFILL,
        value_parser = clap::value_parser!(u32).range(0..=i64::from(observer_records::MAX_GRPC_BUDGET_REFILL)),
    )]
    pub grpc_budget_refill: u32,
    /// Where the kernel copies watched connections' bytes. `packets`: `cgroup_skb` programs at
    /// --cgroup-root on the packets of watched connections only, so no syscall pays; needs the
    /// node's cgroup v2 hierarchy and CAP_NET_ADMIN. `syscalls`: tracepoints on every read and
    /// write, which every process on the node pays for (about ×1.15 for any syscall, ×2 for a
    /// write; docs/benchmarks.md). `auto`: `packets` where this process can, else `syscalls`;
    /// `observer_started` says which and why (`capture_hook`, `capture_hook_reason`).
    #[arg(long, value_enum, value_name = "HOOK", default_value_t = HookChoice::Auto)]
    pub capture_hook: HookChoice,
    /// How the kernel follows a call's iovec entries: `bpf_loop` where the kernel has it
    /// (5.17+), else tail calls. For tests of either on any kernel.
    #[arg(long, value_enum, default_value_t = CopyWalk::Auto, hide = true)]
    pub copy_walk: CopyWalk,
    /// Which tracepoint tells the kernel programs about TCP state changes: the raw one where
    /// the kernel's BTF describes `struct sock` (no perf event, so no CAP_SYS_ADMIN whatever
    /// kernel.perf_event_paranoid says), else the formatted one. For tests of either on any
    /// kernel.
    #[arg(long, value_enum, default_value_t = StateTracepointChoice::Auto, hide = true)]
    pub state_tracepoint: StateTracepointChoice,
    /// Size of the kernel→userspace ring buffer (power of two, at least a page). Records that
    /// do not fit are counted as dropped.
    #[arg(long, value_name = "BYTES", default_value_t = 8 << 20)]
    pub ring_bytes: u32,
    /// Watched connections (and their descriptors, and the connects, reads and writes in
    /// progress on them) the kernel's tables hold at once: at least the WebSockets of the
    /// busiest proxy node (one per online user there) plus push's connections. Each costs about
    /// 540 bytes of kernel memory (about 580 with the packet hook), charged to the pod. A full
    /// table
    /// leaves new connections (or calls) unwatched and says so (`capture_degraded`,
    /// `table_full`).
    #[arg(
        long,
        value_name = "COUNT",
        default_value_t = observer_records::DEFAULT_MAX_WATCHED_CONNECTIONS,
        value_parser = clap::value_parser!(u32).range(64..=(1 << 22)),
    )]
    pub max_watched_connections: u32,
    /// Print every captured record as one JSON object per line (credentials scrubbed).
    #[arg(long)]
    pub events: bool,
    /// Also write every captured record to FILE, for `observer replay FILE` later. Created
    /// mode 0600 once the observer is attached; never through a symbolic link, never over an
    /// existing file unless --overwrite.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// Let --record replace an existing file.
    #[arg(long, requires = "record")]
    pub overwrite: bool,
    /// Stop after this many seconds (default: run until SIGINT/SIGTERM).
    #[arg(long, value_name = "SECS")]
    pub duration: Option<u64>,
    /// Serve Prometheus metrics on this address (`GET /metrics`; `/healthz` for probes).
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<String>,
    /// Name the pods behind gateway IPs and processes in alerts (`"pod":{"namespace","name"}`),
    /// from a watch on the Kubernetes API: the in-cluster service account, else the kubeconfig.
    #[arg(long)]
    pub kube: bool,
    /// Watch only processes inside this cgroup v2 directory (or below it), e.g. the node's
    /// `kubepods`; enforced in the kernel. Repeat for several (at most 16). Default: every
    /// process.
    #[arg(long = "cgroup-scope", value_name = "DIR")]
    pub cgroup_scope: Vec<PathBuf>,
    /// The node's cgroup v2 hierarchy (its root): with --kube, where a process's cgroup leads
    /// to its pod; with the packet hook (--capture-hook), where its programs attach (a hybrid
    /// host mounts it at /sys/fs/cgroup/unified, which is looked for by itself; where neither
    /// is cgroup v2, as on a cgroup v1 node, the packet hook mounts the hierarchy privately if
    /// CAP_SYS_ADMIN allows).
    #[arg(long, value_name = "DIR", default_value = "/sys/fs/cgroup")]
    pub cgroup_root: PathBuf,
    /// With --kube, pods remembered at most (the Kubernetes limit for one cluster is 150000);
    /// pods beyond it stay unnamed.
    #[arg(long, value_name = "N", default_value_t = 150_000)]
    pub kube_max_pods: usize,
    /// With --kube, watch the pods of this namespace only (repeat for several; default: every
    /// namespace). The namespaces OpenIM runs in are enough, and need only a namespaced Role.
    #[arg(long = "kube-namespace", value_name = "NS", requires = "kube")]
    pub kube_namespaces: Vec<String>,
    /// With --kube, the pod labels alerts carry beside a pod's name (`"labels":{…}`), e.g.
    /// `app,app.kubernetes.io/name`; comma-separated or repeated. Default: none.
    #[arg(long = "pod-labels", value_name = "KEY", value_delimiter = ',')]
    pub pod_labels: Vec<String>,
    /// `capture_degraded`: how much a loss (dropped records, lost or undecodable connections,
    /// evictions, bytes past the capture budget) must grow within one second to be raised.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        value_parser = clap::value_parser!(u64).range(1..),
    )]
    pub degraded_min_events: u64,
    /// `capture_degraded`: seconds without further loss before it is `recovered`.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..=86_400),
    )]
    pub degraded_quiet_secs: u64,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(Args, Debug, Clone)]
pub struct ReplayArgs {
    /// A file written by `observer run --record`.
    pub file: PathBuf,
    /// Print the recorded events themselves, one JSON object per line, besides the alerts.
    #[arg(long)]
    pub events: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Bounds and windows of the correlation engine, and how its alerts are printed.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    #[command(flatten)]
    pub output: OutputArgs,
    /// Bytes every table and buffer together may hold (estimated: decoder buffers, connections,
    /// users, pending calls, fold windows). Past it the least useful state is shed and counted.
    /// The default fits the shipped 256 MiB pod limit; docs/install.md gives the sizing rule.
    #[arg(
        long,
        value_name = "BYTES",
        default_value_t = crate::budget::DEFAULT_MEMORY_BUDGET,
        value_parser = in_range(1 << 20, 1 << 40),
    )]
    pub memory_budget: usize,
    /// Users with a live WebSocket placement tracked at once (also bounded by
    /// --memory-budget); a full table evicts the users placed longest ago, counted.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1_000_000,
        value_parser = in_range(1, 100_000_000),
    )]
    pub max_users: usize,
    /// Connections decoded at once (also bounded by --memory-budget); a full table evicts the
    /// connections idle longest, counted.
    #[arg(long, value_name = "N", default_value_t = 65_536, value_parser = in_range(1, 1 << 24))]
    pub max_connections: usize,
    /// Bytes one connection's decoder buffers per direction at most.
    #[arg(
        long,
        value_name = "BYTES",
        default_value_t = 1 << 20,
        value_parser = in_range(1 << 10, 1 << 30),
    )]
    pub max_buffered_bytes: usize,
    /// Repeats of one alert (same user and gateways) within this window fold into a count.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 60,
        value_parser = clap::value_parser!(u64).range(1..=86_400),
    )]
    pub fold_window: u64,
    /// Learned ring membership must hold this long before a divergence is reported.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 3,
        value_parser = clap::value_parser!(u64).range(0..=86_400),
    )]
    pub ring_settle: u64,
    /// New gRPC connections by one pusher within 10 s that count as churn.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 20,
        value_parser = clap::value_parser!(u64).range(1..=1_000_000),
    )]
    pub churn_min_connections: u64,
}

impl EngineArgs {
    /// Builds the engine's configuration; `node`: this node's name in cluster mode.
    pub(super) fn config(&self, node: Option<String>) -> EngineConfig {
        let defaults = EngineConfig::default();
        let memory = MemoryBudget::new(self.memory_budget);
        let max_connections = self.max_connections.min(memory.max_connections());
        EngineConfig {
            routes: RouteLimits {
                max_users: self.max_users.min(memory.max_users()),
                max_tracked_connections: max_connections.saturating_mul(4),
                max_pending_calls: defaults
                    .routes
                    .max_pending_calls
                    .min(memory.max_pending_calls()),
                max_fold_keys: defaults.routes.max_fold_keys.min(memory.max_fold_windows()),
                fold_window_secs: self.fold_window,
                ring_settle_secs: self.ring_settle,
                churn_min_new_connections: self.churn_min_connections,
                ..defaults.routes
            },
            decode: crate::decode::Limits {
                max_buffered_bytes: self.max_buffered_bytes,
                ..defaults.decode
            },
            max_connections,
            memory,
            node,
        }
    }
}

impl RunArgs {
    /// Returns the pod index `--kube` fills: at most --kube-max-pods pods, with the labels
    /// --pod-labels names.
    pub fn pod_index(&self) -> crate::identity::SharedPods {
        crate::identity::PodIndex::shared_with_labels(self.kube_max_pods, self.pod_labels.clone())
    }

    pub(super) fn capture_options(&self) -> CaptureOptions {
        let or_default = |ports: &[u16], default: u16| {
            if ports.is_empty() {
                vec![default]
            } else {
                ports.to_vec()
            }
        };
        CaptureOptions {
            grpc_ports: or_default(&self.grpc_ports, 88),
            websocket_ports: or_default(&self.websocket_ports, 80),
            grpc_budget: self.grpc_budget,
            grpc_budget_refill: self.grpc_budget_refill,
            ring_bytes: self.ring_bytes,
            max_watched_connections: self.max_watched_connections,
            cgroup_scope: self.cgroup_scope.clone(),
            copy_walk: self.copy_walk,
            state_tracepoint: self.state_tracepoint,
            capture_hook: self.capture_hook,
            cgroup_root: self.cgroup_root.clone(),
        }
    }
}

#[cfg(test)]
mod tests;
