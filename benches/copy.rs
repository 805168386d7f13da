//! Metadata actions over the WAN, against real peers: nfs-ganesha as the
//! image server, `nfs-cp` as the client.
//!
//! A raw VM memory image (about 60% zero 4 KiB pages, the rest about 2:1
//! compressible) is fetched over the emulated WAN three ways in one run,
//! each from a copy of the same bytes under its own name, so each starts
//! cold:
//! - **block by block**: `plain.raw`, no metadata file: the client proxy's
//!   block cache reads every block across the link;
//! - **zero map**: `zeromap.raw` with `gvfsctl meta gen` (zero-block map
//!   only): zero blocks are answered at the client, data blocks cross;
//! - **compress-and-copy**: `copy.raw` with `gvfsctl meta gen --compress`:
//!   the client proxy fetches the whole file as zstd chunks over the gvfs
//!   extension program, compressed by the image server's proxy.
//!
//! Topology per way: ganesha <- image-server proxy (no cache, shared by the
//! three ways) <- a fresh `WanLink` (so its byte counters are per way) <- a
//! fresh client proxy with its own `--cache-dir` (metadata actions on by
//! default) <- `nfs-cp` to `/dev/shm` (timed), then compared byte for byte
//! with the origin file. The floor is the zstd (level 3) size of the whole
//! file divided by the link's bandwidth.
//!
//! Run: `cargo build --release --workspace --bins && cargo bench --bench
//! copy`. Environment: `GVFS_BENCH_MIB` (256), `GVFS_BENCH_RTT_MS` (40),
//! `GVFS_BENCH_MBIT` (50). Without `--bench` (under `cargo test --benches`)
//! it does a small smoke run (16 MiB, 2 ms, 400 Mbit/s).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use gvfs_testbed::Stats;
use gvfs_testbed::bench::{env_u64, loadavg, shm_tempdir};
use gvfs_testbed::data::{compare_files, write_memory_image};
use gvfs_testbed::libnfs::CopyClient;
use gvfs_testbed::proxy::gvfsctl_local;
use gvfs_testbed::{Ganesha, Proxy, ProxyArgs};
use gvfs_wanlink::{LinkConfig, WanLink};

const SEED: u64 = 0x636f_7079;
const MIB: u64 = 1 << 20;

/// The metadata file beside an image, which decides how it is fetched.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Meta {
    /// No metadata file.
    None,
    /// `gvfsctl meta gen`: the zero-block map only.
    ZeroMap,
    /// `gvfsctl meta gen --compress`: zero map and compress-and-copy.
    CompressAndCopy,
}

/// One way of fetching the image.
struct Way {
    label: &'static str,
    name: &'static str,
    meta: Meta,
}

const WAYS: [Way; 3] = [
    Way {
        label: "block by block",
        name: "plain.raw",
        meta: Meta::None,
    },
    Way {
        label: "zero map",
        name: "zeromap.raw",
        meta: Meta::ZeroMap,
    },
    Way {
        label: "compress-and-copy",
        name: "copy.raw",
        meta: Meta::CompressAndCopy,
    },
];

/// What one way measured.
struct Measured {
    secs: f64,
    /// Bytes through the link, both directions.
    wire: u64,
    client: Stats,
    server_reads: u64,
    server_fetches: u64,
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / MIB as f64)
}

/// The size of `path` compressed as one zstd stream at level 3.
fn zstd_size(path: &Path) -> Result<u64> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut counter = CountingSink(0);
    zstd::stream::copy_encode(f, &mut counter, 3).context("zstd")?;
    Ok(counter.0)
}

/// A writer that only counts.
struct CountingSink(u64);

impl std::io::Write for CountingSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn fetch(
    rt: &tokio::runtime::Runtime,
    way: &Way,
    src: &Path,
    server: &Proxy,
    link_config: &LinkConfig,
    local: &Path,
    timeout: Duration,
) -> Result<Measured> {
    let link = rt.block_on(WanLink::start(
        "127.0.0.1:0".parse()?,
        server.addr(),
        link_config.clone(),
    ))?;
    let cache = tempfile::Builder::new()
        .prefix("gvfs-bench-cache-")
        .tempdir()?;
    let client = Proxy::spawn(
        ProxyArgs::new(server.upstream_url_at(link.local_addr()))
            .cache_dir(cache.path())
            .env("RUST_LOG", "warn"),
    )?;
    let reads_before = server.calls("READ")?;
    let fetches_before = server.stats()?.ext.fetch_calls;

    let back: PathBuf = local.join(way.name);
    let t = Instant::now();
    CopyClient::NfsCp.copy(&client.url(way.name), &back.display().to_string(), timeout)?;
    let secs = t.elapsed().as_secs_f64();
    compare_files(src, &back).with_context(|| format!("{}: bytes", way.label))?;
    std::fs::remove_file(&back)?;

    let s = link.stats();
    let client_stats = client.stats()?;
    let measured = Measured {
        secs,
        wire: s.downstream_bytes + s.upstream_bytes,
        server_reads: server.calls("READ")? - reads_before,
        server_fetches: server.stats()?.ext.fetch_calls - fetches_before,
        client: client_stats,
    };
    // The way did what it is named for (else the bench measures another).
    let c = &measured.client;
    match way.meta {
        Meta::None => ensure!(
            c.meta.meta_found == 0 && c.meta.zero_bytes == 0,
            "{}: metadata was used: {c}",
            way.label
        ),
        Meta::ZeroMap => ensure!(
            c.meta.meta_found >= 1
                && c.meta.zero_bytes > 0
                && c.file_cache.counts.files_fetched == 0,
            "{}: the zero map was not used alone: {c}",
            way.label
        ),
        Meta::CompressAndCopy => ensure!(
            c.meta.copy_reads > 0 && c.file_cache.counts.files_fetched == 1,
            "{}: compress-and-copy was not used: {c}",
            way.label
        ),
    }
    eprintln!(
        "{}: {secs:.2} s, {} MiB on the wire, link {s}\n  client stats {c}",
        way.label,
        mib(measured.wire)
    );
    Ok(measured)
}

