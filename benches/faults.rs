//! Fault trials of the block cache through the real binary, with
//! nfs-ganesha as the origin, counting what a user would lose:
//!
//! - **crash**: a client writes 64 KiB chunks UNSTABLE and COMMITs every
//!   fourth while the proxy is killed (SIGKILL) at a random moment; every
//!   other trial the restarted proxy is killed again in the middle of its
//!   write-back. After a last restart and write-back, every committed byte
//!   must be at the origin.
//! - **corruption**: a file read through the proxy (cached clean) and one
//!   written and committed through it (cached dirty); the proxy is stopped
//!   (SIGTERM or SIGKILL, in turn) and random bytes of its bank files are
//!   flipped (in pages that hold anything: headers, tags, data). After a
//!   restart both files are read through the proxy and written back: a byte
//!   served or written back that is neither the right one nor the origin's
//!   old one is wrong. Dirty bytes lost must have been reported (a changed
//!   verifier, `dirty_sub_blocks_lost`).
//! - **disk-full**: the cache directory's tmpfs is filled; a client copies a
//!   file in, reads it back, and it is written back.
//!
//! `cargo bench --bench faults` (100 trials each); `GVFS_FAULT_TRIALS=N`
//! and `GVFS_FAULT_PARTS=crash,corruption,disk-full` change that. Needs
//! root (ganesha's portmapper, the tmpfs).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use gvfs_nfs::nfs3_types::nfs3::{nfs_fh3, stable_how};
use gvfs_testbed::bench::{env_u64, loadavg};
use gvfs_testbed::data::{random_bytes_at, write_random_file};
use gvfs_testbed::libnfs::{nfs_cat, nfs_cp};
use gvfs_testbed::nfsclient::NfsClient;
use gvfs_testbed::tmpfs::Tmpfs;
use gvfs_testbed::{Ganesha, Proxy, ProxyArgs};
use rand::{Rng, SeedableRng};

const CHUNK: usize = 64 << 10;

/// A proxy with a 64 MiB block cache in `dir` in front of `g`, which
/// leaves dirty data in the cache on SIGTERM when `keep_dirty`.
fn cached(g: &Ganesha, dir: &Path, keep_dirty: bool) -> Result<Proxy> {
    let args = ProxyArgs::new(g.upstream_url()).cache(dir, "64M");
    Proxy::spawn(if keep_dirty {
        args.no_writeback_on_exit()
    } else {
        args
    })
}

