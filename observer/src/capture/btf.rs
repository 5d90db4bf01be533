//! Reads just enough of the kernel's BTF to find where a struct keeps a field: one pass over the
//! type section that records where each type starts, then lookups by name and member path that read
//! only the types on that path.
//!
//! A general parser (`btfparse`, before) built every one of the kernel's ~100,000 types up
//! front: 30 MB more at the release observer's peak, and in test builds, which leave the
//! observer unoptimised, most of each observer's start (7 of its 10 seconds under the kernel
//! tests' emulated guests). The format is the kernel's `include/uapi/linux/btf.h`.

/// Numbers a type in the BTF: 0 is `void`, the first type described is 1.
pub type TypeId = u32;

/// Says why the bytes are not the BTF this reads.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("not BTF in this machine's byte order (magic {0:#06x})")]
    BadMagic(u16),
    #[error("the BTF ends inside {0}")]
    Truncated(&'static str),
    #[error("the BTF has a type of unknown kind {0}")]
    UnknownKind(u32),
    #[error("type {0} is not in the BTF")]
    NoSuchType(TypeId),
    #[error("type {0} has no size")]
    Unsized(TypeId),
}

const MAGIC: u16 = 0xeb9f;
const HEADER_LEN: usize = 24;
const TYPE_LEN: usize = 12;

// `BTF_KIND_*`: the kinds this reads, and those whose trailing data it must step over.
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;
/// Names the last kind this knows. Kinds 7 (forward declaration) and 12 (function) have no
/// trailing data either.
const KIND_LAST: u32 = KIND_ENUM64;

/// Bounds how deep anonymous members and arrays of arrays are followed: far past any real type, and
/// a damaged file's cycle stops here instead of overflowing the stack.
const MAX_NESTING: usize = 32;

/// Describes a struct or union member found by `Btf::member`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    pub type_id: TypeId,
    /// From the start of the outermost container, through any anonymous ones.
    pub bit_offset: u32,
    /// A bitfield's width in bits; 0 for a whole field.
    pub bitfield_bits: u32,
}

/// Holds the kernel's types, indexed by where each starts in the file.
pub struct Btf<'a> {
    types: &'a [u8],
    strings: &'a [u8],
    /// `starts[id - 1]` is where type `id` begins in `types`.
    starts: Vec<u32>,
}

/// Holds one type's fixed part.
struct Header {
    name_offset: u32,
    kind: u32,
    vlen: usize,
    kind_flag: bool,
    /// `size` or `type`, by kind.
    size_or_type: u32,
}

