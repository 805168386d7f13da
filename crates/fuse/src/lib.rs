//! gvfs-fuse: a proxy's layer stack mounted as a local file system.
//!
//! Hosts without a kernel NFS client, or without root to mount one
//! (containers, microVMs, locked-down cluster nodes), have FUSE. This
//! front end mounts what a proxy serves at a directory, through the same
//! stack as its NFS listener (the top of `Stack`), in the same process:
//! each FUSE request becomes the NFSv3 calls a Linux NFS client would make
//! for it, with the calling process's uid, gid and groups, and no RPC hop.
//!
//! | module | what |
//! |---|---|
//! | [`fs`](crate::fs) | fuser's `Filesystem`: each request a task on the runtime |
//! | `core` | the operations, as NFSv3 calls on the stack (`core/io.rs`: reads, writes, COMMIT; `core/dir.rs`: listings; `core/listing.rs`: what a listing holds; `core/opens.rs`: open files, files hidden while open, and their restore) |
//! | `inodes` | node ids for the kernel, NFS handles for the stack (bounded, FORGET honoured; restored from the journal) |
//! | `journal` | the node table on disk (`nodes.log`): nodes, opens and hidden files, recorded before the kernel is told, replayed by a process taking the session over |
//! | `limits` | bounds of the tables, shared with the journal |
//! | `state` | the session's state directory: its lock, and the `session` file (which connection, root and directory) |
//! | `writes` | UNSTABLE writes kept until a COMMIT covers them (sent again if the verifier changed) |
//! | `attr` | NFS attributes as FUSE's, FUSE's changes as `sattr3` |
//! | `creds` | the caller's credentials (groups from `/proc`) |
//! | `errno` | NFS status to errno, in one place |
//! | `mountpoint` | checks of the directory mounted on (missing, not empty, stale) |
//! | `stats` | what the front end counts, and what `gvfsctl status` shows of a mount |
//! | [`trace`](crate::trace) | a trace of the reads answered (`--mount-trace`), for replaying them elsewhere |
//! | `error` | why a mount could not be made |
//!
//! Kernel-side caching follows the proxy's settings: names and attributes
//! are kept for the attribute timeout, a file's cached pages are kept
//! across opens while its size, mtime and ctime stay the same (as an NFS
//! client's close-to-open), and reads, writes and read-ahead go up to
//! 1 MiB, the largest NFS READ and WRITE of the stack.

#![warn(missing_docs)]

mod attr;
mod core;
mod creds;
mod errno;
mod error;
mod fs;
mod inodes;
mod journal;
mod limits;
mod mountpoint;
mod state;
mod stats;
pub mod trace;
mod writes;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fuser::{BackgroundSession, MountOption, SessionACL};
use gvfs_nfs::{CallContext, Credentials, NfsService, ServiceError};
use tokio::sync::Semaphore;

use crate::core::Core;
pub use crate::error::{FuseError, SessionProblem};
use crate::fs::{Fs, MAX_IN_FLIGHT};
use crate::journal::Journal;
use crate::state::{Header, SessionState};
pub use crate::stats::{Counters, FuseCounts, FuseStats};
use crate::trace::ReadTrace;

/// How to mount.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// The directory.
    pub dir: PathBuf,
    /// How long the kernel keeps names and attributes.
    pub attr_timeout: Duration,
    /// The file system's name in the mount table (what it serves).
    pub source: String,
    /// The kernel's read-ahead for the mount, in bytes: how much a
    /// sequential reader or a page fault of a mapped file asks for at once
    /// ([`DEFAULT_READ_AHEAD`]; 0 for a lazy clone's memory image, whose
    /// page faults should fetch no more than they need).
    pub read_ahead: u32,
    /// Where to write a trace of the reads the mount answers, if anywhere
    /// ([`trace`](crate::trace)).
    pub trace: Option<PathBuf>,
    /// The session's state directory (made with mode 0700): its lock, its
    /// `session` file and its node table, for a process taking the mount
    /// over after this one dies. None: nothing is kept.
    pub state_dir: Option<PathBuf>,
}

/// The mount's default read-ahead: one 1 MiB READ.
pub const DEFAULT_READ_AHEAD: u32 = 1 << 20;

/// A live mount. [`Mount::stop`] unmounts it.
pub struct Mount {
    path: PathBuf,
    core: Arc<Core>,
    /// The locked state directory, if the session keeps one.
    state: Option<SessionState>,
    slots: Arc<Semaphore>,
    session: std::sync::Mutex<Option<BackgroundSession>>,
}

