//! Finds the bytes a JSON string cannot hold as they are: `"`, `\` and the control characters below
//! 0x20. Found sixteen at a time, for the alert writer (does a string need escaping?) and the
//! recording reader (where does a plain string end?): scanned a word or a byte at a time, that
//! search was the bulk of what either spent on a line's strings.

/// Returns a mask with bit `i` set where byte `i` of `block` is one a JSON string cannot hold as it
/// is: on x86_64 one SSE2 comparison of each kind (SSE2 is part of its baseline).
#[cfg(target_arch = "x86_64")]
pub fn special_bytes(block: &[u8; 16]) -> u32 {
    use std::arch::x86_64::{
        _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8,
    };
    // SAFETY: SSE2 is part of x86_64's baseline, which every build for this target has, and the
    // unaligned load reads exactly the sixteen bytes of `block`.
    let mask = unsafe {
        let bytes = _mm_loadu_si128(block.as_ptr().cast());
        // Unsigned: a byte is below 0x20 where the smaller of it and 0x1f is itself.
        let control = _mm_cmpeq_epi8(_mm_min_epu8(bytes, _mm_set1_epi8(0x1f)), bytes);
        let quote = _mm_cmpeq_epi8(bytes, _mm_set1_epi8(b'"' as i8));
        let backslash = _mm_cmpeq_epi8(bytes, _mm_set1_epi8(b'\\' as i8));
        _mm_movemask_epi8(_mm_or_si128(control, _mm_or_si128(quote, backslash)))
    };
    mask as u32
}

#[cfg(not(target_arch = "x86_64"))]
pub use special_bytes_one_by_one as special_bytes;

/// Computes the same a byte at a time, where SSE2 is not there; the tests hold the two to each
/// other.
#[cfg(any(test, not(target_arch = "x86_64")))]
pub fn special_bytes_one_by_one(block: &[u8; 16]) -> u32 {
    block
        .iter()
        .enumerate()
        .filter(|&(_, &byte)| is_special(byte))
        .fold(0, |mask, (index, _)| mask | 1 << index)
}

/// Says whether `byte` is one a JSON string cannot hold as it is.
pub fn is_special(byte: u8) -> bool {
    byte < 0x20 || byte == b'"' || byte == b'\\'
}

/// Returns where the first special byte of `bytes` is, if any.
pub fn first_special(bytes: &[u8]) -> Option<usize> {
    let (blocks, tail) = bytes.as_chunks::<16>();
    for (index, block) in blocks.iter().enumerate() {
        let mask = special_bytes(block);
        if mask != 0 {
            return Some(index * 16 + mask.trailing_zeros() as usize);
        }
    }
    let start = blocks.len() * 16;
    tail.iter()
        .position(|&byte| is_special(byte))
        .map(|offset| start + offset)
}

#[cfg(test)]
mod tests;
