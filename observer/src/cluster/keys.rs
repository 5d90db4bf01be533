//! Names the shared keyspace: what cluster mode stores in Redis, under which keys, for how long.
//!
//! Every key starts with the prefix (`--redis-prefix`) and carries a hash tag, so a Redis
//! Cluster keeps what one pipeline touches together: one user's keys share `{u:USER}`, one
//! node's connection index `{n:NODE}`, the ring evidence `{ring}`.
//!
//! | key | type | holds | lives |
//! |---|---|---|---|
//! | `P{u:USER}:placements` | hash | `NODE\|CONNECTION` → placement | deleted field on close; key TTL [`PLACEMENT_TTL`], refreshed by the owning node every [`PLACEMENT_REFRESH`] |
//! | `P{n:NODE}:connections` | hash | `CONNECTION` → user | same, so a restarted observer finds its node's users |
//! | `P{u:USER}:claim:mismatch:PLACED>PUSHED` | string | the node that printed | one fold window |
//! | `P{ring}:members:proxy`, `…:push` | hash | member string → gateway IP, node, last seen | [`RING_TTL`], refreshed while seen |
//! | `P{ring}:placements` | list | the last [`MAX_RING_PLACEMENTS`] `USER IP` placements | [`RING_TTL`] |
//! | `P{ring}:claim:divergence:CHANGE` | string | the node that printed | [`DIVERGENCE_CLAIM_TTL`] |
//! | `P{ring}:claim:divergence-resolved:CHANGE` | string | the node that printed | [`DIVERGENCE_CLAIM_TTL`] |
//! | `P{changes}:placements` | list | the placement change log, newest first: one entry per write batch that placed or unplaced users, naming them, so readers that cache placements know whom to read again | the last [`PLACEMENT_CHANGES_LEN`] entries; [`RING_TTL`] |
//! | `P{changes}:count` | string | entries ever added to the change log (readers compare it, then read the log only when it moved) | [`RING_TTL`] |
//!
//! Values hold only what the engine joins on (user ids, gateways, processes, member strings):
//! never a token, a header beyond those, a gateway's answer or message content.

use std::{net::IpAddr, time::Duration};

use serde::{Deserialize, Serialize};

use crate::{
    correlate::RemotePlacement,
    model::{Gateway, Process},
};
pub use crate::{correlate::RingSide, model::ConnectionKey};

/// Names the prefix every key starts with unless `--redis-prefix` gives another.
pub const DEFAULT_PREFIX: &str = "openim-observer:";

/// Bounds how long a placement outlives its node's observer: long enough for a DaemonSet rollout
/// to restart the observer and adopt it, short enough that a node gone for good stops
/// answering for its users soon after.
pub const PLACEMENT_TTL: Duration = Duration::from_secs(15 * 60);
/// Sets how often the owning node rewrites its live placements (and at once after Redis comes
/// back, possibly empty).
pub const PLACEMENT_REFRESH: Duration = Duration::from_secs(5 * 60);
/// Bounds how long ring members not seen again stay in the shared rings.
pub const RING_TTL: Duration = Duration::from_secs(15 * 60);
/// Bounds the entries the placement change log keeps; a reader that finds more new entries than it
/// reads at once forgets what it cached.
pub const PLACEMENT_CHANGES_LEN: usize = 10_000;
/// Sets the period in which a divergence (one pair of member lists) is printed once cluster-wide.
pub const DIVERGENCE_CLAIM_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// Counts the recent placements kept as ring evidence (the proxy-ring inference needs a few dozen
/// that tell the candidates apart; this many covers hundreds of gateways).
pub const MAX_RING_PLACEMENTS: usize = 1_000;

