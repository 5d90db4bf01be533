//! Writes alert lines as the daemon prints them. A `route_mismatch` is written here field by field,
//! with the JSON of the gateways and processes it names, and the diagnosis's words for each
//! gateway, kept from the lines before; every other kind, and those values the first time, go
//! through `Serialize` (`json`).
//!
//! Under a misrouting nearly every line is a `route_mismatch`, about 1.3 KB that named the same
//! few gateways and processes as the line before, and writing the lines was half of what the
//! engine spent: some 12,900 instructions a line through `Serialize` (sixty-odd strings, each a
//! call and an escape check; the `#[serde(flatten)]` envelope as a map). `Serialize` stays what
//! every line is held to: the tests and the engine fuzz target compare this writer's lines
//! with serde_json's, byte for byte.

use std::io::{self, Write};

use serde::Serialize;

use super::{Alert, AlertBody, GatewayInfo, PlacementInfo, ProcessInfo, PushInfo};
use super::{RouteMismatch, json};
use crate::model::{Gateway, MessageIds, Rfc3339};
use crate::openim::diagnosis::{DiagnosisPart, GatewayInWords};

/// Writes alert lines, remembering the JSON of the gateways and processes recent lines named.
#[derive(Default)]
pub struct LineWriter {
    line: Vec<u8>,
    gateways: Fragments<GatewayInfo>,
    processes: Fragments<ProcessInfo>,
    /// How the diagnosis names each gateway, escaped.
    gateways_in_words: Fragments<Gateway>,
}

impl LineWriter {
    /// Writes `alert`'s line, newline included, into `out` in one write.
    ///
    /// # Errors
    ///
    /// Fails when writing to `out` fails.
    pub fn write(&mut self, alert: &Alert, out: &mut impl Write) -> io::Result<()> {
        self.fill(alert);
        self.line.push(b'\n');
        out.write_all(&self.line)
    }

    /// Returns `alert`'s line without its newline.
    pub fn line(&mut self, alert: &Alert) -> &str {
        self.fill(alert);
        std::str::from_utf8(&self.line).expect("JSON from UTF-8 strings is UTF-8")
    }

    fn fill(&mut self, alert: &Alert) {
        self.line.clear();
        self.line.reserve(LINE_CAPACITY);
        match &*alert.body {
            AlertBody::RouteMismatch(mismatch) => self.route_mismatch(alert, mismatch),
            _ => json::append(&mut self.line, alert).expect("an alert's map keys are strings"),
        }
    }

    /// Writes a `route_mismatch` line in the order `Serialize` writes: the envelope's first fields,
    /// the body's (after its `kind`), the envelope's `node`.
    fn route_mismatch(&mut self, alert: &Alert, mismatch: &RouteMismatch) {
        self.raw(b"{\"schema_version\":");
        self.integer(alert.schema_version);
        self.raw(b",\"ts\":");
        self.time(alert.ts_ns);
        self.raw(b",\"kind\":\"route_mismatch\",\"user\":");
        self.string(&mismatch.user);
        self.raw(b",\"placed_on\":[");
        for (index, placement) in mismatch.placed_on.iter().enumerate() {
            if index > 0 {
                self.raw(b",");
            }
            self.placement(placement);
        }
        self.raw(b"],\"pushed_to\":");
        self.push(&mismatch.pushed_to);
        self.raw(b",\"count\":");
        self.integer(mismatch.count);
        self.raw(b",\"window_secs\":");
        self.integer(mismatch.window_secs);
        self.raw(b",\"cause\":\"");
        self.raw(mismatch.cause.name().as_bytes());
        self.raw(b"\",\"diagnosis\":\"");
        let line = &mut self.line;
        let gateways_in_words = &mut self.gateways_in_words;
        let written: Result<(), std::convert::Infallible> =
            mismatch.diagnosis_parts().write_parts(|part| {
                match part {
                    DiagnosisPart::Words(words) => line.extend_from_slice(words.as_bytes()),
                    DiagnosisPart::Quoted(text) => json::push_escaped(line, text),
                    DiagnosisPart::Gateway(gateway) => {
                        gateways_in_words.append(line, gateway, |line, gateway| {
                            // Text into a Vec: nothing here can fail.
                            let _ = json::push_display_escaped(line, &GatewayInWords(gateway));
                        });
                    }
                }
                Ok(())
            });
        let Ok(()) = written;
        self.raw(b"\"");
        self.optional_node(alert.node.as_deref());
        self.raw(b"}");
    }

