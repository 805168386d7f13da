//! The FUSE front end against the NFS front end of the same proxy, in one
//! run: one `gvfs-proxy` with a warm write-back block cache over a `dir:`
//! origin (both on tmpfs), listening on 127.0.0.16:111 (QEMU asks the portmapper at
//! HOST:111, so the bench runs as root) and mounted at a directory with
//! `--mount`. Every client reaches the same layers; only the front end
//! differs.
//!
//! | what | through the NFS front end | through the FUSE mount |
//! |---|---|---|
//! | sequential write, 1 MiB | `nfs-cp SRC nfs://...` (one call in flight, COMMIT at close) | `dd if=SRC of=MOUNT/F bs=1M conv=fsync` |
//! | sequential read, 1 MiB | `nfs-cat nfs://... > /dev/null` | `dd if=MOUNT/F of=/dev/null bs=1M`, the file's kernel pages dropped first (`POSIX_FADV_DONTNEED`), read-ahead 1 MiB |
//! | 4 KiB random reads | `qemu-img bench -t none -s 4096 -S 1052672 -d D nfs://...` | the same on `MOUNT/F` (O_DIRECT: no kernel page cache) |
//!
//! The 4 KiB reads step 257 blocks each time, which visits every block of
//! a 1 GiB file once in a scattered order; at depth 1 (one read at a
//! time: latency) and 16 (QEMU's block layer with 16 in flight).
//! Configurations alternate within each repetition; medians are reported
//! with the ratio FUSE/NFS as throughput (above 1: FUSE is faster).
//! Besides the times: the proxy's CPU seconds per run, and the FUSE calls
//! per run (from `gvfsctl status`), so the cost of the FUSE round trips
//! shows.
//!
//! Run: `cargo build --release --workspace --bins && cargo bench --bench
//! fuse`. `GVFS_BENCH_MIB` (file size, default 1024), `GVFS_BENCH_REPS`
//! (default 3), `GVFS_BENCH_RANDOM` (4 KiB reads per run, default 20000).
//! Without `--bench` (as under `cargo test --benches`) it does a quick
//! 16 MiB smoke run.

use std::fmt::Write as _;
use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use gvfs_testbed::bench::{env_u64, loadavg, proc_usage, shm_tempdir};
use gvfs_testbed::data::{compare_files, write_random_file};
use gvfs_testbed::fuse::MountPoint;
use gvfs_testbed::libnfs::nfs_url;
use gvfs_testbed::{Proxy, ProxyArgs, process};

const SEED: u64 = 0x6675_7365_6265_6e63;
const ADDR: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 16);
const TOOL_TIMEOUT: Duration = Duration::from_secs(600);
/// 4 KiB blocks between two random reads: odd, so a walk over a file of
/// 2^k blocks visits each block once.
const STEP_BLOCKS: u64 = 257;

fn main() -> Result<()> {
    let full = std::env::args().any(|a| a == "--bench");
    if let Some(why) = gvfs_testbed::fuse::unavailable() {
        eprintln!("skipping the FUSE bench: {why}");
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "skipping the FUSE bench: it listens on port 111 (QEMU's portmapper port) as root"
        );
        return Ok(());
    }
    let mib = if full {
        env_u64("GVFS_BENCH_MIB", 1024)?
    } else {
        16
    };
    let reps = if full {
        env_u64("GVFS_BENCH_REPS", 3)?
    } else {
        1
    };
    let randoms = if full {
        env_u64("GVFS_BENCH_RANDOM", 20_000)?
    } else {
        200
    };
    let report = run(mib, reps as usize, randoms)?;
    println!("{report}");
    Ok(())
}

