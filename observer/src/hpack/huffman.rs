//! HPACK Huffman decoding (RFC 7541 Section 5.2) over a binary tree built once from the code
//! table, walking one bit at a time: header strings here are short, speed is not the point.

use std::sync::OnceLock;

use super::HpackError;
use super::huffman_table::CODES;

const EOS: u16 = 256;

/// A child slot: either nothing yet, another node, or a decoded symbol.
#[derive(Clone, Copy)]
enum Child {
    Empty,
    Node(u16),
    Symbol(u16),
}

struct Tree {
    nodes: Vec<[Child; 2]>,
}

fn tree() -> &'static Tree {
    static TREE: OnceLock<Tree> = OnceLock::new();
    TREE.get_or_init(|| {
        let mut nodes = vec![[Child::Empty; 2]];
        for (symbol, &(code, bits)) in (0u16..).zip(CODES.iter()) {
            let mut node = 0usize;
            for position in (0..bits).rev() {
                let bit = ((code >> position) & 1) as usize;
                if position == 0 {
                    nodes[node][bit] = Child::Symbol(symbol);
                } else {
                    node = match nodes[node][bit] {
                        Child::Node(next) => usize::from(next),
                        // The code table is a complete prefix code, so a slot on the way to a
                        // symbol is either empty or an inner node.
                        Child::Empty | Child::Symbol(_) => {
                            nodes.push([Child::Empty; 2]);
                            let next = nodes.len() - 1;
                            nodes[node][bit] = Child::Node(next as u16);
                            next
                        }
                    };
                }
            }
        }
        Tree { nodes }
    })
}

/// Decodes a Huffman-coded string. Padding must be fewer than 8 bits, all ones (the EOS
/// prefix), and EOS itself must not appear.
pub(crate) fn decode(input: &[u8], out: &mut Vec<u8>) -> Result<(), HpackError> {
    let tree = tree();
    let mut node = 0usize;
    let mut bits_since_symbol = 0u32;
    let mut all_ones_since_symbol = true;
    for &byte in input {
        for position in (0..8).rev() {
            let bit = usize::from((byte >> position) & 1);
            bits_since_symbol += 1;
            all_ones_since_symbol &= bit == 1;
            let children = tree.nodes.get(node).ok_or(HpackError::InvalidHuffman)?;
            match children[bit] {
                Child::Node(next) => node = usize::from(next),
                Child::Symbol(EOS) => return Err(HpackError::InvalidHuffman),
                Child::Symbol(symbol) => {
                    out.push(symbol as u8);
                    node = 0;
                    bits_since_symbol = 0;
                    all_ones_since_symbol = true;
                }
                Child::Empty => return Err(HpackError::InvalidHuffman),
            }
        }
    }
    if bits_since_symbol > 7 || !all_ones_since_symbol {
        return Err(HpackError::InvalidHuffman);
    }
    Ok(())
}

/// Huffman-encodes `input` (tests build HPACK blocks with it).
#[cfg(test)]
pub(crate) fn encode(input: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut accumulator: u64 = 0;
    let mut pending_bits = 0u32;
    for &byte in input {
        let (code, bits) = CODES[usize::from(byte)];
        accumulator = (accumulator << bits) | u64::from(code);
        pending_bits += u32::from(bits);
        while pending_bits >= 8 {
            pending_bits -= 8;
            out.push((accumulator >> pending_bits) as u8);
        }
    }
    if pending_bits > 0 {
        let pad = 8 - pending_bits;
        out.push(((accumulator << pad) as u8) | ((1u8 << pad) - 1));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_byte_value() {
        let input: Vec<u8> = (0..=255).collect();
        let mut out = Vec::new();
        decode(&encode(&input), &mut out).unwrap();
        assert_eq!(out, input);
    }

    #[test]
    fn rejects_long_or_zero_padding_and_eos() {
        let mut out = Vec::new();
        // "a" is 00011 (5 bits): three padding bits of zeros are invalid.
        assert_eq!(
            decode(&[0b0001_1000], &mut out),
            Err(HpackError::InvalidHuffman)
        );
        // A full byte of ones after a symbol is 8 padding bits: too long.
        assert_eq!(
            decode(&[0b0001_1111, 0xff], &mut out),
            Err(HpackError::InvalidHuffman)
        );
        // EOS is 30 ones.
        assert_eq!(
            decode(&[0xff, 0xff, 0xff, 0xfc], &mut out),
            Err(HpackError::InvalidHuffman)
        );
        assert_eq!(
            decode(&[0xff, 0xff, 0xff, 0xff], &mut out),
            Err(HpackError::InvalidHuffman)
        );
    }
}
