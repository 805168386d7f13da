//! Nothing wrong is served or written back by the block cache, through the
//! real binary with nfs-ganesha as the origin: bytes that rot in a bank
//! file while the proxy is stopped, a bank file deleted, dirty data of a
//! crashed proxy written back as its writer (through a server that squashes
//! root), and a full disk under the cache directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use gvfs_nfs::Credentials;
use gvfs_nfs::nfs3_types::nfs3::stable_how;
use gvfs_testbed::data::{random_bytes_at, write_random_file};
use gvfs_testbed::libnfs::{nfs_cat, nfs_cp};
use gvfs_testbed::nfsclient::NfsClient;
use gvfs_testbed::tmpfs::Tmpfs;
use gvfs_testbed::{Ganesha, Proxy, ProxyArgs, Squash};

const KIB: usize = 1024;
const MIB: u64 = 1 << 20;

fn bank_files(cache: &Path) -> Result<Vec<PathBuf>> {
    let mut banks: Vec<PathBuf> = std::fs::read_dir(cache)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gvfs"))
        .collect();
    banks.sort();
    Ok(banks)
}

/// Flips a byte inside the cached copy of `sub_block` (4 KiB of a file,
/// as the cache keeps it at a 4 KiB-aligned place of a bank file); returns
/// the bank file.
fn rot(cache: &Path, sub_block: &[u8]) -> Result<PathBuf> {
    for bank in bank_files(cache)? {
        let mut bytes = std::fs::read(&bank)?;
        let at = (0..bytes.len() / 4096)
            .map(|i| i * 4096)
            .find(|&i| bytes[i..i + 4096] == *sub_block);
        if let Some(at) = at {
            bytes[at + 100] ^= 0x5a;
            std::fs::write(&bank, &bytes)?;
            return Ok(bank);
        }
    }
    bail!("the sub-block is in no bank file of {}", cache.display())
}

