//! Checks, for `cargo xtask docs`, that the Markdown matches the repository and the observer's
//! command line. Three checks, over README.md, docs/, deploy/ and tests/README.md:
//!
//! - every relative link `[text](path#anchor)` names a file that exists, and a heading of that
//!   file whose GitHub slug is the anchor;
//! - every repository path named in backticks (`observer/…`, `docs/…`, …) exists;
//! - every `observer` subcommand and long flag that `--help` shows is mentioned in README.md or
//!   docs/.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Marks the starts of backticked paths that are checked as paths of this repository.
const REPO_PREFIXES: &[&str] = &[
    "observer/",
    "observer-ebpf/",
    "tests/",
    "xtask/",
    "deploy/",
    "docs/",
    ".ci/",
];

/// Names the flags every clap command has; nobody needs them documented.
const IMPLICIT_FLAGS: &[&str] = &["--help", "--version"];

/// Describes one thing the docs get wrong, and where: `file:line`, or the files searched.
struct Problem {
    place: String,
    message: String,
}

impl Problem {
    /// Describes a problem at `line` of `file`, named relative to the workspace `root`.
    fn at(root: &Path, file: &Path, line: usize, message: String) -> Self {
        let file = file.strip_prefix(root).unwrap_or(file);
        Problem {
            place: format!("{}:{line}", file.display()),
            message,
        }
    }
}

/// Runs every check from the workspace `root`, printing each problem on its own line. The
/// observer's subcommands and flags come from `observer`'s `--help` when a binary is given,
/// else from the clap definitions under observer/src.
///
/// # Errors
///
/// Fails when a Markdown file cannot be read, the observer's command line cannot be read from its
/// help or its source, or any check finds a problem.
pub fn check(root: &Path, observer: Option<&Path>) -> Result<()> {
    let files = markdown_files(root)?;
    let mut problems = Vec::new();
    let mut slugs = SlugCache::default();
    for file in &files {
        let text =
            fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let prose = without_fences(&text);
        problems.extend(check_links(root, file, &prose, &mut slugs));
        problems.extend(check_paths(root, file, &prose));
    }
    let cli = match observer {
        Some(binary) => cli_from_help(binary)?,
        None => cli_from_source(&root.join("observer/src"))?,
    };
    problems.extend(check_cli(root, &files, &cli)?);
    for problem in &problems {
        println!("{}: {}", problem.place, problem.message);
    }
    if !problems.is_empty() {
        bail!(
            "the docs do not match the code: {} problem(s) above",
            problems.len()
        );
    }
    eprintln!(
        "xtask: docs: {} files, links, paths and {} flags of {} subcommands checked",
        files.len(),
        cli.flags.len(),
        cli.subcommands.len()
    );
    Ok(())
}

/// Names the rustdoc lints `rustdoc` denies: every warning. Beyond broken intra-doc links, they are
/// links to private items from public docs (moot with private items documented), malformed HTML in
/// a comment, bare URLs and redundant explicit links: each a comment that renders wrong. What
/// `rustdoc` cannot see (a summary line that starts with a verb) is left to review.
const RUSTDOCFLAGS: &str = "-D warnings";

/// Names the workspace member the host's `cargo doc` leaves out: the eBPF programs build for
/// `bpfel-unknown-none` only (on the host the crate is an empty binary), so they are documented for
/// that target, with the pinned nightly, as `cargo xtask build` builds them.
const EBPF_CRATE: &str = "observer-ebpf";

/// Runs `cargo doc` over every crate with private items documented and every rustdoc warning
/// an error (`RUSTDOCFLAGS=-D warnings`), so a broken intra-doc link fails the run: the host
/// crates with the stable toolchain, the eBPF crate for its own target with the nightly.
///
/// # Errors
///
/// Fails when cargo cannot start or rustdoc reports a warning (printed above by cargo).
pub fn rustdoc(toolchain: &crate::Toolchain) -> Result<()> {
    let mut host = crate::host_cargo("doc");
    host.args(["--workspace", "--exclude", EBPF_CRATE])
        .args(["--no-deps", "--document-private-items"])
        .env("RUSTDOCFLAGS", RUSTDOCFLAGS);
    crate::step(
        &format!("cargo doc (host crates, private items, RUSTDOCFLAGS={RUSTDOCFLAGS})"),
        &mut host,
    )?;
    let mut ebpf = crate::nightly_cargo(toolchain, "doc");
    ebpf.args(["--no-deps", "--document-private-items"])
        .env("RUSTDOCFLAGS", RUSTDOCFLAGS);
    crate::step(
        &format!("cargo doc ({EBPF_CRATE} for bpfel-unknown-none, RUSTDOCFLAGS={RUSTDOCFLAGS})"),
        &mut ebpf,
    )
}

