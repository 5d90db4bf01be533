//! Decompresses HTTP/2 header blocks with HPACK (RFC 7541), one decoder per direction of a
//! connection.
//!
//! Written here rather than taken from a crate: `h2` keeps its HPACK private, and the `hpack`
//! crate and its forks either panic on malformed input or are unmaintained. Every error is a
//! typed `HpackError`; after one, the caller must stop using the decoder (its dynamic table no
//! longer matches the peer's).

mod huffman;
mod huffman_table;
mod string_cache;

pub(crate) use huffman::decode as huffman_decode;
#[cfg(test)]
pub(crate) use huffman::encode as huffman_encode;

use std::collections::VecDeque;

use bytes::Bytes;

/// Counts the bytes of overhead per table entry (RFC 7541 Section 4.1): each entry costs its name
/// and value lengths plus 32.
pub(crate) const ENTRY_OVERHEAD: usize = 32;

/// Sizes the dynamic table as it starts, before any update (SETTINGS_HEADER_TABLE_SIZE default).
pub const DEFAULT_TABLE_SIZE: usize = 4096;

/// Says why a header block cannot be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    #[error("header block ends inside a field representation")]
    Truncated,
    #[error("integer does not fit")]
    IntegerOverflow,
    #[error("index {0} is outside the static and dynamic tables")]
    InvalidIndex(usize),
    #[error("invalid Huffman code or padding")]
    InvalidHuffman,
    #[error("dynamic table size update to {requested} exceeds the allowed {allowed}")]
    TableSizeTooLarge { requested: usize, allowed: usize },
    #[error("dynamic table size update after the first field of a block")]
    LateTableSizeUpdate,
    #[error("decoded header list exceeds {0} bytes")]
    HeaderListTooLarge(usize),
}

/// Holds a decoded field. `Bytes`, so that a field named by index costs no copy: a static table
/// entry is borrowed, a dynamic one shared with the table (gRPC clients send most of each
/// call's headers as indexes into entries their first call added).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderField {
    pub name: Bytes,
    pub value: Bytes,
}

impl HeaderField {
    fn size(&self) -> usize {
        self.name.len() + self.value.len() + ENTRY_OVERHEAD
    }
}

/// Decodes one direction's header blocks, keeping its dynamic table. Not `Debug`: the dynamic table
/// may hold credentials sent as headers.
#[derive(Clone)]
pub struct HpackDecoder {
    /// Newest entry first (index 62 is the front).
    dynamic: VecDeque<HeaderField>,
    dynamic_size: usize,
    max_size: usize,
    /// The largest size a table size update may ask for. The peer's SETTINGS are not tracked,
    /// so this is a generous cap rather than the negotiated value.
    max_size_allowed: usize,
    max_header_list_bytes: usize,
    /// Joined mid-stream (see `joined_mid_stream`).
    joined_mid_stream: bool,
    /// Fields that referred to a table entry made before the decoder joined.
    unknown_fields: u64,
}

impl HpackDecoder {
    /// Returns the dynamic table's size as HPACK counts it (32 bytes of overhead per entry), close
    /// to the heap it holds.
    pub fn table_bytes(&self) -> usize {
        self.dynamic_size
    }

    /// Builds a decoder for a connection seen from its start.
    pub fn new(max_size_allowed: usize, max_header_list_bytes: usize) -> Self {
        Self {
            dynamic: VecDeque::new(),
            dynamic_size: 0,
            max_size: DEFAULT_TABLE_SIZE.min(max_size_allowed),
            max_size_allowed,
            max_header_list_bytes,
            joined_mid_stream: false,
            unknown_fields: 0,
        }
    }

