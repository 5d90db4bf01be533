use clap::{CommandFactory, FromArgMatches, Parser};

use super::*;

#[derive(Parser, Debug)]
struct Cli {
    #[command(subcommand)]
    command: Sub,
}

#[derive(clap::Subcommand, Debug)]
enum Sub {
    Run(Box<RunArgs>),
    Replay(ReplayArgs),
}

/// Parses `argv` as `observer` does, with the environment as it is.
fn parse(argv: &[&str]) -> Result<Sub, clap::Error> {
    let command = Cli::command()
        .mut_subcommand("run", with_env)
        .mut_subcommand("replay", with_env);
    let matches = command.try_get_matches_from(argv)?;
    Cli::from_arg_matches(&matches).map(|cli| cli.command)
}

fn run_args(argv: &[&str]) -> RunArgs {
    match parse(argv) {
        Ok(Sub::Run(args)) => *args,
        other => panic!("{argv:?}: {other:?}"),
    }
}

/// The variables the child test reads; set only in the child's own process.
const SAMPLE_ENVIRONMENT: &[(&str, &str)] = &[
    ("OPENIM_OBSERVER_GRPC_PORT", "88,10088"),
    ("OPENIM_OBSERVER_RING_BYTES", "65536"),
    ("OPENIM_OBSERVER_KUBE", "true"),
    ("OPENIM_OBSERVER_KUBE_NAMESPACE", "chat,im"),
    ("OPENIM_OBSERVER_CAPTURE_HOOK", "syscalls"),
    ("OPENIM_OBSERVER_FOLD_WINDOW", "30"),
    ("OPENIM_OBSERVER_OUTPUT", "text"),
    ("OPENIM_OBSERVER_REDIS_PREFIX", "obs:"),
    (
        "OPENIM_OBSERVER_MEMORY_BUDGET",
        "not-a-number-unless-overridden",
    ),
    ("NODE_NAME", "node-7"),
];

/// Marks the child process `flags_come_from_the_environment` starts.
const CHILD: &str = "OBSERVER_ARGS_ENV_CHILD";

#[test]
fn flags_come_from_the_environment() {
    // Setting variables in this process would reach tests running beside it: the checks
    // run in a child process of this test binary, with the variables set for it alone.
    let output = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "daemon::args::tests::environment_child",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .envs(SAMPLE_ENVIRONMENT.iter().copied())
        .output()
        .expect("run the child test");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Runs in `flags_come_from_the_environment`'s child only; passes trivially elsewhere.
#[test]
fn environment_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let args = run_args(&["observer", "run", "--memory-budget", "2097152"]);
    assert_eq!(
        args.grpc_ports,
        [88, 10088],
        "a repeated flag, comma-separated"
    );
    assert_eq!(args.ring_bytes, 65536);
    assert!(args.kube);
    assert_eq!(args.kube_namespaces, ["chat", "im"]);
    assert_eq!(args.capture_hook, HookChoice::Syscalls);
    assert_eq!(args.engine.fold_window, 30);
    assert_eq!(args.engine.output.output, Some(OutputFormat::Text));
    assert_eq!(args.cluster.redis_prefix, "obs:");
    assert_eq!(args.cluster.node_name.as_deref(), Some("node-7"));
    assert_eq!(
        args.engine.memory_budget, 2_097_152,
        "the command line wins over the environment"
    );
    let Ok(Sub::Replay(replay)) =
        parse(&["observer", "replay", "--memory-budget", "2097152", "FILE"])
    else {
        panic!("replay with the environment");
    };
    assert_eq!(replay.engine.fold_window, 30);
    let error = parse(&["observer", "run"]).expect_err("a bad value from the environment");
    assert!(
        usage_error_line(&error).contains("not-a-number-unless-overridden"),
        "{error}"
    );
}

#[test]
fn every_flag_names_its_variable_in_help() {
    let mut command = Cli::command()
        .mut_subcommand("run", with_env)
        .mut_subcommand("replay", with_env);
    for sub in ["run", "replay"] {
        let help = command
            .find_subcommand_mut(sub)
            .expect("subcommand")
            .render_long_help()
            .to_string();
        let subcommand = Cli::command();
        let subcommand = subcommand.find_subcommand(sub).expect("subcommand");
        for arg in subcommand.get_arguments() {
            let Some(long) = arg.get_long().filter(|_| !arg.is_hide_set()) else {
                continue;
            };
            let expected = match long {
                "node-name" => "NODE_NAME".to_owned(),
                own if OWN_ENVIRONMENT.contains(&own) => continue,
                _ => env_name(long),
            };
            assert!(
                help.contains(&format!("[env: {expected}")),
                "{sub} --{long}: no {expected} in its help"
            );
        }
    }
}

#[test]
fn env_names_are_the_flag_in_screaming_snake_case() {
    assert_eq!(env_name("grpc-port"), "OPENIM_OBSERVER_GRPC_PORT");
    assert_eq!(
        env_name("max-watched-connections"),
        "OPENIM_OBSERVER_MAX_WATCHED_CONNECTIONS"
    );
}
