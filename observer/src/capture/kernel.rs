//! Loads the kernel programs, attaches them, and reads their ring buffer (`ring_records`
//! turns its records into `Event`s).

use std::{
    collections::HashSet,
    os::fd::AsFd,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, CgroupArray, HashMap, MapData, MapError, PerCpuArray, ProgramArray, RingBuf},
    programs::{ProgramError, TracePoint},
};
use observer_records::{
    COUNTER_COUNT, CaptureConfig, Connection, Counter, SocketKey, SocketState,
    adopted_connection_id, watching_slot,
};
use thiserror::Error;
use tokio::io::unix::AsyncFd;

pub use super::ring_records::Drained;
use super::{
    adopt::{self, FoundConnection},
    cgroup_scope::{self, ScopeError},
    ring_records::{MonotonicToWall, drain_ring, monotonic_now_ns},
    tracepoint_format::{self, LayoutError},
};
use crate::model::{Event, EventKind, TcpState};

/// The eBPF object built by `cargo xtask build`, embedded so the binary is self-contained.
#[cfg(ebpf_programs)]
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("OBSERVER_EBPF_OBJECT"));
/// Built without the object (build.rs warned): `KernelCapture::start` refuses.
#[cfg(not(ebpf_programs))]
static EBPF_OBJECT: &[u8] = &[];

/// Whether this build embeds the eBPF programs; without them `KernelCapture::start` fails with
/// `CaptureError::BuiltWithoutPrograms`.
pub const PROGRAMS_EMBEDDED: bool = cfg!(ebpf_programs);

const TRACEFS: &str = "/sys/kernel/tracing";

/// aya-log levels (aya_log_common::Level) for the programs' `AYA_LOG_LEVEL`.
const KERNEL_LOG_WARN: u8 = 2;
const KERNEL_LOG_DEBUG: u8 = 4;

/// `bpf_map_update_elem` flag (linux/bpf.h): insert only if the key is absent.
const BPF_NOEXIST: u64 = 1;

/// How often the reader drains the ring without being woken while it is quiet: a safety net,
/// since the first record after a quiet spell wakes it (`CaptureConfig::wakeup_after_ns`).
pub const DRAIN_INTERVAL: std::time::Duration = std::time::Duration::from_millis(10);

/// While records keep coming the reader drains again this long after reading anything, and
/// tells the programs so (`KernelCapture::reader_polls`): they wake it only when its last
/// read is more than twice this old (a timer fires up to a millisecond late), or the ring
/// fills. A busy ring then costs no wakeups, and a record waits about this long at most.
pub const READ_FOLLOW_UP: std::time::Duration = std::time::Duration::from_millis(1);

/// Which program serves which tracepoints. One program may serve several syscalls whose
/// arguments share a layout (write and sendto both start with fd, buf, len).
const ATTACHMENTS: &[(&str, &str, &str)] = &[
    ("sys_enter_connect", "syscalls", "sys_enter_connect"),
    ("sys_exit_connect", "syscalls", "sys_exit_connect"),
    ("inet_sock_set_state", "sock", "inet_sock_set_state"),
    ("sys_enter_close", "syscalls", "sys_enter_close"),
    ("sys_enter_send_buffer", "syscalls", "sys_enter_write"),
    ("sys_enter_send_buffer", "syscalls", "sys_enter_sendto"),
    ("sys_enter_recv_buffer", "syscalls", "sys_enter_read"),
    ("sys_enter_recv_buffer", "syscalls", "sys_enter_recvfrom"),
    ("sys_enter_send_iovec", "syscalls", "sys_enter_writev"),
    ("sys_enter_recv_iovec", "syscalls", "sys_enter_readv"),
    ("sys_enter_sendmsg", "syscalls", "sys_enter_sendmsg"),
    ("sys_enter_recvmsg", "syscalls", "sys_enter_recvmsg"),
    ("sys_exit_io", "syscalls", "sys_exit_write"),
    ("sys_exit_io", "syscalls", "sys_exit_sendto"),
    ("sys_exit_io", "syscalls", "sys_exit_read"),
    ("sys_exit_io", "syscalls", "sys_exit_recvfrom"),
    ("sys_exit_io", "syscalls", "sys_exit_writev"),
    ("sys_exit_io", "syscalls", "sys_exit_readv"),
    ("sys_exit_io", "syscalls", "sys_exit_sendmsg"),
    ("sys_exit_io", "syscalls", "sys_exit_recvmsg"),
];

