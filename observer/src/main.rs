//! Runs the `observer` command, a thin shell over the library.

use std::io::{self, BufWriter, Write};
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use observer::{
    daemon,
    tools::{self, ToolError},
};

/// Catches the moment OpenIM's WebSocket placement (msggateway-proxy) and its push delivery
/// disagree about which msggateway holds a user, by watching their traffic with eBPF.
#[derive(Parser, Debug)]
#[command(name = "observer", version)]
struct Cli {
    /// How logs on stderr are written: `text` (one line a person reads) or `json` (one object
    /// per line, for a log pipeline).
    #[arg(
        long,
        global = true,
        value_enum,
        value_name = "FORMAT",
        default_value_t = LogFormat::Text,
        env = "OPENIM_OBSERVER_LOG_FORMAT",
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

// Parsed once at start and matched at once: the variants' sizes cost nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Attach to the kernel and watch connections to the gateway ports (needs root or
    /// CAP_BPF + CAP_PERFMON). Alerts go to stdout as JSON lines, logs to stderr.
    Run(Box<daemon::RunArgs>),
    /// Read a capture written by `observer run --record` (no root needed).
    Replay(daemon::ReplayArgs),
    /// Print the ring's pick for each user id as JSON lines {"user":…,"member":…}
    Ring(tools::RingArgs),
    /// Measure, for 1..=N gateways, the share of users that proxy and push route apart
    Audit(tools::AuditArgs),
    /// Show where proxy and push send one user, and why they differ
    Explain(tools::ExplainArgs),
    /// Print the JSON Schema of the alert lines (this schema_version's)
    Schema,
}

/// Allocates with mimalloc rather than glibc's malloc: 14% fewer instructions for the engine on its
/// bench (callgrind), at about the same peak RSS (docs/benchmarks.md has the figures).
#[global_allocator]
static ALLOCATOR: observer::allocator::Mimalloc = observer::allocator::Mimalloc;

fn main() -> ExitCode {
    // `run` and `replay` take every flag from the environment too (`OPENIM_OBSERVER_…`).
    let command = Cli::command()
        .mut_subcommand("run", daemon::RunArgs::with_env)
        .mut_subcommand("replay", daemon::RunArgs::with_env);
    let parsed = command
        .try_get_matches()
        .and_then(|matches| Cli::from_arg_matches(&matches));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(err) if err.use_stderr() => {
            eprintln!("observer: {}", daemon::usage_error_line(&err));
            return ExitCode::from(2);
        }
        Err(err) => {
            let _ = err.print();
            return ExitCode::SUCCESS;
        }
    };
    init_logs(cli.log_format);
    match execute(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        // `observer ring … | head` closes the pipe early: that ends the output, not an error.
        Err(error) if reader_went_away(&error) => ExitCode::SUCCESS,
        Err(error) => {
            // The library's errors name their cause in their own message: print it once.
            eprintln!("observer: {error}");
            ExitCode::from(2)
        }
    }
}

/// Sends logs to stderr, filtered by `RUST_LOG`, as text or JSON lines.
fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // aya warns when it cannot lift RLIMIT_MEMLOCK on a kernel before 5.11; the observer's
        // own error says so with the fix, in the one line a failure prints.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,aya::sys::bpf=error"));
    let logs = tracing_subscriber::fmt()
        .with_writer(io::stderr)
        .with_env_filter(filter);
    match format {
        LogFormat::Text => logs
            .with_ansi(io::IsTerminal::is_terminal(&io::stderr()))
            .init(),
        LogFormat::Json => logs.json().with_ansi(false).init(),
    }
}

fn execute(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run(args) => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(daemon::run(*args))?;
        }
        Command::Replay(args) => daemon::replay(args)?,
        Command::Ring(args) => print_with(|out| args.run(out))?,
        Command::Audit(args) => print_with(|out| args.run(out))?,
        Command::Explain(args) => print_with(|out| args.run(out))?,
        Command::Schema => print_with(|out| {
            out.write_all(observer::alert::schema::schema_text().as_bytes())
                .map_err(ToolError::Write)
        })?,
    }
    Ok(())
}

/// Runs an offline tool with a buffered stdout, flushed at the end.
fn print_with(
    tool: impl FnOnce(&mut BufWriter<io::StdoutLock<'static>>) -> Result<(), ToolError>,
) -> Result<(), ToolError> {
    let mut out = BufWriter::new(io::stdout().lock());
    tool(&mut out)?;
    out.flush().map_err(ToolError::Write)
}

fn reader_went_away(error: &anyhow::Error) -> bool {
    matches!(
        error.downcast_ref::<ToolError>(),
        Some(ToolError::Write(reason)) if reason.kind() == io::ErrorKind::BrokenPipe
    )
}
