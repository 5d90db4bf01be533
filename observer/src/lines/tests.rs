use super::*;

#[test]
fn lines_within_the_bound_come_out_numbered() {
    let lines: Vec<_> = BoundedLines::new(&b"ab\n\ncde\r\nlast"[..], 4)
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        lines,
        [
            (1, "ab".to_owned()),
            (2, String::new()),
            (3, "cde\r".to_owned()),
            (4, "last".to_owned())
        ]
    );
}

#[test]
fn a_longer_line_is_an_error_without_reading_it_all() {
    let endless = io::BufReader::new(io::repeat(0));
    let mut lines = BoundedLines::new(endless, 1024);
    let error = lines.next().unwrap().unwrap_err();
    assert_eq!(error.to_string(), "line 1 is longer than 1024 bytes");
}
