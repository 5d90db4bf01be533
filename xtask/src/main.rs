//! `cargo xtask`: builds the eBPF object with the toolchain it needs, the observer around it,
//! and runs the checks. Every command first makes sure the toolchain is in place (`setup`).

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

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
    /// Install what the eBPF build needs: rust-src for nightly, and a bpf-linker built against
    /// nightly's own LLVM (once; later runs find it). Every other task runs this first.
    Setup,
    /// Build the eBPF object and the `observer` binary that embeds it.
    Build {
        /// Optimised build (target/release/observer).
        #[arg(long)]
        release: bool,
    },
    /// Everything CI checks: formatting, clippy -D warnings (host and eBPF crates), unit tests
    /// and the privileged integration tests (run as root: they load the real programs).
    Test,
    /// The observer catching OpenIM 3.5.1's scale-out bug in a simulated cluster (network
    /// namespaces on this machine; needs root). Arguments go to `openim-lab demo`, e.g.
    /// `cargo xtask demo --mode report-fix --replicas 3 --users 100`.
    Demo {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// What watching costs (figures, not a test; needs root): push throughput and latency in
    /// the lab with no observer, the release observer, and a bpftrace peer, interleaved; and
    /// nanoseconds added per watched and unwatched write(2). Installs bpftrace when missing
    /// (apt). Arguments go to `openim-lab bench`, e.g. `cargo xtask bench --rounds 5`.
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
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
        Task::Setup => setup().map(|_| ()),
        Task::Build { release } => setup().and_then(|toolchain| build(&toolchain, release)),
        Task::Test => setup().and_then(|toolchain| test(&toolchain)),
        Task::Demo { args } => setup().and_then(|toolchain| demo(&toolchain, &args)),
        Task::Bench { args } => setup().and_then(|toolchain| bench(&toolchain, &args)),
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

/// What the eBPF build needs on PATH.
struct Toolchain {
    bpf_linker_bin: PathBuf,
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

fn setup() -> Result<Toolchain> {
    let nightly = capture(Command::new("rustc").args(["+nightly", "-vV"])).context(
        "the nightly toolchain is missing; install it with `rustup toolchain install nightly`",
    )?;
    let field = |name: &str| {
        nightly
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(str::trim)
            .map(str::to_owned)
    };
    let commit = field("commit-hash:").unwrap_or_else(|| "unknown".into());
    let llvm_version = field("LLVM version:").context("`rustc +nightly -vV` names no LLVM")?;
    let llvm_major = llvm_version
        .split('.')
        .next()
        .unwrap_or_default()
        .to_owned();

    let installed = capture(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        "nightly",
    ]))?;
    if !installed.lines().any(|line| line.starts_with("rust-src")) {
        eprintln!("xtask: adding rust-src to nightly (needed to build core for BPF)");
        status(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))
        .context("`rustup component add rust-src --toolchain nightly` failed")?;
    }

    // One linker per nightly: it must link exactly that nightly's libLLVM. The directory doubles
    // as LLVM_PREFIX and as the linker's rpath, so it must outlive the build: keep it out of
    // target/, where `cargo clean` would take it.
    let data_home = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local/share")))
        .context("neither XDG_DATA_HOME nor HOME is set")?;
    let short_commit = &commit[..commit.len().min(12)];
    let prefix = data_home.join(format!("openim-observer/bpf-linker-{short_commit}"));
    let bpf_linker = prefix.join("bin/bpf-linker");
    let linker_works = Command::new(&bpf_linker)
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success());
    if !linker_works {
        install_bpf_linker(&prefix, &llvm_major)?;
    }
    Ok(Toolchain {
        bpf_linker_bin: prefix.join("bin"),
    })
}

