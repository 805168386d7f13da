//! The FUSE session outlives the proxy that serves it
//! (`gvfs-proxy --mount DIR`): after a kill -9 or a stop while files are
//! open, the same command started again takes the mount over, and the
//! processes using it see a stall, not an error. A read the killed
//! proxy had taken but not answered is sent again by the kernel to the
//! next one (FUSE_NOTIFY_RESEND). Under systemd with a file descriptor
//! store (a fake one here), the store holds the connection instead of a
//! keeper, and gives it to the next start.
//!
//! Skipped (with a message) only when `/dev/fuse` or `fusermount3` is
//! missing; the tests run as root, as the CI does.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use gvfs_testbed::data::{MIB, compare_bytes, random_bytes};
use gvfs_testbed::fuse::wan::Wan;
use gvfs_testbed::fuse::{MountPoint, mounted, wait_until};
use gvfs_testbed::proxy::gvfsctl;
use gvfs_testbed::require_fuse;
use gvfs_testbed::systemd::{FakeSystemd, Notice};
use gvfs_testbed::{Proxy, ProxyArgs};

/// How long a read waiting across a restart may take to finish.
const AFTER_RESTART: Duration = Duration::from_secs(60);

/// How long a step of the mapping process may take.
const STEP: Duration = Duration::from_secs(60);

/// A process reading through the mount, its stdout lines (or, with
/// `lines` false, its whole output) arriving on a channel.
struct Reader {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<std::io::Result<Vec<u8>>>,
}

impl Reader {
    fn start(cmd: &mut Command, lines: bool) -> Result<Self> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("spawning {cmd:?}"))?;
        let stdin = child.stdin.take();
        let mut stdout = child.stdout.take().context("no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            if lines {
                for line in BufReader::new(stdout).lines() {
                    if tx.send(line.map(String::into_bytes)).is_err() {
                        return;
                    }
                }
            } else {
                let mut all = Vec::new();
                let _ = tx.send(stdout.read_to_end(&mut all).map(|_| all));
            }
        });
        Ok(Self {
            child,
            stdin,
            lines: rx,
        })
    }

    fn running(&mut self) -> Result<bool> {
        Ok(self.child.try_wait()?.is_none())
    }

    /// Its whole output, within `within`.
    fn output(&mut self, within: Duration) -> Result<Vec<u8>> {
        let out = self
            .lines
            .recv_timeout(within)
            .with_context(|| format!("no output within {within:?}"))??;
        let status = self.child.wait()?;
        ensure!(status.success(), "the reader exited with {status}");
        Ok(out)
    }

    /// Waits for a line starting with `want`.
    fn expect_line(&mut self, want: &str, within: Duration) -> Result<()> {
        let line = self
            .lines
            .recv_timeout(within)
            .with_context(|| format!("no `{want}` within {within:?}"))??;
        let line = String::from_utf8_lossy(&line).into_owned();
        if !line.starts_with(want) {
            bail!("the mapping process said {line:?}, expected `{want}`");
        }
        Ok(())
    }

    /// Lets it take its next step, and waits for it to say `want`.
    fn step(&mut self, want: &str, within: Duration) -> Result<()> {
        writeln!(self.stdin.as_mut().context("no stdin")?)?;
        self.expect_line(want, within)
    }

    /// Lets it end, and waits for it.
    fn finish(&mut self, within: Duration) -> Result<()> {
        writeln!(self.stdin.as_mut().context("no stdin")?)?;
        drop(self.stdin.take());
        ensure!(
            wait_until(within, || !self.running().unwrap_or(false)),
            "the mapping process did not end"
        );
        Ok(())
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

/// The keeper of the mount whose state is in `state` (the proxy's
/// `--cache-dir`/fuse), if one runs: the pid in its `keeper.pid`, if that
/// process is alive (a zombie is not).
fn keepers(state: &Path) -> Vec<u32> {
    let Some(pid) = fs::read_to_string(state.join("keeper.pid"))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
    else {
        return Vec::new();
    };
    // The state letter is the field after the command, in parentheses.
    let alive = fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
        st.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    });
    if alive { vec![pid] } else { Vec::new() }
}

