//! The block cache through the real binary, with libnfs and nfs-ganesha:
//! write-back and `gvfsctl writeback`, crashes after COMMIT, eviction in a
//! tiny cache, coherence with the origin, a warm restart, signals, and the
//! metrics endpoint.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use gvfs_nfs::NfsRequest;
use gvfs_nfs::nfs3_types::nfs3::*;
use gvfs_nfs::nfs3_types::xdr_codec::Opaque;
use gvfs_testbed::data::{compare_file_with, compare_files, random_bytes_at, write_random_file};
use gvfs_testbed::libnfs::{nfs_cat, nfs_cp};
use gvfs_testbed::nfsclient::NfsClient;
use gvfs_testbed::{Ganesha, Proxy, ProxyArgs};

const MIB: u64 = 1 << 20;

#[test]
fn write_back_reaches_ganesha_only_on_writeback_and_byte_identical() -> Result<()> {
    let g = Ganesha::start()?;
    let cache = tempfile::tempdir()?;
    let p = Proxy::spawn(ProxyArgs::new(g.upstream_url()).cache_dir(cache.path()))?;
    let local = tempfile::tempdir()?;
    let src = local.path().join("img.bin");
    write_random_file(&src, 1, 24 * MIB + 4095)?;
    nfs_cp(&src.display().to_string(), &p.url("img.bin"))?;
    let upstream = g.export_dir().join("img.bin");
    let before = std::fs::metadata(&upstream)?.len();
    ensure!(
        before < 24 * MIB,
        "data reached ganesha before write-back ({before} bytes)"
    );
    ensure!(
        p.stats()?.cache.dirty_bytes > 0,
        "nothing dirty after the copy"
    );
    // The client reads its own writes back from the cache meanwhile.
    let back = local.path().join("back.bin");
    nfs_cp(&p.url("img.bin"), &back.display().to_string())?;
    compare_files(&src, &back)?;
    let said = p.write_back()?;
    ensure!(said.contains("done"), "gvfsctl said {said:?}");
    compare_files(&src, &upstream).context("upstream after write-back")?;
    ensure!(
        p.stats()?.cache.dirty_bytes == 0,
        "still dirty after write-back"
    );
    Ok(())
}

