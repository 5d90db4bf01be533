use super::*;

#[test]
fn empty_ring_is_an_error() {
    assert_eq!(
        Ring::new(Vec::<String>::new()).get("u"),
        Err(RingError::Empty)
    );
}

#[test]
fn one_member_takes_every_key() {
    let ring = Ring::new(["only"]);
    for key in ["", "a", "user_1", "3355700821"] {
        assert_eq!(ring.get(key).unwrap(), "only");
    }
}

#[test]
fn templates_expand_in_index_order() {
    let template = MemberTemplate::parse(PUSH_MEMBER_TEMPLATE).unwrap();
    assert_eq!(
        template.members("demo", "chat", 2),
        [
            "demo-openim-msggateway-0.demo-openim-msggateway-headless.chat.svc.cluster.local:88",
            "demo-openim-msggateway-1.demo-openim-msggateway-headless.chat.svc.cluster.local:88",
        ]
    );
    assert!(matches!(
        MemberTemplate::parse("gw.{namespace}"),
        Err(RingError::TemplateWithoutIndex { .. })
    ));
    assert!(matches!(
        MemberTemplate::parse("gw-{i}.{ns}"),
        Err(RingError::UnknownPlaceholder { .. })
    ));
}

#[test]
fn synthetic_ids_are_stable_ten_digit_numbers() {
    let ids = sample_user_ids(1_000);
    assert_eq!(ids, sample_user_ids(1_000));
    assert!(
        ids.iter()
            .all(|id| id.len() == 10 && id.bytes().all(|b| b.is_ascii_digit()))
    );
}
