//! Opens the cgroup v2 directories of `--cgroup-scope DIR`, whose processes the kernel programs
//! watch. Userspace only opens and checks them; the kernel keeps a reference to each cgroup once
//! its fd is written into `CGROUP_SCOPE`, and tests membership itself.

use std::{
    fs::{self, File},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::fs::MetadataExt,
    },
    path::{Path, PathBuf},
};

use observer_records::MAX_CGROUP_SCOPES;
use thiserror::Error;

/// Says why a `--cgroup-scope` or `--cgroup-root` directory cannot be used.
#[derive(Debug, Error)]
pub enum ScopeError {
    #[error("too many --cgroup-scope directories ({count}); at most {MAX_CGROUP_SCOPES}")]
    TooMany { count: usize },
    #[error("--cgroup-scope {}: {reason}", path.display())]
    Unusable { path: PathBuf, reason: String },
    #[error("--cgroup-root {}: {reason}", path.display())]
    RootUnusable { path: PathBuf, reason: String },
}

/// Opens every directory, in order, after checking each is a directory of a cgroup v2
/// hierarchy (`bpf_current_task_under_cgroup` tests the v2 hierarchy only, so a v1 directory
/// would silently match nothing).
///
/// # Errors
///
/// Fails with [`ScopeError::TooMany`] past `MAX_CGROUP_SCOPES` directories, and with
/// [`ScopeError::Unusable`] when one is not a directory of a cgroup v2 hierarchy or cannot be
/// opened.
pub fn open(paths: &[PathBuf]) -> Result<Vec<File>, ScopeError> {
    if paths.len() > MAX_CGROUP_SCOPES as usize {
        return Err(ScopeError::TooMany { count: paths.len() });
    }
    paths
        .iter()
        .map(|path| {
            open_cgroup2_directory(path).map_err(|reason| ScopeError::Unusable {
                path: path.clone(),
                reason,
            })
        })
        .collect()
}

/// Applies `--cgroup-scope` where userspace decides: the connections found established at start,
/// which no program saw being made. The directories are held by identity (device and inode),
/// so that any mount of the hierarchy names them.
#[derive(Debug)]
pub struct ScopeMembership {
    /// The node's cgroup v2 hierarchy, where processes' cgroups are looked up.
    hierarchy: PathBuf,
    directories: Vec<(u64, u64)>,
}

impl ScopeMembership {
    /// Builds the membership test from `scope` as `open` returned it; `hierarchy` as
    /// `hierarchy_path` finds it.
    pub fn new(hierarchy: PathBuf, scope: &[File]) -> Self {
        let directories = scope
            .iter()
            .filter_map(|directory| directory.metadata().ok())
            .map(|metadata| (metadata.dev(), metadata.ino()))
            .collect();
        Self {
            hierarchy,
            directories,
        }
    }

    /// Returns the cgroup v2 hierarchy processes' cgroups are looked up in.
    pub fn hierarchy(&self) -> &Path {
        &self.hierarchy
    }

    /// Says whether a process in `cgroup` (a directory under the hierarchy) is watched: any process
    /// without a scope; with one, a process in a scope directory or below one, and not a
    /// process whose cgroup is unknown.
    pub fn admits(&self, cgroup: Option<&Path>) -> bool {
        if self.directories.is_empty() {
            return true;
        }
        cgroup.is_some_and(|cgroup| {
            cgroup
                .ancestors()
                .take_while(|directory| directory.starts_with(&self.hierarchy))
                .filter_map(|directory| fs::metadata(directory).ok())
                .any(|metadata| self.directories.contains(&(metadata.dev(), metadata.ino())))
        })
    }
}

