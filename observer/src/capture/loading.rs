//! Loads the eBPF object with its tables sized for the options, writes the maps the programs
//! read before they run, and takes out the maps userspace keeps.

use std::os::fd::AsFd;

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, CgroupArray, HashMap, MapData, MapError, PerCpuArray, RingBuf},
};
use observer_records::{
    CaptureConfig, Connection, ConnectionTuple, PacketStream, SocketKey, SocketState,
};

use super::{
    error::CaptureError,
    options::{CaptureOptions, page_size, watched_port_words},
    programs::{self, CaptureHook},
    read_pacing::READ_FOLLOW_UP,
    reader_awake::ReaderAwake,
    sock_layout::StateTracepoint,
};

/// Embeds the eBPF object built by `cargo xtask build`, so that the binary is self-contained.
#[cfg(ebpf_programs)]
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("OBSERVER_EBPF_OBJECT"));
/// Stands in for the object in a build without it (build.rs warned): `KernelCapture::start`
/// refuses.
#[cfg(not(ebpf_programs))]
static EBPF_OBJECT: &[u8] = &[];

/// Loads the programs with their tables sized for `options` and the hook in use.
///
/// # Errors
///
/// Fails with what `programs::classify_load_error` makes of the loader's failure:
/// [`CaptureError::MemlockTooLow`], [`CaptureError::NoRingBuffer`] or [`CaptureError::Setup`].
pub(super) fn load(
    options: &CaptureOptions,
    capture_hook: CaptureHook,
    memlock_in_the_way: Option<u64>,
) -> Result<Ebpf, CaptureError> {
    // The programs' own log statements are filtered in the kernel, before they cost a
    // ring-buffer record and a reader wakeup: a debug line per watched connect cost a
    // busy pusher a context switch per call.
    let kernel_log_level: u8 = if tracing::enabled!(tracing::Level::DEBUG) {
        aya_log::Level::Debug as u8
    } else {
        aya_log::Level::Warn as u8
    };
    // The tables of the hook not in use get one entry: the object declares them all, and
    // hash maps are allocated whole, so full-size ones would cost kernel memory for nothing.
    let (syscall_entries, packet_entries) = match capture_hook {
        CaptureHook::Syscalls => (options.max_watched_connections, 1),
        CaptureHook::Packets => (1, options.max_watched_connections),
    };
    EbpfLoader::new()
        .map_max_entries("EVENTS", options.ring_bytes)
        .map_max_entries("CONNECTIONS", options.max_watched_connections)
        .map_max_entries("SOCKETS", syscall_entries)
        .map_max_entries("IN_FLIGHT", syscall_entries)
        .map_max_entries("PENDING_CONNECTS", syscall_entries)
        .map_max_entries("PACKET_STREAMS", packet_entries)
        .map_max_entries("ADOPTABLE", packet_entries)
        .override_global("AYA_LOG_LEVEL", &kernel_log_level, true)
        .load(EBPF_OBJECT)
        .map_err(|err| programs::classify_load_error(&err, memlock_in_the_way))
}

/// Holds the maps [`configure`] wrote, which must stay open until the programs are loaded.
pub(super) struct Configured {
    _watched: Array<MapData, u64>,
    _scope: CgroupArray<MapData>,
    _config: Array<MapData, CaptureConfig>,
}

