use super::*;

#[test]
fn lab_names_carry_their_owner_pid() {
    assert_eq!(owner_pid("oil4194304a-gw12"), Some(4_194_304));
    assert_eq!(owner_pid("oil77bv10"), Some(77));
    assert_eq!(owner_pid("eth0"), None);
    assert_eq!(owner_pid("oilx"), None);
    assert!(format!("{}v210", new_prefix()).len() <= 15);
}

#[test]
fn link_names_are_read_from_ip_one_line_output() {
    let line = "7: oil1av10@if2: <BROADCAST,MULTICAST,UP> mtu 1500";
    assert_eq!(link_name(line).as_deref(), Some("oil1av10"));
}
