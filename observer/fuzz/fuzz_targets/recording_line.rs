//! A recording's lines as `observer replay` reads them: its plain reader (serde-free, for lines
//! as the observer writes them) answers every line exactly as serde_json alone does.
#![no_main]

use libfuzzer_sys::fuzz_target;
use observer::capture::recording::{from_json_line, from_json_line_by_serde};

fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    let text = |result: Result<_, observer::capture::recording::RecordingError>| {
        result.map_err(|err| err.to_string())
    };
    assert_eq!(
        text(from_json_line(line, 1)),
        text(from_json_line_by_serde(line, 1)),
        "{line}"
    );
});
