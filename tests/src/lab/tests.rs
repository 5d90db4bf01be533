use super::PodRole;

#[test]
fn proxy_and_push_land_on_different_nodes() {
    assert_eq!(PodRole::Proxy.node(3), 0);
    assert_eq!(PodRole::Push.node(3), 1);
    let gateways: Vec<usize> = (0..5)
        .map(|index| PodRole::Gateway(index).node(3))
        .collect();
    assert_eq!(gateways, [0, 1, 2, 0, 1]);
    for role in [PodRole::Proxy, PodRole::Push, PodRole::Gateway(4)] {
        assert_eq!(role.node(1), 0);
    }
}
