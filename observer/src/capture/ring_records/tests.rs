use super::*;

/// Payloads share a block until it is full; a record larger than a block gets one of its
/// exact size; a block lives as long as a payload in it, or the arena still fills it.
#[test]
fn payloads_share_blocks_and_a_large_one_gets_its_own() {
    let mut arena = PayloadArena::default();
    let first = arena.copy(b"first").freeze();
    let mut second = arena.copy(b"second");
    // Written in place (credential redaction), then frozen: the first is untouched.
    second[0] = b'S';
    let second = second.freeze();
    assert_eq!((&first[..], &second[..]), (&b"first"[..], &b"Second"[..]));
    drop(second);
    assert!(!first.is_unique(), "the arena still fills the first block");
    let large = arena.copy(&vec![7; PAYLOAD_BLOCK_BYTES + 1]).freeze();
    assert_eq!(large.len(), PAYLOAD_BLOCK_BYTES + 1);
    assert!(first.is_unique(), "the arena moved on to the large block");
    let next = arena.copy(b"next").freeze();
    assert!(
        large.is_unique(),
        "the large block was full: the next payload is elsewhere"
    );
    assert_eq!(&next[..], b"next");
}

#[test]
fn an_ipv4_mapped_address_is_one_ipv4_identity() {
    let mut mapped = [0u8; 16];
    mapped[10..12].copy_from_slice(&[0xff, 0xff]);
    mapped[12..].copy_from_slice(&[127, 0, 10, 2]);
    assert_eq!(
        ip_from_kernel(AF_INET6, &mapped),
        IpAddr::V4(Ipv4Addr::new(127, 0, 10, 2))
    );
    let mut v4 = [0u8; 16];
    v4[..4].copy_from_slice(&[127, 0, 10, 2]);
    assert_eq!(
        ip_from_kernel(observer_records::AF_INET, &v4),
        ip_from_kernel(AF_INET6, &mapped)
    );
    let loopback = Ipv6Addr::LOCALHOST.octets();
    assert_eq!(
        ip_from_kernel(AF_INET6, &loopback),
        IpAddr::V6(Ipv6Addr::LOCALHOST)
    );
}

/// The kernel's `comm` is 16 bytes, NUL-terminated unless full, and whatever bytes the
/// process named itself with: text up to the NUL, invalid UTF-8 repaired.
#[test]
fn a_process_name_ends_at_its_nul_and_is_repaired_when_not_utf8() {
    let mut comm = [0u8; 16];
    comm[..11].copy_from_slice(b"openim-push");
    assert_eq!(comm_text(&comm), "openim-push");
    assert_eq!(comm_text(b"sixteen-bytes-xy"), "sixteen-bytes-xy");
    comm[3] = 0xff;
    assert_eq!(comm_text(&comm), "ope\u{fffd}im-push");
}
