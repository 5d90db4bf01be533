use super::*;

#[test]
fn namespaces_must_be_kubernetes_names() {
    assert!(check_namespace("chat").is_ok());
    assert!(check_namespace("openim-2").is_ok());
    for bad in ["", "Chat", "-chat", "chat-", "a: b", &"x".repeat(64)] {
        assert!(check_namespace(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn images_need_a_tag_or_digest() {
    assert_eq!(
        split_image("registry:5000/openim-observer:0.1.0").unwrap(),
        (
            "registry:5000/openim-observer",
            "newTag: \"0.1.0\"".to_owned()
        )
    );
    assert_eq!(
        split_image("openim-observer@sha256:ab").unwrap(),
        ("openim-observer", "digest: sha256:ab".to_owned())
    );
    assert!(split_image("registry:5000/openim-observer").is_err());
}