    /// Builds a decoder for a connection joined mid-stream, whose dynamic table holds entries this
    /// decoder never saw. Entries are always added at the front and evicted from the back, so
    /// the entries added since joining are the peer's newest, at the same indexes: a
    /// reference to them decodes exactly, and a reference past them is to an entry made before
    /// the join, counted in `unknown_fields` and left out of the block's fields. Evicting
    /// later than the peer (the table size it set before is unknown, so the largest allowed is
    /// assumed) only keeps entries the peer no longer refers to.
    pub fn joined_mid_stream(max_size_allowed: usize, max_header_list_bytes: usize) -> Self {
        Self {
            max_size: max_size_allowed,
            joined_mid_stream: true,
            ..Self::new(max_size_allowed, max_header_list_bytes)
        }
    }

    /// Counts the fields that referred to a table entry made before the decoder joined.
    pub fn unknown_fields(&self) -> u64 {
        self.unknown_fields
    }

    /// Forgets the dynamic table, joined mid-stream after a block that failed: what it would have
    /// added is unknown, so every entry is treated as made before the join from now on.
    pub fn forget_table(&mut self) {
        self.dynamic.clear();
        self.dynamic_size = 0;
    }

    /// Says whether `index` refers to a dynamic entry this decoder cannot know.
    fn unknown_entry(&self, index: usize) -> bool {
        self.joined_mid_stream && index > STATIC_TABLE.len() + self.dynamic.len()
    }

    /// Decodes one complete header block (HEADERS plus its CONTINUATIONs), updating the table.
    ///
    /// # Errors
    ///
    /// Fails with an [`HpackError`] when the block is truncated or malformed (a bad integer, index,
    /// Huffman string or table size update), or its fields exceed the header list limit.
    pub fn decode(&mut self, block: &[u8]) -> Result<Vec<HeaderField>, HpackError> {
        let mut reader = Reader { input: block };
        // A gRPC request block holds 5-8 fields: one allocation rather than growing from 4.
        let mut fields = Vec::with_capacity(8);
        let mut list_bytes = 0usize;
        while let Some(&first) = reader.input.first() {
            if first & 0x80 != 0 {
                let index = reader.integer(7)?;
                if self.unknown_entry(index) {
                    self.unknown_fields += 1;
                    continue;
                }
                let field = self.lookup(index)?;
                if field.name.is_empty() {
                    // An entry added nameless (see below): its name was made before the join.
                    self.unknown_fields += 1;
                    continue;
                }
                fields.push(field);
            } else if first & 0xe0 == 0x20 {
                if !fields.is_empty() {
                    return Err(HpackError::LateTableSizeUpdate);
                }
                let requested = reader.integer(5)?;
                if requested > self.max_size_allowed {
                    return Err(HpackError::TableSizeTooLarge {
                        requested,
                        allowed: self.max_size_allowed,
                    });
                }
                self.max_size = requested;
                self.evict_to(self.max_size);
                continue;
            } else {
                // 01xxxxxx: with incremental indexing (6-bit index); 0000xxxx without indexing
                // and 0001xxxx never indexed (4-bit index).
                let add_to_table = first & 0xc0 == 0x40;
                let prefix = if add_to_table { 6 } else { 4 };
                let name_index = reader.integer(prefix)?;
                let name = if name_index == 0 {
                    Some(reader.string(true)?)
                } else if self.unknown_entry(name_index) {
                    None
                } else {
                    Some(self.lookup(name_index)?.name).filter(|name| !name.is_empty())
                };
                let cacheable = name
                    .as_ref()
                    .is_some_and(|name| string_cache::value_cacheable(name));
                let value = reader.string(cacheable)?;
                let Some(name) = name else {
                    // The entry still takes its place in the table, nameless.
                    self.unknown_fields += 1;
                    if add_to_table {
                        self.insert(HeaderField {
                            name: Bytes::new(),
                            value,
                        });
                    }
                    continue;
                };
                let field = HeaderField { name, value };
                if add_to_table {
                    self.insert(field.clone());
                }
                fields.push(field);
            }
            if let Some(field) = fields.last() {
                list_bytes += field.size();
            }
            if list_bytes > self.max_header_list_bytes {
                return Err(HpackError::HeaderListTooLarge(self.max_header_list_bytes));
            }
        }
        Ok(fields)
    }

