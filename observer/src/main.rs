//! The `observer` command: a thin shell over the library.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use observer::daemon;

/// Catches the moment OpenIM's WebSocket placement and its push delivery disagree about which
/// msggateway holds a user, by watching their traffic with eBPF.
#[derive(Parser, Debug)]
#[command(name = "observer", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Attach to the kernel and watch connections to the gateway ports (needs root or
    /// CAP_BPF + CAP_PERFMON). Alerts go to stdout as JSON lines, logs to stderr.
    Run(daemon::RunArgs),
    /// Read a capture written by `observer run --record` (no root needed).
    Replay(daemon::ReplayArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) if err.use_stderr() => {
            // Usage errors in one line, like every other error a user can cause.
            let message = err.kind().to_string();
            let detail = err.to_string();
            let first = detail.lines().next().unwrap_or(&message);
            eprintln!("observer: {}", first.trim_start_matches("error: "));
            return ExitCode::from(2);
        }
        Err(err) => {
            let _ = err.print();
            return ExitCode::SUCCESS;
        }
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match execute(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("observer: {err:#}");
            ExitCode::from(2)
        }
    }
}

fn execute(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run(args) => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(daemon::run(args))?;
        }
        Command::Replay(args) => daemon::replay(args)?,
    }
    Ok(())
}
