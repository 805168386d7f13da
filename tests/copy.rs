//! Compress-and-copy through the real binaries, with nfs-ganesha as the
//! image server and libnfs as the client: a file whose metadata asks for it
//! is fetched whole, as a stream of compressed chunks over the gvfs
//! extension program, into the client proxy's file cache; a LAN proxy in
//! the middle keeps what it passed on, so a second compute node's proxy
//! gets it with no WAN traffic, and eight nodes asking at once cause one
//! fetch across the WAN.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use gvfs_nfs::NfsReply;
use gvfs_nfs::NfsRequest;
use gvfs_nfs::nfs3_types::nfs3::{
    CREATE3args, LOOKUP3args, Nfs3Option, Nfs3Result, READ3args, READDIRPLUS3args, WRITE3args,
    cookieverf3, createhow3, diropargs3, filename3, sattr3, stable_how,
};
use gvfs_nfs::nfs3_types::xdr_codec::Opaque;
use gvfs_testbed::data::{compare_files, write_memory_image};
use gvfs_testbed::libnfs::{nfs_cat, nfs_cp};
use gvfs_testbed::nfsclient::NfsClient;
use gvfs_testbed::process;
use gvfs_testbed::proxy::gvfsctl_local as gvfsctl;
use gvfs_testbed::{Ganesha, Proxy, ProxyArgs};
use gvfs_wanlink::{LinkConfig, WanLink};

const MIB: u64 = 1 << 20;

/// An image at the origin with compress-and-copy metadata beside it.
fn image(g: &Ganesha, name: &str, size: u64, seed: u64) -> Result<std::path::PathBuf> {
    let path = g.export_dir().join(name);
    write_memory_image(&path, size, seed)?;
    mark_for_copy(&path)?;
    Ok(path)
}

/// Writes compress-and-copy metadata beside `path`.
fn mark_for_copy(path: &Path) -> Result<()> {
    let said = gvfsctl(&["meta", "gen", &path.display().to_string(), "--compress"])?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    ensure!(said.contains(name), "meta gen said: {said}");
    Ok(())
}

/// An image-server proxy in front of `g`, a 2 ms WAN link to it, and a LAN
/// proxy with its cache in `dir` across that link.
async fn lan_across_a_wan(g: &Ganesha, dir: &Path) -> Result<(Proxy, WanLink, Proxy)> {
    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    let link = WanLink::start(
        "127.0.0.1:0".parse()?,
        server.addr(),
        LinkConfig::from_rtt(Duration::from_millis(2), None),
    )
    .await?;
    let lan =
        Proxy::spawn(ProxyArgs::new(server.upstream_url_at(link.local_addr())).cache(dir, "64M"))?;
    Ok((server, link, lan))
}

/// How long a whole-file fetch may take.
const WAIT: Duration = Duration::from_secs(15);

