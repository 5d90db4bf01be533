//! HPACK Huffman decoding (RFC 7541 Section 5.2), four bits at a time through a state machine
//! built once from the code table. Every new gRPC connection sends its headers Huffman-coded
//! with a fresh HPACK table, and walking the code tree one bit at a time was 7% of the daemon's
//! CPU under the lab's push flood (a new connection per push).

use std::sync::OnceLock;

use super::HpackError;
use super::huffman_table::CODES;

const EOS: u16 = 256;

/// A child slot in the code tree: another inner node, or a decoded symbol (the code is a
/// complete prefix code: no slot is empty once the tree is built).
#[derive(Clone, Copy)]
enum Child {
    Empty,
    Node(u8),
    Symbol(u16),
}

/// The inner nodes of the code tree (257 symbols, so 256 of them: a `u8` names one); node 0 is
/// the root.
fn code_tree() -> Vec<[Child; 2]> {
    let mut nodes = vec![[Child::Empty; 2]];
    for (symbol, &(code, bits)) in (0u16..).zip(CODES.iter()) {
        let mut node = 0usize;
        for position in (0..bits).rev() {
            let bit = ((code >> position) & 1) as usize;
            if position == 0 {
                nodes[node][bit] = Child::Symbol(symbol);
                continue;
            }
            node = match nodes[node][bit] {
                Child::Node(next) => usize::from(next),
                // A slot on the way to a symbol is either empty or an inner node.
                Child::Empty | Child::Symbol(_) => {
                    nodes.push([Child::Empty; 2]);
                    let next = nodes.len() - 1;
                    nodes[node][bit] = Child::Node(next as u8);
                    next
                }
            };
        }
    }
    nodes
}

/// What four bits do from one state: where they lead, and the symbol they complete, if any
/// (at most one: the shortest code is five bits long).
#[derive(Clone, Copy, Default)]
struct Step {
    next: u8,
    symbol: u8,
    flags: u8,
}

const EMITS: u8 = 1;
/// The bits reach EOS, which must not appear in a string.
const FAILS: u8 = 2;

struct Machine {
    /// By state (an inner node of the tree), then by the next four bits.
    steps: Vec<[Step; 16]>,
    /// Whether the input may end in this state: it is the root, or up to 7 bits of padding
    /// that are all ones (the start of EOS).
    may_end: Vec<bool>,
}

fn machine() -> &'static Machine {
    static MACHINE: OnceLock<Machine> = OnceLock::new();
    MACHINE.get_or_init(|| {
        let tree = code_tree();
        let steps = (0..tree.len())
            .map(|state| {
                let mut row = [Step::default(); 16];
                for (nibble, step) in (0u8..).zip(row.iter_mut()) {
                    let mut node = state;
                    for position in (0..4).rev() {
                        match tree[node][usize::from((nibble >> position) & 1)] {
                            Child::Node(next) => node = usize::from(next),
                            Child::Symbol(EOS) | Child::Empty => step.flags |= FAILS,
                            Child::Symbol(symbol) => {
                                step.symbol = symbol as u8;
                                step.flags |= EMITS;
                                node = 0;
                            }
                        }
                    }
                    step.next = node as u8;
                }
                row
            })
            .collect();
        let mut may_end = vec![false; tree.len()];
        let mut node = 0usize;
        may_end[node] = true;
        for _ in 0..7 {
            let Child::Node(next) = tree[node][1] else {
                break;
            };
            node = usize::from(next);
            may_end[node] = true;
        }
        Machine { steps, may_end }
    })
}

/// Decodes a Huffman-coded string. Padding must be fewer than 8 bits, all ones (the EOS
/// prefix), and EOS itself must not appear.
pub(crate) fn decode(input: &[u8], out: &mut Vec<u8>) -> Result<(), HpackError> {
    let machine = machine();
    let mut state = 0usize;
    for &byte in input {
        for nibble in [byte >> 4, byte & 0x0f] {
            let step = machine.steps[state][usize::from(nibble)];
            if step.flags & FAILS != 0 {
                return Err(HpackError::InvalidHuffman);
            }
            if step.flags & EMITS != 0 {
                out.push(step.symbol);
            }
            state = usize::from(step.next);
        }
    }
    if machine.may_end[state] {
        Ok(())
    } else {
        Err(HpackError::InvalidHuffman)
    }
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

    /// The code tree walked one bit at a time: the reference the state machine must agree with.
    fn decode_bit_by_bit(tree: &[[Child; 2]], input: &[u8]) -> Result<Vec<u8>, HpackError> {
        let mut out = Vec::new();
        let mut node = 0usize;
        let mut bits_since_symbol = 0u32;
        let mut all_ones_since_symbol = true;
        for &byte in input {
            for position in (0..8).rev() {
                let bit = usize::from((byte >> position) & 1);
                bits_since_symbol += 1;
                all_ones_since_symbol &= bit == 1;
                match tree[node][bit] {
                    Child::Node(next) => node = usize::from(next),
                    Child::Symbol(EOS) | Child::Empty => return Err(HpackError::InvalidHuffman),
                    Child::Symbol(symbol) => {
                        out.push(symbol as u8);
                        node = 0;
                        bits_since_symbol = 0;
                        all_ones_since_symbol = true;
                    }
                }
            }
        }
        if bits_since_symbol > 7 || !all_ones_since_symbol {
            return Err(HpackError::InvalidHuffman);
        }
        Ok(out)
    }

    /// Every string of up to 2 bytes, and random ones up to 40 bytes, valid codes and not:
    /// the state machine decodes what the bit walk decodes and rejects what it rejects.
    #[test]
    fn the_state_machine_agrees_with_the_bit_walk() {
        let mut inputs: Vec<Vec<u8>> = (0..=u8::MAX).map(|byte| vec![byte]).collect();
        inputs.extend((0..=u16::MAX).map(|pair| pair.to_be_bytes().to_vec()));
        let mut random = 0x5EED_u64;
        for length in 0..4000usize {
            let bytes = (0..length % 41)
                .map(|_| {
                    random = random
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (random >> 56) as u8
                })
                .collect::<Vec<u8>>();
            inputs.push(encode(&bytes));
            inputs.push(bytes);
        }
        let tree = code_tree();
        for input in inputs {
            let mut decoded = Vec::new();
            let result = decode(&input, &mut decoded).map(|()| decoded);
            assert_eq!(
                result,
                decode_bit_by_bit(&tree, &input),
                "input {input:02x?}"
            );
        }
    }

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
