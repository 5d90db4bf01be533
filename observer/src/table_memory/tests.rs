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
