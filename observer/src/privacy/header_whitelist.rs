//! Decides what of an HTTP/2 header block may leave the process: the values of pseudo-headers,
//! `content-type` and `grpc-*` (what the engine reads), nothing else's. gRPC metadata such as
//! `token`, `authorization` or `operationid` is masked however it is spelt on the wire.
//!
//! The walk follows one direction's header blocks byte by byte, across frames and chunks, with
//! a mirror of the peer encoder's dynamic table (names and entry sizes), so a literal whose
//! name is a table reference is judged by that name. A masked value keeps its length prefix and
//! becomes that many `*`: a Huffman-coded one loses its Huffman flag (set in the prefix's first
//! byte, which is judged before it leaves). Its table entry is then smaller for a decoder of
//! the masked stream than for the peer (Huffman codes are chosen only when shorter), so such a
//! decoder evicts later, never earlier, and every reference the peer made still resolves to the
//! same entry: replaying a recording decodes the same kept headers.
//!
//! What cannot be followed (an index past the table, an integer, string or table size over the
//! bounds, bad Huffman) loses the direction: every later header byte is zeroed.

use std::collections::VecDeque;

use crate::hpack::{
    DEFAULT_TABLE_SIZE, ENTRY_OVERHEAD, STATIC_TABLE_LEN, huffman_decode, static_name,
};

/// Bounds the bytes of a literal name or a Huffman value buffered to learn its decoded form.
const MAX_STRING: usize = 8192;
/// Sets the largest dynamic table mirrored, which bounds its names' memory per direction: four
/// times the protocol's default, which gRPC stacks keep. A peer's size update past it loses the
/// direction.
const MAX_TABLE_SIZE: usize = 4 * DEFAULT_TABLE_SIZE;
const MAX_INTEGER: u64 = 1 << 24;
const MASK: u8 = b'*';

/// Says whether a header's value is one the engine reads.
fn kept(name: &[u8]) -> bool {
    name.starts_with(b":") || name == b"content-type" || name.starts_with(b"grpc-")
}

/// Follows one direction's HTTP/2 header blocks, keeping only the values the engine reads.
#[derive(Clone, Debug)]
pub struct HeaderWhitelist {
    /// The peer encoder's dynamic table as (name, entry size), newest first.
    table: VecDeque<(Vec<u8>, usize)>,
    table_size: usize,
    max_size: usize,
    state: State,
    /// The field being read: whether it is added to the table, and its name once known.
    indexing: bool,
    name: Vec<u8>,
    lost: bool,
}

impl Default for HeaderWhitelist {
    fn default() -> Self {
        Self {
            table: VecDeque::new(),
            table_size: 0,
            max_size: DEFAULT_TABLE_SIZE,
            state: State::Start,
            indexing: false,
            name: Vec::new(),
            lost: false,
        }
    }
}