impl Mount {
    /// Mounts `top` at `opts.dir`. Must run on a multi-threaded tokio
    /// runtime: requests run on it. Returns once the kernel has the
    /// mount (its INIT answered).
    pub async fn start(top: Arc<dyn NfsService>, opts: &MountOptions) -> Result<Self, FuseError> {
        mountpoint::check(&opts.dir)?;
        let cx = CallContext::with_cred(Credentials::unix(0, 0));
        let root = top.root(&cx).await.map_err(FuseError::Root)?;
        let root_attr = match gvfs_nfs::layer::Calls::getattr(&*top, &cx, root.data.as_ref())
            .await
            .map_err(FuseError::Root)?
        {
            nfs3_types::nfs3::Nfs3Result::Ok(r) => r.obj_attributes,
            nfs3_types::nfs3::Nfs3Result::Err((status, _)) => {
                return Err(FuseError::Root(ServiceError::UpstreamProtocol {
                    upstream: top.describe(),
                    reason: format!("GETATTR of the root answered {status}"),
                }));
            }
        };
        let trace = match &opts.trace {
            Some(path) => Some(ReadTrace::create(path).map_err(|cause| FuseError::Trace {
                path: path.clone(),
                cause,
            })?),
            None => None,
        };
        let state = match &opts.state_dir {
            Some(dir) => Some(SessionState::create(dir)?),
            None => None,
        };
        let mut core = Core::new(
            top,
            root.data.as_ref(),
            &root_attr,
            opts.attr_timeout,
            trace,
        );
        if let Some(s) = &state {
            // A new log before the first request: nothing of an earlier
            // session is kept by a fresh mount.
            let journal = Journal::create(s.dir()).map_err(|cause| {
                s.clear();
                FuseError::State {
                    path: s.dir().join(journal::LOG),
                    cause,
                }
            })?;
            core = core.with_journal(Arc::new(journal));
        }
        let core = Arc::new(core);
        let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        let fs = Fs::new(
            core.clone(),
            tokio::runtime::Handle::current(),
            slots.clone(),
            opts.read_ahead,
        );
        let config = session_config(&opts.source);
        let dir = opts.dir.clone();
        let session = tokio::task::spawn_blocking(move || {
            fuser::Session::new(fs, &dir, &config).and_then(fuser::Session::spawn)
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        let session = match session {
            Ok(s) => s,
            Err(cause) => {
                if let Some(s) = &state {
                    s.clear();
                }
                return Err(FuseError::Mount {
                    path: opts.dir.clone(),
                    cause,
                });
            }
        };
        set_read_ahead(&opts.dir, opts.read_ahead / 1024);
        if let Some(s) = &state {
            write_session(s, &opts.dir, &core, root.data.as_ref(), root_attr.fileid).await;
        }
        tracing::info!(dir = %opts.dir.display(), "mounted through FUSE");
        Ok(Self {
            path: opts.dir.clone(),
            core,
            state,
            slots,
            session: std::sync::Mutex::new(Some(session)),
        })
    }

    /// The directory mounted on.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Counters and gauges now.
    pub fn stats(&self) -> FuseStats {
        let s = self.core.stats();
        FuseStats {
            path: self.path.display().to_string(),
            counts: s.counts,
            inodes: s.inodes,
            open: s.open,
            uncommitted_bytes: s.uncommitted_bytes,
            in_flight: (MAX_IN_FLIGHT - self.slots.available_permits()) as u64,
        }
    }

    /// Commits every write made through the mount (before a write-back).
    pub async fn commit_all(&self) {
        if let Err(e) = self.core.commit_all().await {
            tracing::error!(error = ?e, "committing the FUSE mount's writes");
        }
    }

    /// [`commit_all`](Self::commit_all), for at most `limit`: an upstream
    /// that does not answer must not hold up the exit (what is not
    /// committed is in the layers below, as after a close without fsync).
    async fn commit_within(&self, limit: Duration) {
        if tokio::time::timeout(limit, self.commit_all())
            .await
            .is_err()
        {
            tracing::warn!(
                ?limit,
                "committing the FUSE mount's writes did not finish; going on"
            );
        }
    }

    /// Unmounts: no new request gets in, those running finish (within
    /// `drain`), and every write made through the mount is committed. A
    /// mount still in use (an open file, a working directory) is detached
    /// lazily: it is gone from the tree at once, and its users get errors
    /// once this process exits.
    pub async fn stop(&self, drain: Duration) {
        self.commit_within(drain).await;
        let path = self.path.clone();
        let clean = tokio::task::spawn_blocking(move || unmount(&path))
            .await
            .unwrap_or(false);
        let all = MAX_IN_FLIGHT as u32;
        if tokio::time::timeout(drain, self.slots.acquire_many(all))
            .await
            .is_err()
        {
            tracing::warn!(
                ?drain,
                "FUSE requests still running after the drain timeout"
            );
        }
        self.commit_within(drain).await;
        if tokio::time::timeout(drain, self.core.remove_hidden())
            .await
            .is_err()
        {
            tracing::warn!("files hidden while open are left (the upstream did not answer)");
        }
        let session = gvfs_nfs::layer::lock(&self.session).take();
        if let Some(session) = session {
            if clean {
                let joined = tokio::time::timeout(
                    drain,
                    tokio::task::spawn_blocking(move || session.umount_and_join()),
                )
                .await;
                if let Ok(Ok(Err(e))) = joined {
                    tracing::debug!(error = %e, "the FUSE session ended");
                } else if joined.is_err() {
                    tracing::warn!("the FUSE session did not end within the drain timeout");
                }
            } else {
                // Its thread ends when the last user lets go, or with us.
                std::mem::forget(session);
            }
        }
        if let Some(s) = &self.state {
            // The session ended: nothing is left for a successor to take.
            s.clear();
        }
        tracing::info!(dir = %self.path.display(), "unmounted");
    }
}

/// Writes the session file of a new mount at `dir`: the connection's
/// device from mountinfo (read on a blocking thread; the mount itself is
/// not looked at), whether the kernel offered resends, and the root. A
/// failure is logged: the mount serves, but cannot be taken over.
async fn write_session(state: &SessionState, dir: &Path, core: &Core, root: &[u8], fileid: u64) {
    let at = dir.to_path_buf();
    let found = tokio::task::spawn_blocking(move || {
        let point = mountpoint::mount_point_path(&at);
        (mountpoint::mount_dev(&at), point)
    })
    .await;
    let Ok((dev, point)) = found else {
        return;
    };
    let dev = dev.unwrap_or_else(|| {
        tracing::warn!(dir = %dir.display(), "the FUSE mount is not in /proc/self/mountinfo: it cannot be taken over");
        (0, 0)
    });
    let mut header = Header::new(dev, root, fileid, &point);
    header.set_resend(
        core.resend_offered
            .load(std::sync::atomic::Ordering::Relaxed),
    );
    if let Err(e) = state.write_header(&header) {
        tracing::warn!(error = %e, "the FUSE mount cannot be taken over");
    }
}

/// Sets the mount's read-ahead to `kb` KiB. The FUSE INIT reply can only
/// lower the kernel's default (128 KiB), so it is set where the kernel
/// keeps it, `/sys/class/bdi/MAJOR:MINOR/read_ahead_kb`; only root may,
/// and elsewhere what INIT asked for stays.
fn set_read_ahead(dir: &Path, kb: u32) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(dir) else {
        return;
    };
    let dev = meta.dev();
    let path = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    if let Err(e) = std::fs::write(&path, kb.to_string()) {
        tracing::debug!(%path, error = %e, "cannot raise the mount's read-ahead (not root?)");
    }
}

/// How fuser runs the mount: four readers on one file description (fuser's
/// `clone_fd` stays off, so each reader reads a `dup` of the one fd and a
/// successor holding another `dup` sees every request still unanswered).
fn session_config(source: &str) -> fuser::Config {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName(source.to_owned()),
        MountOption::Subtype("gvfs".into()),
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    // Root mounts for every user (the server checks each caller's
    // credentials, as it does for an NFS mount); a user's mount is its
    // own, as FUSE allows without user_allow_other.
    config.acl = if effective_uid() == 0 {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(4);
    config
}

fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Unmounts `dir`: plainly if nothing uses it, else detached. Whether
/// it was a plain unmount.
fn unmount(dir: &Path) -> bool {
    let Ok(c) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated path for the call's duration.
    if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
        return true;
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EBUSY) {
        tracing::warn!(dir = %dir.display(), "the mount is in use: detaching it (its users get errors once the proxy exits)");
        // SAFETY: as above.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
            return false;
        }
    }
    // Not root: fusermount3 unmounts a user's own mount.
    let plain = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success());
    if plain {
        return true;
    }
    let lazy = std::process::Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success());
    if !lazy {
        tracing::error!(dir = %dir.display(), error = %err, "cannot unmount");
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `FUSE_DEV_IOC_CLONE`d fd is released with the process that read
    /// from it, failing its unanswered requests: a takeover needs every
    /// reader on `dup`s of one description (plan issue 37, section 4.3).
    #[test]
    fn the_readers_share_one_file_description() {
        let config = session_config("server:/export");
        assert!(!config.clone_fd);
        assert_eq!(config.n_threads, Some(4));
    }
}