/// Records where the proxy placed a user's WebSocket, as seen by one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedPlacement {
    pub user: String,
    pub node: String,
    pub connection: ConnectionKey,
    pub gateway_ip: IpAddr,
    pub gateway_port: u16,
    /// The proxy's `Host`, when seen.
    pub gateway_name: Option<String>,
    pub platform: Option<i32>,
    pub since_ns: u64,
    pub proxy_pid: u32,
    pub proxy_comm: String,
}

/// Holds the stored value of a placement: user, node and connection are in its key and field.
/// Short names: this is most of the bytes per online user.
#[derive(Debug, Serialize, Deserialize)]
struct PlacementValue {
    #[serde(rename = "gw")]
    gateway_ip: IpAddr,
    #[serde(rename = "port")]
    gateway_port: u16,
    #[serde(rename = "name", default, skip_serializing_if = "Option::is_none")]
    gateway_name: Option<String>,
    #[serde(rename = "plat", default, skip_serializing_if = "Option::is_none")]
    platform: Option<i32>,
    #[serde(rename = "since")]
    since_ns: u64,
    #[serde(rename = "pid")]
    proxy_pid: u32,
    #[serde(rename = "comm")]
    proxy_comm: String,
    /// Unix milliseconds after which readers ignore it: the hash's TTL is shared by every node
    /// placing the user, so each field carries its own.
    #[serde(rename = "exp")]
    expires_ms: u64,
}

impl SharedPlacement {
    /// Returns the placement as the engine takes another node's.
    pub(crate) fn to_remote(&self) -> RemotePlacement {
        RemotePlacement {
            node: self.node.as_str().into(),
            connection: self.connection,
            gateway: Gateway {
                ip: self.gateway_ip,
                port: self.gateway_port,
                name: self.gateway_name.as_deref().map(Into::into),
            },
            platform: self.platform,
            since_ns: self.since_ns,
            // Another node's process: its cgroup means nothing here.
            proxy: Process {
                pid: self.proxy_pid,
                comm: self.proxy_comm.as_str().into(),
                cgroup_id: 0,
            },
        }
    }

    /// Returns the placement's field in its user's hash.
    pub fn field(&self) -> String {
        placement_field(&self.node, &self.connection)
    }

    /// Returns the placement's stored value, expiring at `expires_ms`.
    pub(crate) fn value(&self, expires_ms: u64) -> String {
        let value = PlacementValue {
            gateway_ip: self.gateway_ip,
            gateway_port: self.gateway_port,
            gateway_name: self.gateway_name.clone(),
            platform: self.platform,
            since_ns: self.since_ns,
            proxy_pid: self.proxy_pid,
            proxy_comm: self.proxy_comm.clone(),
            expires_ms,
        };
        serde_json::to_string(&value).unwrap_or_default()
    }

    /// Reads one field of `user`'s hash back; `None` when malformed or expired at `now_ms`.
    pub(crate) fn from_stored(user: &str, field: &str, value: &str, now_ms: u64) -> Option<Self> {
        Self::from_stored_until(user, field, value)
            .and_then(|(placement, expires_ms)| (expires_ms > now_ms).then_some(placement))
    }

    /// Reads one field of `user`'s hash back with the Unix millisecond it expires at; `None`
    /// when malformed.
    pub(crate) fn from_stored_until(user: &str, field: &str, value: &str) -> Option<(Self, u64)> {
        let (node, connection) = field.split_once('|')?;
        let value: PlacementValue = serde_json::from_str(value).ok()?;
        let connection = connection.parse().ok()?;
        let placement = Self {
            user: user.to_owned(),
            node: node.to_owned(),
            connection,
            gateway_ip: value.gateway_ip,
            gateway_port: value.gateway_port,
            gateway_name: value.gateway_name,
            platform: value.platform,
            since_ns: value.since_ns,
            proxy_pid: value.proxy_pid,
            proxy_comm: value.proxy_comm,
        };
        Some((placement, value.expires_ms))
    }
}

/// Returns the field of `node`'s placement on `connection` in its user's hash (`node|connection`).
pub(crate) fn placement_field(node: &str, connection: &ConnectionKey) -> String {
    format!("{node}|{connection}")
}

