//! The guide's commands, run (issue 38), as tests/deploy.rs checks the
//! deploy files: every ```sh block of docs/guide/*.md runs unless it says
//! why not, so a command the guide shows that fails (a typo, a changed
//! option, a wrong path) fails this test.
//!
//! How a page runs:
//! - In a temporary directory of its own, the working directory of every
//!   command, and with `XDG_RUNTIME_DIR` a directory in it (so `gvfsctl`
//!   without `--control` finds the page's proxy, and only it). `PATH`
//!   starts with the directory of the binaries `cargo build --workspace
//!   --bins` made (`gvfs-proxy`, `gvfsctl`, `gvfs-wanlink`: found as
//!   `gvfs_testbed::proxy::proxy_binary` finds them), so the guide calls
//!   them by name, as a user who installed them does.
//! - Its blocks run in order, each as `bash -euo pipefail -c BLOCK` (any
//!   command that fails fails the page), within [`BLOCK_TIMEOUT`]; files
//!   one block makes are there for the next, as in one terminal.
//! - What the line just before a block's opening fence may say (blank lines
//!   between are not allowed; indented blocks in lists count the same):
//!   - `<!-- not run: REASON -->`: the block is skipped. REASON says what
//!     it needs that a test cannot have: root, a kernel NFS mount, a remote
//!     host, systemd, a golden VM and QEMU, or a build of its own.
//!   - `<!-- background -->`: the block is one command that serves in the
//!     foreground (a proxy). The test starts it, waits until it prints
//!     that it is ready (its `Stop with Ctrl-C` line, within
//!     [`READY_TIMEOUT`]; a proxy that exits first fails the page), and
//!     stops it with SIGTERM at the end of the page, last started first
//!     (each must exit within [`STOP_TIMEOUT`]; one that exited on its
//!     own before, e.g. replaced by `--take-over`, is left be). So a page
//!     shows a proxy as a user starts it and the commands after it run
//!     against that very command.
//!   - Any other HTML comment there is an error, so a misspelt marker
//!     cannot skip or background a block unseen.
//! - Ports: pages run at once (a test each), so no two pages' proxies may
//!   listen on the same address (first-proxy.md: 2049 and 3049; site.md:
//!   20049 and 3149; operations.md: 4049 and 9100).
//!
//! Besides: every option `gvfs-proxy --help` lists is in options.md, every
//! `gvfsctl` command (and subcommand) in `gvfsctl --help` appears in the
//! guide as `gvfsctl NAME`, every page is tested here, relative links (and
//! their #anchors) of the guide and the README lead somewhere, and the
//! README stays short with its two set-up commands.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use gvfs_testbed::process;
use gvfs_testbed::proxy::{gvfsctl_binary, proxy_binary};

/// Longest a block may run.
const BLOCK_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest a background command may take to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest a background command may take to stop on SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// What a proxy prints last when it is ready.
const READY_LINE: &str = "Stop with Ctrl-C";

