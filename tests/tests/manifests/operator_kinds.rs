//! The Prometheus operator's kinds the monitoring component ships (`monitoring.coreos.com/v1`),
//! with the fields of its CRDs that the observer's manifests may use. k8s-openapi has no type
//! for them; these play its part in the typed round trip, so a misspelt or misplaced field is
//! lost on the way back and reported, as for the built-in kinds.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};

/// The group and version of both kinds.
pub const API_VERSION: &str = "monitoring.coreos.com/v1";

/// A `PodMonitor`: which pods the operator's Prometheus scrapes, and how.
#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodMonitor {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: PodMonitorSpec,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodMonitorSpec {
    pub selector: LabelSelector,
    pub pod_metrics_endpoints: Vec<PodMetricsEndpoint>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<NamespaceSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_label: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_target_labels: Option<Vec<String>>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceSelector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub any: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_names: Option<Vec<String>>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodMetricsEndpoint {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrape_timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub honor_labels: Option<bool>,
}

/// A `PrometheusRule`: rule groups as in a Prometheus rules file.
#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusRule {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: PrometheusRuleSpec,
}

#[derive(Debug, Deserialize, Serialize)]
pub struct PrometheusRuleSpec {
    pub groups: Vec<RuleGroup>,
}

#[derive(Debug, Deserialize, Serialize)]
pub struct RuleGroup {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    pub rules: Vec<Rule>,
}

/// An alerting rule (`alert`) or a recording rule (`record`).
#[derive(Debug, Deserialize, Serialize)]
pub struct Rule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<String>,
    pub expr: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r#for: Option<String>,
    #[serde(
        default,
        rename = "keep_firing_for",
        skip_serializing_if = "Option::is_none"
    )]
    pub keep_firing_for: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}
