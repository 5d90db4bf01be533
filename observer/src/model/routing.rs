//! Describes who talks to whom in OpenIM's routing, and what a push call carries and gets back.

use std::{fmt::Write as _, net::IpAddr, sync::Arc};

use compact_str::CompactString;
use serde::Serialize;

use super::wire;

/// Describes a process seen on one end of a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Process {
    pub pid: u32,
    /// Inline (a task name is at most 15 bytes): copied into every placement, call and
    /// alert that names the process without an allocation.
    pub comm: CompactString,
    /// cgroup v2 id of the process: what names its pod (`--kube`).
    pub cgroup_id: u64,
}

/// Describes a gateway as one side of OpenIM addressed it: the IP it dialled and the member string
/// it used (`Host` for the proxy, `:authority` for push), when seen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Gateway {
    #[serde(serialize_with = "serialize_ip")]
    pub ip: IpAddr,
    pub port: u16,
    /// Shared: every placement, call and alert that names this gateway by this member string
    /// holds the same copy (`correlate::shared_texts`, within its bounds), so comparing two
    /// names usually compares two pointers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<Arc<str>>,
}

/// Holds an IP address as text, on the stack. Every `route_mismatch` prints two or more gateway
/// addresses in its JSON and its diagnosis; std's `Display` takes each through the formatting
/// machinery (about 800 instructions an IPv4 address), so IPv4 digits are written directly.
pub struct IpText {
    /// The longest IPv6 text, `ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255`, is 45 bytes.
    bytes: [u8; 45],
    len: usize,
}

impl IpText {
    /// Writes `ip` as text.
    pub fn new(ip: IpAddr) -> Self {
        let mut text = IpText {
            bytes: [0; 45],
            len: 0,
        };
        match ip {
            IpAddr::V4(v4) => {
                for (index, octet) in v4.octets().into_iter().enumerate() {
                    if index > 0 {
                        text.push(b'.');
                    }
                    if octet >= 100 {
                        text.push(b'0' + octet / 100);
                    }
                    if octet >= 10 {
                        text.push(b'0' + octet / 10 % 10);
                    }
                    text.push(b'0' + octet % 10);
                }
            }
            // Rare, and its compression rules are std's to get right.
            IpAddr::V6(v6) => {
                let _ = write!(text, "{v6}");
            }
        }
        text
    }

    /// Returns the text.
    pub fn as_str(&self) -> &str {
        // Only ASCII digits, dots, colons and hex letters are ever written.
        wire::utf8(self.bytes.get(..self.len).unwrap_or_default()).unwrap_or_default()
    }

    fn push(&mut self, byte: u8) {
        if let Some(slot) = self.bytes.get_mut(self.len) {
            *slot = byte;
            self.len += 1;
        }
    }
}

impl std::fmt::Write for IpText {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        text.bytes().for_each(|byte| self.push(byte));
        Ok(())
    }
}

fn serialize_ip<S: serde::Serializer>(ip: &IpAddr, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(IpText::new(*ip).as_str())
}

/// Holds the ids that identify a message without revealing it (never its content).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct MessageIds {
    /// Shared by the alerts of every recipient of one call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_msg_id: Option<Arc<str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_msg_id: Option<Arc<str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_type: Option<i32>,
}

/// Holds an OpenIM user id as push names it: held inline up to 24 bytes (OpenIM's are numbers of
/// about ten digits), so a call's recipients and answers cost no allocation each.
pub type UserId = CompactString;

/// Records a gateway's answer for one requested user. No platforms means the gateway holds no
/// connection for the user, or delivered only to platforms it does not list (see
/// [`GatewayAnswer::EmptyEntry`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserResult {
    pub user_id: UserId,
    pub online_push: bool,
    pub platforms: Vec<PlatformResult>,
}

/// Records how the write to one of the user's connections (one platform) went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PlatformResult {
    pub platform_id: i32,
    /// 0 delivered, -2 write failed, -3 iOS in background.
    pub result_code: i64,
}

/// Says what the gateway that received a push answered for one user.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GatewayAnswer {
    /// At least one of the user's connections on that gateway took the message.
    Delivered,
    /// The gateway's entry for the user lists no platform: it holds no connection for the
    /// user, or only connections on platforms whose deliveries it does not report (3.5.1's
    /// gateway lists a successful write for iOS and Android only). Alone it proves nothing:
    /// the placement does.
    #[serde(alias = "not_online_here")]
    EmptyEntry,
    /// Connections exist but every write failed (result codes say why).
    DeliveryFailed,
    /// No answer was seen (connection closed first, or the answer was not captured).
    Unknown,
}

/// Says why a recipient's WebSocket is not where push sent its message, as far as the wire shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MismatchCause {
    /// The proxy's and push's rings spell gateways differently, so they hash users apart.
    RingSpelling,
    /// The two rings agree now, but the user was placed under an older membership (a
    /// scale-out or scale-in): OpenIM never moves a live WebSocket when the ring changes.
    StalePlacement,
    /// Push's ring has not caught up with the proxy's membership.
    PushRingLags,
    /// The proxy's ring has not caught up with push's membership.
    ProxyRingLags,
    /// The evidence does not single out a cause yet.
    Undetermined,
}

impl MismatchCause {
    /// Returns the cause's name as the alert line spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::RingSpelling => "ring_spelling",
            Self::StalePlacement => "stale_placement",
            Self::PushRingLags => "push_ring_lags",
            Self::ProxyRingLags => "proxy_ring_lags",
            Self::Undetermined => "undetermined",
        }
    }
}

#[cfg(test)]
mod tests;