/// Records a ring member string tied to the gateway IP dialled, as one node last saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingMember {
    pub ip: IpAddr,
    pub node: String,
    /// Unix milliseconds; members older than [`RING_TTL`] are ignored.
    #[serde(rename = "seen")]
    pub seen_ms: u64,
}

/// Builds every key from the prefix.
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// Builds the keys under `prefix`.
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }

    /// Returns the prefix every key starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Returns the key of `user`'s placements hash.
    pub fn user_placements(&self, user: &str) -> String {
        format!("{}{{u:{}}}:placements", self.prefix, escape(user))
    }

    /// Returns the claim key of a mismatch: one per (user, gateways placed on, gateway pushed to)
    /// and fold window.
    pub fn mismatch_claim(&self, user: &str, placed: &[IpAddr], pushed: IpAddr) -> String {
        let mut placed: Vec<String> = placed.iter().map(IpAddr::to_string).collect();
        placed.sort();
        placed.dedup();
        format!(
            "{}{{u:{}}}:claim:mismatch:{}>{pushed}",
            self.prefix,
            escape(user),
            placed.join(",")
        )
    }

    /// Returns the key of `node`'s connection index (connection → user).
    pub fn node_connections(&self, node: &str) -> String {
        format!("{}{{n:{}}}:connections", self.prefix, escape(node))
    }

    /// Returns the key of the shared ring members of `side`.
    pub fn ring_members(&self, side: RingSide) -> String {
        format!("{}{{ring}}:members:{}", self.prefix, side.name())
    }

    /// Returns the key of the recent placements kept as ring evidence.
    pub fn ring_placements(&self) -> String {
        format!("{}{{ring}}:placements", self.prefix)
    }

    /// Returns the key of the placement change log: which users' placements each write batch
    /// changed.
    pub fn placement_changes(&self) -> String {
        format!("{}{{changes}}:placements", self.prefix)
    }

    /// Returns the key counting the entries the change log was ever given (same slot as the log).
    pub fn placement_changes_count(&self) -> String {
        format!("{}{{changes}}:count", self.prefix)
    }

    /// Returns the claim key of a divergence: one per pair of member lists (the change it
    /// describes).
    pub fn divergence_claim(&self, proxy_members: &[String], push_members: &[String]) -> String {
        self.members_claim("divergence", proxy_members, push_members)
    }

    /// Returns the claim key of a resolved divergence: one per pair of member lists it was resolved
    /// with: its own, so that the claim of the divergence it closes does not swallow it.
    pub fn divergence_resolved_claim(
        &self,
        proxy_members: &[String],
        push_members: &[String],
    ) -> String {
        self.members_claim("divergence-resolved", proxy_members, push_members)
    }

    fn members_claim(
        &self,
        kind: &str,
        proxy_members: &[String],
        push_members: &[String],
    ) -> String {
        let mut hasher = crc32fast::Hasher::new();
        for member in proxy_members {
            hasher.update(member.as_bytes());
            hasher.update(b"\n");
        }
        hasher.update(b"\0");
        for member in push_members {
            hasher.update(member.as_bytes());
            hasher.update(b"\n");
        }
        format!(
            "{}{{ring}}:claim:{kind}:{}-{}-{:08x}",
            self.prefix,
            proxy_members.len(),
            push_members.len(),
            hasher.finalize()
        )
    }
}

/// Escapes user ids and node names, which go inside hash tags: braces would end the tag early and
/// `%` would make escapes ambiguous, so those three are percent-encoded (OpenIM ids never contain
/// them).
fn escape(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains(['{', '}', '%']) {
        return text.into();
    }
    text.replace('%', "%25")
        .replace('{', "%7B")
        .replace('}', "%7D")
        .into()
}

#[cfg(test)]
mod tests;