/// Waits until the mount has no open file (the kernel sends a RELEASE
/// after the last close, a moment later).
fn nothing_open(p: &Proxy) -> Result<()> {
    ensure!(
        wait_until(Duration::from_secs(10), || p
            .stats()
            .is_ok_and(|s| s.mount().is_ok_and(|m| m.open == 0))),
        "files still open on the mount"
    );
    Ok(())
}

fn keepers_gone(state: &Path) -> bool {
    keepers(state).is_empty()
}

/// The keeper of `state`, waiting for it to note its pid: it holds the
/// connection once the proxy's start returns, but writes `keeper.pid`
/// after its own start, a moment later on a busy machine.
fn keepers_noted(state: &Path) -> Vec<u32> {
    wait_until(Duration::from_secs(10), || !keepers(state).is_empty());
    keepers(state)
}

fn state_of(cache: &Path) -> PathBuf {
    cache.join("fuse")
}

#[test]
fn a_read_the_killed_proxy_had_taken_is_answered_by_the_next() -> Result<()> {
    require_fuse!();
    let mut wan = Wan::start()?;
    let bytes = wan.place("waiting", 71)?;
    let cache = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    let args = ProxyArgs::new(wan.upstream_url()).cache_dir(cache.path());
    let mut p = mounted(args.clone(), &mnt)?;
    // A reader in a process of its own: this one starts proxies, and a
    // fork holding a file of a mount nobody serves would wait in exec.
    wan.cut("blackhole")?;
    let mut reader = Reader::start(Command::new("cat").arg(mnt.path().join("waiting")), false)?;
    ensure!(
        wait_until(Duration::from_secs(10), || p
            .stats()
            .is_ok_and(|s| s.mount().is_ok_and(|m| m.in_flight > 0))),
        "the read never reached the proxy"
    );
    p.kill();
    ensure!(mnt.is_mounted()?, "the mount went with the proxy");
    ensure!(
        !keepers_noted(&state_of(cache.path())).is_empty(),
        "no keeper holds the connection"
    );
    ensure!(
        reader.running()?,
        "the reader ended when its proxy was killed"
    );
    wan.restore()?;
    let mut next = mounted(args, &mnt).context("starting the same command again")?;
    let got = reader.output(AFTER_RESTART)?;
    compare_bytes(&bytes, &got).context("the bytes read across the restart")?;
    let m = next.stats()?.mount()?.clone();
    ensure!(m.session.takeovers == 1, "session: {:?}", m.session);
    ensure!(m.counts.resent_requests >= 1, "counts: {:?}", m.counts);
    // Nothing open: a stop ends the mount and its keeper.
    nothing_open(&next)?;
    let status = next.terminate()?;
    ensure!(
        status.success(),
        "exit {status}; output:\n{}",
        next.output()
    );
    ensure!(
        !mnt.is_mounted()?,
        "still mounted after a stop with nothing open"
    );
    ensure!(
        wait_until(Duration::from_secs(5), || keepers_gone(&state_of(
            cache.path()
        ))),
        "the keeper outlived the mount"
    );
    Ok(())
}

