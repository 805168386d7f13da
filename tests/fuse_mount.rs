//! The FUSE mount's life (`gvfs-proxy --mount DIR`): refused directories,
//! a dead mount left by SIGKILL (`--mount-keep none`) detached, SIGTERM's unmount after write-back,
//! `gvfsctl status`, the TOML key, `--listen none` (the mount and no NFS
//! listener).
//!
//! Skipped (with a message) only when `/dev/fuse` or `fusermount3` is
//! missing; the tests run as root, as the CI does.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use gvfs_proxy::exit::ExitCode;
use gvfs_testbed::data::{MIB, compare_file_with, random_bytes};
use gvfs_testbed::fuse::{self, MountPoint, drop_caches, mounted};
use gvfs_testbed::process::{self};
use gvfs_testbed::proxy::{gvfsctl, proxy_binary};
use gvfs_testbed::require_fuse;
use gvfs_testbed::{Proxy, ProxyArgs, Status};

/// Runs gvfs-proxy serving `origin` with `--mount mnt`, expecting it to refuse at once: returns its stderr
/// once it exited with the local-resource code (4).
fn refused_mount(origin: &Path, mnt: &Path) -> Result<String> {
    let ctl = tempfile::tempdir()?;
    let mut cmd = Command::new(proxy_binary()?);
    cmd.args(["--listen", "127.0.0.1:0", "--control"])
        .arg(ctl.path().join("ctl.sock"))
        .arg("--upstream")
        .arg(format!("dir:{}", origin.display()))
        .arg("--mount")
        .arg(mnt);
    let out = process::run(&mut cmd, Duration::from_secs(30))?;
    let stderr = out.stderr_text();
    let want = ExitCode::LocalResource.code();
    ensure!(
        out.status.code() == Some(i32::from(want)),
        "gvfs-proxy --mount {} exited with {}, expected {want}; stderr:\n{stderr}",
        mnt.display(),
        out.status
    );
    Ok(stderr)
}

#[test]
fn a_missing_or_non_empty_directory_is_refused() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    let missing = mnt.path().join("missing");
    let said = refused_mount(origin.path(), &missing)?;
    ensure!(said.contains("does not exist"), "stderr: {said}");
    fs::write(mnt.path().join("something"), b"x")?;
    let said = refused_mount(origin.path(), mnt.path())?;
    ensure!(said.contains("not empty"), "stderr: {said}");
    ensure!(!mnt.is_mounted()?, "mounted anyway");
    Ok(())
}

#[test]
fn a_dead_mount_is_detached_and_mounted_afresh() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    // Without a keeper the connection ends with the process.
    let args = ProxyArgs::dir(origin.path())
        .arg("--mount-keep")
        .arg("none");
    let mut p = mounted(args.clone(), &mnt)?;
    fs::write(mnt.path().join("first"), b"first\n")?;
    p.kill();
    ensure!(mnt.is_mounted()?, "no mount left after SIGKILL");
    let statfs = gvfs_testbed::fuse::statvfs(mnt.path());
    ensure!(statfs.is_err(), "statfs of the dead mount succeeded");
    let mut p = mounted(args, &mnt).context("starting again on the dead mount")?;
    ensure!(
        p.output().contains("detaching it"),
        "no word of the dead mount; output:\n{}",
        p.output()
    );
    ensure!(fs::read(mnt.path().join("first"))? == b"first\n");
    fs::write(mnt.path().join("second"), b"second\n")?;
    ensure!(fs::read(origin.path().join("second"))? == b"second\n");
    let status = p.terminate()?;
    ensure!(
        status.success(),
        "exit {status} on SIGTERM; output:\n{}",
        p.output()
    );
    ensure!(!mnt.is_mounted()?, "still mounted after SIGTERM");
    Ok(())
}

