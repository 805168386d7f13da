//! An upstream outage under the FUSE mount (`gvfs-proxy --mount DIR`):
//! nfs-ganesha behind `gvfs-wanlink`, cut and restored. A read waits like
//! a hard mount by default, and fails with EIO after `--upstream-timeout`.
//!
//! Skipped (with a message) only when `/dev/fuse` or `fusermount3` is
//! missing; the tests run as root, as the CI does.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use gvfs_testbed::data::compare_bytes;
use gvfs_testbed::fuse::wan::{Wan, outcome, read_on_a_thread, read_within};
use gvfs_testbed::fuse::{MountPoint, mounted};
use gvfs_testbed::require_fuse;
use gvfs_testbed::{Proxy, ProxyArgs};

/// How long a read must still be waiting while the link is cut.
const STILL_BLOCKED: Duration = Duration::from_secs(3);
/// How long the read may take to complete after the link is restored.
const AFTER_RESTORE: Duration = Duration::from_secs(60);
/// `--upstream-timeout` of the soft-mount case, seconds.
const UPSTREAM_TIMEOUT: u64 = 2;
/// How long a read may be refused for before `--upstream-timeout` can
/// have passed: it must still be waiting then.
const BEFORE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long after the cut a read must have failed with
/// `--upstream-timeout 2`.
const FAILED_WITHIN: Duration = Duration::from_secs(20);

/// How many calls the mount's file system made that failed below it
/// (`mount.failed` of `gvfsctl stats`).
fn failed_below(p: &Proxy) -> Result<u64> {
    Ok(p.stats()?.mount()?.counts.failed)
}

