//! The copy loop: the bytes of one syscall from user memory to the ring, in bounded steps.

use aya_ebpf::helpers::{
    bpf_probe_read_user, generated::bpf_probe_read_user as probe_read_user_raw,
};
use observer_records::{
    CHUNK_SIZE, Counter, FLAG_TRUNCATED, MAX_CHUNKS_PER_CALL, MAX_IOVECS, RecordHeader,
};

use crate::{
    maps::{BUFFER_PLAIN, CURSOR, IoCall, SCRATCH, count},
    ring::output_data,
};

/// Where `copy_out` is: the current user buffer, bytes left in it, bytes left to capture,
/// the next iovec entry and the stream offset of the next chunk.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CopyCursor {
    base: u64,
    left: u64,
    remaining: u64,
    next_iovec: u64,
    offset: u64,
}

impl CopyCursor {
    fn load(&self) -> Self {
        // SAFETY: `self` is a valid, aligned map value. Volatile: see `copy_out`.
        unsafe { core::ptr::read_volatile(self) }
    }

    fn store(&mut self, value: Self) {
        // SAFETY: as in `load`.
        unsafe { core::ptr::write_volatile(self, value) }
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Iovec {
    base: u64,
    len: u64,
}

/// Copies the first `capture` bytes of the call's buffers to the ring, `CHUNK_SIZE` at a time.
///
/// One bounded loop walks both the iovec array and the chunks inside each entry: a step either
/// loads the next iovec or emits one chunk.
///
/// Verifier: with the walk's state (`CopyCursor`) in registers, every iteration forked the
/// paths of the previous one (min of two unknowns, error exits, …) and the verifier gave up at
/// "processed 1000001 insns (limit 1000000)". The state therefore lives in per-CPU map memory,
/// read and written with volatile accesses so LLVM cannot keep it in registers: the verifier
/// does not track map contents, so the paths of one iteration converge at the loop head and
/// are pruned, and the cost grows linearly with the bound.
pub fn copy_out(call: &IoCall, header: RecordHeader, capture: u64, truncated: bool) {
    let (Some(scratch), Some(cursor)) = (SCRATCH.get_ptr_mut(0), CURSOR.get_ptr_mut(0)) else {
        return;
    };
    // SAFETY: this CPU's entries; a program runs to completion on its CPU, and no other
    // program of ours uses them.
    let (scratch, cursor) = unsafe { (&mut *scratch, &mut *cursor) };
    scratch.header = header;
    let plain = call.layout == BUFFER_PLAIN;
    cursor.store(CopyCursor {
        base: if plain { call.buffers } else { 0 },
        left: if plain { call.count } else { 0 },
        remaining: capture,
        next_iovec: 0,
        offset: header.offset,
    });
    let iovec_count = call.count.min(MAX_IOVECS as u64);

    for _ in 0..(MAX_CHUNKS_PER_CALL + MAX_IOVECS) {
        let mut step = cursor.load();
        if step.remaining == 0 {
            break;
        }
        if step.left == 0 {
            if plain || step.next_iovec >= iovec_count {
                break;
            }
            let entry = call.buffers + step.next_iovec * core::mem::size_of::<Iovec>() as u64;
            let Ok(iovec) = (unsafe { bpf_probe_read_user(entry as *const Iovec) }) else {
                count(Counter::UserReadFailures, 1);
                break;
            };
            step.next_iovec += 1;
            step.base = iovec.base;
            step.left = iovec.len;
            cursor.store(step);
            continue;
        }
        let wanted = step.left.min(step.remaining).min(CHUNK_SIZE as u64);
        // Bound the size again on the very register the helper receives (a no-op after the
        // `min`): otherwise LLVM may pass a copy whose range the verifier no longer knows
        // ("R2 unbounded memory access").
        let len = (wanted as u32) & (2 * CHUNK_SIZE as u32 - 1);
        if len == 0 || len > CHUNK_SIZE as u32 {
            break;
        }
        let read = unsafe {
            probe_read_user_raw(
                scratch.payload.as_mut_ptr().cast(),
                len,
                step.base as *const core::ffi::c_void,
            )
        };
        if read != 0 {
            count(Counter::UserReadFailures, 1);
            break;
        }
        step.remaining -= u64::from(len);
        step.left -= u64::from(len);
        step.base += u64::from(len);
        scratch.header.len = len;
        scratch.header.offset = step.offset;
        scratch.header.flags = if truncated && step.remaining == 0 {
            FLAG_TRUNCATED
        } else {
            0
        };
        step.offset += u64::from(len);
        cursor.store(step);
        output_data(scratch);
    }
    let left_over = cursor.load().remaining;
    if left_over > 0 {
        // Past the chunk or iovec bound, or unreadable: the gap shows in the next offset.
        count(Counter::BytesNotCaptured, left_over);
    }
}
