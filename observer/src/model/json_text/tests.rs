use super::*;

/// Every byte at every position: the SSE2 mask and the one-by-one mask agree, and the first
/// special byte is found past whole blocks and in the tail.
#[test]
fn special_bytes_are_found_wherever_they_are() {
    for byte in 0..=u8::MAX {
        for position in 0..16 {
            let mut block = [b'a'; 16];
            block[position] = byte;
            let expected = if is_special(byte) { 1 << position } else { 0 };
            assert_eq!(special_bytes(&block), expected, "{byte:#x} at {position}");
            assert_eq!(special_bytes_one_by_one(&block), expected);
        }
        for length in 1..40 {
            for position in 0..length {
                let mut text = vec![b'a'; length];
                text[position] = byte;
                let expected = is_special(byte).then_some(position);
                assert_eq!(first_special(&text), expected, "{byte:#x} at {position}");
            }
        }
    }
    assert_eq!(first_special(b"ab\"c\\"), Some(2));
    assert_eq!(first_special(b""), None);
}
