//! Runs the offline subcommands that answer routing questions without a cluster: which member a
//! ring picks for each user (`ring`), how many users OpenIM's two rings send to different gateways
//! (`audit`), and why one user is split (`explain`).
//!
//! OpenIM's msggateway-proxy places a user's WebSocket with a ring over member strings of one
//! spelling, and push delivers with a ring over another spelling of the same gateways. Gateways
//! are compared by index (`{i}` in the templates), since the two rings never share a string.

use std::fs;
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;
use thiserror::Error;

use crate::lines::{BoundedLines, LineError};
use crate::openim::{
    diagnosis::{self, Explanation, Pick},
    hashring::{
        MemberTemplate, PROXY_MEMBER_TEMPLATE, PUSH_MEMBER_TEMPLATE, Ring, RingError,
        sample_user_ids,
    },
    members::describe_member_difference,
};

/// Describes the errors a user of the tools can cause; each displays as one self-contained line.
#[derive(Debug, Error)]
pub enum ToolError {
    #[error("cannot read {}: {reason}", path.display())]
    ReadFile { path: PathBuf, reason: LineError },
    #[error("cannot read user ids from standard input: {reason}")]
    ReadStdin { reason: LineError },
    #[error("{} lists more than {max} entries", path.display())]
    TooManyLines { path: PathBuf, max: usize },
    #[error("{} lists no members (expected one member string per line)", path.display())]
    NoMembers { path: PathBuf },
    #[error("{} lists no user ids (expected one user id per line)", path.display())]
    NoUsers { path: PathBuf },
    #[error("--sample must be 1..={MAX_SAMPLE}")]
    BadSample,
    #[error("--replicas must be 1..={MAX_REPLICAS}: OpenIM runs one msggateway or more")]
    BadReplicas,
    #[error("bad {flag}: {reason}")]
    BadTemplate {
        flag: &'static str,
        reason: RingError,
    },
    #[error("cannot write output: {0}")]
    Write(io::Error),
}

/// Bounds the gateways a deployment can be given: far beyond any OpenIM cluster, and rings of this
/// many members stay small.
pub const MAX_REPLICAS: usize = 1024;
/// Bounds the synthetic user ids `audit` may generate.
pub const MAX_SAMPLE: usize = 1_000_000;
/// Bounds the users `audit` reads from a file (it holds them all).
pub const MAX_AUDIT_USERS: usize = 1_000_000;
/// Bounds the members a ring file may list.
pub const MAX_MEMBERS: usize = 10_000;
/// Bounds the bytes of one user id or member string (a member is a DNS name and a port).
pub const MAX_LINE_BYTES: usize = 512;

/// Pick a member for each user id, as the Go library would, over members listed in a file.
#[derive(Args, Debug)]
pub struct RingArgs {
    /// File with the ring's member strings, one per line, in the order they are added
    /// (blank lines and trailing whitespace are ignored)
    #[arg(long, value_name = "FILE")]
    pub members_file: PathBuf,
    /// File with user ids, one per line [default: standard input]
    #[arg(long, value_name = "FILE")]
    pub users_file: Option<PathBuf>,
}

impl RingArgs {
    /// Prints one `{"user":…,"member":…}` JSON object per line, in input order.
    ///
    /// # Errors
    ///
    /// Fails with [`ToolError::ReadFile`] or [`ToolError::TooManyLines`] when the members file
    /// cannot be read or is too long, [`ToolError::NoMembers`] when it lists none,
    /// [`ToolError::ReadFile`] or [`ToolError::ReadStdin`] when a user id cannot be read, and
    /// [`ToolError::Write`] when `out` cannot be written.
    pub fn run(self, out: &mut impl Write) -> Result<(), ToolError> {
        let members = read_nonblank_lines(&self.members_file, MAX_MEMBERS)?;
        if members.is_empty() {
            return Err(ToolError::NoMembers {
                path: self.members_file,
            });
        }
        let ring = Ring::new(members);
        // Stream the users so that a pipeline sees each pick as soon as its id arrives.
        match &self.users_file {
            Some(path) => {
                let file = fs::File::open(path).map_err(|reason| ToolError::ReadFile {
                    path: path.clone(),
                    reason: reason.into(),
                })?;
                self.pick_each_user(&ring, io::BufReader::new(file), out, |reason| {
                    ToolError::ReadFile {
                        path: path.clone(),
                        reason,
                    }
                })
            }
            None => self.pick_each_user(&ring, io::stdin().lock(), out, |reason| {
                ToolError::ReadStdin { reason }
            }),
        }
    }

    fn pick_each_user(
        &self,
        ring: &Ring,
        users: impl BufRead,
        out: &mut impl Write,
        read_error: impl Fn(LineError) -> ToolError,
    ) -> Result<(), ToolError> {
        for line in BoundedLines::new(users, MAX_LINE_BYTES) {
            let (_, line) = line.map_err(&read_error)?;
            let user = line.trim_end();
            if user.is_empty() {
                continue;
            }
            let member = ring.get(user).map_err(|_| ToolError::NoMembers {
                path: self.members_file.clone(),
            })?;
            write_json_line(out, &RingPick { user, member })?;
        }
        Ok(())
    }
}

