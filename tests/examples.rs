//! `cargo run --example site`: its short mode (`--once`), and the site
//! left running, checked from outside with libnfs' `nfs-cat` through the
//! mount lines it prints, `gvfsctl stats` and each proxy's metrics
//! endpoint (against the metrics examples/deploy/prometheus.yml lists),
//! then stopped with SIGINT as Ctrl-C does.
//!
//! The example is the binary `cargo test` builds beside the tests
//! (`target/<profile>/examples/site`; a `cargo test --test examples` of
//! its own builds no example: run `cargo build --examples` first), and it
//! runs the `gvfs-proxy` and `gvfsctl` built by `cargo build --workspace
//! --bins`, as every integration test does. `cargo test` also builds the
//! clone example (`examples/clone.rs`), which needs QEMU to run.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use gvfs_testbed::Stats;
use gvfs_testbed::data::compare_bytes;
use gvfs_testbed::libnfs::nfs_cat;
use gvfs_testbed::process;
use gvfs_testbed::proxy::{gvfsctl, proxy_binary};

/// Longest the site may take to come up and do its reads.
const SITE_TIMEOUT: Duration = Duration::from_secs(120);
/// The line the site prints once it waits for Ctrl-C.
const WAITING: &str = "The site runs until Ctrl-C";

/// The example `name`, as `cargo test` (or `cargo build --examples`)
/// built it.
fn example(name: &str) -> Result<Command> {
    let bin = proxy_binary()?
        .parent()
        .context("gvfs-proxy has a directory")?
        .join("examples")
        .join(name);
    ensure!(
        bin.is_file(),
        "{} does not exist: run `cargo build --examples` (cargo test builds them unless a \
         test target is named)",
        bin.display()
    );
    let mut cmd = Command::new(bin);
    // The binaries are built already: no cargo inside the test.
    cmd.env("GVFS_EXAMPLE_BUILD", "0");
    Ok(cmd)
}

/// What the site printed that a user would act on.
#[derive(Debug, Default)]
struct Printed {
    origin: PathBuf,
    /// libnfs URLs of the golden image, one per node.
    urls: Vec<String>,
    /// Control socket and metrics address, by proxy name.
    proxies: BTreeMap<String, (PathBuf, String)>,
}

fn parse(output: &str) -> Result<Printed> {
    let mut p = Printed::default();
    for line in output.lines() {
        if let Some(rest) = line.strip_prefix("origin ") {
            let dir = rest.split(':').next().context("origin line")?;
            p.origin = PathBuf::from(dir);
        }
        if let Some((_, rest)) = line.split_once("libnfs: nfs-cat '") {
            p.urls.push(rest.trim_end_matches('\'').to_owned());
        }
        if let Some(rest) = line.strip_prefix("$ gvfsctl --control ") {
            let (control, comment) = rest.split_once(" stats").context("stats line")?;
            let comment = comment.trim_start().trim_start_matches("# ");
            let (name, metrics) = comment
                .split_once(", metrics at http://")
                .context("metrics in the stats line")?;
            let metrics = metrics.trim_end_matches("/metrics").to_owned();
            p.proxies
                .insert(name.to_owned(), (PathBuf::from(control), metrics));
        }
    }
    ensure!(
        p.origin.is_absolute() && p.urls.len() == 2 && p.proxies.len() == 4,
        "the site did not print an origin, two nodes' URLs and four proxies: {p:?}\n{output}"
    );
    Ok(p)
}

#[test]
fn the_site_example_runs_once_and_stops() -> Result<()> {
    let out = process::run(example("site")?.arg("--once"), SITE_TIMEOUT)?;
    let text = out.stdout_text();
    ensure!(
        out.status.success(),
        "site --once: {}\n{text}\n{}",
        out.status,
        out.stderr_text()
    );
    let printed = parse(&text)?;
    for node in ["node1", "node2"] {
        let read = format!("read images/golden.img through {node} with ");
        ensure!(
            text.lines()
                .any(|l| l.starts_with(&read) && l.ends_with("the same as the origin's")),
            "no checked read through {node}:\n{text}"
        );
    }
    for name in ["node2", "node1", "lan-proxy", "image-server"] {
        ensure!(
            text.contains(&format!("{name}: stopped (exit status: 0)")),
            "{name} did not stop cleanly:\n{text}"
        );
    }
    ensure!(
        text.contains("block cache") && text.contains("file cache (compress-and-copy)"),
        "no gvfsctl stats in:\n{text}"
    );
    ensure!(
        !printed.origin.exists(),
        "{} is left after the site stopped",
        printed.origin.display()
    );
    Ok(())
}

#[test]
fn the_running_site_serves_what_it_prints_and_stops_on_sigint() -> Result<()> {
    let mut child = example("site")?
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawning the site example")?;
    let (lines, output) = collect(&mut child);
    let result = check_running_site(&lines, &output);
    // SIGINT, as Ctrl-C sends it, whatever the checks found.
    process::signal(&child, libc::SIGINT)?;
    let status = process::wait_timeout(&mut child, SITE_TIMEOUT)?;
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let text = output();
    let printed = result.with_context(|| format!("the site printed:\n{text}"))?;
    ensure!(
        status.is_some_and(|s| s.success()),
        "the site did not exit 0 on SIGINT ({status:?}):\n{text}"
    );
    for name in ["node2", "node1", "lan-proxy", "image-server"] {
        ensure!(
            text.contains(&format!("{name}: stopped (exit status: 0)")),
            "{name} did not stop cleanly:\n{text}"
        );
    }
    ensure!(
        !printed.origin.exists(),
        "{} is left after the site stopped",
        printed.origin.display()
    );
    Ok(())
}

