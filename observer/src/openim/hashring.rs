//! Ports, bit for bit, the consistent hash OpenIM 3.5.1 uses (stathat.com/c/consistent v1.0.0),
//! and the member-string templates its two routing components build their rings from.
//!
//! Each member owns `POINTS_PER_MEMBER` points on a 32-bit circle: point k of member m is the
//! CRC-32 (IEEE) of the decimal text of k followed by m. A key goes to the owner of the first
//! point strictly greater than the key's CRC-32, wrapping past the last point. When two points
//! collide the member added later owns it, as in the Go map the library keeps.

use std::collections::HashMap;

use thiserror::Error;

/// Counts each member's points: stathat's `NumberOfReplicas` default, which OpenIM does not change.
pub const POINTS_PER_MEMBER: usize = 20;

/// Describes a ring with no members or a member template that cannot build one.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RingError {
    #[error("the ring has no members")]
    Empty,
    #[error("member template {template:?} is missing the {{i}} placeholder")]
    TemplateWithoutIndex { template: String },
    #[error("member template {template:?} has an unknown placeholder {{{name}}}")]
    UnknownPlaceholder { template: String, name: String },
}

/// Holds an immutable ring: points sorted by hash, each with the index of its member.
#[derive(Clone, Debug)]
pub struct Ring {
    members: Vec<String>,
    point_hashes: Vec<u32>,
    point_owners: Vec<u32>,
}

impl Ring {
    /// Builds the ring as the Go library does after `Add`ing each of `members_in_add_order`.
    pub fn new<I, S>(members_in_add_order: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        // `Add` of a member already present keeps it at its first position (index-based callers
        // rely on that) but re-stamps its points, so it wins collisions against members added in
        // between: the points are generated for every `Add`, duplicates included.
        let mut members: Vec<String> = Vec::new();
        let mut first_index: HashMap<String, u32> = HashMap::new();
        let mut points: Vec<(u32, u32)> = Vec::new();
        let mut text = String::new();
        for member in members_in_add_order {
            let member: String = member.into();
            let index = *first_index.entry(member.clone()).or_insert_with(|| {
                members.push(member.clone());
                (members.len() - 1) as u32
            });
            for point in 0..POINTS_PER_MEMBER {
                text.clear();
                text.push_str(itoa_small(point));
                text.push_str(&member);
                points.push((crc32fast::hash(text.as_bytes()), index));
            }
        }
        // Stable sort keeps insertion order among equal hashes, so the last of a run is the
        // member added last: the one the Go map ends up holding.
        points.sort_by_key(|&(hash, _)| hash);
        points.dedup_by(|later, kept| {
            let same_hash = later.0 == kept.0;
            if same_hash {
                kept.1 = later.1;
            }
            same_hash
        });
        let (point_hashes, point_owners) = points.into_iter().unzip();
        Self {
            members,
            point_hashes,
            point_owners,
        }
    }

    /// Returns the member strings, in the order they were added.
    pub fn members(&self) -> &[String] {
        &self.members
    }

    /// Returns the member that holds `key`, as `consistent.Get(key)` answers.
    ///
    /// # Errors
    ///
    /// Fails with [`RingError::Empty`] when the ring has no members.
    pub fn get(&self, key: &str) -> Result<&str, RingError> {
        self.get_index(key)
            .map(|index| self.members[index].as_str())
    }

    /// Returns the index (in `members()`) of the member that holds `key`.
    ///
    /// # Errors
    ///
    /// Fails with [`RingError::Empty`] when the ring has no members.
    pub fn get_index(&self, key: &str) -> Result<usize, RingError> {
        if self.point_hashes.is_empty() {
            return Err(RingError::Empty);
        }
        let hash = crc32fast::hash(key.as_bytes());
        let position = self.point_hashes.partition_point(|&point| point <= hash);
        let position = if position == self.point_hashes.len() {
            0
        } else {
            position
        };
        Ok(self.point_owners[position] as usize)
    }
}

/// Returns the decimal text of 0..POINTS_PER_MEMBER without allocating.
fn itoa_small(value: usize) -> &'static str {
    const DIGITS: [&str; POINTS_PER_MEMBER] = [
        "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
        "17", "18", "19",
    ];
    DIGITS[value]
}

/// Returns `count` numeric user ids shaped like OpenIM's (ten digits), the same ones on every call,
/// so shares measured over them are comparable between runs (SplitMix64 from a fixed seed).
pub fn sample_user_ids(count: usize) -> Vec<String> {
    let mut state: u64 = 0x0F3E_11A1_2023_0351;
    (0..count)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut mixed = state;
            mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            mixed ^= mixed >> 31;
            (1_000_000_000 + mixed % 9_000_000_000).to_string()
        })
        .collect()
}

/// Spells a gateway as openim-msggateway-proxy does in 3.5.1 (no port).
pub const PROXY_MEMBER_TEMPLATE: &str = "{instance}-openim-msggateway-{i}.{instance}-openim-msggateway-headless.{namespace}.svc.cluster.local";
/// Spells a gateway as openim-push does in 3.5.1 (its gRPC port appended).
pub const PUSH_MEMBER_TEMPLATE: &str = "{instance}-openim-msggateway-{i}.{instance}-openim-msggateway-headless.{namespace}.svc.cluster.local:88";

/// Holds a member-string template with `{instance}`, `{i}` and `{namespace}` placeholders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberTemplate(String);

impl MemberTemplate {
    /// Parses a template, checking its placeholders.
    ///
    /// # Errors
    ///
    /// Fails with [`RingError::UnknownPlaceholder`] for a placeholder other than `{instance}`,
    /// `{i}` and `{namespace}`, and [`RingError::TemplateWithoutIndex`] when `{i}` is missing.
    pub fn parse(template: &str) -> Result<Self, RingError> {
        let mut rest = template;
        let mut has_index = false;
        while let Some(open) = rest.find('{') {
            let Some(close) = rest[open..].find('}') else {
                break;
            };
            let name = &rest[open + 1..open + close];
            match name {
                "i" => has_index = true,
                "instance" | "namespace" => {}
                _ => {
                    return Err(RingError::UnknownPlaceholder {
                        template: template.to_owned(),
                        name: name.to_owned(),
                    });
                }
            }
            rest = &rest[open + close + 1..];
        }
        if !has_index {
            return Err(RingError::TemplateWithoutIndex {
                template: template.to_owned(),
            });
        }
        Ok(Self(template.to_owned()))
    }

    /// Returns the template as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Returns the member strings for replicas 0..replicas, in the order OpenIM adds them.
    pub fn members(&self, instance: &str, namespace: &str, replicas: usize) -> Vec<String> {
        (0..replicas)
            .map(|index| {
                self.0
                    .replace("{instance}", instance)
                    .replace("{namespace}", namespace)
                    .replace("{i}", &index.to_string())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
