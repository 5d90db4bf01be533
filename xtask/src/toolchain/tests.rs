use super::*;

#[test]
fn reads_the_pinned_channel() {
    let pin = pinned_nightly().unwrap();
    assert!(pin.starts_with("nightly-"), "{pin}");
    assert_eq!(
        channel("[toolchain]\nchannel = \"nightly-2026-05-20\"\ncomponents = [\"rust-src\"]\n"),
        Some("nightly-2026-05-20".into())
    );
    assert_eq!(channel("[toolchain]\ncomponents = []\n"), None);
}

#[test]
fn the_day_after_a_commit_date() {
    assert_eq!(next_day("2026-05-19").as_deref(), Some("2026-05-20"));
    assert_eq!(next_day("2026-04-30").as_deref(), Some("2026-05-01"));
    assert_eq!(next_day("2026-12-31").as_deref(), Some("2027-01-01"));
    assert_eq!(next_day("2028-02-28").as_deref(), Some("2028-02-29"));
    assert_eq!(next_day("2026-02-28").as_deref(), Some("2026-03-01"));
    assert_eq!(next_day("2026-02-30"), None);
    assert_eq!(next_day("nonsense"), None);
}
