//! Sequential throughput of a large file copied by two real clients, libnfs'
//! `nfs-cp` (one 1 MiB call in flight) and `qemu-img convert -W -m 8` (QEMU's
//! block layer with several requests in flight): directly to and from
//! nfs-ganesha, through one gvfs-proxy in front of it, and through a chain of
//! three; plus, for context, one proxy over the embedded `dir:` origin. The
//! client-facing proxies listen on 127.0.0.12, .13 and .14 port 111, since
//! QEMU asks the portmapper at HOST:111 (so the bench runs as root).
//!
//! Each measurement is one `nfs-cp` run (wall time of the process, mount
//! handshake included) that writes the source file to the export under a
//! fresh name (nfs-cp refuses to overwrite), checks the bytes that landed in
//! the export directory, then reads that file back to a fresh local file
//! and checks it. The configurations are interleaved (and their order
//! rotated) within each repetition, so slow drift of the machine (page
//! cache, writeback, other load) spreads over all of them.
//!
//! Reads come right after the write of the same file, so the server's page
//! cache very likely still holds it: the read figures are warm-cache reads
//! for every configuration alike.
//!
//! Before measuring, each configuration does one untimed 256 MiB round
//! trip (a fresh server or proxy is slow on its first copy).
//!
//! Also recorded per measurement: CPU seconds used by the client (`nfs-cp`),
//! by the proxies together and by ganesha, from `getrusage` and
//! `/proc/PID/stat`, and the proxies' minor page faults, to show where the
//! time goes.
//!
//! Run: `cargo build --release --workspace --bins && cargo bench --bench
//! throughput`. Environment: `GVFS_BENCH_MIB` (file size, default 1024),
//! `GVFS_BENCH_REPS` (repetitions, default 3), `GVFS_BENCH_ONLY` (a
//! comma-separated list of parts of configuration names, e.g. `3 proxies`,
//! to run only those; the direct one always runs), `GVFS_BENCH_CLIENTS`
//! (`nfs-cp,qemu` by default). Without `--bench` (as under
//! `cargo test --benches`) it does a quick 8 MiB smoke run instead. The
//! proxy binary is looked up as in the test fixtures: next to the bench's
//! `deps/` directory, i.e. `target/release/gvfs-proxy` under `cargo bench`.

use std::fmt::Write as _;
use std::fs;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use gvfs_testbed::bench::{env_u64, loadavg};
use gvfs_testbed::data::{compare_files, write_random_file};
use gvfs_testbed::libnfs::CopyClient;
use gvfs_testbed::process;
use gvfs_testbed::{Ganesha, Proxy, ProxyArgs};

/// Seed of the source file's content (see `gvfs_testbed::data`).
const SEED: u64 = 0x6776_6673_6265_6e63;
/// File size and repetitions of a smoke run (no `--bench` argument).
const SMOKE_MIB: u64 = 8;
const SMOKE_REPS: usize = 1;
/// The name of the direct configuration, which the others are compared with.
const DIRECT: &str = "direct (ganesha)";
/// Size of the untimed warm-up copy (MiB, at most the file size).
const WARM_UP_MIB: u64 = 256;
/// The slowest copy rate tolerated before `nfs-cp` is killed (MiB/s).
const MIN_RATE_MIB_S: u64 = 2;

/// Which group a configuration belongs to: the ganesha ones are compared
/// with the direct copy, the `dir:` one is reported on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Ganesha,
    Dir,
}

/// One way of reaching an export.
struct Target {
    name: &'static str,
    origin: Origin,
    /// Builds the libnfs URL of a file in the export.
    url: Box<dyn Fn(&str) -> String>,
    /// Builds the QEMU URL (no ports: QEMU asks the portmapper at HOST:111).
    qemu_url: Box<dyn Fn(&str) -> String>,
    /// The local directory behind the export (where written files land).
    export_dir: PathBuf,
    /// Pids of the proxies in the path (CPU accounting).
    proxy_pids: Vec<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Write,
    Read,
}

impl Direction {
    fn label(self) -> &'static str {
        match self {
            Self::Write => "write",
            Self::Read => "read",
        }
    }
}

/// One timed copy.
#[derive(Debug, Clone, Copy)]
struct Sample {
    mib_s: f64,
    /// CPU seconds used during the copy by nfs-cp, the proxies, ganesha.
    cpu_client: f64,
    cpu_proxies: f64,
    cpu_ganesha: f64,
    /// Page faults (minor) taken by the proxies during the copy.
    proxy_faults: u64,
}

