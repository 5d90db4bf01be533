//! Starts the kernel programs (`host` checks what they need, `loading` loads them and
//! configures their maps, `programs` attaches them), reads their ring buffer (`ring_records` turns
//! its records into
//! `Event`s) and keeps their tables in line with the kernel's sockets.

use std::{collections::HashSet, path::Path};

use aya::{
    Ebpf,
    maps::{Array, HashMap, MapData, MapError, PerCpuArray, RingBuf},
};
use aya_obj::generated::BPF_NOEXIST;
use observer_records::{
    Connection, ConnectionTuple, Counter, PacketStream, SocketKey, SocketState,
    adopted_connection_id, watching_slot,
};
use tokio::io::unix::AsyncFd;

pub use super::error::CaptureError;
pub use super::hook_choice::HookChoice;
pub use super::options::CaptureOptions;
pub use super::programs::{CaptureHook, CopyWalk, program_names};
pub use super::ring_records::Drained;
use super::{
    adopt::{self, Adoption, FoundConnection},
    cgroup_scope::{self, ScopeMembership},
    hook_choice,
    host::{self, TRACEFS},
    kernel_counters::KernelCounters,
    loading::{Maps, configure, load},
    options::validate_options,
    program_runs, programs, read_pacing,
    reader_awake::ReaderAwake,
    reorder::{Reorder, ReorderCounters},
    ring_records::{RecordConverter, monotonic_now_ns},
    sock_layout::{self, StateTracepoint, VMLINUX_BTF},
    socket_tables::table_sockets,
    stale_entries::{self, EntryTuple, StaleEntries},
    tracepoint_format,
};
use crate::model::{Event, EventKind, PortClass, TcpState};

/// Says whether this build embeds the eBPF programs; without them `KernelCapture::start` fails with
/// `CaptureError::BuiltWithoutPrograms`.
pub const PROGRAMS_EMBEDDED: bool = cfg!(ebpf_programs);

/// Holds the loaded and attached programs. Dropping it detaches and unloads them all.
pub struct KernelCapture {
    ring: AsyncFd<RingBuf<MapData>>,
    counters: PerCpuArray<MapData, u64>,
    /// The programs' connection and descriptor tables: adoption fills them, `reconcile` reads
    /// and prunes them.
    connections: HashMap<MapData, u64, Connection>,
    /// The packet hook's connections (the syscall hook's are in `connections`): `reconcile`
    /// reads their keys. `None` with the syscall hook.
    packet_streams: Option<HashMap<MapData, u64, PacketStream>>,
    sockets: HashMap<MapData, SocketKey, SocketState>,
    /// The programs' filter of processes that may own a watched descriptor: adoption marks
    /// the processes whose descriptors it adds.
    watching: Array<MapData, u8>,
    /// When the reader last said it reads (`reader_polls`), 0 once it waits.
    reader_awake: ReaderAwake,
    /// Whether `reader_awake` holds a stamp (so going quiet has something to clear).
    reader_stamped: bool,
    /// `CONNECTIONS` keys of the connections adopted at start and still alive, with the
    /// descriptors (`(tgid, fd)`) that held them then.
    adopted: std::collections::HashMap<u64, Vec<(u32, u32)>>,
    /// The packet programs' table of connections to adopt at their first packet, and what
    /// userspace handed them (each connection's socket inode and descriptors, to remove it
    /// from the table if it ends unseen).
    adoptable: HashMap<MapData, ConnectionTuple, Connection>,
    handed_over: std::collections::HashMap<ConnectionTuple, (u64, Vec<(u32, u32)>)>,
    /// Which of the connections found at start `--cgroup-scope` lets this observer adopt.
    scope_membership: ScopeMembership,
    /// Descriptors (`(tgid, fd)` and the connection they named) whose connection was already
    /// gone at the last reconciliation: removed at the next one if still so (`reconcile`).
    orphaned_descriptors: HashSet<(u32, u32, u64)>,
    /// Entries of `connections` and `packet_streams` whose socket is gone, their TCP_CLOSE
    /// never handled (a skipped run): found and removed by `reconcile`'s sweeps.
    stale_entries: StaleEntries,
    /// Ring records to events (kernel time to wall time, payloads into shared blocks).
    records: RecordConverter,
    /// The packet hook's records back in stream order (`None` with the syscall hook), the
    /// events it let go outside a drain, and a buffer reused by every drain.
    reorder: Option<Reorder>,
    released: Vec<Event>,
    reorder_scratch: Vec<Event>,
    /// How the syscall hook walks a call's buffers; `None` with the packet hook.
    copy_walk: Option<CopyWalk>,
    capture_hook: CaptureHook,
    /// Why this hook: the flag, or what `HookChoice::Auto` found.
    capture_hook_reason: String,
    state_tracepoint: StateTracepoint,
    log_task: tokio::task::JoinHandle<()>,
    /// The programs (`counters` asks the kernel what it counted of their runs). Last: they
    /// must outlive the maps and logger taken from them.
    ebpf: Ebpf,
}

