//! Shows, for `cargo xtask demo`, the scale-out incident, reproduced in the lab with the real
//! observer watching, told in a few screens, on any OpenIM release and discovery the lab speaks,
//! with the release's checks (see [`crate::releases`]) one line each.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use serde_json::Value;

use crate::lab::release::PushRouting;
use crate::lab::truth::GroundTruth;
use crate::observed::{NodeObservers, NodeOutput, ObserverOutput, ObserverProcess, Score};
use crate::{Lab, LabConfig, releases};

/// Holds what the demo runs and where it writes.
pub struct DemoConfig {
    pub lab: LabConfig,
    pub observer: PathBuf,
    /// Where the alerts, the observer's capture and the ground truth are written.
    pub out_dir: PathBuf,
}

/// Runs the demo and returns the text to show; progress goes to stderr as it happens.
///
/// # Errors
///
/// Fails when the output directory or a file in it cannot be written, the lab or an observer does
/// not start or stop, or the scenario fails.
pub async fn run(config: DemoConfig) -> anyhow::Result<String> {
    std::fs::create_dir_all(&config.out_dir)
        .with_context(|| format!("create {}", config.out_dir.display()))?;
    let capture = config.out_dir.join("capture.jsonl");
    let (truth, nodes) = if config.lab.nodes > 1 {
        run_with_node_observers(&config).await?
    } else {
        run_with_one_observer(&config, &capture).await?
    };
    let output = merged(&nodes);

    let alerts_path = config.out_dir.join("alerts.jsonl");
    let alert_text: String = output
        .alert_lines
        .iter()
        .map(|line| format!("{line}\n"))
        .collect();
    std::fs::write(&alerts_path, alert_text)
        .with_context(|| format!("write {}", alerts_path.display()))?;
    let truth_path = config.out_dir.join("ground-truth.jsonl");
    truth
        .write_file(&truth_path)
        .with_context(|| format!("write {}", truth_path.display()))?;

    let score = Score::new(&truth, &output.alerts);
    let mut text = String::new();
    what_happened(&mut text, &config.lab, &truth, &score)?;
    what_was_reported(&mut text, &nodes, &output, &score, &alerts_path)?;
    accuracy(&mut text, &truth, &output, &score)?;
    if nodes.len() > 1 {
        writeln!(
            text,
            "\nFiles: {} (alerts), {} (ground truth).",
            alerts_path.display(),
            truth_path.display()
        )?;
    } else {
        writeln!(
            text,
            "\nFiles: {} (alerts), {} (the observer's capture: `observer replay` reads it without \
            root), {} (ground truth).",
            alerts_path.display(),
            capture.display(),
            truth_path.display()
        )?;
    }
    writeln!(
        text,
        "Try `--mode report-fix` (the incident report's fix as written), `--mode correct`, \
        `--openim 3.5|3.6|3.7|3.8|main` and `--discovery etcd`."
    )?;
    Ok(text)
}

/// Tells the lab's ground truth: the release, the scale-out and who missed real time.
fn what_happened(
    text: &mut String,
    lab: &LabConfig,
    truth: &GroundTruth,
    score: &Score,
) -> anyhow::Result<()> {
    let scale = if lab.replicas_initial == lab.replicas_final {
        format!("{} msggateway replicas", lab.replicas_final)
    } else {
        format!(
            "{} → {} msggateway replicas",
            lab.replicas_initial, lab.replicas_final
        )
    };
    let spread = if lab.nodes > 1 {
        format!(" on {} nodes", lab.nodes)
    } else {
        String::new()
    };
    let routing = match truth.routing {
        PushRouting::Ring => "push hashes each recipient over its `…:88` ring",
        PushRouting::Broadcast => "push sends every recipient to every gateway",
    };
    writeln!(
        text,
        "\nOpenIM {} in the lab ({} discovery: {routing}; service {}): proxy mode {}, \
        {scale}{spread}, {} users on mixed platforms\n",
        lab.openim.as_str(),
        lab.discovery.as_str(),
        lab.openim.service(),
        lab.mode.as_str(),
        lab.users + lab.late_users
    )?;
    writeln!(text, "What happened (the lab's ground truth):")?;
    if lab.replicas_initial != lab.replicas_final {
        writeln!(
            text,
            "  {} users connected to {} gateway(s); the cluster scaled out to {} (new pods; proxy \
            and push restarted with {} members); {} more users connected.",
            lab.users, lab.replicas_initial, lab.replicas_final, lab.replicas_final, lab.late_users
        )?;
    }
    writeln!(
        text,
        "  {} group messages pushed; {} of {} connected users silently missed real-time delivery \
        (push sent their message to a gateway that does not hold their WebSocket).",
        truth.summary.messages,
        score.missed.len(),
        truth.summary.connected
    )?;
    let true_causes = releases::CauseScore::new(truth, &[]).true_causes;
    if !true_causes.is_empty() {
        let causes: Vec<String> = true_causes
            .iter()
            .map(|(cause, users)| format!("{cause} {users}"))
            .collect();
        writeln!(text, "  Why, user by user: {}.", causes.join(", "))?;
    }
    if truth.summary.connect_failures > 0 {
        writeln!(
            text,
            "  {} users could not open their WebSocket at all.",
            truth.summary.connect_failures
        )?;
    }
    Ok(())
}