/// Writes `chunks` chunks of 64 KiB UNSTABLE and COMMITs every 4; returns
/// how many chunks were committed when the proxy died (or all).
async fn write_until_killed(c: &NfsClient, fh: &nfs_fh3, chunks: u64) -> u64 {
    let mut committed = 0;
    for i in 0..chunks {
        let data = random_bytes_at(77, i * 65_536, 65_536);
        let w = c
            .call(NfsRequest::Write(WRITE3args {
                file: fh.clone(),
                offset: i * 65_536,
                count: 65_536,
                stable: stable_how::UNSTABLE,
                data: Opaque::owned(data),
            }))
            .await;
        if !matches!(w, Ok(ref r) if r.status() == nfsstat3::NFS3_OK) {
            return committed;
        }
        if i % 4 == 3 {
            match c
                .call(NfsRequest::Commit(COMMIT3args {
                    file: fh.clone(),
                    offset: 0,
                    count: 0,
                }))
                .await
            {
                Ok(r) if r.status() == nfsstat3::NFS3_OK => committed = i + 1,
                _ => return committed,
            }
        }
    }
    committed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_after_commit_loses_no_committed_byte() -> Result<()> {
    let trials: u64 = std::env::var("GVFS_CRASH_TRIALS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let g = Ganesha::start()?;
    for trial in 0..trials {
        let cache = tempfile::tempdir()?;
        let mut p = Proxy::spawn(
            ProxyArgs::new(g.upstream_url())
                .cache_dir(cache.path())
                .no_writeback_on_exit(),
        )?;
        let c = NfsClient::of_proxy(&p, Duration::from_secs(1)).await?;
        let name = format!("crash-{trial}.bin");
        let fh = c.create(&name).await?;
        // Kill at a pseudo-random moment while the client writes and commits.
        let delay = Duration::from_millis(5 + (trial * 37) % 200);
        let writer = tokio::spawn({
            let (c, fh) = (c.clone(), fh.clone());
            async move { write_until_killed(&c, &fh, 1024).await }
        });
        tokio::time::sleep(delay).await;
        p.kill();
        let committed = writer.await?;
        // Restart on the same cache, write back, check every committed byte.
        let p = Proxy::spawn(ProxyArgs::new(g.upstream_url()).cache_dir(cache.path()))?;
        p.write_back()
            .with_context(|| format!("trial {trial}: write-back after the crash"))?;
        let upstream = std::fs::read(g.export_dir().join(&name))?;
        let want = (committed * 65_536) as usize;
        ensure!(
            upstream.len() >= want,
            "trial {trial}: {} bytes upstream, {want} committed",
            upstream.len()
        );
        ensure!(
            upstream[..want] == random_bytes_at(77, 0, want)[..],
            "trial {trial}: committed bytes differ upstream"
        );
        eprintln!(
            "trial {trial}: killed after {delay:?}, {committed} chunks committed, all upstream"
        );
    }
    Ok(())
}

/// Small writes inside a file that is not cached need no READ upstream, and
/// the size the client wrote (trailing zeros included) survives a kill -9.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_writes_need_no_read_and_their_size_survives_a_crash() -> Result<()> {
    let g = Ganesha::start()?;
    let cache = tempfile::tempdir()?;
    let f = g.export_dir().join("part.bin");
    write_random_file(&f, 9, MIB)?;
    let mut want = std::fs::read(&f)?;
    let mut p = Proxy::spawn(
        ProxyArgs::new(g.upstream_url())
            .cache_dir(cache.path())
            .no_writeback_on_exit(),
    )?;
    let c = NfsClient::of_proxy(&p, Duration::from_secs(5)).await?;
    let fh = c.resolve("part.bin").await?.context("part.bin")?;
    let edits: [(u64, Vec<u8>); 4] = [
        (12_345, vec![0xAB; 100]),
        (12_445, vec![0xCD; 7]),
        (70_001, vec![0xEF; 5000]),
        // Past the end, ending in zeros: the file grows to MIB + 3005.
        (MIB + 5, vec![0; 3000]),
    ];
    for (off, data) in &edits {
        c.write(&fh, *off, data, stable_how::UNSTABLE).await?;
        let end = *off as usize + data.len();
        if want.len() < end {
            want.resize(end, 0);
        }
        want[*off as usize..end].copy_from_slice(data);
    }
    c.commit(&fh).await?;
    let stats = p.stats()?;
    ensure!(
        stats.cache.counts.fetched_bytes == 0,
        "partial writes read from upstream: {stats}"
    );
    p.kill();
    let p = Proxy::spawn(ProxyArgs::new(g.upstream_url()).cache_dir(cache.path()))?;
    let c = NfsClient::of_proxy(&p, Duration::from_secs(5)).await?;
    let fh = c.resolve("part.bin").await?.context("part.bin")?;
    let size = match c
        .call(NfsRequest::Getattr(GETATTR3args { object: fh.clone() }))
        .await?
    {
        gvfs_nfs::NfsReply::Getattr(Nfs3Result::Ok(ok)) => ok.obj_attributes.size,
        other => anyhow::bail!("GETATTR after the restart: {:?}", other.status()),
    };
    ensure!(
        size == want.len() as u64,
        "size {size} after the crash, want {}",
        want.len()
    );
    ensure!(
        nfs_cat(&p.url("part.bin"))? == want,
        "read through the cache after the crash"
    );
    p.write_back()?;
    compare_file_with(&want, &f).context("upstream after write-back")?;
    Ok(())
}

#[test]
fn a_tiny_cache_evicts_and_writes_dirty_victims_back() -> Result<()> {
    let g = Ganesha::start()?;
    let cache = tempfile::tempdir()?;
    let p = Proxy::spawn(
        ProxyArgs::new(g.upstream_url())
            .cache(cache.path(), "1M")
            .cache_banks(1)
            .cache_ways(2)
            .block_size("64K"),
    )?;
    let local = tempfile::tempdir()?;
    let src = local.path().join("big.bin");
    write_random_file(&src, 5, 9 * MIB + 123)?;
    nfs_cp(&src.display().to_string(), &p.url("big.bin"))?;
    let back = local.path().join("back.bin");
    nfs_cp(&p.url("big.bin"), &back.display().to_string())?;
    compare_files(&src, &back).context("read back through the tiny cache")?;
    p.write_back()?;
    compare_files(&src, &g.export_dir().join("big.bin"))?;
    ensure!(
        p.stats()?.cache.evictions > 0,
        "no evictions in a 1 MiB cache"
    );
    Ok(())
}

#[test]
fn a_change_at_the_origin_drops_cached_blocks() -> Result<()> {
    let g = Ganesha::start()?;
    let cache = tempfile::tempdir()?;
    let p = Proxy::spawn(ProxyArgs::new(g.upstream_url()).cache_dir(cache.path()))?;
    let f = g.export_dir().join("f.bin");
    write_random_file(&f, 1, 3 * MIB)?;
    ensure!(nfs_cat(&p.url("f.bin"))? == std::fs::read(&f)?);
    std::thread::sleep(Duration::from_millis(20));
    write_random_file(&f, 2, 3 * MIB + 10)?;
    let got = nfs_cat(&p.url("f.bin"))?;
    compare_file_with(&got, &f).context("read after the origin changed")?;
    Ok(())
}

#[test]
fn a_restarted_proxy_serves_from_its_warm_cache() -> Result<()> {
    let g = Ganesha::start()?;
    let cache = tempfile::tempdir()?;
    let f = g.export_dir().join("warm.bin");
    write_random_file(&f, 3, 6 * MIB)?;
    let mut p = Proxy::spawn(
        ProxyArgs::new(g.upstream_url())
            .cache_dir(cache.path())
            .readahead(0),
    )?;
    ensure!(nfs_cat(&p.url("warm.bin"))? == std::fs::read(&f)?);
    let first = p.stats()?;
    ensure!(
        first.cache.counts.fetched_bytes >= 6 * MIB,
        "first pass fetched {first}"
    );
    p.terminate()?;
    let p = Proxy::spawn(
        ProxyArgs::new(g.upstream_url())
            .cache_dir(cache.path())
            .readahead(0),
    )?;
    ensure!(nfs_cat(&p.url("warm.bin"))? == std::fs::read(&f)?);
    let second = p.stats()?;
    ensure!(
        second.cache.counts.fetched_bytes == 0 && second.cache.counts.misses == 0,
        "second pass went upstream: {second}"
    );
    ensure!(
        second.cache.counts.hit_bytes >= 6 * MIB,
        "second pass: {second}"
    );
    Ok(())
}

#[test]
fn sigusr1_writes_back_and_sigterm_writes_back_on_exit() -> Result<()> {
    let g = Ganesha::start()?;
    let cache = tempfile::tempdir()?;
    let mut p = Proxy::spawn(ProxyArgs::new(g.upstream_url()).cache_dir(cache.path()))?;
    let local = tempfile::tempdir()?;
    for (name, seed) in [("a.bin", 1u64), ("b.bin", 2)] {
        write_random_file(&local.path().join(name), seed, 2 * MIB + 1)?;
    }
    nfs_cp(
        &local.path().join("a.bin").display().to_string(),
        &p.url("a.bin"),
    )?;
    p.signal(libc::SIGUSR1)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while compare_files(&local.path().join("a.bin"), &g.export_dir().join("a.bin")).is_err() {
        ensure!(
            std::time::Instant::now() < deadline,
            "SIGUSR1 did not write a.bin back"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    nfs_cp(
        &local.path().join("b.bin").display().to_string(),
        &p.url("b.bin"),
    )?;
    p.terminate()?;
    compare_files(&local.path().join("b.bin"), &g.export_dir().join("b.bin"))
        .context("SIGTERM did not write b.bin back")?;
    Ok(())
}

#[test]
fn metrics_endpoint_serves_the_cache_counters() -> Result<()> {
    let g = Ganesha::start()?;
    let cache = tempfile::tempdir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let p = Proxy::spawn(
        ProxyArgs::new(g.upstream_url())
            .cache_dir(cache.path())
            .metrics(SocketAddr::from(([127, 0, 0, 1], port))),
    )?;
    std::fs::write(g.export_dir().join("m"), b"metrics")?;
    ensure!(nfs_cat(&p.url("m"))? == b"metrics");
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    use std::io::{Read, Write};
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    ensure!(text.starts_with("HTTP/1.1 200"), "{text}");
    ensure!(text.contains("gvfs_cache_misses_total"), "{text}");
    ensure!(text.contains("gvfs_status_nfs_calls_READ_total"), "{text}");
    Ok(())
}

/// `--attr-timeout`: the first LOOKUP in a directory reads it
/// (READDIRPLUS, from nfs-ganesha), so a session on another file there,
/// and a lookup of a name that is not there, cost no LOOKUP upstream.
#[test]
fn a_directory_read_with_its_first_lookup_answers_the_next_names() -> Result<()> {
    let g = Ganesha::start()?;
    let dir = g.export_dir().join("img1");
    std::fs::create_dir(&dir)?;
    for (i, name) in ["vm.json", "mem", "state"].iter().enumerate() {
        write_random_file(&dir.join(name), 40 + i as u64, 64 << 10)?;
    }
    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    let cache = tempfile::tempdir()?;
    let client = Proxy::spawn(
        ProxyArgs::new(server.upstream_url())
            .cache_dir(cache.path())
            .attr_timeout(60),
    )?;
    let upstream = |proc_: &str| server.calls(proc_);
    compare_file_with(&nfs_cat(&client.url("img1/vm.json"))?, &dir.join("vm.json"))?;
    ensure!(
        upstream("READDIRPLUS")? >= 1,
        "no READDIRPLUS with the first LOOKUP in img1: {:?}",
        server.status()?
    );
    let lookups = upstream("LOOKUP")?;
    compare_file_with(&nfs_cat(&client.url("img1/mem"))?, &dir.join("mem"))?;
    compare_file_with(&nfs_cat(&client.url("img1/state"))?, &dir.join("state"))?;
    ensure!(
        nfs_cat(&client.url("img1/not-there")).is_err(),
        "a name not in the directory was found"
    );
    ensure!(
        upstream("LOOKUP")? == lookups,
        "LOOKUPs upstream for names in a directory already read: {} more",
        upstream("LOOKUP")? - lookups
    );
    let s = client.stats()?;
    ensure!(s.attr_cache.listings >= 1, "{s}");
    // A file made upstream shows once the timeout has passed (here: the
    // proxy's own write empties the cache at once).
    let local = cache.path().join("new");
    write_random_file(&local, 49, 4096)?;
    nfs_cp(&local.display().to_string(), &client.url("img1/new"))?;
    compare_file_with(&nfs_cat(&client.url("img1/new"))?, &local)?;
    Ok(())
}

/// `--attr-timeout`: a first session asks GETATTR of the file no further
/// than the proxy; a second client session on the same file costs no
/// calls upstream (NULL, MNT, LOOKUP, GETATTR, ACCESS all answered from the
/// attribute cache and the data from the block cache); a write through the
/// proxy empties it, so the writer's next session sees its own change.
#[test]
fn attribute_cache_answers_repeat_sessions_locally_and_empties_on_writes() -> Result<()> {
    let g = Ganesha::start()?;
    let src = g.export_dir().join("golden.img");
    write_random_file(&src, 31, 3 << 20)?;
    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    let dir = tempfile::tempdir()?;
    let client = Proxy::spawn(
        ProxyArgs::new(server.upstream_url())
            .cache(dir.path(), "64M")
            .attr_timeout(60),
    )?;
    let calls = |p: &Proxy| -> Result<u64> {
        let s = p.status()?;
        Ok(s.nfs_calls.values().sum::<u64>() + s.front.mount_calls)
    };
    let getattrs = |p: &Proxy| p.calls("GETATTR");
    let before = getattrs(&server)?;
    let first = nfs_cat(&client.url("golden.img"))?;
    compare_file_with(&first, &src)?;
    // The first session's GETATTR of the file is answered from the
    // attributes its LOOKUP and ACCESS replies carried: only the export
    // root's (which no reply has described) goes upstream.
    ensure!(
        getattrs(&server)? - before == 1,
        "GETATTRs upstream in a first session: {} (want the root's only)",
        getattrs(&server)? - before
    );
    let before = calls(&server)?;
    let second = nfs_cat(&client.url("golden.img"))?;
    compare_file_with(&second, &src)?;
    ensure!(
        calls(&server)? == before,
        "a repeat session reached upstream: {:?}",
        server.status()?
    );
    let s = client.stats()?;
    ensure!(s.attr_cache.hits > 0, "no attribute cache hits: {s}");

    // A write through the proxy: the next GETATTR goes upstream again.
    let local = dir.path().join("new.img");
    write_random_file(&local, 32, 4096)?;
    nfs_cp(&local.display().to_string(), &client.url("new.img"))?;
    ensure!(
        client.stats()?.attr_cache.invalidations > 0,
        "CREATE/WRITE did not empty the attribute cache"
    );
    compare_file_with(&nfs_cat(&client.url("new.img"))?, &local)?;
    // A write-back changes files upstream: it empties the cache too.
    let before = client.stats()?.attr_cache.invalidations;
    client.write_back()?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while client.stats()?.attr_cache.invalidations == before {
        ensure!(
            std::time::Instant::now() < deadline,
            "the write-back did not empty the attribute cache"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}
