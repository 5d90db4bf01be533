use super::*;

#[test]
fn ip_text_spells_addresses_as_display_does() {
    let mut addresses: Vec<IpAddr> = [
        "0.0.0.0",
        "255.255.255.255",
        "10.244.126.11",
        "1.20.100.9",
        "::1",
        "::ffff:1.2.3.4",
        "fe80::1:2",
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    ]
    .iter()
    .map(|text| text.parse().unwrap())
    .collect();
    addresses.extend((0..=255u8).map(|octet| IpAddr::from([octet, octet / 3, 9, 99])));
    for ip in addresses {
        assert_eq!(IpText::new(ip).as_str(), ip.to_string());
    }
    let gateway = Gateway {
        ip: "10.0.0.7".parse().unwrap(),
        port: 88,
        name: None,
    };
    assert_eq!(
        serde_json::to_string(&gateway).unwrap(),
        r#"{"ip":"10.0.0.7","port":88}"#
    );
}
