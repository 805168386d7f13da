//! Metadata actions through the real binaries, with nfs-ganesha and
//! libnfs: `gvfsctl meta gen` writes zero-block maps beside images at the
//! origin; a caching proxy uses them so zero blocks never cross to
//! upstream, and ignores metadata that is corrupt, truncated, of another
//! version or stale, with the same bytes either way.

use std::path::Path;

use anyhow::{Context, Result, ensure};
use gvfs_testbed::data::{compare_file_with, write_sparse_file};
use gvfs_testbed::libnfs::nfs_cat;
use gvfs_testbed::{Ganesha, Proxy, ProxyArgs};

const MIB: u64 = 1 << 20;

use gvfs_testbed::proxy::gvfsctl_local as gvfsctl;

/// A 24 MiB "memory image": data in a few places, zeros elsewhere (holes
/// and written zeros alike), with an odd tail.
fn make_image(path: &Path, seed: u64) -> Result<u64> {
    let size = 24 * MIB + 1000;
    write_sparse_file(
        path,
        size,
        seed,
        &[
            (0, 64 * 1024),
            (3 * MIB + 4096, 5 * 4096),
            (10 * MIB, 2 * MIB),
            (24 * MIB, 1000),
        ],
    )?;
    Ok(size)
}

#[test]
fn zero_blocks_are_answered_locally_and_the_bytes_are_identical() -> Result<()> {
    let g = Ganesha::start()?;
    let image = g.export_dir().join("mem.img");
    let size = make_image(&image, 1)?;
    let shown = gvfsctl(&[
        "meta",
        "gen",
        &image.display().to_string(),
        "--block-size",
        "4K",
    ])?;
    ensure!(shown.contains("mem.img"), "meta gen said: {shown}");
    ensure!(g.export_dir().join(".mem.img.gvfsmeta").is_file());
    let want = std::fs::read(&image)?;

    let with = tempfile::tempdir()?;
    let p = Proxy::spawn(ProxyArgs::new(g.upstream_url()).cache_dir(with.path()))?;
    let got = nfs_cat(&p.url("mem.img"))?;
    compare_file_with(&got, &image).context("read with metadata")?;
    let stats = p.stats()?;
    let meta = &stats.meta;
    let cache = &stats.cache;
    ensure!(meta.meta_found == 1, "stats: {stats}");
    // Data: 64 KiB + 20 KiB + 2 MiB + 1000 bytes, in 35 of the cache's
    // 64 KiB blocks, which it fetches whole; read-ahead skips known zeros.
    let fetched = cache.counts.fetched_bytes;
    ensure!(
        fetched <= 35 * 65_536 && meta.zero_bytes >= size - 35 * 65_536,
        "fetched {fetched} bytes of a {size}-byte image with 21 MiB of zeros: {stats}"
    );
    // Reading it again: every READ below the metadata layer is one of its
    // data runs, or the one READ of the metadata file (zero blocks never go
    // below it), all cache hits now.
    let again = nfs_cat(&p.url("mem.img"))?;
    ensure!(again == want);
    let after = p.stats()?;
    let below = after.cache.counts.reads;
    ensure!(
        below == after.meta.data_reads + 1 && after.meta.zero_reads > 0,
        "zero blocks went below the metadata layer: {after}"
    );
    ensure!(
        after.cache.counts.fetched_bytes == fetched,
        "the second read fetched from upstream: {after}"
    );

    // Without metadata: the same bytes, and the zeros are fetched.
    let without = tempfile::tempdir()?;
    let q = Proxy::spawn(
        ProxyArgs::new(g.upstream_url())
            .cache_dir(without.path())
            .no_meta(),
    )?;
    ensure!(nfs_cat(&q.url("mem.img"))? == want, "read without metadata");
    ensure!(
        q.stats()?.cache.counts.fetched_bytes >= size - 64 * 1024,
        "without metadata the whole file is fetched"
    );
    Ok(())
}

