//! Huffman-coded strings decoded once per thread, not once per connection.
//!
//! OpenIM 3.5.1's push opens a connection for every call, so every call's header block starts
//! from an empty dynamic table: its `:path`, `:authority`, `content-type`, `user-agent` and `te`
//! come as Huffman-coded literals each time, the same bytes call after call, and so do the
//! gateway's answers. Under the lab's push flood, decoding them was 7% of the daemon's CPU and
//! the buffer each decode allocated 4% more. A small direct-mapped table keeps the last string
//! decoded into each slot: a repeat costs a hash and a comparison, and shares the decoded bytes.
//!
//! Only names, and the values of the protocol's own headers (`CACHED_VALUES`), are kept: any
//! other value (a token in metadata, an operation ID) could outlive its connection here.

use std::{cell::RefCell, hash::BuildHasher};

use bytes::Bytes;
use hashbrown::DefaultHashBuilder;

use super::{HpackError, huffman};

/// Slots of the table; a string's hash picks its slot, and a different string there replaces it.
const SLOTS: usize = 64;

/// Longer encoded strings are decoded every time: at most `SLOTS` × (64 bytes and their
/// decoding, at most 102) stay in memory.
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
    slots: Vec<Option<Slot>>,
}

thread_local! {
    static CACHE: RefCell<StringCache> = RefCell::new(StringCache {
        hasher: DefaultHashBuilder::default(),
        slots: (0..SLOTS).map(|_| None).collect(),
    });
}

/// `encoded`, Huffman-decoded: from the table when the same bytes were decoded last in their
/// slot, else decoded and kept there. A string that fails to decode is not kept.
pub(super) fn decode(encoded: &[u8]) -> Result<Bytes, HpackError> {
    if encoded.len() > MAX_ENCODED_LEN {
        return decode_fresh(encoded);
    }
    CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        let slot = cache.hasher.hash_one(encoded) as usize % SLOTS;
        if let Some(kept) = &cache.slots[slot]
            && *kept.encoded == *encoded
        {
            return Ok(kept.decoded.clone());
        }
        let decoded = decode_fresh(encoded)?;
        cache.slots[slot] = Some(Slot {
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
    fn strings_sharing_a_slot_each_decode_to_their_own_bytes() {
        // More strings than slots: every slot is replaced at least once.
        let texts: Vec<String> = (0..SLOTS * 3).map(|n| format!("value-{n}")).collect();
        for _ in 0..2 {
            for text in &texts {
                let decoded = decode(&huffman::encode(text.as_bytes())).unwrap();
                assert_eq!(&decoded[..], text.as_bytes());
            }
        }
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
