//! Mounts a cgroup v2 hierarchy of the tests' own: `--cgroup-scope` and the packet hook
//! (`--cgroup-root`) need one, and this host's services may live in cgroup v1 only. Needs root.

/// Holds a cgroup v2 hierarchy mounted at a temporary directory (this host's services may live in
/// cgroup v1 only), with sub-directories made on demand. Dropping it moves any process left in them
/// back to the root, removes them and unmounts.
pub struct Cgroup2Mount {
    mount: tempfile::TempDir,
    children: Vec<std::path::PathBuf>,
}

impl Cgroup2Mount {
    /// Returns the hierarchy's root directory.
    pub fn root(&self) -> &std::path::Path {
        self.mount.path()
    }

    /// Mounts a cgroup v2 hierarchy at a new temporary directory (panics if it cannot: the
    /// tests that use it need root).
    pub fn mount() -> Self {
        let mount = tempfile::tempdir().expect("temp dir");
        let target = std::ffi::CString::new(mount.path().as_os_str().as_encoded_bytes()).unwrap();
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
        assert_eq!(ret, 0, "mount cgroup2: {}", std::io::Error::last_os_error());
        Self {
            mount,
            children: Vec::new(),
        }
    }

    /// Makes a cgroup under the root named after this process and `name`, removed when the mount is
    /// dropped, and returns its path; panics if it cannot.
    pub fn child(&mut self, name: &str) -> std::path::PathBuf {
        let path = self
            .mount
            .path()
            .join(format!("observer-test-{}-{name}", std::process::id()));
        std::fs::create_dir(&path).expect("make cgroup");
        self.children.push(path.clone());
        path
    }

    /// Moves the process `pid` into the root cgroup; panics if it cannot.
    pub fn move_to_root(&self, pid: u32) {
        std::fs::write(self.mount.path().join("cgroup.procs"), pid.to_string())
            .expect("move to the root cgroup");
    }
}

impl Drop for Cgroup2Mount {
    fn drop(&mut self) {
        for child in std::mem::take(&mut self.children).into_iter().rev() {
            if let Ok(procs) = std::fs::read_to_string(child.join("cgroup.procs")) {
                for pid in procs.lines().filter_map(|pid| pid.parse().ok()) {
                    self.move_to_root(pid);
                }
            }
            let _ = std::fs::remove_dir(&child);
        }
        let target = std::ffi::CString::new(self.mount.path().as_os_str().as_encoded_bytes());
        if let Ok(target) = target {
            // SAFETY: umount2(2) on the directory we mounted.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
    }
}
