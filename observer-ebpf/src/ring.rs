//! Sends records to userspace: builds a record's header and puts records on the `EVENTS` ring.

use aya_ebpf::helpers::{bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_ktime_get_ns};
use observer_records::{Counter, DataRecord, RecordHeader, RecordKind};

use crate::maps::{CONFIG, Connection, EVENTS, READER_AWAKE, count};

// bpf_ringbuf_query / bpf_ringbuf_output flags (uapi/linux/bpf.h).
const BPF_RB_AVAIL_DATA: u64 = 0;
const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;

/// Holds the time of a data record, read when first needed and then kept: a gRPC direction's budget
/// (`io::draw_grpc_budget`) and the record's header get the same instant from one helper call (they
/// made two), and a segment or call the policy copies nothing of (WebSocket chat) none.
pub struct RecordTime(Option<u64>);

impl RecordTime {
    /// Returns a time not read yet.
    pub const fn unread() -> Self {
        Self(None)
    }

    /// Returns the time, reading it at the first call.
    pub fn now(&mut self) -> u64 {
        *self.0.get_or_insert_with(|| unsafe { bpf_ktime_get_ns() })
    }
}

/// Returns a record's header stamped now.
pub fn header_for(kind: RecordKind, sock: u64, conn: &Connection) -> RecordHeader {
    header_at(kind, sock, conn, unsafe { bpf_ktime_get_ns() })
}

/// Returns a record's header stamped `ts_ns`.
pub fn header_at(kind: RecordKind, sock: u64, conn: &Connection, ts_ns: u64) -> RecordHeader {
    RecordHeader {
        ts_ns,
        sock,
        cgroup_id: conn.cgroup_id,
        offset: 0,
        call_len: 0,
        tgid: conn.tgid,
        len: 0,
        old_state: 0,
        new_state: 0,
        sport: conn.sport,
        dport: conn.dport,
        family: conn.family,
        kind: kind as u8,
        direction: 0,
        flags: 0,
        port_class: conn.port_class,
        _reserved: [0; 6],
        saddr: conn.saddr,
        daddr: conn.daddr,
        comm: conn.comm,
    }
}

/// Stamps `header` with the calling process: records made in a syscall name the calling process,
/// which may differ from the connecting one (a forked child, a descriptor passed over a unix
/// socket).
pub fn stamp_current(header: &mut RecordHeader, pid_tgid: u64) {
    header.tgid = (pid_tgid >> 32) as u32;
    header.cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    if let Ok(comm) = bpf_get_current_comm() {
        header.comm = comm;
    }
}

/// Puts a header-only record on the ring, counting it in `RingFullDrops` when the ring is full.
pub fn output_header(header: &RecordHeader) {
    if EVENTS
        .output::<RecordHeader>(header, wakeup_flags(header.ts_ns))
        .is_err()
    {
        count(Counter::RingFullDrops, 1);
    }
}

/// Puts a data record, its header and `len` payload bytes, on the ring, counting it in
/// `RingFullDrops` when the ring is full.
pub fn output_data(record: &DataRecord) {
    let size = core::mem::size_of::<RecordHeader>() + record.header.len as usize;
    if size > core::mem::size_of::<DataRecord>() {
        return;
    }
    // SAFETY: `size` is within the record (checked above), which lives in the scratch map.
    let bytes =
        unsafe { core::slice::from_raw_parts((record as *const DataRecord).cast::<u8>(), size) };
    if EVENTS
        .output::<[u8]>(bytes, wakeup_flags(record.header.ts_ns))
        .is_err()
    {
        count(Counter::RingFullDrops, 1);
    }
}

/// Wakes the reader only once enough bytes wait, or when it was not known to be reading for
/// long enough (`CaptureConfig::wakeup_bytes`, `wakeup_after_ns`); `now_ns` is the record's
/// time.
fn wakeup_flags(now_ns: u64) -> u64 {
    let (threshold, wakeup_after_ns) = match CONFIG.get(0) {
        Some(config) => (u64::from(config.wakeup_bytes), config.wakeup_after_ns),
        None => (0, 0),
    };
    let Some(reader_awake) = READER_AWAKE.get_ptr_mut(0) else {
        return BPF_RB_FORCE_WAKEUP;
    };
    // SAFETY: the map's one slot; a racing write from another CPU only costs a second wakeup.
    // Saturating: a record stamped before another CPU's wakeup is not due.
    let due = now_ns.saturating_sub(unsafe { *reader_awake }) >= wakeup_after_ns;
    if due || EVENTS.query(BPF_RB_AVAIL_DATA) >= threshold {
        // SAFETY: as above.
        unsafe { *reader_awake = now_ns };
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}
