//! Restart: every proxy of a chain, and the `dir:` origin, is killed and
//! started again on the same address in the middle of a workload. The
//! client keeps the handles it has and finishes, as NFS clients expect of a
//! server that reboots: handles stay valid, calls are resent after the
//! reconnect, and a changed write verifier makes the client resend
//! uncommitted data.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use gvfs_nfs::NfsRequest;
use gvfs_nfs::nfs3_types::nfs3::*;
use gvfs_testbed::data::random_bytes_at;
use gvfs_testbed::libnfs::nfs_cp;
use gvfs_testbed::nfsclient::NfsClient;
use gvfs_testbed::{Ganesha, Proxy, ProxyArgs};

const CHUNK: usize = 256 * 1024;

/// Kills `p` and starts the same proxy again on the same address.
fn restart(p: &mut Proxy, upstream: &str) -> Result<()> {
    let addr = p.addr();
    p.kill();
    *p = Proxy::spawn(ProxyArgs::new(upstream.to_string()).listen(addr))
        .with_context(|| format!("restarting the proxy on {addr}"))?;
    Ok(())
}

async fn write(c: &NfsClient, fh: &nfs_fh3, offset: u64, stable: stable_how) -> Result<writeverf3> {
    c.write(fh, offset, &random_bytes_at(5, offset, CHUNK), stable)
        .await
}

fn expected(chunks: usize) -> Vec<u8> {
    random_bytes_at(5, 0, chunks * CHUNK)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_proxy_of_a_chain_restarts_under_a_writing_client() -> Result<()> {
    let g = Ganesha::start()?;
    let mut inner = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    let mut middle = Proxy::spawn(ProxyArgs::new(inner.upstream_url()))?;
    let mut outer = Proxy::spawn(ProxyArgs::new(middle.upstream_url()))?;
    let (up_inner, up_middle, up_outer) = (
        g.upstream_url(),
        inner.upstream_url(),
        middle.upstream_url(),
    );
    let c = NfsClient::of_proxy(&outer, Duration::from_secs(60)).await?;
    let fh = c.create("restart.bin").await?;
    let chunks = 96;
    for i in 0..chunks {
        match i {
            20 => restart(&mut outer, &up_outer)?,
            40 => restart(&mut middle, &up_middle)?,
            60 => restart(&mut inner, &up_inner)?,
            80 => {
                // All three at once.
                restart(&mut inner, &up_inner)?;
                restart(&mut middle, &up_middle)?;
                restart(&mut outer, &up_outer)?;
            }
            _ => {}
        }
        write(&c, &fh, (i * CHUNK) as u64, stable_how::FILE_SYNC)
            .await
            .with_context(|| format!("chunk {i}"))?;
    }
    ensure!(
        std::fs::read(g.export_dir().join("restart.bin"))? == expected(chunks),
        "file at ganesha differs"
    );
    // The handle from before all restarts still reads.
    let r = c
        .call(NfsRequest::Read(READ3args {
            file: fh.clone(),
            offset: 0,
            count: 4096,
        }))
        .await?;
    ensure!(
        r.status() == nfsstat3::NFS3_OK,
        "old handle: {:?}",
        r.status()
    );
    Ok(())
}

/// The dir: origin restarts with unstable data outstanding: its write
/// verifier changes, so the client (like any NFSv3 client) writes the
/// uncommitted range again; handles issued before the restart stay valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dir_origin_restart_changes_the_verifier_and_keeps_handles() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let origin_url = format!("dir:{}", dir.path().display());
    let mut origin = Proxy::spawn(ProxyArgs::new(origin_url.clone()))?;
    let front = Proxy::spawn(ProxyArgs::new(origin.upstream_url()))?;
    let c = NfsClient::of_proxy(&front, Duration::from_secs(60)).await?;
    let fh = c.create("unstable.bin").await?;
    let chunks = 32;
    let mut uncommitted = Vec::new();
    let mut verf = None;
    let mut rewrites = 0;
    let mut i = 0;
    while i < chunks {
        if i == 16 && rewrites == 0 {
            restart(&mut origin, &origin_url)?;
        }
        let v = write(&c, &fh, (i * CHUNK) as u64, stable_how::UNSTABLE).await?;
        uncommitted.push(i);
        if i % 8 == 7 {
            let cv = c.commit(&fh).await?;
            let changed = verf.is_some_and(|old: writeverf3| old != cv) || cv != v;
            if changed {
                // The server may have lost the unstable writes: send them again.
                rewrites += 1;
                for j in std::mem::take(&mut uncommitted) {
                    write(&c, &fh, (j * CHUNK) as u64, stable_how::UNSTABLE).await?;
                    uncommitted.push(j);
                }
                let again = c.commit(&fh).await?;
                verf = Some(again);
            } else {
                verf = Some(cv);
            }
            uncommitted.clear();
        }
        i += 1;
    }
    ensure!(
        rewrites >= 1,
        "the verifier did not change across the origin restart"
    );
    ensure!(
        std::fs::read(dir.path().join("unstable.bin"))? == expected(chunks),
        "file at the origin differs"
    );
    let r = c
        .call(NfsRequest::Getattr(GETATTR3args { object: fh }))
        .await?;
    ensure!(
        r.status() == nfsstat3::NFS3_OK,
        "old handle after restart: {:?}",
        r.status()
    );
    Ok(())
}

/// A large `nfs-cp` (libnfs, a real client) through a chain finishes with
/// the right bytes while the proxy in the middle, and then the one the
/// client talks to, are killed and restarted.
#[test]
fn nfs_cp_survives_proxy_restarts_mid_copy() -> Result<()> {
    let g = Ganesha::start()?;
    let inner = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    let mut middle = Proxy::spawn(ProxyArgs::new(inner.upstream_url()))?;
    let mut outer = Proxy::spawn(ProxyArgs::new(middle.upstream_url()))?;
    let (up_middle, up_outer) = (inner.upstream_url(), middle.upstream_url());
    let local = tempfile::tempdir()?;
    let src = local.path().join("big.bin");
    gvfs_testbed::data::write_random_file(&src, 11, 512 << 20)?;
    let (s, dst) = (src.display().to_string(), outer.url("big.bin"));
    let copier = std::thread::spawn(move || nfs_cp(&s, &dst));
    std::thread::sleep(Duration::from_millis(200));
    ensure!(
        !copier.is_finished(),
        "the copy ended before the first restart"
    );
    restart(&mut middle, &up_middle)?;
    std::thread::sleep(Duration::from_millis(200));
    ensure!(
        !copier.is_finished(),
        "the copy ended before the second restart"
    );
    restart(&mut outer, &up_outer)?;
    copier
        .join()
        .map_err(|_| anyhow::anyhow!("copier panicked"))??;
    gvfs_testbed::data::compare_files(&src, &g.export_dir().join("big.bin"))
}
