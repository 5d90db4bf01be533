//! `cargo xtask demo`: the scale-out incident, reproduced in the lab with the real observer
//! watching, told in a few screens.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use serde_json::Value;

use crate::lab::truth::GroundTruth;
use crate::observed::{NodeObservers, NodeOutput, ObserverOutput, ObserverProcess, Score};
use crate::{Lab, LabConfig};

pub struct DemoConfig {
    pub lab: LabConfig,
    pub observer: PathBuf,
    /// Where the alerts, the observer's capture and the ground truth are written.
    pub out_dir: PathBuf,
}

/// Runs the demo and returns the text to show; progress goes to stderr as it happens.
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
    let lab = &config.lab;
    let mut text = String::new();
    let observers = if nodes.len() > 1 {
        "the node observers"
    } else {
        "the observer"
    };
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
    writeln!(
        text,
        "\nOpenIM 3.5.1 in the lab: proxy mode {}, {scale}{spread}, {} users\n",
        lab.mode.as_str(),
        lab.users + lab.late_users
    )?;
    writeln!(text, "What happened (the lab's ground truth):")?;
    if lab.replicas_initial != lab.replicas_final {
        writeln!(
            text,
            "  {} users connected to {} gateway(s); the cluster scaled out to {} (new pods; proxy and push restarted with {} members); {} more users connected.",
            lab.users, lab.replicas_initial, lab.replicas_final, lab.replicas_final, lab.late_users
        )?;
    }
    writeln!(
        text,
        "  {} group messages pushed; {} of {} connected users silently missed real-time delivery (push sent their message to a gateway that does not hold their WebSocket).",
        truth.summary.messages,
        score.missed.len(),
        truth.summary.connected
    )?;
    if truth.summary.connect_failures > 0 {
        writeln!(
            text,
            "  {} users could not open their WebSocket at all.",
            truth.summary.connect_failures
        )?;
    }
    if nodes.len() > 1 {
        writeln!(
            text,
            "\nWhat the {} node observers reported ({} JSON alert lines on their stdout, saved in {}):",
            nodes.len(),
            output.alerts.len(),
            alerts_path.display()
        )?;
        for node in &nodes {
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
    writeln!(
        text,
        "\nAccuracy against the ground truth: precision {:.1}% ({} of {} alerted users really missed a message), recall {:.1}% ({} of {} users who missed one were alerted).",
        score.precision() * 100.0,
        score.alerted.len() - score.false_positives.len(),
        score.alerted.len(),
        score.recall() * 100.0,
        score.missed.len() - score.false_negatives.len(),
        score.missed.len(),
    )?;
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
            "\nFiles: {} (alerts), {} (the observer's capture: `observer replay` reads it without root), {} (ground truth).",
            alerts_path.display(),
            capture.display(),
            truth_path.display()
        )?;
    }
    writeln!(
        text,
        "Try `--mode report-fix` (the incident report's fix as written) and `--mode correct`."
    )?;
    Ok(text)
}

/// One observer for the whole machine, started before the lab, recording its capture.
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

/// One observer per simulated node, scoped to the node's cgroup, which exists once the lab
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

/// Every node's alerts together (the cluster's verdict), node by node.
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