fn main() -> Result<()> {
    let bench = std::env::args().any(|a| a == "--bench");
    let trials = env_u64("GVFS_FAULT_TRIALS", if bench { 100 } else { 3 })?;
    let parts =
        std::env::var("GVFS_FAULT_PARTS").unwrap_or_else(|_| "crash,corruption,disk-full".into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let g = Ganesha::start().context("starting nfs-ganesha")?;
    println!("faults: {trials} trials per part; load {}", loadavg());
    let started = Instant::now();
    if parts.contains("crash") {
        rt.block_on(crash(&g, trials))?;
    }
    if parts.contains("corruption") {
        rt.block_on(corruption(&g, trials))?;
    }
    if parts.contains("disk-full") {
        disk_full(&g)?;
    }
    println!(
        "done in {:.0} s; load {}",
        started.elapsed().as_secs_f64(),
        loadavg()
    );
    Ok(())
}

/// Writes chunks from `first` on, COMMITting every fourth, until `chunks`
/// or an error (the proxy died); returns how many were committed.
async fn write_until_killed(c: &NfsClient, fh: &nfs_fh3, seed: u64, chunks: u64) -> u64 {
    let mut committed = 0;
    for i in 0..chunks {
        let data = random_bytes_at(seed, i * CHUNK as u64, CHUNK);
        if c.write(fh, i * CHUNK as u64, &data, stable_how::UNSTABLE)
            .await
            .is_err()
        {
            return committed;
        }
        if i % 4 == 3 {
            match c.commit(fh).await {
                Ok(_) => committed = i + 1,
                Err(_) => return committed,
            }
        }
    }
    committed
}

async fn crash(g: &Ganesha, trials: u64) -> Result<()> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let (mut committed_bytes, mut lost_bytes, mut kills) = (0u64, 0u64, 0u64);
    let mut verifier_changes = 0u64;
    for trial in 0..trials {
        let cache = tempfile::tempdir()?;
        let mut p = cached(g, cache.path(), true)?;
        let c = NfsClient::of_proxy(&p, Duration::from_secs(2)).await?;
        let name = format!("crash-{trial}.bin");
        let fh = c.create(&name).await?;
        let seed = 1000 + trial;
        let writer = tokio::spawn({
            let (c, fh) = (c.clone(), fh.clone());
            async move { write_until_killed(&c, &fh, seed, 512).await }
        });
        tokio::time::sleep(Duration::from_millis(rng.gen_range(5..400))).await;
        p.kill();
        kills += 1;
        let committed = writer.await?;
        let mut p = cached(g, cache.path(), false)?;
        if trial % 2 == 1 {
            // Killed again, in the middle of writing back.
            let ctl = p.control_path().to_path_buf();
            let wb = std::process::Command::new(gvfs_testbed::proxy::gvfsctl_binary()?)
                .arg("--control")
                .arg(&ctl)
                .args(["writeback", "--wait"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()?;
            std::thread::sleep(Duration::from_millis(rng.gen_range(1..60)));
            p.kill();
            kills += 1;
            let _ = wb.wait_with_output();
            p = cached(g, cache.path(), false)?;
        }
        verifier_changes += p.stats()?.cache.verifier_changes;
        p.write_back()
            .with_context(|| format!("trial {trial}: write-back after the crash"))?;
        let want = committed as usize * CHUNK;
        let upstream = std::fs::read(g.export_dir().join(&name))?;
        let expected = random_bytes_at(seed, 0, want);
        let lost = (0..want)
            .filter(|&i| upstream.get(i) != Some(&expected[i]))
            .count() as u64;
        committed_bytes += want as u64;
        lost_bytes += lost;
        std::fs::remove_file(g.export_dir().join(&name))?;
    }
    println!("\n| crash part | value |\n|---|---:|");
    println!("| trials | {trials} |");
    println!("| kill -9 of the proxy (half of them during write-back) | {kills} |");
    println!("| bytes committed by the client | {committed_bytes} |");
    println!("| committed bytes lost | **{lost_bytes}** |");
    println!("| restarts that changed the write verifier | {verifier_changes} |");
    ensure!(lost_bytes == 0, "{lost_bytes} committed bytes lost");
    Ok(())
}

/// Flips one random byte in each of `count` random pages (4 KiB) of the
/// bank files that hold anything; returns how many were flipped.
fn flip_random(cache: &Path, count: usize, rng: &mut impl Rng) -> Result<usize> {
    let mut pages = Vec::new();
    let mut banks = Vec::new();
    for e in std::fs::read_dir(cache)? {
        let path = e?.path();
        if path.extension().is_some_and(|x| x == "gvfs") {
            let bytes = std::fs::read(&path)?;
            for (i, page) in bytes.chunks(4096).enumerate() {
                if page.iter().any(|&b| b != 0) {
                    pages.push((banks.len(), i * 4096));
                }
            }
            banks.push((path, bytes));
        }
    }
    let mut flipped = 0;
    for _ in 0..count.min(pages.len()) {
        let (b, at) = pages[rng.gen_range(0..pages.len())];
        let pos = at + rng.gen_range(0..4096);
        let bytes = &mut banks[b].1;
        if pos < bytes.len() {
            bytes[pos] ^= 1 << rng.gen_range(0..8);
            flipped += 1;
        }
    }
    for (path, bytes) in banks {
        std::fs::write(path, bytes)?;
    }
    Ok(flipped)
}

/// Bytes of `got` that are neither `want` nor the origin's `old` (zeros).
fn wrong(got: &[u8], want: &[u8]) -> u64 {
    (0..want.len().max(got.len()))
        .filter(|&i| {
            let g = got.get(i).copied().unwrap_or(0);
            g != want.get(i).copied().unwrap_or(0) && g != 0
        })
        .count() as u64
}

async fn corruption(g: &Ganesha, trials: u64) -> Result<()> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let (mut flips, mut wrong_served, mut wrong_written) = (0u64, 0u64, 0u64);
    let (mut lost_bytes, mut unreported, mut dropped, mut dirty_lost) = (0u64, 0u64, 0u64, 0u64);
    for trial in 0..trials {
        let cache = tempfile::tempdir()?;
        let clean_name = format!("clean-{trial}.bin");
        let dirty_name = format!("dirty-{trial}.bin");
        let clean_path = g.export_dir().join(&clean_name);
        write_random_file(&clean_path, 3000 + trial, 4 << 20)?;
        let clean = std::fs::read(&clean_path)?;
        let mut p = cached(g, cache.path(), true)?;
        ensure!(nfs_cat(&p.url(&clean_name))? == clean, "first read");
        let c = NfsClient::of_proxy(&p, Duration::from_secs(30)).await?;
        let fh = c.create(&dirty_name).await?;
        let dirty = random_bytes_at(4000 + trial, 0, 4 << 20);
        for (i, chunk) in dirty.chunks(1 << 20).enumerate() {
            c.write(&fh, (i << 20) as u64, chunk, stable_how::UNSTABLE)
                .await?;
        }
        let before = c.commit(&fh).await?;
        if trial % 2 == 0 {
            p.terminate()?;
        } else {
            p.kill();
        }
        flips += flip_random(cache.path(), rng.gen_range(1..=8), &mut rng)? as u64;
        let p = cached(g, cache.path(), true)?;
        wrong_served += wrong(&nfs_cat(&p.url(&clean_name))?, &clean);
        wrong_served += wrong(&nfs_cat(&p.url(&dirty_name))?, &dirty);
        let c = NfsClient::of_proxy(&p, Duration::from_secs(30)).await?;
        let fh = c.resolve(&dirty_name).await?.context("dirty file")?;
        p.write_back()?;
        let after = c.commit(&fh).await?;
        let origin = std::fs::read(g.export_dir().join(&dirty_name))?;
        wrong_written += wrong(&origin, &dirty);
        let lost = (0..dirty.len())
            .filter(|&i| origin.get(i) != Some(&dirty[i]))
            .count() as u64;
        let stats = p.stats()?.cache;
        lost_bytes += lost;
        dropped += stats.corrupt_clean_dropped;
        dirty_lost += stats.dirty_sub_blocks_lost;
        if lost > 0 && after.0 == before.0 {
            unreported += 1;
        }
        ensure!(
            std::fs::read(&clean_path)? == clean,
            "trial {trial}: the clean file changed at the origin"
        );
        for name in [&clean_name, &dirty_name] {
            std::fs::remove_file(g.export_dir().join(name))?;
        }
    }
    println!("\n| corruption part | value |\n|---|---:|");
    println!("| trials (half after SIGTERM, half after kill -9) | {trials} |");
    println!("| bytes flipped in bank files | {flips} |");
    println!("| wrong bytes served | **{wrong_served}** |");
    println!("| wrong bytes written back | **{wrong_written}** |");
    println!("| clean sub-blocks dropped and fetched again | {dropped} |");
    println!("| dirty sub-blocks lost (reported) | {dirty_lost} |");
    println!("| dirty bytes not at the origin | {lost_bytes} |");
    println!("| trials that lost dirty bytes with the verifier unchanged | **{unreported}** |");
    ensure!(
        wrong_served == 0 && wrong_written == 0 && unreported == 0,
        "wrong bytes or an unreported loss"
    );
    Ok(())
}

fn disk_full(g: &Ganesha) -> Result<()> {
    let disk = Tmpfs::mount("96m")?;
    let cache = disk.path().join("cache");
    let p = cached(g, &cache, false)?;
    let filled = disk.fill()?;
    let local = tempfile::tempdir()?;
    let src = local.path().join("full.bin");
    write_random_file(&src, 5000, 48 << 20)?;
    let t = Instant::now();
    nfs_cp(&src.display().to_string(), &p.url("full.bin"))?;
    let copy = t.elapsed();
    let want = std::fs::read(&src)?;
    let served = nfs_cat(&p.url("full.bin"))?;
    p.write_back()?;
    let origin = std::fs::read(g.export_dir().join("full.bin"))?;
    let lost = (0..want.len())
        .filter(|&i| origin.get(i) != Some(&want[i]))
        .count();
    println!("\n| disk-full part | value |\n|---|---:|");
    println!("| tmpfs filled after the proxy started | {filled} bytes |");
    println!(
        "| written through the proxy onto the full disk | {} bytes in {:.2} s |",
        want.len(),
        copy.as_secs_f64()
    );
    println!(
        "| read back wrong | **{}** |",
        wrong(&served, &want) + (served.len() != want.len()) as u64
    );
    println!("| bytes lost after write-back | **{lost}** |");
    ensure!(lost == 0 && served == want, "data lost on a full disk");
    std::fs::remove_file(g.export_dir().join("full.bin"))?;
    Ok(())
}
