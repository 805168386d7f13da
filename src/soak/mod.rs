//! The soak benchmark's harness: many clients, for a long time, through a
//! caching chain over TLS, every byte checked.
//!
//! Topology (all on loopback):
//!
//! ```text
//! 16 clients ──NFSv3──> LAN proxy ══TLS 1.3══> image-server proxy ──NFSv3──> nfs-ganesha
//!  (fixture +          block cache,            --listen-tls,                  (export dir)
//!   nfs-cat/nfs-cp)    write-back              --map-peer lan=pass
//! ```
//!
//! The clients ([`workload`]) create, write, read, truncate and remove their
//! own files and read shared ones for [`Settings::duration`]; every byte
//! read is checked against the model (wrong bytes served must be 0). A
//! [`sample::Sampler`] records CPU time and RSS of both proxies and ganesha
//! all along. At the end the LAN proxy writes back (`gvfsctl writeback
//! --wait`) and every file at the origin is compared with what its client
//! wrote (bytes lost must be 0; removed files must be gone).
//!
//! `benches/soak.rs` runs it (10 minutes by default) and `tests/soak.rs` a
//! quick run of it.

pub mod sample;
pub mod workload;

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use gvfs_nfs::Credentials;

use crate::bench::{loadavg, machine_busy_secs};
use crate::data::{fill_at, write_random_file};
use crate::nfsclient::NfsClient;
use crate::{Ganesha, Proxy, ProxyArgs, Stats, Status, WritePolicy};
use sample::{Sample, Sampler};
use workload::{Client, ClientEnd, ClientKind, Plan, SharedFile, Tally};

/// Longest a client's call may wait for its reply (a call that takes longer
/// fails and counts as an error).
const CALL_GIVE_UP: Duration = Duration::from_secs(120);

/// What to run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long the clients run.
    pub duration: Duration,
    /// Clients at once.
    pub clients: usize,
    /// How many of them are libnfs clients (`nfs-cat`, `nfs-cp`).
    pub libnfs_clients: usize,
    /// Files each client keeps.
    pub files_per_client: usize,
    /// Largest size of a client's file.
    pub max_file: usize,
    /// Read-only files every client reads.
    pub shared_files: usize,
    /// Size of each shared file.
    pub shared_size: u64,
    /// The LAN proxy's `--cache-size`.
    pub cache_size: String,
    /// The LAN proxy's `--block-size`.
    pub block_size: String,
    /// Time between two samples of CPU and RSS.
    pub sample_every: Duration,
    /// Seed of the operations and contents.
    pub seed: u64,
    /// Run this `gvfs-proxy` binary as the image server instead of the
    /// built one (to compare two builds).
    pub image_server_binary: Option<PathBuf>,
    /// Further arguments of the LAN proxy (e.g. `--attr-timeout 60`).
    pub lan_args: Vec<String>,
}

impl Settings {
    /// The recorded run: 16 clients for 10 minutes.
    pub fn full() -> Self {
        Self {
            duration: Duration::from_secs(600),
            sample_every: Duration::from_secs(10),
            ..Self::quick()
        }
    }

    /// A quick run for the CI: the same clients for 15 s.
    pub fn quick() -> Self {
        Self {
            duration: Duration::from_secs(15),
            clients: 16,
            libnfs_clients: 4,
            files_per_client: 6,
            max_file: 1 << 20,
            shared_files: 4,
            shared_size: 8 << 20,
            // Smaller than what the clients touch (~16 x 6 x 0.5 MiB plus
            // 32 MiB shared), so blocks, dirty ones too, get evicted.
            cache_size: "64M".into(),
            block_size: "64K".into(),
            sample_every: Duration::from_secs(1),
            seed: 0x736f_616b,
            image_server_binary: None,
            lan_args: Vec::new(),
        }
    }
}

/// The processes the sampler watches, in [`Sample::procs`] order.
pub const PROCESSES: [&str; 3] = ["image-server proxy", "LAN proxy", "nfs-ganesha"];

