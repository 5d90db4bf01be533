//! HPACK header decompression (RFC 7541), one decoder per direction of a connection.
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

/// RFC 7541 Section 4.1: each entry costs its name and value lengths plus 32.
pub(crate) const ENTRY_OVERHEAD: usize = 32;

/// The size the dynamic table starts with before any update (SETTINGS_HEADER_TABLE_SIZE default).
pub const DEFAULT_TABLE_SIZE: usize = 4096;

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

/// A decoded field. `Bytes`, so that a field named by index costs no copy: a static table
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

/// Not `Debug`: the dynamic table may hold credentials sent as headers.
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
    /// The dynamic table's size as HPACK counts it (32 bytes of overhead per entry), close to
    /// the heap it holds.
    pub fn table_bytes(&self) -> usize {
        self.dynamic_size
    }

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

    /// A decoder for a connection joined mid-stream, whose dynamic table holds entries this
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

    pub fn unknown_fields(&self) -> u64 {
        self.unknown_fields
    }

    /// Joined mid-stream, after a block that failed: what it would have added is unknown, so
    /// every entry is treated as made before the join from now on.
    pub fn forget_table(&mut self) {
        self.dynamic.clear();
        self.dynamic_size = 0;
    }

    /// Whether `index` refers to a dynamic entry this decoder cannot know.
    fn unknown_entry(&self, index: usize) -> bool {
        self.joined_mid_stream && index > STATIC_TABLE.len() + self.dynamic.len()
    }

    /// Decodes one complete header block (HEADERS plus its CONTINUATIONs), updating the table.
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
    /// RFC 7541 Section 5.1. Values past 2^28 are rejected: no legitimate index, length or table
    /// size comes near, and it keeps the shifts far from overflow.
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

    /// A string literal. Huffman-coded, it is decoded through `string_cache` when `cacheable`
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

/// The name of static table entry `index` (1-based, as on the wire).
pub(crate) fn static_name(index: usize) -> Option<&'static [u8]> {
    let (name, _) = STATIC_TABLE.get(index.checked_sub(1)?)?;
    Some(name.as_bytes())
}

/// Entries of the static table; dynamic entries are numbered after them.
pub(crate) const STATIC_TABLE_LEN: usize = STATIC_TABLE.len();

/// RFC 7541 Appendix A.
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
mod tests {
    use super::*;

    #[test]
    fn joined_mid_stream_decodes_what_it_can_and_counts_the_rest() {
        let mut decoder = HpackDecoder::joined_mid_stream(64 << 10, 64 << 10);
        // Indexed 62 (made before the join), a literal added under the name of entry 63
        // (also before), then `:method: GET` from the static table.
        let first = [0xbe, 0x7f, 0x00, 0x01, b'x', 0x82];
        let decoded = decoder.decode(&first).unwrap();
        assert_eq!(fields(&decoded), pairs(&[(":method", "GET")]));
        assert_eq!(decoder.unknown_fields(), 2);
        // A new literal `a: b` goes in front; 62 is then it, 63 the nameless one.
        let second = [0x40, 0x01, b'a', 0x01, b'b', 0xbe, 0xbf];
        let decoded = decoder.decode(&second).unwrap();
        assert_eq!(fields(&decoded), pairs(&[("a", "b"), ("a", "b")]));
        assert_eq!(decoder.unknown_fields(), 3);
        // Strict decoding refuses the same block.
        assert_eq!(
            HpackDecoder::new(4096, 4096).decode(&first),
            Err(HpackError::InvalidIndex(62))
        );
    }

    fn hex(text: &str) -> Vec<u8> {
        let digits: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
        digits
            .chunks(2)
            .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
            .collect()
    }

