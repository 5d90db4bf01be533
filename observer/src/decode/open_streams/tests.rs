use super::OpenStreams;

#[test]
fn streams_stay_in_id_order_whatever_order_they_open_in() {
    let mut streams = OpenStreams::default();
    for id in [7, 3, 5, 1] {
        streams.insert(id, id * 10);
    }
    streams.insert(5, 55);
    assert_eq!(
        streams.iter().collect::<Vec<_>>(),
        [(1, &10), (3, &30), (5, &55), (7, &70)]
    );
    assert_eq!(streams.remove(3), Some(30));
    assert_eq!(streams.remove(3), None);
    assert!(!streams.contains(3) && streams.contains(7));
    *streams.get_mut(7).unwrap() += 1;
    assert_eq!(streams.get(7), Some(&71));
    assert_eq!(streams.len(), 3);
}