/// The exit program of `ATTACHMENTS` stands for one of two, chosen at load (`CopyWalk`).
const EXIT_PROGRAM: &str = "sys_exit_io";
/// `EXIT_PROGRAM` for kernels without `bpf_loop`, and the program its copy continues in.
const EXIT_PROGRAM_BOUNDED: &str = "sys_exit_io_bounded";
const COPY_CONTINUE_PROGRAM: &str = "copy_continue";
/// The slot of `COPY_CONTINUE_PROGRAM` in the `COPY_PROGRAMS` map (`maps::COPY_CONTINUE`).
const COPY_CONTINUE_SLOT: u32 = 0;

/// Names of our programs as the kernel lists them (truncated to 15 bytes by the kernel), so a
/// check can tell whether any is still loaded.
pub fn program_names() -> impl Iterator<Item = &'static str> {
    let mut names: Vec<&str> = ATTACHMENTS.iter().map(|(program, _, _)| *program).collect();
    names.dedup();
    names.extend([EXIT_PROGRAM_BOUNDED, COPY_CONTINUE_PROGRAM]);
    names.into_iter()
}

/// How the kernel walks a call's buffers (observer-ebpf/src/copy.rs). Both follow every iovec
/// entry a call may have (`IOV_MAX`); they differ in what the kernel must offer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyWalk {
    /// `bpf_loop` where the kernel has it (5.17+), else tail calls.
    Auto,
    /// The `bpf_loop` helper (Linux 5.17+); refuse to start without it.
    BpfLoop,
    /// Bounded loops chained by tail calls (any supported kernel).
    TailCalls,
}

#[derive(Debug, Error)]
pub enum CaptureError {
    #[error("built without the eBPF programs: build with `cargo xtask build`")]
    BuiltWithoutPrograms,
    #[error(
        "loading eBPF programs needs root or CAP_BPF + CAP_PERFMON (missing: {missing}); run with sudo or grant them"
    )]
    MissingPrivileges { missing: String },
    #[error(
        "tracefs is not mounted at {TRACEFS} and mounting it failed ({reason}); mount it with `mount -t tracefs tracefs {TRACEFS}`"
    )]
    TracefsUnavailable { reason: String },
    #[error("this kernel has no BPF ring buffer (Linux 5.8 or newer is needed): {0}")]
    NoRingBuffer(String),
    #[error("tracepoint {category}/{name} is missing from this kernel ({reason})")]
    MissingTracepoint {
        category: String,
        name: String,
        reason: String,
    },
    #[error(transparent)]
    TracepointLayout(#[from] LayoutError),
    #[error("the kernel rejected program {program}: {reason}")]
    ProgramRejected { program: String, reason: String },
    #[error("too many watched ports ({count}); at most {max}")]
    TooManyPorts { count: usize, max: u32 },
    #[error("port {0} is both a gRPC and a WebSocket port")]
    PortInBothClasses(u16),
    #[error("--ring-bytes must be a power of two multiple of the page size, got {0}")]
    BadRingSize(u32),
    #[error(transparent)]
    Scope(#[from] ScopeError),
    #[error("eBPF setup failed: {0}")]
    Setup(String),
    #[error("reading the ring buffer failed: {0}")]
    Read(#[from] std::io::Error),
}

/// What to watch and how much to copy.
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
}

/// Kernel-side counters, summed over CPUs; indexed by `Counter`, serialised as an object keyed
/// by `Counter::name`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelCounters([u64; COUNTER_COUNT as usize]);

impl KernelCounters {
    pub fn iter(&self) -> impl Iterator<Item = (Counter, u64)> + '_ {
        Counter::ALL
            .into_iter()
            .map(|counter| (counter, self[counter]))
    }
}

impl std::ops::Index<Counter> for KernelCounters {
    type Output = u64;

    fn index(&self, counter: Counter) -> &u64 {
        &self.0[counter as usize]
    }
}

impl std::ops::IndexMut<Counter> for KernelCounters {
    fn index_mut(&mut self, counter: Counter) -> &mut u64 {
        &mut self.0[counter as usize]
    }
}