/// A proxy with a small block cache (and so a file cache) in `dir`,
/// listening on 127.0.0.`last`:111 in front of `server`, where QEMU finds
/// NFS (through PORTMAP on port 111 of the address given).
fn caching_for_qemu(server: &Proxy, dir: &Path, last: u8) -> Result<Proxy> {
    let at = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)), 111);
    Proxy::spawn(
        ProxyArgs::new(server.upstream_url())
            .cache(dir, "64M")
            .listen(at),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_256_mib_image_comes_as_one_compressed_stream_and_is_served_before_it_ends() -> Result<()>
{
    let g = Ganesha::start()?;
    let size = 256 * MIB;
    let src = image(&g, "mem.raw", size, 5)?;
    // The proxy next to the image server compresses; a 200 Mbit/s link
    // makes the stream last long enough to read from it while it runs.
    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    let link = WanLink::start(
        "127.0.0.1:0".parse()?,
        server.addr(),
        LinkConfig::from_rtt(Duration::from_millis(2), Some(200_000_000)),
    )
    .await?;
    let cache = tempfile::tempdir()?;
    let client = Proxy::spawn(
        ProxyArgs::new(server.upstream_url_at(link.local_addr())).cache(cache.path(), "64M"),
    )?;

    // The first READ is answered while the rest of the file is on its way.
    let nfs = NfsClient::of_proxy(&client, Duration::from_secs(60)).await?;
    let fh = nfs.resolve("mem.raw").await?.context("no mem.raw")?;
    let reply = nfs
        .call(NfsRequest::Read(READ3args {
            file: fh,
            offset: 3 * MIB + 512,
            count: 65_536,
        }))
        .await?;
    let NfsReply::Read(Nfs3Result::Ok(ok)) = reply else {
        anyhow::bail!("READ failed: {reply:?}");
    };
    let want = std::fs::read(&src)?;
    ensure!(
        ok.data.as_ref() == &want[(3 * MIB + 512) as usize..(3 * MIB + 512 + 65_536) as usize],
        "the first READ returned other bytes"
    );
    let early = client.stats()?;
    ensure!(
        early.meta.copy_reads == 1 && early.file_cache.counts.files_complete == 0,
        "the READ was not served from a stream under way: {early}"
    );

    let local = tempfile::tempdir()?;
    let back = local.path().join("mem.raw");
    nfs_cp(&client.url("mem.raw"), &back.display().to_string())?;
    compare_files(&src, &back).context("compress-and-copy bytes")?;

    let s = client.wait_files_complete(1, WAIT)?;
    let chunks = s.file_cache.counts.chunks_fetched;
    let zero = s.file_cache.counts.zero_chunks;
    // Every byte once: the first READ's pieces and the rest of their
    // chunk behind them in two runs (unless the stream claimed that chunk
    // first), and every other chunk whole. The runs come in whole 64 KiB
    // hashed pieces (the image has hashes), so they may bring again the
    // READ's pieces in the first of them.
    let fetched = s.file_cache.counts.raw_bytes + zero * MIB;
    ensure!(
        s.file_cache.counts.files_fetched == 1
            && (size..size + (64 << 10)).contains(&fetched)
            && (size / MIB..=size / MIB + 2).contains(&(chunks + zero)),
        "one whole-file fetch of 256 chunks: {s}"
    );
    // No block of the image was read below the file cache (only the small
    // metadata file went through the block cache).
    ensure!(s.cache.counts.fetched_bytes < MIB, "block reads: {s}");
    let wire = s.file_cache.counts.wire_bytes;
    let raw = s.file_cache.counts.raw_bytes;
    ensure!(
        wire * 10 < raw * 7,
        "compressed {raw} bytes into {wire}: {s}"
    );
    let up = server.stats()?;
    ensure!(
        up.ext.fetch_calls == chunks && up.ext.compressed_here == chunks,
        "the image server's proxy answered {} FETCHes for {chunks} chunks: {up}",
        up.ext.fetch_calls
    );
    // Block by block this would be thousands of READs; here the only READs
    // that reached the image server's proxy are of the metadata file (its
    // block hashes make it a few 64 KiB blocks of the client's cache).
    let meta_len = std::fs::metadata(g.export_dir().join(".mem.raw.gvfsmeta"))?.len();
    ensure!(
        server.calls("READ")? <= 2 + meta_len.div_ceil(64 << 10),
        "READs upstream for a {meta_len}-byte metadata file: {up}"
    );
    let crossed = link.stats().downstream_bytes;
    ensure!(
        crossed < wire + 2 * MIB,
        "{crossed} bytes crossed the link for {wire} bytes of chunks"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lan_proxy_serves_a_second_node_with_no_wan_bytes_and_coalesces_eight() -> Result<()> {
    let g = Ganesha::start()?;
    let a_img = image(&g, "a.raw", 48 * MIB, 11)?;
    let b_img = image(&g, "b.raw", 24 * MIB, 12)?;
    let lan_dir = tempfile::tempdir()?;
    let (server, link, lan) = lan_across_a_wan(&g, lan_dir.path()).await?;
    let local = tempfile::tempdir()?;

    // Node A warms the LAN proxy.
    let a_dir = tempfile::tempdir()?;
    let node_a = Proxy::spawn(ProxyArgs::new(lan.upstream_url()).cache(a_dir.path(), "64M"))?;
    let to_a = local.path().join("a-from-a");
    nfs_cp(&node_a.url("a.raw"), &to_a.display().to_string())?;
    compare_files(&a_img, &to_a).context("node A's copy")?;
    lan.wait_files_complete(1, WAIT)?;
    let wan_before = link.stats().downstream_bytes + link.stats().upstream_bytes;
    let fetches_before = server.stats()?.ext.fetch_calls;
    let reads_before = server.calls("READ")?;

    // Node B gets the same image from the LAN proxy alone.
    let b_dir = tempfile::tempdir()?;
    let node_b = Proxy::spawn(ProxyArgs::new(lan.upstream_url()).cache(b_dir.path(), "64M"))?;
    let to_b = local.path().join("a-from-b");
    nfs_cp(&node_b.url("a.raw"), &to_b.display().to_string())?;
    compare_files(&a_img, &to_b).context("node B's copy")?;
    let b = node_b.stats()?;
    ensure!(
        b.meta.copy_reads > 0,
        "node B did not use compress-and-copy: {b}"
    );
    let wan = link.stats().downstream_bytes + link.stats().upstream_bytes - wan_before;
    let up = server.stats()?;
    ensure!(
        up.ext.fetch_calls == fetches_before && server.calls("READ")? == reads_before,
        "node B's copy reached the image server: {up}"
    );
    // Only a few lookups and attribute checks cross: no file data.
    ensure!(wan < 64 * 1024, "{wan} bytes crossed the WAN for node B");

    // Eight nodes ask for another image at once: one fetch crosses the WAN.
    let mut nodes = Vec::new();
    let mut dirs = Vec::new();
    for _ in 0..8 {
        let d = tempfile::tempdir()?;
        nodes.push(Proxy::spawn(
            ProxyArgs::new(lan.upstream_url()).cache(d.path(), "64M"),
        )?);
        dirs.push(d);
    }
    let fetches_before = server.stats()?.ext.fetch_calls;
    let copies: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (from, to) = (p.url("b.raw"), local.path().join(format!("b-{i}")));
            tokio::task::spawn_blocking(move || nfs_cp(&from, &to.display().to_string()))
        })
        .collect();
    for (i, c) in copies.into_iter().enumerate() {
        c.await?.with_context(|| format!("node {i}'s copy"))?;
        compare_files(&b_img, &local.path().join(format!("b-{i}")))
            .with_context(|| format!("node {i}'s bytes"))?;
    }
    let up = server.stats()?;
    let l = lan.stats()?;
    ensure!(
        up.ext.fetch_calls - fetches_before == 24,
        "eight nodes caused {} FETCHes of a 24-chunk image upstream (LAN: {l})",
        up.ext.fetch_calls - fetches_before
    );
    ensure!(
        l.file_cache.counts.files_fetched == 2,
        "the LAN proxy fetched: {l}"
    );
    // It handed every chunk on in the frame it came in.
    ensure!(
        l.file_cache.counts.frames_reused >= 24 + 48 && l.file_cache.counts.frames_made == 0,
        "the LAN proxy compressed chunks again: {l}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lan_proxy_fetches_no_chunks_the_zero_map_says_are_zeros() -> Result<()> {
    let g = Ganesha::start()?;
    // 24 chunks, of which 4..20 are all zeros (as much of a memory image is).
    let path = g.export_dir().join("z.raw");
    write_memory_image(&path, 24 * MIB, 31)?;
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new().write(true).open(&path)?;
        f.seek(SeekFrom::Start(4 * MIB))?;
        f.write_all(&vec![0; 16 * MIB as usize])?;
    }
    mark_for_copy(&path)?;
    let lan_dir = tempfile::tempdir()?;
    let (server, _link, lan) = lan_across_a_wan(&g, lan_dir.path()).await?;
    let node_dir = tempfile::tempdir()?;
    let node = Proxy::spawn(ProxyArgs::new(lan.upstream_url()).cache(node_dir.path(), "64M"))?;
    let local = tempfile::tempdir()?;
    let to = local.path().join("z");
    nfs_cp(&node.url("z.raw"), &to.display().to_string())?;
    compare_files(&path, &to).context("the node's copy")?;
    let l = lan.wait_files_complete(1, WAIT)?;
    let up = server.stats()?;
    ensure!(
        l.file_cache.counts.zero_chunks == 16 && up.ext.fetch_calls == 8,
        "the LAN proxy fetched chunks of zeros across the WAN: LAN {l}, server {up}"
    );
    Ok(())
}

/// Writes `blocks` incompressible 4 KiB blocks to `path`, every second one
/// a copy of an earlier block; returns the bytes the copies hold.
fn write_with_repeats(path: &Path, blocks: usize, seed: u64) -> Result<u64> {
    let mut x = seed | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut data = vec![0u8; blocks * 4096];
    for b in 0..blocks {
        if b % 2 == 1 {
            let from = (next() as usize % (b / 2 + 1)) * 2;
            data.copy_within(from * 4096..(from + 1) * 4096, b * 4096);
        } else {
            for w in data[b * 4096..(b + 1) * 4096].chunks_exact_mut(8) {
                w.copy_from_slice(&next().to_le_bytes());
            }
        }
    }
    std::fs::write(path, &data)?;
    Ok((blocks / 2 * 4096) as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_blocks_cross_the_wan_once_and_every_proxy_gets_them_whole() -> Result<()> {
    let g = Ganesha::start()?;
    let path = g.export_dir().join("rep.raw");
    let raw = 2048 * 4096u64;
    let repeated = write_with_repeats(&path, 2048, 77)?;
    let path_s = path.display().to_string();
    let runs = || -> Result<u64> {
        let shown = gvfsctl(&["meta", "show", &path_s])?;
        let line = shown
            .lines()
            .find(|l| l.starts_with("repeated blocks:"))
            .with_context(|| format!("meta show: {shown}"))?;
        let runs = line.split(" in ").nth(1).and_then(|r| r.split(' ').next());
        runs.and_then(|r| r.parse().ok())
            .with_context(|| format!("meta show: {line}"))
    };
    // Without repeats (for older proxies) none are recorded.
    gvfsctl(&["meta", "gen", &path_s, "--compress", "--no-repeats"])?;
    ensure!(runs()? == 0, "--no-repeats recorded repeats");
    mark_for_copy(&path)?;
    ensure!(runs()? > 0, "meta gen --compress found no repeats");
    // The image server's proxy reads the metadata (it would by default
    // with --listen-tls); a LAN proxy across a WAN link; a node behind it.
    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()).meta())?;
    let link = WanLink::start(
        "127.0.0.1:0".parse()?,
        server.addr(),
        LinkConfig::from_rtt(Duration::from_millis(2), None),
    )
    .await?;
    // Without dedup, which would copy repeated blocks it holds already
    // itself (its own test is tests/dedup.rs).
    let lan_dir = tempfile::tempdir()?;
    let lan = Proxy::spawn(
        ProxyArgs::new(server.upstream_url_at(link.local_addr()))
            .cache(lan_dir.path(), "64M")
            .no_dedup(),
    )?;
    let node_dir = tempfile::tempdir()?;
    let node = Proxy::spawn(
        ProxyArgs::new(lan.upstream_url())
            .cache(node_dir.path(), "64M")
            .no_dedup(),
    )?;
    let local = tempfile::tempdir()?;
    let to = local.path().join("rep");
    nfs_cp(&node.url("rep.raw"), &to.display().to_string())?;
    compare_files(&path, &to).context("the node's copy")?;
    let l = lan.wait_files_complete(1, WAIT)?;
    let wan = link.stats();
    ensure!(
        l.file_cache.counts.repeat_bytes == repeated,
        "the LAN proxy did not fill every repeat: {l}"
    );
    // Half the blocks are repeats of random data: about half crosses.
    ensure!(
        wan.downstream_bytes < raw * 6 / 10,
        "{} bytes crossed the WAN for {raw} of file, {repeated} repeated",
        wan.downstream_bytes
    );
    // The LAN proxy hands the chunks on as they came, compressing none;
    // the node fills the repeats itself.
    let nd = node.wait_files_complete(1, WAIT)?;
    ensure!(
        nd.file_cache.counts.repeat_bytes == repeated && l.file_cache.counts.frames_made == 0,
        "node: {nd}, LAN: {l}"
    );
    // A node straight behind the image server fills them itself.
    let direct_dir = tempfile::tempdir()?;
    let direct = Proxy::spawn(
        ProxyArgs::new(server.upstream_url())
            .cache(direct_dir.path(), "64M")
            .no_dedup(),
    )?;
    ensure!(
        nfs_cat(&direct.url("rep.raw"))? == std::fs::read(&path)?,
        "direct copy"
    );
    let d = direct.wait_files_complete(1, WAIT)?;
    ensure!(d.file_cache.counts.repeat_bytes == repeated, "direct: {d}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_to_a_held_file_stay_local_until_written_back_compressed() -> Result<()> {
    let g = Ganesha::start()?;
    let size = 16 * MIB;
    let src = image(&g, "wb.raw", size, 21)?;
    let original = std::fs::read(&src)?;
    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    let cache = tempfile::tempdir()?;
    let client = caching_for_qemu(&server, cache.path(), 41)?;
    ensure!(nfs_cat(&client.url("wb.raw"))? == original, "first read");
    client.wait_files_complete(1, WAIT)?;

    // QEMU writes into the image: at 3 MiB and over its last page (a raw
    // image cannot grow through QEMU; growing is covered in crates/meta).
    let url = format!("nfs://{}/export/wb.raw", client.ip());
    let out = process::run_ok(
        std::process::Command::new("qemu-io").args([
            "-f",
            "raw",
            "-c",
            "write -P 0xab 3146000 70000",
            "-c",
            &format!("write -P 0xcd {} 4096", size - 4096),
            "-c",
            "flush",
            &url,
        ]),
        Duration::from_secs(60),
    )
    .context("qemu-io (apt-get install qemu-utils qemu-block-extra)")?;
    ensure!(
        out.stdout_text().contains("wrote 70000"),
        "qemu-io said: {}",
        out.stdout_text()
    );
    let mut want = original.clone();
    want[3_146_000..3_146_000 + 70_000].fill(0xab);
    want[size as usize - 4096..].fill(0xcd);
    let s = client.stats()?;
    ensure!(
        s.meta.copy_writes >= 2 && s.file_cache.dirty_files == 1,
        "the writes did not stay in the file cache: {s}"
    );
    ensure!(
        std::fs::read(&src)? == original,
        "the origin changed before write-back"
    );
    ensure!(
        nfs_cat(&client.url("wb.raw"))? == want,
        "reads through the proxy do not show the writes"
    );

    client.write_back()?;
    ensure!(
        std::fs::read(&src)? == want,
        "the origin does not hold the writes after write-back"
    );
    let s = client.stats()?;
    let up = server.stats()?;
    ensure!(
        s.file_cache.counts.written_back_files == 1 && s.file_cache.dirty_files == 0,
        "client: {s}"
    );
    // Two chunks were touched (the one at 3 MiB and the last), sent
    // compressed with STORE.
    ensure!(
        up.ext.store_calls == 2 && up.ext.stored_wire_bytes < up.ext.stored_raw_bytes,
        "image server's proxy: {up}"
    );
    ensure!(
        nfs_cat(&client.url("wb.raw"))? == want,
        "read after write-back"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reads_its_writes_after_a_write_back_without_asking_for_attributes() -> Result<()>
{
    let g = Ganesha::start()?;
    let size = 16 * MIB;
    let src = image(&g, "rb.raw", size, 22)?;
    let original = std::fs::read(&src)?;
    // A block the metadata's zero map says is zeros.
    let zero = original
        .chunks(4096)
        .position(|c| c.iter().all(|&b| b == 0))
        .context("the image has no zero block")? as u64
        * 4096;
    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    let cache = tempfile::tempdir()?;
    let client = caching_for_qemu(&server, cache.path(), 42)?;
    ensure!(nfs_cat(&client.url("rb.raw"))? == original, "first read");
    client.wait_files_complete(1, WAIT)?;

    // One QEMU session writes into the zero block, waits while the proxy
    // writes back, then reads the block again: no GETATTR or LOOKUP in
    // between, as a VMM with its image open.
    let url = format!("nfs://{}/export/rb.raw", client.ip());
    let session = std::thread::spawn(move || {
        process::run_ok(
            std::process::Command::new("qemu-io").args([
                "-f",
                "raw",
                "-c",
                &format!("write -P 0xab {zero} 4096"),
                "-c",
                "flush",
                "-c",
                "sleep 4000",
                "-c",
                &format!("read -P 0xab {zero} 4096"),
                &url,
            ]),
            Duration::from_secs(60),
        )
    });
    let mut held = false;
    for _ in 0..100 {
        if client.stats()?.file_cache.dirty_files == 1 {
            held = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ensure!(held, "the write did not stay in the file cache");
    client.write_back()?;
    ensure!(
        std::fs::read(&src)?[zero as usize..zero as usize + 4096]
            .iter()
            .all(|&b| b == 0xab),
        "the origin does not hold the write after write-back"
    );
    let out = session
        .join()
        .map_err(|_| anyhow::anyhow!("qemu-io thread panicked"))?
        .context("the qemu-io session (write, write-back, read back) failed")?;
    let said = out.stdout_text();
    ensure!(
        said.contains("read 4096/4096") && !said.contains("Pattern verification failed"),
        "the block read back after write-back is not what was written: {said}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_that_truncates_a_held_file_lets_the_whole_copy_go() -> Result<()> {
    let g = Ganesha::start()?;
    let src = image(&g, "tr.raw", 8 * MIB, 23)?;
    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    let cache = tempfile::tempdir()?;
    let client = Proxy::spawn(ProxyArgs::new(server.upstream_url()).cache(cache.path(), "64M"))?;
    ensure!(
        nfs_cat(&client.url("tr.raw"))? == std::fs::read(&src)?,
        "first read"
    );
    client.wait_files_complete(1, WAIT)?;

    // CREATE UNCHECKED with size 0 over the held file, then a WRITE.
    let nfs = NfsClient::of_proxy(&client, Duration::from_secs(60)).await?;
    let root = nfs.resolve("").await?.context("no root")?;
    let created = nfs
        .call(NfsRequest::Create(CREATE3args {
            where_: diropargs3 {
                dir: root,
                name: filename3::from(b"tr.raw".to_vec()),
            },
            how: createhow3::UNCHECKED(sattr3 {
                size: Nfs3Option::Some(0),
                ..sattr3::default()
            }),
        }))
        .await?;
    let NfsReply::Create(Nfs3Result::Ok(ok)) = created else {
        anyhow::bail!("CREATE failed: {created:?}");
    };
    let Nfs3Option::Some(fh) = ok.obj else {
        anyhow::bail!("CREATE gave no handle");
    };
    let written = nfs
        .call(NfsRequest::Write(WRITE3args {
            file: fh,
            offset: 0,
            count: 4096,
            stable: stable_how::FILE_SYNC,
            data: Opaque::owned(vec![0xcd; 4096]),
        }))
        .await?;
    ensure!(
        matches!(written, NfsReply::Write(Nfs3Result::Ok(_))),
        "WRITE failed: {written:?}"
    );
    let now = nfs_cat(&client.url("tr.raw"))?;
    ensure!(
        now.len() == 4096 && now.iter().all(|&b| b == 0xcd),
        "read {} bytes after the truncation and write, not the 4096 written",
        now.len()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_and_readdirplus_give_a_held_file_its_local_size() -> Result<()> {
    let g = Ganesha::start()?;
    let size = 8 * MIB;
    let src = image(&g, "gr.raw", size, 24)?;
    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    let cache = tempfile::tempdir()?;
    let client = Proxy::spawn(ProxyArgs::new(server.upstream_url()).cache(cache.path(), "64M"))?;
    ensure!(
        nfs_cat(&client.url("gr.raw"))? == std::fs::read(&src)?,
        "first read"
    );
    client.wait_files_complete(1, WAIT)?;

    // Grow the held file by a page: the write stays in the file cache.
    let nfs = NfsClient::of_proxy(&client, Duration::from_secs(60)).await?;
    let root = nfs.resolve("").await?.context("no root")?;
    let fh = nfs.lookup(&root, "gr.raw").await?.context("no gr.raw")?;
    let written = nfs
        .call(NfsRequest::Write(WRITE3args {
            file: fh,
            offset: size,
            count: 4096,
            stable: stable_how::FILE_SYNC,
            data: Opaque::owned(vec![0xee; 4096]),
        }))
        .await?;
    ensure!(
        matches!(written, NfsReply::Write(Nfs3Result::Ok(_))),
        "WRITE failed: {written:?}"
    );
    ensure!(
        std::fs::metadata(&src)?.len() == size,
        "the write went upstream"
    );
    let grown = size + 4096;
    let looked = nfs
        .call(NfsRequest::Lookup(LOOKUP3args {
            what: diropargs3 {
                dir: root.clone(),
                name: filename3::from(b"gr.raw".to_vec()),
            },
        }))
        .await?;
    let NfsReply::Lookup(Nfs3Result::Ok(ok)) = looked else {
        anyhow::bail!("LOOKUP failed: {looked:?}");
    };
    let Nfs3Option::Some(a) = ok.obj_attributes else {
        anyhow::bail!("LOOKUP gave no attributes");
    };
    ensure!(a.size == grown, "LOOKUP says {} bytes, not {grown}", a.size);
    let listed = nfs
        .call(NfsRequest::Readdirplus(READDIRPLUS3args {
            dir: root,
            cookie: 0,
            cookieverf: cookieverf3::default(),
            dircount: 8192,
            maxcount: 32768,
        }))
        .await?;
    let NfsReply::Readdirplus(Nfs3Result::Ok(ok)) = listed else {
        anyhow::bail!("READDIRPLUS failed: {listed:?}");
    };
    let entry = ok
        .reply
        .entries
        .0
        .iter()
        .find(|e| e.name.0.as_ref() == b"gr.raw")
        .context("gr.raw not listed")?;
    let Nfs3Option::Some(a) = &entry.name_attributes else {
        anyhow::bail!("READDIRPLUS gave no attributes for gr.raw");
    };
    ensure!(
        a.size == grown,
        "READDIRPLUS says {} bytes, not {grown}",
        a.size
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_to_a_held_file_that_upstream_would_refuse_is_refused_here() -> Result<()> {
    let g = Ganesha::start()?;
    let src = image(&g, "ro.raw", 8 * MIB, 25)?;
    let original = std::fs::read(&src)?;
    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    let cache = tempfile::tempdir()?;
    let client = Proxy::spawn(ProxyArgs::new(server.upstream_url()).cache(cache.path(), "64M"))?;
    ensure!(nfs_cat(&client.url("ro.raw"))? == original, "first read");
    client.wait_files_complete(1, WAIT)?;

    // Another user, who may read the image (0644, root's) but not write it.
    let a = client.addr();
    let stranger = NfsClient::mount(
        a,
        a,
        client.export(),
        gvfs_nfs::rpc::Credentials::unix(2000, 2000),
        Duration::from_secs(60),
    )
    .await?;
    let fh = stranger
        .resolve("ro.raw")
        .await?
        .context("no ro.raw for the stranger")?;
    let written = stranger
        .call(NfsRequest::Write(WRITE3args {
            file: fh,
            offset: 0,
            count: 4,
            stable: stable_how::FILE_SYNC,
            data: Opaque::owned(b"evil".to_vec()),
        }))
        .await?;
    ensure!(
        matches!(written, NfsReply::Write(Nfs3Result::Err(_))),
        "the proxy kept a write upstream would refuse: {written:?}"
    );
    let s = client.stats()?;
    ensure!(
        s.file_cache.dirty_files == 0,
        "the refused write stayed in the file cache: {s}"
    );
    ensure!(
        nfs_cat(&client.url("ro.raw"))? == original,
        "others read the refused write"
    );
    Ok(())
}