fn main() -> Result<()> {
    let bench_mode = std::env::args().any(|a| a == "--bench");
    let mib = env_u64("GVFS_BENCH_MIB", if bench_mode { 1024 } else { SMOKE_MIB })?;
    let reps = env_u64(
        "GVFS_BENCH_REPS",
        if bench_mode { 3 } else { SMOKE_REPS as u64 },
    )? as usize;
    if mib == 0 || reps == 0 {
        bail!("GVFS_BENCH_MIB and GVFS_BENCH_REPS must be at least 1");
    }
    let size = mib << 20;

    // Everything under one temporary directory in /tmp: the same disk as
    // ganesha's export (its fixture also makes its directory in /tmp).
    let work = tempfile::Builder::new()
        .prefix("gvfs-bench-")
        .tempdir()
        .context("creating the work directory")?;
    let src = work.path().join("source");
    eprintln!("writing a {mib} MiB source file to {}", src.display());
    write_random_file(&src, SEED, size)?;
    let dir_origin = work.path().join("dir-origin");
    fs::create_dir(&dir_origin)?;

    let ganesha = Ganesha::start().context("starting nfs-ganesha")?;
    let ganesha_pid = ganesha.pid().context("ganesha is not running")?;
    // Client-facing proxies listen on 127.0.0.N:111 so that QEMU, which
    // always asks the portmapper at HOST:111, finds them.
    let spawn = |upstream: String, on_111: Option<u8>| -> Result<Proxy> {
        // Info-level logging is off the hot path either way; warn keeps the
        // captured output small.
        let mut args = ProxyArgs::new(upstream).env("RUST_LOG", "warn");
        if let Some(n) = on_111 {
            args = args.listen(SocketAddr::from(([127, 0, 0, n], 111)));
        }
        Proxy::spawn(args)
    };
    let one = spawn(ganesha.upstream_url(), Some(12))?;
    let chain1 = spawn(ganesha.upstream_url(), None)?;
    let chain2 = spawn(chain1.upstream_url(), None)?;
    let chain3 = spawn(chain2.upstream_url(), Some(13))?;
    let over_dir = spawn(format!("dir:{}", dir_origin.display()), Some(14))?;

    let proxy_url = |p: &Proxy| {
        let (ip, port, export) = (p.ip(), p.port(), p.export().to_owned());
        move |f: &str| gvfs_testbed::libnfs::nfs_url(ip, port, port, &export, f)
    };
    let qemu_url = |ip: std::net::IpAddr, export: String| {
        Box::new(move |f: &str| format!("nfs://{ip}{export}/{f}")) as Box<dyn Fn(&str) -> String>
    };
    let ganesha_url = {
        let (ip, nfs, mnt) = (ganesha.ip(), ganesha.nfs_port(), ganesha.mount_port());
        move |f: &str| gvfs_testbed::libnfs::nfs_url(ip, nfs, mnt, gvfs_testbed::ganesha::EXPORT, f)
    };
    let pid = |p: &Proxy| p.pid().context("proxy is not running");
    let all = vec![
        Target {
            name: DIRECT,
            origin: Origin::Ganesha,
            url: Box::new(ganesha_url),
            qemu_url: qemu_url(ganesha.ip(), gvfs_testbed::ganesha::EXPORT.to_owned()),
            export_dir: ganesha.export_dir().to_owned(),
            proxy_pids: vec![],
        },
        Target {
            name: "1 proxy -> ganesha",
            origin: Origin::Ganesha,
            url: Box::new(proxy_url(&one)),
            qemu_url: qemu_url(one.ip(), one.export().to_owned()),
            export_dir: ganesha.export_dir().to_owned(),
            proxy_pids: vec![pid(&one)?],
        },
        Target {
            name: "3 proxies -> ganesha",
            origin: Origin::Ganesha,
            url: Box::new(proxy_url(&chain3)),
            qemu_url: qemu_url(chain3.ip(), chain3.export().to_owned()),
            export_dir: ganesha.export_dir().to_owned(),
            proxy_pids: vec![pid(&chain1)?, pid(&chain2)?, pid(&chain3)?],
        },
        Target {
            name: "1 proxy -> dir:",
            origin: Origin::Dir,
            url: Box::new(proxy_url(&over_dir)),
            qemu_url: qemu_url(over_dir.ip(), over_dir.export().to_owned()),
            export_dir: dir_origin.clone(),
            proxy_pids: vec![pid(&over_dir)?],
        },
    ];
    // GVFS_BENCH_ONLY: comma-separated parts of configuration names to run
    // (for profiling one path); the direct one always runs, for the ratios.
    let only = std::env::var("GVFS_BENCH_ONLY").unwrap_or_default();
    let wanted = |name: &str| {
        only.is_empty() || name == DIRECT || only.split(',').any(|w| name.contains(w.trim()))
    };
    let targets: Vec<Target> = all.into_iter().filter(|t| wanted(t.name)).collect();

    let timeout = Duration::from_secs(120.max(mib / MIN_RATE_MIB_S));

    // One untimed round trip per configuration first: a fresh ganesha or
    // proxy is markedly slower on its first hundreds of MiB (its buffers
    // are faulted in), which would otherwise bias whichever runs first.
    let warm = work.path().join("warm-up");
    write_random_file(&warm, SEED ^ 1, WARM_UP_MIB.min(mib) << 20)?;
    for (i, t) in targets.iter().enumerate() {
        let name = format!("warm-up-{i}");
        let back = work.path().join(&name);
        let remote = (t.url)(&name);
        nfs_cp(&warm, &remote, timeout)
            .and_then(|()| nfs_cp(&remote, &back, timeout))
            .and_then(|()| compare_files(&warm, &back))
            .with_context(|| format!("{}: warm-up copy", t.name))?;
        fs::remove_file(&back)?;
        fs::remove_file(t.export_dir.join(&name))?;
    }
    fs::remove_file(&warm)?;

    let clients: Vec<CopyClient> = std::env::var("GVFS_BENCH_CLIENTS")
        .unwrap_or_else(|_| "nfs-cp,qemu".into())
        .split(',')
        .map(|c| CopyClient::parse(c).context("GVFS_BENCH_CLIENTS"))
        .collect::<Result<_>>()?;
    let mut samples: Vec<Vec<[Vec<Sample>; 2]>> = clients
        .iter()
        .map(|_| targets.iter().map(|_| [vec![], vec![]]).collect())
        .collect();
    let started = Instant::now();
    let load_before = loadavg();
    let src_s = src.display().to_string();
    for rep in 0..reps {
        for (c, client) in clients.iter().enumerate() {
            for k in 0..targets.len() {
                // Rotate the order each repetition, so no configuration
                // always runs first (right after the previous one's deletes).
                let i = (k + rep) % targets.len();
                let t = &targets[i];
                let name = format!("bench-{rep}-{c}-{i}");
                let remote = match client {
                    CopyClient::NfsCp => (t.url)(&name),
                    CopyClient::Qemu => (t.qemu_url)(&name),
                };
                let local = work.path().join(format!("readback-{rep}-{c}-{i}"));
                let local_s = local.display().to_string();
                let landed = t.export_dir.join(&name);
                let what = format!("{} with {}", t.name, client.label());

                let w = measure(size, &t.proxy_pids, ganesha_pid, || {
                    client.copy(&src_s, &remote, timeout)
                })
                .with_context(|| format!("{what}: writing"))?;
                compare_files(&src, &landed)
                    .with_context(|| format!("{what}: the written file differs"))?;
                report(rep, &what, Direction::Write, mib, &w);

                let r = measure(size, &t.proxy_pids, ganesha_pid, || {
                    client.copy(&remote, &local_s, timeout)
                })
                .with_context(|| format!("{what}: reading"))?;
                compare_files(&src, &local)
                    .with_context(|| format!("{what}: the file read back differs"))?;
                report(rep, &what, Direction::Read, mib, &r);

                fs::remove_file(&local)?;
                fs::remove_file(&landed)?;
                samples[c][i][0].push(w);
                samples[c][i][1].push(r);
            }
        }
    }
    eprintln!(
        "all copies verified; {:.0} s in all; load average {load_before} before, {} after",
        started.elapsed().as_secs_f64(),
        loadavg()
    );
    for p in [&one, &chain1, &chain2, &chain3, &over_dir] {
        let out = p.output();
        if out
            .lines()
            .any(|l| l.contains("WARN") || l.contains("ERROR"))
        {
            eprintln!("proxy on port {} logged:\n{out}", p.port());
        }
    }

    for (client, samples) in clients.iter().zip(&samples) {
        print!("{}", table(&targets, samples, mib, reps, *client));
    }
    Ok(())
}