/// Maps `PATH` (size `SIZE`) read-only and reads it in steps, one per
/// line on stdin: its first half at once, then the whole mapping into
/// `OUT.1`, then its last 4 KiB through the descriptor into `OUT.2`.
const MAPPER: &str = r#"
import mmap, os, sys
path, size, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
f = os.open(path, os.O_RDONLY)
m = mmap.mmap(f, size, prot=mmap.PROT_READ)
first = m[: size // 2]
print("ready", len(first), flush=True)
sys.stdin.readline()
open(out + ".1", "wb").write(m[:])
print("mapped", flush=True)
sys.stdin.readline()
open(out + ".2", "wb").write(os.pread(f, 4096, size - 4096))
print("read", flush=True)
sys.stdin.readline()
"#;

/// An origin with an 8 MiB file `memory` of random bytes (`seed`), a
/// cache directory, a directory for outputs and a mount point.
struct Memory {
    origin: tempfile::TempDir,
    cache: tempfile::TempDir,
    out: tempfile::TempDir,
    bytes: Vec<u8>,
    mnt: MountPoint,
}

impl Memory {
    fn new(seed: u64) -> Result<Self> {
        let origin = tempfile::tempdir()?;
        let bytes = random_bytes(seed, 8 * MIB);
        fs::write(origin.path().join("memory"), &bytes)?;
        Ok(Self {
            origin,
            cache: tempfile::tempdir()?,
            out: tempfile::tempdir()?,
            bytes,
            mnt: MountPoint::new()?,
        })
    }
}

/// [`MAPPER`] on `memory` (`len` bytes) in `mnt`, writing into `got`,
/// once it has read the first half.
fn start_mapper(mnt: &MountPoint, len: usize, got: &Path) -> Result<Reader> {
    let mut mapper = Reader::start(
        Command::new("python3")
            .args(["-c", MAPPER])
            .arg(mnt.path().join("memory"))
            .arg(len.to_string())
            .arg(got),
        true,
    )?;
    mapper.expect_line("ready", STEP)?;
    Ok(mapper)
}

#[test]
fn a_stop_with_a_file_mapped_is_a_pause_and_the_next_proxy_goes_on() -> Result<()> {
    require_fuse!();
    let Memory {
        origin,
        cache,
        out,
        bytes,
        mnt,
    } = Memory::new(72)?;
    let args = ProxyArgs::dir(origin.path()).cache_dir(cache.path());
    let mut p = mounted(args.clone(), &mnt)?;
    let got = out.path().join("got");
    let mut mapper = start_mapper(&mnt, bytes.len(), &got)?;
    let status = p.terminate()?;
    ensure!(status.success(), "exit {status}; output:\n{}", p.output());
    ensure!(mnt.is_mounted()?, "a stop with a file mapped unmounted it");
    ensure!(
        mapper.running()?,
        "the mapping process ended with the proxy"
    );
    let mut next = mounted(args.clone(), &mnt).context("starting the same command again")?;
    ensure!(
        next.stats()?.mount()?.session.takeovers == 1,
        "session: {:?}",
        next.stats()?.mount()?.session
    );
    // Every page, through the mapping made before the stop (the second
    // half never read before).
    mapper.step("mapped", STEP)?;
    compare_bytes(&bytes, &fs::read(got.with_extension("1"))?)
        .context("the mapping across the stop")?;
    // And a kill -9 of the next one, with the file still mapped.
    next.kill();
    let mut third = mounted(args, &mnt).context("starting again after kill -9")?;
    mapper.step("read", STEP)?;
    compare_bytes(
        &bytes[bytes.len() - 4096..],
        &fs::read(got.with_extension("2"))?,
    )?;
    ensure!(
        third.stats()?.mount()?.session.takeovers == 2,
        "takeovers after the second restart"
    );
    // `gvfsctl unmount` ends the mount for good, but not under a user
    // unless forced.
    let refused = gvfsctl(third.control_path(), &["unmount"])?;
    ensure!(
        !refused.status.success() && refused.stderr_text().contains("files are open"),
        "gvfsctl unmount with a file mapped: {}",
        refused.stderr_text()
    );
    mapper.finish(STEP)?;
    nothing_open(&third)?;
    let done = gvfsctl(third.control_path(), &["unmount"])?;
    ensure!(
        done.status.success(),
        "gvfsctl unmount: {}",
        done.stderr_text()
    );
    let status = third.wait_exit(Duration::from_secs(30))?;
    ensure!(
        status.success(),
        "exit {status}; output:\n{}",
        third.output()
    );
    ensure!(!mnt.is_mounted()?, "still mounted after gvfsctl unmount");
    ensure!(
        !state_of(cache.path()).exists(),
        "the session's state outlived the unmount"
    );
    Ok(())
}

#[test]
fn a_mount_whose_keeper_is_gone_is_mounted_afresh() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    let cache = tempfile::tempdir()?;
    fs::write(origin.path().join("first"), b"first\n")?;
    let mnt = MountPoint::new()?;
    let args = ProxyArgs::dir(origin.path()).cache_dir(cache.path());
    let mut p = mounted(args.clone(), &mnt)?;
    p.kill();
    let state = state_of(cache.path());
    let keepers = keepers_noted(&state);
    if keepers.is_empty() {
        bail!("no keeper after kill -9");
    }
    for pid in keepers {
        // SAFETY: kill has no memory preconditions.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    ensure!(
        wait_until(Duration::from_secs(10), || keepers_gone(&state)),
        "the keeper outlived SIGKILL"
    );
    // The connection is dead now; the next start clears it and mounts.
    let mut next = mounted(args, &mnt).context("starting after the keeper died too")?;
    ensure!(fs::read(mnt.path().join("first"))? == b"first\n");
    ensure!(
        next.stats()?.mount()?.session.takeovers == 0,
        "a fresh mount counts no takeover"
    );
    let status = next.terminate()?;
    ensure!(
        status.success(),
        "exit {status}; output:\n{}",
        next.output()
    );
    ensure!(!mnt.is_mounted()?, "still mounted after SIGTERM");
    Ok(())
}