    fn lookup(&self, index: usize) -> Result<HeaderField, HpackError> {
        if index == 0 {
            return Err(HpackError::InvalidIndex(index));
        }
        if let Some(&(name, value)) = STATIC_TABLE.get(index - 1) {
            return Ok(HeaderField {
                name: Bytes::from_static(name.as_bytes()),
                value: Bytes::from_static(value.as_bytes()),
            });
        }
        self.dynamic
            .get(index - 1 - STATIC_TABLE.len())
            .cloned()
            .ok_or(HpackError::InvalidIndex(index))
    }

    fn insert(&mut self, field: HeaderField) {
        let size = field.size();
        if size > self.max_size {
            // RFC 7541 Section 4.4: an entry larger than the table empties it and is not added.
            self.evict_to(0);
            return;
        }
        self.evict_to(self.max_size - size);
        self.dynamic_size += size;
        if self.dynamic.capacity() == 0 {
            // A fresh connection's first block adds about six entries: one allocation.
            self.dynamic.reserve(8);
        }
        self.dynamic.push_front(field);
    }

    fn evict_to(&mut self, target: usize) {
        while self.dynamic_size > target {
            match self.dynamic.pop_back() {
                Some(evicted) => self.dynamic_size -= evicted.size(),
                None => self.dynamic_size = 0,
            }
        }
    }

    #[cfg(test)]
    fn table_size(&self) -> usize {
        self.dynamic_size
    }
}

struct Reader<'a> {
    input: &'a [u8],
}

impl Reader<'_> {
    /// Reads an integer with a `prefix_bits` prefix (RFC 7541 Section 5.1). Values past 2^28 are
    /// rejected: no legitimate index, length or table size comes near, and it keeps the shifts far
    /// from overflow.
    fn integer(&mut self, prefix_bits: u32) -> Result<usize, HpackError> {
        let (&first, rest) = self.input.split_first().ok_or(HpackError::Truncated)?;
        self.input = rest;
        let prefix_max = (1usize << prefix_bits) - 1;
        let mut value = usize::from(first) & prefix_max;
        if value < prefix_max {
            return Ok(value);
        }
        let mut shift = 0u32;
        loop {
            let (&byte, rest) = self.input.split_first().ok_or(HpackError::Truncated)?;
            self.input = rest;
            value += usize::from(byte & 0x7f) << shift;
            if value > 1 << 28 {
                return Err(HpackError::IntegerOverflow);
            }
            if byte & 0x80 == 0 {
                return Ok(value);
            }
            shift += 7;
            if shift > 28 {
                return Err(HpackError::IntegerOverflow);
            }
        }
    }

    /// Reads a string literal. Huffman-coded, it is decoded through `string_cache` when `cacheable`
    /// (a name, or the value of a protocol header), else into a buffer of its own.
    fn string(&mut self, cacheable: bool) -> Result<Bytes, HpackError> {
        let huffman = self.input.first().ok_or(HpackError::Truncated)? & 0x80 != 0;
        let length = self.integer(7)?;
        if length > self.input.len() {
            return Err(HpackError::Truncated);
        }
        let (raw, rest) = self.input.split_at(length);
        self.input = rest;
        match (huffman, cacheable) {
            (true, true) => string_cache::decode(raw),
            (true, false) => string_cache::decode_fresh(raw),
            (false, _) => Ok(Bytes::copy_from_slice(raw)),
        }
    }
}

/// Returns the name of static table entry `index` (1-based, as on the wire).
pub(crate) fn static_name(index: usize) -> Option<&'static [u8]> {
    let (name, _) = STATIC_TABLE.get(index.checked_sub(1)?)?;
    Some(name.as_bytes())
}

/// Counts the entries of the static table; dynamic entries are numbered after them.
pub(crate) const STATIC_TABLE_LEN: usize = STATIC_TABLE.len();

/// Holds the static table of RFC 7541 Appendix A.
static STATIC_TABLE: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

#[cfg(test)]
mod tests;
