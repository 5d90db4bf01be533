use super::*;

#[test]
fn cpio_entries_are_newc_and_aligned() {
    let mut archive = Cpio::default();
    archive.file("init", 0o755, b"#!/bin/sh\n");
    let bytes = archive.finish();
    assert!(bytes.starts_with(b"070701"));
    assert_eq!(bytes.len() % 4, 0);
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("init\0"));
    assert!(text.contains("TRAILER!!!\0"));
}

#[test]
fn firmware_screen_controls_are_stripped() {
    assert_eq!(
        strip_terminal_controls("\u{1b}c\u{1b}[?7l\u{1b}[2JSeaBIOS\r"),
        "SeaBIOS"
    );
}
