use super::*;

/// A BTF built by hand: `struct outer { int a; union { struct { char pad; int b; }; }; int
/// c:3; char d[6]; }` with `typedef int myint` for `a`.
fn sample() -> Vec<u8> {
    let strings = b"\0outer\0a\0b\0c\0d\0int\0char\0myint\0pad\0";
    let name = |text: &str| {
        let needle = [b"\0", text.as_bytes(), b"\0"].concat();
        strings
            .windows(needle.len())
            .position(|window| window == needle.as_slice())
            .map(|at| at as u32 + 1)
            .unwrap()
    };
    let info = |kind: u32, vlen: u32, flag: bool| (kind << 24) | vlen | (u32::from(flag) << 31);
    let mut types: Vec<u32> = Vec::new();
    // 1: int (4 bytes), 2: char (1 byte)
    types.extend([name("int"), info(KIND_INT, 0, false), 4, 32]);
    types.extend([name("char"), info(KIND_INT, 0, false), 1, 8]);
    // 3: typedef int myint
    types.extend([name("myint"), info(KIND_TYPEDEF, 0, false), 1]);
    // 4: anonymous struct { char pad; int b; }
    types.extend([0, info(KIND_STRUCT, 2, false), 8]);
    types.extend([name("pad"), 2, 0, name("b"), 1, 32]);
    // 5: anonymous union holding 4
    types.extend([0, info(KIND_UNION, 1, false), 8]);
    types.extend([0, 4, 0]);
    // 6: char[6]
    types.extend([0, info(KIND_ARRAY, 0, false), 0, 2, 1, 6]);
    // 7: struct outer, with bitfield offsets (kind flag)
    types.extend([name("outer"), info(KIND_STRUCT, 4, true), 24]);
    types.extend([name("a"), 3, 0]);
    types.extend([0, 5, 32]);
    types.extend([name("c"), 1, (3 << 24) | 96]);
    types.extend([name("d"), 6, 104]);
    let types: Vec<u8> = types.iter().flat_map(|word| word.to_ne_bytes()).collect();
    let mut bytes = Vec::new();
    bytes.extend(MAGIC.to_ne_bytes());
    bytes.extend([1, 0]);
    for word in [24, 0, types.len() as u32, types.len() as u32] {
        bytes.extend(word.to_ne_bytes());
    }
    bytes.extend((strings.len() as u32).to_ne_bytes());
    bytes.extend(types);
    bytes.extend(strings);
    bytes
}

#[test]
fn members_are_found_through_anonymous_unions_and_structs() {
    let bytes = sample();
    let btf = Btf::parse(&bytes).unwrap();
    let outer = btf.struct_named("outer").unwrap();
    assert_eq!(outer, 7);
    let b = btf.member(outer, "b").unwrap();
    assert_eq!((b.type_id, b.bit_offset, b.bitfield_bits), (1, 64, 0));
    let a = btf.member(outer, "a").unwrap();
    assert_eq!((a.bit_offset, btf.size_of(a.type_id).unwrap()), (0, 4));
    let c = btf.member(outer, "c").unwrap();
    assert_eq!((c.bit_offset, c.bitfield_bits), (96, 3));
    let d = btf.member(outer, "d").unwrap();
    assert_eq!((d.bit_offset / 8, btf.size_of(d.type_id).unwrap()), (13, 6));
    assert_eq!(btf.member(outer, "missing"), None);
    assert_eq!(btf.member(outer, "a.b"), None, "an int has no members");
    assert_eq!(btf.struct_named("int"), None, "not a struct");
}

#[test]
fn damaged_btf_is_an_error_not_a_panic() {
    let bytes = sample();
    assert_eq!(
        Btf::parse(&bytes[..bytes.len() - 3]).err(),
        Some(BtfError::Truncated("its string section"))
    );
    for cut in 0..bytes.len() {
        let _ = Btf::parse(&bytes[..cut]);
    }
    let mut swapped = bytes.clone();
    swapped.swap(0, 1);
    assert!(matches!(Btf::parse(&swapped), Err(BtfError::BadMagic(_))));
    // A member whose type points past the table.
    let mut dangling = bytes;
    let at = HEADER_LEN + 4 * (4 + 4 + 3 + 3 + 6 + 3 + 3 + 6 + 3) + 4;
    dangling[at..at + 4].copy_from_slice(&99u32.to_ne_bytes());
    let btf = Btf::parse(&dangling).unwrap();
    let a = btf.member(7, "a").unwrap();
    assert_eq!(btf.size_of(a.type_id), Err(BtfError::NoSuchType(99)));
}

#[test]
fn a_cycle_of_anonymous_members_ends_in_not_found() {
    let mut bytes = sample();
    // The union's one anonymous member (type 4) made the union itself (type 5).
    let at = HEADER_LEN + 4 * (4 + 4 + 3 + 3 + 6 + 3 + 1);
    assert_eq!(bytes[at..at + 4], 4u32.to_ne_bytes());
    bytes[at..at + 4].copy_from_slice(&5u32.to_ne_bytes());
    let btf = Btf::parse(&bytes).unwrap();
    assert_eq!(btf.member(7, "b"), None);
    assert!(btf.member(7, "d").is_some());
}
