use super::*;

#[test]
fn modes_hash_and_dial_as_documented() {
    for (mode, hashed_port, dialed_port) in [
        (ProxyMode::V351, false, false),
        (ProxyMode::ReportFix, true, true),
        (ProxyMode::Correct, true, false),
    ] {
        let route = Router::new(mode, "demo", "chat", 3)
            .expect("router")
            .route("3355700821")
            .expect("route");
        assert_eq!(route.member.ends_with(":88"), hashed_port, "{mode:?}");
        assert_eq!(route.dial.ends_with(":88"), dialed_port, "{mode:?}");
        assert!(route.dial.starts_with("demo-openim-msggateway-"));
    }
}

#[test]
fn send_id_comes_from_the_query() {
    assert_eq!(send_id_of("/?sendID=42&token=t"), Some("42"));
    assert_eq!(send_id_of("/?token=t&sendID="), None);
    assert_eq!(send_id_of("/"), None);
}