/// One configuration's times, seconds per repetition.
#[derive(Default)]
struct Times {
    nfs: Vec<f64>,
    fuse: Vec<f64>,
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn run(mib: u64, reps: usize, randoms: u64) -> Result<String> {
    // The origin and the cache in memory (tmpfs), so the figures are the
    // front ends', not the disk's flushing.
    let work = shm_tempdir()?;
    let origin = work.path().join("origin");
    let cache = work.path().join("cache");
    std::fs::create_dir_all(&origin)?;
    let src = work.path().join("src");
    let bytes = mib << 20;
    write_random_file(&src, SEED, bytes)?;
    let mnt = MountPoint::new()?;
    // Room for every file the run writes (2 per repetition, removed in
    // the next) and the one it reads, so that writes never wait for the
    // write-back of a victim.
    let cache_size = format!("{}M", (mib * 6).max(256));
    let mut proxy = Proxy::spawn(
        ProxyArgs::dir(&origin)
            .listen(SocketAddr::from((ADDR, 111)))
            .cache(&cache, &cache_size)
            .no_writeback_on_exit()
            .mount(mnt.path()),
    )?;
    let pid = proxy.pid().context("the proxy's pid")?;
    let url = |name: &str| nfs_url(proxy.ip(), proxy.port(), proxy.port(), proxy.export(), name);
    let qemu_url = |name: &str| format!("nfs://{}{}/{name}", proxy.ip(), proxy.export());
    let m = mnt.path().to_path_buf();

    // Untimed warm-up, and the file every read measures, through both.
    timed_nfs_write(&src, &url("warm"))?;
    std::fs::remove_file(m.join("warm"))?;
    timed_fuse_write(&src, &m.join("read-me"))?;
    compare_files(&src, &m.join("read-me"))?;
    nfs_read(&url("read-me"))?;

    let mut seq_write = Times::default();
    let mut seq_read = Times::default();
    let mut rand1 = Times::default();
    let mut rand16 = Times::default();
    let (mut cpu_nfs, mut cpu_fuse) = (Vec::new(), Vec::new());
    let mut fuse_calls_per_gib = Vec::new();
    let cpu = || proc_usage(pid).map(|u| u.cpu_secs);
    let fuse_calls = |p: &Proxy| -> Result<u64> { Ok(p.stats()?.mount()?.counts.calls) };
    for rep in 0..reps {
        let name = format!("w{rep}");
        let _ = std::fs::remove_file(m.join(format!("{name}-nfs")));
        let _ = std::fs::remove_file(m.join(format!("{name}-fuse")));
        let fuse_first = rep % 2 == 1;
        for side in if fuse_first {
            [true, false]
        } else {
            [false, true]
        } {
            let before = cpu()?;
            if side {
                let calls = fuse_calls(&proxy)?;
                seq_write
                    .fuse
                    .push(timed_fuse_write(&src, &m.join(format!("{name}-fuse")))?);
                let t = timed_fuse_read(&m.join("read-me"))?;
                seq_read.fuse.push(t);
                let done = fuse_calls(&proxy)? - calls;
                fuse_calls_per_gib.push(done as f64 / (2.0 * mib as f64 / 1024.0));
                cpu_fuse.push(cpu()? - before);
            } else {
                seq_write
                    .nfs
                    .push(timed_nfs_write(&src, &url(&format!("{name}-nfs")))?);
                seq_read.nfs.push(timed(|| nfs_read(&url("read-me")))?);
                cpu_nfs.push(cpu()? - before);
            }
        }
        compare_files(&src, &m.join(format!("{name}-nfs")))?;
        compare_files(&src, &m.join(format!("{name}-fuse")))?;
        for (depth, times) in [(1, &mut rand1), (16, &mut rand16)] {
            let file = m.join("read-me");
            let on_mount = file.display().to_string();
            let on_nfs = qemu_url("read-me");
            times.nfs.push(qemu_bench(&on_nfs, depth, randoms)?);
            times.fuse.push(qemu_bench(&on_mount, depth, randoms)?);
        }
    }
    let status = proxy.status()?;
    let exit = proxy.terminate()?;
    if !exit.success() {
        bail!("the proxy exited {exit}: {}", proxy.output());
    }
    if mnt.is_mounted()? {
        bail!("SIGTERM left the mount behind");
    }

    let mut out = String::new();
    writeln!(
        out,
        "FUSE front end vs NFS front end, one proxy (warm write-back block cache over dir:), {mib} MiB, {reps} repetitions, load {}",
        loadavg()
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "| workload | NFS front end (median) | FUSE mount (median) | FUSE / NFS (throughput) | runs NFS | runs FUSE |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---|---|")?;
    let mbps = |secs: f64| bytes as f64 / (1 << 20) as f64 / secs;
    let list = |v: &[f64]| {
        v.iter()
            .map(|t| format!("{t:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    for (label, t) in [
        ("sequential write, 1 MiB", &seq_write),
        ("sequential read, 1 MiB", &seq_read),
    ] {
        let (n, f) = (median(&t.nfs), median(&t.fuse));
        writeln!(
            out,
            "| {label} | {n:.2} s ({:.0} MiB/s) | {f:.2} s ({:.0} MiB/s) | {:.2}x | {} | {} |",
            mbps(n),
            mbps(f),
            n / f,
            list(&t.nfs),
            list(&t.fuse)
        )?;
    }
    for (label, t) in [
        ("4 KiB random reads, depth 1", &rand1),
        ("4 KiB random reads, depth 16", &rand16),
    ] {
        let (n, f) = (median(&t.nfs), median(&t.fuse));
        let iops = |s: f64| randoms as f64 / s;
        writeln!(
            out,
            "| {label} | {n:.2} s ({:.0} reads/s, {:.0} µs each) | {f:.2} s ({:.0} reads/s, {:.0} µs each) | {:.2}x | {} | {} |",
            iops(n),
            n * 1e6 / randoms as f64,
            iops(f),
            f * 1e6 / randoms as f64,
            n / f,
            list(&t.nfs),
            list(&t.fuse)
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "Proxy CPU per repetition (write + read of {mib} MiB): NFS front end {:.2} s, FUSE {:.2} s. \
         FUSE calls down the stack per GiB moved: {:.0} (1 MiB each would be 1024). \
         Mount counters at the end: {}",
        median(&cpu_nfs),
        median(&cpu_fuse),
        median(&fuse_calls_per_gib),
        serde_json::to_string(&status.mount)?
    )?;
    Ok(out)
}

fn timed(f: impl FnOnce() -> Result<()>) -> Result<f64> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed().as_secs_f64())
}

/// `nfs-cp SRC URL`: one 1 MiB WRITE in flight, COMMIT at close.
fn timed_nfs_write(src: &Path, url: &str) -> Result<f64> {
    timed(|| {
        process::run_ok(Command::new("nfs-cp").arg(src).arg(url), TOOL_TIMEOUT)?;
        Ok(())
    })
}

/// `dd` to the mount in 1 MiB writes, with an fsync (COMMIT) at the end.
fn timed_fuse_write(src: &Path, dst: &Path) -> Result<f64> {
    timed(|| {
        process::run_ok(
            Command::new("dd")
                .arg(format!("if={}", src.display()))
                .arg(format!("of={}", dst.display()))
                .args(["bs=1M", "conv=fsync", "status=none"]),
            TOOL_TIMEOUT,
        )?;
        Ok(())
    })
}

/// `nfs-cat URL > /dev/null`.
fn nfs_read(url: &str) -> Result<()> {
    let null = File::create("/dev/null")?;
    let status = Command::new("nfs-cat")
        .arg(url)
        .stdout(Stdio::from(null))
        .status()
        .context("running nfs-cat")?;
    if !status.success() {
        bail!("nfs-cat {url} failed: {status}");
    }
    Ok(())
}

/// Drops the file's pages from the kernel's cache, then `dd`s it to
/// /dev/null in 1 MiB reads.
fn timed_fuse_read(file: &Path) -> Result<f64> {
    let f = File::open(file)?;
    // SAFETY: a valid open descriptor; the advice has no memory effects.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if r != 0 {
        bail!("posix_fadvise: {}", std::io::Error::from_raw_os_error(r));
    }
    drop(f);
    timed(|| {
        process::run_ok(
            Command::new("dd")
                .arg(format!("if={}", file.display()))
                .args(["of=/dev/null", "bs=1M", "status=none"]),
            TOOL_TIMEOUT,
        )?;
        Ok(())
    })
}

/// `qemu-img bench` of `count` 4 KiB reads, `depth` in flight, O_DIRECT.
fn qemu_bench(target: &str, depth: u32, count: u64) -> Result<f64> {
    let step = (STEP_BLOCKS * 4096).to_string();
    timed(|| {
        process::run_ok(
            Command::new("qemu-img").args([
                "bench",
                "-f",
                "raw",
                "-t",
                "none",
                "-d",
                &depth.to_string(),
                "-c",
                &count.to_string(),
                "-s",
                "4096",
                "-S",
                &step,
                target,
            ]),
            TOOL_TIMEOUT,
        )?;
        Ok(())
    })
}
