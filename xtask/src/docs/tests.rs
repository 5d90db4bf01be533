use super::*;

#[test]
fn slugs_follow_github() {
    assert_eq!(slug("Running it on a node"), "running-it-on-a-node");
    assert_eq!(slug("`route_mismatch`"), "route_mismatch");
    assert_eq!(
        slug("Capturing from packets, or at the syscalls (`--capture-hook`)"),
        "capturing-from-packets-or-at-the-syscalls---capture-hook"
    );
    assert_eq!(
        slug("Cluster mode: OpenIM's Redis or a dedicated one"),
        "cluster-mode-openims-redis-or-a-dedicated-one"
    );
    assert_eq!(
        slug("Adding a `capture_degraded` reason"),
        "adding-a-capture_degraded-reason"
    );
}

#[test]
fn repeated_headings_get_numbered_anchors_and_fences_hide_headings() {
    let text = "# Title\n## Use\n```sh\n# not a heading\n```\n## Use\n#hashtag\n";
    let anchors: Vec<String> = heading_anchors(text).into_iter().collect();
    assert_eq!(anchors, ["title", "use", "use-1"]);
}

#[test]
fn links_are_found_with_their_line_and_without_titles() {
    let prose = "See [install](docs/install.md#run-it) and\n\
                     [a link\nover lines](x.md \"title\").\n\
                     ![image](img.png), [web](https://example.com), [not] (a link), a](b).\n";
    let targets: Vec<(String, usize)> = links(prose)
        .into_iter()
        .map(|link| (link.target, link.line))
        .collect();
    assert_eq!(
        targets,
        [
            ("docs/install.md#run-it".to_owned(), 1),
            ("x.md".to_owned(), 3),
            ("img.png".to_owned(), 4),
            ("https://example.com".to_owned(), 4)
        ]
    );
}

#[test]
fn links_inside_fences_are_ignored() {
    let text = "[a](a.md)\n```\n[b](b.md)\n```\n[c](c.md)\n";
    let targets: Vec<String> = links(&without_fences(text))
        .into_iter()
        .map(|l| l.target)
        .collect();
    assert_eq!(targets, ["a.md", "c.md"]);
}

#[test]
fn code_spans_may_cross_a_line_and_only_repo_paths_count() {
    let prose = "Run `cargo xtask vm\n--kernel 6.1`, read `observer/src/main.rs` and ``a`b``.\n";
    let spans = code_spans(prose);
    assert_eq!(
        spans,
        [
            ("cargo xtask vm --kernel 6.1".to_owned(), 1),
            ("observer/src/main.rs".to_owned(), 2),
            ("a`b".to_owned(), 2)
        ]
    );
    assert!(is_repo_path("observer/src/main.rs"));
    assert!(is_repo_path("deploy/kubernetes/overlays/example"));
    assert!(!is_repo_path("observer run --events"));
    assert!(!is_repo_path("/proc/<pid>/fd"));
    assert!(!is_repo_path("tests/src/*.rs"));
    assert!(!is_repo_path("target/release/observer"));
}

#[test]
fn help_text_gives_subcommands_and_long_flags() {
    let top = "Usage: observer <COMMAND>\n\nCommands:\n  run     Attach\n  ring    Print\n\
                   \x20 help    Print this\n\nOptions:\n  -h, --help     Print help\n\
                   \x20 -V, --version  Print version\n";
    let sub = "Options:\n      --grpc-port <PORT>\n          Remote port\n\
                   \x20     --grpc-budget-refill <BYTES_PER_SEC>\n      --events\n  -h, --help\n";
    assert_eq!(
        subcommands_in_help(top),
        BTreeSet::from(["ring".into(), "run".into()])
    );
    assert_eq!(
        flags_in_help(sub),
        BTreeSet::from([
            "--events".into(),
            "--grpc-budget-refill".into(),
            "--grpc-port".into()
        ])
    );
}

#[test]
fn source_gives_subcommands_and_visible_long_flags() {
    let main = "enum Command {\n    /// Run.\n    Run(Box<RunArgs>),\n\
                    \x20   #[command(hide = true)]\n    Secret(X),\n    PushLoop(Y),\n}\n";
    assert_eq!(
        subcommands_in_source(main),
        BTreeSet::from(["push-loop".into(), "run".into()])
    );
    let args = "    #[arg(long = \"grpc-port\", value_name = \"PORT\")]\n\
                    pub grpc_ports: Vec<u16>,\n\
                    #[arg(long, value_name = \"BYTES\")]\n    /// doc\n    pub ring_bytes: u32,\n\
                    #[arg(long, hide = true)]\n    pub copy_walk: CopyWalk,\n\
                    #[arg(value_name = \"FILE\")]\n    pub file: PathBuf,\n\
                    #[arg(long)]\n    json: bool,\n";
    assert_eq!(
        flags_in_source(args),
        BTreeSet::from(["--grpc-port".into(), "--json".into(), "--ring-bytes".into()])
    );
}

#[test]
fn mentions_need_a_whole_flag() {
    let text = "set --grpc-budget-refill and `--ring-bytes`";
    assert!(mentions(text, "--grpc-budget-refill"));
    assert!(mentions(text, "--ring-bytes"));
    assert!(!mentions(text, "--grpc-budget"));
}
