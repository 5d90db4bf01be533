use super::*;

#[test]
fn member_differences_read_as_plain_words() {
    let proxy = "demo-openim-msggateway-0.demo-openim-msggateway-headless.chat.svc.cluster.local";
    let push = format!("{proxy}:88");
    assert_eq!(
        describe_member_difference(proxy, &push),
        "push members carry ':88', proxy members do not"
    );
    assert_eq!(
        describe_member_difference(&push, proxy),
        "proxy members carry ':88', push members do not"
    );
    assert_eq!(
        describe_member_difference("gw-0.chat:80", "gw-0.chat:88"),
        "proxy members carry '80' where push members carry '88'"
    );
    assert_eq!(
        describe_member_difference("gw-0.chat.svc", "gw-0.im.svc"),
        "proxy members carry 'chat' where push members carry 'im'"
    );
    assert_eq!(
        describe_member_difference("10.0.0.7", "gw-0:88"),
        "proxy spells the same gateway as '10.0.0.7', push as 'gw-0:88'"
    );
    assert_eq!(
        describe_member_difference("gw-0:88", "gw-0:88"),
        "proxy and push spell a gateway the same way ('gw-0:88')"
    );
    assert_eq!(
        describe_member_difference("gw-é0", "gw-é1"),
        "proxy members carry 'é0' where push members carry 'é1'"
    );
}
