//! Runs, for `cargo xtask vm --kernel VERSION`, the privileged kernel tests under another kernel.
//!
//! The kernel is a Debian cloud kernel (the flavour of Debian 11 and 12 cloud nodes), fetched with
//! `apt-get download` through a private apt configuration (its own sources and lists under the
//! cache, so the host's apt setup is neither needed nor changed) and unpacked with `dpkg-deb`.
//! qemu boots it with TCG (nested KVM fails on CI machines) and an initramfs built here:
//! busybox-static, the kernel's own virtio/virtiofs modules, and an `/init` that mounts the
//! host's `/` read-only over virtiofs (Debian's cloud kernels have no 9p), chroots into it and
//! runs the host-built test binaries, whose absolute paths therefore hold in the guest too.
//! The guest has its own kernel state, so no machine lock is needed.

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context, Result, bail};

use crate::{capture, status, step};

/// Lists every suite a Debian 11 or 12 kernel comes from: 5.10 in bullseye and its security
/// updates, 6.1 in bookworm and its security updates, 6.12 in bookworm-security (linux-6.12) and
/// bookworm-backports.
const APT_SOURCES: &str = "\
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bullseye main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bullseye-security main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-updates main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-backports main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bookworm-security main
";

/// Names where the sources the lists were last fetched for are kept, beside them.
const LISTS_SOURCES: &str = "lists/sources.list";

/// Bounds the package lists' age: older lists are refreshed, as new kernel ABIs replace old ones on
/// the mirror.
const LISTS_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

const FLAVOUR: &str = "cloud-amd64";

/// Lists the modules the guest needs to mount the host over virtiofs, in load order (each after the
/// ones its `depends=` names), with the config symbol that builds each. A `=y` symbol means built
/// in.
const VIRTIOFS_MODULES: &[(&str, &str)] = &[
    ("CONFIG_VIRTIO", "virtio_ring"),
    ("CONFIG_VIRTIO", "virtio"),
    ("CONFIG_VIRTIO_PCI_LIB_LEGACY", "virtio_pci_legacy_dev"),
    ("CONFIG_VIRTIO_PCI_LIB", "virtio_pci_modern_dev"),
    ("CONFIG_VIRTIO_PCI", "virtio_pci"),
    ("CONFIG_FUSE_FS", "fuse"),
    ("CONFIG_VIRTIO_FS", "virtiofs"),
];

/// Sizes the guest memory; virtiofs needs it shared with virtiofsd.
const GUEST_MEMORY_MIB: u32 = 1024;

/// Bounds a guest's run: boot plus the whole kernel test suite under TCG takes 3.5 to 4.5 minutes
/// here (it took 8.5 while each observer start parsed all of the kernel's BTF unoptimised); a hung
/// guest is killed.
const GUEST_TIMEOUT: Duration = Duration::from_secs(900);

/// Holds the line the guest's `/init` prints after the tests, before their exit status.
const EXIT_MARKER: &str = "xtask-vm: tests exited with status ";

/// Says what to run in the guest: test binaries, one after another, and the directory cargo would
/// run them from.
pub struct GuestTests<'a> {
    pub binaries: &'a [PathBuf],
    pub working_dir: &'a Path,
    pub args: &'a [&'a str],
}

/// Holds a kernel ready to boot.
struct Kernel {
    release: String,
    vmlinuz: PathBuf,
    /// Modules to load in the initramfs, in order (empty when all are built in).
    modules: Vec<PathBuf>,
}

/// Fetches (or finds in the cache) the kernel for `request`, boots it and runs `tests` inside.
/// Returns the test runners' summary lines added up into one.
///
/// # Errors
///
/// Fails when qemu is missing and cannot be installed, the kernel cannot be found, downloaded or
/// unpacked, the guest cannot be started, or it stops, times out, prints no summary or reports
/// failed tests.
pub fn run(cache: &Path, request: &str, tests: &GuestTests) -> Result<String> {
    ensure_qemu()?;
    let apt = PrivateApt::new(&cache.join("apt"))?;
    let package = apt.kernel_package(request)?;
    let kernel = unpack_kernel(&apt, cache, &package)?;
    let busybox = unpack_busybox(&apt, cache)?;
    eprintln!("xtask: booting Linux {} under qemu (TCG)", kernel.release);

    let scratch = ScratchDir::create(cache, &kernel.release)?;
    let initramfs = scratch.path.join("initramfs.cpio");
    write_initramfs(&initramfs, &busybox, &kernel.modules, tests)?;
    let started = Instant::now();
    let summary = boot(&scratch.path, &kernel, &initramfs)?;
    eprintln!(
        "xtask: Linux {}: {summary} ({:.0} s)",
        kernel.release,
        started.elapsed().as_secs_f64()
    );
    Ok(summary)
}