/// Opens the cgroup v2 hierarchy at `path`, or, on a hybrid host (cgroup v1 there), at
/// `path/unified`, and where that was: with `--cgroup-root`, where the packet programs attach
/// (every socket of a process in a cgroup below it passes them). Or why `path` is not one, in
/// a few words.
///
/// # Errors
///
/// Fails, with the reason in a few words, when neither `path` nor `path/unified` is a directory of
/// a cgroup v2 hierarchy.
pub fn open_hierarchy(path: &Path) -> Result<(PathBuf, File), String> {
    match open_cgroup2_directory(path) {
        Ok(directory) => Ok((path.to_owned(), directory)),
        Err(reason) => {
            let unified = path.join("unified");
            open_cgroup2_directory(&unified)
                .map(|directory| (unified, directory))
                .map_err(|_| reason)
        }
    }
}

/// Says where the cgroup v2 hierarchy of `--cgroup-root` is: `path`, or its `unified` on a hybrid
/// host; `path` itself when neither is cgroup v2.
pub fn hierarchy_path(path: &Path) -> PathBuf {
    open_hierarchy(path).map_or_else(|_| path.to_owned(), |(path, _)| path)
}

/// Says why `--cgroup-root` gives the packet programs no place to attach, in a few words each.
#[derive(Debug, PartialEq, Eq)]
pub enum NoHierarchyRoot {
    /// Neither `path` nor its `unified` is cgroup v2: a cgroup v1 node, or a wrong directory.
    NotCgroup2(String),
    /// A cgroup below its hierarchy's root (a container's own namespace shows it as the root).
    BelowRoot(String),
}

/// Opens the root of the cgroup v2 hierarchy at `path` or `path/unified` (`open_hierarchy`), or
/// says why neither is one.
///
/// # Errors
///
/// Fails with [`NoHierarchyRoot::NotCgroup2`] when neither is cgroup v2, and with
/// [`NoHierarchyRoot::BelowRoot`] when the directory is a cgroup below its hierarchy's root.
pub fn find_hierarchy_root(path: &Path) -> Result<(PathBuf, File), NoHierarchyRoot> {
    let (path, directory) = open_hierarchy(path)
        .map_err(|reason| NoHierarchyRoot::NotCgroup2(format!("{}: {reason}", path.display())))?;
    // Every cgroup but a hierarchy's root has `cgroup.type`. Without it here, this is the root
    // of the hierarchy of this cgroup namespace: a container's own /sys/fs/cgroup, a private
    // namespace's, has it, since it shows the container's cgroup as its root.
    if path.join("cgroup.type").exists() {
        return Err(NoHierarchyRoot::BelowRoot(format!(
            "{} is a cgroup below its hierarchy's root (a container's own /sys/fs/cgroup is its \
            cgroup), so programs there would see only its sockets; mount the node's /sys/fs/cgroup \
            and pass it",
            path.display()
        )));
    }
    Ok((path, directory))
}

/// Names `fsopen`'s close-on-exec flag; it and the two below come from linux/mount.h (not in
/// the `libc` crate).
const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;

