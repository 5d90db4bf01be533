//! Decodes Huffman-coded strings once per thread, not once per connection.
//!
//! OpenIM 3.5.1's push opens a connection for every call, so every call's header block starts
//! from an empty dynamic table: its `:path`, `:authority`, `content-type`, `user-agent` and `te`
//! come as Huffman-coded literals each time, the same bytes call after call, and so do the
//! gateway's answers. Under the lab's push flood, decoding them was 7% of the daemon's CPU and
//! the buffer each decode allocated 4% more. A small table keeps the strings decoded last: a
//! repeat costs a hash and a few comparisons, and shares the decoded bytes.
//!
//! The table is set-associative: a string's hash picks a set of `WAYS` slots, and a new string
//! replaces the one in its set used least recently. With a direct-mapped table (one slot a
//! hash), two strings of every call that hashed to one slot took it from each other call after
//! call: which ones depends on the hasher's seed, drawn per process, and in one run under the
//! lab's push flood `te` and the `grpc-status` value `0` did, and so did the `:authority` of two
//! gateways, so that 2.8 strings a push were decoded (and allocated) afresh instead of none.
//!
//! Only names, and the values of the protocol's own headers (`CACHED_VALUES`), are kept: any
//! other value (a token in metadata, an operation ID) could outlive its connection here.

use std::{cell::RefCell, hash::BuildHasher};

use bytes::Bytes;
use hashbrown::DefaultHashBuilder;

use super::{HpackError, huffman};

/// Counts the sets of the table; a string's hash picks its set.
const SETS: usize = 32;

/// Counts the slots of a set: strings whose hashes share a set stay side by side up to this many.
const WAYS: usize = 4;

/// Bounds the encoded strings kept: longer ones are decoded every time: at most `SETS` × `WAYS` ×
/// (64 bytes and their decoding, at most 102) stay in memory, 21 KiB.
const MAX_ENCODED_LEN: usize = 64;

/// Names the headers whose values are kept: the ones gRPC and HTTP/2 themselves send, which name no
/// one.
const CACHED_VALUES: [&[u8]; 12] = [
    b":authority",
    b":method",
    b":path",
    b":scheme",
    b":status",
    b"accept-encoding",
    b"content-type",
    b"grpc-accept-encoding",
    b"grpc-encoding",
    b"grpc-status",
    b"te",
    b"user-agent",
];

/// Says whether the value of header `name` may be kept in the table.
pub(super) fn value_cacheable(name: &[u8]) -> bool {
    CACHED_VALUES.contains(&name)
}

struct Slot {
    encoded: Box<[u8]>,
    decoded: Bytes,
}

/// Holds the strings kept, by set. Not `Debug`, as the dynamic tables: whatever a slot holds stays
/// inside the process.
struct StringCache {
    hasher: DefaultHashBuilder,
    /// Each set's slots, the one used last first.
    sets: Vec<[Option<Slot>; WAYS]>,
}

impl StringCache {
    fn set_of(&self, encoded: &[u8]) -> usize {
        self.hasher.hash_one(encoded) as usize % SETS
    }
}

thread_local! {
    static CACHE: RefCell<StringCache> = RefCell::new(StringCache {
        hasher: DefaultHashBuilder::default(),
        sets: (0..SETS).map(|_| Default::default()).collect(),
    });
}

/// Huffman-decodes `encoded`: from the table when the same bytes are among the strings kept in
/// their set, else decoded and kept there in place of the one used least recently. A string
/// that fails to decode is not kept.
///
/// # Errors
///
/// Fails with [`HpackError::InvalidHuffman`] when `encoded` is not a valid Huffman code (it is not
/// kept then).
pub(super) fn decode(encoded: &[u8]) -> Result<Bytes, HpackError> {
    if encoded.len() > MAX_ENCODED_LEN {
        return decode_fresh(encoded);
    }
    CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        let set_index = cache.set_of(encoded);
        let set = &mut cache.sets[set_index];
        let kept = set.iter().enumerate().find_map(|(way, slot)| {
            let kept = slot.as_ref().filter(|kept| *kept.encoded == *encoded)?;
            Some((way, kept.decoded.clone()))
        });
        if let Some((way, decoded)) = kept {
            // Used now: first in its set.
            set[..=way].rotate_right(1);
            return Ok(decoded);
        }
        let decoded = decode_fresh(encoded)?;
        // The least recently used slot, last, comes first and takes the new string.
        set.rotate_right(1);
        set[0] = Some(Slot {
            encoded: encoded.into(),
            decoded: decoded.clone(),
        });
        Ok(decoded)
    })
}

/// Huffman-decodes `encoded` into a buffer of its own.
///
/// # Errors
///
/// Fails with [`HpackError::InvalidHuffman`] when `encoded` is not a valid Huffman code.
pub(super) fn decode_fresh(encoded: &[u8]) -> Result<Bytes, HpackError> {
    let mut decoded = Vec::with_capacity(encoded.len() * 8 / 5);
    huffman::decode(encoded, &mut decoded)?;
    Ok(Bytes::from(decoded))
}

#[cfg(test)]
mod tests;
