//! Provides openim-lab: a stand-in for an OpenIM msggateway cluster (3.5.1 by default; 3.6, 3.7,
//! 3.8 and main on request, see [`lab::release`]), built from real parts.
//!
//! Every pod is a network namespace with its own address on a bridge the lab creates, and runs
//! one role as a separate process of the `openim-lab` binary (`ip netns exec <ns> openim-lab
//! <role>`): `msggateway` (WebSocket :80, gRPC :88), `msggw-proxy` (WebSocket :10002, consistent
//! hash on `sendID`) and `openim-push` (consistent hash on recipients, one new gRPC connection per
//! call in 3.5; a kept connection per gateway, or every recipient to every gateway, in later
//! releases). Clients run in the lab process and reach the proxy over the bridge. Traffic between
//! them is real TCP with real protocols (HTTP/1.1 upgrade + WebSocket, HTTP/2 + gRPC + protobuf),
//! so a system-wide observer sees what it would see on a Kubernetes node.
//!
//! Entry points: [`Lab::start`], [`Lab::run_scenario`], [`Lab::push_flood`]; the `openim-lab`
//! binary wraps them (`openim-lab run`, `openim-lab push-loop`). [`lab`] is the cluster stand-in
//! and its parts; [`observed`] runs the real observer beside a lab and scores its alerts;
//! [`releases`] checks them per OpenIM release and routing;
//! [`demo`] is `cargo xtask demo`; [`bench`](mod@bench) is `cargo xtask bench` (what watching
//! costs); [`cluster_node`] is one cluster-mode observer at the engine, without a kernel, for the
//! cluster tests and `benches/cluster.rs`; [`redis_topology`] starts a Redis Cluster or
//! Sentinel-managed Redis, and [`redis_lab`] runs the lab with one observer per node on any of
//! them.

pub mod alert_latency;
pub mod bench;
pub mod cluster_node;
pub mod demo;
pub mod kernel_tables;
pub mod lab;
pub mod memory_load;
pub mod observed;
pub mod privileges;
pub mod redis_lab;
pub mod redis_server;
pub mod redis_topology;
pub mod releases;
pub mod soak;
pub mod watching_cost;

pub use lab::release::{Discovery, OpenImRelease, PushRouting};
pub use lab::truth::{FloodReport, GroundTruth, MissCause, Summary, UserTruth};
pub use lab::{Lab, LabConfig, ProxyMode, ScenarioStep};

/// Finds a workspace binary: `$env_var` if set, else `name` next to this executable or in its
/// parent directory (cargo puts test binaries in `target/<profile>/deps/` and the others in
/// `target/<profile>/`).
///
/// # Errors
///
/// Fails when the current executable's path is unknown, or `name` is in neither directory.
pub fn sibling_binary(name: &str, env_var: &str) -> anyhow::Result<std::path::PathBuf> {
    use anyhow::Context;
    if let Some(path) = std::env::var_os(env_var) {
        return Ok(std::path::PathBuf::from(path));
    }
    let current = std::env::current_exe().context("current executable")?;
    current
        .ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .with_context(|| {
            format!("{name} binary not found: build it (cargo xtask build) or set {env_var}")
        })
}

/// Holds the code generated from `proto/*.proto` (OpenIM's field numbers and gRPC names).
pub mod proto {
    pub mod sdkws {
        tonic::include_proto!("open_im_server.sdkws");
    }
    pub mod msggateway {
        tonic::include_proto!("open_im_server.msggateway");
    }
}