impl Drop for KernelCapture {
    fn drop(&mut self) {
        self.log_task.abort();
    }
}

impl KernelCapture {
    /// Checks privileges and tracefs, loads the programs, configures and attaches them.
    /// Must run inside a tokio runtime (the ring buffer and the log reader are async).
    ///
    /// # Errors
    ///
    /// Fails with a [`CaptureError`] when the build has no programs, an option or directory is
    /// unusable, privileges or tracefs are missing, or the kernel refuses a program, map or
    /// tracepoint; under `auto`, a refused packet hook falls back to the syscall hook first.
    pub fn start(options: &CaptureOptions) -> Result<Self, CaptureError> {
        if !PROGRAMS_EMBEDDED {
            return Err(CaptureError::BuiltWithoutPrograms);
        }
        // User input first: a mistyped directory is named whatever else is missing.
        let scope = cgroup_scope::open(&options.cgroup_scope)?;
        let capabilities = host::Capabilities::effective();
        let chosen = hook_choice::choose(options.capture_hook, &options.cgroup_root, capabilities)?;
        let state = sock_layout::choose(options.state_tracepoint, Path::new(VMLINUX_BTF))?;
        let start_hook = |chosen| Self::start_hook(options, &scope, capabilities, chosen, state);
        match start_hook(chosen) {
            // A kernel whose verifier refuses the packet programs, or a cgroup root another
            // program holds exclusively: `auto` hooks the syscalls instead, and says why.
            Err(CaptureError::PacketHook(refusal)) if options.capture_hook == HookChoice::Auto => {
                let chosen = hook_choice::after_packet_hook_refusal(&refusal);
                tracing::warn!("{}; hooking the syscalls instead", chosen.reason);
                start_hook(chosen)
            }
            started => started,
        }
    }

