use super::*;

#[test]
fn tables_parse_in_host_byte_order() {
    // Written as a little-endian kernel prints them.
    let tcp = "  sl  local_address rem_address   st tx_queue rx_queue\n\
                   0: 0500F40A:A028 0700F40A:0050 01 00000000:00000000 00:00000000 00000000     0        0 1001 1 0\n\
                   1: 0500F40A:A029 0700F40A:0050 06 00000000:00000000 00:00000000 00000000     0        0 1002 1 0\n";
    let tcp6 = "  sl  local_address                         remote_address\n\
                    0: 0000000000000000FFFF00000900F40A:A030 0000000000000000FFFF00000700F40A:0050 01 00000000:00000000 00:00000000 00000000     0        0 1003 1 0\n";
    if cfg!(target_endian = "little") {
        let found: Vec<String> = parse_table(tcp)
            .chain(parse_table(tcp6))
            .filter(|socket| socket.established)
            .map(|socket| socket.key.canonical().to_string())
            .collect();
        assert_eq!(
            found,
            [
                "10.244.0.5:41000>10.244.0.7:80",
                "10.244.0.9:41008>10.244.0.7:80"
            ]
        );
    }
}

#[test]
fn rows_carry_the_socket_inode() {
    let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
                   0: 0500F40A:A028 0700F40A:0050 01 00000000:00000000 00:00000000 00000000     0        0 123456 1 0\n";
    let sockets: Vec<TableSocket> = parse_table(tcp).collect();
    assert_eq!(sockets.len(), 1);
    assert_eq!(sockets[0].inode, 123_456);
}

/// TIME_WAIT rows hold no descriptor (inode 0): a node can have tens of thousands, and
/// a process that cannot read other namespaces' links reads them once per process.
#[test]
fn rows_no_descriptor_holds_are_left_out() {
    let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
                   0: 0500F40A:A028 0700F40A:0050 06 00000000:00000000 03:00001000 00000000     0        0 0 1 0\n";
    assert_eq!(parse_table(tcp).count(), 0);
}
