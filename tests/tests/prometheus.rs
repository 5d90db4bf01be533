//! The observer's metrics, alert rules and dashboard as a real Prometheus reads them: the shipped
//! rules pass `promtool`'s checks and unit tests; a Prometheus scraping an observer that watches
//! the lab's 3.5.1 misrouting types every series as meant, fires the route-mismatch rule, and
//! evaluates every panel query of the Grafana dashboard.
//!
//! Needs Debian's `prometheus` package (`prometheus`, `promtool`); the live test also needs root
//! and the eBPF programs. Without them the tests skip and say why.

#[path = "../src/prometheus_server.rs"]
mod prometheus_server;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use prometheus_server::{PrometheusServer, available, promtool};
use serde_json::Value;
use tests::observed::{ObserverProcess, find_observer_binary};
use tests::privileges::{Needs, can_run};
use tests::{Lab, LabConfig, ProxyMode};

/// The job name the test Prometheus scrapes the observer as (the rules match `openim-observer`).
const JOB: &str = "openim-observer";

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn rules_text() -> String {
    std::fs::read_to_string(deploy().join("prometheus/rules.yaml")).expect("rules.yaml")
}

#[test]
fn shipped_rules_pass_promtool_checks_and_unit_tests() {
    if !available("promtool") {
        return;
    }
    let dir = deploy().join("prometheus");
    for args in [
        &["check", "rules", "rules.yaml"][..],
        &["test", "rules", "rules_test.yaml"][..],
    ] {
        let output = promtool(&dir, args).expect("promtool runs");
        assert!(
            output.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// The PrometheusRule's groups, for the Prometheus operator, are the plain rules file's.
#[test]
fn the_prometheus_rule_holds_the_rules_file() {
    let read = |path: &Path| -> Value {
        let text = std::fs::read_to_string(path).expect("readable");
        serde_norway::from_str(&text).expect("YAML")
    };
    let rules = read(&deploy().join("prometheus/rules.yaml"));
    let resource = read(&deploy().join("kubernetes/components/monitoring/prometheusrule.yaml"));
    assert_eq!(resource["kind"], "PrometheusRule");
    assert_eq!(
        resource["spec"]["groups"], rules["groups"],
        "deploy/kubernetes/components/monitoring/prometheusrule.yaml's groups differ from \
        deploy/prometheus/rules.yaml"
    );
}

/// The dashboard's queries, with Grafana's variables as a Prometheus evaluates them.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(deploy().join("grafana/openim-observer.json"))
        .expect("the dashboard");
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 6, "{} panels", panels.len());
    panels
        .iter()
        .flat_map(|panel| {
            let title = panel["title"].as_str().unwrap_or_default().to_owned();
            panel["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |target| (title.clone(), target["expr"].as_str().unwrap_or_default()))
                .map(|(title, expr)| {
                    let expr = expr
                        .replace("$__rate_interval", "1m")
                        .replace("$instance", ".+");
                    (title, expr)
                })
        })
        .collect()
}

fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a free port");
    listener.local_addr().expect("bound").port()
}

/// The rules with every `for:` at one second, as the live test evaluates them.
fn quick_rules() -> String {
    rules_text()
        .lines()
        .map(|line| match line.split_once("for: ") {
            Some((indent, _)) if indent.trim().is_empty() => format!("{indent}for: 1s"),
            _ => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_real_prometheus_scrapes_the_observer_and_fires_on_the_labs_misrouting() {
    if !can_run(Needs::RootAndPrograms) || !available("prometheus") {
        return;
    }
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let observer_binary = find_observer_binary().expect("observer binary");
    let observer = ObserverProcess::start(&observer_binary, &["--metrics-addr", &metrics_addr])
        .expect("observer attaches");
    let prometheus =
        PrometheusServer::start(JOB, &[&metrics_addr], Some(&quick_rules())).expect("prometheus");
    prometheus
        .wait_for_targets(JOB)
        .expect("the observer scraped");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let fired = runtime.block_on(async {
        // 3.5.1's misrouting with enough pushes that push's routing is learned during the
        // run (misses are held until it is), as tests/tests/end_to_end.rs runs it.
        let config = LabConfig {
            replicas_initial: 3,
            replicas_final: 3,
            users: 30,
            messages_per_user: 5,
            ..LabConfig::default()
        };
        let mut lab = Lab::start(config).await.expect("lab starts");
        lab.run_scenario().await.expect("scenario runs");
        wait_for_firing(&prometheus, "OpenIMUsersMissingRealTimeMessages").await
    });
    check_metadata(&prometheus);
    lint_text_format(&metrics_addr);
    // Started means attached: ready.
    let (head, _) = http_get(&metrics_addr, "/readyz");
    assert!(head.starts_with("HTTP/1.1 200"), "/readyz: {head}");
    for (title, expr) in dashboard_queries() {
        if let Err(error) = prometheus.query(&expr) {
            panic!("dashboard panel {title:?}: {expr}: {error}");
        }
    }
    // The share of push recipients misrouted has both its terms: the lab misroutes some of the
    // recipients the observer judged, not all of them.
    let total = |expr: &str| -> f64 {
        let answer = prometheus.query(expr).expect("query");
        answer["result"][0]["value"][1]
            .as_str()
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("{expr}: no value: {answer}"))
    };
    let judged = total("sum(openim_observer_push_recipients_judged_total)");
    let misrouted = total("sum(openim_observer_misrouted_recipients_total)");
    assert!(
        misrouted > 0.0 && misrouted < judged,
        "{misrouted} recipients misrouted of {judged} judged"
    );
    let output = observer.stop().expect("observer stops");
    let mismatches = output
        .alerts
        .iter()
        .filter(|alert| alert["kind"] == "route_mismatch")
        .count();
    assert!(
        mismatches > 0,
        "the lab's misrouting raised no route_mismatch"
    );
    assert!(
        fired,
        "OpenIMUsersMissingRealTimeMessages never fired: {:?}\nseries: {:?}\nup: {:?}\nmismatch \
        ts: {:?}\nnow {:?}\n{}",
        prometheus.api("/api/v1/alerts"),
        prometheus.query("openim_observer_alerts_total{kind=\"route_mismatch\"}[3m]"),
        prometheus.query("up[3m]"),
        output
            .alerts
            .iter()
            .filter(|alert| alert["kind"] == "route_mismatch")
            .map(|alert| alert["ts"].clone())
            .collect::<Vec<_>>(),
        std::time::SystemTime::now(),
        prometheus.log()
    );
}

/// `GET path` from the observer's metrics endpoint: the response's head and body.
fn http_get(metrics_addr: &str, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(metrics_addr).expect("metrics port");
    write!(stream, "GET {path} HTTP/1.0\r\n\r\n").expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    let (head, body) = response.split_once("\r\n\r\n").expect("a head");
    (head.to_owned(), body.to_owned())
}

/// The plain text format (what a scraper that does not ask for OpenMetrics gets) passes
/// `promtool check metrics`, Prometheus' own linter of that format.
fn lint_text_format(metrics_addr: &str) {
    use std::io::Write;
    let (head, body) = http_get(metrics_addr, "/metrics");
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8"),
        "{head}"
    );
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(body.as_bytes())
        .expect("write to promtool");
    let output = child.wait_with_output().expect("promtool ends");
    assert!(
        output.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A capture degraded on purpose, as tests/tests/blindness.rs degrades it (a one-page ring, the
/// observer paused at the start of a push flood), fires the capture-degraded rule. The episode
/// is kept open (a long quiet time) so that the rule's one-second `for:` sees it.
#[test]
fn a_real_prometheus_fires_on_capture_degraded_on_purpose() {
    if !can_run(Needs::RootAndPrograms) || !available("prometheus") {
        return;
    }
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let observer = ObserverProcess::start(
        &find_observer_binary().expect("observer binary"),
        &[
            "--grpc-port",
            "88",
            "--ws-port",
            "80",
            "--ring-bytes",
            "4096",
            "--degraded-quiet-secs",
            "120",
            "--metrics-addr",
            &metrics_addr,
        ],
    )
    .expect("observer attaches");
    let prometheus =
        PrometheusServer::start(JOB, &[&metrics_addr], Some(&quick_rules())).expect("prometheus");
    prometheus
        .wait_for_targets(JOB)
        .expect("the observer scraped");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let fired = runtime.block_on(async {
        let mut lab = Lab::start(LabConfig {
            mode: ProxyMode::Correct,
            replicas_initial: 2,
            replicas_final: 2,
            users: 20,
            lab_binary: Some(PathBuf::from(env!("CARGO_BIN_EXE_openim-lab"))),
            ..LabConfig::default()
        })
        .await
        .expect("lab starts");
        lab.connect_users(0..20, false).await;
        observer.pause();
        let resume = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            observer.resume();
        };
        let (report, ()) = tokio::join!(lab.push_flood(Duration::from_secs(4)), resume);
        report.expect("push flood");
        drop(lab);
        wait_for_firing(&prometheus, "OpenIMObserverCaptureDegraded").await
    });
    let output = observer.stop().expect("observer stops");
    let degraded = output
        .alerts
        .iter()
        .any(|alert| alert["kind"] == "capture_degraded" && alert["reason"] == "ring_full");
    assert!(
        degraded,
        "the tiny ring raised no capture_degraded ring_full"
    );
    assert!(
        fired,
        "OpenIMObserverCaptureDegraded never fired: {:?}\nseries: {:?}\n{}",
        prometheus.api("/api/v1/alerts"),
        prometheus.query("openim_observer_capture_degraded"),
        prometheus.log()
    );
}

/// Waits up to 60 s for `alert` to be firing in Prometheus' `/api/v1/alerts`.
async fn wait_for_firing(prometheus: &PrometheusServer, alert: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let alerts = prometheus.api("/api/v1/alerts").expect("alerts API");
        let firing = alerts["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|one| one["labels"]["alertname"] == alert && one["state"] == "firing");
        if firing {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    false
}

/// Every series the observer exports has a type and help in Prometheus' metadata, none
/// `unknown`, and every counter's series end in `_total`.
fn check_metadata(prometheus: &PrometheusServer) {
    let selector = prometheus_server::encode_query(&format!("{{job=\"{JOB}\"}}"));
    let metadata = prometheus
        .api(&format!("/api/v1/targets/metadata?match_target={selector}"))
        .expect("target metadata");
    let mut types = BTreeMap::new();
    for entry in metadata.as_array().expect("a list") {
        let metric = entry["metric"].as_str().expect("metric").to_owned();
        let kind = entry["type"].as_str().expect("type").to_owned();
        assert!(
            !entry["help"].as_str().unwrap_or_default().is_empty(),
            "{metric} has no help"
        );
        assert_ne!(kind, "unknown", "{metric} is typed unknown");
        types.insert(metric, kind);
    }
    assert!(types.len() > 20, "only {} families: {types:?}", types.len());
    // The same through the metadata API across targets.
    let families = prometheus.api("/api/v1/metadata").expect("metadata");
    for (metric, kind) in &types {
        let listed = families[metric.as_str()]
            .as_array()
            .is_some_and(|entries| entries.iter().any(|entry| entry["type"] == kind.as_str()));
        assert!(listed, "{metric} ({kind}) missing from /api/v1/metadata");
    }
    let series = prometheus
        .api(&format!("/api/v1/series?match[]={selector}"))
        .expect("series");
    let names: BTreeSet<String> = series
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|labels| labels["__name__"].as_str().map(str::to_owned))
        // Prometheus' own: the scrape's and the rules' series (alerts, and recording rules,
        // named `level:metric:operations`).
        .filter(|name| {
            !name.starts_with("scrape_")
                && !name.starts_with("ALERTS")
                && name != "up"
                && !name.contains(':')
        })
        .collect();
    for name in &names {
        let family = ["_total", "_bucket", "_sum", "_count", "_created", "_info"]
            .iter()
            .filter_map(|suffix| name.strip_suffix(suffix))
            .find(|family| types.contains_key(*family))
            .unwrap_or(name);
        let kind = types
            .get(family)
            .unwrap_or_else(|| panic!("{name}: no metadata (family {family})"));
        if kind == "counter" {
            assert!(
                name.ends_with("_total"),
                "counter series {name} lacks _total"
            );
        }
    }
    for family in [
        "openim_observer_events",
        "process_cpu_seconds",
        "openim_observer_alerts",
    ] {
        assert_eq!(
            types.get(family).map(String::as_str),
            Some("counter"),
            "{family}"
        );
    }
}
