use super::*;

/// Spelled as humantime spells RFC 3339 with microseconds: across leap days, the turns
/// of years and centuries (2000 is a leap year, 2100 is not) and the end of u64.
#[test]
fn rfc3339_matches_humantime_everywhere() {
    let day = 86_400 * NANOS_PER_SEC;
    let mut instants = vec![0, 1, 999, 1_000, NANOS_PER_SEC - 1, u64::MAX];
    for day_number in (0..200_000u64).step_by(7) {
        instants.push(day_number * day + day_number * 1_234_567_891 % day);
    }
    for leap_day in ["2000-02-29", "2024-02-29", "2100-02-28", "2100-03-01"] {
        let midnight = humantime::parse_rfc3339(&format!("{leap_day}T00:00:00Z")).unwrap();
        let ns = midnight
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        instants.extend([ns - 1, ns, ns + day - 1]);
    }
    for ts_ns in instants {
        let time = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ts_ns);
        let expected = humantime::format_rfc3339_micros(time).to_string();
        assert_eq!(rfc3339(ts_ns), expected, "at {ts_ns} ns");
    }
}