    /// Starts the programs with the hook chosen. Everything it loaded and attached is released on
    /// failure.
    fn start_hook(
        options: &CaptureOptions,
        scope: &[std::fs::File],
        capabilities: host::Capabilities,
        chosen: hook_choice::ChosenHook,
        state: StateTracepoint,
    ) -> Result<Self, CaptureError> {
        let hook_choice::ChosenHook {
            hook: capture_hook,
            cgroup_root,
            reason: capture_hook_reason,
        } = chosen;
        host::check_privileges(capabilities, capture_hook)?;
        let tracepoints = capture_hook.tracepoints(state);
        if !tracepoints.is_empty() {
            host::ensure_tracefs()?;
            tracepoint_format::check(Path::new(TRACEFS), &tracepoints)?;
        }
        validate_options(options)?;
        let memlock_in_the_way = host::raise_memlock_limit();
        let mut ebpf = load(options, capture_hook, memlock_in_the_way)?;
        // Held until the programs are loaded (they load as they attach): a map taken out of the
        // object closes its fd when dropped, and a program loaded after that is refused with
        // "fd N is not pointing to valid bpf_map".
        let _configured = configure(&mut ebpf, options, scope, capture_hook, state)?;
        let maps = Maps::take(&mut ebpf, capture_hook)?;
        let copy_walk = match &cgroup_root {
            Some(root) => {
                programs::attach_packet_hook(&mut ebpf, root, state)
                    .map_err(|refusal| CaptureError::PacketHook(Box::new(refusal)))?;
                None
            }
            None => Some(programs::attach_syscall_hook(
                &mut ebpf,
                options.copy_walk,
                state,
            )?),
        };
        // Last: a task spawned before a failure above would go on reading a released map.
        let log_task = programs::spawn_kernel_log_reader(&mut ebpf)?;
        let Maps {
            ring,
            counters,
            connections,
            sockets,
            adoptable,
            packet_streams,
            watching,
            reader_awake,
        } = maps;
        Ok(Self {
            // SAFETY: the ring owns its map fd and keeps it open while the AsyncFd holds it.
            ring: unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
                .map_err(|err| CaptureError::Read(err.into()))?,
            counters,
            connections,
            packet_streams,
            sockets,
            watching,
            reader_awake,
            reader_stamped: false,
            adopted: std::collections::HashMap::new(),
            adoptable,
            handed_over: std::collections::HashMap::new(),
            scope_membership: ScopeMembership::new(
                cgroup_scope::hierarchy_path(&options.cgroup_root),
                scope,
            ),
            orphaned_descriptors: HashSet::new(),
            stale_entries: StaleEntries::new(stale_entries::sees_every_process()),
            records: RecordConverter::new(),
            reorder: (capture_hook == CaptureHook::Packets).then(Reorder::default),
            released: Vec::new(),
            reorder_scratch: Vec::new(),
            copy_walk,
            capture_hook,
            capture_hook_reason,
            state_tracepoint: state,
            log_task,
            ebpf,
        })
    }

    /// Says how this kernel walks a call's buffers: `CopyWalk::BpfLoop` or `CopyWalk::TailCalls`;
    /// `None` with the packet hook, which copies from packets.
    pub fn copy_walk(&self) -> Option<CopyWalk> {
        self.copy_walk
    }

    /// Returns the hook whose programs copy the watched bytes.
    pub fn capture_hook(&self) -> CaptureHook {
        self.capture_hook
    }

    /// Says which tracepoint tells the programs about TCP state changes.
    pub fn state_tracepoint(&self) -> StateTracepoint {
        self.state_tracepoint
    }

    /// Says why `capture_hook` was chosen: the flag that asked for it, or what `HookChoice::Auto`
    /// found.
    pub fn capture_hook_reason(&self) -> &str {
        &self.capture_hook_reason
    }

    /// Waits until the kernel has produced records, then converts up to one batch of them.
    ///
    /// # Errors
    ///
    /// Fails with [`CaptureError::Read`] when waiting for the ring buffer to become readable fails.
    pub async fn read_batch(&mut self, events: &mut Vec<Event>) -> Result<Drained, CaptureError> {
        let mut guard = self.ring.readable_mut().await?;
        let from = events.len();
        let drained = self.records.drain(guard.get_inner_mut(), events);
        // Records left behind keep the ring readable: the next call converts them at once
        // instead of waiting for a wakeup the programs may not send.
        if !drained.more {
            guard.clear_ready();
        }
        drop(guard);
        self.put_in_order(events, from);
        Ok(drained)
    }

