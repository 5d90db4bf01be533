//! Defines what a capture watches and how much it copies (`CaptureOptions`, built from the command
//! line), checked before anything is loaded, and the watched ports as the programs' map holds
//! them.

use std::path::PathBuf;

use super::{error::CaptureError, hook_choice::HookChoice, programs::CopyWalk, sock_layout};

/// Says what to watch and how much to copy.
#[derive(Clone, Debug)]
pub struct CaptureOptions {
    pub grpc_ports: Vec<u16>,
    pub websocket_ports: Vec<u16>,
    pub grpc_budget: u32,
    /// Bytes per second each direction's gRPC budget regains.
    pub grpc_budget_refill: u32,
    pub ring_bytes: u32,
    /// Entries of the kernel's `CONNECTIONS` and `SOCKETS` tables.
    pub max_watched_connections: u32,
    /// cgroup v2 directories whose processes alone are watched; empty: every process.
    pub cgroup_scope: Vec<PathBuf>,
    pub copy_walk: CopyWalk,
    pub capture_hook: HookChoice,
    pub state_tracepoint: sock_layout::StateTracepointChoice,
    /// The node's cgroup v2 hierarchy, where `CaptureHook::Packets` attaches.
    pub cgroup_root: PathBuf,
}

/// Builds the non-zero words of `WATCHED_PORTS` for the watched ports: each port's `PortClass` at
/// its `watched_port_slot`.
pub(super) fn watched_port_words(options: &CaptureOptions) -> std::collections::BTreeMap<u32, u64> {
    let mut words = std::collections::BTreeMap::new();
    for (ports, class) in [
        (&options.grpc_ports, observer_records::PortClass::Grpc),
        (
            &options.websocket_ports,
            observer_records::PortClass::WebSocket,
        ),
    ] {
        for &port in ports {
            let (index, shift) = observer_records::watched_port_slot(port);
            *words.entry(index).or_insert(0) |= u64::from(class as u8) << shift;
        }
    }
    words
}

/// Checks the options before anything is loaded: the number of watched ports, no port in both
/// classes, and the ring's size.
///
/// # Errors
///
/// Fails with [`CaptureError::TooManyPorts`], [`CaptureError::PortInBothClasses`] or
/// [`CaptureError::BadRingSize`] (not a power of two, or smaller than a page).
pub(super) fn validate_options(options: &CaptureOptions) -> Result<(), CaptureError> {
    let count = options.grpc_ports.len() + options.websocket_ports.len();
    if count > observer_records::MAX_WATCHED_PORTS as usize {
        return Err(CaptureError::TooManyPorts {
            count,
            max: observer_records::MAX_WATCHED_PORTS,
        });
    }
    if let Some(port) = options
        .grpc_ports
        .iter()
        .find(|port| options.websocket_ports.contains(port))
    {
        return Err(CaptureError::PortInBothClasses(*port));
    }
    let page = page_size();
    if !options.ring_bytes.is_power_of_two() || options.ring_bytes < page {
        return Err(CaptureError::BadRingSize(options.ring_bytes));
    }
    Ok(())
}

/// Returns the page size, 4096 where `sysconf` cannot say.
pub(super) fn page_size() -> u32 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u32::try_from(size).unwrap_or(4096)
}
