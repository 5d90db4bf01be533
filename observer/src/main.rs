//! The `observer` command: a thin dispatch to the library's subcommands.

use std::io::{self, BufWriter, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use observer::tools::{self, ToolError};

/// Watches OpenIM's gateway routing: where msggateway-proxy places a user's WebSocket and where
/// push delivers the user's messages.
#[derive(Parser, Debug)]
#[command(name = "observer", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the ring's pick for each user id as JSON lines {"user":…,"member":…}
    Ring(tools::RingArgs),
    /// Measure, for 1..=N gateways, the share of users that proxy and push route apart
    Audit(tools::AuditArgs),
    /// Show where proxy and push send one user, and why they differ
    Explain(tools::ExplainArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        // `observer ring … | head` closes the pipe early: that ends the output, not an error.
        Err(error) if reader_went_away(&error) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("observer: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let mut out = BufWriter::new(io::stdout().lock());
    match cli.command {
        Command::Ring(args) => args.run(&mut out)?,
        Command::Audit(args) => args.run(&mut out)?,
        Command::Explain(args) => args.run(&mut out)?,
    }
    out.flush().map_err(ToolError::Write)?;
    Ok(())
}

fn reader_went_away(error: &anyhow::Error) -> bool {
    matches!(
        error.downcast_ref::<ToolError>(),
        Some(ToolError::Write(reason)) if reason.kind() == io::ErrorKind::BrokenPipe
    )
}