    /// Passes the events from `from` on, with the packet hook, through `reorder` (records
    /// ahead of a gap wait for its fill), with those whose wait is over.
    fn put_in_order(&mut self, events: &mut Vec<Event>, from: usize) {
        let Some(reorder) = &mut self.reorder else {
            return;
        };
        let now_ns = monotonic_now_ns();
        let mut fresh = std::mem::take(&mut self.reorder_scratch);
        fresh.extend(events.drain(from..));
        events.append(&mut self.released);
        for event in fresh.drain(..) {
            reorder.push(event, now_ns, events);
        }
        reorder.expire(now_ns, events);
        self.reorder_scratch = fresh;
    }

    /// Releases, in order, the records still waiting for a gap to fill, as the capture ends.
    pub fn release_held(&mut self, events: &mut Vec<Event>) {
        events.append(&mut self.released);
        if let Some(reorder) = &mut self.reorder {
            reorder.release_all(events);
        }
    }

    /// Says whether records wait in userspace for a later drain: held for a gap to fill, or
    /// released by the reconciliation and not yet passed on.
    pub fn holds_records(&self) -> bool {
        !self.released.is_empty() || self.reorder.as_ref().is_some_and(Reorder::holds)
    }

    /// Returns what putting the packet hook's records in order did (`None` with the syscall hook).
    pub fn reorder_counters(&self) -> Option<ReorderCounters> {
        self.reorder.as_ref().map(Reorder::counters)
    }

    /// Tells the programs the reader polls the ring: it reads again within `follow_up`
    /// (`read_pacing`), so records need not wake it; they do once that is late by more than
    /// `read_pacing::awake_stamp` allows, or the ring fills.
    pub fn reader_polls(&mut self, follow_up: std::time::Duration) {
        self.reader_awake
            .stamp(read_pacing::awake_stamp(monotonic_now_ns(), follow_up));
        self.reader_stamped = true;
    }

    /// Tells the programs the reader now waits for a wakeup. False when it already did: then no
    /// record can have been made without waking it, and there is nothing to drain again.
    pub fn reader_waits(&mut self) -> bool {
        if !self.reader_stamped {
            return false;
        }
        self.reader_awake.stamp(0);
        self.reader_stamped = false;
        true
    }

    /// Converts up to one batch of the records already in the ring without waiting.
    pub fn drain(&mut self, events: &mut Vec<Event>) -> Drained {
        let from = events.len();
        let drained = self.records.drain(self.ring.get_mut(), events);
        self.put_in_order(events, from);
        drained
    }

    /// Watches the connections to watched ports that were established before the programs
    /// were attached (call once, right after `start`).
    ///
    /// With the syscall hook each one is watched at once through its descriptors, and gets an
    /// event (`TcpState` from `Unknown` to `Established`, under its adopted id) for the engine,
    /// which then decodes it as joined mid-stream. With the packet hook a gRPC connection is
    /// handed to the packet programs (`ADOPTABLE`), which watch it from its next packet and
    /// announce it then, under its socket's address; a WebSocket one, upgraded before the
    /// start, has nothing left to copy and gets its event at once, as with syscalls.
    pub fn adopt_established(&mut self, options: &CaptureOptions) -> Adoption {
        let (found, outside_scope) = adopt::find_established(
            &options.grpc_ports,
            &options.websocket_ports,
            &self.scope_membership,
        );
        let now_ns = self.records.clock.wall_ns(monotonic_now_ns());
        let mut adoption = Adoption {
            outside_scope,
            ..Adoption::default()
        };
        for connection in found {
            let adopted = if self.capture_hook == CaptureHook::Packets
                && connection.port_class == PortClass::Grpc
            {
                self.hand_to_packet_programs(&connection).map(|()| None)
            } else {
                self.adopt(&connection).map(Some)
            };
            match adopted {
                Ok(id) => {
                    match connection.port_class {
                        PortClass::Grpc => adoption.grpc += 1,
                        PortClass::WebSocket => adoption.websocket += 1,
                    }
                    if let Some(id) = id {
                        adoption.events.push(adopted_event(&connection, id, now_ns));
                    }
                }
                Err(reason) => tracing::warn!(
                    local = %connection.local,
                    remote = %connection.remote,
                    "could not adopt an existing connection: {reason}"
                ),
            }
        }
        adoption
    }

