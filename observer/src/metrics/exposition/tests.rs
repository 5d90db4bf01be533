use super::*;

#[test]
fn accept_headers_pick_the_format_prometheus_asked_for() {
    // Prometheus 2.x's default scrape protocols, then 3.x's, then a curl.
    for (accept, format) in [
        (
            Some(
                "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
            ),
            Format::OpenMetrics,
        ),
        (
            Some(
                "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1",
            ),
            Format::OpenMetrics,
        ),
        (Some("text/plain;version=0.0.4;q=1,*/*;q=0.1"), Format::Text),
        (
            Some("text/plain;version=0.0.4,application/openmetrics-text;q=0.5"),
            Format::Text,
        ),
        (Some("*/*"), Format::Text),
        (
            Some("application/openmetrics-text; version=9.9.9"),
            Format::Text,
        ),
        (Some("application/openmetrics-text;q=0"), Format::Text),
        (None, Format::Text),
    ] {
        assert_eq!(Format::negotiate(accept), format, "{accept:?}");
    }
}

#[test]
fn the_text_format_names_counters_by_their_samples() {
    let openmetrics = "# HELP x_events Events.\n# TYPE x_events counter\nx_events_total 3\n\
            # HELP x_up Up.\n# TYPE x_up gauge\nx_up 1\n\
            # HELP x_wait_seconds Wait.\n# TYPE x_wait_seconds histogram\n# UNIT x_wait_seconds seconds\n\
            x_wait_seconds_sum 0.5\n# EOF\n";
    let expected = "# HELP x_events_total Events.\n# TYPE x_events_total counter\nx_events_total 3\n\
            # HELP x_up Up.\n# TYPE x_up gauge\nx_up 1\n\
            # HELP x_wait_seconds Wait.\n# TYPE x_wait_seconds histogram\n\
            x_wait_seconds_sum 0.5\n";
    assert_eq!(to_text_format(openmetrics), expected);
}