/// Writes what the programs read before they run: the watched ports, the capture's
/// configuration and the `--cgroup-scope` directories.
///
/// # Errors
///
/// Fails with [`CaptureError::Setup`] when a map is missing from the object, of another type, or
/// refuses a value.
pub(super) fn configure(
    ebpf: &mut Ebpf,
    options: &CaptureOptions,
    scope: &[std::fs::File],
    capture_hook: CaptureHook,
    state: StateTracepoint,
) -> Result<Configured, CaptureError> {
    let mut watched: Array<_, u64> = take_map(ebpf, "WATCHED_PORTS")?;
    for (index, word) in watched_port_words(options) {
        watched
            .set(index, word, 0)
            .map_err(|err| CaptureError::Setup(format!("WATCHED_PORTS: {err}")))?;
    }
    let mut scope_map: CgroupArray<_> = take_map(ebpf, "CGROUP_SCOPE")?;
    for (index, directory) in (0..).zip(scope) {
        scope_map
            .set(index, directory.as_fd(), 0)
            .map_err(|err| CaptureError::Setup(format!("CGROUP_SCOPE: {err}")))?;
    }
    let capture_config = CaptureConfig {
        grpc_budget: options.grpc_budget,
        grpc_budget_refill: options.grpc_budget_refill,
        // An eighth of the ring: the reader wakes well before the ring fills.
        wakeup_bytes: options.ring_bytes / 8,
        // `cgroup_scope::open` allows at most MAX_CGROUP_SCOPES.
        cgroup_scopes: scope.len() as u32,
        // A poll a millisecond late (timer slack) wakes the reader; `read_pacing`'s
        // longer follow-ups are stamped ahead by the difference.
        wakeup_after_ns: 2 * READ_FOLLOW_UP.as_nanos() as u64,
        capture_hook: capture_hook.kernel() as u32,
        _reserved: 0,
        sock_layout: match state {
            StateTracepoint::Raw(layout) => layout,
            StateTracepoint::Formatted => Default::default(),
        },
    };
    let mut config: Array<_, CaptureConfig> = take_map(ebpf, "CONFIG")?;
    config
        .set(0, capture_config, 0)
        .map_err(|err| CaptureError::Setup(format!("CONFIG: {err}")))?;
    Ok(Configured {
        _watched: watched,
        _scope: scope_map,
        _config: config,
    })
}

/// Holds the maps userspace keeps reading or writing after the start.
pub(super) struct Maps {
    pub(super) ring: RingBuf<MapData>,
    pub(super) counters: PerCpuArray<MapData, u64>,
    pub(super) connections: HashMap<MapData, u64, Connection>,
    pub(super) sockets: HashMap<MapData, SocketKey, SocketState>,
    pub(super) adoptable: HashMap<MapData, ConnectionTuple, Connection>,
    pub(super) packet_streams: Option<HashMap<MapData, u64, PacketStream>>,
    pub(super) watching: Array<MapData, u8>,
    pub(super) reader_awake: ReaderAwake,
}

impl Maps {
    /// Takes the maps out of the loaded object (`PACKET_STREAMS` only with the packet hook).
    ///
    /// # Errors
    ///
    /// Fails with [`CaptureError::Setup`] when a map is missing from the object or of another type,
    /// or `READER_AWAKE` cannot be mapped.
    pub(super) fn take(ebpf: &mut Ebpf, capture_hook: CaptureHook) -> Result<Self, CaptureError> {
        let reader_awake = match ebpf.take_map("READER_AWAKE") {
            Some(aya::maps::Map::Array(map)) => ReaderAwake::map(map, page_size() as usize)
                .map_err(|err| CaptureError::Setup(format!("mapping READER_AWAKE: {err}")))?,
            _ => {
                return Err(CaptureError::Setup(
                    "map READER_AWAKE is missing from the object".into(),
                ));
            }
        };
        Ok(Self {
            ring: take_map(ebpf, "EVENTS")?,
            counters: take_map(ebpf, "COUNTERS")?,
            connections: take_map(ebpf, "CONNECTIONS")?,
            sockets: take_map(ebpf, "SOCKETS")?,
            adoptable: take_map(ebpf, "ADOPTABLE")?,
            packet_streams: match capture_hook {
                CaptureHook::Syscalls => None,
                CaptureHook::Packets => Some(take_map(ebpf, "PACKET_STREAMS")?),
            },
            watching: take_map(ebpf, "WATCHING")?,
            reader_awake,
        })
    }
}

/// Takes the map `name` out of the loaded object as the type `M`.
fn take_map<M>(ebpf: &mut Ebpf, name: &str) -> Result<M, CaptureError>
where
    M: TryFrom<aya::maps::Map, Error = MapError>,
{
    let map = ebpf
        .take_map(name)
        .ok_or_else(|| CaptureError::Setup(format!("map {name} is missing from the object")))?;
    M::try_from(map).map_err(|err| CaptureError::Setup(format!("map {name}: {err}")))
}