/// Returns where downloads and unpacked kernels are kept between runs.
pub fn cache_dir(workspace: &Path) -> PathBuf {
    workspace.join("target/vm")
}

fn ensure_qemu() -> Result<()> {
    let qemu_works = Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success());
    if !qemu_works {
        crate::apt::install("qemu-system-x86")?;
    }
    if virtiofsd().is_none() {
        // Debian 13 and later ship the Rust virtiofsd on its own; 12 ships it inside qemu.
        crate::apt::install("virtiofsd")?;
    }
    Ok(())
}

fn virtiofsd() -> Option<PathBuf> {
    ["/usr/libexec/virtiofsd", "/usr/lib/qemu/virtiofsd"]
        .into_iter()
        .map(PathBuf::from)
        .find(|path| path.is_file())
}

/// Runs apt with its own sources, lists and archive cache under `root`.
struct PrivateApt {
    root: PathBuf,
}

impl PrivateApt {
    fn new(root: &Path) -> Result<Self> {
        for dir in ["lists/partial", "cache/archives/partial", "debs"] {
            std::fs::create_dir_all(root.join(dir))
                .with_context(|| format!("creating {}", root.join(dir).display()))?;
        }
        let sources = root.join("sources.list");
        std::fs::write(&sources, APT_SOURCES)
            .with_context(|| format!("writing {}", sources.display()))?;
        let apt = Self {
            root: root.to_owned(),
        };
        if apt.lists_are_stale() {
            apt.update()?;
        }
        Ok(apt)
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        let root = self.root.display();
        command.args([
            "-o".into(),
            format!("Dir::Etc::SourceList={root}/sources.list"),
            "-o".into(),
            "Dir::Etc::SourceParts=/dev/null".into(),
            "-o".into(),
            format!("Dir::State::Lists={root}/lists"),
            "-o".into(),
            format!("Dir::Cache={root}/cache"),
            // Downloads go to a directory of ours that the _apt user cannot write.
            "-o".into(),
            "APT::Sandbox::User=root".into(),
        ]);
        command
    }

    /// Says whether the lists are older than `LISTS_MAX_AGE`, or were fetched for other sources
    /// than `APT_SOURCES` (a suite added since).
    fn lists_are_stale(&self) -> bool {
        let fetched_for = std::fs::read_to_string(self.root.join(LISTS_SOURCES));
        if fetched_for.ok().as_deref() != Some(APT_SOURCES) {
            return true;
        }
        let newest = std::fs::read_dir(self.root.join("lists"))
            .into_iter()
            .flatten()
            .filter_map(|entry| entry.ok())
            .filter(|entry| entry.file_name().to_string_lossy().contains("_Packages"))
            .filter_map(|entry| entry.metadata().ok()?.modified().ok())
            .min();
        match newest {
            Some(modified) => SystemTime::now()
                .duration_since(modified)
                .map_or(true, |age| age > LISTS_MAX_AGE),
            None => true,
        }
    }

    fn update(&self) -> Result<()> {
        step(
            "fetching Debian 11's and 12's package lists for the kernels (apt-get update, private \
            lists)",
            self.command("apt-get").args(["update", "-qq"]),
        )?;
        let fetched_for = self.root.join(LISTS_SOURCES);
        std::fs::write(&fetched_for, APT_SOURCES)
            .with_context(|| format!("writing {}", fetched_for.display()))
    }