/// Lines of the child's stdout as they come, and all it printed (stderr
/// too) so far.
fn collect(child: &mut Child) -> (mpsc::Receiver<String>, impl Fn() -> String + use<>) {
    let all = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let (tx, rx) = mpsc::channel();
    if let Some(out) = child.stdout.take() {
        let all = all.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(mut a) = all.lock() {
                    a.push_str(&line);
                    a.push('\n');
                }
                let _ = tx.send(line);
            }
        });
    }
    if let Some(mut err) = child.stderr.take() {
        let all = all.clone();
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = err.read_to_string(&mut text);
            if let Ok(mut a) = all.lock() {
                a.push_str("[stderr]\n");
                a.push_str(&text);
            }
        });
    }
    (rx, move || {
        all.lock().map(|a| a.clone()).unwrap_or_default()
    })
}

/// Waits for the site to say it runs, then checks it from outside.
fn check_running_site(
    lines: &mpsc::Receiver<String>,
    output: &impl Fn() -> String,
) -> Result<Printed> {
    let deadline = Instant::now() + SITE_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.starts_with(WAITING) => break,
            Ok(_) => {}
            Err(_) => bail!("the site did not say it runs within {SITE_TIMEOUT:?}"),
        }
    }
    let printed = parse(&output())?;
    // libnfs through the URLs it printed: the origin's bytes.
    let golden = std::fs::read(printed.origin.join("images/golden.img"))?;
    for url in &printed.urls {
        compare_bytes(&golden, &nfs_cat(url)?).with_context(|| format!("nfs-cat {url}"))?;
    }
    // The LAN proxy fetched the image once for both nodes, and the second
    // node's fetch was answered from its file cache.
    let stats = |name: &str| -> Result<Stats> {
        let (control, _) = &printed.proxies[name];
        let out = gvfsctl(control, &["stats", "--json"])?;
        ensure!(out.status.success(), "gvfsctl stats: {}", out.stderr_text());
        Stats::from_json(serde_json::from_str(&out.stdout_text())?)
    };
    let lan = stats("lan-proxy")?;
    ensure!(
        lan.file_cache.counts.files_fetched == 1 && lan.ext.from_file_cache >= 1,
        "the LAN proxy did not fetch the image once and serve it from its file cache: {lan}"
    );
    ensure!(
        stats("image-server")?.ext.fetch_calls >= 1,
        "nothing was fetched from the image server"
    );
    check_metrics(&printed)?;
    Ok(printed)
}

/// Every metric examples/deploy/prometheus.yml lists for a role is on the
/// metrics endpoint of the site's proxy in that role.
fn check_metrics(printed: &Printed) -> Result<()> {
    let listed = listed_metrics(&deploy_dir().join("prometheus.yml"))?;
    for (job, proxies) in [
        ("gvfs-image-server", &["image-server"][..]),
        ("gvfs-lan-proxy", &["lan-proxy"][..]),
        ("gvfs-node", &["node1", "node2"][..]),
    ] {
        let names = listed
            .get(job)
            .with_context(|| format!("prometheus.yml has no job {job}"))?;
        ensure!(names.len() >= 10, "{job} lists {} metrics", names.len());
        for proxy in proxies {
            let text = scrape(&printed.proxies[*proxy].1)?;
            let served: Vec<&str> = text
                .lines()
                .filter(|l| !l.starts_with('#'))
                .filter_map(|l| l.split_whitespace().next())
                .collect();
            for name in names {
                ensure!(
                    served.contains(&name.as_str()),
                    "{proxy} ({job}) serves no {name}:\n{text}"
                );
            }
        }
    }
    Ok(())
}

/// The metric names prometheus.yml lists in its comments (`#   gvfs_...`),
/// by the job they precede.
fn listed_metrics(path: &Path) -> Result<BTreeMap<String, Vec<String>>> {
    let text = std::fs::read_to_string(path)?;
    let mut jobs = BTreeMap::new();
    let mut names = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(job) = line.strip_prefix("- job_name: ") {
            jobs.insert(job.trim().to_owned(), std::mem::take(&mut names));
        } else if let Some(name) = line
            .strip_prefix('#')
            .map(str::trim_start)
            .filter(|c| c.starts_with("gvfs_"))
            .and_then(|c| c.split_whitespace().next())
            .filter(|n| n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        {
            names.push(name.to_owned());
        }
    }
    Ok(jobs)
}

/// `GET /metrics` of the endpoint at `addr`.
fn scrape(addr: &str) -> Result<String> {
    let mut s = std::net::TcpStream::connect(addr).with_context(|| format!("metrics at {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    ensure!(
        text.starts_with("HTTP/1.1 200"),
        "metrics at {addr}: {text}"
    );
    Ok(text)
}

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/deploy")
}
