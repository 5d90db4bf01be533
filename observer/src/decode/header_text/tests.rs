use super::*;

#[test]
fn text_shares_its_bytes_and_repairs_what_is_not_utf8() {
    let value = Bytes::from_static(b"gw-0.gw-headless:88");
    let text = HeaderText::new(&value);
    assert_eq!(&*text, "gw-0.gw-headless:88");
    assert_eq!(text.as_ptr(), value.as_ptr(), "shared, not copied");
    let invalid = Bytes::from_static(b"gw-\xff:88");
    assert_eq!(&*HeaderText::new(&invalid), "gw-\u{fffd}:88");
}