/// Fixes the contract other tools parse: exactly these two keys.
#[derive(Serialize)]
struct RingPick<'a> {
    user: &'a str,
    member: &'a str,
}

/// One OpenIM deployment: how many gateways, and how each routing component spells them.
#[derive(Args, Debug)]
pub struct DeploymentArgs {
    /// Number of msggateway replicas (MY_MSGGATEWAY_REPLICACOUNT), 1 to 1024
    #[arg(long, value_name = "N", value_parser = in_range(1, MAX_REPLICAS))]
    pub replicas: usize,
    /// OpenIM instance name: the pod name up to its first '-' (e.g. "demo" for
    /// demo-openim-push-7d9f…)
    #[arg(long, value_name = "NAME")]
    pub instance: String,
    /// Kubernetes namespace of the OpenIM pods
    #[arg(long, value_name = "NS")]
    pub namespace: String,
    /// How msggateway-proxy spells gateway {i}; placeholders {instance}, {namespace}, {i}
    #[arg(long, value_name = "TEMPLATE", default_value = PROXY_MEMBER_TEMPLATE)]
    pub proxy_template: String,
    /// How push spells gateway {i}; placeholders {instance}, {namespace}, {i}
    #[arg(long, value_name = "TEMPLATE", default_value = PUSH_MEMBER_TEMPLATE)]
    pub push_template: String,
}

/// Holds the parsed templates of a deployment, ready to build rings of any size.
struct Templates {
    proxy: MemberTemplate,
    push: MemberTemplate,
    instance: String,
    namespace: String,
}

impl DeploymentArgs {
    fn templates(&self) -> Result<Templates, ToolError> {
        if !(1..=MAX_REPLICAS).contains(&self.replicas) {
            return Err(ToolError::BadReplicas);
        }
        let parse = |flag, template: &str| {
            MemberTemplate::parse(template)
                .map_err(|reason| ToolError::BadTemplate { flag, reason })
        };
        Ok(Templates {
            proxy: parse("--proxy-template", &self.proxy_template)?,
            push: parse("--push-template", &self.push_template)?,
            instance: self.instance.clone(),
            namespace: self.namespace.clone(),
        })
    }
}

impl Templates {
    fn rings(&self, replicas: usize) -> GatewayRings {
        let members =
            |template: &MemberTemplate| template.members(&self.instance, &self.namespace, replicas);
        GatewayRings {
            proxy: Ring::new(members(&self.proxy)),
            push: Ring::new(members(&self.push)),
        }
    }

    /// Returns the plain-words difference between the two spellings of gateway 0.
    fn difference(&self) -> (bool, String) {
        let members = |template: &MemberTemplate| {
            template
                .members(&self.instance, &self.namespace, 1)
                .pop()
                .unwrap_or_default()
        };
        let (proxy, push) = (members(&self.proxy), members(&self.push));
        (proxy != push, describe_member_difference(&proxy, &push))
    }
}

/// Holds OpenIM's two rings over the same gateways.
struct GatewayRings {
    proxy: Ring,
    push: Ring,
}

impl GatewayRings {
    /// Returns the gateway indexes (proxy, push) for `user`.
    fn gateways(&self, user: &str) -> Result<(usize, usize), ToolError> {
        let pick = |ring: &Ring| ring.get_index(user).map_err(|_| ToolError::BadReplicas);
        Ok((pick(&self.proxy)?, pick(&self.push)?))
    }
}

/// For each replica count up to N, the share of users the proxy and push rings split.
#[derive(Args, Debug)]
pub struct AuditArgs {
    #[command(flatten)]
    pub deployment: DeploymentArgs,
    /// File with user ids, one per line, to audit instead of a synthetic sample
    #[arg(long, value_name = "FILE", conflicts_with = "sample")]
    pub users_file: Option<PathBuf>,
    /// Number of synthetic numeric user ids to audit (always the same ids for a given K), up to
    /// 1000000
    #[arg(long, value_name = "K", default_value_t = 10_000, value_parser = in_range(1, MAX_SAMPLE))]
    pub sample: usize,
    /// Print one JSON object per replica count (replicas, users, split, share = split/users)
    #[arg(long)]
    pub json: bool,
}

/// Holds one row of the audit, also its JSON line.
#[derive(Serialize, Debug)]
struct AuditRow {
    replicas: usize,
    users: usize,
    /// Users whose WebSocket gateway (proxy) differs from their delivery gateway (push).
    split: usize,
    /// `split / users`, from 0 to 1.
    share: f64,
}