#[test]
fn bad_metadata_is_ignored_with_a_warning_and_the_data_stays_right() -> Result<()> {
    let g = Ganesha::start()?;
    let image = g.export_dir().join("vm.img");
    make_image(&image, 2)?;
    let image_s = image.display().to_string();
    let meta_path = g.export_dir().join(".vm.img.gvfsmeta");
    gvfsctl(&["meta", "gen", &image_s, "--block-size", "64K"])?;
    let good = std::fs::read(&meta_path)?;
    let want = std::fs::read(&image)?;
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut flipped = good.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x10;
    cases.push(("corrupt", flipped));
    cases.push(("truncated", good[..good.len() - 7].to_vec()));
    let mut version = good.clone();
    version[8] = version[8].wrapping_add(7);
    cases.push(("another version", version));
    cases.push(("empty", Vec::new()));
    for (what, bytes) in cases {
        std::fs::write(&meta_path, &bytes)?;
        let cache = tempfile::tempdir()?;
        let p = Proxy::spawn(ProxyArgs::new(g.upstream_url()).cache_dir(cache.path()))?;
        let got = nfs_cat(&p.url("vm.img"))?;
        ensure!(got == want, "{what}: wrong bytes");
        let stats = p.stats()?;
        ensure!(
            stats.meta.meta_rejected == 1 && stats.meta.zero_bytes == 0,
            "{what}: {stats}"
        );
        ensure!(
            p.output().contains("ignoring metadata"),
            "{what}: no warning:\n{}",
            p.output()
        );
    }
    // Stale: the image changed after its metadata was made (a zero block
    // now holds data the old map calls zero).
    std::fs::write(&meta_path, &good)?;
    std::thread::sleep(std::time::Duration::from_millis(20));
    gvfs_testbed::data::write_at(&image, 5 * MIB, b"no longer zero")?;
    let want = std::fs::read(&image)?;
    let cache = tempfile::tempdir()?;
    let p = Proxy::spawn(ProxyArgs::new(g.upstream_url()).cache_dir(cache.path()))?;
    ensure!(nfs_cat(&p.url("vm.img"))? == want, "stale: wrong bytes");
    let stats = p.stats()?;
    ensure!(stats.meta.meta_rejected == 1, "stale: {stats}");
    ensure!(
        p.output().contains("stale"),
        "no stale warning:\n{}",
        p.output()
    );
    Ok(())
}

/// A LOOKUP starts looking for the file's metadata, so it is known by the
/// time the client reads: no READ has been sent when the proxy has found it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_finds_the_metadata_before_any_read() -> Result<()> {
    let g = Ganesha::start()?;
    let image = g.export_dir().join("early.img");
    make_image(&image, 3)?;
    gvfsctl(&["meta", "gen", &image.display().to_string()])?;
    let cache = tempfile::tempdir()?;
    let p = Proxy::spawn(ProxyArgs::new(g.upstream_url()).cache_dir(cache.path()))?;
    let nfs = gvfs_testbed::nfsclient::NfsClient::of_proxy(&p, std::time::Duration::from_secs(30))
        .await?;
    ensure!(nfs.lookup(&nfs.root, "early.img").await?.is_some());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let stats = loop {
        let s = p.stats()?;
        if s.meta.meta_found == 1 || std::time::Instant::now() > deadline {
            break s;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    ensure!(
        stats.meta.meta_found == 1 && stats.cache.counts.reads == 1,
        "after a LOOKUP (only the metadata file read): {stats}"
    );
    // The client's read uses it, with no second look.
    compare_file_with(&nfs_cat(&p.url("early.img"))?, &image)?;
    let after = p.stats()?;
    ensure!(
        after.meta.meta_found == 1 && after.meta.zero_reads > 0,
        "{after}"
    );
    Ok(())
}

/// Seconds and nanoseconds.
type Time = (u64, u32);

/// The size, mtime and ctime of `path` as GETATTR reports them.
fn times(path: &Path) -> Result<(u64, Time, Time)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    let t = |s: i64, ns: i64| (s as u64, ns as u32);
    Ok((
        m.len(),
        t(m.mtime(), m.mtime_nsec()),
        t(m.ctime(), m.ctime_nsec()),
    ))
}

/// What anyone who may write in `image`'s directory can plant: a map that
/// calls every block zeros, with the size and times GETATTR shows.
fn forge_all_zeros(image: &Path, meta_path: &Path) -> Result<()> {
    let (size, mtime, ctime) = times(image)?;
    let block_size = 64 * 1024;
    let mut zero = gvfs_metafile::ZeroMap::new(gvfs_metafile::block_count(size, block_size));
    zero.set_zero_range(0, zero.blocks());
    let forged = gvfs_metafile::MetaFile {
        block_size,
        file_size: size,
        mtime,
        ctime,
        actions: gvfs_metafile::Actions::default(),
        compressed_size: 0,
        zero,
        repeats: Vec::new(),
        hashes: None,
    };
    std::fs::write(meta_path, forged.encode())?;
    Ok(())
}

