//! Huffman-coded strings decoded once per thread, not once per connection.
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

/// Sets of the table; a string's hash picks its set.
const SETS: usize = 32;

/// Slots of a set: strings whose hashes share a set stay side by side up to this many.
const WAYS: usize = 4;

/// Longer encoded strings are decoded every time: at most `SETS` × `WAYS` × (64 bytes and their
/// decoding, at most 102) stay in memory, 21 KiB.
const MAX_ENCODED_LEN: usize = 64;

/// Headers whose values are kept: the ones gRPC and HTTP/2 themselves send, which name no one.
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

/// Whether the value of header `name` may be kept in the table.
pub(super) fn value_cacheable(name: &[u8]) -> bool {
    CACHED_VALUES.contains(&name)
}

struct Slot {
    encoded: Box<[u8]>,
    decoded: Bytes,
}

/// Not `Debug`, as the dynamic tables: whatever a slot holds stays inside the process.
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

/// `encoded`, Huffman-decoded: from the table when the same bytes are among the strings kept in
/// their set, else decoded and kept there in place of the one used least recently. A string
/// that fails to decode is not kept.
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

/// `encoded`, Huffman-decoded into a buffer of its own.
pub(super) fn decode_fresh(encoded: &[u8]) -> Result<Bytes, HpackError> {
    let mut decoded = Vec::with_capacity(encoded.len() * 8 / 5);
    huffman::decode(encoded, &mut decoded)?;
    Ok(Bytes::from(decoded))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_string_shares_its_first_decoding() {
        let encoded =
            huffman::encode(b"/OpenIMServer.msggateway.msgGateway/SuperGroupOnlineBatchPushOneMsg");
        assert!(encoded.len() <= MAX_ENCODED_LEN);
        let first = decode(&encoded).unwrap();
        let again = decode(&encoded).unwrap();
        assert_eq!(
            &first[..],
            b"/OpenIMServer.msggateway.msgGateway/SuperGroupOnlineBatchPushOneMsg"
        );
        assert_eq!(first, again);
        assert_eq!(first.as_ptr(), again.as_ptr(), "the same bytes, not a copy");
    }

    #[test]
    fn strings_sharing_a_set_each_decode_to_their_own_bytes() {
        // More strings than slots: every slot is replaced at least once.
        let texts: Vec<String> = (0..SETS * WAYS * 3).map(|n| format!("value-{n}")).collect();
        for _ in 0..2 {
            for text in &texts {
                let decoded = decode(&huffman::encode(text.as_bytes())).unwrap();
                assert_eq!(&decoded[..], text.as_bytes());
            }
        }
    }

    /// As many strings as a set has slots, all hashed to one set and used in turn, call after
    /// call: each stays kept, and is decoded once.
    #[test]
    fn strings_of_one_set_used_in_turn_keep_their_slots() {
        let set_of = |encoded: &[u8]| CACHE.with(|cache| cache.borrow().set_of(encoded));
        let first = huffman::encode(b"value-0");
        let same_set: Vec<Vec<u8>> = (0..)
            .map(|n| huffman::encode(format!("value-{n}").as_bytes()))
            .filter(|encoded| set_of(encoded) == set_of(&first))
            .take(WAYS)
            .collect();
        let decoded: Vec<Bytes> = same_set
            .iter()
            .map(|encoded| decode(encoded).unwrap())
            .collect();
        for _ in 0..3 {
            for (encoded, first_decoding) in same_set.iter().zip(&decoded) {
                let again = decode(encoded).unwrap();
                assert_eq!(
                    again.as_ptr(),
                    first_decoding.as_ptr(),
                    "kept, not decoded again"
                );
            }
        }
        // One more string of that set takes the slot of the one used least recently.
        let newcomer = (WAYS..)
            .map(|n| huffman::encode(format!("value-{n}").as_bytes()))
            .find(|encoded| set_of(encoded) == set_of(&first) && !same_set.contains(encoded))
            .unwrap();
        decode(&newcomer).unwrap();
        let evicted = decode(&same_set[0]).unwrap();
        assert_ne!(evicted.as_ptr(), decoded[0].as_ptr(), "decoded again");
        let kept = decode(&same_set[WAYS - 1]).unwrap();
        assert_eq!(kept.as_ptr(), decoded[WAYS - 1].as_ptr());
    }

    #[test]
    fn a_long_string_is_decoded_every_time_and_a_bad_one_is_not_kept() {
        let long = "x".repeat(200);
        let encoded = huffman::encode(long.as_bytes());
        assert!(encoded.len() > MAX_ENCODED_LEN);
        let first = decode(&encoded).unwrap();
        let again = decode(&encoded).unwrap();
        assert_eq!(&first[..], long.as_bytes());
        assert_ne!(first.as_ptr(), again.as_ptr());
        // All ones is EOS, which RFC 7541 forbids inside a string.
        let invalid = [0xff, 0xff, 0xff, 0xff];
        assert_eq!(decode(&invalid), Err(HpackError::InvalidHuffman));
        assert_eq!(decode(&invalid), Err(HpackError::InvalidHuffman));
    }

    #[test]
    fn only_the_protocols_own_values_are_kept() {
        assert!(value_cacheable(b":path"));
        assert!(value_cacheable(b"content-type"));
        assert!(!value_cacheable(b"authorization"));
        assert!(!value_cacheable(b"token"));
        assert!(!value_cacheable(b"operationid"));
    }
}
