//! The file cache (files held whole by compress-and-copy) under faults,
//! through the real binaries with nfs-ganesha as the image server: a
//! write-back that would overwrite a change made at the origin, a kept
//! copy of a file changed while the proxy was down, and a full disk.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use gvfs_nfs::nfs3_types::nfs3::{
    COMMIT3args, Nfs3Result, WRITE3args, nfs_fh3, nfsstat3, stable_how,
};
use gvfs_nfs::nfs3_types::xdr_codec::Opaque;
use gvfs_nfs::{NfsReply, NfsRequest};
use gvfs_testbed::data::write_sparse_file;
use gvfs_testbed::libnfs::nfs_cat;
use gvfs_testbed::nfsclient::NfsClient;
use gvfs_testbed::proxy::gvfsctl_local as gvfsctl;
use gvfs_testbed::tmpfs::Tmpfs;
use gvfs_testbed::{Ganesha, Origin, Proxy, ProxyArgs, Site, Tier};

const MIB: u64 = 1 << 20;

/// A 4 MiB image with data in its first and last chunk and zeros between,
/// marked for compress-and-copy.
fn image(dir: &Path, name: &str, seed: u64) -> Result<PathBuf> {
    let path = dir.join(name);
    write_sparse_file(&path, 4 * MIB, seed, &[(0, MIB), (3 * MIB, MIB)])?;
    gvfsctl(&["meta", "gen", &path.display().to_string(), "--compress"])?;
    Ok(path)
}

/// How long a whole-file fetch may take.
const WAIT: Duration = Duration::from_secs(15);

/// A WRITE (FILE_SYNC unless `unstable`) of `data` at `offset`: its status.
async fn write(
    nfs: &NfsClient,
    fh: &nfs_fh3,
    offset: u64,
    data: &[u8],
    unstable: bool,
) -> Result<nfsstat3> {
    let reply = nfs
        .call(NfsRequest::Write(WRITE3args {
            file: fh.clone(),
            offset,
            count: data.len() as u32,
            stable: if unstable {
                stable_how::UNSTABLE
            } else {
                stable_how::FILE_SYNC
            },
            data: Opaque::owned(data.to_vec()),
        }))
        .await?;
    Ok(match reply {
        NfsReply::Write(Nfs3Result::Ok(_)) => nfsstat3::NFS3_OK,
        NfsReply::Write(Nfs3Result::Err((st, _))) => st,
        other => bail!("WRITE answered {other:?}"),
    })
}

async fn commit(nfs: &NfsClient, fh: &nfs_fh3) -> Result<nfsstat3> {
    let reply = nfs
        .call(NfsRequest::Commit(COMMIT3args {
            file: fh.clone(),
            offset: 0,
            count: 0,
        }))
        .await?;
    Ok(match reply {
        NfsReply::Commit(Nfs3Result::Ok(_)) => nfsstat3::NFS3_OK,
        NfsReply::Commit(Nfs3Result::Err((st, _))) => st,
        other => bail!("COMMIT answered {other:?}"),
    })
}

/// Item 6a of issue 20: the file changes at the origin after a proxy
/// fetched it whole and while it holds a client's write to it. Write-back
/// does not store the proxy's chunk over the origin's change: the origin
/// keeps its bytes, the proxy keeps (and serves) its client's, and
/// `gvfsctl writeback` fails, naming the conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_back_does_not_overwrite_a_change_made_at_the_origin() -> Result<()> {
    let site = Site::builder(Origin::Ganesha)
        .node(Tier::new().cache("16M"))
        .start_with(|origin| image(origin, "shared.raw", 41).map(drop))?;
    let src = site.origin_dir().join("shared.raw");
    let client = site.node(0)?;
    ensure!(nfs_cat(&client.url("shared.raw"))? == std::fs::read(&src)?);
    client.wait_files_complete(1, WAIT)?;

    let nfs = NfsClient::of_proxy(client, Duration::from_secs(30)).await?;
    let fh = nfs.resolve("shared.raw").await?.context("shared.raw")?;
    let ours = b"the proxy's client wrote this";
    ensure!(write(&nfs, &fh, MIB + 100, ours, false).await? == nfsstat3::NFS3_OK);
    let s = client.stats()?;
    ensure!(s.file_cache.dirty_files == 1, "not kept: {s}");
    // Meanwhile, at the origin, in the same 1 MiB chunk.
    let theirs = b"someone changed the origin";
    std::thread::sleep(Duration::from_millis(20));
    gvfs_testbed::data::write_at(&src, MIB + 500_000, theirs)?;
    let origin = std::fs::read(&src)?;

    let e = client.write_back().expect_err("the write-back went ahead");
    ensure!(format!("{e:#}").contains("conflict"), "{e:#}");
    ensure!(
        std::fs::read(&src)? == origin,
        "the origin's change was overwritten"
    );
    let s = client.stats()?;
    ensure!(
        s.file_cache.counts.write_back_conflicts == 1 && s.file_cache.dirty_files == 1,
        "{s}"
    );
    let served = nfs_cat(&client.url("shared.raw"))?;
    let at = (MIB + 100) as usize;
    ensure!(
        served[at..at + ours.len()] == ours[..],
        "the proxy lost its client's write"
    );
    ensure!(
        client.output().contains("write-back conflict"),
        "no error logged:\n{}",
        client.output()
    );
    Ok(())
}

