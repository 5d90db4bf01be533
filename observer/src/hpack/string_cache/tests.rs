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