/// What a run found.
#[derive(Debug)]
pub struct Outcome {
    /// What ran.
    pub settings: Settings,
    /// All clients' counts.
    pub tally: Tally,
    /// Seconds the clients ran (to the last one's final COMMIT).
    pub run_secs: f64,
    /// Seconds `gvfsctl writeback --wait` took at the end.
    pub writeback_secs: f64,
    /// Files compared at the origin.
    pub files_checked: u64,
    /// Bytes those files must hold.
    pub bytes_expected: u64,
    /// Bytes of them the origin does not hold (other bytes, or missing).
    pub bytes_lost: u64,
    /// Bytes at the origin past the end a file must have.
    pub extra_bytes: u64,
    /// Files missing at the origin.
    pub files_missing: u64,
    /// Removed files still at the origin.
    pub files_not_removed: u64,
    /// Bytes of the shared files changed at the origin.
    pub shared_bytes_changed: u64,
    /// Samples, the first at the start of the clients' run, the last after
    /// it.
    pub samples: Vec<Sample>,
    /// The machine's CPUs.
    pub cpus: usize,
    /// Load average at the start and at the end.
    pub load: (String, String),
    /// The LAN proxy's `gvfsctl stats` after the write-back (`None` if
    /// it did not answer).
    pub lan_stats: Option<Stats>,
    /// The image-server proxy's `gvfsctl status` at the end of the
    /// clients' run (before the write-back; all zeros if it did not answer).
    pub image_status: Status,
}

impl Outcome {
    /// Failed operations, wrong bytes, lost bytes and stray files, in one
    /// line each; empty when the run was clean.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        let t = &self.tally;
        if t.total_errors() > 0 {
            p.push(format!(
                "{} failed operations: {:?}",
                t.total_errors(),
                t.errors
            ));
        }
        for (what, n) in [
            ("wrong bytes served", t.wrong_bytes),
            ("bytes lost at the origin", self.bytes_lost),
            ("extra bytes at the origin", self.extra_bytes),
            ("files missing at the origin", self.files_missing),
            ("removed files still at the origin", self.files_not_removed),
            ("bytes of shared files changed", self.shared_bytes_changed),
            ("tainted files", t.tainted_files),
        ] {
            if n > 0 {
                p.push(format!("{n} {what}"));
            }
        }
        p
    }
}