impl serde::Serialize for KernelCounters {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(Counter::ALL.len()))?;
        for (counter, value) in self.iter() {
            map.serialize_entry(counter.name(), &value)?;
        }
        map.end()
    }
}

/// The loaded and attached programs. Dropping it detaches and unloads them all.
pub struct KernelCapture {
    ring: AsyncFd<RingBuf<MapData>>,
    counters: PerCpuArray<MapData, u64>,
    /// The programs' connection and descriptor tables: adoption fills them, `reconcile` reads
    /// and prunes them.
    connections: HashMap<MapData, u64, Connection>,
    sockets: HashMap<MapData, SocketKey, SocketState>,
    /// The programs' filter of processes that may own a watched descriptor: adoption marks
    /// the processes whose descriptors it adds.
    watching: Array<MapData, u8>,
    /// When the reader last said it reads (`reader_polls`), 0 once it waits.
    reader_awake: Array<MapData, u64>,
    /// Whether `reader_awake` holds a stamp (so going quiet has something to clear).
    reader_stamped: bool,
    /// `CONNECTIONS` keys of the connections adopted at start and still alive, with the
    /// descriptors (`(tgid, fd)`) that held them then.
    adopted: std::collections::HashMap<u64, Vec<(u32, u32)>>,
    clock: MonotonicToWall,
    copy_walk: CopyWalk,
    log_task: tokio::task::JoinHandle<()>,
    // Last: the programs must outlive the maps and logger taken from them.
    _ebpf: Ebpf,
}

impl Drop for KernelCapture {
    fn drop(&mut self) {
        self.log_task.abort();
    }
}

impl KernelCapture {
    /// Checks privileges and tracefs, loads the programs, configures and attaches them.
    /// Must run inside a tokio runtime (the ring buffer and the log reader are async).
    pub fn start(options: &CaptureOptions) -> Result<Self, CaptureError> {
        if !PROGRAMS_EMBEDDED {
            return Err(CaptureError::BuiltWithoutPrograms);
        }
        // User input first: a mistyped directory is named whatever else is missing.
        let scope = cgroup_scope::open(&options.cgroup_scope)?;
        check_privileges()?;
        ensure_tracefs()?;
        tracepoint_format::check(Path::new(TRACEFS), ATTACHMENTS)?;
        validate_options(options)?;
        raise_memlock_limit();

        // The programs' own log statements are filtered in the kernel, before they cost a
        // ring-buffer record and a reader wakeup: a debug line per watched connect cost a
        // busy pusher a context switch per call.
        let kernel_log_level: u8 = if tracing::enabled!(tracing::Level::DEBUG) {
            KERNEL_LOG_DEBUG
        } else {
            KERNEL_LOG_WARN
        };
        let mut ebpf = EbpfLoader::new()
            .map_max_entries("EVENTS", options.ring_bytes)
            .map_max_entries("CONNECTIONS", options.max_watched_connections)
            .map_max_entries("SOCKETS", options.max_watched_connections)
            .override_global("AYA_LOG_LEVEL", &kernel_log_level, true)
            .load(EBPF_OBJECT)
            .map_err(|err| classify_load_error(&err))?;
        let log_task = spawn_kernel_log_reader(&mut ebpf)?;

        let mut watched: HashMap<_, u16, u8> = take_map(&mut ebpf, "WATCHED_PORTS")?;
        for (ports, class) in [
            (&options.grpc_ports, observer_records::PortClass::Grpc),
            (
                &options.websocket_ports,
                observer_records::PortClass::WebSocket,
            ),
        ] {
            for port in ports {
                watched
                    .insert(port, class as u8, 0)
                    .map_err(|err| CaptureError::Setup(format!("WATCHED_PORTS: {err}")))?;
            }
        }
        let mut config: Array<_, CaptureConfig> = take_map(&mut ebpf, "CONFIG")?;
        let capture_config = CaptureConfig {
            grpc_budget: options.grpc_budget,
            grpc_budget_refill: options.grpc_budget_refill,
            // An eighth of the ring: the reader wakes well before the ring fills.
            wakeup_bytes: options.ring_bytes / 8,
            // `cgroup_scope::open` allows at most MAX_CGROUP_SCOPES.
            cgroup_scopes: scope.len() as u32,
            wakeup_after_ns: 2 * READ_FOLLOW_UP.as_nanos() as u64,
        };
        let mut scope_map: CgroupArray<_> = take_map(&mut ebpf, "CGROUP_SCOPE")?;
        for (index, directory) in (0..).zip(&scope) {
            scope_map
                .set(index, directory.as_fd(), 0)
                .map_err(|err| CaptureError::Setup(format!("CGROUP_SCOPE: {err}")))?;
        }
        config
            .set(0, capture_config, 0)
            .map_err(|err| CaptureError::Setup(format!("CONFIG: {err}")))?;
        let counters: PerCpuArray<_, u64> = take_map(&mut ebpf, "COUNTERS")?;
        let ring: RingBuf<MapData> = take_map(&mut ebpf, "EVENTS")?;
        let connections: HashMap<_, u64, Connection> = take_map(&mut ebpf, "CONNECTIONS")?;
        let sockets: HashMap<_, SocketKey, SocketState> = take_map(&mut ebpf, "SOCKETS")?;
        let watching: Array<_, u8> = take_map(&mut ebpf, "WATCHING")?;
        let reader_awake: Array<_, u64> = take_map(&mut ebpf, "READER_AWAKE")?;

        let copy_walk = load_exit_program(&mut ebpf, options.copy_walk)?;
        let exit_program = match copy_walk {
            CopyWalk::TailCalls => EXIT_PROGRAM_BOUNDED,
            _ => EXIT_PROGRAM,
        };
        for (program_name, category, tracepoint) in ATTACHMENTS {
            let program_name = if *program_name == EXIT_PROGRAM {
                exit_program
            } else {
                program_name
            };
            attach(&mut ebpf, program_name, category, tracepoint)?;
        }
        Ok(Self {
            // SAFETY: the ring owns its map fd and keeps it open while the AsyncFd holds it.
            ring: unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
                .map_err(|err| CaptureError::Read(err.into()))?,
            counters,
            connections,
            sockets,
            watching,
            reader_awake,
            reader_stamped: false,
            adopted: std::collections::HashMap::new(),
            clock: MonotonicToWall::now(),
            copy_walk,
            log_task,
            _ebpf: ebpf,
        })
    }

