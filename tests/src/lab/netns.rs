//! Sets up pod networking: one bridge per lab run, one network namespace per pod, joined by a veth
//! pair, all on a private 10.244.X.0/24 like a Kubernetes node's pod CIDR. Namespaces get no
//! default route, so pods can reach only each other and the bridge address.
//!
//! Every name starts with the run's prefix (`oil<pid><letter>`), so parallel and leftover runs
//! never clash; link names stay within the kernel's 15 characters.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};

use thiserror::Error;

/// Says why the lab's networking could not be set up.
#[derive(Debug, Error)]
pub enum NetError {
    #[error("`ip {args}` failed: {stderr}")]
    Ip { args: String, stderr: String },
    #[error("could not run `ip` (install iproute2): {0}")]
    Spawn(#[from] std::io::Error),
    #[error("no free 10.244.X.0/24 subnet for the lab bridge")]
    NoFreeSubnet,
    #[error("the lab needs root (network namespaces, veth, bridge); running as uid {0}")]
    NotRoot(u32),
}

/// Runs `ip` with the arguments and returns its stdout.
///
/// # Errors
///
/// Fails when `ip` cannot be run or exits unsuccessfully (the error holds its stderr).
pub fn ip(args: &[&str]) -> Result<String, NetError> {
    let output = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(NetError::Ip {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

/// Checks that the process runs as root, which the lab's networking needs.
///
/// # Errors
///
/// Fails with the effective uid when it is not 0.
pub fn require_root() -> Result<(), NetError> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        Ok(())
    } else {
        Err(NetError::NotRoot(uid))
    }
}

/// Returns a new prefix for this process's next lab: `oil<pid><letter>`, the letter telling apart
/// labs that one process starts one after another.
pub fn new_prefix() -> String {
    static NEXT: AtomicU8 = AtomicU8::new(0);
    let letter = (b'a' + NEXT.fetch_add(1, Ordering::Relaxed) % 26) as char;
    format!("oil{}{letter}", std::process::id())
}

/// Returns the pid a lab name was made by, if the name is a lab name.
fn owner_pid(name: &str) -> Option<u32> {
    let digits: String = name
        .strip_prefix("oil")?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Removes namespaces and links left by lab runs whose process is gone (killed with SIGKILL,
/// say). Names of live processes are left alone: they may belong to a parallel run.
/// Whether `name` is a lab name whose lab process is gone.
pub fn is_orphan(name: &str) -> bool {
    owner_pid(name).is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
}

/// Removes the namespaces and links of lab runs whose process is gone.
pub fn sweep_leftovers() {
    if let Ok(list) = ip(&["netns", "list"]) {
        for name in list
            .lines()
            .filter_map(|line| line.split_whitespace().next())
        {
            if is_orphan(name) {
                let _ = ip(&["netns", "del", name]);
            }
        }
    }
    if let Ok(list) = ip(&["-o", "link", "show"]) {
        for name in list.lines().filter_map(link_name) {
            if is_orphan(&name) {
                let _ = ip(&["link", "del", &name]);
            }
        }
    }
}

/// Returns the interface name in a line of `ip -o link show` (`7: name@peer: <...`).
fn link_name(line: &str) -> Option<String> {
    let name = line.split(": ").nth(1)?;
    Some(name.split('@').next()?.to_owned())
}

/// Lists the lab namespaces and links whose names start with `prefix` (for leak checks).
///
/// # Errors
///
/// Fails when `ip` cannot list the namespaces or links.
pub fn leftovers(prefix: &str) -> Result<Vec<String>, NetError> {
    let mut found: Vec<String> = ip(&["netns", "list"])?
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| name.starts_with(prefix))
        .map(|name| format!("netns {name}"))
        .collect();
    found.extend(
        ip(&["-o", "link", "show"])?
            .lines()
            .filter_map(link_name)
            .filter(|name| name.starts_with(prefix))
            .map(|name| format!("link {name}")),
    );
    Ok(found)
}

/// Holds a pod's network identity.
#[derive(Clone, Debug)]
pub struct PodNet {
    pub netns: String,
    pub ip: Ipv4Addr,
}

/// Turns IPv6 off inside `netns`, so that client libraries that prefer dual-stack sockets when
/// IPv6 is available (gRPC C-core opens AF_INET6 sockets to IPv4-mapped addresses even for an
/// `ipv4:` target) use IPv4 ones. Nothing to do on a kernel without IPv6.
///
/// # Errors
///
/// Fails when `ip netns exec` cannot write the setting.
pub fn disable_ipv6(netns: &str) -> Result<(), NetError> {
    write_setting(netns, "/proc/sys/net/ipv6/conf/all/disable_ipv6", "1")
}

/// Writes `value` to the kernel setting at `path` as seen inside `netns`, if the kernel has it.
fn write_setting(netns: &str, path: &str, value: &str) -> Result<(), NetError> {
    ip(&[
        "netns",
        "exec",
        netns,
        "sh",
        "-c",
        &format!("[ ! -e {path} ] || echo {value} > {path}"),
    ])
    .map(|_| ())
}

/// Lets connects inside `netns` reuse the ports of its connections in TIME_WAIT
/// (`net.ipv4.tcp_tw_reuse`, per namespace), as push's pod needs for a push flood: a new
/// connection per push leaves one in TIME_WAIT for a minute on push's side, and at about 2,000
/// pushes a second the ports to each gateway run out within that minute. Without it the flood
/// fell from 2,000 pushes a second to 260 after about 60 s (72,000 sockets in TIME_WAIT),
/// every `connect` searching the port range, and recovered only as they expired; with it,
/// 2,200–2,400 a second throughout 100 s.
///
/// # Errors
///
/// Fails when `ip netns exec` cannot write the setting.
pub fn reuse_time_wait_ports(netns: &str) -> Result<(), NetError> {
    write_setting(netns, "/proc/sys/net/ipv4/tcp_tw_reuse", "1")
}

/// Holds the bridge and the pod namespaces of one lab run; dropping it removes them all.
#[derive(Debug)]
pub struct Network {
    prefix: String,
    subnet: u8,
    bridge: String,
    namespaces: Vec<String>,
    veths: Vec<String>,
}

impl Network {
    /// Creates the lab's bridge, named after `prefix`, on a free 10.244.X.0/24.
    ///
    /// # Errors
    ///
    /// Fails without root, when no subnet is free, or when an `ip` command fails.
    pub fn create(prefix: &str) -> Result<Self, NetError> {
        require_root()?;
        let subnet = free_subnet()?;
        let bridge = format!("{prefix}br");
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        // From here on, Drop removes what exists.
        let network = Self {
            prefix: prefix.to_owned(),
            subnet,
            bridge,
            namespaces: Vec::new(),
            veths: Vec::new(),
        };
        ip(&[
            "addr",
            "add",
            &format!("{}/24", network.bridge_ip()),
            "dev",
            &network.bridge,
        ])?;
        ip(&["link", "set", &network.bridge, "up"])?;
        Ok(network)
    }

    /// Returns the name prefix of the lab's namespaces and links.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Returns the root namespace's address on the bridge, from which the lab's clients connect.
    pub fn bridge_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 244, self.subnet, 1)
    }

    /// Creates namespace `<prefix>-<pod>` with `eth0` at 10.244.X.`host`.
    ///
    /// # Errors
    ///
    /// Fails when an `ip` command fails.
    pub fn add_pod(&mut self, pod: &str, host: u8) -> Result<PodNet, NetError> {
        let netns = format!("{}-{pod}", self.prefix);
        ip(&["netns", "add", &netns])?;
        self.namespaces.push(netns.clone());
        let veth = format!("{}v{host}", self.prefix);
        let pod_ip = Ipv4Addr::new(10, 244, self.subnet, host);
        ip(&[
            "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &netns,
        ])?;
        self.veths.push(veth.clone());
        ip(&["link", "set", &veth, "master", &self.bridge])?;
        ip(&["link", "set", &veth, "up"])?;
        ip(&[
            "-n",
            &netns,
            "addr",
            "add",
            &format!("{pod_ip}/24"),
            "dev",
            "eth0",
        ])?;
        ip(&["-n", &netns, "link", "set", "eth0", "up"])?;
        ip(&["-n", &netns, "link", "set", "lo", "up"])?;
        Ok(PodNet { netns, ip: pod_ip })
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // Deleting a veth end removes its peer at once; a deleted namespace would take its links
        // along too, but only later, in the kernel's asynchronous namespace cleanup.
        for veth in self.veths.drain(..).rev() {
            let _ = ip(&["link", "del", &veth]);
        }
        for netns in self.namespaces.drain(..).rev() {
            let _ = ip(&["netns", "del", &netns]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}

/// Finds the first 10.244.X.0/24 that no interface address or route on the machine uses, starting
/// at a pid-derived X so that parallel runs rarely even try the same one.
fn free_subnet() -> Result<u8, NetError> {
    let in_use = format!(
        "{}\n{}",
        ip(&["-o", "-4", "addr", "show"])?,
        ip(&["-4", "route", "show", "table", "all"])?
    );
    let start = (std::process::id() % 200) as u8;
    (0..200u8)
        .map(|offset| 20 + (start.wrapping_add(offset)) % 200)
        .find(|subnet| !in_use.contains(&format!("10.244.{subnet}.")))
        .ok_or(NetError::NoFreeSubnet)
}

#[cfg(test)]
mod tests;
