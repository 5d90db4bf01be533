use super::*;

/// Each family's blocks, of sizes around mimalloc's small/medium boundary and beyond, come
/// back aligned as asked, hold what was written through a `realloc`, and free.
#[test]
fn blocks_are_aligned_as_asked_and_keep_their_bytes_through_realloc() {
    let allocator = Mimalloc;
    for align in [1, 2, 4, 8, 16, 64, 4096] {
        for size in [1, 7, 24, 1000, 1500, 5000, 70_000] {
            let layout = Layout::from_size_align(size, align).unwrap();
            // SAFETY: a non-zero size; the block is written within its size and freed once.
            unsafe {
                let block = allocator.alloc(layout);
                assert!(!block.is_null());
                assert_eq!(block as usize % align, 0, "size {size}, align {align}");
                block.write_bytes(0xA5, size);
                let grown = allocator.realloc(block, layout, size * 3);
                assert_eq!(grown as usize % align, 0, "grown {size}, align {align}");
                assert!((0..size).all(|index| *grown.add(index) == 0xA5));
                allocator.dealloc(grown, Layout::from_size_align(size * 3, align).unwrap());

                let zeroed = allocator.alloc_zeroed(layout);
                assert_eq!(zeroed as usize % align, 0);
                assert!((0..size).all(|index| *zeroed.add(index) == 0));
                allocator.dealloc(zeroed, layout);
            }
        }
    }
}
