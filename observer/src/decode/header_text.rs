//! Holds a header value as text that shares the decoded header's bytes.

use std::{fmt, ops::Deref};

use bytes::Bytes;

use crate::model::wire;

/// Holds a header field's value as text in the bytes HPACK decoded it into: a call's `:path`
/// and `:authority` come from the string cache or the connection's table, so keeping them
/// costs no copy. As `String`s they were four allocations a call (each copied once for the
/// stream and once for its fact), a fifth of the daemon's allocations under the lab's push
/// flood. Not UTF-8, the value is repaired (as `String::from_utf8_lossy`) into a copy.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct HeaderText(Bytes);

impl HeaderText {
    /// Keeps `value` as text: shared when it is UTF-8, else repaired into a copy.
    pub fn new(value: &Bytes) -> Self {
        match wire::utf8(value) {
            Ok(_) => Self(value.clone()),
            Err(_) => Self(Bytes::from(String::from_utf8_lossy(value).into_owned())),
        }
    }

    /// Holds a static text.
    pub const fn from_static(text: &'static str) -> Self {
        Self(Bytes::from_static(text.as_bytes()))
    }

    /// Returns the text.
    pub fn as_str(&self) -> &str {
        // SAFETY: every constructor checks or makes UTF-8.
        unsafe { std::str::from_utf8_unchecked(&self.0) }
    }
}

impl Deref for HeaderText {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for HeaderText {
    fn from(text: &str) -> Self {
        Self(Bytes::copy_from_slice(text.as_bytes()))
    }
}

impl fmt::Debug for HeaderText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

#[cfg(test)]
mod tests;