    /// How this kernel walks a call's buffers: `CopyWalk::BpfLoop` or `CopyWalk::TailCalls`.
    pub fn copy_walk(&self) -> CopyWalk {
        self.copy_walk
    }

    /// Waits until the kernel has produced records, then converts up to one batch of them.
    pub async fn read_batch(&mut self, events: &mut Vec<Event>) -> Result<Drained, CaptureError> {
        let mut guard = self.ring.readable_mut().await?;
        let drained = drain_ring(guard.get_inner_mut(), &self.clock, events);
        // Records left behind keep the ring readable: the next call converts them at once
        // instead of waiting for a wakeup the programs may not send.
        if !drained.more {
            guard.clear_ready();
        }
        Ok(drained)
    }

    /// Tells the programs the reader polls the ring: it reads again within `READ_FOLLOW_UP`,
    /// so records need not wake it.
    pub fn reader_polls(&mut self) {
        self.set_reader_awake(monotonic_now_ns());
        self.reader_stamped = true;
    }

    /// Tells the programs the reader now waits for a wakeup. False when it already did: then no
    /// record can have been made without waking it, and there is nothing to drain again.
    pub fn reader_waits(&mut self) -> bool {
        if !self.reader_stamped {
            return false;
        }
        self.set_reader_awake(0);
        self.reader_stamped = false;
        true
    }

    /// A failed update only costs wakeups or a timer's delay, never records: logged, not
    /// returned.
    fn set_reader_awake(&mut self, stamp: u64) {
        if let Err(err) = self.reader_awake.set(0, stamp, 0) {
            tracing::debug!("READER_AWAKE: {err}");
        }
    }

    /// Converts up to one batch of the records already in the ring without waiting.
    pub fn drain(&mut self, events: &mut Vec<Event>) -> Drained {
        drain_ring(self.ring.get_mut(), &self.clock, events)
    }

