//! Content-addressed blocks through the real binaries, with nfs-ganesha as
//! the image server and libnfs as the client: image B shares half its
//! blocks with image A (at other offsets); once a proxy holds A, fetching B
//! copies those blocks from A (checked against B's metadata hashes) and
//! fetches only the rest, at every hop of a cascade, across a restart, and
//! never serves a held block whose bytes went bad.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use gvfs_testbed::data::{compare_files, fill_at};
use gvfs_testbed::libnfs::nfs_cp;
use gvfs_testbed::proxy::gvfsctl_local as gvfsctl;
use gvfs_testbed::{Ganesha, Origin, Proxy, ProxyArgs, Site, Tier};
use gvfs_wanlink::LinkConfig;

const MIB: u64 = 1 << 20;
const BLOCK: u64 = 4096;
/// Blocks of each image (12 MiB).
const BLOCKS: u64 = 3072;
/// Bytes of B that are blocks of A: its even blocks.
const SHARED: u64 = BLOCKS / 2 * BLOCK;
/// How long a fetch or the indexer may take on a loaded machine.
const WAIT: Duration = Duration::from_secs(30);

/// Image A (its own random blocks) and image B, whose even block `2j` is
/// A's block `j` and whose odd blocks are its own, each with
/// compress-and-copy metadata (and so block hashes) beside it.
fn images(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    pair(dir, ["a.img", "b.img"], BLOCK, BLOCKS, 1, "--compress")
}

/// Two images named `names` of `count` units of `unit` bytes: the first of
/// its own data (from `seed`), the second's even unit `2j` the first's
/// unit `j` and its odd units its own; each with metadata made by `gvfsctl
/// meta gen FILE META_FLAG`, which must record block hashes.
fn pair(
    dir: &Path,
    names: [&str; 2],
    unit: u64,
    count: u64,
    seed: u64,
    meta_flag: &str,
) -> Result<(PathBuf, PathBuf)> {
    let (a, b) = (dir.join(names[0]), dir.join(names[1]));
    let (fa, fb) = (File::create(&a)?, File::create(&b)?);
    let mut buf = vec![0u8; unit as usize];
    for i in 0..count {
        fill_at(seed, i * unit, &mut buf);
        fa.write_all_at(&buf, i * unit)?;
        if i % 2 == 0 {
            fill_at(seed, i / 2 * unit, &mut buf);
        } else {
            fill_at(seed + 1, i * unit, &mut buf);
        }
        fb.write_all_at(&buf, i * unit)?;
    }
    for p in [&a, &b] {
        let said = gvfsctl(&["meta", "gen", &p.display().to_string(), meta_flag])?;
        ensure!(
            said.contains("block hashes") && said.contains("zstd") == (meta_flag == "--compress"),
            "meta gen said: {said}"
        );
    }
    Ok((a, b))
}

/// Rewrites the metadata of `image` so that each `(i, j)` of `blocks`
/// gives its i-th block fingerprint the fingerprint of `other`'s block
/// `j`; its piece hashes stay its true ones.
fn lie(g: &Ganesha, image: &str, other: &str, blocks: &[(usize, u64)]) -> Result<()> {
    let read = |name: &str| -> Result<gvfs_metafile::MetaFile> {
        let path = g.export_dir().join(format!(".{name}.gvfsmeta"));
        Ok(gvfs_metafile::MetaFile::decode(&std::fs::read(path)?)?)
    };
    let (mut m, theirs) = (read(image)?, read(other)?);
    let h = m.hashes.clone().context("hashes")?;
    let mut fps = h.fingerprints().to_vec();
    for &(i, j) in blocks {
        fps[i] = *theirs.block_fingerprint(j).context("the other's block")?;
    }
    let pieces = (0..m.file_size.div_ceil(gvfs_metafile::hashes::HASH_PIECE))
        .map(|p| m.piece_hash(p).copied().context("a piece's hash"))
        .collect::<Result<Vec<_>>>()?;
    m.hashes = Some(std::sync::Arc::new(
        gvfs_metafile::BlockHashes::new(fps, pieces, &m.zero, m.block_size, m.file_size)
            .context("same counts")?,
    ));
    std::fs::write(
        g.export_dir().join(format!(".{image}.gvfsmeta")),
        m.encode(),
    )?;
    Ok(())
}

/// Copies `name` through `proxy` with nfs-cp and checks it against the
/// origin's `want`.
fn copy_through(proxy: &Proxy, name: &str, want: &Path, to: &Path) -> Result<()> {
    nfs_cp(&proxy.url(name), &to.display().to_string())?;
    compare_files(want, to).with_context(|| format!("{name} through {}", proxy.url("")))
}