#[test]
fn rotten_clean_bytes_are_fetched_again_not_served() -> Result<()> {
    let g = Ganesha::start()?;
    let cache = tempfile::tempdir()?;
    let image = g.export_dir().join("img.bin");
    write_random_file(&image, 21, 2 * MIB)?;
    let want = std::fs::read(&image)?;
    let mut p = Proxy::spawn(ProxyArgs::new(g.upstream_url()).cache(cache.path(), "16M"))?;
    ensure!(nfs_cat(&p.url("img.bin"))? == want, "first read");
    // Stopped cleanly, so the next start does not check the banks.
    p.terminate()?;
    rot(cache.path(), &want[64 * KIB..68 * KIB])?;
    let p = Proxy::spawn(ProxyArgs::new(g.upstream_url()).cache(cache.path(), "16M"))?;
    ensure!(
        nfs_cat(&p.url("img.bin"))? == want,
        "a byte that rotted in the cache was served"
    );
    let stats = p.stats()?;
    ensure!(stats.cache.corrupt_clean_dropped == 1, "{stats}");
    ensure!(stats.cache.verifier_changes == 0, "{stats}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotten_dirty_bytes_are_not_written_back_and_clients_are_told() -> Result<()> {
    let g = Ganesha::start()?;
    let cache = tempfile::tempdir()?;
    let mut p = Proxy::spawn(
        ProxyArgs::new(g.upstream_url())
            .cache(cache.path(), "16M")
            .no_writeback_on_exit(),
    )?;
    let c = NfsClient::of_proxy(&p, Duration::from_secs(30)).await?;
    let fh = c.create("dirty.bin").await?;
    let data = random_bytes_at(22, 0, 256 * KIB);
    c.write(&fh, 0, &data, stable_how::UNSTABLE).await?;
    let before = c.commit(&fh).await?;
    p.terminate()?;
    let rotten = 128 * KIB..132 * KIB;
    rot(cache.path(), &data[rotten.clone()])?;
    let p = Proxy::spawn(
        ProxyArgs::new(g.upstream_url())
            .cache(cache.path(), "16M")
            .no_writeback_on_exit(),
    )?;
    let c = NfsClient::of_proxy(&p, Duration::from_secs(30)).await?;
    let fh = c.resolve("dirty.bin").await?.context("dirty.bin")?;
    // Writing back finds the rotten sub-block and leaves it out.
    p.write_back()?;
    let after = c.commit(&fh).await?;
    ensure!(
        after.0 != before.0,
        "the verifier did not change: a client would not resend"
    );
    let origin = std::fs::read(g.export_dir().join("dirty.bin"))?;
    ensure!(
        origin.len() == data.len(),
        "origin has {} bytes",
        origin.len()
    );
    ensure!(origin[..rotten.start] == data[..rotten.start]);
    ensure!(origin[rotten.end..] == data[rotten.end..]);
    ensure!(
        origin[rotten.clone()].iter().all(|&b| b == 0),
        "rotten bytes reached the origin (it never had that range: a hole)"
    );
    let stats = p.stats()?;
    ensure!(stats.cache.dirty_sub_blocks_lost == 1, "{stats}");
    let kept = std::fs::read_dir(cache.path().join("quarantine"))?.count();
    ensure!(kept == 1, "{kept} files set aside");
    ensure!(
        p.output().contains("failed its checksum"),
        "nothing logged:\n{}",
        p.output()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_bank_file_changes_the_verifier_and_is_reported() -> Result<()> {
    let g = Ganesha::start()?;
    let cache = tempfile::tempdir()?;
    let mut p = Proxy::spawn(
        ProxyArgs::new(g.upstream_url())
            .cache(cache.path(), "16M")
            .no_writeback_on_exit(),
    )?;
    let c = NfsClient::of_proxy(&p, Duration::from_secs(30)).await?;
    let fh = c.create("spread.bin").await?;
    // 2 MiB in 64 KiB blocks lands in every bank.
    let data = random_bytes_at(23, 0, 2 << 20);
    for (i, chunk) in data.chunks(1 << 20).enumerate() {
        c.write(&fh, (i << 20) as u64, chunk, stable_how::UNSTABLE)
            .await?;
    }
    let before = c.commit(&fh).await?;
    p.terminate()?;
    let banks = bank_files(cache.path())?;
    ensure!(banks.len() > 1, "{banks:?}");
    std::fs::remove_file(&banks[1])?;
    let p = Proxy::spawn(
        ProxyArgs::new(g.upstream_url())
            .cache(cache.path(), "16M")
            .no_writeback_on_exit(),
    )?;
    let c = NfsClient::of_proxy(&p, Duration::from_secs(30)).await?;
    let fh = c.resolve("spread.bin").await?.context("spread.bin")?;
    let after = c.commit(&fh).await?;
    ensure!(
        after.0 != before.0,
        "verifier unchanged after losing a bank"
    );
    let stats = p.stats()?;
    ensure!(stats.cache.banks_lost == 1, "{stats}");
    ensure!(
        p.output().contains("bank files of this cache are missing"),
        "not reported:\n{}",
        p.output()
    );
    Ok(())
}

/// Dirty data recovered after a kill -9 is written back as the user who
/// wrote it: through a server that squashes root, root could not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovered_dirty_data_is_written_back_as_its_writer() -> Result<()> {
    let g = Ganesha::start_with(Squash::Root)?;
    let cache = tempfile::tempdir()?;
    // Owned by uid 1000, writable by it alone (the directory too: not by
    // the anonymous user root is squashed to).
    let name = "mine.bin";
    let path = g.export_dir().join(name);
    write_random_file(&path, 24, 512 * KIB as u64)?;
    for p in [g.export_dir(), path.as_path()] {
        std::os::unix::fs::chown(p, Some(1000), Some(1000))?;
    }
    let user = Credentials::unix(1000, 1000);
    for (round, keep_record) in [(0u64, true), (1, false)] {
        let mut p = Proxy::spawn(
            ProxyArgs::new(g.upstream_url())
                .cache(cache.path(), "16M")
                .no_writeback_on_exit(),
        )?;
        let a = p.addr();
        let c = NfsClient::mount(a, a, p.export(), user.clone(), Duration::from_secs(30)).await?;
        let fh = c.resolve(name).await?.context(name)?;
        let data = random_bytes_at(25 + round, 0, 128 * KIB);
        c.write(&fh, 0, &data, stable_how::UNSTABLE).await?;
        c.commit(&fh).await?;
        p.kill();
        if !keep_record {
            // Without the record, the file's owner writes it back.
            std::fs::remove_file(cache.path().join("writers"))?;
        }
        let p = Proxy::spawn(
            ProxyArgs::new(g.upstream_url())
                .cache(cache.path(), "16M")
                .no_writeback_on_exit(),
        )?;
        p.write_back().context("write-back after the crash")?;
        let origin = std::fs::read(&path)?;
        ensure!(
            origin[..data.len()] == data[..],
            "round {round}: the recovered data did not reach the origin\n{}",
            p.output()
        );
    }
    Ok(())
}

/// The cache directory's disk fills up: the banks' space was reserved at
/// start, so writes into the cache still succeed, reads are served, and
/// write-back delivers everything. A cache that does not fit is refused at
/// start, not when a write finds no room.
#[test]
fn a_full_disk_under_the_cache_loses_nothing() -> Result<()> {
    let g = Ganesha::start()?;
    let disk = Tmpfs::mount("40m")?;
    let cache = disk.path().join("cache");
    let too_big = Proxy::spawn(ProxyArgs::new(g.upstream_url()).cache(&cache, "64M"));
    match too_big {
        Ok(p) => bail!("a 64 MiB cache started on a 40 MiB disk\n{}", p.output()),
        Err(e) => ensure!(format!("{e:#}").contains("no room"), "{e:#}"),
    }
    let p = Proxy::spawn(ProxyArgs::new(g.upstream_url()).cache(&cache, "16M"))?;
    disk.fill()?;
    let local = tempfile::tempdir()?;
    let src = local.path().join("big.bin");
    write_random_file(&src, 26, 6 * MIB)?;
    nfs_cp(&src.display().to_string(), &p.url("big.bin"))?;
    let want = std::fs::read(&src)?;
    ensure!(nfs_cat(&p.url("big.bin"))? == want, "read back");
    p.write_back()?;
    ensure!(
        std::fs::read(g.export_dir().join("big.bin"))? == want,
        "write-back from a cache on a full disk"
    );
    Ok(())
}