    /// Returns the kernel package for `request`: a series (`6.1`, `6.12`) picks its newest cloud
    /// kernel; anything longer is an exact release (`6.1.0-57`, `6.12.117+deb12`, with or without
    /// the `-cloud-amd64` suffix).
    fn kernel_package(&self, request: &str) -> Result<String> {
        let is_series = request.split('.').count() == 2
            && request.split('.').all(|part| part.parse::<u32>().is_ok());
        if !is_series {
            let release = request
                .strip_suffix(&format!("-{FLAVOUR}"))
                .unwrap_or(request);
            let package = format!("linux-image-{release}-{FLAVOUR}");
            if self.candidate(std::slice::from_ref(&package))?.is_empty() {
                bail!("Debian 11 and 12 have no package {package}");
            }
            return Ok(package);
        }
        let names = capture(
            self.command("apt-cache")
                .args(["pkgnames", &format!("linux-image-{request}")]),
        )?;
        let in_series: Vec<String> = names
            .lines()
            .filter(|name| {
                name.strip_prefix("linux-image-")
                    .and_then(|rest| rest.strip_suffix(&format!("-{FLAVOUR}")))
                    .and_then(|release| release.strip_prefix(request))
                    .is_some_and(|rest| rest.starts_with(['.', '-']))
            })
            .map(str::to_owned)
            .collect();
        let mut newest: Option<(String, String)> = None;
        for (package, version) in self.candidate(&in_series)? {
            let newer = match &newest {
                None => true,
                Some((_, best)) => Command::new("dpkg")
                    .args(["--compare-versions", &version, "gt", best])
                    .status()
                    .is_ok_and(|status| status.success()),
            };
            if newer {
                newest = Some((package, version));
            }
        }
        newest
            .map(|(package, _)| package)
            .with_context(|| format!("Debian 11 and 12 have no linux-image-{request}.*-{FLAVOUR}"))
    }

    /// Returns (package, candidate version) for each of `packages` apt can install.
    fn candidate(&self, packages: &[String]) -> Result<Vec<(String, String)>> {
        if packages.is_empty() {
            return Ok(Vec::new());
        }
        let policy = capture(self.command("apt-cache").arg("policy").args(packages))?;
        let mut found = Vec::new();
        let mut current = None;
        for line in policy.lines() {
            if let Some(name) = line.strip_suffix(':').filter(|_| !line.starts_with(' ')) {
                current = Some(name.to_owned());
            } else if let Some(version) = line.trim().strip_prefix("Candidate:")
                && let Some(package) = current.take()
            {
                let version = version.trim();
                if version != "(none)" {
                    found.push((package, version.to_owned()));
                }
            }
        }
        Ok(found)
    }

    /// Returns the package's .deb, downloaded once into the cache.
    fn download(&self, package: &str) -> Result<PathBuf> {
        let debs = self.root.join("debs");
        let prefix = format!("{package}_");
        let find = || -> Option<PathBuf> {
            std::fs::read_dir(&debs)
                .ok()?
                .filter_map(|entry| entry.ok())
                .map(|entry| entry.path())
                .find(|path| {
                    path.file_name()
                        .is_some_and(|name| name.to_string_lossy().starts_with(&prefix))
                        && path.extension().is_some_and(|ext| ext == "deb")
                })
        };
        if let Some(deb) = find() {
            return Ok(deb);
        }
        let download = |apt: &Self| {
            step(
                &format!("downloading {package} (apt-get download)"),
                apt.command("apt-get")
                    .current_dir(&debs)
                    .args(["download", "-qq", package]),
            )
        };
        if download(self).is_err() {
            // The mirror may have replaced that version since the lists were fetched.
            self.update()?;
            download(self)?;
        }
        find().with_context(|| format!("apt-get download left no {package}_*.deb"))
    }
}

