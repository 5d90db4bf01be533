use super::*;

#[test]
fn times_are_rfc3339() {
    assert!(is_rfc3339("2026-12-07T00:00:00.123456Z"));
    assert!(is_rfc3339("2026-12-07T00:00:00+01:00"));
    assert!(!is_rfc3339("2026-12-07 00:00:00Z"));
    assert!(!is_rfc3339("yesterday"));
}

#[test]
fn lines_that_do_not_fit_are_named_by_path() {
    let schema = schema();
    let line = json!({"schema_version": 1, "ts": "2026-12-07T00:00:00Z", "kind": "push_routing",
            "node": "n", "service": "s", "routing": "ring", "gateways": 2, "diagnosis": "d"});
    assert_eq!(validate(&schema, &line), Ok(()));
    let mut extra = line.clone();
    extra["surprise"] = json!(1);
    assert!(
        validate(&schema, &extra)
            .unwrap_err()
            .to_string()
            .starts_with("$.surprise")
    );
    let mut wrong = line.clone();
    wrong["routing"] = json!("anycast");
    assert!(validate(&schema, &wrong).is_err());
    let mut unknown = line;
    unknown["kind"] = json!("mystery");
    assert!(validate(&schema, &unknown).is_err());
}

#[test]
fn only_additions_keep_a_version() {
    let shipped = schema();
    assert!(breaking_changes(&shipped, &shipped).is_empty());
    let mut added = shipped.clone();
    added["$defs"]["push_routing"]["properties"]["new_field"] = string();
    assert!(breaking_changes(&shipped, &added).is_empty());
    let mut retyped = shipped.clone();
    retyped["$defs"]["push_routing"]["properties"]["gateways"] = integer();
    assert_eq!(
        breaking_changes(&shipped, &retyped),
        ["$defs/push_routing/gateways: minimum changed"]
    );
    let mut required = shipped.clone();
    required["$defs"]["pod"]["required"] = json!(["namespace", "name", "container"]);
    assert_eq!(
        breaking_changes(&shipped, &required),
        ["$defs/pod: required fields changed"]
    );
}

/// The shipped file of this version is this module's schema, and no change since a
/// version's file was written breaks it: raise `SCHEMA_VERSION` for one that does.
/// `OBSERVER_WRITE_SCHEMA=1` writes the current version's file.
#[test]
fn the_shipped_schema_is_the_generated_one() {
    let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/schema");
    let path = folder.join(file_name(SCHEMA_VERSION));
    let current = schema_text();
    if std::env::var_os("OBSERVER_WRITE_SCHEMA").is_some() {
        if let Ok(shipped) = std::fs::read_to_string(&path) {
            let shipped: Value = serde_json::from_str(&shipped).expect("shipped schema");
            let broken = breaking_changes(&shipped, &schema());
            assert!(broken.is_empty(), "raise SCHEMA_VERSION: {broken:?}");
        }
        std::fs::write(&path, &current).expect("write the schema");
    }
    let shipped = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let shipped_value: Value = serde_json::from_str(&shipped).expect("shipped schema");
    let broken = breaking_changes(&shipped_value, &schema());
    assert!(
        broken.is_empty(),
        "{} breaks the shipped schema of version {SCHEMA_VERSION}: raise SCHEMA_VERSION \
             ({broken:?})",
        path.display()
    );
    assert!(
        shipped == current,
        "{} differs from the generated schema: run OBSERVER_WRITE_SCHEMA=1 cargo test -p \
             observer --lib alert::schema",
        path.display()
    );
}