/// Default (hard) behaviour: `name` (looked up and opened while the link
/// is up, never read) is read on a thread while the link is cut in `mode`;
/// the read must still be waiting after [`STILL_BLOCKED`] (no error, no
/// data), then complete with the right bytes once the link is restored.
/// Returns how long it took after the restore.
fn hard_outage(
    wan: &mut Wan,
    p: &Proxy,
    mnt: &MountPoint,
    mode: &str,
    name: &str,
    bytes: &[u8],
) -> Result<Duration> {
    let f = File::open(mnt.path().join(name))?;
    let down = wan.down_bytes()?;
    let failed = failed_below(p)?;
    wan.cut(mode)?;
    let rx = read_on_a_thread(f, bytes.len());
    match rx.recv_timeout(STILL_BLOCKED) {
        Err(mpsc::RecvTimeoutError::Timeout) => {}
        Ok(r) => {
            wan.restore()?;
            bail!(
                "cut {mode}: the read of {name} finished during the outage ({}), \
                 expected it to wait like a hard mount; proxy output:\n{}",
                outcome(&r),
                p.output()
            );
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => bail!("the reading thread died"),
    }
    let restored = Instant::now();
    wan.restore()?;
    let got = match rx.recv_timeout(AFTER_RESTORE) {
        Ok(Ok(got)) => got,
        Ok(Err(e)) => bail!(
            "cut {mode}: the read of {name} failed after the restore: {e} (errno {:?}); \
             proxy output:\n{}",
            e.raw_os_error(),
            p.output()
        ),
        Err(_) => bail!(
            "cut {mode}: the read of {name} still waits {AFTER_RESTORE:?} after the restore; \
             proxy output:\n{}",
            p.output()
        ),
    };
    let took = restored.elapsed();
    compare_bytes(bytes, &got)
        .with_context(|| format!("cut {mode}: {name} read after the outage"))?;
    // No call below the mount gave up in the meantime (the kernel would
    // have asked again and hidden it).
    let failed_since = failed_below(p)? - failed;
    ensure!(
        failed_since == 0,
        "cut {mode}: {failed_since} calls failed below the mount during the outage, \
         expected them to wait; proxy output:\n{}",
        p.output()
    );
    let crossed = wan.down_bytes()? - down;
    ensure!(
        crossed >= bytes.len() as u64,
        "cut {mode}: only {crossed} bytes came back through the link for a {}-byte read",
        bytes.len()
    );
    Ok(took)
}

/// With `--upstream-timeout 2`: `name` (looked up and opened while the
/// link is up) is read on a thread while the link is cut in `mode`; the
/// read must still be waiting after [`BEFORE_TIMEOUT`], then fail with EIO
/// within [`FAILED_WITHIN`] of the cut. After the restore the same file
/// and `fresh` (never read) read back whole. Returns how long the failure
/// took after the cut.
fn soft_outage(
    wan: &mut Wan,
    p: &Proxy,
    mnt: &MountPoint,
    mode: &str,
    (name, bytes): (&str, &[u8]),
    (fresh, fresh_bytes): (&str, &[u8]),
) -> Result<Duration> {
    let f = File::open(mnt.path().join(name))?;
    wan.cut(mode)?;
    let cut = Instant::now();
    let rx = read_on_a_thread(f, bytes.len());
    let early = rx.recv_timeout(BEFORE_TIMEOUT);
    let ended_early = early.is_ok();
    let failed = match early {
        Err(mpsc::RecvTimeoutError::Timeout) => {
            rx.recv_timeout(FAILED_WITHIN.saturating_sub(cut.elapsed()))
        }
        other => other,
    };
    let took = cut.elapsed();
    wan.restore()?;
    match (ended_early, failed) {
        (false, Ok(Err(e))) if e.raw_os_error() == Some(libc::EIO) => {}
        (true, Ok(r)) => bail!(
            "cut {mode}, --upstream-timeout {UPSTREAM_TIMEOUT}: the read of {name} ended \
             after {took:?}, before the timeout could pass ({}); proxy output:\n{}",
            outcome(&r),
            p.output()
        ),
        (_, Ok(r)) => bail!(
            "cut {mode}, --upstream-timeout {UPSTREAM_TIMEOUT}: the read of {name} gave {} \
             after {took:?}, expected EIO; proxy output:\n{}",
            outcome(&r),
            p.output()
        ),
        (_, Err(_)) => bail!(
            "cut {mode}, --upstream-timeout {UPSTREAM_TIMEOUT}: the read of {name} still \
             waits {took:?} after the cut, expected EIO; proxy output:\n{}",
            p.output()
        ),
    }
    let again = read_within(&mnt.path().join(name), AFTER_RESTORE)
        .with_context(|| format!("cut {mode}: {name} again after the restore"))?;
    compare_bytes(bytes, &again)
        .with_context(|| format!("cut {mode}: {name} after the restore"))?;
    let got = read_within(&mnt.path().join(fresh), AFTER_RESTORE)
        .with_context(|| format!("cut {mode}: {fresh} after the restore"))?;
    compare_bytes(fresh_bytes, &got)
        .with_context(|| format!("cut {mode}: {fresh} after the restore"))?;
    Ok(took)
}

/// A mount whose upstream (nfs-ganesha, over gvfs-wanlink relays, no block
/// cache: every read goes upstream) goes away. By default the proxy waits
/// like a hard NFS mount: a read during the outage is still waiting after
/// 3 s, and completes with the right bytes once the link is back, for a
/// blackhole cut (bytes held, then delivered) and a reset cut (connections
/// reset, the proxy reconnects). With `--upstream-timeout 2` the same read
/// fails with EIO (not at once, and within 20 s), and the proxy serves
/// again after the restore.
#[test]
fn an_upstream_outage_blocks_like_a_hard_mount_then_fails_with_eio_after_the_timeout() -> Result<()>
{
    require_fuse!();
    let mut wan = Wan::start()?;
    let modes = ["blackhole", "reset"];
    let mut files = BTreeMap::new();
    for (i, mode) in modes.iter().enumerate() {
        let seed = 120 + 10 * i as u64;
        for (j, kind) in ["hard", "soft", "fresh"].iter().enumerate() {
            let name = format!("{kind}-{mode}");
            let bytes = wan.place(&name, seed + j as u64)?;
            files.insert(name, bytes);
        }
    }
    let mut timings = Vec::new();

    // Hard (the default).
    let mnt = MountPoint::new()?;
    let mut p = mounted(ProxyArgs::new(wan.upstream_url()), &mnt)?;
    let listed = fs::read_dir(mnt.path())?.count();
    ensure!(
        listed == files.len(),
        "{listed} entries listed, expected {}",
        files.len()
    );
    for mode in modes {
        let name = format!("hard-{mode}");
        let took = hard_outage(&mut wan, &p, &mnt, mode, &name, &files[&name])?;
        timings.push(format!("hard, cut {mode}: done {took:?} after the restore"));
    }
    let exit = p.terminate()?;
    ensure!(
        exit.success(),
        "exit {exit} on SIGTERM; output:\n{}",
        p.output()
    );
    drop(mnt);

    // Soft: --upstream-timeout 2.
    let mnt = MountPoint::new()?;
    let p = mounted(
        ProxyArgs::new(wan.upstream_url()).upstream_timeout(UPSTREAM_TIMEOUT),
        &mnt,
    )?;
    for mode in modes {
        let (soft, fresh) = (format!("soft-{mode}"), format!("fresh-{mode}"));
        let took = soft_outage(
            &mut wan,
            &p,
            &mnt,
            mode,
            (&soft, &files[&soft]),
            (&fresh, &files[&fresh]),
        )?;
        timings.push(format!(
            "--upstream-timeout {UPSTREAM_TIMEOUT}, cut {mode}: EIO {took:?} after the cut"
        ));
    }
    eprintln!("{}", timings.join("\n"));
    Ok(())
}