/// Unpacks the kernel image, its config and the virtiofs modules, once per kernel.
fn unpack_kernel(apt: &PrivateApt, cache: &Path, package: &str) -> Result<Kernel> {
    let release = package
        .strip_prefix("linux-image-")
        .context("not a kernel package")?
        .to_owned();
    let dir = cache.join("kernels").join(&release);
    let vmlinuz = dir.join("vmlinuz");
    let module_list = dir.join("modules.order");
    if !(vmlinuz.is_file() && module_list.is_file()) {
        let deb = apt.download(package)?;
        let scratch = ScratchDir::create(cache, &format!("unpack-{release}"))?;
        step(
            &format!("unpacking {}", deb.display()),
            Command::new("dpkg-deb")
                .arg("-x")
                .arg(&deb)
                .arg(&scratch.path),
        )?;
        let unpacked = &scratch.path;
        let config_path = unpacked.join(format!("boot/config-{release}"));
        let config = std::fs::read_to_string(&config_path)
            .with_context(|| format!("reading {}", config_path.display()))?;
        let setting = |symbol: &str| {
            config
                .lines()
                .find_map(|line| line.strip_prefix(&format!("{symbol}=")))
                .map(str::to_owned)
        };
        for symbol in ["CONFIG_VIRTIO_PCI", "CONFIG_VIRTIO_FS"] {
            if setting(symbol).is_none() {
                bail!("Linux {release} is built without {symbol}: its guest cannot mount the host");
            }
        }
        let module_root = unpacked.join("lib/modules").join(&release);
        let mut order = String::new();
        std::fs::create_dir_all(dir.join("modules"))?;
        for (symbol, module) in VIRTIOFS_MODULES {
            if setting(symbol).as_deref() != Some("m") {
                continue;
            }
            let source = find_module(&module_root, module)?.with_context(|| {
                format!("{module} is a module of Linux {release} but not in {package}")
            })?;
            let file_name = source.file_name().context("module file name")?;
            std::fs::copy(&source, dir.join("modules").join(file_name))
                .with_context(|| format!("copying {}", source.display()))?;
            order.push_str(&format!("{}\n", file_name.to_string_lossy()));
        }
        std::fs::copy(unpacked.join(format!("boot/vmlinuz-{release}")), &vmlinuz)
            .context("copying the kernel image")?;
        std::fs::write(&module_list, order)?;
    }
    let modules = std::fs::read_to_string(&module_list)?
        .lines()
        .map(|name| dir.join("modules").join(name))
        .collect();
    Ok(Kernel {
        release,
        vmlinuz,
        modules,
    })
}

/// Finds `NAME.ko` or `NAME.ko.xz` anywhere under `root` (busybox in the guest unpacks xz).
fn find_module(root: &Path, name: &str) -> Result<Option<PathBuf>> {
    let wanted = [format!("{name}.ko"), format!("{name}.ko.xz")];
    let mut pending = vec![root.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                pending.push(path);
            } else if wanted.iter().any(|file| entry.file_name() == file.as_str()) {
                return Ok(Some(path));
            }
        }
    }
    Ok(None)
}

fn unpack_busybox(apt: &PrivateApt, cache: &Path) -> Result<PathBuf> {
    let busybox = cache.join("busybox");
    if busybox.is_file() {
        return Ok(busybox);
    }
    let deb = apt.download("busybox-static")?;
    let scratch = ScratchDir::create(cache, "unpack-busybox")?;
    status(
        Command::new("dpkg-deb")
            .arg("-x")
            .arg(&deb)
            .arg(&scratch.path),
    )?;
    std::fs::copy(scratch.path.join("bin/busybox"), &busybox).context("copying busybox")?;
    Ok(busybox)
}

