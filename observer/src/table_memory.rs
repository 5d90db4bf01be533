//! Where the engine's largest tables keep their buckets: memory the kernel may back with 2 MiB
//! pages. Judging a push call looks every recipient up in the placements and fold tables,
//! tens of megabytes each with 100,000 users, at addresses no two lookups share: with 4 KiB
//! pages nearly every lookup also misses the TLB, and the page walk delays even the prefetch
//! that was meant to hide the miss. A 2 MiB page covers 512 times as much (the worst-case engine
//! bench: events/s ×1.05–×1.07 with these two tables on huge pages, ×1.07 with the host's huge
//! pages on for the whole process).
//!
//! Only blocks of at least one huge page are mapped this way, aligned to one and advised with
//! `MADV_HUGEPAGE` (honoured where the host's `transparent_hugepage` is `madvise` or `always`,
//! ignored under `never`); smaller ones, a table's first growth steps, come from the global
//! allocator as before. The rest of the process keeps 4 KiB pages, so what it hands back to
//! the node stays fine-grained.

use std::{alloc::Layout, ptr::NonNull};

use allocator_api2::alloc::{AllocError, Allocator, Global};

/// The transparent huge page size on x86_64 and arm64 (with 4 KiB base pages).
const HUGE_PAGE: usize = 2 << 20;

/// An allocator for a table's bucket array (`hashbrown::HashTable::new_in`).
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
mod tests {
    use std::hash::BuildHasher;

    use hashbrown::{DefaultHashBuilder, HashTable};

    use super::*;

    /// Small blocks come from the global allocator, large ones from their own mapping aligned
    /// to a huge page; both hold what is written and go back where they came from.
    #[test]
    fn large_blocks_are_huge_page_aligned_and_small_ones_are_not_mapped() {
        for (size, align) in [(24, 8), (4096, 16), (HUGE_PAGE - 1, 16), (HUGE_PAGE, 16)] {
            let layout = Layout::from_size_align(size, align).unwrap();
            let block = HugePageTables.allocate(layout).unwrap();
            let start = block.cast::<u8>().as_ptr();
            assert!(block.len() >= size);
            assert_eq!(start as usize % align, 0);
            if size >= HUGE_PAGE {
                assert_eq!(start as usize % HUGE_PAGE, 0);
            }
            // SAFETY: within the block, which is freed once with its own layout.
            unsafe {
                start.write_bytes(0xA5, size);
                assert_eq!(*start.add(size - 1), 0xA5);
                HugePageTables.deallocate(block.cast(), layout);
            }
        }
        let odd = Layout::from_size_align(3 * HUGE_PAGE + 5, 64).unwrap();
        let block = HugePageTables.allocate(odd).unwrap();
        assert_eq!(block.len(), 4 * HUGE_PAGE);
        // SAFETY: as above.
        unsafe { HugePageTables.deallocate(block.cast(), odd) };
    }

    /// A table grows from the global allocator's blocks into mapped ones and keeps its entries.
    #[test]
    fn a_table_grows_across_the_threshold_and_keeps_its_entries() {
        let hasher = DefaultHashBuilder::default();
        let mut table = HashTable::new_in(HugePageTables);
        for value in 0..200_000u64 {
            table.insert_unique(hasher.hash_one(value), value, |value| {
                hasher.hash_one(value)
            });
        }
        assert_eq!(table.len(), 200_000);
        assert!((0..200_000u64).all(|value| {
            table
                .find(hasher.hash_one(value), |found| *found == value)
                .is_some()
        }));
    }
}
