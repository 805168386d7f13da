//! A hot upgrade: `gvfs-proxy --take-over` replaces the proxy running with
//! the same configuration without unmounting its FUSE mount.
//!
//! Before it opens anything (the cache, the listeners), the new process
//! finds the running one through its control socket and asks it to hand
//! over (`{"cmd":"hand-over"}`). The running proxy pauses its mount as a
//! stop with files open does (its keeper holds the connection), closes
//! its layers without the exit write-back (the next proxy owns the cache
//! and its dirty data) and exits. The new process waits for that exit,
//! then starts as usual: it takes the paused session over, and the
//! guests see a stall.
//!
//! A running proxy too old to know `hand-over` is sent SIGTERM instead: a
//! stop with files open is a pause there too; with nothing open it
//! unmounts, and the new process mounts afresh (no user is lost). With no
//! proxy running, `--take-over` starts as usual.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;

use crate::ProxyError;
use crate::config::Config;
use crate::control::{self, RequestError};

/// The control command a running proxy hands over on.
pub const COMMAND: &str = "hand-over";

/// How long past its drain and exit write-back timeouts a running proxy
/// may take to exit once asked.
const EXIT_MARGIN: Duration = Duration::from_secs(30);

/// Asks the proxy running with `cfg`'s control socket to hand over, and
/// waits until it has exited. Returns its pid, or `None` when no proxy
/// answers there.
pub async fn replace_running(cfg: &Config) -> Result<Option<u32>, ProxyError> {
    let path = control_path_to_replace(cfg)?;
    let failed = |reason: String| ProxyError::TakeOver {
        control: path.clone(),
        reason,
    };
    let status = match control::request(&path, &json!({ "cmd": "status" })).await {
        Ok(s) => s,
        Err(RequestError::Unreachable { .. }) => {
            tracing::info!(control = %path.display(), "--take-over: no proxy answers there; starting as usual");
            return Ok(None);
        }
        Err(e) => return Err(failed(e.to_string())),
    };
    let pid = status["pid"]
        .as_u64()
        .and_then(|p| i32::try_from(p).ok())
        .filter(|&p| p > 0)
        .ok_or_else(|| failed("its status names no pid".into()))?;
    // Opened before it is asked to go: the pid cannot be another
    // process's by the time we wait on it.
    let exited = pidfd(pid).map_err(|e| failed(format!("cannot watch pid {pid}: {e}")))?;
    match control::request(&path, &json!({ "cmd": COMMAND })).await {
        Ok(_) => {
            tracing::info!(pid, "--take-over: the running proxy hands over");
        }
        Err(RequestError::Refused(why)) if why.starts_with("unknown command") => {
            // A proxy from before hand-over: its stop pauses a mount with
            // files open, which is what a hand-over does.
            tracing::info!(
                pid,
                "--take-over: the running proxy does not know hand-over; stopping it with SIGTERM"
            );
            // SAFETY: kill(2) with a pid the pidfd above pins down.
            if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
                return Err(failed(format!(
                    "cannot signal pid {pid}: {}",
                    std::io::Error::last_os_error()
                )));
            }
        }
        // It may end before its answer is written: wait for it anyway.
        Err(RequestError::Io { .. } | RequestError::BadReply(_)) => {}
        Err(e) => return Err(failed(e.to_string())),
    }
    let within = cfg.drain_timeout * 3
        + cfg
            .cache
            .as_ref()
            .map_or(Duration::ZERO, |c| c.exit_writeback_timeout)
        + EXIT_MARGIN;
    let waited = tokio::task::spawn_blocking(move || wait_exit(&exited, within))
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
    match waited {
        Ok(true) => {
            tracing::info!(pid, "--take-over: the old proxy has exited; taking over");
            Ok(Some(pid as u32))
        }
        Ok(false) => Err(failed(format!(
            "pid {pid} did not exit within {within:?} of being asked to hand over"
        ))),
        Err(e) => Err(failed(format!("waiting for pid {pid}: {e}"))),
    }
}

/// The control socket of the proxy `--take-over` replaces: the one `cfg`
/// names, or the default for its listen address or mount. A listen port
/// of 0 names no proxy in particular.
fn control_path_to_replace(cfg: &Config) -> Result<PathBuf, ProxyError> {
    let nfs = cfg.listen;
    let tls = cfg.tls.as_ref().and_then(|t| t.listen);
    if cfg.control.is_none() && nfs.or(tls).is_some_and(|a| a.port() == 0) {
        return Err(ProxyError::TakeOver {
            control: PathBuf::new(),
            reason: "a listen port of 0 names no running proxy: give --control, or the port it \
                     listens on"
                .into(),
        });
    }
    Ok(crate::config::control_path(cfg, nfs, tls))
}

/// A pidfd of `pid`: readable once the process has exited.
fn pidfd(pid: i32) -> std::io::Result<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(pid)
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    Ok(rustix::process::pidfd_open(
        pid,
        rustix::process::PidfdFlags::empty(),
    )?)
}

/// Waits up to `within` for the process behind `pidfd` to exit (a zombie
/// not yet reaped by its parent has exited). Returns whether it did.
fn wait_exit(pidfd: &OwnedFd, within: Duration) -> std::io::Result<bool> {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let deadline = std::time::Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
        let timeout = Timespec::try_from(left).unwrap_or(Timespec {
            tv_sec: 60,
            tv_nsec: 0,
        });
        match poll(&mut fds, Some(&timeout)) {
            Ok(0) => continue,
            Ok(_) => return Ok(true),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_on_a_process_sees_it_exit() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let fd = pidfd(child.id() as i32).unwrap();
        // Not reaped yet: a zombie counts as exited.
        assert!(wait_exit(&fd, Duration::from_secs(10)).unwrap());
        child.wait().unwrap();
        let mut long = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let fd = pidfd(long.id() as i32).unwrap();
        assert!(!wait_exit(&fd, Duration::from_millis(100)).unwrap());
        long.kill().unwrap();
        long.wait().unwrap();
    }
}