fn main() -> Result<()> {
    let bench = std::env::args().any(|a| a == "--bench");
    let size = env_u64("GVFS_BENCH_MIB", if bench { 256 } else { 16 })? * MIB;
    let rtt = Duration::from_millis(env_u64("GVFS_BENCH_RTT_MS", if bench { 40 } else { 2 })?);
    let mbit = env_u64("GVFS_BENCH_MBIT", if bench { 50 } else { 400 })?;
    ensure!(
        size > 0 && mbit > 0,
        "GVFS_BENCH_MIB and GVFS_BENCH_MBIT must be > 0"
    );
    let rate_bps = mbit * 1_000_000;
    let link_config = LinkConfig::from_rtt(rtt, Some(rate_bps));
    let timeout = Duration::from_secs(3600);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let local = shm_tempdir()?;
    let ganesha = Ganesha::start().context("starting nfs-ganesha")?;
    let start_load = loadavg();
    eprintln!("load average {start_load} at start");

    // The image, three times under different names, with its metadata.
    let first = ganesha.export_dir().join(WAYS[0].name);
    write_memory_image(&first, size, SEED)?;
    for way in &WAYS {
        let path = ganesha.export_dir().join(way.name);
        if path != first {
            std::fs::copy(&first, &path)?;
        }
        let p = path.display().to_string();
        let said = match way.meta {
            Meta::None => continue,
            Meta::ZeroMap => gvfsctl_local(&["meta", "gen", &p])?,
            Meta::CompressAndCopy => gvfsctl_local(&["meta", "gen", &p, "--compress"])?,
        };
        eprintln!("{}", said.trim());
    }
    let zstd = zstd_size(&first)?;
    let floor = zstd as f64 * 8.0 / rate_bps as f64;

    let server = Proxy::spawn(ProxyArgs::new(ganesha.upstream_url()).env("RUST_LOG", "warn"))?;
    let mut results = Vec::new();
    for way in &WAYS {
        let src = ganesha.export_dir().join(way.name);
        results.push(fetch(
            &rt,
            way,
            &src,
            &server,
            &link_config,
            local.path(),
            timeout,
        )?);
    }

    let mut out = format!(
        "\n{} MiB memory image, {} ms RTT, {mbit} Mbit/s, nfs-cp, one run per way; \
         load average {start_load} at the start, {} at the end\n\n",
        size / MIB,
        rtt.as_millis(),
        loadavg()
    );
    out += "| way | seconds | MiB/s of file | MiB on the wire | speed-up vs block by block | time / floor |\n\
            |---|---:|---:|---:|---:|---:|\n";
    let plain = results[0].secs;
    for (way, r) in WAYS.iter().zip(&results) {
        out += &format!(
            "| {} | {:.2} | {:.1} | {} | {:.2}x | {:.2}x |\n",
            way.label,
            r.secs,
            (size / MIB) as f64 / r.secs,
            mib(r.wire),
            plain / r.secs,
            r.secs / floor
        );
    }
    out += &format!(
        "| floor: zstd -3 of the file / bandwidth | {floor:.2} | {:.1} | {} | {:.2}x | 1.00x |\n",
        (size / MIB) as f64 / floor,
        mib(zstd),
        plain / floor
    );
    out += "\nWhat explains it (MiB; client proxy stats, and the image-server proxy's calls):\n\n\
            | way | cache.fetched_bytes | meta.zero_bytes | file_cache wire / raw | chunks fetched / zero | server READs | server FETCHes |\n\
            |---|---:|---:|---:|---:|---:|---:|\n";
    for (way, r) in WAYS.iter().zip(&results) {
        let c = &r.client;
        out += &format!(
            "| {} | {} | {} | {} / {} | {} / {} | {} | {} |\n",
            way.label,
            mib(c.cache.counts.fetched_bytes),
            mib(c.meta.zero_bytes),
            mib(c.file_cache.counts.wire_bytes),
            mib(c.file_cache.counts.raw_bytes),
            c.file_cache.counts.chunks_fetched,
            c.file_cache.counts.zero_chunks,
            r.server_reads,
            r.server_fetches
        );
    }
    println!("{out}");
    Ok(())
}
