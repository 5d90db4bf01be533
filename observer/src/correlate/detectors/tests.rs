use super::testing::*;

#[test]
fn a_full_fold_table_closes_the_windows_that_ended_to_fold_a_new_key() {
    let limits = RouteLimits {
        max_fold_keys: 2,
        fold_window_secs: 10,
        ..RouteLimits::default()
    };
    let mut table = Detectors::new(limits);
    for (index, user) in ["u1", "u2", "u3", "u4", "u5"].iter().enumerate() {
        place(&mut table, 100 + index as u64, user, 0, SEC);
    }
    // Two keys fill the table; the third is emitted unfolded.
    push(&mut table, 1, &["u1", "u2"], 1, 2 * SEC, false);
    assert_eq!(
        kinds(&push(&mut table, 2, &["u3"], 1, 2 * SEC, false)).len(),
        1
    );
    assert_eq!(table.counters().fold_keys_evicted, 1);
    // Windows still open half a second later: the next key is unfolded too.
    push(&mut table, 3, &["u4"], 1, 2 * SEC + SEC / 2, false);
    assert_eq!(table.counters().fold_keys_evicted, 2);
    // Once the first windows have ended, the next new key closes them and is folded.
    let alerts = push(&mut table, 4, &["u5"], 1, 13 * SEC, false);
    assert_eq!(kinds(&alerts), ["route_mismatch"]);
    assert_eq!(table.counters().fold_keys_evicted, 2);
    assert_eq!(table.folds.open_windows(), 1);
}

#[test]
fn every_placed_recipient_counts_as_judged_whether_misrouted_or_not() {
    let mut table = Detectors::new(RouteLimits::default());
    place(&mut table, 1, "u1", 0, SEC);
    place(&mut table, 2, "u2", 0, SEC);
    // u1 and u2 are misrouted; the stranger has no placement to judge against.
    let alerts = push(&mut table, 3, &["u1", "u2", "stranger"], 3, 2 * SEC, false);
    assert_eq!(kinds(&alerts), ["route_mismatch", "route_mismatch"]);
    assert_eq!(table.counters().push_recipients_judged, 2);
    // Delivered where it is placed: judged all the same.
    assert!(push(&mut table, 4, &["u1"], 0, 3 * SEC, true).is_empty());
    // A repeat folded into its window is judged again.
    assert!(push(&mut table, 5, &["u2"], 3, 4 * SEC, false).is_empty());
    assert_eq!(table.counters().push_recipients_judged, 4);
}

#[test]
fn a_push_to_the_placing_gateway_is_silent() {
    let mut table = Detectors::new(RouteLimits::default());
    place(&mut table, 1, "u1", 0, SEC);
    assert!(push(&mut table, 2, &["u1"], 0, 2 * SEC, true).is_empty());
}

#[test]
fn a_push_elsewhere_is_a_mismatch_with_the_gateways_answer() {
    let mut table = Detectors::new(RouteLimits::default());
    place(&mut table, 1, "u1", 0, SEC);
    // The proxy has placed someone on gateway 3 too, so both spellings of it are known.
    place(&mut table, 9, "u9", 3, SEC);
    let alerts = push(&mut table, 2, &["u1"], 3, 2 * SEC, false);
    assert_eq!(kinds(&alerts), ["route_mismatch"]);
    let json: serde_json::Value = serde_json::from_str(&alerts[0].to_json_line()).unwrap();
    assert_eq!(json["kind"], "route_mismatch");
    assert_eq!(json["schema_version"], 1);
    assert_eq!(json["user"], "u1");
    assert_eq!(json["placed_on"][0]["gateway"]["ip"], "10.244.0.10");
    assert_eq!(json["placed_on"][0]["platforms"][0], 2);
    assert_eq!(json["pushed_to"]["gateway"]["ip"], "10.244.0.13");
    assert_eq!(json["pushed_to"]["answer"], "empty_entry");
    assert_eq!(json["pushed_to"]["message"]["client_msg_id"], "c1");
    let diagnosis = json["diagnosis"].as_str().unwrap();
    assert!(diagnosis.contains("missed real time"), "{diagnosis}");
    assert!(diagnosis.contains("':88'"), "{diagnosis}");
}

#[test]
fn unplaced_users_and_closed_placements_are_not_judged() {
    let mut table = Detectors::new(RouteLimits::default());
    assert!(push(&mut table, 2, &["stranger"], 3, SEC, false).is_empty());
    place(&mut table, 1, "u1", 0, SEC);
    table.observe(
        Observation::ConnectionClosed {
            connection: 1,
            ts_ns: 2 * SEC,
        },
        &mut Vec::new(),
    );
    assert!(push(&mut table, 3, &["u1"], 3, 3 * SEC, false).is_empty());
    // A refused upgrade is no placement either.
    table.observe(
        Observation::UpgradeRequested {
            connection: 4,
            endpoints: endpoints(4, 0),
            ts_ns: 4 * SEC,
            user: "u2".into(),
            platform: None,
            gateway: gateway(0, 80, None),
            proxy: process(10, "p"),
        },
        &mut Vec::new(),
    );
    table.observe(
        Observation::UpgradeAnswered {
            connection: 4,
            ts_ns: 4 * SEC,
            status: 400,
        },
        &mut Vec::new(),
    );
    assert!(push(&mut table, 5, &["u2"], 3, 5 * SEC, false).is_empty());
}

#[test]
fn repeats_fold_into_one_count_per_window() {
    let mut table = Detectors::new(RouteLimits::default());
    place(&mut table, 1, "u1", 0, SEC);
    let mut alerts = Vec::new();
    for second in 2..12 {
        alerts.extend(push(
            &mut table,
            100 + second,
            &["u1"],
            3,
            second * SEC,
            false,
        ));
    }
    assert_eq!(alerts.len(), 1, "first one at once");
    table.tick(70 * SEC, &mut alerts);
    assert_eq!(alerts.len(), 2, "the window's summary");
    let AlertBody::RouteMismatch(RouteMismatch { count, .. }) = &*alerts[1].body else {
        panic!("{:?}", alerts[1]);
    };
    assert_eq!(*count, 10);
}
