//! A shared proxy and clients that misbehave: how much a well-behaved
//! client's read latency suffers from others on the same proxy.
//!
//! One caching proxy (block cache, over a `dir:` origin on tmpfs). A good
//! client (the test bed's `NfsClient`, one call at a time) reads 4 KiB and
//! 1 MiB at random places of a 64 MiB file the cache already holds, for
//! `GVFS_SHARED_SECS` seconds per case, and its p50 and p99 latencies are
//! recorded in three cases:
//!
//! - alone;
//! - hogs: 8 more connections each send 128 READs of 1 MiB at once and
//!   never read a reply;
//! - writers: 16 more clients (a thread and a connection each) write 1 MiB
//!   UNSTABLE WRITEs to files of their own, with a COMMIT after every 8.
//!
//! The figures that matter are the ratios of the good client's p99 with
//! others to its p99 alone (goal: at most 1.2).
//!
//! Run: `cargo build --release -p gvfs-proxy --bins && cargo bench --bench
//! shared`. Environment: `GVFS_SHARED_SECS` (seconds per case, default 20).
//! Without `--bench` (as under `cargo test --benches`) each case runs 2 s.

use std::io::Write as _;
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use gvfs_nfs::nfs3_types::nfs3::{Nfs3Result, READ3args, nfs_fh3, stable_how};
use gvfs_nfs::{NfsReply, NfsRequest};
use gvfs_testbed::bench::{env_u64, loadavg, shm_tempdir};
use gvfs_testbed::data::write_random_file;
use gvfs_testbed::nfsclient::NfsClient;
use gvfs_testbed::rpc_client::read_call;
use gvfs_testbed::{Proxy, ProxyArgs};
use rand::Rng;

const MIB: u64 = 1 << 20;
/// The file the good client reads (and the hogs ask for).
const FILE_MIB: u64 = 64;
const HOGS: u32 = 8;
const HOG_CALLS: u32 = 128;
const WRITERS: usize = 16;
/// WRITEs between COMMITs; each writer cycles over this many MiB.
const COMMIT_EVERY: u64 = 8;
const WRITER_FILE_MIB: u64 = 32;
const GIVE_UP: Duration = Duration::from_secs(60);

/// Latencies of the good client in one case, in microseconds.
#[derive(Default)]
struct Latencies {
    small: Vec<u64>,
    large: Vec<u64>,
}

fn percentile(v: &mut [u64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_unstable();
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    v[i] as f64 / 1000.0
}

/// p50 and p99 of 4 KiB and 1 MiB reads, in milliseconds.
struct Summary {
    small: (f64, f64),
    large: (f64, f64),
    calls: usize,
}

impl Latencies {
    fn summary(mut self) -> Summary {
        Summary {
            calls: self.small.len() + self.large.len(),
            small: (
                percentile(&mut self.small, 0.5),
                percentile(&mut self.small, 0.99),
            ),
            large: (
                percentile(&mut self.large, 0.5),
                percentile(&mut self.large, 0.99),
            ),
        }
    }
}

async fn read(c: &NfsClient, fh: &nfs_fh3, offset: u64, count: u32) -> Result<()> {
    let reply = c
        .call(NfsRequest::Read(READ3args {
            file: fh.clone(),
            offset,
            count,
        }))
        .await?;
    match reply {
        NfsReply::Read(Nfs3Result::Ok(ok)) if ok.data.len() == count as usize => Ok(()),
        other => bail!("READ {count} at {offset}: {:?}", other.status()),
    }
}

/// The good client: 4 KiB and 1 MiB reads in turn, for `secs`.
async fn good_client(c: &NfsClient, fh: &nfs_fh3, secs: u64) -> Result<Latencies> {
    let mut lat = Latencies::default();
    let mut rng = rand::thread_rng();
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        let at = rng.gen_range(0..FILE_MIB * 256) * 4096;
        let t = Instant::now();
        read(c, fh, at, 4096).await?;
        lat.small.push(t.elapsed().as_micros() as u64);
        let at = rng.gen_range(0..FILE_MIB) * MIB;
        let t = Instant::now();
        read(c, fh, at, MIB as u32).await?;
        lat.large.push(t.elapsed().as_micros() as u64);
    }
    Ok(lat)
}

/// Connections that each send `HOG_CALLS` READs of 1 MiB and never read.
fn hogs(p: &Proxy, fh: &nfs_fh3) -> Result<Vec<TcpStream>> {
    let mut hogs = Vec::new();
    for h in 0..HOGS {
        let mut s = TcpStream::connect_timeout(&p.addr(), Duration::from_secs(5))?;
        s.set_write_timeout(Some(Duration::from_secs(10)))?;
        let mut calls = Vec::new();
        for i in 0..HOG_CALLS {
            let at = u64::from(i) % FILE_MIB * MIB;
            calls.extend(read_call(h * HOG_CALLS + i, fh, at, MIB as u32));
        }
        s.write_all(&calls)?;
        hogs.push(s);
    }
    Ok(hogs)
}