/// The pages of the guide; a page not listed fails `every_page_is_tested`.
const PAGES: &[&str] = &[
    "index.md",
    "install.md",
    "first-proxy.md",
    "site.md",
    "vm-clones.md",
    "operations.md",
    "options.md",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn guide_dir() -> PathBuf {
    root().join("docs/guide")
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// What to do with a block.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Mode {
    Run,
    Background,
    NotRun(String),
}

/// A ```sh block of a page: its first line's number (from 1), what to do
/// with it, and its text.
#[derive(Debug, Clone)]
struct Block {
    line: usize,
    mode: Mode,
    text: String,
}

/// The ```sh blocks of a Markdown text, with what the line before each
/// says to do with it.
fn blocks(markdown: &str) -> Result<Vec<Block>> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let fence = lines[i].trim();
        if !fence.starts_with("```") {
            i += 1;
            continue;
        }
        let lang = fence.trim_start_matches('`').trim();
        let start = i;
        i += 1;
        let mut body = Vec::new();
        while i < lines.len() && lines[i].trim() != "```" {
            body.push(lines[i]);
            i += 1;
        }
        ensure!(
            i < lines.len(),
            "line {}: a block that never ends",
            start + 1
        );
        i += 1;
        if lang != "sh" {
            continue;
        }
        let before = start.checked_sub(1).map(|n| lines[n].trim()).unwrap_or("");
        let mode = if let Some(comment) = before.strip_prefix("<!--") {
            let comment = comment
                .strip_suffix("-->")
                .with_context(|| format!("line {start}: a comment not closed on its line"))?
                .trim();
            if comment == "background" {
                Mode::Background
            } else if let Some(reason) = comment.strip_prefix("not run:") {
                ensure!(
                    !reason.trim().is_empty(),
                    "line {start}: `not run:` without a reason"
                );
                Mode::NotRun(reason.trim().to_owned())
            } else {
                bail!(
                    "line {start}: {before:?} before a sh block: only `<!-- not run: REASON -->` \
                     and `<!-- background -->` go there"
                );
            }
        } else {
            Mode::Run
        };
        // Blocks indented in a list: the fence's indent off every line.
        let indent = lines[start].len() - lines[start].trim_start().len();
        let text = body
            .iter()
            .map(|l| match (l.get(..indent), l.get(indent..)) {
                (Some(pad), Some(rest)) if pad.trim().is_empty() => rest,
                _ => l.trim_start(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        out.push(Block {
            line: start + 1,
            mode,
            text,
        });
    }
    Ok(out)
}

/// The directory of the binaries `cargo build --workspace --bins` made.
fn bin_dir() -> Result<PathBuf> {
    gvfsctl_binary()?;
    Ok(proxy_binary()?
        .parent()
        .context("gvfs-proxy has no directory")?
        .to_path_buf())
}

/// A page being run: its directory and the commands started in the
/// background, stopped when it is dropped.
struct Run {
    dir: tempfile::TempDir,
    path: String,
    background: Vec<(usize, Child)>,
}

impl Run {
    fn new() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let run = dir.path().join("run");
        std::fs::create_dir(&run)?;
        std::fs::set_permissions(&run, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        let path = format!(
            "{}:{}",
            bin_dir()?.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Ok(Run {
            dir,
            path,
            background: Vec::new(),
        })
    }

    fn bash(&self, script: &str) -> Command {
        let mut cmd = Command::new("bash");
        cmd.args(["-euo", "pipefail", "-c", script])
            .current_dir(self.dir.path())
            .env("PATH", &self.path)
            .env("XDG_RUNTIME_DIR", self.dir.path().join("run"))
            .stdin(Stdio::null());
        cmd
    }

    fn run(&mut self, block: &Block) -> Result<()> {
        match &block.mode {
            Mode::NotRun(reason) => {
                println!("line {}: not run: {reason}", block.line);
                Ok(())
            }
            Mode::Run => {
                let out = process::run(&mut self.bash(&block.text), BLOCK_TIMEOUT)?;
                ensure!(
                    out.status.success(),
                    "the block at line {} failed ({}):\n{}\n--- stdout:\n{}--- stderr:\n{}",
                    block.line,
                    out.status,
                    block.text,
                    out.stdout_text(),
                    out.stderr_text()
                );
                Ok(())
            }
            Mode::Background => self.start(block),
        }
    }

    /// Starts a background block and waits until it is ready.
    fn start(&mut self, block: &Block) -> Result<()> {
        let log = self
            .dir
            .path()
            .join(format!("background-{}.log", block.line));
        let mut child = self
            .bash(&format!("exec {}", block.text.trim()))
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut printed = Vec::new();
        let ready = loop {
            match rx.recv_timeout(READY_TIMEOUT) {
                Ok(line) => {
                    let done = line.starts_with(READY_LINE);
                    printed.push(line);
                    if done {
                        break true;
                    }
                }
                Err(_) => break false,
            }
        };
        if !ready {
            let _ = process::terminate(&mut child, STOP_TIMEOUT);
            bail!(
                "the background block at line {} did not get ready:\n{}\n--- stdout:\n{}\n--- stderr:\n{}",
                block.line,
                block.text,
                printed.join("\n"),
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        // Keep its output flowing: a full pipe would block it.
        std::thread::spawn(move || for _ in rx {});
        self.background.push((block.line, child));
        Ok(())
    }

    /// Stops the background commands, last started first.
    fn stop(&mut self) -> Result<()> {
        let mut failures = Vec::new();
        while let Some((line, mut child)) = self.background.pop() {
            match process::terminate(&mut child, STOP_TIMEOUT) {
                Ok((_, false)) => {}
                Ok((_, true)) => failures.push(format!(
                    "the background block at line {line} did not stop on SIGTERM"
                )),
                Err(e) => failures.push(format!("stopping the block at line {line}: {e}")),
            }
        }
        ensure!(failures.is_empty(), "{}", failures.join("; "));
        Ok(())
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Runs the blocks of `markdown` in order; returns how many ran.
fn run_markdown(markdown: &str) -> Result<usize> {
    let blocks = blocks(markdown)?;
    let mut run = Run::new()?;
    let mut ran = 0;
    for block in &blocks {
        run.run(block)?;
        ran += usize::from(!matches!(block.mode, Mode::NotRun(_)));
    }
    run.stop()?;
    Ok(ran)
}

fn run_page(name: &str) -> Result<()> {
    let text = read(&guide_dir().join(name))?;
    run_markdown(&text).with_context(|| format!("docs/guide/{name}"))?;
    Ok(())
}

#[test]
fn index_md() -> Result<()> {
    run_page("index.md")
}

#[test]
fn install_md() -> Result<()> {
    run_page("install.md")
}

#[test]
fn first_proxy_md() -> Result<()> {
    run_page("first-proxy.md")
}

#[test]
fn site_md() -> Result<()> {
    run_page("site.md")
}

#[test]
fn vm_clones_md() -> Result<()> {
    run_page("vm-clones.md")
}

#[test]
fn operations_md() -> Result<()> {
    run_page("operations.md")
}

#[test]
fn options_md() -> Result<()> {
    run_page("options.md")
}

#[test]
fn every_page_is_tested() -> Result<()> {
    let mut found: Vec<String> = std::fs::read_dir(guide_dir())?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_>>()?;
    found.retain(|n| n.ends_with(".md"));
    found.sort();
    let mut listed: Vec<String> = PAGES.iter().map(|s| s.to_string()).collect();
    listed.sort();
    ensure!(
        found == listed,
        "docs/guide/ has {found:?}, tests/guide.rs runs {listed:?}"
    );
    Ok(())
}

/// The runner itself: a command that fails fails the page, a typo
/// included; `not run` skips; a misspelt marker is an error; a background
/// command that never gets ready fails.
#[test]
fn a_failing_command_fails_its_page() -> Result<()> {
    ensure!(run_markdown("```sh\ngvfsctl --version\ntrue\n```\n")? == 1);
    for bad in [
        "```sh\ngvfsctl stauts\n```\n",
        "```sh\ngvfs-proxy --listen 127.0.0.1:1 --upstream dir:nowhere --chek\n```\n",
        "```sh\nfalse | cat\n```\n",
        "<!-- not-run: typo -->\n```sh\ntrue\n```\n",
        "<!-- not run: -->\n```sh\ntrue\n```\n",
        "<!-- background -->\n```sh\nsleep 0.1\n```\n",
    ] {
        ensure!(run_markdown(bad).is_err(), "this page passed:\n{bad}");
    }
    ensure!(
        run_markdown("<!-- not run: it fails -->\n```sh\nfalse\n```\n```text\nfalse\n```\n")? == 0
    );
    Ok(())
}

fn help(bin: &Path, args: &[&str]) -> Result<String> {
    let out = process::run(Command::new(bin).args(args), Duration::from_secs(20))?;
    ensure!(
        out.status.success(),
        "{} {args:?}: {}",
        bin.display(),
        out.stderr_text()
    );
    Ok(out.stdout_text())
}

/// Whether `text` holds `word` not followed by more of a name (`--cache`
/// is not in `--cache-dir`; `gvfsctl ca` is not in `gvfsctl cat`).
fn mentions(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(at, _)| {
        !text[at + word.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    })
}

#[test]
fn every_gvfs_proxy_option_is_in_options_md() -> Result<()> {
    let help = help(&proxy_binary()?, &["--help"])?;
    let options = read(&guide_dir().join("options.md"))?;
    let mut flags = Vec::new();
    for line in help.lines().map(str::trim).filter(|l| l.starts_with('-')) {
        for word in line
            .split_whitespace()
            .take_while(|w| w.starts_with('-') || w.starts_with('<'))
        {
            let flag = word.trim_end_matches(',');
            if flag.starts_with("--") {
                flags.push(flag.split(['=', '<']).next().unwrap_or(flag).to_owned());
            }
        }
    }
    ensure!(
        flags.len() > 30,
        "too few options found in --help: {flags:?}"
    );
    let missing: Vec<&String> = flags.iter().filter(|f| !mentions(&options, f)).collect();
    ensure!(
        missing.is_empty(),
        "docs/guide/options.md does not mention {missing:?}"
    );
    Ok(())
}

/// The commands a `--help` lists under `Commands:`, `help` left out.
fn commands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_gvfsctl_command_is_in_the_guide() -> Result<()> {
    let bin = gvfsctl_binary()?;
    let mut guide = String::new();
    for page in PAGES {
        guide += &read(&guide_dir().join(page))?;
    }
    let top = commands(&help(&bin, &["--help"])?);
    ensure!(top.len() >= 8, "gvfsctl --help lists {top:?}");
    let mut missing = Vec::new();
    for cmd in &top {
        let sub = commands(&help(&bin, &[cmd.as_str(), "--help"])?);
        if sub.is_empty() && !mentions(&guide, &format!("gvfsctl {cmd}")) {
            missing.push(format!("gvfsctl {cmd}"));
        }
        for sub in sub {
            let full = format!("gvfsctl {cmd} {sub}");
            if !mentions(&guide, &full) {
                missing.push(full);
            }
        }
    }
    ensure!(missing.is_empty(), "the guide never shows {missing:?}");
    Ok(())
}

/// GitHub's anchor of a heading: lower case, spaces to `-`, other
/// punctuation but `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn relative_links_lead_somewhere() -> Result<()> {
    let mut files: Vec<PathBuf> = PAGES.iter().map(|p| guide_dir().join(p)).collect();
    files.push(root().join("README.md"));
    let mut broken = Vec::new();
    for file in &files {
        let text = read(file)?;
        for (at, _) in text.match_indices("](") {
            let rest = &text[at + 2..];
            let Some(end) = rest.find(')') else { continue };
            let target = &rest[..end];
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, frag) = target.split_once('#').unwrap_or((target, ""));
            let dest = if path.is_empty() {
                file.clone()
            } else {
                file.parent().context("no parent")?.join(path)
            };
            if !dest.exists() {
                broken.push(format!("{}: {target}", file.display()));
                continue;
            }
            if !frag.is_empty() {
                let headings = read(&dest)?;
                let found = headings
                    .lines()
                    .filter_map(|l| l.strip_prefix('#'))
                    .any(|h| anchor(h.trim_start_matches('#')) == frag);
                if !found {
                    broken.push(format!("{}: {target} (no such heading)", file.display()));
                }
            }
        }
    }
    ensure!(broken.is_empty(), "broken links: {broken:#?}");
    Ok(())
}

#[test]
fn the_readme_is_short_with_its_two_set_up_commands() -> Result<()> {
    let readme = read(&root().join("README.md"))?;
    let lines = readme.lines().count();
    ensure!(lines <= 300, "README.md has {lines} lines (at most 300)");
    // tests/control.rs runs the first; .ci/run runs the second.
    let sh: Vec<String> = blocks(&readme)?.into_iter().map(|b| b.text).collect();
    ensure!(
        sh.first().map(String::as_str) == Some("cargo run --release -p gvfs-proxy")
            && sh.get(1).map(String::as_str) == Some("scripts/test.sh"),
        "README.md's first two sh blocks: {sh:?}"
    );
    ensure!(read(&root().join(".ci/run"))?.contains("exec scripts/test.sh"));
    for link in [
        "docs/guide/index.md",
        "docs/ARCHITECTURE.md",
        "docs/BENCHMARKS.md",
        "docs/clone.md",
    ] {
        ensure!(
            readme.contains(&format!("]({link}")),
            "README.md does not link {link}"
        );
    }
    Ok(())
}
