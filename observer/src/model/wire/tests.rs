#[test]
fn utf8_reads_text_as_std_does() {
    let texts: [&[u8]; 7] = [
        b"",
        b"4360894025",
        b"\x00\x7f",
        "é€😀 user".as_bytes(),
        b"\xff",
        b"user\xc3",
        b"\xed\xa0\x80",
    ];
    for bytes in texts {
        assert_eq!(super::utf8(bytes), std::str::from_utf8(bytes), "{bytes:?}");
    }
}