impl<'a> Btf<'a> {
    /// Indexes `bytes`, a whole BTF file such as `/sys/kernel/btf/vmlinux`.
    ///
    /// # Errors
    ///
    /// Fails with a [`BtfError`] when the bytes do not start with BTF's magic in this machine's
    /// byte order, end inside the header, a section or a type, or hold a type of an unknown kind.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, BtfError> {
        let magic = u16::from_ne_bytes([
            *bytes.first().ok_or(BtfError::Truncated("its header"))?,
            *bytes.get(1).ok_or(BtfError::Truncated("its header"))?,
        ]);
        if magic != MAGIC {
            return Err(BtfError::BadMagic(magic));
        }
        let header_len = read_u32(bytes, 4).ok_or(BtfError::Truncated("its header"))? as usize;
        let field = |at| read_u32(bytes, at).ok_or(BtfError::Truncated("its header"));
        let (type_off, type_len) = (field(8)? as usize, field(12)? as usize);
        let (str_off, str_len) = (field(16)? as usize, field(20)? as usize);
        let section = |offset: usize, len: usize, what| {
            let start = header_len.max(HEADER_LEN).checked_add(offset);
            start
                .and_then(|start| bytes.get(start..start.checked_add(len)?))
                .ok_or(BtfError::Truncated(what))
        };
        let types = section(type_off, type_len, "its type section")?;
        let strings = section(str_off, str_len, "its string section")?;
        let mut starts = Vec::new();
        let mut at = 0;
        while at < types.len() {
            starts.push(at as u32);
            let header = type_header(types, at)?;
            at += TYPE_LEN + trailing_len(&header)?;
        }
        if at != types.len() {
            return Err(BtfError::Truncated("its last type"));
        }
        Ok(Self {
            types,
            strings,
            starts,
        })
    }

    /// Returns the struct named `name`, if there is one (the first, if there are several).
    pub fn struct_named(&self, name: &str) -> Option<TypeId> {
        (1..=self.starts.len() as TypeId).find(|&id| {
            self.header(id).is_ok_and(|header| {
                header.kind == KIND_STRUCT && self.name(header.name_offset) == Some(name.as_bytes())
            })
        })
    }

    /// Returns the member at `path` (names joined by dots) of the struct or union `container`,
    /// looking through anonymous structs and unions as C does.
    pub fn member(&self, container: TypeId, path: &str) -> Option<Member> {
        let mut found = Member {
            type_id: container,
            bit_offset: 0,
            bitfield_bits: 0,
        };
        for name in path.split('.') {
            let inner = self.named_member(found.type_id, name.as_bytes(), MAX_NESTING)?;
            found = Member {
                bit_offset: found.bit_offset.checked_add(inner.bit_offset)?,
                ..inner
            };
        }
        Some(found)
    }

    /// Returns the size of `id` in bytes, through typedefs and qualifiers.
    ///
    /// # Errors
    ///
    /// Fails with a [`BtfError`] when `id` or a type it refers to is not in the BTF, or has no size
    /// (a kind without one, a cycle of aliases, or arrays nested too deep).
    pub fn size_of(&self, id: TypeId) -> Result<usize, BtfError> {
        self.nested_size_of(id, MAX_NESTING)
    }

    fn nested_size_of(&self, id: TypeId, depth: usize) -> Result<usize, BtfError> {
        let id = self.strip_aliases(id)?;
        let header = self.header(id)?;
        match header.kind {
            KIND_INT | KIND_STRUCT | KIND_UNION | KIND_ENUM | KIND_ENUM64 | KIND_FLOAT
            | KIND_DATASEC => Ok(header.size_or_type as usize),
            KIND_PTR => Ok(std::mem::size_of::<usize>()),
            KIND_ARRAY => {
                let array = self.trailing(id)?;
                let (element, count) = (read_u32(array, 0), read_u32(array, 8));
                let (Some(element), Some(count), Some(depth)) =
                    (element, count, depth.checked_sub(1))
                else {
                    return Err(BtfError::Unsized(id));
                };
                self.nested_size_of(element, depth)?
                    .checked_mul(count as usize)
                    .ok_or(BtfError::Unsized(id))
            }
            _ => Err(BtfError::Unsized(id)),
        }
    }

    fn named_member(&self, container: TypeId, name: &[u8], depth: usize) -> Option<Member> {
        let container = self.strip_aliases(container).ok()?;
        let header = self.header(container).ok()?;
        if !matches!(header.kind, KIND_STRUCT | KIND_UNION) {
            return None;
        }
        let members = self.trailing(container).ok()?;
        for entry in members.chunks_exact(12).take(header.vlen) {
            let (name_offset, type_id, offset) = (
                read_u32(entry, 0)?,
                read_u32(entry, 4)?,
                read_u32(entry, 8)?,
            );
            // With the kind flag, the offset's top byte is a bitfield's width.
            let (bit_offset, bitfield_bits) = if header.kind_flag {
                (offset & 0x00ff_ffff, offset >> 24)
            } else {
                (offset, 0)
            };
            if name_offset == 0 {
                let inner = self.named_member(type_id, name, depth.checked_sub(1)?);
                if let Some(inner) = inner {
                    return Some(Member {
                        bit_offset: bit_offset.checked_add(inner.bit_offset)?,
                        ..inner
                    });
                }
            } else if self.name(name_offset) == Some(name) {
                return Some(Member {
                    type_id,
                    bit_offset,
                    bitfield_bits,
                });
            }
        }
        None
    }

    /// Follows `id` through typedefs, qualifiers and type tags.
    fn strip_aliases(&self, mut id: TypeId) -> Result<TypeId, BtfError> {
        // A chain longer than the table is a cycle.
        for _ in 0..=self.starts.len() {
            let header = self.header(id)?;
            match header.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = header.size_or_type;
                }
                _ => return Ok(id),
            }
        }
        Err(BtfError::Unsized(id))
    }

    fn header(&self, id: TypeId) -> Result<Header, BtfError> {
        type_header(self.types, self.start(id)?)
    }

    /// Returns the data after type `id`'s fixed part.
    fn trailing(&self, id: TypeId) -> Result<&'a [u8], BtfError> {
        self.types
            .get(self.start(id)? + TYPE_LEN..)
            .ok_or(BtfError::Truncated("a type"))
    }

    /// Returns where type `id` begins in the type section.
    fn start(&self, id: TypeId) -> Result<usize, BtfError> {
        id.checked_sub(1)
            .and_then(|index| self.starts.get(index as usize))
            .map(|&start| start as usize)
            .ok_or(BtfError::NoSuchType(id))
    }

    /// Returns the NUL-terminated string at `offset` of the string section.
    fn name(&self, offset: u32) -> Option<&'a [u8]> {
        let rest = self.strings.get(offset as usize..)?;
        memchr::memchr(0, rest).map(|end| &rest[..end])
    }
}

fn type_header(types: &[u8], at: usize) -> Result<Header, BtfError> {
    let word = |offset| read_u32(types, at + offset).ok_or(BtfError::Truncated("a type"));
    let info = word(4)?;
    Ok(Header {
        name_offset: word(0)?,
        kind: (info >> 24) & 0x1f,
        vlen: (info & 0xffff) as usize,
        kind_flag: info >> 31 == 1,
        size_or_type: word(8)?,
    })
}

/// Counts the bytes that follow a type's fixed part, by its kind.
fn trailing_len(header: &Header) -> Result<usize, BtfError> {
    Ok(match header.kind {
        KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
        KIND_ARRAY => 12,
        KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * header.vlen,
        KIND_ENUM | KIND_FUNC_PROTO => 8 * header.vlen,
        kind if kind <= KIND_LAST => 0,
        kind => return Err(BtfError::UnknownKind(kind)),
    })
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let word = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_ne_bytes([word[0], word[1], word[2], word[3]]))
}

#[cfg(test)]
mod tests;
