//! Running child processes with a deadline.
//!
//! Every wait in the fixtures goes through here, so a hung peer fails a test
//! with a message instead of hanging it.

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How often a deadline loop polls.
pub(crate) const POLL: Duration = Duration::from_millis(10);

/// What a finished command printed, and how it exited.
#[derive(Debug)]
pub struct Output {
    /// Exit status.
    pub status: ExitStatus,
    /// Everything written to stdout.
    pub stdout: Vec<u8>,
    /// Everything written to stderr.
    pub stderr: Vec<u8>,
}

impl Output {
    /// Stderr as (lossy) text.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// Stdout as (lossy) text.
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// `cmd` as a shell-like line, for error messages.
pub fn describe(cmd: &Command) -> String {
    let mut line = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    line
}

/// Runs `cmd` to completion with stdin closed and both outputs captured.
/// After `timeout` the child is killed and an error returned. A non-zero
/// exit is not an error here (see [`run_ok`]).
pub fn run(cmd: &mut Command, timeout: Duration) -> Result<Output> {
    let line = describe(cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawning `{line}`"))?;
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let status =
        wait_timeout(&mut child, timeout).with_context(|| format!("waiting for `{line}`"))?;
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        let stderr = String::from_utf8_lossy(&stderr.join().unwrap_or_default()).into_owned();
        bail!("`{line}` did not finish within {timeout:?} and was killed; stderr:\n{stderr}");
    };
    Ok(Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// Like [`run`], but a non-zero exit is an error that quotes stderr.
pub fn run_ok(cmd: &mut Command, timeout: Duration) -> Result<Output> {
    let out = run(cmd, timeout)?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}); stderr:\n{}{}",
            describe(cmd),
            out.status,
            out.stderr_text(),
            if out.stdout.is_empty() {
                String::new()
            } else {
                format!("\nstdout:\n{}", out.stdout_text())
            }
        );
    }
    Ok(out)
}

/// Reads a pipe to its end on a thread; join to get the bytes.
fn drain(pipe: Option<impl Read + Send + 'static>) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut buf);
        }
        buf
    })
}

/// Waits for `child` to exit for at most `timeout`; `None` if it has not.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> std::io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        thread::sleep(POLL);
    }
}

/// Sends `signal` to `child` unless it has already been reaped.
pub fn signal(child: &Child, signal: libc::c_int) -> std::io::Result<()> {
    let pid = libc::pid_t::try_from(child.id()).map_err(std::io::Error::other)?;
    // SAFETY: plain syscall on a pid we spawned and have not reaped yet (a
    // `Child` is only reaped by `wait`/`try_wait`, after which callers do
    // not signal it).
    let rc = unsafe { libc::kill(pid, signal) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Stops `child`: SIGTERM, up to `grace` to exit, then SIGKILL. Returns the
/// exit status, and whether it had to be killed.
pub fn terminate(child: &mut Child, grace: Duration) -> std::io::Result<(ExitStatus, bool)> {
    if let Some(status) = child.try_wait()? {
        return Ok((status, false));
    }
    signal(child, libc::SIGTERM)?;
    if let Some(status) = wait_timeout(child, grace)? {
        return Ok((status, false));
    }
    child.kill()?;
    Ok((child.wait()?, true))
}

/// A command that runs `bin` (its arguments to be added) with `fds` as
/// systemd passes them: fds 3 on, named in `LISTEN_FDNAMES`, counted in
/// `LISTEN_FDS`, and `LISTEN_PID` set to the pid `bin` runs as (a shell
/// sets it, then `exec`s `bin`).
pub fn passing_fds(bin: &Path, fds: &[(String, Arc<OwnedFd>)]) -> Command {
    let mut cmd = Command::new("/bin/sh");
    cmd.args(["-c", r#"export LISTEN_PID=$$; exec "$0" "$@""#])
        .arg(bin)
        .env("LISTEN_FDS", fds.len().to_string())
        .env(
            "LISTEN_FDNAMES",
            fds.iter()
                .map(|(name, _)| name.as_str())
                .collect::<Vec<_>>()
                .join(":"),
        );
    let raw: Vec<RawFd> = fds.iter().map(|(_, fd)| fd.as_raw_fd()).collect();
    // SAFETY: between fork and exec the closure calls only fcntl and
    // dup2 (async-signal-safe) and allocates nothing (`raw` is moved in,
    // and only read).
    unsafe {
        cmd.pre_exec(move || {
            // Each first to a number above those it goes to, so none is
            // overwritten before it is moved; dup2 then clears
            // close-on-exec on fds 3 on.
            let floor = 3 + raw.len() as RawFd;
            for (i, &fd) in raw.iter().enumerate() {
                let high = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, floor);
                if high < 0 || libc::dup2(high, 3 + i as RawFd) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd
}
