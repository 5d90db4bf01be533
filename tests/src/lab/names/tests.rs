use super::*;

#[test]
fn table_round_trips_and_resolves_with_default_port() {
    let mut table = NameTable::default();
    table.insert("gw-0.svc", Ipv4Addr::new(10, 244, 7, 10));
    let parsed = NameTable::parse_arg(&table.to_arg()).expect("parses");
    assert_eq!(parsed, table);
    assert_eq!(
        parsed.resolve("gw-0.svc", 80).expect("known").to_string(),
        "10.244.7.10:80"
    );
    assert_eq!(
        parsed
            .resolve("gw-0.svc:88", 80)
            .expect("known")
            .to_string(),
        "10.244.7.10:88"
    );
    assert!(parsed.resolve("elsewhere", 80).is_err());
}