#[derive(Clone, Debug)]
enum State {
    /// At a field representation's first byte.
    Start,
    /// Bytes after a prefix integer's first one.
    Integer {
        value: u64,
        shift: u32,
        of: IntegerOf,
    },
    /// At a string's first byte: its Huffman flag and length prefix.
    StringStart { of: StringOf },
    String {
        length: u64,
        left: u64,
        huffman: bool,
        of: StringOf,
        masked: bool,
        buffer: Vec<u8>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IntegerOf {
    /// An indexed field: nothing to mask, nothing added.
    FieldIndex,
    NameIndex,
    TableSize,
    StringLength {
        of: StringOf,
        huffman: bool,
        masked: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StringOf {
    Name,
    Value,
}

impl HeaderWhitelist {
    /// Masks in place what of the next bytes of this direction's header blocks is not kept.
    /// `fragment` is a HEADERS or CONTINUATION frame's block fragment (no padding or priority).
    pub fn filter(&mut self, fragment: &mut [u8]) {
        for byte in fragment {
            *byte = if self.lost { 0 } else { self.step(*byte) };
        }
    }

    /// Says whether this direction's blocks can no longer be followed.
    pub fn is_lost(&self) -> bool {
        self.lost
    }

    fn step(&mut self, byte: u8) -> u8 {
        match std::mem::replace(&mut self.state, State::Start) {
            State::Start => {
                let (prefix_bits, of) = if byte & 0x80 != 0 {
                    (7, IntegerOf::FieldIndex)
                } else if byte & 0xc0 == 0x40 {
                    self.indexing = true;
                    (6, IntegerOf::NameIndex)
                } else if byte & 0xe0 == 0x20 {
                    (5, IntegerOf::TableSize)
                } else {
                    self.indexing = false;
                    (4, IntegerOf::NameIndex)
                };
                self.integer_start(byte, prefix_bits, of);
                byte
            }
            State::Integer { value, shift, of } => {
                let Some(value) = (shift <= 28)
                    .then(|| value + (u64::from(byte & 0x7f) << shift))
                    .filter(|&value| value <= MAX_INTEGER)
                else {
                    return self.lose();
                };
                if byte & 0x80 != 0 {
                    self.state = State::Integer {
                        value,
                        shift: shift + 7,
                        of,
                    };
                } else {
                    self.integer_done(value, of);
                }
                byte
            }
            State::StringStart { of } => {
                let huffman = byte & 0x80 != 0;
                let masked = of == StringOf::Value && !kept(&self.name);
                self.integer_start(
                    byte,
                    7,
                    IntegerOf::StringLength {
                        of,
                        huffman,
                        masked,
                    },
                );
                // A masked value is `*`s, no longer Huffman-coded.
                if masked { byte & 0x7f } else { byte }
            }
            State::String {
                length,
                left,
                huffman,
                of,
                masked,
                mut buffer,
            } => {
                if of == StringOf::Name || (huffman && self.indexing) {
                    buffer.push(byte);
                }
                if left > 1 {
                    self.state = State::String {
                        length,
                        left: left - 1,
                        huffman,
                        of,
                        masked,
                        buffer,
                    };
                } else {
                    self.string_done(of, huffman, &buffer, length);
                }
                if masked { MASK } else { byte }
            }
        }
    }

    fn integer_start(&mut self, byte: u8, prefix_bits: u32, of: IntegerOf) {
        let max = (1u8 << prefix_bits) - 1;
        let value = byte & max;
        if value < max {
            self.integer_done(u64::from(value), of);
        } else {
            self.state = State::Integer {
                value: u64::from(max),
                shift: 0,
                of,
            };
        }
    }

    fn integer_done(&mut self, value: u64, of: IntegerOf) {
        match of {
            IntegerOf::FieldIndex => {
                if self.name_of(value).is_none() {
                    self.lose();
                }
            }
            IntegerOf::NameIndex if value == 0 => {
                self.state = State::StringStart { of: StringOf::Name };
            }
            IntegerOf::NameIndex => {
                let name = self.name_of(value);
                self.name_known(name);
            }
            IntegerOf::TableSize if value as usize > MAX_TABLE_SIZE => {
                self.lose();
            }
            IntegerOf::TableSize => {
                self.max_size = value as usize;
                self.evict_to(self.max_size);
            }
            IntegerOf::StringLength {
                of,
                huffman,
                masked,
            } => {
                if value > MAX_STRING as u64 && (of == StringOf::Name || huffman) {
                    self.lose();
                } else if value == 0 {
                    self.string_done(of, huffman, &[], 0);
                } else {
                    self.state = State::String {
                        length: value,
                        left: value,
                        huffman,
                        of,
                        masked,
                        buffer: Vec::new(),
                    };
                }
            }
        }
    }

    /// Ends a string of `length` bytes on the wire; `buffer` holds them where they were
    /// needed (a name, a Huffman value added to the table).
    fn string_done(&mut self, of: StringOf, huffman: bool, buffer: &[u8], length: u64) {
        let decoded = |bytes: &[u8]| -> Option<Vec<u8>> {
            if !huffman {
                return Some(bytes.to_vec());
            }
            let mut out = Vec::new();
            huffman_decode(bytes, &mut out).ok().map(|()| out)
        };
        match of {
            StringOf::Name => self.name_known(decoded(buffer)),
            StringOf::Value => {
                if self.indexing {
                    let value_len = if huffman {
                        match decoded(buffer) {
                            Some(value) => value.len(),
                            None => {
                                self.lose();
                                return;
                            }
                        }
                    } else {
                        length as usize
                    };
                    let name = std::mem::take(&mut self.name);
                    self.insert(name, value_len);
                }
                self.state = State::Start;
            }
        }
    }

    /// Takes the field's name, once read (`None`: it cannot be known); its value comes next.
    fn name_known(&mut self, name: Option<Vec<u8>>) {
        match name {
            Some(name) => {
                self.name = name;
                self.state = State::StringStart {
                    of: StringOf::Value,
                };
            }
            None => {
                self.lose();
            }
        }
    }

    /// Returns the name of table index `index` (static, then dynamic).
    fn name_of(&self, index: u64) -> Option<Vec<u8>> {
        let index = usize::try_from(index).ok()?;
        if let Some(name) = static_name(index) {
            return Some(name.to_vec());
        }
        let (name, _) = self.table.get(index.checked_sub(STATIC_TABLE_LEN + 1)?)?;
        Some(name.clone())
    }

    fn insert(&mut self, name: Vec<u8>, value_len: usize) {
        let size = name.len() + value_len + ENTRY_OVERHEAD;
        if size > self.max_size {
            // RFC 7541 §4.4: an entry larger than the table empties it and is not added.
            self.evict_to(0);
            return;
        }
        self.evict_to(self.max_size - size);
        self.table_size += size;
        self.table.push_front((name, size));
    }

    fn evict_to(&mut self, size: usize) {
        while self.table_size > size {
            match self.table.pop_back() {
                Some((_, entry)) => self.table_size -= entry,
                None => break,
            }
        }
    }

    fn lose(&mut self) -> u8 {
        self.lost = true;
        0
    }
}