/// Writers, each on a thread and a connection of its own, until `stop`;
/// adds the MiB written to `written`.
fn writers(
    p: &Proxy,
    stop: &Arc<AtomicBool>,
    written: &Arc<AtomicU64>,
) -> Vec<std::thread::JoinHandle<Result<()>>> {
    (0..WRITERS)
        .map(|w| {
            let (stop, written) = (stop.clone(), written.clone());
            let addr = p.addr();
            let export = p.export().to_owned();
            std::thread::spawn(move || -> Result<()> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(async {
                    let cred = gvfs_nfs::Credentials::unix(0, 0);
                    let c = NfsClient::mount(addr, addr, &export, cred, GIVE_UP).await?;
                    let fh = c.create(&format!("w{w}")).await?;
                    let data = vec![w as u8 ^ 0x5a; MIB as usize];
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let at = n % WRITER_FILE_MIB * MIB;
                        c.write(&fh, at, &data, stable_how::UNSTABLE).await?;
                        written.fetch_add(1, Ordering::Relaxed);
                        n += 1;
                        if n.is_multiple_of(COMMIT_EVERY) {
                            c.commit(&fh).await?;
                        }
                    }
                    Ok(())
                })
            })
        })
        .collect()
}

fn main() -> Result<()> {
    let bench = std::env::args().any(|a| a == "--bench");
    let secs = env_u64("GVFS_SHARED_SECS", if bench { 20 } else { 2 })?;
    let origin = shm_tempdir()?;
    let cache = shm_tempdir()?;
    write_random_file(&origin.path().join("big"), 0x5348_4152, FILE_MIB * MIB)?;
    let p = Proxy::spawn(
        ProxyArgs::dir(origin.path())
            .cache(cache.path(), "1G")
            .env("RUST_LOG", "warn"),
    )?;
    let budget = p.status()?.buffers.budget_bytes;
    eprintln!("load average {} at start", loadavg());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let good = rt.block_on(NfsClient::of_proxy(&p, GIVE_UP))?;
    let fh = rt.block_on(good.resolve("big"))?.context("no file big")?;
    // Warm: every MiB read once, so the good client's reads are hits.
    rt.block_on(async {
        for m in 0..FILE_MIB {
            read(&good, &fh, m * MIB, MIB as u32).await?;
        }
        anyhow::Ok(())
    })?;

    let alone = rt.block_on(good_client(&good, &fh, secs))?.summary();
    eprintln!("alone: {} calls", alone.calls);

    let hog_conns = hogs(&p, &fh)?;
    // Let them fill what they may of the memory budget.
    std::thread::sleep(Duration::from_secs(2));
    let throttled = p.status()?.buffers.throttled;
    let with_hogs = rt.block_on(good_client(&good, &fh, secs))?.summary();
    let held = p.status()?.buffers;
    eprintln!(
        "hogs: {} calls; budget {} MiB, held {} MiB, throttled {}",
        with_hogs.calls,
        held.budget_bytes / MIB,
        held.held_bytes / MIB,
        held.throttled
    );
    drop(hog_conns);

    let (stop, written) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let threads = writers(&p, &stop, &written);
    std::thread::sleep(Duration::from_secs(1));
    let before = written.load(Ordering::Relaxed);
    let t = Instant::now();
    let with_writers = rt.block_on(good_client(&good, &fh, secs))?.summary();
    let write_rate = (written.load(Ordering::Relaxed) - before) as f64 / t.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join()
            .map_err(|_| anyhow::anyhow!("a writer panicked"))??;
    }
    ensure!(throttled >= 1, "the hogs were never held back");

    println!(
        "\n## Shared proxy, misbehaving clients ({secs} s per case, budget {} MiB)\n",
        budget / MIB
    );
    println!(
        "| case | 4 KiB p50 ms | 4 KiB p99 ms | 1 MiB p50 ms | 1 MiB p99 ms | p99 / alone (4 KiB, 1 MiB) |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let cases = [
        ("alone", &alone),
        ("8 hogs x 128 READs, never read", &with_hogs),
        ("16 writers (1 MiB UNSTABLE + COMMIT)", &with_writers),
    ];
    for (name, s) in cases {
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2}, {:.2} |",
            s.small.0,
            s.small.1,
            s.large.0,
            s.large.1,
            s.small.1 / alone.small.1,
            s.large.1 / alone.large.1
        );
    }
    println!(
        "\nwriters wrote {write_rate:.0} MiB/s meanwhile; load average {} at the end",
        loadavg()
    );
    Ok(())
}
