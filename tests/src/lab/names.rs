//! Resolves names with the lab's own name table: member host names → pod addresses. Pods get it on
//! the command line instead of using the machine's resolver, so nothing outside the lab is
//! consulted or changed.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};

use thiserror::Error;

/// Holds what the proxy and push are told of the gateways, as OpenIM's are: the Helm instance and
/// namespace their member strings are built from, `MY_MSGGATEWAY_REPLICACOUNT`, and the lab's name
/// table to resolve the members with.
#[derive(clap::Args, Debug, Clone)]
pub struct GatewayDeployment {
    #[arg(long)]
    pub instance: String,
    #[arg(long)]
    pub namespace: String,
    /// MY_MSGGATEWAY_REPLICACOUNT.
    #[arg(long)]
    pub replicas: usize,
    /// The lab's name table, `host=ip,...`.
    #[arg(long)]
    pub names: String,
}

/// Says why a name table entry or a name could not be read or resolved.
#[derive(Debug, Error)]
pub enum NameError {
    #[error("name table entry {0:?} is not host=ipv4")]
    BadEntry(String),
    #[error("no lab address for host {0:?}")]
    Unknown(String),
    #[error("bad port in {0:?}")]
    BadPort(String),
}

/// Maps the lab's host names to pod addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NameTable {
    hosts: HashMap<String, Ipv4Addr>,
}

impl NameTable {
    /// Names `ip` as `host`'s address.
    pub fn insert(&mut self, host: impl Into<String>, ip: Ipv4Addr) {
        self.hosts.insert(host.into(), ip);
    }

    /// Returns the table as `host=ip,host=ip`, the form pods receive with `--names`.
    pub fn to_arg(&self) -> String {
        let mut entries: Vec<String> = self
            .hosts
            .iter()
            .map(|(host, ip)| format!("{host}={ip}"))
            .collect();
        entries.sort();
        entries.join(",")
    }

    /// Reads a table from its `--names` form, `host=ip,host=ip`.
    ///
    /// # Errors
    ///
    /// Fails when an entry has no `=` or its address is not IPv4.
    pub fn parse_arg(arg: &str) -> Result<Self, NameError> {
        let mut table = Self::default();
        for entry in arg.split(',').filter(|entry| !entry.is_empty()) {
            let (host, ip) = entry
                .split_once('=')
                .ok_or_else(|| NameError::BadEntry(entry.to_owned()))?;
            let ip = ip
                .parse()
                .map_err(|_| NameError::BadEntry(entry.to_owned()))?;
            table.insert(host, ip);
        }
        Ok(table)
    }

    /// Resolves `host` or `host:port` (as a dialer would: no port means `default_port`).
    ///
    /// # Errors
    ///
    /// Fails when the port is not a number or the table does not name the host.
    pub fn resolve(&self, authority: &str, default_port: u16) -> Result<SocketAddr, NameError> {
        let (host, port) = split_port(authority, default_port)?;
        let ip = self
            .hosts
            .get(host)
            .ok_or_else(|| NameError::Unknown(host.to_owned()))?;
        Ok(SocketAddr::from((*ip, port)))
    }
}

/// Splits `host:port`; a name without `:` uses `default_port`.
///
/// # Errors
///
/// Fails when the port after `:` is not a number.
pub fn split_port(authority: &str, default_port: u16) -> Result<(&str, u16), NameError> {
    match authority.rsplit_once(':') {
        Some((host, port)) => port
            .parse()
            .map(|port| (host, port))
            .map_err(|_| NameError::BadPort(authority.to_owned())),
        None => Ok((authority, default_port)),
    }
}

/// Reads random bytes from the kernel, for credentials and ids that must not repeat across runs.
///
/// # Errors
///
/// Fails when /dev/urandom cannot be opened or read.
pub fn random_bytes<const N: usize>() -> std::io::Result<[u8; N]> {
    use std::io::Read;
    let mut bytes = [0u8; N];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests;