    fn fields(decoded: &[HeaderField]) -> Vec<(String, String)> {
        decoded
            .iter()
            .map(|field| {
                (
                    String::from_utf8(field.name.to_vec()).unwrap(),
                    String::from_utf8(field.value.to_vec()).unwrap(),
                )
            })
            .collect()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|&(n, v)| (n.to_owned(), v.to_owned()))
            .collect()
    }

    fn table(decoder: &HpackDecoder) -> Vec<(String, String)> {
        fields(&decoder.dynamic.iter().cloned().collect::<Vec<_>>())
    }

    #[test]
    fn c1_integers() {
        assert_eq!(Reader { input: &[0x0a] }.integer(5), Ok(10));
        assert_eq!(
            Reader {
                input: &[0x1f, 0x9a, 0x0a]
            }
            .integer(5),
            Ok(1337)
        );
        assert_eq!(Reader { input: &[0x2a] }.integer(8), Ok(42));
        assert_eq!(
            Reader {
                input: &[0x1f, 0x9a]
            }
            .integer(5),
            Err(HpackError::Truncated)
        );
        let huge = [0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f];
        assert_eq!(
            Reader { input: &huge }.integer(5),
            Err(HpackError::IntegerOverflow)
        );
    }

    #[test]
    fn c2_literal_representations() {
        let mut decoder = HpackDecoder::new(65536, 65536);
        let decoded = decoder
            .decode(&hex(
                "400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572",
            ))
            .unwrap();
        assert_eq!(fields(&decoded), pairs(&[("custom-key", "custom-header")]));
        assert_eq!(decoder.table_size(), 55);

        let mut decoder = HpackDecoder::new(65536, 65536);
        let decoded = decoder
            .decode(&hex("040c 2f73 616d 706c 652f 7061 7468"))
            .unwrap();
        assert_eq!(fields(&decoded), pairs(&[(":path", "/sample/path")]));
        assert_eq!(decoder.table_size(), 0);

        let decoded = decoder
            .decode(&hex("1008 7061 7373 776f 7264 0673 6563 7265 74"))
            .unwrap();
        assert_eq!(fields(&decoded), pairs(&[("password", "secret")]));
        assert_eq!(decoder.table_size(), 0);

        let decoded = decoder.decode(&hex("82")).unwrap();
        assert_eq!(fields(&decoded), pairs(&[(":method", "GET")]));
    }

    fn run_requests(blocks: [&str; 3]) {
        let mut decoder = HpackDecoder::new(65536, 65536);
        let first = decoder.decode(&hex(blocks[0])).unwrap();
        assert_eq!(
            fields(&first),
            pairs(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
            ])
        );
        assert_eq!(table(&decoder), pairs(&[(":authority", "www.example.com")]));
        assert_eq!(decoder.table_size(), 57);

        let second = decoder.decode(&hex(blocks[1])).unwrap();
        assert_eq!(
            fields(&second),
            pairs(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
                ("cache-control", "no-cache"),
            ])
        );
        assert_eq!(decoder.table_size(), 110);

        let third = decoder.decode(&hex(blocks[2])).unwrap();
        assert_eq!(
            fields(&third),
            pairs(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value"),
            ])
        );
        assert_eq!(
            table(&decoder),
            pairs(&[
                ("custom-key", "custom-value"),
                ("cache-control", "no-cache"),
                (":authority", "www.example.com"),
            ])
        );
        assert_eq!(decoder.table_size(), 164);
    }

    #[test]
    fn c3_requests_without_huffman() {
        run_requests([
            "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
            "8286 84be 5808 6e6f 2d63 6163 6865",
            "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
        ]);
    }

    #[test]
    fn c4_requests_with_huffman() {
        run_requests([
            "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
            "8286 84be 5886 a8eb 1064 9cbf",
            "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
        ]);
    }

    /// C.5 / C.6: responses with a 256-byte table, so entries get evicted.
    fn run_responses(blocks: [&str; 3]) {
        let mut decoder = HpackDecoder::new(65536, 65536);
        let mut update = hex("3fe1 01"); // size update to 256
        update.extend(hex(blocks[0]));
        let first = decoder.decode(&update).unwrap();
        assert_eq!(
            fields(&first),
            pairs(&[
                (":status", "302"),
                ("cache-control", "private"),
                ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
                ("location", "https://www.example.com"),
            ])
        );
        assert_eq!(decoder.table_size(), 222);

        let second = decoder.decode(&hex(blocks[1])).unwrap();
        assert_eq!(fields(&second)[0], (":status".to_owned(), "307".to_owned()));
        assert_eq!(decoder.table_size(), 222);
        assert_eq!(table(&decoder)[0], (":status".to_owned(), "307".to_owned()));

        let third = decoder.decode(&hex(blocks[2])).unwrap();
        assert_eq!(
            fields(&third),
            pairs(&[
                (":status", "200"),
                ("cache-control", "private"),
                ("date", "Mon, 21 Oct 2013 20:13:22 GMT"),
                ("location", "https://www.example.com"),
                ("content-encoding", "gzip"),
                (
                    "set-cookie",
                    "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1"
                ),
            ])
        );
        assert_eq!(
            table(&decoder),
            pairs(&[
                (
                    "set-cookie",
                    "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1"
                ),
                ("content-encoding", "gzip"),
                ("date", "Mon, 21 Oct 2013 20:13:22 GMT"),
            ])
        );
        assert_eq!(decoder.table_size(), 215);
    }

    #[test]
    fn c5_responses_without_huffman() {
        run_responses([
            "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 \
             2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 \
             6c65 2e63 6f6d",
            "4803 3330 37c1 c0bf",
            "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d \
             54c0 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049 \
             5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b 2076 6572 7369 6f6e \
             3d31",
        ]);
    }

    #[test]
    fn c6_responses_with_huffman() {
        run_responses([
            "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6 \
             2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
            "4883 640e ffc1 c0bf",
            "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab \
             77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f \
             9587 3160 65c0 03ed 4ee5 b106 3d50 07",
        ]);
    }

    #[test]
    fn malformed_blocks_are_errors() {
        let mut decoder = HpackDecoder::new(4096, 65536);
        assert_eq!(decoder.decode(&[0x80]), Err(HpackError::InvalidIndex(0)));
        assert_eq!(decoder.decode(&[0xbe]), Err(HpackError::InvalidIndex(62)));
        assert_eq!(
            decoder.decode(&[0x40, 0x05, b'a']),
            Err(HpackError::Truncated)
        );
        assert_eq!(
            decoder.decode(&[0x82, 0x20]),
            Err(HpackError::LateTableSizeUpdate)
        );
        // 31 + 0x62 + (0x1f << 7) = 4097
        assert_eq!(
            decoder.decode(&[0x3f, 0xe2, 0x1f]),
            Err(HpackError::TableSizeTooLarge {
                requested: 4097,
                allowed: 4096
            })
        );
        let mut small = HpackDecoder::new(4096, 40);
        assert_eq!(
            small.decode(&hex(
                "400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572"
            )),
            Err(HpackError::HeaderListTooLarge(40))
        );
    }
}
