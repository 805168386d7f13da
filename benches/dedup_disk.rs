//! Dedup of disk images read block by block, against real peers: nfs-ganesha
//! as the image server, `nfs-cp` as the client, the block cache of a node
//! proxy behind the emulated WAN.
//!
//! Two raw disk images of the same size, each with metadata made by
//! `gvfsctl meta gen --hashes` (zero map and block hashes, no
//! compress-and-copy, so they are read block by block): `base.img` of its
//! own random data with a tenth of holes, and `next.img`, whose even 64 KiB
//! pieces are pieces of `base.img` (at other offsets: a shared base layer)
//! and whose odd pieces are its own. Each way starts a fresh link and a
//! fresh node proxy, copies `base.img` through it (cold), waits for its
//! blocks to be indexed, and then times the copy of `next.img`:
//! - **dedup off**: `--no-dedup`: every block of `next.img` crosses the link;
//! - **dedup on**: the default: the block cache fills the shared pieces
//!   from `base.img`'s blocks it holds.
//!
//! The floor is the bytes of `next.img` no held image has (its own non-zero
//! pieces) over the link's bandwidth.
//!
//! Run: `cargo build --release --workspace --bins && cargo bench --bench
//! dedup_disk`. Environment: `GVFS_BENCH_MIB` (128), `GVFS_BENCH_RTT_MS`
//! (40), `GVFS_BENCH_MBIT` (50). Without `--bench` (under `cargo test
//! --benches`) it does a small smoke run (8 MiB, 2 ms, 400 Mbit/s).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use gvfs_testbed::bench::{env_u64, loadavg, shm_tempdir};
use gvfs_testbed::data::{compare_files, fill_at};
use gvfs_testbed::libnfs::CopyClient;
use gvfs_testbed::proxy::gvfsctl_local;
use gvfs_testbed::{Ganesha, Proxy, ProxyArgs};
use gvfs_wanlink::{LinkConfig, WanLink};

const MIB: u64 = 1 << 20;
const PIECE: u64 = 64 * 1024;

/// What a piece of each image is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Piece {
    Hole,
    /// Random bytes of the image's own.
    Own,
    /// `base.img`'s piece of this index.
    Base(u64),
}

fn base_piece(p: u64) -> Piece {
    if p % 10 == 9 { Piece::Hole } else { Piece::Own }
}

fn next_piece(p: u64) -> Piece {
    match p % 2 {
        0 if base_piece(p / 2) == Piece::Own => Piece::Base(p / 2),
        0 => Piece::Hole,
        _ => Piece::Own,
    }
}

/// Writes an image of `pieces` pieces laid out by `layout`, its own data
/// from `seed`.
fn write_image(path: &Path, pieces: u64, seed: u64, layout: fn(u64) -> Piece) -> Result<()> {
    let f = File::create(path)?;
    f.set_len(pieces * PIECE)?;
    let mut buf = vec![0u8; PIECE as usize];
    for p in 0..pieces {
        match layout(p) {
            Piece::Hole => continue,
            Piece::Own => fill_at(seed, p * PIECE, &mut buf),
            Piece::Base(q) => fill_at(1, q * PIECE, &mut buf),
        }
        f.write_all_at(&buf, p * PIECE)?;
    }
    Ok(())
}

/// What one way measured for `next.img`.
struct Measured {
    secs: f64,
    /// Bytes through the link, both directions.
    wire: u64,
    held_fill: u64,
    fetched: u64,
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / MIB as f64)
}

fn way(
    rt: &tokio::runtime::Runtime,
    dedup: bool,
    g: &Ganesha,
    server: &Proxy,
    link_config: &LinkConfig,
    local: &Path,
    base_blocks: u64,
) -> Result<Measured> {
    let link = rt.block_on(WanLink::start(
        "127.0.0.1:0".parse()?,
        server.addr(),
        link_config.clone(),
    ))?;
    let cache = tempfile::Builder::new()
        .prefix("gvfs-bench-cache-")
        .tempdir()?;
    let mut args = ProxyArgs::new(server.upstream_url_at(link.local_addr()))
        .cache_dir(cache.path())
        .env("RUST_LOG", "warn");
    if !dedup {
        args = args.no_dedup();
    }
    let node = Proxy::spawn(args)?;
    let timeout = Duration::from_secs(3600);
    let copy = |name: &str| -> Result<f64> {
        let back = local.join(name);
        let t = Instant::now();
        CopyClient::NfsCp.copy(&node.url(name), &back.display().to_string(), timeout)?;
        let secs = t.elapsed().as_secs_f64();
        compare_files(&g.export_dir().join(name), &back).with_context(|| name.to_string())?;
        std::fs::remove_file(&back)?;
        Ok(secs)
    };
    copy("base.img")?;
    if dedup {
        node.wait_for("the base image's blocks indexed", timeout, |s| {
            s.file_cache.blocks_indexed >= base_blocks
        })?;
    }
    let before = (link.stats(), node.stats()?);
    let secs = copy("next.img")?;
    let (after, s) = (link.stats(), node.stats()?);
    let m = Measured {
        secs,
        wire: after.downstream_bytes + after.upstream_bytes
            - before.0.downstream_bytes
            - before.0.upstream_bytes,
        held_fill: s.cache.counts.held_fill_bytes - before.1.cache.counts.held_fill_bytes,
        fetched: s.cache.counts.fetched_bytes - before.1.cache.counts.fetched_bytes,
    };
    // The way did what it is named for.
    ensure!(
        s.file_cache.counts.files_fetched == 0 && (m.held_fill > 0) == dedup,
        "dedup {dedup}: {s}"
    );
    eprintln!(
        "dedup {dedup}: next.img in {secs:.2} s, {} MiB on the wire\n  node stats {s}",
        mib(m.wire)
    );
    Ok(m)
}

