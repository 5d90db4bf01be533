use super::*;

fn row(rss_kib: u64, entries: usize, gateways: usize) -> Row {
    let node = NodeSample {
        rss_kib,
        kernel_entries: entries,
        connections: entries as f64,
        users: entries as f64,
        running: true,
        ..NodeSample::default()
    };
    Row {
        at_secs: 0.0,
        phase: "load",
        nodes: vec![node],
        redis: Some((1, 1)),
        alerts: AlertCounts::default(),
        pushes: 0,
        reconnects: 0,
        gateways,
    }
}

fn judge(rows: &[Row], end: &Row) -> Option<String> {
    let names = ["node-1".to_owned()];
    verdict(&Evidence {
        node_names: &names,
        load_rows: rows,
        end,
        redis_end: RedisEnd::default(),
        alerts: AlertCounts {
            expected: 3,
            printed: 3,
            ..AlertCounts::default()
        },
        alert_examples: String::new(),
        restart_unseen: Vec::new(),
        exited: Vec::new(),
        batch: 16,
    })
}

#[test]
fn a_steady_run_that_empties_passes() {
    let rows: Vec<Row> = (0..12).map(|_| row(30_000, 480, 4)).collect();
    assert_eq!(judge(&rows, &row(30_000, 0, 4)), None);
}

#[test]
fn memory_growing_past_the_margin_fails_naming_the_node() {
    let rows: Vec<Row> = (0..12)
        .map(|minute| row(30_000 + minute * 2_000, 480, 4))
        .collect();
    let failure = judge(&rows, &row(60_000, 0, 4)).expect("growth");
    assert!(failure.starts_with("node-1: RSS"), "{failure}");
}

#[test]
fn entries_added_by_new_gateways_are_explained() {
    let mut rows: Vec<Row> = (0..12).map(|_| row(30_000, 480, 4)).collect();
    rows[11] = row(30_000, 480 + 2 * 3 + 2 * 16, 7);
    assert_eq!(judge(&rows, &row(30_000, 0, 7)), None);
    rows[11] = row(30_000, 600, 7);
    assert!(judge(&rows, &row(30_000, 0, 7)).is_some());
}

#[test]
fn an_entry_left_after_the_load_fails() {
    let rows: Vec<Row> = (0..12).map(|_| row(30_000, 480, 4)).collect();
    let mut end = row(30_000, 0, 4);
    end.nodes[0].kernel_by_table = vec![("CONNECTIONS".to_owned(), 3)];
    let failure = judge(&rows, &end).expect("left behind");
    assert!(failure.contains("CONNECTIONS 3"), "{failure}");
}