    fn adopt(&mut self, connection: &FoundConnection) -> Result<u64, MapError> {
        let id = adopted_connection_id(connection.inode);
        self.connections
            .insert(id, connection.kernel_connection(), 0)?;
        // The packet programs find connections by socket, not descriptor: the entry above is
        // all a WebSocket adopted for its close needs.
        if self.capture_hook == CaptureHook::Syscalls {
            let state = connection.socket_state(id);
            for key in connection.socket_keys() {
                // BPF_NOEXIST: a descriptor the programs saw meanwhile (closed and reused for
                // a new connection since the scan) keeps its own entry.
                if let Err(err) = self.sockets.insert(key, state, u64::from(BPF_NOEXIST)) {
                    tracing::debug!(
                        tgid = key.tgid,
                        fd = key.fd,
                        "descriptor not adopted: {err}"
                    );
                }
                // Without its mark the programs would not look the descriptor up at all.
                self.watching.set(watching_slot(key.tgid), 1, 0)?;
            }
        }
        self.adopted.insert(id, connection.descriptors.clone());
        Ok(id)
    }

    /// Names `connection` to the packet programs, which adopt it at its first packet.
    fn hand_to_packet_programs(&mut self, connection: &FoundConnection) -> Result<(), MapError> {
        let kernel = connection.kernel_connection();
        let tuple = ConnectionTuple {
            saddr: kernel.saddr,
            daddr: kernel.daddr,
            sport: kernel.sport,
            dport: kernel.dport,
            family: kernel.family,
            _reserved: 0,
        };
        self.adoptable.insert(tuple, kernel, 0)?;
        self.handed_over
            .insert(tuple, (connection.inode, connection.descriptors.clone()));
        Ok(())
    }

