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
