//! Runs the copy walk: the bytes of one syscall from user memory to the ring, in bounded steps.
//!
//! A call passes one plain buffer or an array of up to `IOV_MAX` iovec entries. The walk fills
//! `CHUNK_SIZE` records from consecutive entries (gRPC C-core's 9-byte frame headers share a
//! record with the payloads after them) and sends each record when it is full or when the call's
//! bytes end. A step loads the next entry and copies what fits of it, or sends a full record and
//! continues in the same entry, so `MAX_COPY_STEPS` steps follow any call to its end. The walk's
//! state lives in per-CPU map memory (`COPY`, `SCRATCH`), which lets it be driven two ways:
//!
//! - `bpf_loop` (Linux 5.17+): one helper call runs the steps (`walk_with_loop`). The verifier
//!   checks one step, not `MAX_COPY_STEPS` of them.
//! - older kernels: a program runs `STEPS_PER_PROGRAM` steps, then tail-calls `copy_continue`,
//!   which runs as many more and tail-calls itself (`walk_bounded`). The kernel allows 32 chained
//!   tail calls (33 from 5.17), so 33 programs of 40 steps cover `MAX_COPY_STEPS` (1057).
//!
//! Userspace loads the `bpf_loop` exit program and falls back to the bounded one when the
//! verifier refuses it (`observer/src/capture/programs.rs`, `CopyWalk`).
//!
//! Verifier: with the walk's state in registers, every iteration forked the paths of the
//! previous one (min of two unknowns, error exits, …) and the verifier gave up at "processed
//! 1000001 insns (limit 1000000)". The state therefore lives in map memory, read and written with
//! volatile accesses so LLVM cannot keep it in registers: the verifier does not track map
//! contents, so the paths of one step converge at the loop head and are pruned, and the cost of
//! the bounded walk grows linearly with `STEPS_PER_PROGRAM`.

use aya_ebpf::{
    helpers::generated::{bpf_loop, bpf_probe_read_user as probe_read_user_raw},
    macros::tracepoint,
    programs::TracePointContext,
};
use observer_records::{
    CHUNK_SIZE, Counter, FLAG_TRUNCATED, MAX_CHUNKS_PER_CALL, MAX_COPY_STEPS, RecordHeader,
};

use crate::{
    copy_state::{CopyState, IOVEC_BATCH, Iovec, Walk},
    maps::{BUFFER_PLAIN, COPY, COPY_CONTINUE, COPY_PROGRAMS, ChunkBuffer, IoCall, SCRATCH, count},
    ring::output_data,
};

/// Counts the steps one program of the bounded walk runs before it tail-calls the next: the bound
/// of the copy loop that Linux 6.1's verifier accepted before this walk (40 steps).
const STEPS_PER_PROGRAM: u32 = 40;

/// Counts the programs of the bounded walk: the exit program and the 32 tail calls every kernel
/// allows.
const BOUNDED_PROGRAMS: u32 = 33;

const _: () = assert!(STEPS_PER_PROGRAM * BOUNDED_PROGRAMS >= MAX_COPY_STEPS);

/// Marks a walk over one plain buffer; these are `Walk::flags`.
const COPY_PLAIN: u64 = 1;
const COPY_TRUNCATED: u64 = 2;
const COPY_UNREADABLE: u64 = 4;

/// Returns this CPU's walk state and record buffer.
fn walk_maps() -> Option<(&'static mut CopyState, &'static mut ChunkBuffer)> {
    let (state, buffer) = (COPY.get_ptr_mut(0)?, SCRATCH.get_ptr_mut(0)?);
    // SAFETY: this CPU's entries; a program and its tail calls run to completion on their CPU,
    // and no other program of ours uses them.
    Some(unsafe { (&mut *state, &mut *buffer) })
}