#[test]
fn sigterm_writes_back_then_unmounts_and_status_shows_the_mount() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    let cache = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    let mut p = mounted(
        ProxyArgs::dir(origin.path()).cache(cache.path(), "64M"),
        &mnt,
    )?;
    let stats = p.stats()?;
    ensure!(
        stats.mount()?.path == mnt.path().display().to_string(),
        "gvfsctl stats: mount is {:?}, expected path {}",
        stats.status.mount,
        mnt.path().display()
    );
    let bytes = random_bytes(31, 3 * MIB + 1234);
    let mut f = File::create(mnt.path().join("kept"))?;
    f.write_all(&bytes)?;
    f.sync_all()?;
    drop(f);
    let exit = p.terminate()?;
    ensure!(
        exit.success(),
        "exit {exit} on SIGTERM; output:\n{}",
        p.output()
    );
    ensure!(!mnt.is_mounted()?, "still mounted after SIGTERM");
    compare_file_with(&bytes, &origin.path().join("kept"))
        .context("the cache's dirty data at the origin after SIGTERM")?;
    // A proxy without --mount reports none.
    let plain = Proxy::spawn(ProxyArgs::dir(origin.path()))?;
    let status = plain.stats()?.status;
    ensure!(
        status.mount.is_none(),
        "a proxy without --mount reports mount {:?}",
        status.mount
    );
    Ok(())
}

#[test]
fn the_config_file_key_mounts_too() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    fs::write(origin.path().join("placed"), b"placed at the origin\n")?;
    let cfg_dir = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    let cfg = cfg_dir.path().join("proxy.toml");
    fs::write(&cfg, format!("mount = \"{}\"\n", mnt.path().display()))?;
    let mut p = Proxy::spawn(ProxyArgs::dir(origin.path()).config(&cfg))?;
    ensure!(
        mnt.is_mounted()?,
        "mount = in the config file did not mount"
    );
    ensure!(fs::read(mnt.path().join("placed"))? == b"placed at the origin\n");
    ensure!(p.stats()?.mount()?.path == mnt.path().display().to_string());
    let exit = p.terminate()?;
    ensure!(exit.success(), "exit {exit} on SIGTERM");
    ensure!(!mnt.is_mounted()?, "still mounted after SIGTERM");
    Ok(())
}

/// A `gvfs-proxy` started by hand (not through [`Proxy::spawn`], which
/// waits for `listening on`); killed when dropped.
struct Spawned(Option<std::process::Child>);

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The line a proxy without an NFS listener prints instead of
/// `listening on ADDR`.
const NO_LISTENER_LINE: &str = "no NFS listener (--listen none)";
/// The last line of the proxy's start-up banner.
const BANNER_END: &str = "Stop with Ctrl-C";