fn install_bpf_linker(prefix: &Path, llvm_major: &str) -> Result<()> {
    let sysroot = capture(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))?;
    let lib_dir = Path::new(sysroot.trim()).join("lib");
    let wanted = format!("libLLVM.so.{llvm_major}.");
    let libllvm = std::fs::read_dir(&lib_dir)
        .with_context(|| format!("reading {}", lib_dir.display()))?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name())
        .find(|name| name.to_string_lossy().starts_with(&wanted))
        .with_context(|| {
            format!(
                "nightly ships no {wanted}* in {}: is the nightly toolchain complete?",
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
        "xtask: building bpf-linker against nightly's LLVM {llvm_major} into {} (once, a few minutes)",
        prefix.display()
    );
    status(
        Command::new("cargo")
            .args([
                "+nightly",
                "install",
                "bpf-linker",
                "--locked",
                "--version",
                "0.13.0",
            ])
            .args(["--no-default-features", "--features"])
            .arg(format!("llvm-{llvm_major}"))
            .arg("--root")
            .arg(prefix)
            .env("LLVM_PREFIX", prefix),
    )
    .context("building bpf-linker failed (see cargo's output above)")?;
    Ok(())
}

fn ebpf_object() -> PathBuf {
    workspace_root().join("target/bpfel-unknown-none/release/observer-ebpf")
}

/// `cargo +nightly …` for the eBPF crate, with the linker on PATH.
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
        .args(["+nightly", subcommand, "-Z", "build-std=core"])
        .args(["--target", "bpfel-unknown-none", "--release"])
        .args(["--package", "observer-ebpf", "--bin", "observer-ebpf"]);
    command
}

/// Host cargo with the eBPF object's path, which `observer`'s build script embeds.
fn host_cargo(subcommand: &str) -> Command {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    command
        .current_dir(workspace_root())
        .env("OBSERVER_EBPF_OBJECT", ebpf_object())
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
        command.arg("--release");
    }
    status(&mut command).context("building the observer failed")
}

fn test(toolchain: &Toolchain) -> Result<()> {
    // Cluster mode's tests run against a real Redis.
    ensure_package("redis-server", "redis-server")?;
    build_ebpf(toolchain)?;
    step(
        "cargo fmt --check",
        host_cargo("fmt").args(["--all", "--", "--check"]),
    )?;
    step(
        "clippy (eBPF crate)",
        nightly_cargo(toolchain, "clippy").args(["--", "-D", "warnings"]),
    )?;
    step(
        "clippy (host crates)",
        host_cargo("clippy").args(["--all-targets", "--", "-D", "warnings"]),
    )?;
    // Integration tests load programs and share kernel state; each test file serialises its own
    // tests, and one test binary at a time runs.
    eprintln!("xtask: cargo test");
    let totals = run_tests(host_cargo("test").args(["--", "--test-threads=1"]))?;
    // cargo ends on the last binary's own line (often doc-tests with nothing to run): say what
    // the whole run did.
    println!("tests: {} passed, {} failed", totals.passed, totals.failed);
    if !totals.succeeded {
        bail!("cargo test failed");
    }
    Ok(())
}

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

/// The number just before `label` in `ok. 12 passed; 0 failed; …`.
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
    ensure_package("redis-server", "redis-server")?;
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
    ensure_package("bpftrace", "bpftrace")?;
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

/// Installs a Debian package when its command is missing (the lab's `redis-server`, the
/// benchmark's bpftrace peer); a fresh machine's package lists are refreshed first.
fn ensure_package(command: &str, package: &str) -> Result<()> {
    let installed = Command::new(command)
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success());
    if installed {
        return Ok(());
    }
    let how =
        format!("{command} is missing: install it (Debian/Ubuntu: `apt-get install -y {package}`)");
    let available = || -> Result<bool> {
        let policy = capture(Command::new("apt-cache").args(["policy", package]))
            .with_context(|| how.clone())?;
        Ok(policy
            .lines()
            .find_map(|line| line.trim().strip_prefix("Candidate:"))
            .map(str::trim)
            .is_some_and(|version| version != "(none)"))
    };
    if !available()? {
        // A fresh machine's package lists are empty until the first update.
        step(
            "refreshing the package lists (apt-get update)",
            Command::new("apt-get").args(["update", "-qq"]),
        )
        .with_context(|| how.clone())?;
        if !available()? {
            bail!("{how}");
        }
    }
    step(
        &format!("installing {package} (apt-get install -y {package})"),
        Command::new("apt-get")
            .args(["install", "-y", package])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .with_context(|| how.clone())
}

fn run(toolchain: &Toolchain, args: &[OsString]) -> Result<()> {
    build(toolchain, true)?;
    let binary = workspace_root().join("target/release/observer");
    status(Command::new(binary).args(args)).context("observer exited with an error")
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
