//! Provides the binary's global allocator: mimalloc, called the way its C API is fastest.
//!
//! The `mimalloc` crate passes every Rust allocation to `mi_malloc_aligned`, whose fast path
//! covers blocks up to 1 KiB only. A larger block whose size class is not a power of two is
//! then over-allocated by its alignment, through a slower path, and its page marked as holding
//! interior pointers, which every later free of that page pays for (3% of the engine's
//! instructions on its worst-case bench). Every mimalloc block is aligned to a machine word
//! (its size classes are word multiples), so a layout that asks for no more than that goes to
//! the plain `mi_malloc` family, and only a larger alignment (hash tables' 16-byte groups) to
//! the aligned one.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as ffi;

/// Names the alignment every mimalloc block has.
const WORD: usize = std::mem::size_of::<usize>();

/// Allocates through mimalloc, with the plain `mi_malloc` family for word-aligned layouts.
pub struct Mimalloc;

// SAFETY: every block comes from mimalloc and goes back to it (`mi_free` takes blocks of either
// family); the plain family is used only for alignments its blocks always satisfy.
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: plain C calls; a null result is the allocation failure `GlobalAlloc` expects.
        unsafe {
            if layout.align() <= WORD {
                ffi::mi_malloc(layout.size()).cast()
            } else {
                ffi::mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe {
            if layout.align() <= WORD {
                ffi::mi_zalloc(layout.size()).cast()
            } else {
                ffi::mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (the caller's contract).
        unsafe { ffi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout` (the caller's contract); the new
        // block keeps the alignment `layout` asked for.
        unsafe {
            if layout.align() <= WORD {
                ffi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                ffi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

#[cfg(test)]
mod tests;