/// How long a message to systemd may take.
const NOTICE: Duration = Duration::from_secs(10);

/// Whether `n` stores a FUSE connection, with the descriptor.
fn stores(n: &Notice) -> bool {
    n.value("FDSTORE") == Some("1") && n.fds.len() == 1
}

#[test]
fn under_systemd_the_fd_store_keeps_the_connection_and_no_keeper_runs() -> Result<()> {
    require_fuse!();
    let Memory {
        origin,
        cache,
        out,
        bytes,
        mnt,
    } = Memory::new(73)?;
    let systemd = FakeSystemd::bind()?;
    let args = systemd.args(ProxyArgs::dir(origin.path()).cache_dir(cache.path()), 4);
    let state = state_of(cache.path());
    let mut p = mounted(args.clone(), &mnt)?;
    let mut stored = systemd.wait_for(NOTICE, stores)?;
    let name = stored
        .value("FDNAME")
        .context("FDSTORE=1 without FDNAME")?
        .to_string();
    let session = p.stats()?.mount()?.session.clone();
    ensure!(
        name == format!("gvfs-fuse-{}", session.id) && session.kept_by == "fdstore",
        "stored as {name:?}; session: {session:?}"
    );
    ensure!(
        !state.join("keeper.pid").exists() && keepers_gone(&state),
        "a keeper runs beside the fd store"
    );
    // "systemd" holds the connection from here on.
    let fd = Arc::new(stored.fds.pop().context("no descriptor")?);
    let got = out.path().join("got");
    let mut mapper = start_mapper(&mnt, bytes.len(), &got)?;
    p.kill();
    ensure!(mnt.is_mounted()?, "the mount went with the proxy");
    ensure!(
        mapper.running()?,
        "the mapping process ended with the proxy"
    );
    // A connection stored under another session's name is refused, as a
    // keeper of another session is.
    let other = format!("gvfs-fuse-{}", "00".repeat(16));
    let refused = Proxy::spawn(args.clone().mount(mnt.path()).pass_fd(other, fd.clone()));
    ensure!(
        refused
            .as_ref()
            .is_err_and(|e| format!("{e:#}").contains("different session")),
        "a connection stored for another session: {:?}",
        refused.map(|p| p.output())
    );
    let mut next = mounted(args.clone().pass_fd(name.clone(), fd.clone()), &mnt)
        .context("starting again with the stored connection")?;
    // The same connection, stored again by the new process.
    let again = systemd.wait_for(NOTICE, stores)?;
    ensure!(
        again.value("FDNAME") == Some(name.as_str()),
        "stored again as {:?}",
        again.text
    );
    let status = gvfsctl(next.control_path(), &["status", "--json"])?;
    ensure!(status.status.success(), "{}", status.stderr_text());
    let json: serde_json::Value = serde_json::from_str(&status.stdout_text())?;
    let session = &json["mount"]["session"];
    ensure!(
        session["kept_by"] == "fdstore" && session["takeovers"] == 1,
        "gvfsctl status: {json}"
    );
    ensure!(
        !state.join("keeper.pid").exists() && keepers_gone(&state),
        "a keeper runs after a takeover from the fd store"
    );
    ensure!(
        next.output()
            .contains("systemd passed a stored FUSE connection"),
        "the proxy did not see the passed fd; output:\n{}",
        next.output()
    );
    // Every page, through the mapping made before the kill.
    mapper.step("mapped", STEP)?;
    compare_bytes(&bytes, &fs::read(got.with_extension("1"))?)
        .context("the mapping across the kill")?;
    mapper.step("read", STEP)?;
    mapper.finish(STEP)?;
    nothing_open(&next)?;
    let done = gvfsctl(next.control_path(), &["unmount"])?;
    ensure!(
        done.status.success(),
        "gvfsctl unmount: {}",
        done.stderr_text()
    );
    let removed = systemd.wait_for(NOTICE, |n| n.value("FDSTOREREMOVE") == Some("1"))?;
    ensure!(
        removed.value("FDNAME") == Some(name.as_str()),
        "removed: {:?}",
        removed.text
    );
    let status = next.wait_exit(Duration::from_secs(30))?;
    ensure!(
        status.success(),
        "exit {status}; output:\n{}",
        next.output()
    );
    ensure!(!mnt.is_mounted()?, "still mounted after gvfsctl unmount");
    Ok(())
}