/// Holds a directory under the cache, removed when dropped, whatever happened in between.
struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    fn create(cache: &Path, name: &str) -> Result<Self> {
        let path = cache.join(format!("tmp-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self { path })
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Returns the guest's `/init`: modules, mounts, then the tests in a chroot of the host's `/`.
fn init_script(modules: &[String], tests: &GuestTests) -> String {
    let quote = |text: &str| format!("'{}'", text.replace('\'', r"'\''"));
    let args: Vec<String> = tests.args.iter().map(|arg| quote(arg)).collect();
    format!(
        r#"#!/bin/busybox sh
# Written by `cargo xtask vm`.
/bin/busybox --install -s /bin
export PATH=/bin
fail() {{ echo "xtask-vm: $*"; echo "{EXIT_MARKER}1"; poweroff -f; }}
mount -t proc proc /proc && mount -t sysfs sysfs /sys && mount -t devtmpfs devtmpfs /dev \
  || fail "mounting /proc, /sys, /dev failed"
for module in {modules}; do
  case "$module" in
    *.xz) unxz -c "/lib/modules/$module" > /module.ko && insmod /module.ko && rm /module.ko ;;
    *) insmod "/lib/modules/$module" ;;
  esac || fail "loading $module failed"
done
# The host's files, read-only; the kernel's own state on top.
mount -t virtiofs -o ro host /host || fail "mounting the host over virtiofs failed"
mount -t proc proc /host/proc
mount -t sysfs sysfs /host/sys
mount -t devtmpfs devtmpfs /host/dev
mount -t tracefs tracefs /host/sys/kernel/tracing
mount -t cgroup2 cgroup2 /host/sys/fs/cgroup
mount -t tmpfs tmpfs /host/tmp
mount -t tmpfs tmpfs /host/run
ip link set lo up || fail "no loopback"
status=0
for binary in {binaries}; do
  echo "xtask-vm: Linux $(uname -r), running $binary"
  chroot /host /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root RUST_BACKTRACE=1 /bin/sh -c 'cd "$1" && shift && exec "$@"' sh \
    {dir} "$binary" {args} || status=$?
done
echo "{EXIT_MARKER}$status"
poweroff -f
"#,
        modules = modules.join(" "),
        dir = quote(&tests.working_dir.to_string_lossy()),
        binaries = tests
            .binaries
            .iter()
            .map(|binary| quote(&binary.to_string_lossy()))
            .collect::<Vec<_>>()
            .join(" "),
        args = args.join(" "),
    )
}

fn write_initramfs(
    path: &Path,
    busybox: &Path,
    modules: &[PathBuf],
    tests: &GuestTests,
) -> Result<()> {
    let mut archive = Cpio::default();
    for dir in ["bin", "dev", "host", "lib", "lib/modules", "proc", "sys"] {
        archive.directory(dir);
    }
    archive.device("dev/console", 5, 1);
    archive.file(
        "bin/busybox",
        0o755,
        &std::fs::read(busybox).context("reading busybox")?,
    );
    let mut names = Vec::new();
    for module in modules {
        let name = module
            .file_name()
            .context("module file name")?
            .to_string_lossy()
            .into_owned();
        archive.file(
            &format!("lib/modules/{name}"),
            0o644,
            &std::fs::read(module).with_context(|| format!("reading {}", module.display()))?,
        );
        names.push(name);
    }
    archive.file("init", 0o755, init_script(&names, tests).as_bytes());
    std::fs::write(path, archive.finish()).with_context(|| format!("writing {}", path.display()))
}

/// Builds a `newc` cpio archive, the format the kernel unpacks as initramfs.
#[derive(Default)]
struct Cpio {
    bytes: Vec<u8>,
    next_inode: u32,
}

impl Cpio {
    fn directory(&mut self, name: &str) {
        self.entry(name, 0o040755, (0, 0), &[]);
    }

    fn device(&mut self, name: &str, major: u32, minor: u32) {
        self.entry(name, 0o020600, (major, minor), &[]);
    }

    fn file(&mut self, name: &str, permissions: u32, data: &[u8]) {
        self.entry(name, 0o100000 | permissions, (0, 0), data);
    }

    fn entry(&mut self, name: &str, mode: u32, (major, minor): (u32, u32), data: &[u8]) {
        self.next_inode += 1;
        let fields = [
            self.next_inode,
            mode,
            0, // uid
            0, // gid
            1, // nlink
            0, // mtime
            data.len() as u32,
            0, // dev major
            0, // dev minor
            major,
            minor,
            name.len() as u32 + 1,
            0, // check
        ];
        self.bytes.extend_from_slice(b"070701");
        for field in fields {
            self.bytes
                .extend_from_slice(format!("{field:08x}").as_bytes());
        }
        self.bytes.extend_from_slice(name.as_bytes());
        self.bytes.push(0);
        self.pad();
        self.bytes.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.bytes.len().is_multiple_of(4) {
            self.bytes.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.bytes
    }
}

/// Holds a child, killed and reaped when dropped (qemu, virtiofsd), so no path leaves one running.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Boots the guest, passes its console through, and returns the test runner's summary.
///
/// Longer than 100 lines on purpose: qemu's and virtiofsd's command lines, started and
/// stopped in order, read best as one sequence.
fn boot(scratch: &Path, kernel: &Kernel, initramfs: &Path) -> Result<String> {
    let socket = scratch.join("virtiofs.sock");
    let virtiofsd = virtiofsd().context("virtiofsd is missing")?;
    let _virtiofsd = Reaped(
        Command::new(&virtiofsd)
            .arg(format!("--socket-path={}", socket.display()))
            .args(["-o", "source=/", "-o", "cache=auto", "-o", "sandbox=chroot"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("could not start {}", virtiofsd.display()))?,
    );
    let socket_deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        if Instant::now() > socket_deadline {
            bail!("virtiofsd did not create {} within 10 s", socket.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }

    let memory = format!("{GUEST_MEMORY_MIB}M");
    let mut qemu = Reaped(
        Command::new("qemu-system-x86_64")
            .args(["-accel", "tcg", "-smp", "2", "-m", &memory])
            .args(["-nographic", "-nic", "none", "-no-reboot"])
            .arg("-kernel")
            .arg(&kernel.vmlinuz)
            .arg("-initrd")
            .arg(initramfs)
            .args(["-append", "console=ttyS0 quiet panic=-1"])
            .arg("-chardev")
            .arg(format!("socket,id=host,path={}", socket.display()))
            .args(["-device", "vhost-user-fs-pci,chardev=host,tag=host"])
            .args(["-object"])
            .arg(format!(
                "memory-backend-memfd,id=memory,size={memory},share=on"
            ))
            .args(["-numa", "node,memdev=memory"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("could not start qemu-system-x86_64")?,
    );
    let console = qemu.0.stdout.take().context("qemu's stdout")?;
    let (lines, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(console).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });

    let deadline = Instant::now() + GUEST_TIMEOUT;
    let mut summary = None;
    let mut exit_status = None;
    let mut stdout = std::io::stdout().lock();
    loop {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            bail!(
                "Linux {}: the guest did not finish within {} s (qemu killed)",
                kernel.release,
                GUEST_TIMEOUT.as_secs()
            );
        };
        let line = match received.recv_timeout(left) {
            Ok(line) => line,
            // The console closed: qemu exited.
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
        };
        let line = strip_terminal_controls(&line);
        let _ = writeln!(stdout, "{line}");
        if let Some(result) = line.trim().strip_prefix("test result: ") {
            summary.get_or_insert_with(Summary::default).add(result);
        }
        if let Some(code) = line.trim().strip_prefix(EXIT_MARKER) {
            exit_status = code.trim().parse::<i32>().ok();
        }
    }
    let _ = stdout.flush();
    let Some(exit_status) = exit_status else {
        bail!(
            "Linux {}: the guest stopped before the tests finished (see its console above)",
            kernel.release
        );
    };
    let summary = summary
        .with_context(|| {
            format!(
                "Linux {}: the test binaries printed no summary",
                kernel.release
            )
        })?
        .to_string();
    if exit_status != 0 {
        bail!(
            "Linux {}: the tests failed (exit status {exit_status}): {summary}",
            kernel.release
        );
    }
    Ok(summary)
}

/// Adds up the `test result:` lines of several test binaries.
#[derive(Default)]
struct Summary {
    passed: u64,
    failed: u64,
    ignored: u64,
}

impl Summary {
    /// Adds one `ok. 12 passed; 0 failed; 1 ignored; …` line.
    fn add(&mut self, result: &str) {
        let count = |label: &str| {
            result
                .split(';')
                .find_map(|part| part.trim().strip_suffix(label))
                .and_then(|number| number.rsplit(' ').next())
                .and_then(|number| number.parse::<u64>().ok())
                .unwrap_or(0)
        };
        self.passed += count(" passed");
        self.failed += count(" failed");
        self.ignored += count(" ignored");
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verdict = if self.failed == 0 { "ok" } else { "FAILED" };
        write!(
            f,
            "{verdict}. {} passed; {} failed; {} ignored",
            self.passed, self.failed, self.ignored
        )
    }
}

/// Strips the firmware's screen handling (SeaBIOS clears the screen on the serial line).
fn strip_terminal_controls(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.next() == Some('[') {
                // CSI: parameters up to a final byte in @..~ (other escapes are one letter).
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
        } else if c != '\r' {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests;