    fn placement(&mut self, placement: &PlacementInfo) {
        self.raw(b"{\"gateway\":");
        self.gateways
            .append(&mut self.line, &placement.gateway, append_json);
        self.raw(b",\"platforms\":[");
        for (index, &platform) in placement.platforms.iter().enumerate() {
            if index > 0 {
                self.raw(b",");
            }
            self.integer(platform);
        }
        self.raw(b"],\"since\":");
        self.time(placement.since_ns);
        self.raw(b",\"proxy\":");
        self.processes
            .append(&mut self.line, &placement.proxy, append_json);
        self.optional_node(placement.node.as_deref());
        self.raw(b"}");
    }

    fn push(&mut self, push: &PushInfo) {
        self.raw(b"{\"gateway\":");
        self.gateways
            .append(&mut self.line, &push.gateway, append_json);
        self.raw(b",\"method\":");
        self.string(&push.method);
        self.raw(b",\"message\":");
        self.message(&push.message);
        self.raw(b",\"pusher\":");
        self.processes
            .append(&mut self.line, &push.pusher, append_json);
        self.raw(b",\"answer\":");
        self.value(&push.answer);
        if !push.answer_platforms.is_empty() {
            self.raw(b",\"answer_platforms\":");
            self.value(&push.answer_platforms);
        }
        self.optional_node(push.node.as_deref());
        self.raw(b"}");
    }

    /// Writes the message's ids present, in `MessageIds`' order.
    fn message(&mut self, message: &MessageIds) {
        self.raw(b"{");
        let mut separator = b"".as_slice();
        if let Some(id) = &message.client_msg_id {
            self.raw(separator);
            self.raw(b"\"client_msg_id\":");
            self.string(id);
            separator = b",";
        }
        if let Some(id) = &message.server_msg_id {
            self.raw(separator);
            self.raw(b"\"server_msg_id\":");
            self.string(id);
            separator = b",";
        }
        if let Some(seq) = message.seq {
            self.raw(separator);
            self.raw(b"\"seq\":");
            self.integer(seq);
            separator = b",";
        }
        if let Some(session_type) = message.session_type {
            self.raw(separator);
            self.raw(b"\"session_type\":");
            self.integer(session_type);
        }
        self.raw(b"}");
    }

    fn optional_node(&mut self, node: Option<&str>) {
        if let Some(node) = node {
            self.raw(b",\"node\":");
            self.string(node);
        }
    }

    fn raw(&mut self, json: &[u8]) {
        self.line.extend_from_slice(json);
    }

    fn string(&mut self, text: &str) {
        json::write_escaped(&mut self.line, text);
    }

    fn integer(&mut self, value: impl itoa::Integer) {
        self.raw(itoa::Buffer::new().format(value).as_bytes());
    }

    fn time(&mut self, ts_ns: u64) {
        self.raw(b"\"");
        self.raw(Rfc3339::new(ts_ns).as_str().as_bytes());
        self.raw(b"\"");
    }

    fn value(&mut self, value: &impl Serialize) {
        append_json(&mut self.line, value);
    }
}

fn append_json(line: &mut Vec<u8>, value: &impl Serialize) {
    json::append(line, value).expect("alert fields have string keys");
}

/// Bounds the room for a `route_mismatch` line (about 1.3 KB with Kubernetes member names) without
/// growing.
const LINE_CAPACITY: usize = 2048;

/// Keeps the JSON of values recent lines named, found again by equality: writing a gateway afresh
/// cost about 1,100 instructions, comparing a kept one a few dozen. Holds at most
/// `FRAGMENTS_KEPT` (a cluster's gateways under both rings' spellings, its pushers and
/// proxies), replacing the oldest beyond that.
struct Fragments<T> {
    kept: Vec<(T, Box<[u8]>)>,
    oldest: usize,
}

const FRAGMENTS_KEPT: usize = 32;

impl<T> Default for Fragments<T> {
    fn default() -> Self {
        Self {
            kept: Vec::new(),
            oldest: 0,
        }
    }
}

impl<T: PartialEq + Clone> Fragments<T> {
    /// Appends what `write` appends for `value`, written afresh only when not kept.
    fn append(&mut self, line: &mut Vec<u8>, value: &T, write: impl FnOnce(&mut Vec<u8>, &T)) {
        if let Some((_, json)) = self.kept.iter().find(|(kept, _)| kept == value) {
            line.extend_from_slice(json);
            return;
        }
        let start = line.len();
        write(line, value);
        let fragment = (value.clone(), line[start..].into());
        if self.kept.len() < FRAGMENTS_KEPT {
            self.kept.push(fragment);
        } else {
            self.kept[self.oldest] = fragment;
            self.oldest = (self.oldest + 1) % FRAGMENTS_KEPT;
        }
    }
}
