//! Captures what the kernel programs saw, as `model::Event`s, whether the events come live from
//! the kernel (`kernel`) or from a recording (`recording`).

pub mod adopt;
mod btf;
pub mod cgroup_scope;
mod error;
mod hook_choice;
mod host;
pub mod kernel;
pub mod kernel_counters;
mod kernel_features;
mod loading;
mod options;
mod program_runs;
mod programs;
pub mod read_pacing;
mod reader_awake;
pub mod recording;
pub mod reorder;
mod ring_records;
pub mod sock_layout;
pub mod socket_tables;
pub mod stale_entries;
pub mod tracepoint_format;