    /// Brings the programs' tables in line with the kernel's sockets, and returns the keys of
    /// `CONNECTIONS` and `PACKET_STREAMS` still alive: a tracked connection not among them is
    /// gone, whether or not its close reached userspace (a full ring drops records, never map
    /// updates).
    ///
    /// An adopted connection that none of its descriptors holds any more is removed (the
    /// programs only remove those they saw connecting), and so is every descriptor entry
    /// whose connection has been gone for a whole interval (a process that exits closes its
    /// descriptors without `close`). Not sooner: after a peer's reset (TCP_CLOSE removes the
    /// connection) the process still reads what arrived before it, and closes, through that
    /// descriptor; removed at once, a reconciliation in between lost that read, uncounted.
    pub fn reconcile(&mut self) -> HashSet<u64> {
        // Handed to the packet programs and ended before they saw a packet: nothing else would
        // remove them (the programs remove those they adopt).
        if !self.handed_over.is_empty() {
            let gone: Vec<ConnectionTuple> = self
                .handed_over
                .iter()
                .filter(|(_, (inode, descriptors))| !adopt::holds_socket(descriptors, *inode))
                .map(|(tuple, _)| *tuple)
                .collect();
            for tuple in gone {
                let _ = self.adoptable.remove(&tuple);
                self.handed_over.remove(&tuple);
            }
        }
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
        if self.stale_entries.due() {
            self.remove_stale_entries();
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
        let mut alive: HashSet<u64> = self.connections.keys().flatten().collect();
        if let Some(packet_streams) = &self.packet_streams {
            alive.extend(packet_streams.keys().flatten());
        }
        let mut orphaned = HashSet::new();
        for (key, sock) in descriptors {
            if alive.contains(&sock) {
                continue;
            }
            let descriptor = (key.tgid, key.fd, sock);
            if !self.orphaned_descriptors.contains(&descriptor) {
                orphaned.insert(descriptor);
                continue;
            }
            // Only while the descriptor still names that connection: closed and reused since
            // it was read, it belongs to a new one.
            if self
                .sockets
                .get(&key, 0)
                .is_ok_and(|state| state.sock == sock)
            {
                let _ = self.sockets.remove(&key);
            }
        }
        self.orphaned_descriptors = orphaned;
        if let Some(reorder) = &mut self.reorder {
            // Passed on with the next drain, before anything newer.
            reorder.retain(&alive, &mut self.released);
        }
        alive
    }

    /// Removes the entries of `CONNECTIONS` (but those adopted, which `reconcile` follows by
    /// their descriptors) and `PACKET_STREAMS` that no socket of the node has matched at two
    /// sweeps in a row (`stale_entries`); each only while it still holds the endpoints found.
    fn remove_stale_entries(&mut self) {
        let adopted = |key: &u64| key & observer_records::ADOPTED_CONNECTION_BIT != 0;
        let mut entries: Vec<(u64, EntryTuple)> = self
            .connections
            .iter()
            .flatten()
            .filter(|(key, _)| !adopted(key))
            .map(|(key, conn)| (key, EntryTuple::of(&conn)))
            .collect();
        if let Some(packet_streams) = &self.packet_streams {
            entries.extend(
                packet_streams
                    .iter()
                    .flatten()
                    .map(|(key, stream)| (key, EntryTuple::of(&stream.conn))),
            );
        }
        // Entries first, sockets second: a connection made in between has its socket read.
        let sockets = if entries.is_empty() {
            Vec::new()
        } else {
            table_sockets()
        };
        for (key, tuple) in self.stale_entries.sweep(entries, &sockets) {
            let removed = if self
                .connections
                .get(&key, 0)
                .is_ok_and(|conn| EntryTuple::of(&conn) == tuple)
            {
                self.connections.remove(&key).is_ok()
            } else if let Some(packet_streams) = &mut self.packet_streams
                && packet_streams
                    .get(&key, 0)
                    .is_ok_and(|stream| EntryTuple::of(&stream.conn) == tuple)
            {
                packet_streams.remove(&key).is_ok()
            } else {
                false
            };
            self.stale_entries.removed += u64::from(removed);
        }
    }

    /// Reads the kernel side's counters: the programs' own, summed over CPUs, and what the kernel
    /// counted of their runs.
    ///
    /// # Errors
    ///
    /// Fails with [`CaptureError::Setup`] when the `COUNTERS` map or a program's info cannot be
    /// read.
    pub fn counters(&self) -> Result<KernelCounters, CaptureError> {
        let mut totals = KernelCounters::default();
        totals.stale_entries_removed = self.stale_entries.removed;
        for counter in Counter::ALL {
            let per_cpu = self
                .counters
                .get(&(counter as u32), 0)
                .map_err(|err| CaptureError::Setup(format!("COUNTERS: {err}")))?;
            totals[counter] = per_cpu.iter().sum();
        }
        for (name, program) in self.ebpf.programs() {
            // The hook's own programs; the other hook's were never loaded and never run.
            let Ok(fd) = program.fd() else { continue };
            let runs = program_runs::program_runs(fd)
                .map_err(|err| CaptureError::Setup(format!("program {name}'s info: {err}")))?;
            if let Some(skipped) = runs.skipped {
                *totals.runs_skipped.get_or_insert(0) += skipped;
            }
            totals.runs_timed += runs.timed;
            totals.run_time_ns += runs.time_ns;
        }
        Ok(totals)
    }
}

/// Builds what the engine learns of an adopted connection: it exists, established, from now on.
fn adopted_event(connection: &FoundConnection, id: u64, ts_ns: u64) -> Event {
    let owner = connection.descriptors.first().map_or(0, |(tgid, _)| *tgid);
    Event {
        ts_ns,
        connection: id,
        pid: owner,
        comm: connection.comm.as_str().into(),
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