/// Lists README.md, docs/**/*.md, deploy/**/*.md and tests/README.md, sorted.
fn markdown_files(root: &Path) -> Result<Vec<PathBuf>> {
    let mut files = vec![root.join("README.md"), root.join("tests/README.md")];
    for dir in ["docs", "deploy"] {
        collect_files(&root.join(dir), "md", &mut files)?;
    }
    files.retain(|file| file.is_file());
    files.sort();
    files.dedup();
    Ok(files)
}

/// Adds every file under `dir` whose extension is `extension`, recursively.
fn collect_files(dir: &Path, extension: &str, files: &mut Vec<PathBuf>) -> Result<()> {
    if !dir.is_dir() {
        return Ok(());
    }
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            collect_files(&path, extension, files)?;
        } else if path.extension().is_some_and(|found| found == extension) {
            files.push(path);
        }
    }
    Ok(())
}

/// Blanks the lines of fenced code blocks, keeping the line count, so that neither links nor
/// headings nor backticks inside them count.
fn without_fences(text: &str) -> String {
    let mut fenced = false;
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// Turns a heading's text into its anchor as GitHub spells it: lowercase, punctuation dropped
/// except `-` and `_`, each space a `-`.
pub fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Returns every anchor of a Markdown text's headings, with GitHub's `-1`, `-2`… for repeats.
pub fn heading_anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = BTreeSet::new();
    for line in without_fences(text).lines() {
        let Some(heading) = heading_text(line) else {
            continue;
        };
        let base = slug(heading);
        let count = seen.entry(base.clone()).or_insert(0);
        anchors.insert(match *count {
            0 => base.clone(),
            n => format!("{base}-{n}"),
        });
        *count += 1;
    }
    anchors
}

/// Returns an ATX heading's text (`## Text ##` gives `Text`), or `None` for any other line.
fn heading_text(line: &str) -> Option<&str> {
    let hashes = line.len() - line.trim_start_matches('#').len();
    if !(1..=6).contains(&hashes) {
        return None;
    }
    let rest = &line[hashes..];
    if !rest.is_empty() && !rest.starts_with(' ') {
        return None;
    }
    Some(rest.trim().trim_end_matches('#').trim())
}

/// Caches the anchors of each Markdown file read so far.
#[derive(Default)]
struct SlugCache(HashMap<PathBuf, Option<BTreeSet<String>>>);

impl SlugCache {
    /// Returns the anchors of `file`, or `None` when it cannot be read as text.
    fn anchors(&mut self, file: &Path) -> Option<&BTreeSet<String>> {
        self.0
            .entry(file.to_path_buf())
            .or_insert_with(|| {
                fs::read_to_string(file)
                    .ok()
                    .map(|text| heading_anchors(&text))
            })
            .as_ref()
    }
}

/// Holds a link found in Markdown: its target as written, and the line it ends on.
#[derive(Debug, PartialEq, Eq)]
pub struct Link {
    pub target: String,
    pub line: usize,
}

/// Finds every inline link and image `[text](target)` in `prose` (fences already blanked); the
/// text may run over several lines. A title after the target (`(path "title")`) is dropped.
pub fn links(prose: &str) -> Vec<Link> {
    let bytes = prose.as_bytes();
    let mut found = Vec::new();
    let mut index = 0;
    while let Some(offset) = prose[index..].find("](") {
        let start = index + offset + 2;
        index = start;
        let Some(length) = prose[start..].find(')') else {
            break;
        };
        let inside = &prose[start..start + length];
        if inside.contains('\n') || !opens_link(bytes, start - 2) {
            continue;
        }
        let target = inside.split_whitespace().next().unwrap_or_default();
        found.push(Link {
            target: target.trim_matches(['<', '>']).to_owned(),
            line: prose[..start].matches('\n').count() + 1,
        });
        index = start + length;
    }
    found
}

/// Tells whether the `]` at `close` ends a bracketed text opened by a `[` before it in the
/// paragraph.
fn opens_link(bytes: &[u8], close: usize) -> bool {
    let mut depth = 0usize;
    let mut previous = b' ';
    for &byte in bytes[..close].iter().rev() {
        match byte {
            b']' => depth += 1,
            b'[' if depth == 0 => return true,
            b'[' => depth -= 1,
            b'\n' if previous == b'\n' => return false,
            _ => {}
        }
        previous = byte;
    }
    false
}

