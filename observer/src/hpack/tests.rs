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