/// Item 6c of issue 20: a LAN proxy's file cache kept across a restart is
/// checked against the origin before its first use. A FETCH of a chunk
/// past the first skips the check only for a caller checked within the
/// last 3 s; right after a restart nobody has been, so the kept copy of a
/// file changed meanwhile at the origin is not served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_file_is_checked_against_the_origin_before_its_first_use() -> Result<()> {
    use gvfs_ext::{CHUNK, ChunkSource, Class, ExtClient, FetchArgs, Want, decompress};
    use gvfs_nfs::Credentials;
    use gvfs_nfs::net::client::{ClientConfig, RpcClient, TcpConnector};
    let g = Ganesha::start()?;
    let src = image(g.export_dir(), "kept.raw", 31)?;
    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    let lan_dir = tempfile::tempdir()?;
    let mut lan = Proxy::spawn(ProxyArgs::new(server.upstream_url()).cache(lan_dir.path(), "16M"))?;
    let node_dir = tempfile::tempdir()?;
    let node = Proxy::spawn(ProxyArgs::new(lan.upstream_url()).cache(node_dir.path(), "16M"))?;
    ensure!(nfs_cat(&node.url("kept.raw"))? == std::fs::read(&src)?);
    lan.wait_files_complete(1, WAIT)?;
    drop(node);
    lan.terminate()?;
    // The image changes at the origin while the LAN proxy is down: same
    // size, other bytes in its last chunk.
    gvfs_testbed::data::write_at(&src, 3 * MIB + 100, b"changed while the LAN proxy was down")?;
    let want = std::fs::read(&src)?;

    let lan = Proxy::spawn(ProxyArgs::new(server.upstream_url()).cache(lan_dir.path(), "16M"))?;
    let s = lan.stats()?;
    ensure!(
        s.file_cache.cached_bytes == 4 * MIB,
        "the LAN proxy did not keep the file: {s}"
    );
    let give_up = Duration::from_secs(30);
    let nfs = NfsClient::of_proxy(&lan, give_up).await?;
    let fh = nfs.resolve("kept.raw").await?.context("kept.raw")?;
    let ext = ExtClient::new(RpcClient::new(
        TcpConnector { addr: lan.addr() },
        ClientConfig {
            give_up_after: Some(give_up),
            ..ClientConfig::default()
        },
    ));
    let ok = ext
        .fetch(
            &Credentials::unix(0, 0),
            &FetchArgs {
                fh: fh.data.to_vec(),
                offset: 3 * MIB,
                count: CHUNK,
                have: None,
            },
            &Want::local(Class::Background),
        )
        .await?;
    let got = decompress(ok).map_err(anyhow::Error::msg)?;
    ensure!(
        got[..] == want[3 * MIB as usize..],
        "the LAN proxy served its restored copy of a file changed at the origin"
    );
    Ok(())
}

