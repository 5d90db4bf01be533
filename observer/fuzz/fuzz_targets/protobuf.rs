//! The push messages, complete and as captured prefixes, over arbitrary bytes.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use observer::decode::protobuf::{
    PushMethod, decode_request, decode_request_prefix, decode_response, decode_response_prefix,
};

fuzz_target!(|data: &[u8]| {
    let data = Bytes::copy_from_slice(data);
    for method in [PushMethod::Batch, PushMethod::Single] {
        let complete = decode_request(method, data.clone());
        let prefix = decode_request_prefix(method, data.clone());
        // A whole message read as a prefix knows no recipient the whole message lacks.
        if let (Ok(complete), Ok(prefix)) = (complete, prefix) {
            assert!(complete.recipients.starts_with(&prefix.recipients));
        }
        let _ = decode_response(method, data.clone());
        let _ = decode_response_prefix(method, data.clone());
    }
});
