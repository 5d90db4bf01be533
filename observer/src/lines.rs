//! Reads lines of untrusted input (recordings, user and member lists, standard input) with a
//! bound on each line, so that a file without newlines (`/dev/zero`) is an error after a few
//! kilobytes rather than all of memory.

use std::io::{self, BufRead, Read};

use thiserror::Error;

/// Describes a line that cannot be read: too long, not UTF-8, or a read error.
#[derive(Debug, Error)]
pub enum LineError {
    #[error("line {line} is longer than {max} bytes")]
    TooLong { line: usize, max: usize },
    #[error("line {line} is not UTF-8")]
    NotUtf8 { line: usize },
    #[error(transparent)]
    Read(#[from] io::Error),
}

/// Yields each line of `reader` with its 1-based number and without its `\n`; at most `max_bytes`
/// bytes are buffered for one line.
pub struct BoundedLines<R> {
    reader: R,
    max_bytes: usize,
    number: usize,
    buffer: Vec<u8>,
}

impl<R: BufRead> BoundedLines<R> {
    /// Reads `reader` line by line, buffering at most `max_bytes` bytes for one line.
    pub fn new(reader: R, max_bytes: usize) -> Self {
        Self {
            reader,
            max_bytes,
            number: 0,
            buffer: Vec::new(),
        }
    }
}

impl<R: BufRead> Iterator for BoundedLines<R> {
    type Item = Result<(usize, String), LineError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.buffer.clear();
        // One byte over the bound tells a line that fits from one that does not.
        let limit = u64::try_from(self.max_bytes)
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let read = match (&mut self.reader)
            .take(limit)
            .read_until(b'\n', &mut self.buffer)
        {
            Ok(0) => return None,
            Ok(read) => read,
            Err(error) => return Some(Err(error.into())),
        };
        self.number += 1;
        let line = self.number;
        if self.buffer.last() == Some(&b'\n') {
            self.buffer.pop();
        } else if read > self.max_bytes {
            return Some(Err(LineError::TooLong {
                line,
                max: self.max_bytes,
            }));
        }
        Some(
            String::from_utf8(std::mem::take(&mut self.buffer))
                .map(|text| (line, text))
                .map_err(|_| LineError::NotUtf8 { line }),
        )
    }
}

#[cfg(test)]
mod tests;