/// Item 4 of issue 20: a user who may write in the directory of root's
/// image plants `.IMAGE.gvfsmeta` with an all-zero map. Proxies believe
/// metadata only from root or the image's owner with no other writers, so
/// they serve the image's real bytes and count the file as not trusted;
/// metadata from the image's owner is still used. The export is
/// No_Root_Squash, so the test (root) sets owners on disk directly.
#[test]
fn forged_metadata_from_another_user_is_not_trusted() -> Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt, chown};
    let g = Ganesha::start()?;
    let image = g.export_dir().join("root.img");
    let size = make_image(&image, 4)?;
    let want = std::fs::read(&image)?;
    let meta_path = g.export_dir().join(".root.img.gvfsmeta");
    // (owner, group, mode) of the planted file: another user's; root's but
    // writable by anyone; root's, writable by a group that cannot write
    // the image.
    for (uid, gid, mode) in [(1000, 1000, 0o644), (0, 0, 0o666), (0, 50, 0o664)] {
        forge_all_zeros(&image, &meta_path)?;
        chown(&meta_path, Some(uid), Some(gid))?;
        std::fs::set_permissions(&meta_path, std::fs::Permissions::from_mode(mode))?;
        let cache = tempfile::tempdir()?;
        let p = Proxy::spawn(ProxyArgs::new(g.upstream_url()).cache_dir(cache.path()))?;
        let got = nfs_cat(&p.url("root.img"))?;
        compare_file_with(&got, &image)
            .with_context(|| format!("forged metadata {uid}:{gid} {mode:o} was believed"))?;
        let stats = p.stats()?;
        let meta = &stats.meta;
        ensure!(
            meta.meta_untrusted == 1
                && meta.meta_rejected == 1
                && meta.meta_found == 0
                && meta.zero_bytes == 0,
            "{uid}:{gid} {mode:o}: {stats}"
        );
        ensure!(
            p.output().contains("not trusted"),
            "no warning:\n{}",
            p.output()
        );
    }
    // The image's owner's own metadata, made by `meta gen` as root (which
    // gives it the image's owner), is used.
    chown(&image, Some(1000), Some(1000))?;
    gvfsctl(&["meta", "gen", &image.display().to_string()])?;
    let m = std::fs::metadata(&meta_path)?;
    ensure!(
        (m.uid(), m.gid()) == (1000, 1000),
        "meta gen wrote it as {}:{}",
        m.uid(),
        m.gid()
    );
    let cache = tempfile::tempdir()?;
    let p = Proxy::spawn(ProxyArgs::new(g.upstream_url()).cache_dir(cache.path()))?;
    ensure!(nfs_cat(&p.url("root.img"))? == want, "owner's metadata");
    let stats = p.stats()?;
    let meta = &stats.meta;
    ensure!(
        meta.meta_found == 1
            && meta.meta_untrusted == 0
            && meta.zero_reads > 0
            && meta.zero_bytes >= size - 3 * MIB,
        "the owner's metadata was not used: {stats}"
    );
    Ok(())
}

/// Item 5 of issue 20: the image changes where its map says zeros and its
/// mtime is put back (`touch -d`): size and mtime match the metadata, the
/// ctime does not, so the metadata is stale and the real bytes are served.
/// Made again with `meta gen`, it is used.
#[test]
fn a_change_with_its_mtime_put_back_makes_metadata_stale() -> Result<()> {
    let g = Ganesha::start()?;
    let image = g.export_dir().join("put-back.img");
    make_image(&image, 5)?;
    gvfsctl(&["meta", "gen", &image.display().to_string()])?;
    let (_, mtime, _) = times(&image)?;
    std::thread::sleep(std::time::Duration::from_millis(20));
    gvfs_testbed::data::write_at(&image, 5 * MIB, b"data where the map says zeros")?;
    let when = std::time::UNIX_EPOCH + std::time::Duration::new(mtime.0, mtime.1);
    std::fs::File::options()
        .write(true)
        .open(&image)?
        .set_modified(when)?;
    ensure!(times(&image)?.1 == mtime, "mtime not put back");
    let want = std::fs::read(&image)?;

    let cache = tempfile::tempdir()?;
    let p = Proxy::spawn(ProxyArgs::new(g.upstream_url()).cache_dir(cache.path()))?;
    compare_file_with(&nfs_cat(&p.url("put-back.img"))?, &image)
        .context("read through metadata whose mtime was put back")?;
    let stats = p.stats()?;
    ensure!(
        stats.meta.meta_rejected == 1 && stats.meta.zero_bytes == 0,
        "{stats}"
    );
    ensure!(p.output().contains("stale"), "{}", p.output());
    let shown = gvfsctl(&["meta", "show", &image.display().to_string()])?;
    ensure!(
        shown.contains("no: the file's ctime is now"),
        "meta show said: {shown}"
    );

    gvfsctl(&["meta", "gen", &image.display().to_string()])?;
    let cache = tempfile::tempdir()?;
    let p = Proxy::spawn(ProxyArgs::new(g.upstream_url()).cache_dir(cache.path()))?;
    ensure!(nfs_cat(&p.url("put-back.img"))? == want, "regenerated");
    let stats = p.stats()?;
    ensure!(
        stats.meta.meta_found == 1 && stats.meta.zero_reads > 0,
        "{stats}"
    );
    Ok(())
}