/// Runs `copy` and times it, with the CPU time used meanwhile.
fn measure(
    size: u64,
    proxy_pids: &[u32],
    ganesha_pid: u32,
    copy: impl FnOnce() -> Result<()>,
) -> Result<Sample> {
    let proxies_before = usage_of_pids(proxy_pids)?;
    let ganesha_before = usage_of_pids(&[ganesha_pid])?;
    let client_before = gvfs_testbed::bench::children_cpu_secs();
    let start = Instant::now();
    copy()?;
    let secs = start.elapsed().as_secs_f64();
    Ok(Sample {
        mib_s: size as f64 / f64::from(1 << 20) / secs,
        cpu_client: gvfs_testbed::bench::children_cpu_secs() - client_before,
        cpu_proxies: usage_of_pids(proxy_pids)?.cpu - proxies_before.cpu,
        cpu_ganesha: usage_of_pids(&[ganesha_pid])?.cpu - ganesha_before.cpu,
        proxy_faults: usage_of_pids(proxy_pids)?.faults - proxies_before.faults,
    })
}

/// `nfs-cp from to`, killed after `timeout`.
fn nfs_cp(
    from: &impl AsRef<std::ffi::OsStr>,
    to: &impl AsRef<std::ffi::OsStr>,
    timeout: Duration,
) -> Result<()> {
    process::run_ok(Command::new("nfs-cp").arg(from).arg(to), timeout)
        .context("nfs-cp (apt-get install libnfs-utils)")?;
    Ok(())
}