    /// Watches the connections to watched ports that were established before the programs
    /// were attached (call once, right after `start`). Returns one event per adopted
    /// connection (`TcpState` from `Unknown` to `Established`, under its adopted id) for the
    /// engine, which then decodes it as joined mid-stream.
    pub fn adopt_established(&mut self, options: &CaptureOptions) -> Vec<Event> {
        let found = adopt::find_established(&options.grpc_ports, &options.websocket_ports);
        let now_ns = self.clock.wall_ns(monotonic_now_ns());
        let mut events = Vec::new();
        for connection in found {
            match self.adopt(&connection) {
                Ok(id) => events.push(adopted_event(&connection, id, now_ns)),
                Err(reason) => tracing::warn!(
                    local = %connection.local,
                    remote = %connection.remote,
                    "could not adopt an existing connection: {reason}"
                ),
            }
        }
        events
    }

    fn adopt(&mut self, connection: &FoundConnection) -> Result<u64, MapError> {
        let id = adopted_connection_id(connection.inode);
        self.connections
            .insert(id, connection.kernel_connection(), 0)?;
        let state = connection.socket_state(id);
        for key in connection.socket_keys() {
            // BPF_NOEXIST: a descriptor the programs saw meanwhile (closed and reused for a
            // new connection since the scan) keeps its own entry.
            if let Err(err) = self.sockets.insert(key, state, BPF_NOEXIST) {
                tracing::debug!(
                    tgid = key.tgid,
                    fd = key.fd,
                    "descriptor not adopted: {err}"
                );
            }
            // Without its mark the programs would not look the descriptor up at all.
            self.watching.set(watching_slot(key.tgid), 1, 0)?;
        }
        self.adopted.insert(id, connection.descriptors.clone());
        Ok(id)
    }

    /// Brings the programs' tables in line with the kernel's sockets, and returns the
    /// `CONNECTIONS` keys still alive: a tracked connection not among them is gone, whether or
    /// not its close reached userspace (a full ring drops records, never map updates).
    ///
    /// An adopted connection that none of its descriptors holds any more is removed (the
    /// programs only remove those they saw connecting), and so is every descriptor entry
    /// whose connection is gone (a process that exits closes its descriptors without `close`).
    pub fn reconcile(&mut self) -> HashSet<u64> {
        if !self.adopted.is_empty() {
            let gone: Vec<u64> = self
                .adopted
                .iter()
                .filter(|&(&id, descriptors)| {
                    let inode = id & (observer_records::ADOPTED_CONNECTION_BIT - 1);
                    !adopt::holds_socket(descriptors, inode)
                })
                .map(|(&id, _)| id)
                .collect();
            for id in gone {
                let _ = self.connections.remove(&id);
                self.adopted.remove(&id);
            }
        }
        // Descriptors first, connections second: the programs add a connection (at SYN_SENT)
        // before its descriptor (at connect's exit), so a descriptor read here whose connection
        // is missing from the later read really lost it. The other order unwatched the
        // descriptors of connections made between the two reads: on a table of 100,000 a
        // burst of 1,000 connects lost a third of its upgrades, with nothing counted.
        let descriptors: Vec<(SocketKey, u64)> = self
            .sockets
            .iter()
            .flatten()
            .map(|(key, state)| (key, state.sock))
            .collect();
        let alive: HashSet<u64> = self.connections.keys().flatten().collect();
        for (key, sock) in descriptors {
            // Only while the descriptor still names that connection: closed and reused since
            // it was read, it belongs to a new one.
            if !alive.contains(&sock)
                && self
                    .sockets
                    .get(&key, 0)
                    .is_ok_and(|state| state.sock == sock)
            {
                let _ = self.sockets.remove(&key);
            }
        }
        alive
    }

    pub fn counters(&self) -> Result<KernelCounters, CaptureError> {
        let mut totals = KernelCounters::default();
        for counter in Counter::ALL {
            let per_cpu = self
                .counters
                .get(&(counter as u32), 0)
                .map_err(|err| CaptureError::Setup(format!("COUNTERS: {err}")))?;
            totals[counter] = per_cpu.iter().sum();
        }
        Ok(totals)
    }
}

fn validate_options(options: &CaptureOptions) -> Result<(), CaptureError> {
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

fn page_size() -> u32 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u32::try_from(size).unwrap_or(4096)
}

fn take_map<M>(ebpf: &mut Ebpf, name: &str) -> Result<M, CaptureError>
where
    M: TryFrom<aya::maps::Map, Error = MapError>,
{
    let map = ebpf
        .take_map(name)
        .ok_or_else(|| CaptureError::Setup(format!("map {name} is missing from the object")))?;
    M::try_from(map).map_err(|err| CaptureError::Setup(format!("map {name}: {err}")))
}

