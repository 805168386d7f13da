//! The gvfs extension program between proxies of different builds: a
//! node fetches a compress-and-copy image whole through its upstream
//! proxy, with nfs-ganesha as the image server and libnfs as the client.
//!
//! Two proxies of this build agree on version 2 with HELLO, and fetch with
//! FETCH_CLASS (each call carrying its priority class). A proxy of the
//! build before version 2 (no HELLO; `GVFS_OLD_BINS` names the directory
//! of its `gvfs-proxy`) works on either side: as the upstream, this build
//! learns from its PROG_MISMATCH to speak version 1; as the node, it
//! speaks version 1 to this build, which still serves it. The older peer's
//! test is ignored unless asked for, as CI has no older binary:
//!
//! ```text
//! git worktree add /tmp/old 0035e95 && (cd /tmp/old && cargo build -p gvfs-proxy --bins)
//! GVFS_OLD_BINS=/tmp/old/target/debug cargo test --test ext_versions -- --include-ignored
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use gvfs_testbed::data::write_sparse_file;
use gvfs_testbed::libnfs::nfs_cat;
use gvfs_testbed::proxy::gvfsctl_local as gvfsctl;
use gvfs_testbed::{Ganesha, Proxy, ProxyArgs};

const MIB: u64 = 1 << 20;

/// How long a whole-file fetch may take.
const WAIT: Duration = Duration::from_secs(30);

/// A 4 MiB image with data in its first and last chunk (two chunks to
/// FETCH: the zero map says the others are zeros), marked for
/// compress-and-copy.
fn image(g: &Ganesha) -> Result<PathBuf> {
    let path = g.export_dir().join("image.raw");
    write_sparse_file(&path, 4 * MIB, 7, &[(0, MIB), (3 * MIB, MIB)])?;
    gvfsctl(&["meta", "gen", &path.display().to_string(), "--compress"])?;
    Ok(path)
}

/// The proxy binary of the build before version 2, from `GVFS_OLD_BINS`.
fn old_binary() -> Result<PathBuf> {
    let dir = std::env::var_os("GVFS_OLD_BINS")
        .context("GVFS_OLD_BINS is not set: see this file's doc")?;
    let bin = PathBuf::from(dir).join("gvfs-proxy");
    ensure!(bin.is_file(), "no {}", bin.display());
    Ok(bin)
}

/// Reads the image through a node proxy (of `binary`, or this build's)
/// over `server`, checks every byte, and that the node fetched it whole
/// and served it from its file cache; returns the server's extension
/// counters (`fetch_calls`, `hello_calls`, and the FETCH_CLASS calls of
/// every class).
fn fetch_whole(src: &Path, server: &Proxy, binary: Option<&Path>) -> Result<(u64, u64, u64)> {
    let cache = tempfile::tempdir()?;
    let mut args = ProxyArgs::new(server.upstream_url()).cache(cache.path(), "16M");
    if let Some(b) = binary {
        args = args.binary(b);
    }
    let node = Proxy::spawn(args)?;
    let want = std::fs::read(src)?;
    ensure!(
        nfs_cat(&node.url("image.raw"))? == want,
        "the node served other bytes"
    );
    node.wait_files_complete(1, WAIT)?;
    ensure!(
        nfs_cat(&node.url("image.raw"))? == want,
        "the node served other bytes from its file cache"
    );
    let e = server.stats()?.ext;
    let classed = e.class_calls_demand
        + e.class_calls_profile
        + e.class_calls_background
        + e.class_calls_bulk;
    Ok((e.fetch_calls, e.hello_calls, classed))
}

#[test]
fn proxies_of_this_build_agree_on_version_2() -> Result<()> {
    let g = Ganesha::start()?;
    let src = image(&g)?;
    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    let (fetches, hellos, classed) = fetch_whole(&src, &server, None)?;
    ensure!(
        fetches >= 2,
        "the image did not come by FETCH: {fetches} calls"
    );
    ensure!(hellos >= 1, "no HELLO reached the upstream");
    ensure!(
        classed == fetches,
        "{classed} of {fetches} FETCHes came as FETCH_CLASS"
    );
    Ok(())
}

#[test]
#[ignore = "needs GVFS_OLD_BINS, the build before extension version 2 (see the file's doc)"]
fn a_proxy_of_the_build_before_version_2_works_on_either_side() -> Result<()> {
    let old = old_binary()?;
    let g = Ganesha::start()?;
    let src = image(&g)?;

    // An older upstream: this node speaks version 1 to it.
    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()).binary(&old))?;
    let (fetches, _, _) = fetch_whole(&src, &server, None)?;
    ensure!(fetches >= 2, "an older upstream got {fetches} FETCHes");

    // An older node: this upstream serves its version-1 calls.
    let server = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    let (fetches, hellos, classed) = fetch_whole(&src, &server, Some(&old))?;
    ensure!(fetches >= 2, "an older node sent {fetches} FETCHes");
    ensure!(hellos == 0, "an older node sent HELLO?");
    ensure!(classed == 0, "an older node sent FETCH_CLASS?");
    Ok(())
}