/// Waits until `p` has indexed `blocks` blocks (its indexer runs in the
/// background, at low priority).
async fn wait_indexed(p: &Proxy, blocks: u64) -> Result<()> {
    p.wait_for("file_cache.blocks_indexed", WAIT, |s| {
        s.file_cache.blocks_indexed >= blocks
    })
    .map(drop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_crosses_the_wan_as_only_the_blocks_no_held_image_has() -> Result<()> {
    // Node 2 runs with dedup off, for the end.
    let site = Site::builder(Origin::Ganesha)
        .wan(LinkConfig::from_rtt(Duration::from_millis(2), None))
        .lan(Tier::new().cache("64M"))
        .node(Tier::new().cache("64M"))
        .node(Tier::new().cache("64M").args(ProxyArgs::no_dedup))
        .start_with(|origin| images(origin).map(drop))?;
    let (a, b) = (
        site.origin_dir().join("a.img"),
        site.origin_dir().join("b.img"),
    );
    let (server, lan, node, link) = (site.image_server(), site.lan()?, site.node(0)?, site.wan()?);
    let out = tempfile::tempdir()?;
    let wan = || link.stats().downstream_bytes + link.stats().upstream_bytes;

    copy_through(node, "a.img", &a, &out.path().join("a"))?;
    lan.wait_files_complete(1, WAIT)?;
    node.wait_files_complete(1, WAIT)?;
    wait_indexed(lan, BLOCKS).await?;
    wait_indexed(node, BLOCKS).await?;
    let wan_a = wan();
    // Before B is fetched, `meta show` says half of it is held already.
    let shown = gvfs_testbed::proxy::gvfsctl(
        node.control_path(),
        &["meta", "show", &b.display().to_string()],
    )?
    .stdout_text();
    ensure!(
        shown.contains("block hashes:    3072") && shown.contains("1536 of 3072 data blocks"),
        "gvfsctl meta show:\n{shown}"
    );
    copy_through(node, "b.img", &b, &out.path().join("b"))?;
    let lan_stats = lan.wait_files_complete(2, WAIT)?;
    let node_stats = node.wait_files_complete(2, WAIT)?;
    let wan_b = wan() - wan_a;

    // Each hop copied B's shared half from A.
    for (who, s) in [("node", &node_stats), ("LAN proxy", &lan_stats)] {
        ensure!(
            s.file_cache.counts.dedup_bytes >= SHARED
                && s.file_cache.counts.dedup_rejected == 0
                && s.file_cache.counts.hash_mismatches == 0,
            "the {who} did not copy B's {SHARED} shared bytes from A: {s}"
        );
    }
    // Each asked with FETCH_HAVE. The image server's proxy left the held
    // blocks out; the LAN proxy sent its whole chunks' frames as they were.
    let (lan_ext, server_ext) = (lan.stats()?, server.stats()?);
    ensure!(
        lan_ext.ext.have_calls > 0 && lan_ext.file_cache.counts.frames_made > 0,
        "the LAN proxy was not told which blocks its caller held: {lan_ext}"
    );
    ensure!(
        server_ext.ext.have_calls > 0 && server_ext.ext.have_bytes >= SHARED,
        "the image server's proxy did not leave out the held blocks: {server_ext}"
    );
    // Random blocks do not compress: B costs about its unique half (and its
    // hashes); A cost it all.
    ensure!(
        wan_b * 10 < wan_a * 6 && wan_b * 10 > wan_a * 4,
        "B took {wan_b} bytes across the WAN, A {wan_a}"
    );

    // With dedup off, a node fetches every block, and gets the same bytes.
    let off = site.node(1)?;
    copy_through(off, "a.img", &a, &out.path().join("a2"))?;
    copy_through(off, "b.img", &b, &out.path().join("b2"))?;
    let s = off.wait_files_complete(2, WAIT)?;
    ensure!(
        s.file_cache.counts.dedup_bytes == 0 && s.file_cache.counts.raw_bytes >= 2 * BLOCKS * BLOCK,
        "--no-dedup still copied held blocks: {s}"
    );

    // `gvfsctl stats` names what dedup saved, per image.
    let text = gvfs_testbed::proxy::gvfsctl(node.control_path(), &["stats"])?.stdout_text();
    ensure!(
        text.contains("dedup") && text.contains("b.img"),
        "gvfsctl stats does not show dedup per image:\n{text}"
    );
    Ok(())
}

/// The node's cached copy of the image of `size` bytes (the only one of
/// that size in its file cache).
fn cached_copy(cache_dir: &Path, size: u64) -> Result<PathBuf> {
    for e in std::fs::read_dir(cache_dir.join("files"))? {
        let p = e?.path();
        if p.extension().is_none() && std::fs::metadata(&p)?.len() == size {
            return Ok(p);
        }
    }
    anyhow::bail!("no cached file of {size} bytes in {}", cache_dir.display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_blocks_serve_after_a_restart_and_rotted_ones_are_fetched() -> Result<()> {
    let g = Ganesha::start()?;
    let (a, b) = images(g.export_dir())?;
    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    let (dir, out) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let mut node = Proxy::spawn(ProxyArgs::new(server.upstream_url()).cache(dir.path(), "64M"))?;
    copy_through(&node, "a.img", &a, &out.path().join("a"))?;
    node.wait_files_complete(1, WAIT)?;
    wait_indexed(&node, BLOCKS).await?;
    node.terminate()?;

    // Rot: the first 64 blocks of the cached A (which B's blocks 0, 2, ...
    // 126 repeat) change on disk while the proxy is down.
    let held = cached_copy(dir.path(), BLOCKS * BLOCK)?;
    let f = std::fs::OpenOptions::new().write(true).open(&held)?;
    for i in 0..64 {
        f.write_all_at(b"rot!", i * BLOCK + 100)?;
    }
    drop(f);

    // After the restart the index still finds A's blocks; the rotted ones
    // fail their hash and are fetched, and B is right.
    let node = Proxy::spawn(ProxyArgs::new(server.upstream_url()).cache(dir.path(), "64M"))?;
    copy_through(&node, "b.img", &b, &out.path().join("b"))?;
    // (A was restored, not fetched: B is this process's first fetch.)
    let s = node.wait_files_complete(1, WAIT)?;
    ensure!(
        s.file_cache.counts.dedup_rejected == 64
            && s.file_cache.counts.dedup_bytes == SHARED - 64 * BLOCK,
        "after a restart with 64 rotted blocks: {s}\n{}",
        node.output()
    );
    ensure!(
        server.stats()?.ext.have_bytes == SHARED - 64 * BLOCK,
        "the image server did not leave out exactly the good held blocks"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_hashes_or_with_an_older_format_fetches_everything() -> Result<()> {
    let g = Ganesha::start()?;
    let (a, b) = images(g.export_dir())?;
    // B's metadata without hashes (format 1): nothing to match it by.
    let said = gvfsctl(&[
        "meta",
        "gen",
        &b.display().to_string(),
        "--compress",
        "--no-hashes",
    ])?;
    ensure!(!said.contains("block hashes"), "meta gen said: {said}");
    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    let (dir, out) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let node = Proxy::spawn(ProxyArgs::new(server.upstream_url()).cache(dir.path(), "64M"))?;
    copy_through(&node, "a.img", &a, &out.path().join("a"))?;
    copy_through(&node, "b.img", &b, &out.path().join("b"))?;
    let s = node.wait_files_complete(2, WAIT)?;
    ensure!(
        s.file_cache.counts.dedup_bytes == 0 && s.meta.copy_reads > 0,
        "B without hashes: {s}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_readers_faults_copy_shared_blocks_and_fetch_the_rest() -> Result<()> {
    gvfs_testbed::require_fuse!();
    let g = Ganesha::start()?;
    let (a, b) = images(g.export_dir())?;
    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    let (dir, out) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let mnt = gvfs_testbed::fuse::MountPoint::new()?;
    let node = Proxy::spawn(
        ProxyArgs::new(server.upstream_url())
            .cache(dir.path(), "64M")
            .mount(mnt.path()),
    )?;
    copy_through(&node, "a.img", &a, &out.path().join("a"))?;
    node.wait_files_complete(1, WAIT)?;
    wait_indexed(&node, BLOCKS).await?;

    // Page faults far apart in B, as a guest's: each reader fetches the
    // 64 KiB piece it needs, half of whose blocks A holds.
    let f = File::open(mnt.path().join("b.img"))?;
    let origin = File::open(&b)?;
    for chunk in [9u64, 2, 7, 11] {
        let at = chunk * MIB + 3 * BLOCK;
        let (mut got, mut want) = (vec![0u8; 2 * BLOCK as usize], vec![0u8; 2 * BLOCK as usize]);
        f.read_exact_at(&mut got, at)?;
        origin.read_exact_at(&mut want, at)?;
        ensure!(got == want, "B's bytes at {at} through the mount");
    }
    let s = node.stats()?;
    ensure!(
        s.file_cache.counts.faults_waited > 0 && s.file_cache.counts.dedup_bytes > 0,
        "the faults did not copy held blocks: {s}"
    );
    ensure!(
        server.stats()?.ext.demand_calls > 0 && server.stats()?.ext.have_calls > 0,
        "the faults were not asked as demand with the held blocks named"
    );
    // And the whole of B arrives right.
    node.wait_files_complete(2, WAIT)?;
    compare_files(&b, &mnt.path().join("b.img"))?;
    drop(f);
    drop(node);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fingerprint_that_names_other_bytes_costs_a_fetch_not_wrong_bytes() -> Result<()> {
    let g = Ganesha::start()?;
    let (a, b) = images(g.export_dir())?;
    // B's metadata lies about its odd block 1 (its own bytes): it gives it
    // the fingerprint of A's block 7. Its piece hashes are B's true ones.
    lie(&g, "b.img", "a.img", &[(1, 7)])?;

    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    let (dir, out) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let node = Proxy::spawn(ProxyArgs::new(server.upstream_url()).cache(dir.path(), "64M"))?;
    copy_through(&node, "a.img", &a, &out.path().join("a"))?;
    node.wait_files_complete(1, WAIT)?;
    wait_indexed(&node, BLOCKS).await?;
    copy_through(&node, "b.img", &b, &out.path().join("b"))?;
    let s = node.wait_files_complete(2, WAIT)?;
    // The first chunk failed its piece hash with A's block in it, came
    // again whole, and the rest of B's shared blocks were copied.
    ensure!(
        s.file_cache.counts.hash_mismatches == 1
            && s.file_cache.counts.dedup_rejected == 1
            && s.file_cache.counts.dedup_bytes >= SHARED - MIB,
        "B with a lying fingerprint: {s}"
    );
    Ok(())
}

/// A lazy reader's fault fetches a few 8 KiB pieces, less than a 64 KiB
/// piece hash covers: held blocks must not go there unchecked. B's
/// metadata lies about its block 1 (it names A's block 7, held), and B's
/// working-set profile (beside it at the origin) names the 8 KiB at its
/// start: the fault, and the profile's fetch, get B's true bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_smaller_than_a_piece_hash_gets_no_unchecked_held_block() -> Result<()> {
    gvfs_testbed::require_fuse!();
    let g = Ganesha::start()?;
    let (a, b) = images(g.export_dir())?;
    lie(&g, "b.img", "a.img", &[(1, 7)])?;
    let m = std::fs::metadata(&b)?;
    let time = |s: i64, ns: i64| (s as u32, ns as u32);
    use std::os::unix::fs::MetadataExt;
    let profile = gvfs_ext::Profile {
        size: m.len(),
        mtime: time(m.mtime(), m.mtime_nsec()),
        ctime: time(m.ctime(), m.ctime_nsec()),
        unit: gvfs_filecache::PIECE,
        parts: vec![0],
    };
    std::fs::write(g.export_dir().join(".b.img.gvfsprofile"), profile.record())?;

    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()).meta())?;
    let (dir, out) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let mnt = gvfs_testbed::fuse::MountPoint::new()?;
    let node = Proxy::spawn(
        ProxyArgs::new(server.upstream_url())
            .cache(dir.path(), "64M")
            .mount(mnt.path())
            .mount_readahead("0"),
    )?;
    copy_through(&node, "a.img", &a, &out.path().join("a"))?;
    node.wait_files_complete(1, WAIT)?;
    wait_indexed(&node, BLOCKS).await?;

    // A first fault far away starts B's fetch; once it follows the
    // profile, the fault on block 1.
    let f = File::open(mnt.path().join("b.img"))?;
    let (mut got, mut want) = (vec![0u8; BLOCK as usize], vec![0u8; BLOCK as usize]);
    f.read_exact_at(&mut got, 9 * MIB)?;
    node.wait_for("file_cache.profile_hits", WAIT, |s| {
        s.file_cache.counts.profile_hits >= 1
    })?;
    f.read_exact_at(&mut got, BLOCK)?;
    File::open(&b)?.read_exact_at(&mut want, BLOCK)?;
    ensure!(got == want, "B's block 1 through the mount is not B's");
    let s = node.wait_files_complete(2, WAIT)?;
    ensure!(
        s.file_cache.counts.profile_pieces == 1,
        "B's profile was not fetched first: {s}"
    );
    // The rest of chunk 0 came in whole hashed pieces, held blocks and
    // all: the lie was caught by the hash and that chunk fetched again.
    ensure!(
        s.file_cache.counts.hash_mismatches == 1 && s.file_cache.counts.dedup_rejected == 1,
        "the rest of chunk 0 was not checked with held blocks in it: {s}"
    );
    compare_files(&b, &mnt.path().join("b.img"))?;
    drop(f);
    drop(node);
    Ok(())
}

/// Pieces of 64 KiB (the block cache's blocks) of each disk image.
const PIECES: u64 = BLOCKS / 16;
const PIECE: u64 = 16 * BLOCK;

/// Disk images C and D, read block by block (metadata with `--hashes`, no
/// compress-and-copy): D's even piece `2j` is C's piece `j`, its odd
/// pieces its own.
fn disks(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    pair(dir, ["c.img", "d.img"], PIECE, PIECES, 3, "--hashes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_read_block_by_block_fills_shared_blocks_from_held_ones() -> Result<()> {
    let g = Ganesha::start()?;
    let (c, d) = disks(g.export_dir())?;
    // D's metadata lies about its own piece 1: its blocks get the
    // fingerprints of C's piece 90 (held), its piece hash stays D's.
    let blocks: Vec<(usize, u64)> = (0..16).map(|i| (16 + i, 90 * 16 + i as u64)).collect();
    lie(&g, "d.img", "c.img", &blocks)?;

    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    let (dir, out) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let node = Proxy::spawn(ProxyArgs::new(server.upstream_url()).cache(dir.path(), "64M"))?;
    copy_through(&node, "c.img", &c, &out.path().join("c"))?;
    wait_indexed(&node, BLOCKS).await?;
    let before = node.stats()?.cache.counts.fetched_bytes;
    copy_through(&node, "d.img", &d, &out.path().join("d"))?;
    let s = node.stats()?;
    // (D's metadata file is read through the block cache too.)
    let fetched = s.cache.counts.fetched_bytes - before;
    // D's shared pieces but one (C's piece 90, whose entries the lie
    // cost) came from C's blocks in the block cache; the lie was caught by
    // its piece hash and D's piece 1 was read upstream.
    ensure!(
        s.cache.counts.held_fill_bytes == (PIECES / 2 - 1) * PIECE
            && ((PIECES / 2 + 1) * PIECE..(PIECES / 2 + 2) * PIECE).contains(&fetched)
            && s.file_cache.counts.hash_mismatches == 1
            && s.file_cache.counts.dedup_bytes == (PIECES / 2 - 1) * PIECE,
        "D through the block cache: {s}"
    );
    let text = gvfs_testbed::proxy::gvfsctl(node.control_path(), &["stats"])?.stdout_text();
    ensure!(
        text.contains("d.img") && text.contains("filled from blocks with the same content"),
        "gvfsctl stats does not show the block cache's dedup:\n{text}"
    );

    // Across a cascade: a LAN proxy that holds C fills D's shared pieces
    // for a node that holds nothing.
    let (lan_dir, node_dir, out3) = (
        tempfile::tempdir()?,
        tempfile::tempdir()?,
        tempfile::tempdir()?,
    );
    let lan = Proxy::spawn(ProxyArgs::new(server.upstream_url()).cache(lan_dir.path(), "64M"))?;
    copy_through(&lan, "c.img", &c, &out3.path().join("c"))?;
    wait_indexed(&lan, BLOCKS).await?;
    let fresh = Proxy::spawn(ProxyArgs::new(lan.upstream_url()).cache(node_dir.path(), "64M"))?;
    copy_through(&fresh, "d.img", &d, &out3.path().join("d"))?;
    let s = lan.stats()?;
    ensure!(
        s.cache.counts.held_fill_bytes >= (PIECES / 2 - 1) * PIECE
            && fresh.stats()?.cache.counts.held_fill_bytes == 0,
        "the LAN proxy did not fill D from C for the node: {s}"
    );

    // Blocks the block cache lets go leave the index with it: a node with
    // a 4 MiB cache holds a third of C, and indexes no more than that.
    let (small_dir, out2) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let small = Proxy::spawn(
        ProxyArgs::new(server.upstream_url())
            .cache(small_dir.path(), "4M")
            .cache_banks(1),
    )?;
    copy_through(&small, "c.img", &c, &out2.path().join("c"))?;
    let s = small.stats()?;
    let held = s.cache.frames_in_use * 16;
    let s = small.wait_for("file_cache.blocks_forgotten", WAIT, |s| {
        s.file_cache.blocks_forgotten >= BLOCKS - held
    })?;
    ensure!(
        s.file_cache.blocks_indexed - s.file_cache.blocks_forgotten <= held,
        "the index keeps blocks the cache let go: {s}"
    );
    Ok(())
}
