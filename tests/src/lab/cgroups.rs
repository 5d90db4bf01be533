//! Makes one cgroup v2 directory per simulated node, so that each node's observer can be scoped to
//! its node's pods (`observer run --cgroup-scope`) the way a real node's kernel shows only its own
//! processes. Pods join their node's directory between fork and exec (`PodProcess::spawn`), so none
//! of their syscalls runs outside it.
//!
//! The cgroup v2 hierarchy is reused where it is already mounted; otherwise (a host whose
//! services use cgroup v1 only) it is mounted at a temporary directory. Dropping removes the
//! directories and undoes the mount.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use thiserror::Error;

/// Says why a node cgroup could not be mounted or made.
#[derive(Debug, Error)]
pub enum CgroupError {
    #[error("mounting cgroup2 at {path} failed: {source}")]
    Mount {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Bounds how long removal waits for killed pods to leave their cgroup before giving up on it.
const REMOVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Holds the lab's directory in the cgroup v2 hierarchy and one sub-directory per node.
#[derive(Debug)]
pub struct NodeCgroups {
    hierarchy: PathBuf,
    /// Set when this lab mounted the hierarchy itself: unmounted and removed on drop.
    own_mount: bool,
    lab_dir: PathBuf,
    nodes: Vec<PathBuf>,
}

impl NodeCgroups {
    /// Makes `<hierarchy>/<prefix>/node-<n>` for `nodes` nodes (`prefix` names everything the
    /// lab creates).
    ///
    /// # Errors
    ///
    /// Fails when the hierarchy is not mounted and cannot be mounted, or a directory cannot be
    /// made.
    pub fn create(prefix: &str, nodes: usize) -> Result<Self, CgroupError> {
        let (hierarchy, own_mount) = match mounted_hierarchy() {
            Some(path) => (path, false),
            None => (mount_hierarchy(prefix)?, true),
        };
        sweep_leftovers(&hierarchy);
        let lab_dir = hierarchy.join(prefix);
        let mut cgroups = Self {
            hierarchy,
            own_mount,
            lab_dir: lab_dir.clone(),
            nodes: Vec::new(),
        };
        make_dir(&lab_dir)?;
        for node in 0..nodes {
            let dir = lab_dir.join(format!("node-{}", node + 1));
            make_dir(&dir)?;
            cgroups.nodes.push(dir);
        }
        Ok(cgroups)
    }

    /// Returns the node's cgroup directory (what its observer's `--cgroup-scope` names).
    pub fn node_dir(&self, node: usize) -> &Path {
        &self.nodes[node]
    }

    /// Returns the file a process writes to join the node's cgroup.
    pub fn procs_file(&self, node: usize) -> PathBuf {
        self.nodes[node].join("cgroup.procs")
    }

    /// Returns the pids of the processes in the node's cgroup.
    pub fn pids(&self, node: usize) -> Vec<u32> {
        read_pids(&self.procs_file(node))
    }
}

impl Drop for NodeCgroups {
    fn drop(&mut self) {
        let root_procs = self.hierarchy.join("cgroup.procs");
        // Children first: a cgroup with sub-directories cannot be removed.
        for dir in self.nodes.iter().chain([&self.lab_dir]) {
            let deadline = Instant::now() + REMOVE_TIMEOUT;
            // Killed pods may take a moment to exit; any still alive go back to the root.
            while std::fs::remove_dir(dir).is_err() && dir.exists() && Instant::now() < deadline {
                for pid in read_pids(&dir.join("cgroup.procs")) {
                    let _ = std::fs::write(&root_procs, pid.to_string());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if self.own_mount {
            unmount(&self.hierarchy);
        }
    }
}

/// Finds where the cgroup v2 hierarchy is mounted whole (its root, not a sub-tree), if anywhere.
fn mounted_hierarchy() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo.lines().find_map(|line| {
        // `id parent major:minor root mountpoint options… - fstype source superoptions`
        let (mount, filesystem) = line.split_once(" - ")?;
        let fields: Vec<&str> = mount.split(' ').collect();
        let (root, mountpoint) = (*fields.get(3)?, *fields.get(4)?);
        // Mount points with escaped characters (`\040`) are not worth decoding here.
        (filesystem.split(' ').next() == Some("cgroup2")
            && root == "/"
            && !mountpoint.contains('\\'))
        .then(|| PathBuf::from(mountpoint))
    })
}

/// Returns the directory where the lab named `prefix` mounts the hierarchy itself.
fn own_mount_point(prefix: &str) -> PathBuf {
    std::env::temp_dir().join(format!("{prefix}-cgroup2"))
}

fn mount_hierarchy(prefix: &str) -> Result<PathBuf, CgroupError> {
    let path = own_mount_point(prefix);
    make_dir(&path)?;
    let target = c_path(&path)?;
    // SAFETY: mount(2) with valid C strings and no data.
    let ret = unsafe {
        libc::mount(
            c"none".as_ptr(),
            target.as_ptr(),
            c"cgroup2".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if ret != 0 {
        let source = std::io::Error::last_os_error();
        let _ = std::fs::remove_dir(&path);
        return Err(CgroupError::Mount { path, source });
    }
    Ok(path)
}

fn unmount(path: &Path) {
    if let Ok(target) = c_path(path) {
        // SAFETY: umount2(2) on a directory the lab mounted.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
    let _ = std::fs::remove_dir(path);
}

/// Removes what labs killed without their `Drop` left: their (by then empty) cgroups in the
/// hierarchy and their own mount points under the temp directory.
fn sweep_leftovers(hierarchy: &Path) {
    let Ok(entries) = std::fs::read_dir(hierarchy) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if crate::lab::netns::is_orphan(&name) {
            let lab_dir = entry.path();
            if let Ok(nodes) = std::fs::read_dir(&lab_dir) {
                for node in nodes.flatten().filter(|node| node.path().is_dir()) {
                    let _ = std::fs::remove_dir(node.path());
                }
            }
            let _ = std::fs::remove_dir(&lab_dir);
        }
    }
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(prefix) = name.strip_suffix("-cgroup2")
            && crate::lab::netns::is_orphan(prefix)
        {
            unmount(&entry.path());
        }
    }
}

fn read_pids(procs: &Path) -> Vec<u32> {
    std::fs::read_to_string(procs)
        .map(|text| text.lines().filter_map(|pid| pid.parse().ok()).collect())
        .unwrap_or_default()
}

fn make_dir(path: &Path) -> Result<(), CgroupError> {
    match std::fs::create_dir(path) {
        Err(source) if source.kind() != std::io::ErrorKind::AlreadyExists => Err(CgroupError::Io {
            path: path.to_owned(),
            source,
        }),
        _ => Ok(()),
    }
}

fn c_path(path: &Path) -> Result<std::ffi::CString, CgroupError> {
    std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| CgroupError::Io {
        path: path.to_owned(),
        source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
    })
}