fn report(rep: usize, name: &str, dir: Direction, mib: u64, s: &Sample) {
    eprintln!(
        "rep {}  {name:<22} {:<5} {mib} MiB at {:7.1} MiB/s  (cpu s: client {:.2}, proxies {:.2}, ganesha {:.2}; proxy page faults per MiB {:.0})",
        rep + 1,
        dir.label(),
        s.mib_s,
        s.cpu_client,
        s.cpu_proxies,
        s.cpu_ganesha,
        s.proxy_faults as f64 / mib as f64
    );
}

/// The results table (markdown, so it can go into docs/BENCHMARKS.md as is).
fn table(
    targets: &[Target],
    samples: &[[Vec<Sample>; 2]],
    mib: u64,
    reps: usize,
    client: CopyClient,
) -> String {
    let gib = mib as f64 / 1024.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{} of a {mib} MiB file, {reps} repetition(s); MiB/s (median, min-max); \
         CPU seconds per GiB copied and proxies' minor page faults per MiB (medians)\n",
        client.label()
    );
    let header = "| configuration | direction | median MiB/s | min-max MiB/s | vs direct | cpu client | cpu proxies | cpu ganesha | proxy faults/MiB |\n\
                  |---|---|---:|---:|---:|---:|---:|---:|---:|\n";
    for origin in [Origin::Ganesha, Origin::Dir] {
        if !targets.iter().any(|t| t.origin == origin) {
            continue;
        }
        if origin == Origin::Dir {
            let _ = writeln!(out, "\nFor context (not comparable with ganesha):\n");
        }
        out.push_str(header);
        for dir in [Direction::Write, Direction::Read] {
            let d = dir as usize;
            let direct = median(samples[0][d].iter().map(|s| s.mib_s));
            for (t, s) in targets
                .iter()
                .zip(samples)
                .filter(|(t, _)| t.origin == origin)
            {
                let s = &s[d];
                let rate = median(s.iter().map(|x| x.mib_s));
                let lo = s.iter().map(|x| x.mib_s).fold(f64::INFINITY, f64::min);
                let hi = s.iter().map(|x| x.mib_s).fold(0.0, f64::max);
                let ratio = match origin {
                    Origin::Ganesha => format!("{:.2}x", rate / direct),
                    Origin::Dir => "-".to_owned(),
                };
                let per_gib = |f: fn(&Sample) -> f64| median(s.iter().map(f)) / gib;
                let _ = writeln!(
                    out,
                    "| {} | {} | {rate:.0} | {lo:.0}-{hi:.0} | {ratio} | {:.2} | {:.2} | {:.2} | {:.0} |",
                    t.name,
                    dir.label(),
                    per_gib(|x| x.cpu_client),
                    per_gib(|x| x.cpu_proxies),
                    per_gib(|x| x.cpu_ganesha),
                    median(s.iter().map(|x| x.proxy_faults as f64)) / mib as f64,
                );
            }
        }
    }
    out
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// What a process has used so far.
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    /// CPU seconds, user + system.
    cpu: f64,
    /// Minor page faults.
    faults: u64,
}

/// CPU seconds and minor faults of the processes `pids` so far, all
/// threads included.
fn usage_of_pids(pids: &[u32]) -> Result<Usage> {
    pids.iter().try_fold(Usage::default(), |sum, &p| {
        let u = gvfs_testbed::bench::proc_usage(p)?;
        Ok(Usage {
            cpu: sum.cpu + u.cpu_secs,
            faults: sum.faults + u.minor_faults,
        })
    })
}