impl AuditArgs {
    /// Prints a table for replica counts 1..=N with a one-line explanation, or JSON lines.
    ///
    /// # Errors
    ///
    /// Fails with [`ToolError::BadReplicas`] or [`ToolError::BadTemplate`] for a bad deployment,
    /// [`ToolError::BadSample`] for a sample out of range, [`ToolError::ReadFile`],
    /// [`ToolError::TooManyLines`] or [`ToolError::NoUsers`] when the users file cannot be read, is
    /// too long or is empty, and [`ToolError::Write`] when `out` cannot be written.
    pub fn run(self, out: &mut impl Write) -> Result<(), ToolError> {
        let templates = self.deployment.templates()?;
        let (users, users_origin) = match &self.users_file {
            Some(path) => {
                let users = read_nonblank_lines(path, MAX_AUDIT_USERS)?;
                if users.is_empty() {
                    return Err(ToolError::NoUsers { path: path.clone() });
                }
                let origin = format!("user ids from {}", path.display());
                (users, origin)
            }
            None if !(1..=MAX_SAMPLE).contains(&self.sample) => return Err(ToolError::BadSample),
            None => (
                sample_user_ids(self.sample),
                "synthetic numeric user ids".to_owned(),
            ),
        };

        let mut rows = Vec::with_capacity(self.deployment.replicas);
        for replicas in 1..=self.deployment.replicas {
            let rings = templates.rings(replicas);
            let mut split = 0;
            for user in &users {
                let (proxy_gateway, push_gateway) = rings.gateways(user)?;
                split += usize::from(proxy_gateway != push_gateway);
            }
            rows.push(AuditRow {
                replicas,
                users: users.len(),
                split,
                share: split as f64 / users.len() as f64,
            });
        }

        if self.json {
            return rows.iter().try_for_each(|row| write_json_line(out, row));
        }
        let (spellings_differ, difference) = templates.difference();
        let mut text = format!(
            "Proxy (WebSocket placement) vs push (online delivery) rings, {} {}:\n",
            users.len(),
            users_origin
        );
        text.push_str("replicas  users split   share\n");
        for row in &rows {
            text.push_str(&format!(
                "{:>8}  {:>11}  {:>5.1}%\n",
                row.replicas,
                row.split,
                row.share * 100.0
            ));
        }
        text.push_str(&diagnosis::audit_why(spellings_differ, &difference));
        out.write_all(text.as_bytes()).map_err(ToolError::Write)
    }
}

/// Where both rings send one user, and why they differ.
#[derive(Args, Debug)]
pub struct ExplainArgs {
    /// The user id to place (OpenIM's sendID / recipient id)
    #[arg(long, value_name = "ID")]
    pub user: String,
    #[command(flatten)]
    pub deployment: DeploymentArgs,
    /// Print one JSON object instead of text
    #[arg(long)]
    pub json: bool,
}

impl ExplainArgs {
    /// Prints both rings' picks for the user and why they differ or agree, as text or one JSON
    /// line.
    ///
    /// # Errors
    ///
    /// Fails with [`ToolError::BadReplicas`] or [`ToolError::BadTemplate`] for a bad deployment,
    /// and [`ToolError::Write`] when `out` cannot be written.
    pub fn run(self, out: &mut impl Write) -> Result<(), ToolError> {
        let templates = self.deployment.templates()?;
        let replicas = self.deployment.replicas;
        let rings = templates.rings(replicas);
        let (proxy_gateway, push_gateway) = rings.gateways(&self.user)?;
        let (spellings_differ, difference) = templates.difference();
        let explanation = Explanation {
            user: &self.user,
            replicas,
            proxy: Pick {
                gateway: proxy_gateway,
                member: &rings.proxy.members()[proxy_gateway],
            },
            push: Pick {
                gateway: push_gateway,
                member: &rings.push.members()[push_gateway],
            },
            agree: proxy_gateway == push_gateway,
            difference: &difference,
        };
        if self.json {
            return write_json_line(out, &explanation);
        }
        let text = diagnosis::explanation(&explanation, spellings_differ);
        out.write_all(text.as_bytes()).map_err(ToolError::Write)
    }
}

/// Builds a clap parser for a count within `min..=max`: out of range is a one-line usage error.
pub(crate) fn in_range(min: usize, max: usize) -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(min as u64..=max as u64)
}

/// Reads the lines of a text file with trailing whitespace (and CR) removed, blank lines skipped;
/// at most `max_lines` of them, each at most `MAX_LINE_BYTES`.
fn read_nonblank_lines(path: &Path, max_lines: usize) -> Result<Vec<String>, ToolError> {
    let read_error = |reason: LineError| ToolError::ReadFile {
        path: path.to_owned(),
        reason,
    };
    let file = fs::File::open(path).map_err(|reason| read_error(reason.into()))?;
    let mut lines = Vec::new();
    for line in BoundedLines::new(io::BufReader::new(file), MAX_LINE_BYTES) {
        let (_, line) = line.map_err(read_error)?;
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        if lines.len() == max_lines {
            return Err(ToolError::TooManyLines {
                path: path.to_owned(),
                max: max_lines,
            });
        }
        lines.push(line.to_owned());
    }
    Ok(lines)
}

fn write_json_line(out: &mut impl Write, value: &impl Serialize) -> Result<(), ToolError> {
    serde_json::to_writer(&mut *out, value).map_err(|error| ToolError::Write(error.into()))?;
    out.write_all(b"\n").map_err(ToolError::Write)
}

#[cfg(test)]
mod tests;