#[test]
fn a_hot_upgrade_takes_the_mount_over_without_unmounting() -> Result<()> {
    require_fuse!();
    let Memory {
        origin,
        cache,
        out,
        bytes,
        mnt,
    } = Memory::new(73)?;
    // --take-over finds the running proxy by its control socket.
    let args = ProxyArgs::dir(origin.path())
        .cache_dir(cache.path())
        .control(out.path().join("control.sock"))
        .arg("--take-over");
    // With nothing running, --take-over starts as usual.
    let mut first = mounted(args.clone(), &mnt)?;
    let got = out.path().join("got");
    let mut mapper = start_mapper(&mnt, bytes.len(), &got)?;
    let mut second = mounted(args.clone(), &mnt).context("the hot upgrade")?;
    let status = first.wait_exit(STEP)?;
    ensure!(
        status.success(),
        "the replaced proxy: exit {status}; output:\n{}",
        first.output()
    );
    ensure!(
        second.output().contains("the running proxy hands over"),
        "the new proxy did not ask for a hand-over; output:\n{}",
        second.output()
    );
    let session = second.stats()?.mount()?.session.clone();
    ensure!(session.takeovers == 1, "session: {session:?}");
    mapper.step("mapped", STEP)?;
    compare_bytes(&bytes, &fs::read(got.with_extension("1"))?)
        .context("the mapping across the hot upgrade")?;
    // With nothing open, a hand-over still keeps the mount: the next
    // proxy takes it over instead of mounting afresh.
    mapper.finish(STEP)?;
    nothing_open(&second)?;
    let mut third = mounted(args, &mnt).context("a hot upgrade with nothing open")?;
    let status = second.wait_exit(STEP)?;
    ensure!(
        status.success(),
        "exit {status}; output:\n{}",
        second.output()
    );
    ensure!(
        third.stats()?.mount()?.session.takeovers == 2,
        "takeovers after the second hot upgrade"
    );
    let mut cat = Reader::start(Command::new("cat").arg(mnt.path().join("memory")), false)?;
    compare_bytes(&bytes, &cat.output(STEP)?).context("a read after the second hot upgrade")?;
    nothing_open(&third)?;
    let status = third.terminate()?;
    ensure!(
        status.success(),
        "exit {status}; output:\n{}",
        third.output()
    );
    ensure!(
        !mnt.is_mounted()?,
        "still mounted after a stop with nothing open"
    );
    Ok(())
}