/// Loads the exit program `wanted` asks for; with `CopyWalk::Auto`, the `bpf_loop` one if this
/// kernel's verifier accepts it (5.17+), else the bounded one. Returns the walk loaded.
fn load_exit_program(ebpf: &mut Ebpf, wanted: CopyWalk) -> Result<CopyWalk, CaptureError> {
    if wanted != CopyWalk::TailCalls {
        match load_program(ebpf, EXIT_PROGRAM) {
            Ok(()) => return Ok(CopyWalk::BpfLoop),
            Err(err) if wanted == CopyWalk::BpfLoop => return Err(err),
            Err(err) => tracing::info!("copying in tail calls: no bpf_loop here ({err})"),
        }
    }
    load_program(ebpf, EXIT_PROGRAM_BOUNDED)?;
    load_program(ebpf, COPY_CONTINUE_PROGRAM)?;
    let continuation = tracepoint_program(ebpf, COPY_CONTINUE_PROGRAM)?
        .fd()
        .map_err(|err| CaptureError::Setup(format!("{COPY_CONTINUE_PROGRAM}: {err}")))?
        .try_clone()
        .map_err(|err| CaptureError::Setup(format!("{COPY_CONTINUE_PROGRAM}: {err}")))?;
    // Borrowed, not taken: the map stays with `Ebpf`, whose fd keeps its entries (the kernel
    // empties a program array once userspace closes it).
    let map = ebpf
        .map_mut("COPY_PROGRAMS")
        .ok_or_else(|| CaptureError::Setup("map COPY_PROGRAMS is missing".to_owned()))?;
    let mut programs = ProgramArray::try_from(map)
        .map_err(|err| CaptureError::Setup(format!("map COPY_PROGRAMS: {err}")))?;
    programs
        .set(COPY_CONTINUE_SLOT, &continuation, 0)
        .map_err(|err| CaptureError::Setup(format!("COPY_PROGRAMS: {err}")))?;
    Ok(CopyWalk::TailCalls)
}

fn tracepoint_program<'a>(
    ebpf: &'a mut Ebpf,
    program_name: &str,
) -> Result<&'a mut TracePoint, CaptureError> {
    ebpf.program_mut(program_name)
        .ok_or_else(|| CaptureError::Setup(format!("program {program_name} is missing")))?
        .try_into()
        .map_err(|err: ProgramError| CaptureError::Setup(err.to_string()))
}

/// Loads a program into the kernel once (one program may serve several tracepoints).
fn load_program(ebpf: &mut Ebpf, program_name: &str) -> Result<(), CaptureError> {
    let program = tracepoint_program(ebpf, program_name)?;
    if program.fd().is_ok() {
        return Ok(());
    }
    program
        .load()
        .map_err(|err| CaptureError::ProgramRejected {
            program: program_name.to_owned(),
            reason: verifier_summary(&err),
        })?;
    // The verifier's work (5.16+), against its limit of 1 000 000 instructions.
    if let Some(verified) = program
        .info()
        .ok()
        .and_then(|info| info.verified_instruction_count())
    {
        tracing::debug!(program = program_name, verified, "program loaded");
    }
    Ok(())
}

fn attach(
    ebpf: &mut Ebpf,
    program_name: &str,
    category: &str,
    tracepoint: &str,
) -> Result<(), CaptureError> {
    load_program(ebpf, program_name)?;
    tracepoint_program(ebpf, program_name)?
        .attach(category, tracepoint)
        .map_err(|err| CaptureError::MissingTracepoint {
            category: category.to_owned(),
            name: tracepoint.to_owned(),
            reason: err.to_string(),
        })?;
    Ok(())
}

/// The verifier log can run to thousands of lines: a feature this kernel lacks is named as
/// such, otherwise the log's last lines say what went wrong. The statistics the verifier
/// appends ("processed N insns", "verification time", stack depth) are left out: they would
/// push the refusal itself out of the summary.
fn verifier_summary(err: &ProgramError) -> String {
    let text = match err {
        ProgramError::LoadError { verifier_log, .. } => verifier_log.to_string(),
        other => other.to_string(),
    };
    if let Some(feature) = super::kernel_features::missing_feature(&text) {
        return feature;
    }
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| !line.trim().is_empty() && !is_verifier_statistics(line))
        .collect();
    let tail = &lines[lines.len().saturating_sub(3)..];
    tail.join(" | ")
}