/// Prepares the walk over the first `capture` bytes of `call`, whose records start from
/// `header`; returns whether there is anything to copy.
pub fn begin(call: &IoCall, header: RecordHeader, capture: u64, truncated: bool) -> bool {
    let Some((state, buffer)) = walk_maps() else {
        return false;
    };
    let limit = MAX_CHUNKS_PER_CALL as u64 * CHUNK_SIZE as u64;
    let (capture, truncated) = if capture > limit {
        count(Counter::CallsCutAtChunkLimit, 1);
        count(Counter::BytesNotCaptured, capture - limit);
        (limit, true)
    } else {
        (capture, truncated)
    };
    buffer.record.header = header;
    let plain = call.layout == BUFFER_PLAIN;
    let mut flags = 0;
    if plain {
        flags |= COPY_PLAIN;
    }
    if truncated {
        flags |= COPY_TRUNCATED;
    }
    state.walk.store(Walk {
        buffers: call.buffers,
        iovec_count: if plain { 0 } else { call.count },
        next_iovec: 0,
        base: if plain { call.buffers } else { 0 },
        left: if plain { call.count } else { 0 },
        remaining: capture,
        offset: header.offset,
        fill: 0,
        flags,
        // Past any entry: the first step reads a batch.
        batch_start: u64::MAX - IOVEC_BATCH,
    });
    capture > 0
}

/// Runs the walk in one `bpf_loop` call (Linux 5.17+).
pub fn walk_with_loop() {
    // SAFETY: `loop_step` has the callback signature `bpf_loop` expects, and uses no context.
    unsafe {
        bpf_loop(
            MAX_COPY_STEPS,
            loop_step as *mut core::ffi::c_void,
            core::ptr::null_mut(),
            0,
        )
    };
    finish();
}

/// Takes one step as `bpf_loop`'s callback: 0 continues, 1 stops. Private, hence static linkage in
/// BTF, which the verifier requires of a callback ("callback function not static").
extern "C" fn loop_step(_index: u64, _context: *mut core::ffi::c_void) -> i64 {
    let Some((state, buffer)) = walk_maps() else {
        return 1;
    };
    if step(state, buffer) { 0 } else { 1 }
}

/// Runs `STEPS_PER_PROGRAM` steps, then goes on in `copy_continue` (kernels without `bpf_loop`).
///
/// Returns an integer, always 0: with BTF, the verifier refuses a tail call in a function that
/// does not ("tail_call is only allowed in functions that return 'int'", Linux 6.x).
pub fn walk_bounded(ctx: &TracePointContext) -> i64 {
    let Some((state, buffer)) = walk_maps() else {
        return 0;
    };
    for _ in 0..STEPS_PER_PROGRAM {
        if !step(state, buffer) {
            finish();
            return 0;
        }
    }
    // SAFETY: `ctx` is this program's context; on success the call does not return.
    unsafe { COPY_PROGRAMS.tail_call(ctx, COPY_CONTINUE) };
    // The tail call failed: the kernel's limit of chained calls (never reached within
    // `MAX_COPY_STEPS`), or the slot is empty.
    finish();
    0
}

/// Continues the bounded walk, with the same tracepoint context and the walk's state in `COPY`.
#[tracepoint]
pub fn copy_continue(ctx: TracePointContext) -> u32 {
    let _ = walk_bounded(&ctx);
    0
}