/// `--listen none --mount DIR`: the banner says there is no NFS listener
/// (and never `listening on`), the mount serves (a file written through it
/// reads back and is at the origin), `gvfsctl status --json` shows
/// `"listen": "none"` and the mount, the process listens on no TCP port,
/// and SIGTERM exits 0 and unmounts. Without --mount, `--listen none` is a
/// configuration error (exit 2, "nothing to serve").
#[test]
fn listen_none_serves_the_mount_only() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    let ctl = tempfile::tempdir()?;
    let control = ctl.path().join("ctl.sock");
    let mnt = MountPoint::new()?;
    let mut cmd = Command::new(proxy_binary()?);
    cmd.args(["--listen", "none", "--upstream"])
        .arg(format!("dir:{}", origin.path().display()))
        .arg("--mount")
        .arg(mnt.path())
        .arg("--control")
        .arg(&control)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let line = process::describe(&cmd);
    let mut child = cmd.spawn().with_context(|| format!("spawning `{line}`"))?;
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let mut proxy = Spawned(Some(child));
    let (tx, lines) = mpsc::channel::<String>();
    if let Some(out) = stdout {
        thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
    }
    let stderr = stderr.map(|mut err| {
        thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        })
    });
    // The whole banner, up to its last line (or the end of stdout).
    let mut banner = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !banner.iter().any(|l: &String| l.starts_with(BANNER_END)) {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(l) => banner.push(l),
            Err(_) => {
                let child = proxy.0.as_mut().context("the proxy is gone")?;
                let status = child.try_wait()?;
                if status.is_some() {
                    // Gone: its stderr says why.
                    let said = stderr.and_then(|h| h.join().ok()).unwrap_or_default();
                    bail!(
                        "`{line}` exited ({status:?}) before its banner ended; stdout:\n{}\nstderr:\n{said}",
                        banner.join("\n")
                    );
                }
                bail!(
                    "`{line}` printed no `{BANNER_END}` line within 10 s; stdout:\n{}",
                    banner.join("\n")
                );
            }
        }
    }
    let shown = banner.join("\n");
    ensure!(
        banner.iter().any(|l| l == NO_LISTENER_LINE),
        "no `{NO_LISTENER_LINE}` line; stdout:\n{shown}"
    );
    ensure!(
        !banner.iter().any(|l| l.starts_with("listening on")),
        "--listen none printed a `listening on` line; stdout:\n{shown}"
    );
    // The mount is live once the banner is out.
    ensure!(
        mnt.is_mounted()?,
        "{} is not mounted after the banner; stdout:\n{shown}",
        mnt.path().display()
    );
    let ty = fuse::fs_type(mnt.path())?;
    ensure!(ty == fuse::FUSE_SUPER_MAGIC, "f_type {ty:#x}, not FUSE's");

    let bytes = random_bytes(91, 300_001);
    let mut f = File::create(mnt.path().join("only-fuse"))?;
    f.write_all(&bytes)?;
    f.sync_all()?;
    drop(f);
    drop_caches();
    compare_file_with(&bytes, &mnt.path().join("only-fuse"))
        .context("read back through the mount")?;
    compare_file_with(&bytes, &origin.path().join("only-fuse")).context("at the origin")?;

    let out = gvfsctl(&control, &["status", "--json"])?;
    ensure!(
        out.status.success(),
        "gvfsctl status failed: {}",
        out.stderr_text()
    );
    let status: Status =
        serde_json::from_str(&out.stdout_text()).context("parsing gvfsctl status --json")?;
    ensure!(
        status.listen == "none",
        "gvfsctl status --json: listen is {:?}, expected \"none\"",
        status.listen
    );
    ensure!(
        status.mount.as_ref().map(|m| m.path.as_str()) == Some(&*mnt.path().display().to_string()),
        "gvfsctl status --json: mount is {:?}, expected path {}",
        status.mount,
        mnt.path().display()
    );

    let child = proxy.0.as_mut().context("the proxy is gone")?;
    let ports = fuse::listening_tcp_ports(child.id())?;
    ensure!(
        ports.is_empty(),
        "--listen none, yet the proxy listens on TCP ports {ports:?}"
    );

    let (exit, killed) = process::terminate(child, Duration::from_secs(10))?;
    let said = stderr.and_then(|h| h.join().ok()).unwrap_or_default();
    ensure!(!killed, "ignored SIGTERM for 10 s; stderr:\n{said}");
    ensure!(exit.success(), "exit {exit} on SIGTERM; stderr:\n{said}");
    ensure!(!mnt.is_mounted()?, "still mounted after SIGTERM");

    // With nothing to serve, it refuses to start.
    let elsewhere = tempfile::tempdir()?;
    let mut cmd = Command::new(proxy_binary()?);
    cmd.args(["--listen", "none", "--upstream"])
        .arg(format!("dir:{}", elsewhere.path().display()))
        .arg("--control")
        .arg(ctl.path().join("nothing.sock"));
    let out = process::run(&mut cmd, Duration::from_secs(30))?;
    let want = ExitCode::Config.code();
    ensure!(
        out.status.code() == Some(i32::from(want)),
        "--listen none without --mount exited with {}, expected {want}; stderr:\n{}",
        out.status,
        out.stderr_text()
    );
    ensure!(
        out.stderr_text().contains("nothing to serve"),
        "stderr: {}",
        out.stderr_text()
    );
    Ok(())
}
