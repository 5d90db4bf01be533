//! Decodes HPACK Huffman strings (RFC 7541 Section 5.2) four bits at a time through a state machine
//! built once from the code table. Every new gRPC connection sends its headers Huffman-coded
//! with a fresh HPACK table, and walking the code tree one bit at a time was 7% of the daemon's
//! CPU under the lab's push flood (a new connection per push).

use std::sync::OnceLock;

use super::HpackError;
use super::huffman_table::CODES;

const EOS: u16 = 256;

/// Holds a child slot in the code tree: another inner node, or a decoded symbol (the code is a
/// complete prefix code: no slot is empty once the tree is built).
#[derive(Clone, Copy)]
enum Child {
    Empty,
    Node(u8),
    Symbol(u16),
}

/// Builds the inner nodes of the code tree (257 symbols, so 256 of them: a `u8` names one); node 0
/// is the root.
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

/// Records what four bits do from one state: where they lead, and the symbol they complete, if any
/// (at most one: the shortest code is five bits long).
#[derive(Clone, Copy, Default)]
struct Step {
    next: u8,
    symbol: u8,
    flags: u8,
}

const EMITS: u8 = 1;
/// Flags bits that reach EOS, which must not appear in a string.
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
///
/// # Errors
///
/// Fails with [`HpackError::InvalidHuffman`] when the bits hold EOS or end in anything but short
/// all-ones padding.
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
mod tests;