/// Opens the root of the node's cgroup v2 hierarchy through a mount of the observer's own that no
/// directory holds (`fsopen`/`fsmount`, Linux 5.2): on a node whose cgroups are all v1 there
/// is no other way to it, and nothing is left mounted behind, since the mount goes with the
/// last descriptor of it (a program attached there holds the cgroup itself). Needs
/// CAP_SYS_ADMIN. In a cgroup namespace of its own the mount shows that namespace's root,
/// which is refused as any cgroup below the hierarchy's root is.
///
/// # Errors
///
/// Fails, naming the call and its errno, when `fsopen`, `fsconfig`, `fsmount` or `openat` fails, or
/// when the mount shows this observer's cgroup namespace instead of the node's root.
pub fn mount_private_hierarchy() -> Result<File, String> {
    let failed = |call: &str| format!("{call}: {}", std::io::Error::last_os_error());
    // SAFETY: a NUL-terminated name and flags; the result is a new descriptor or -1.
    let context = unsafe { libc::syscall(libc::SYS_fsopen, c"cgroup2".as_ptr(), FSOPEN_CLOEXEC) };
    let context = owned_descriptor(context).ok_or_else(|| failed("fsopen(cgroup2)"))?;
    let (null, no_value) = (
        std::ptr::null::<libc::c_char>(),
        std::ptr::null::<libc::c_void>(),
    );
    // SAFETY: our fs context descriptor; CMD_CREATE takes no key or value.
    let created = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            context.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            null,
            no_value,
            0,
        )
    };
    if created != 0 {
        return Err(failed("fsconfig(create)"));
    }
    // SAFETY: our created fs context; no mount attributes.
    let mount =
        unsafe { libc::syscall(libc::SYS_fsmount, context.as_raw_fd(), FSMOUNT_CLOEXEC, 0) };
    let mount = owned_descriptor(mount).ok_or_else(|| failed("fsmount"))?;
    // SAFETY: a directory descriptor we own and a NUL-terminated relative path.
    let root = unsafe {
        libc::openat(
            mount.as_raw_fd(),
            c".".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    let root = owned_descriptor(libc::c_long::from(root)).ok_or_else(|| failed("openat"))?;
    // Every cgroup but a hierarchy's root has `cgroup.type` (see `find_hierarchy_root`).
    // SAFETY: a directory descriptor we own and a NUL-terminated relative path.
    if unsafe { libc::faccessat(root.as_raw_fd(), c"cgroup.type".as_ptr(), libc::F_OK, 0) } == 0 {
        return Err(
            "the cgroup v2 hierarchy mounted shows this observer's cgroup namespace, not the \
            node's root"
                .to_owned(),
        );
    }
    Ok(File::from(root))
}

/// Owns a descriptor a syscall returned, or `None` for its -1.
fn owned_descriptor(result: libc::c_long) -> Option<OwnedFd> {
    let fd = libc::c_int::try_from(result).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: the kernel just gave us this descriptor, owned by nothing else.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens a directory of a cgroup v2 hierarchy, or says in a few words why it is not one.
fn open_cgroup2_directory(path: &Path) -> Result<File, String> {
    let directory = File::open(path).map_err(|err| err.to_string())?;
    let metadata = directory.metadata().map_err(|err| err.to_string())?;
    if !metadata.is_dir() {
        return Err("not a directory".to_owned());
    }
    // SAFETY: statfs is plain old data; zeroed is a valid value that fstatfs overwrites.
    let mut filesystem: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid open fd and a pointer to a statfs the call may write.
    if unsafe { libc::fstatfs(directory.as_raw_fd(), &mut filesystem) } != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    if filesystem.f_type != libc::CGROUP2_SUPER_MAGIC {
        return Err(
            "not a cgroup v2 directory (mount one with `mount -t cgroup2 none DIR`)".to_owned(),
        );
    }
    Ok(directory)
}

/// Holds a hybrid host's layout, for tests: a directory that is not cgroup v2 whose `unified`
/// links to a hierarchy the test kit mounts.
#[cfg(test)]
pub(super) struct HybridLayout {
    _hierarchy: openim_test_kit::cgroup2::Cgroup2Mount,
    host: tempfile::TempDir,
}

#[cfg(test)]
impl HybridLayout {
    /// Mounts the layout; `None` without root, which mounting needs.
    pub(super) fn mount() -> Option<Self> {
        // SAFETY: geteuid(2) has no failure mode.
        if unsafe { libc::geteuid() } != 0 {
            return None;
        }
        let hierarchy = openim_test_kit::cgroup2::Cgroup2Mount::mount();
        let host = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(hierarchy.root(), host.path().join("unified")).unwrap();
        Some(Self {
            _hierarchy: hierarchy,
            host,
        })
    }

    pub(super) fn host(&self) -> &Path {
        self.host.path()
    }

    pub(super) fn unified(&self) -> PathBuf {
        self.host.path().join("unified")
    }
}

#[cfg(test)]
mod tests;