/// Runs the soak.
pub fn run(s: &Settings) -> Result<Outcome> {
    if s.libnfs_clients > s.clients || s.clients == 0 || s.max_file == 0 {
        bail!("soak settings: {s:?}");
    }
    let work = tempfile::Builder::new().prefix("gvfs-soak-").tempdir()?;
    let scratch = crate::bench::shm_tempdir()?;
    let pki = crate::site::Pki::new(&["image-server", "lan"])?;
    let ca = pki.ca_dir().to_path_buf();
    let ganesha = Ganesha::start().context("starting nfs-ganesha")?;
    let shared: Vec<SharedFile> = (0..s.shared_files)
        .map(|i| SharedFile {
            name: format!("shared-{i}"),
            seed: s.seed ^ (0x5348_0000 + i as u64),
            size: s.shared_size,
        })
        .collect();
    for f in &shared {
        write_random_file(&ganesha.export_dir().join(&f.name), f.seed, f.size)?;
    }

    let mut image_args = ProxyArgs::new(ganesha.upstream_url())
        .tls(&ca, "image-server")
        .listen_tls(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .map_peer("lan", "pass")
        .env("RUST_LOG", "warn");
    if let Some(b) = &s.image_server_binary {
        image_args = image_args.binary(b);
    }
    let image = Proxy::spawn(image_args).context("starting the image-server proxy")?;
    let tls: SocketAddr = image
        .status()?
        .listen_tls
        .context("the image server has no TLS listener")?
        .parse()?;
    let cache = work.path().join("cache");
    let mut lan_args = ProxyArgs::new(format!("gvfs://{tls}/export?name=image-server"));
    for a in &s.lan_args {
        lan_args = lan_args.arg(a);
    }
    let lan = Proxy::spawn(
        lan_args
            .tls(&ca, "lan")
            .cache(&cache, &s.cache_size)
            .block_size(&s.block_size)
            .write_policy(WritePolicy::WriteBack)
            .env("RUST_LOG", "warn"),
    )
    .context("starting the LAN proxy")?;
    let pids = [image.pid(), lan.pid(), ganesha.pid()]
        .into_iter()
        .map(|p| p.context("a process of the chain is not running"))
        .collect::<Result<Vec<u32>>>()?;

    let plan = Arc::new(Plan {
        ip: lan.ip(),
        port: lan.port(),
        export: lan.export().to_owned(),
        files_per_client: s.files_per_client,
        max_file: s.max_file,
        shared: shared.clone(),
        scratch: scratch.path().to_path_buf(),
        seed: s.seed,
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let progress = Arc::new(AtomicU64::new(0));
    let (addr, export) = (lan.addr(), lan.export().to_owned());
    let clients = rt.block_on(async {
        let mut clients = Vec::new();
        for id in 0..s.clients {
            let nfs = NfsClient::mount(addr, addr, &export, Credentials::unix(0, 0), CALL_GIVE_UP)
                .await?;
            let kind = if id < s.libnfs_clients {
                ClientKind::Libnfs
            } else {
                ClientKind::Fixture
            };
            clients.push(
                Client::start(id, kind, nfs, Arc::clone(&plan), Arc::clone(&progress)).await?,
            );
        }
        Ok::<_, anyhow::Error>(clients)
    })?;

    let load_start = loadavg();
    let sampler = Sampler::start(pids, s.sample_every, Arc::clone(&progress))?;
    let started = Instant::now();
    let deadline = started + s.duration;
    let ends: Vec<ClientEnd> = rt.block_on(async {
        let tasks: Vec<_> = clients
            .into_iter()
            .map(|c| tokio::spawn(c.run(deadline)))
            .collect();
        let mut ends = Vec::new();
        for t in tasks {
            ends.push(t.await.context("a client task panicked")?);
        }
        Ok::<_, anyhow::Error>(ends)
    })?;
    let run_secs = started.elapsed().as_secs_f64();
    let samples = sampler.finish();
    let load_end = loadavg();
    let image_status = image.status().unwrap_or_default();

    let t = Instant::now();
    lan.write_back().context("writing back the LAN proxy")?;
    let writeback_secs = t.elapsed().as_secs_f64();
    let lan_stats = lan.stats().ok();

    let mut tally = Tally::default();
    for e in &ends {
        tally.merge(&e.tally);
    }
    let mut out = Outcome {
        settings: s.clone(),
        tally,
        run_secs,
        writeback_secs,
        files_checked: 0,
        bytes_expected: 0,
        bytes_lost: 0,
        extra_bytes: 0,
        files_missing: 0,
        files_not_removed: 0,
        shared_bytes_changed: 0,
        samples,
        cpus: machine_busy_secs().map(|(_, n)| n).unwrap_or(1),
        load: (load_start, load_end),
        lan_stats,
        image_status,
    };
    check_origin(&ganesha, &ends, &shared, &mut out)?;
    Ok(out)
}

/// Compares the origin's files with what the clients wrote.
fn check_origin(
    ganesha: &Ganesha,
    ends: &[ClientEnd],
    shared: &[SharedFile],
    out: &mut Outcome,
) -> Result<()> {
    let dir = ganesha.export_dir();
    for end in ends {
        for (name, want) in &end.files {
            let Some(want) = want else { continue };
            out.files_checked += 1;
            out.bytes_expected += want.len() as u64;
            match std::fs::read(dir.join(name)) {
                Ok(got) => {
                    out.bytes_lost += want
                        .iter()
                        .enumerate()
                        .filter(|&(i, b)| got.get(i) != Some(b))
                        .count() as u64;
                    out.extra_bytes += got.len().saturating_sub(want.len()) as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    out.files_missing += 1;
                    out.bytes_lost += want.len() as u64;
                }
                Err(e) => return Err(e).with_context(|| format!("reading {name} at the origin")),
            }
        }
        for name in &end.removed {
            if dir.join(name).exists() {
                out.files_not_removed += 1;
            }
        }
    }
    for f in shared {
        let got = std::fs::read(dir.join(&f.name))?;
        let mut want = vec![0; f.size as usize];
        fill_at(f.seed, 0, &mut want);
        out.shared_bytes_changed += want
            .iter()
            .enumerate()
            .filter(|&(i, b)| got.get(i) != Some(b))
            .count() as u64
            + got.len().saturating_sub(want.len()) as u64;
    }
    Ok(())
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

/// Per watched process over the clients' run: CPU seconds, mean cores, CPU
/// milliseconds per operation, RSS min/max/end in MiB.
#[derive(Debug, Clone, Copy)]
pub struct ProcSummary {
    /// CPU seconds during the run.
    pub cpu_secs: f64,
    /// Mean cores busy (CPU seconds per second).
    pub cores: f64,
    /// CPU milliseconds per client operation.
    pub ms_per_op: f64,
    /// Smallest RSS seen, MiB.
    pub rss_min: f64,
    /// Largest RSS seen, MiB.
    pub rss_max: f64,
    /// RSS at the last sample, MiB.
    pub rss_end: f64,
}

impl Outcome {
    /// The summary of watched process `i` ([`PROCESSES`]).
    pub fn proc_summary(&self, i: usize) -> Option<ProcSummary> {
        let (first, last) = (self.samples.first()?, self.samples.last()?);
        let secs = (last.secs - first.secs).max(1e-9);
        let ops = (last.ops - first.ops).max(1) as f64;
        let cpu = last.procs.get(i)?.cpu_secs - first.procs.get(i)?.cpu_secs;
        let rss: Vec<f64> = self
            .samples
            .iter()
            .filter_map(|s| s.procs.get(i))
            .map(|u| mib(u.rss_bytes))
            .collect();
        Some(ProcSummary {
            cpu_secs: cpu,
            cores: cpu / secs,
            ms_per_op: cpu * 1000.0 / ops,
            rss_min: rss.iter().copied().fold(f64::INFINITY, f64::min),
            rss_max: rss.iter().copied().fold(0.0, f64::max),
            rss_end: rss.last().copied().unwrap_or(0.0),
        })
    }

    /// CPU seconds the rest of the machine used during the run (busy time
    /// of all CPUs minus the watched processes, this harness and its libnfs
    /// tools), and that as mean cores.
    pub fn others_cpu(&self) -> (f64, f64) {
        let (Some(a), Some(b)) = (self.samples.first(), self.samples.last()) else {
            return (0.0, 0.0);
        };
        let (cpu, _) = others_between(a, b);
        (cpu, cpu / (b.secs - a.secs).max(1e-9))
    }
}

/// CPU seconds others used between two samples, and ours.
fn others_between(a: &Sample, b: &Sample) -> (f64, f64) {
    let ours: f64 = a
        .procs
        .iter()
        .zip(&b.procs)
        .map(|(x, y)| y.cpu_secs - x.cpu_secs)
        .sum::<f64>()
        + (b.harness_cpu - a.harness_cpu);
    ((b.machine_busy - a.machine_busy - ours).max(0.0), ours)
}

/// The report, in Markdown: totals, operations, processes, and resources
/// over time.
pub fn report_markdown(o: &Outcome, command: &str) -> String {
    let s = &o.settings;
    let t = &o.tally;
    let mut m = String::new();
    let ops = t.total_ops();
    let _ = writeln!(
        m,
        "`{command}`: {} clients ({} libnfs `nfs-cat`/`nfs-cp`, {} fixture) for {:.0} s, \
         {} files of up to {} KiB each, {} shared files of {} MiB; LAN proxy cache {} \
         in {} blocks, write-back; load average {} at the start, {} at the end; {} CPUs.\n",
        s.clients,
        s.libnfs_clients,
        s.clients - s.libnfs_clients,
        o.run_secs,
        s.files_per_client,
        s.max_file >> 10,
        s.shared_files,
        s.shared_size >> 20,
        s.cache_size,
        s.block_size,
        o.load.0,
        o.load.1,
        o.cpus
    );
    let _ = writeln!(m, "| | |\n|---|---:|");
    for (k, v) in [
        (
            "operations",
            format!("{ops} ({:.0}/s)", ops as f64 / o.run_secs.max(1e-9)),
        ),
        ("failed operations", t.total_errors().to_string()),
        ("wrong bytes served", t.wrong_bytes.to_string()),
        (
            "bytes checked on read",
            format!("{} ({:.0} MiB)", t.bytes_read, mib(t.bytes_read)),
        ),
        (
            "bytes written (acknowledged)",
            format!("{} ({:.0} MiB)", t.bytes_written, mib(t.bytes_written)),
        ),
        (
            "verifier changes (files rewritten)",
            t.verifier_changes.to_string(),
        ),
        (
            "tainted files (unchecked after an error)",
            t.tainted_files.to_string(),
        ),
        (
            "write-back at the end",
            format!("{:.1} s", o.writeback_secs),
        ),
        (
            "files compared at the origin",
            format!(
                "{} holding {} bytes ({:.1} MiB)",
                o.files_checked,
                o.bytes_expected,
                mib(o.bytes_expected)
            ),
        ),
        ("bytes lost at the origin", o.bytes_lost.to_string()),
        ("extra bytes at the origin", o.extra_bytes.to_string()),
        (
            "files missing / removed files still there",
            format!("{} / {}", o.files_missing, o.files_not_removed),
        ),
        (
            "shared files' bytes changed",
            o.shared_bytes_changed.to_string(),
        ),
    ] {
        let _ = writeln!(m, "| {k} | {v} |");
    }
    let _ = writeln!(m, "\n| operation | count | failed |\n|---|---:|---:|");
    for (k, v) in &t.ops {
        let _ = writeln!(
            m,
            "| {k} | {v} | {} |",
            t.errors.get(k).copied().unwrap_or(0)
        );
    }
    let _ = writeln!(
        m,
        "\n| process | CPU s | mean cores | CPU ms per op | RSS min MiB | RSS max MiB | RSS end MiB |\n|---|---:|---:|---:|---:|---:|---:|"
    );
    for (i, name) in PROCESSES.iter().enumerate() {
        if let Some(p) = o.proc_summary(i) {
            let _ = writeln!(
                m,
                "| {name} | {:.1} | {:.2} | {:.3} | {:.1} | {:.1} | {:.1} |",
                p.cpu_secs, p.cores, p.ms_per_op, p.rss_min, p.rss_max, p.rss_end
            );
        }
    }
    let (others, others_cores) = o.others_cpu();
    let _ = writeln!(
        m,
        "\nOther processes on the machine used {others:.0} CPU s during the run ({others_cores:.2} cores on average, of {}).",
        o.cpus
    );
    // Resources over time: about a dozen rows.
    let n = o.samples.len();
    if n >= 2 {
        let step = (n - 1).div_ceil(12).max(1);
        let _ = writeln!(
            m,
            "\n| t s | ops/s | image-server cores | image-server RSS MiB | LAN cores | LAN RSS MiB | ganesha cores | others cores | load |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        let mut i = 0;
        while i + 1 < n {
            let j = (i + step).min(n - 1);
            let (a, b) = (&o.samples[i], &o.samples[j]);
            let dt = (b.secs - a.secs).max(1e-9);
            let cores = |k: usize| match (a.procs.get(k), b.procs.get(k)) {
                (Some(x), Some(y)) => (y.cpu_secs - x.cpu_secs) / dt,
                _ => 0.0,
            };
            let rss = |k: usize| b.procs.get(k).map(|u| mib(u.rss_bytes)).unwrap_or(0.0);
            let (oth, _) = others_between(a, b);
            let _ = writeln!(
                m,
                "| {:.0} | {:.0} | {:.2} | {:.1} | {:.2} | {:.1} | {:.2} | {:.2} | {:.1} |",
                b.secs,
                (b.ops - a.ops) as f64 / dt,
                cores(0),
                rss(0),
                cores(1),
                rss(1),
                cores(2),
                oth / dt,
                b.load1
            );
            i = j;
        }
    }
    let st = &o.image_status;
    if !st.nfs_calls.is_empty() {
        let nfs: u64 = st.nfs_calls.values().sum();
        let all = nfs + st.front.mount_calls + st.front.ext_calls;
        let bytes = st.front.read_bytes + st.front.write_bytes;
        if let Some(p) = o.proc_summary(0) {
            let _ = writeln!(
                m,
                "\nThe image-server proxy answered {all} calls ({:.0}/s; {:.0} MiB read, {:.0} MiB \
                 written through it): {:.0} CPU µs per call, {:.1} CPU ms per MiB.",
                all as f64 / o.run_secs.max(1e-9),
                mib(st.front.read_bytes),
                mib(st.front.write_bytes),
                p.cpu_secs * 1e6 / all.max(1) as f64,
                p.cpu_secs * 1e3 / mib(bytes).max(1e-9),
            );
        }
    }
    if let Some(lan) = &o.lan_stats
        && let Ok(cache) = serde_json::to_string(&lan.cache)
    {
        let _ = writeln!(m, "\nLAN proxy cache after the write-back: `{cache}`");
    }
    if !t.messages.is_empty() {
        let _ = writeln!(m, "\nFirst errors:\n");
        for msg in &t.messages {
            let _ = writeln!(m, "- {msg}");
        }
    }
    m
}