/// Checks that each relative link of `file` names an existing file, and an existing heading.
fn check_links(root: &Path, file: &Path, prose: &str, slugs: &mut SlugCache) -> Vec<Problem> {
    let dir = file.parent().unwrap_or(Path::new("."));
    let mut problems = Vec::new();
    for link in links(prose) {
        if link.target.contains("://") || link.target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match link.target.split_once('#') {
            Some((path, anchor)) => (path, Some(anchor)),
            None => (link.target.as_str(), None),
        };
        let target = if path.is_empty() {
            file.to_path_buf()
        } else {
            dir.join(path)
        };
        let problem = |message: String| Problem::at(root, file, link.line, message);
        if !target.exists() {
            problems.push(problem(format!("link to a missing file: {}", link.target)));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        if target.is_dir() || target.extension().is_none_or(|extension| extension != "md") {
            problems.push(problem(format!(
                "anchor into a file without headings: {}",
                link.target
            )));
        } else if !slugs
            .anchors(&target)
            .is_some_and(|anchors| anchors.contains(anchor))
        {
            problems.push(problem(format!(
                "link to a missing heading: {}",
                link.target
            )));
        }
    }
    problems
}

/// Returns every inline code span of `prose` with the line it starts on; a span may run over a
/// line break, which counts as a space.
pub fn code_spans(prose: &str) -> Vec<(String, usize)> {
    let mut spans = Vec::new();
    let mut line = 1;
    let mut rest = prose;
    while let Some(open) = rest.find('`') {
        line += rest[..open].matches('\n').count();
        let ticks = rest[open..].len() - rest[open..].trim_start_matches('`').len();
        let body = &rest[open + ticks..];
        let fence = "`".repeat(ticks);
        // A backtick without its pair (or one a blank line away) opens no span.
        let Some(close) = body
            .find(&fence)
            .filter(|&close| !body[..close].contains("\n\n"))
        else {
            rest = body;
            continue;
        };
        let span = &body[..close];
        spans.push((span.replace('\n', " ").trim().to_owned(), line));
        line += span.matches('\n').count();
        rest = &body[close + ticks..];
    }
    spans
}

/// Tells whether a code span names a path of this repository that must exist: no spaces, one of
/// [`REPO_PREFIXES`], and no glob or placeholder.
pub fn is_repo_path(span: &str) -> bool {
    !span.contains(char::is_whitespace)
        && REPO_PREFIXES.iter().any(|prefix| span.starts_with(prefix))
        && !span.contains(['*', '<', '>', '{', '}', '…', '?', '$'])
        && !span.contains("...")
}

/// Checks that every repository path `file` names in backticks exists.
fn check_paths(root: &Path, file: &Path, prose: &str) -> Vec<Problem> {
    code_spans(prose)
        .into_iter()
        .filter(|(span, _)| is_repo_path(span))
        .filter(|(span, _)| !root.join(span.trim_end_matches(['.', ',', ':'])).exists())
        .map(|(span, line)| {
            Problem::at(
                root,
                file,
                line,
                format!("names a path that does not exist: {span}"),
            )
        })
        .collect()
}

/// Holds the `observer` command line: its subcommands and every long flag of any of them.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Cli {
    pub subcommands: BTreeSet<String>,
    pub flags: BTreeSet<String>,
}

