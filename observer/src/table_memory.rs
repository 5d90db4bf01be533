//! Allocates where the engine's largest tables keep their buckets: memory the kernel may back with
//! 2 MiB pages. Judging a push call looks every recipient up in the placements and fold tables,
//! tens of megabytes each with 100,000 users, at addresses no two lookups share: with 4 KiB pages
//! nearly every lookup also misses the TLB, and the page walk delays even the prefetch that was
//! meant to hide the miss. A 2 MiB page covers 512 times as much (the worst-case engine bench:
//! events/s ×1.05–×1.07 with these two tables on huge pages, ×1.07 with the host's huge pages on
//! for the whole process).
//!
//! Only blocks of at least one huge page are mapped this way, aligned to one and advised with
//! `MADV_HUGEPAGE` (honoured where the host's `transparent_hugepage` is `madvise` or `always`,
//! ignored under `never`); smaller ones, a table's first growth steps, come from the global
//! allocator as before. The rest of the process keeps 4 KiB pages, so what it hands back to
//! the node stays fine-grained.

use std::{alloc::Layout, ptr::NonNull};

use allocator_api2::alloc::{AllocError, Allocator, Global};

/// Names the transparent huge page size on x86_64 and arm64 (with 4 KiB base pages).
const HUGE_PAGE: usize = 2 << 20;

/// Allocates a table's bucket array (`hashbrown::HashTable::new_in`).
#[derive(Clone, Copy, Debug, Default)]
pub struct HugePageTables;

impl HugePageTables {
    fn is_huge(layout: Layout) -> bool {
        layout.size() >= HUGE_PAGE && layout.align() <= HUGE_PAGE
    }
}

// SAFETY: a block of `is_huge` size is an anonymous mapping of its size rounded up to whole
// huge pages, valid until `deallocate` unmaps exactly that; every other block is the global
// allocator's, allocated and freed with the same layout. `is_huge` depends on the layout alone,
// which `deallocate` gets exactly as `allocate` did, so each block goes back where it came from.
unsafe impl Allocator for HugePageTables {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if !Self::is_huge(layout) {
            return Global.allocate(layout);
        }
        let size = layout.size().next_multiple_of(HUGE_PAGE);
        // One huge page more than asked, so that a 2 MiB-aligned stretch of `size` lies
        // within; the parts before and after it are unmapped again.
        let mapped = size + HUGE_PAGE;
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing.
        let start = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if start == libc::MAP_FAILED {
            return Err(AllocError);
        }
        let start = start.cast::<u8>();
        let head = start.align_offset(HUGE_PAGE);
        let tail = mapped - head - size;
        // SAFETY: both stretches lie within the mapping just made and outside the block kept;
        // `madvise` only advises on the block. A failed advice is harmless: the block is then
        // backed by small pages, as any other memory.
        let block = unsafe {
            let block = start.add(head);
            if head > 0 {
                libc::munmap(start.cast(), head);
            }
            if tail > 0 {
                libc::munmap(block.add(size).cast(), tail);
            }
            libc::madvise(block.cast(), size, libc::MADV_HUGEPAGE);
            block
        };
        let block = NonNull::new(block).ok_or(AllocError)?;
        Ok(NonNull::slice_from_raw_parts(block, size))
    }

    unsafe fn deallocate(&self, block: NonNull<u8>, layout: Layout) {
        if !Self::is_huge(layout) {
            // SAFETY: the global allocator's block, with the layout it was allocated with.
            unsafe { Global.deallocate(block, layout) };
            return;
        }
        let size = layout.size().next_multiple_of(HUGE_PAGE);
        // SAFETY: exactly the stretch `allocate` kept mapped for this layout.
        unsafe { libc::munmap(block.as_ptr().cast(), size) };
    }
}

#[cfg(test)]
mod tests;
