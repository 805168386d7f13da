//! The Linux kernel NFS client as a peer: a TCG guest booting Debian's
//! kernel mounts the export through gvfs and runs a real workload
//! (`src/kernel/init.sh`: create, dd, read back after dropping caches,
//! rename, links, truncate, a 300-entry directory, remount), then the test
//! compares nfs-ganesha's export directory with what the guest wrote: names,
//! kinds, modes, owners, sizes, link counts, symbolic links, MD5s and the
//! modification times the guest set.
//!
//! Through (1) nfs-ganesha alone, the control: the workload's expectations
//! hold on a real server; (2) a plain proxy; (3) a write-back block cache,
//! whose data reach the origin only at `gvfsctl writeback --wait`; (4) a
//! chain, cache proxy -> proxy -> ganesha; (5) a write-back cache killed
//! and restarted twice under the running client.
//!
//! Fetches Debian's kernel on first use (`apt-get download`) and builds the
//! guest's mount helper with `gcc -static`; see `scripts/test.sh`.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use gvfs_testbed::kernel::{self, GuestReport, NfsClientKit, Server, Workload};
use gvfs_testbed::{Ganesha, Proxy, ProxyArgs, WritePolicy};

/// Boots the guest on `server`; fails unless every step passed.
fn workload(server: &Server, what: Workload, label: &str) -> Result<GuestReport> {
    let kit = NfsClientKit::shared().context("preparing the NFS client guest's kit")?;
    let work = tempfile::Builder::new().prefix("gvfs-kernel-").tempdir()?;
    let report = kernel::run_guest(&kit, server, what, work.path())
        .with_context(|| format!("{label}: running the kernel NFS client guest"))?;
    eprintln!("{label}: {}", report.summary());
    report
        .ensure_passed()
        .with_context(|| format!("{label}: the workload failed"))?;
    Ok(report)
}

/// Fails unless ganesha's export directory holds what the guest wrote.
fn origin_matches(report: &GuestReport, export: &Path, label: &str) -> Result<()> {
    report
        .compare_origin(export)
        .with_context(|| format!("{label}: comparing the origin with what the guest wrote"))
}

fn cache_proxy(upstream: String, dir: &Path) -> Result<Proxy> {
    cache_proxy_at(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), upstream, dir)
}

fn cache_proxy_at(listen: SocketAddr, upstream: String, dir: &Path) -> Result<Proxy> {
    Proxy::spawn(
        ProxyArgs::new(upstream)
            .listen(listen)
            .cache_dir(dir)
            .write_policy(WritePolicy::WriteBack),
    )
}

/// Writes the cache's dirty data back; checks there was some beforehand
/// and the origin did not have the guest's big file yet.
fn write_back(front: &Proxy, report: &GuestReport, export: &Path) -> Result<()> {
    let dirty = front.stats()?.cache.dirty_bytes;
    ensure!(
        dirty > 0,
        "the write-back cache kept nothing dirty: the guest's writes went upstream at once"
    );
    ensure!(
        origin_matches(report, export, "before write-back").is_err(),
        "the origin had everything before the write-back"
    );
    let said = front.write_back()?;
    ensure!(said.contains("done"), "gvfsctl writeback said {said:?}");
    let left = front.stats()?.cache.dirty_bytes;
    ensure!(left == 0, "{left} bytes still dirty after the write-back");
    Ok(())
}

#[test]
fn kernel_client_runs_the_workload_on_ganesha_alone() -> Result<()> {
    let g = Ganesha::start()?;
    let report = workload(&Server::ganesha(&g), Workload::default(), "ganesha")?;
    origin_matches(&report, g.export_dir(), "ganesha")
}

#[test]
fn kernel_client_runs_the_workload_through_a_proxy() -> Result<()> {
    let g = Ganesha::start()?;
    let p = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    let report = workload(&Server::proxy(&p)?, Workload::default(), "proxy")
        .with_context(|| format!("proxy output:\n{}", p.output()))?;
    origin_matches(&report, g.export_dir(), "proxy")
}

/// Through a write-back cache proxy over ganesha, then `gvfsctl writeback`.
fn through_cache(what: Workload, label: &str) -> Result<()> {
    let g = Ganesha::start()?;
    let cache = tempfile::tempdir()?;
    let p = cache_proxy(g.upstream_url(), cache.path())?;
    let report = workload(&Server::proxy(&p)?, what, label)
        .with_context(|| format!("cache proxy output:\n{}", p.output()))?;
    write_back(&p, &report, g.export_dir())?;
    origin_matches(&report, g.export_dir(), label)
}

/// An mtime the guest sets after writing (`touch -d`) is kept too: the
/// cache writes that file back before forwarding the SETATTR.
#[test]
fn kernel_client_writes_reach_the_origin_after_write_back() -> Result<()> {
    through_cache(Workload::default(), "cache")
}

#[test]
fn kernel_client_writes_reach_the_origin_through_a_chain() -> Result<()> {
    let g = Ganesha::start()?;
    let middle = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    let cache = tempfile::tempdir()?;
    let front = cache_proxy(middle.upstream_url(), cache.path())?;
    let report =
        workload(&Server::proxy(&front)?, Workload::default(), "chain").with_context(|| {
            format!(
                "front (cache) proxy output:\n{}\nmiddle proxy output:\n{}",
                front.output(),
                middle.output()
            )
        })?;
    write_back(&front, &report, g.export_dir())?;
    origin_matches(&report, g.export_dir(), "chain after write-back")
}

/// The cache proxy is killed (SIGKILL) and started again on the same port
/// and cache directory twice while the guest works: as it finishes writing
/// its first file (the committed data must be recovered from the cache),
/// and a moment into its parallel writers (WRITEs in flight are resent, and
/// the write verifier changes if the restart lost any). The hard mount
/// rides through, and every byte the guest wrote reaches the origin at
/// write-back.
#[test]
fn kernel_client_rides_through_cache_proxy_crashes() -> Result<()> {
    let g = Ganesha::start()?;
    let cache = tempfile::tempdir()?;
    let mut p = cache_proxy(g.upstream_url(), cache.path())?;
    let addr = p.addr();
    let kit = NfsClientKit::shared().context("preparing the NFS client guest's kit")?;
    let work = tempfile::Builder::new().prefix("gvfs-kernel-").tempdir()?;
    let mut before = Vec::new();
    let report = kernel::run_guest_with(
        &kit,
        &Server::proxy(&p)?,
        Workload::default(),
        work.path(),
        |step| {
            match step {
                "write-big" => {}
                // The step before `parallel`: let its writers start.
                "read-odd" => std::thread::sleep(Duration::from_millis(300)),
                _ => return Ok(()),
            }
            before.push(p.output());
            p.kill();
            p = cache_proxy_at(addr, g.upstream_url(), cache.path())
                .with_context(|| format!("restarting the cache proxy after {step}"))?;
            Ok(())
        },
    )?;
    eprintln!("crashes: {}", report.summary());
    ensure!(before.len() == 2, "{} crashes, expected 2", before.len());
    report.ensure_passed().with_context(|| {
        format!(
            "the workload failed across crashes of the cache proxy; its output before \
             each:\n{}\nafter the last:\n{}",
            before.join("\n----\n"),
            p.output()
        )
    })?;
    write_back(&p, &report, g.export_dir())?;
    origin_matches(&report, g.export_dir(), "crashes, after write-back")
}