/// Takes one step: loads the next iovec entry when the current one is used up, copies what fits of
/// it into the record, and sends the record once full or once the call's bytes end. Returns whether
/// there is more to do.
fn step(state: &mut CopyState, buffer: &mut ChunkBuffer) -> bool {
    let mut walk = state.walk.load();
    if walk.remaining == 0 {
        return false;
    }
    if walk.left == 0 {
        if walk.flags & COPY_PLAIN != 0 || walk.next_iovec >= walk.iovec_count {
            // Fewer bytes in the entries than the call moved: the array changed under the call.
            walk.flags |= COPY_UNREADABLE;
            state.walk.store(walk);
            return false;
        }
        if walk.next_iovec.wrapping_sub(walk.batch_start) >= IOVEC_BATCH
            && !read_batch(state, &mut walk)
        {
            count(Counter::UserReadFailures, 1);
            walk.flags |= COPY_UNREADABLE;
            state.walk.store(walk);
            return false;
        }
        let iovec = state.batch[((walk.next_iovec - walk.batch_start) % IOVEC_BATCH) as usize];
        walk.next_iovec += 1;
        walk.base = iovec.base;
        walk.left = iovec.len;
    }
    // Below `CHUNK_SIZE`: a full record is sent before the step ends. The mask says so to the
    // verifier, which then bounds the destination below (`ChunkBuffer::slack`).
    let fill = walk.fill & (CHUNK_SIZE as u64 - 1);
    let wanted = walk.left.min(walk.remaining).min(CHUNK_SIZE as u64 - fill);
    if wanted > 0 {
        // Bound the size again on the very register the helper receives (a no-op after the
        // `min`): otherwise LLVM may pass a copy whose range the verifier no longer knows
        // ("R2 unbounded memory access").
        //
        // Linux 6.1's verifier learns nothing from comparing two registers, so it cannot
        // bound `min(left, CHUNK_SIZE - fill)`; LLVM, which can, drops the mask and the test
        // below as redundant, and 6.1 then refuses the call ("R2 min value is negative, either
        // use unsigned or 'var &= const'"). The volatile read hides the value from LLVM, so
        // the mask and the constant test stay. Only an upper bound: `len == 0 || len > N`
        // becomes one unsigned test of `len - 1`, on another register. A zero size is valid
        // for the helper, and `wanted > 0` here anyway.
        // SAFETY: a read of a local.
        let opaque = unsafe { core::ptr::read_volatile(&wanted) };
        let len = (opaque as u32) & (2 * CHUNK_SIZE as u32 - 1);
        if len > CHUNK_SIZE as u32 {
            return false;
        }
        let destination = buffer
            .record
            .payload
            .as_mut_ptr()
            .wrapping_add(fill as usize);
        let read = unsafe {
            probe_read_user_raw(
                destination.cast(),
                len,
                walk.base as *const core::ffi::c_void,
            )
        };
        if read != 0 {
            count(Counter::UserReadFailures, 1);
            walk.flags |= COPY_UNREADABLE;
            state.walk.store(walk);
            return false;
        }
        walk.fill = fill + u64::from(len);
        walk.left -= u64::from(len);
        walk.remaining -= u64::from(len);
        walk.base += u64::from(len);
    }
    if walk.fill >= CHUNK_SIZE as u64 || (walk.remaining == 0 && walk.fill > 0) {
        let truncated = walk.remaining == 0 && walk.flags & COPY_TRUNCATED != 0;
        send(buffer, &mut walk, truncated);
    }
    state.walk.store(walk);
    walk.remaining > 0
}

/// Reads the batch of iovec entries that starts at `walk.next_iovec`; false if unreadable.
fn read_batch(state: &mut CopyState, walk: &mut Walk) -> bool {
    let entries = walk
        .iovec_count
        .saturating_sub(walk.next_iovec)
        .min(IOVEC_BATCH);
    let size = core::mem::size_of::<Iovec>() as u32;
    // Masked for the verifier, as the copy's length below: 1 to IOVEC_BATCH entries.
    if entries == 0 {
        return false;
    }
    // An upper bound only, as in `step` (Linux 6.1's verifier).
    let bytes = (entries as u32 * size) & (2 * IOVEC_BATCH as u32 * size - 1);
    if bytes > IOVEC_BATCH as u32 * size {
        return false;
    }
    let first = walk.buffers + walk.next_iovec * u64::from(size);
    let read = unsafe {
        probe_read_user_raw(
            state.batch.as_mut_ptr().cast(),
            bytes,
            first as *const core::ffi::c_void,
        )
    };
    walk.batch_start = walk.next_iovec;
    read == 0
}

/// Sends the record filled so far and starts the next one after it.
fn send(buffer: &mut ChunkBuffer, walk: &mut Walk, truncated: bool) {
    buffer.record.header.len = (walk.fill as u32) & (2 * CHUNK_SIZE as u32 - 1);
    buffer.record.header.offset = walk.offset;
    buffer.record.header.flags = if truncated { FLAG_TRUNCATED } else { 0 };
    output_data(&buffer.record);
    walk.offset += walk.fill;
    walk.fill = 0;
}

/// Ends the walk: a walk cut short sends what it filled (marked truncated) and counts the rest
/// by cause; the gap shows in the next record's offset.
fn finish() {
    let Some((state, buffer)) = walk_maps() else {
        return;
    };
    let mut walk = state.walk.load();
    if walk.remaining == 0 {
        return;
    }
    if walk.fill > 0 {
        send(buffer, &mut walk, true);
    }
    let cause = if walk.flags & COPY_UNREADABLE != 0 {
        Counter::CallsCutUnreadable
    } else {
        Counter::CallsCutAtStepLimit
    };
    count(cause, 1);
    count(Counter::BytesNotCaptured, walk.remaining);
    walk.remaining = 0;
    state.walk.store(walk);
}