/// Item 10 of issue 20 (the file cache's part): the disk of the file
/// cache's directory fills up under a WRITE into a file held whole. The
/// client is told NFS3ERR_NOSPC (nothing is kept of that WRITE, nothing
/// goes upstream), what it committed before stays, reads go on, and once
/// there is room again writes are kept and written back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_file_cache_disk_answers_nospc_and_recovers() -> Result<()> {
    let g = Ganesha::start()?;
    let src = image(g.export_dir(), "full.raw", 51)?;
    let mut want = std::fs::read(&src)?;
    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    let cache = tempfile::tempdir()?;
    // The file cache's directory, on an 8 MiB disk of its own.
    let files = cache.path().join("files");
    let tmpfs = Tmpfs::mount_at(&files, "8m")?;
    let client = Proxy::spawn(ProxyArgs::new(server.upstream_url()).cache(cache.path(), "16M"))?;
    ensure!(nfs_cat(&client.url("full.raw"))? == want);
    client.wait_files_complete(1, WAIT)?;
    let nfs = NfsClient::of_proxy(&client, Duration::from_secs(30)).await?;
    let fh = nfs.resolve("full.raw").await?.context("full.raw")?;

    // Committed before the disk fills: in a chunk of data (in place).
    let early = b"committed before the disk filled";
    ensure!(write(&nfs, &fh, 1000, early, true).await? == nfsstat3::NFS3_OK);
    ensure!(commit(&nfs, &fh).await? == nfsstat3::NFS3_OK);
    want[1000..1000 + early.len()].copy_from_slice(early);

    tmpfs.fill()?;
    // Into a chunk of zeros (a hole in the cached file): needs new blocks.
    let hole = 2 * MIB as usize;
    let late = vec![0xc3u8; 256 * 1024];
    let st = write(&nfs, &fh, hole as u64, &late, true).await?;
    ensure!(
        st == nfsstat3::NFS3ERR_NOSPC,
        "a WRITE onto a full disk answered {st:?}"
    );
    // Reads go on, with the committed write and nothing of the refused one
    // (its range still reads as it was, zeros).
    let served = nfs_cat(&client.url("full.raw"))?;
    ensure!(served == want, "reads on a full disk are wrong");
    ensure!(
        std::fs::read(&src)? != want,
        "the writes went upstream instead of staying in the file cache"
    );

    // Room again: the client's retry is kept, and everything written back.
    tmpfs.unfill()?;
    ensure!(write(&nfs, &fh, hole as u64, &late, false).await? == nfsstat3::NFS3_OK);
    ensure!(commit(&nfs, &fh).await? == nfsstat3::NFS3_OK);
    want[hole..hole + late.len()].copy_from_slice(&late);
    ensure!(nfs_cat(&client.url("full.raw"))? == want, "after recovery");
    client.write_back()?;
    ensure!(
        std::fs::read(&src)? == want,
        "the origin does not hold the writes after write-back"
    );
    drop(client);
    drop(tmpfs);
    Ok(())
}

/// Issue 37 (a crash keeps what was fetched): a LAN proxy killed -9
/// halfway through fetching an image across a slow WAN keeps the pieces
/// that had arrived. Started again on the same cache, the next fetch of
/// the same version fetches only the rest, and every byte is right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lan_proxy_killed_halfway_through_a_fetch_keeps_what_had_arrived() -> Result<()> {
    use gvfs_nfs::nfs3_types::nfs3::READ3args;
    use gvfs_wanlink::{LinkConfig, WanLink};
    const SIZE: u64 = 24 * MIB;
    let g = Ganesha::start()?;
    let src = g.export_dir().join("half.raw");
    // Random bytes: they cross the WAN at its rate, whatever zstd does.
    write_sparse_file(&src, SIZE, 41, &[(0, SIZE)])?;
    gvfsctl(&["meta", "gen", &src.display().to_string(), "--compress"])?;
    let want = std::fs::read(&src)?;
    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    // 20 Mbit/s: the image takes about 10 s to cross.
    let link = WanLink::start(
        "127.0.0.1:0".parse()?,
        server.addr(),
        LinkConfig::from_rtt(Duration::from_millis(10), Some(20_000_000)),
    )
    .await?;
    let upstream = server.upstream_url_at(link.local_addr());
    let dir = tempfile::tempdir()?;
    let mut lan = Proxy::spawn(ProxyArgs::new(upstream.clone()).cache(dir.path(), "64M"))?;

    // One READ starts the whole file's fetch; the kill comes once a
    // quarter of it has arrived, well before the end.
    let nfs = NfsClient::of_proxy(&lan, Duration::from_secs(30)).await?;
    let fh = nfs.resolve("half.raw").await?.context("half.raw")?;
    nfs.call(NfsRequest::Read(READ3args {
        file: fh,
        offset: 0,
        count: 4096,
    }))
    .await?;
    let deadline = std::time::Instant::now() + WAIT;
    let arrived = loop {
        let got = lan.stats()?.file_cache.counts.raw_bytes;
        if got >= SIZE / 4 {
            break got;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "only {got} bytes arrived"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    drop(nfs);
    lan.kill();
    ensure!(arrived < SIZE, "the whole file arrived before the kill");

    let lan = Proxy::spawn(ProxyArgs::new(upstream).cache(dir.path(), "64M"))?;
    let kept = lan.stats()?.file_cache.counts;
    ensure!(
        kept.kept_files == 1 && kept.kept_bytes > 0,
        "nothing kept of the file cut short: {kept:?}"
    );
    ensure!(
        nfs_cat(&lan.url("half.raw"))? == want,
        "wrong bytes after the restart"
    );
    let done = lan.wait_files_complete(1, Duration::from_secs(60))?;
    let c = &done.file_cache.counts;
    // Only what had not been recorded crossed again.
    ensure!(
        c.raw_bytes + c.kept_bytes <= SIZE && c.refetched_bytes == 0 && c.kept_bad_pieces == 0,
        "after the restart {} bytes fetched, {} kept, {} fetched again, {} bad, of {SIZE}",
        c.raw_bytes,
        c.kept_bytes,
        c.refetched_bytes,
        c.kept_bad_pieces
    );
    Ok(())
}