fn main() -> Result<()> {
    let bench = std::env::args().any(|a| a == "--bench");
    let size = env_u64("GVFS_BENCH_MIB", if bench { 128 } else { 8 })? * MIB;
    let rtt = Duration::from_millis(env_u64("GVFS_BENCH_RTT_MS", if bench { 40 } else { 2 })?);
    let mbit = env_u64("GVFS_BENCH_MBIT", if bench { 50 } else { 400 })?;
    ensure!(
        size >= MIB && mbit > 0,
        "GVFS_BENCH_MIB must be >= 1 and GVFS_BENCH_MBIT > 0"
    );
    let rate_bps = mbit * 1_000_000;
    let link_config = LinkConfig::from_rtt(rtt, Some(rate_bps));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let local = shm_tempdir()?;
    let g = Ganesha::start().context("starting nfs-ganesha")?;
    let start_load = loadavg();

    let pieces = size / PIECE;
    write_image(&g.export_dir().join("base.img"), pieces, 1, base_piece)?;
    write_image(&g.export_dir().join("next.img"), pieces, 2, next_piece)?;
    for name in ["base.img", "next.img"] {
        let p = g.export_dir().join(name).display().to_string();
        eprintln!(
            "{}",
            gvfsctl_local(&["meta", "gen", &p, "--hashes"])?.trim()
        );
    }
    let count = |layout: fn(u64) -> Piece, want: fn(Piece) -> bool| {
        (0..pieces).filter(|&p| want(layout(p))).count() as u64
    };
    let base_blocks = count(base_piece, |k| k == Piece::Own) * PIECE / 4096;
    let unique = count(next_piece, |k| k == Piece::Own) * PIECE;
    let shared = count(next_piece, |k| matches!(k, Piece::Base(_))) * PIECE;
    let floor = unique as f64 * 8.0 / rate_bps as f64;

    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()).env("RUST_LOG", "warn"))?;
    let off = way(
        &rt,
        false,
        &g,
        &server,
        &link_config,
        local.path(),
        base_blocks,
    )?;
    let on = way(
        &rt,
        true,
        &g,
        &server,
        &link_config,
        local.path(),
        base_blocks,
    )?;

    let mut out = format!(
        "\n{} MiB disk images (next.img: {} MiB shared with base.img, {} MiB its own, \
         the rest holes), {} ms RTT, {mbit} Mbit/s, nfs-cp through a node proxy's block \
         cache, one run per way; load average {start_load} at the start, {} at the end\n\n",
        size / MIB,
        mib(shared),
        mib(unique),
        rtt.as_millis(),
        loadavg()
    );
    out += "| next.img, after base.img | seconds | MiB on the wire | wire / floor bytes | \
            time / floor | MiB filled from held blocks | MiB fetched upstream |\n\
            |---|---:|---:|---:|---:|---:|---:|\n";
    for (label, m) in [("dedup off", &off), ("dedup on", &on)] {
        out += &format!(
            "| {label} | {:.2} | {} | {:.2}x | {:.2}x | {} | {} |\n",
            m.secs,
            mib(m.wire),
            m.wire as f64 / unique as f64,
            m.secs / floor,
            mib(m.held_fill),
            mib(m.fetched)
        );
    }
    out += &format!(
        "| floor: next.img's own bytes / bandwidth | {floor:.2} | {} | 1.00x | 1.00x | | |\n\n\
         dedup on / off: {:.2}x the time, {:.2}x the WAN bytes\n",
        mib(unique),
        on.secs / off.secs,
        on.wire as f64 / off.wire as f64
    );
    println!("{out}");
    Ok(())
}