fn is_verifier_statistics(line: &str) -> bool {
    let line = line.trim_start();
    line.starts_with("processed ")
        || line.starts_with("verification time")
        || line.starts_with("stack depth")
}

fn classify_load_error(err: &aya::EbpfError) -> CaptureError {
    let mut text = err.to_string();
    // aya's messages leave out the system call's answer, which is what tells a seccomp filter
    // or security module refusing bpf() ("Operation not permitted") from anything else. The
    // errors between hold no more than their Display already says.
    let mut cause: &dyn std::error::Error = err;
    while let Some(source) = cause.source() {
        cause = source;
    }
    if let Some(io) = cause.downcast_ref::<std::io::Error>() {
        text = format!("{text}: {io}");
    }
    if let aya::EbpfError::MapError(MapError::CreateError { name, .. }) = err
        && name == "EVENTS"
    {
        return CaptureError::NoRingBuffer(text);
    }
    CaptureError::Setup(text)
}

/// Forwards the programs' aya-log records (debug-level, off unless RUST_LOG asks) to `log`,
/// which the tracing subscriber bridges to stderr. The logger owns the map the programs write
/// to: it must stay alive as long as they run, so the task keeps it.
fn spawn_kernel_log_reader(ebpf: &mut Ebpf) -> Result<tokio::task::JoinHandle<()>, CaptureError> {
    let logger = aya_log::EbpfLogger::init(ebpf)
        .map_err(|err| CaptureError::Setup(format!("aya-log: {err}")))?;
    // SAFETY: the logger owns its ring fd and keeps it open while the AsyncFd holds it.
    let mut logger =
        unsafe { AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE) }
            .map_err(|err| CaptureError::Read(err.into()))?;
    Ok(tokio::spawn(async move {
        while let Ok(mut guard) = logger.readable_mut().await {
            guard.get_inner_mut().flush();
            guard.clear_ready();
        }
    }))
}

/// Capabilities from /proc/self/status (`CapEff`); bit numbers from linux/capability.h.
fn check_privileges() -> Result<(), CaptureError> {
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let effective = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                line.strip_prefix("CapEff:")
                    .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            })
        })
        .unwrap_or(0);
    let has = |cap: u32| effective & (1u64 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(|(cap, _)| !has(*cap))
        .map(|(_, name)| name)
        .collect();
    Err(CaptureError::MissingPrivileges {
        missing: missing.join(", "),
    })
}

/// Tracepoint attachment reads ids from tracefs. Hosts and containers often have it
/// unmounted; as root we can mount it ourselves.
fn ensure_tracefs() -> Result<(), CaptureError> {
    if Path::new(TRACEFS).join("events").is_dir() {
        return Ok(());
    }
    let status = std::process::Command::new("mount")
        .args(["-t", "tracefs", "tracefs", TRACEFS])
        .stderr(std::process::Stdio::piped())
        .output();
    match status {
        Ok(output) if output.status.success() => Ok(()),
        Ok(output) => Err(CaptureError::TracefsUnavailable {
            reason: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        }),
        Err(err) => Err(CaptureError::TracefsUnavailable {
            reason: err.to_string(),
        }),
    }
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK, whose default is far too small for
/// the ring buffer. Newer kernels ignore it, so a failure here is not an error.
fn raise_memlock_limit() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads the struct we pass and nothing else.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) } != 0 {
        tracing::debug!("could not raise RLIMIT_MEMLOCK; fine on Linux 5.11+");
    }
}

/// What the engine learns of an adopted connection: it exists, established, from now on.
fn adopted_event(connection: &FoundConnection, id: u64, ts_ns: u64) -> Event {
    let owner = connection.descriptors.first().map_or(0, |(tgid, _)| *tgid);
    Event {
        ts_ns,
        connection: id,
        pid: owner,
        comm: connection.comm.clone(),
        cgroup_id: connection.cgroup_id,
        saddr: connection.local.ip(),
        sport: connection.local.port(),
        daddr: connection.remote.ip(),
        dport: connection.remote.port(),
        port_class: connection.port_class,
        kind: EventKind::TcpState {
            old: TcpState::Unknown,
            new: TcpState::Established,
        },
    }
}