/// Tells what the observers printed: counts by kind, the first mismatch, the incident diagnoses.
fn what_was_reported(
    text: &mut String,
    nodes: &[NodeOutput],
    output: &ObserverOutput,
    score: &Score,
    alerts_path: &std::path::Path,
) -> anyhow::Result<()> {
    let observers = if nodes.len() > 1 {
        "the node observers"
    } else {
        "the observer"
    };
    if nodes.len() > 1 {
        writeln!(
            text,
            "\nWhat the {} node observers reported ({} JSON alert lines on their stdout, saved in \
            {}):",
            nodes.len(),
            output.alerts.len(),
            alerts_path.display()
        )?;
        for node in nodes {
            writeln!(
                text,
                "  {:<26} {} alerts",
                node.node,
                node.output.alerts.len()
            )?;
        }
    } else {
        writeln!(
            text,
            "\nWhat the observer reported ({} JSON alert lines on its stdout, saved in {}):",
            output.alerts.len(),
            alerts_path.display()
        )?;
    }
    for (kind, count) in &score.kinds {
        let unit = if kind == "route_mismatch" {
            format!("{} users", score.alerted.len())
        } else {
            count.to_string()
        };
        writeln!(text, "  {kind:<26} {unit}")?;
    }
    if let Some(first) = output
        .alert_lines
        .iter()
        .find(|line| line.contains("\"kind\":\"route_mismatch\""))
    {
        writeln!(
            text,
            "\n  the first route_mismatch, as {observers} printed it:"
        )?;
        writeln!(text, "  {first}")?;
    }
    for kind in [
        "push_routing",
        "ring_divergence",
        "ws_upgrade_on_grpc_port",
        "push_connection_churn",
    ] {
        if let Some(alert) = first_of(&output.alerts, kind)
            && let Some(diagnosis) = alert["diagnosis"].as_str()
        {
            writeln!(text, "\n  {kind}: {diagnosis}")?;
        }
    }
    Ok(())
}

/// Tells the precision and recall of the per-user alerts, then the release's checks one line each.
fn accuracy(
    text: &mut String,
    truth: &GroundTruth,
    output: &ObserverOutput,
    score: &Score,
) -> anyhow::Result<()> {
    writeln!(
        text,
        "\nAccuracy against the ground truth: precision {:.1}% ({} of {} alerted users really \
        missed a message), recall {:.1}% ({} of {} users who missed one were alerted).",
        score.precision() * 100.0,
        score.alerted.len() - score.false_positives.len(),
        score.alerted.len(),
        score.recall() * 100.0,
        score.missed.len() - score.false_negatives.len(),
        score.missed.len(),
    )?;
    let checks = releases::checks(truth, &output.alerts);
    let failed = checks.iter().filter(|check| !check.passed).count();
    writeln!(
        text,
        "\nWhat OpenIM {} with {} routing requires ({} of {} met):",
        truth.openim.as_str(),
        truth.routing.as_str(),
        checks.len() - failed,
        checks.len()
    )?;
    for check in &checks {
        let mark = if check.passed { "ok  " } else { "FAIL" };
        writeln!(text, "  {mark} {}", check.line)?;
    }
    Ok(())
}

/// Runs one observer for the whole machine, started before the lab, recording its capture.
async fn run_with_one_observer(
    config: &DemoConfig,
    capture: &std::path::Path,
) -> anyhow::Result<(GroundTruth, Vec<NodeOutput>)> {
    let capture_arg = capture.to_string_lossy().into_owned();
    step("starting the observer: loading its eBPF programs into this kernel");
    let observer = ObserverProcess::start(
        &config.observer,
        &[
            "--grpc-port",
            "88",
            "--ws-port",
            "80",
            "--record",
            &capture_arg,
            // The demo's output directory is its own: a rerun replaces the last capture.
            "--overwrite",
        ],
    )?;
    step(&format!(
        "observer attached, copying from {}; starting the lab (every pod is a network namespace)",
        observer.capture_hook()
    ));
    let lab_config = config.lab.clone();
    let outcome = async {
        let mut lab = Lab::start(lab_config).await?;
        let truth = lab.run_scenario().await?;
        drop(lab);
        anyhow::Ok(truth)
    }
    .await;
    step("lab done; stopping the observer");
    let output = observer.stop()?;
    let truth = outcome?;
    Ok((
        truth,
        vec![NodeOutput {
            node: String::new(),
            output,
        }],
    ))
}

/// Runs one observer per simulated node, scoped to the node's cgroup, which exists once the lab
/// does: the lab starts first (its pods only listen until the scenario runs).
async fn run_with_node_observers(
    config: &DemoConfig,
) -> anyhow::Result<(GroundTruth, Vec<NodeOutput>)> {
    step("starting the lab (every pod is a network namespace, every node a cgroup)");
    let mut lab = Lab::start(config.lab.clone()).await?;
    step("starting one observer per node, sharing state through a lab redis-server");
    let observers = NodeObservers::start(
        &config.observer,
        &lab,
        &["--grpc-port", "88", "--ws-port", "80"],
    )?;
    step("observers attached; running the scenario");
    let outcome = lab.run_scenario().await;
    drop(lab);
    step("lab done; stopping the observers");
    let outputs = observers.stop()?;
    Ok((outcome?, outputs))
}

/// Merges every node's alerts together (the cluster's verdict), node by node.
fn merged(nodes: &[NodeOutput]) -> ObserverOutput {
    let mut all = ObserverOutput::default();
    for node in nodes {
        all.alerts.extend(node.output.alerts.iter().cloned());
        all.alert_lines
            .extend(node.output.alert_lines.iter().cloned());
    }
    all
}

fn step(message: &str) {
    eprintln!("demo: {message}");
}

fn first_of<'a>(alerts: &'a [Value], kind: &str) -> Option<&'a Value> {
    alerts.iter().find(|alert| alert["kind"] == kind)
}