/// Reads the subcommands from `observer --help` and the flags from each `observer SUB --help`.
fn cli_from_help(binary: &Path) -> Result<Cli> {
    let help = |args: &[&str]| -> Result<String> {
        let output = Command::new(binary)
            .args(args)
            .output()
            .with_context(|| format!("could not run {}", binary.display()))?;
        if !output.status.success() {
            bail!("`{} {}` failed", binary.display(), args.join(" "));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    };
    let subcommands = subcommands_in_help(&help(&["--help"])?);
    let mut flags = BTreeSet::new();
    for subcommand in &subcommands {
        flags.extend(flags_in_help(&help(&[subcommand, "--help"])?));
    }
    Ok(Cli { subcommands, flags })
}

/// Returns the subcommands listed under `Commands:` in clap's help, without `help`.
pub fn subcommands_in_help(help: &str) -> BTreeSet<String> {
    help.lines()
        .skip_while(|line| line.trim() != "Commands:")
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// Returns the long flags clap's help lists (lines opening with `-`), without `--help` and
/// `--version`.
pub fn flags_in_help(help: &str) -> BTreeSet<String> {
    help.lines()
        .map(str::trim_start)
        .filter(|line| line.starts_with('-'))
        .filter_map(|line| {
            let token = line
                .split([' ', ','])
                .find(|token| token.starts_with("--"))?;
            let name = token[2..]
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .next()?;
            Some(format!("--{name}"))
        })
        .filter(|flag| flag.len() > 2 && !IMPLICIT_FLAGS.contains(&flag.as_str()))
        .collect()
}

/// Reads the subcommands from the `Command` enum of observer/src/main.rs and the long flags
/// from every `#[arg(long…)]` under `src`, leaving out hidden ones.
fn cli_from_source(src: &Path) -> Result<Cli> {
    let main = fs::read_to_string(src.join("main.rs")).context("reading observer/src/main.rs")?;
    let mut files = Vec::new();
    collect_files(src, "rs", &mut files)?;
    let mut flags = BTreeSet::new();
    for file in files {
        let text =
            fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        flags.extend(flags_in_source(&text));
    }
    Ok(Cli {
        subcommands: subcommands_in_source(&main),
        flags,
    })
}

/// Returns the variants of `enum Command` in kebab case, as clap derives subcommand names.
pub fn subcommands_in_source(main: &str) -> BTreeSet<String> {
    let mut subcommands = BTreeSet::new();
    let mut hidden = false;
    let body = main
        .lines()
        .skip_while(|line| !line.trim_start().starts_with("enum Command"))
        .skip(1)
        .take_while(|line| line.trim() != "}");
    for line in body.map(str::trim) {
        if line.starts_with("#[command(") && line.contains("hide = true") {
            hidden = true;
        } else if line.starts_with(|c: char| c.is_ascii_uppercase()) {
            let name: String = line
                .chars()
                .take_while(char::is_ascii_alphanumeric)
                .collect();
            if !std::mem::take(&mut hidden) {
                subcommands.insert(kebab_case(&name));
            }
        }
    }
    subcommands
}

/// Returns the long flags of the `#[arg(…)]` attributes in one source file: `long = "name"`, or
/// a plain `long` named after the field that follows. Hidden arguments are left out.
pub fn flags_in_source(source: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    let mut lines = source.lines().map(str::trim);
    while let Some(line) = lines.next() {
        if !line.starts_with("#[arg(") {
            continue;
        }
        let mut attribute = line.to_owned();
        while !attribute.ends_with(")]") {
            match lines.next() {
                Some(more) => attribute.push_str(more),
                None => break,
            }
        }
        if attribute.contains("hide = true") || !has_long(&attribute) {
            continue;
        }
        if let Some(name) = explicit_long(&attribute) {
            flags.insert(format!("--{name}"));
        } else if let Some(field) =
            lines.find(|line| !line.starts_with("#[") && !line.starts_with("//"))
        {
            let field = field
                .trim_start_matches("pub ")
                .split(':')
                .next()
                .unwrap_or_default();
            flags.insert(format!("--{}", field.trim().replace('_', "-")));
        }
    }
    flags
}

/// Tells whether an `#[arg(…)]` attribute asks for a long flag.
fn has_long(attribute: &str) -> bool {
    let inner = attribute
        .trim_start_matches("#[arg(")
        .trim_end_matches(")]");
    inner
        .split(',')
        .map(str::trim)
        .any(|part| part == "long" || part.starts_with("long ") || part.starts_with("long="))
}

/// Returns the name in `long = "name"`, if the attribute spells it out.
fn explicit_long(attribute: &str) -> Option<&str> {
    let after = &attribute[attribute.find("long = \"")? + "long = \"".len()..];
    after.split('"').next()
}

/// Converts a variant's name to clap's kebab case: `PushLoop` → `push-loop`.
fn kebab_case(name: &str) -> String {
    let mut out = String::new();
    for (index, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && index > 0 {
            out.push('-');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// Checks that README.md or docs/ mention every subcommand (`observer SUB`) and every flag.
fn check_cli(root: &Path, files: &[PathBuf], cli: &Cli) -> Result<Vec<Problem>> {
    let readme = root.join("README.md");
    let docs = root.join("docs");
    let mut text = String::new();
    for file in files
        .iter()
        .filter(|file| **file == readme || file.starts_with(&docs))
    {
        text.push_str(
            &fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?,
        );
        text.push('\n');
    }
    let missing = |message: String| Problem {
        place: "README.md, docs/".to_owned(),
        message,
    };
    let mut problems = Vec::new();
    for subcommand in &cli.subcommands {
        if !mentions(&text, &format!("observer {subcommand}")) {
            problems.push(missing(format!("no page mentions `observer {subcommand}`")));
        }
    }
    for flag in &cli.flags {
        if !mentions(&text, flag) {
            problems.push(missing(format!("no page mentions the flag `{flag}`")));
        }
    }
    Ok(problems)
}

/// Tells whether `needle` occurs in `text` not followed by another letter, digit, `-` or `_`
/// (so that `--grpc-budget` is not found inside `--grpc-budget-refill`).
pub fn mentions(text: &str, needle: &str) -> bool {
    text.match_indices(needle).any(|(at, _)| {
        !text[at + needle.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    })
}

#[cfg(test)]
mod tests;
