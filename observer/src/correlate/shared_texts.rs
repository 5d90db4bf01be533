//! Shares the texts that every connection of a cluster repeats (the gateways' member strings, the
//! push methods' names), held once.
//!
//! Each upgrade and each push call used to hold its own copy, so two placements on one gateway
//! named it with two allocations. An alert line finds the JSON of a gateway it wrote before by
//! comparing gateways, and two copies are compared byte by byte: for a fold window's summary,
//! written a minute after its call, that read the call's copy cold from memory, a cache miss in
//! every line. One copy per text compares by its pointer, and costs no allocation per call.

use std::sync::Arc;

use hashbrown::HashSet;

/// Bounds the distinct texts held. A cluster has a few gateways under each ring's spelling and a
/// few push methods; anything past this (a client sending arbitrary `Host` headers) gets its own
/// copy, as before, without growing the table.
const MAX_TEXTS: usize = 1024;

/// Bounds a held text's bytes: the longest member string, a DNS name (at most 253 bytes) with
/// `:port`, fits; a longer text is not held, so the table stays within `MAX_TEXTS * MAX_TEXT_BYTES`
/// (260 KiB) of text.
const MAX_TEXT_BYTES: usize = 260;

/// Holds the texts shared, one copy each.
#[derive(Debug, Default)]
pub struct SharedTexts {
    texts: HashSet<Arc<str>>,
}

impl SharedTexts {
    /// Returns `text` as the copy every caller asking for the same text gets.
    pub fn share(&mut self, text: &str) -> Arc<str> {
        if let Some(held) = self.texts.get(text) {
            return held.clone();
        }
        let copy: Arc<str> = text.into();
        if self.texts.len() < MAX_TEXTS && text.len() <= MAX_TEXT_BYTES {
            self.texts.insert(copy.clone());
        }
        copy
    }
}

#[cfg(test)]
mod tests;
