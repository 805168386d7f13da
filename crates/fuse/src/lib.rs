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
//! | `keeper`, `fdstore` | what holds the connection while no proxy does: a keeper process, or systemd's file descriptor store under a unit with `FileDescriptorStoreMax=` |
//! | `limits` | bounds of the tables, shared with the journal |
//! | `state` | the session's state directory: its lock, and the `session` file (which connection, root and directory) |
//! | `writes` | UNSTABLE writes kept until a COMMIT covers them (sent again if the verifier changed) |
//! | `attr` | NFS attributes as FUSE's, FUSE's changes as `sattr3` |
//! | `creds` | the caller's credentials (groups from `/proc`) |
//! | `errno` | NFS status to errno, in one place |
//! | `mountpoint` | checks of the directory mounted on (missing, not empty, stale), its read-ahead, and the unmount |
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
pub mod fdstore;
mod fs;
mod inodes;
mod journal;
pub mod keeper;
mod limits;
mod mountpoint;
mod state;
mod stats;
mod takeover;
pub mod trace;
mod writes;

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fuser::{BackgroundSession, MountOption, SessionACL};
use gvfs_nfs::{CallContext, Credentials, NfsService, ServiceError};
use nfs3_types::nfs3::fattr3;
use tokio::sync::Semaphore;

use crate::core::Core;
pub use crate::error::{FuseError, SessionProblem};
use crate::fdstore::StoredFd;
use crate::fs::{Fs, MAX_IN_FLIGHT};
use crate::journal::Journal;
use crate::state::{Header, SessionState};
pub use crate::stats::{Counters, FuseCounts, FuseStats, SessionInfo};
use crate::takeover::Holder;
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
    /// The binary to run as the session's keeper (`gvfs-proxy`, run as
    /// [`keeper::KEEPER_ARG`]), which holds the FUSE connection while no
    /// proxy does, with `state_dir`. None: the mount ends with this
    /// process, and so does every process that maps a file from it.
    pub keeper: Option<PathBuf>,
    /// Keep the connection in systemd's file descriptor store instead of
    /// with a keeper ([`fdstore`]; with `state_dir`).
    pub fd_store: bool,
    /// The connection systemd passed back from its store at start, to take
    /// the session at `dir` over with instead of asking a keeper.
    pub stored: Option<StoredFd>,
}

/// How [`Mount::stop`] left the mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// Unmounted, for good.
    Unmounted,
    /// Paused: files are open on it, and its keeper (or systemd's fd
    /// store) holds the connection for the next proxy, which takes it
    /// over. The process must end without dropping anything FUSE holds
    /// (`_exit`).
    Paused,
}

/// The mount's default read-ahead: one 1 MiB READ.
pub const DEFAULT_READ_AHEAD: u32 = 1 << 20;

/// A live mount. [`Mount::stop`] unmounts it, or pauses it when files
/// are open and a keeper or systemd's store holds the connection.
pub struct Mount {
    path: PathBuf,
    core: Arc<Core>,
    /// The locked state directory, if the session keeps one.
    state: Option<SessionState>,
    /// What holds the connection while no proxy does.
    holder: Option<Holder>,
    /// Since when, and how often taken over.
    info: SessionInfo,
    /// Set by `gvfsctl unmount`: the next stop unmounts even with files open.
    tear_down: AtomicBool,
    /// Set by a hand-over: the next stop pauses even with nothing open.
    hand_over: AtomicBool,
    slots: Arc<Semaphore>,
    session: std::sync::Mutex<Option<BackgroundSession>>,
}

impl Mount {
    /// Mounts `top` at `opts.dir`, or takes over the session of a gvfs
    /// mount there that its keeper or systemd's store (`opts.stored`)
    /// holds (left by a proxy that was stopped with files open, or died).
    /// A dead gvfs mount (nothing holds its connection) is detached and
    /// mounted afresh. Must run on a multi-threaded tokio runtime:
    /// requests run on it. Returns once the kernel has the mount (its INIT
    /// answered) or the session is served again.
    pub async fn start(top: Arc<dyn NfsService>, opts: &MountOptions) -> Result<Self, FuseError> {
        let found = mountpoint::inspect(&opts.dir)?;
        let (root, root_attr) = root_of(&*top).await?;
        let stored = opts
            .stored
            .as_ref()
            .and_then(|s| Some((s.session().to_string(), s.take()?)));
        if stored.is_some() && found == mountpoint::Found::Free {
            tracing::warn!(dir = %opts.dir.display(), "systemd passed a stored FUSE connection, but no gvfs mount is there: closing it, and mounting afresh");
        }
        if let mountpoint::Found::Gvfs { dev } = found {
            if let Some(taken) = find_session(opts, dev, &root, stored).await? {
                return Self::take_over(top, opts, &root, &root_attr, taken).await;
            }
            let dir = opts.dir.clone();
            let unkept = tokio::task::spawn_blocking(move || takeover::look_at_unkept(&dir))
                .await
                .unwrap_or(takeover::Unkept::Alive);
            match unkept {
                takeover::Unkept::Alive => {
                    return Err(FuseError::AlreadyMounted {
                        path: opts.dir.clone(),
                        fstype: "fuse.gvfs".into(),
                    });
                }
                takeover::Unkept::Dead => {
                    tracing::warn!(dir = %opts.dir.display(), "a dead gvfs mount (its proxy and keeper are gone) is there: detaching it, and mounting afresh");
                    let dir = opts.dir.clone();
                    tokio::task::spawn_blocking(move || takeover::detach(&dir))
                        .await
                        .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())))
                        .map_err(|cause| FuseError::MountPoint {
                            path: opts.dir.clone(),
                            cause,
                        })?;
                    if let Some(dir) = &opts.state_dir
                        && let Ok(Some(old)) = SessionState::try_lock(dir)
                    {
                        old.clear();
                    }
                    // What was under it must be fit to mount on too.
                    if mountpoint::inspect(&opts.dir)? != mountpoint::Found::Free {
                        return Err(FuseError::AlreadyMounted {
                            path: opts.dir.clone(),
                            fstype: "fuse.gvfs".into(),
                        });
                    }
                }
            }
        }
        Self::fresh(top, opts, &root, &root_attr).await
    }

    /// A new mount at `opts.dir`.
    async fn fresh(
        top: Arc<dyn NfsService>,
        opts: &MountOptions,
        root: &[u8],
        root_attr: &fattr3,
    ) -> Result<Self, FuseError> {
        let trace = open_trace(opts)?;
        let state = match &opts.state_dir {
            Some(dir) => Some(SessionState::create(dir)?),
            None => None,
        };
        let mut core = Core::new(top, root, root_attr, opts.attr_timeout, trace);
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
        let (fs, slots) = file_system(&core, opts);
        let config = session_config(&opts.source);
        let dir = opts.dir.clone();
        // The connection is copied before the readers start: the keeper's
        // copy is a `dup` of the one file description.
        let session = tokio::task::spawn_blocking(move || {
            let session = fuser::Session::new(fs, &dir, &config)?;
            let dev = takeover::copy_of(&session)?;
            Ok((session.spawn()?, dev))
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        let (session, dev) = match session {
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
        mountpoint::set_read_ahead(&opts.dir, opts.read_ahead / 1024);
        let mut info = SessionInfo {
            kept_by: "none".into(),
            mounted_at_us: trace::unix_micros(),
            ..SessionInfo::default()
        };
        let header = match &state {
            Some(s) => write_session(s, &opts.dir, &core, root, root_attr.fileid).await,
            None => None,
        };
        let holder = match (&state, &header) {
            (Some(s), Some(h)) => {
                let id = takeover::id_hex(&h.id);
                info.id = id.clone();
                info.mounted_at_us = h.mounted_at;
                hold(opts, s, &id, &dev)
            }
            _ => None,
        };
        if let Some(h) = &holder {
            info.kept_by = h.kept_by().into();
        }
        drop(dev);
        tracing::info!(dir = %opts.dir.display(), kept_by = %info.kept_by, "mounted through FUSE");
        Ok(Self {
            path: opts.dir.clone(),
            core,
            state,
            holder,
            info,
            tear_down: AtomicBool::new(false),
            hand_over: AtomicBool::new(false),
            slots,
            session: std::sync::Mutex::new(Some(session)),
        })
    }

    /// Serves the session `taken` from here on: the node table, open files
    /// and hidden files restored before any request is read, and the
    /// requests the old process had read and not answered sent again.
    async fn take_over(
        top: Arc<dyn NfsService>,
        opts: &MountOptions,
        root: &[u8],
        root_attr: &fattr3,
        taken: takeover::Found,
    ) -> Result<Self, FuseError> {
        let takeover::Found {
            state,
            holder,
            dev,
            header,
            table,
        } = taken;
        // A keeper found goes on holding the connection. One from
        // systemd's store is stored again (systemd ignores a copy it
        // has), or given to a keeper when this start has no store.
        let id = takeover::id_hex(&header.id);
        let holder = match holder {
            Holder::Keeper(k) => Some(Holder::Keeper(k)),
            Holder::FdStore { .. } => hold(opts, &state, &id, &dev),
        };
        let trace = open_trace(opts)?;
        let journal = Journal::resume(state.dir(), &table).map_err(|cause| FuseError::State {
            path: state.dir().join(journal::LOG),
            cause,
        })?;
        let (nodes, opens) = (table.nodes.len(), table.opens.len());
        let core = Core::new(top, root, root_attr, opts.attr_timeout, trace)
            .with_journal(Arc::new(journal));
        core.resend_offered
            .store(header.resend(), Ordering::Relaxed);
        core.restore(table);
        let core = Arc::new(core);
        let (fs, slots) = file_system(&core, opts);
        let config = session_config(&opts.source);
        // Before any reader of this process starts: a request it had read
        // itself would be sent again and done twice.
        let resent = takeover::resend(dev.as_fd());
        let session = tokio::task::spawn_blocking(move || {
            let acl = config.acl;
            fuser::Session::from_initialized_fd(fs, dev, acl, config)?.spawn()
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())))
        .map_err(|cause| FuseError::Mount {
            path: opts.dir.clone(),
            cause,
        })?;
        let resend = match resent {
            Ok(true) => "yes",
            Ok(false) => {
                tracing::warn!(
                    "this kernel cannot resend FUSE requests (Linux before 6.9): any the old process had read and not answered wait for ever"
                );
                "unsupported"
            }
            Err(e) => {
                tracing::warn!(error = %e, "asking the kernel to resend FUSE requests");
                "unsupported"
            }
        };
        let takeovers = state.count_takeover();
        let info = SessionInfo {
            id,
            mounted_at_us: header.mounted_at,
            taken_over_at_us: trace::unix_micros(),
            takeovers,
            kept_by: holder.as_ref().map_or("none", Holder::kept_by).into(),
            resend: resend.into(),
        };
        tracing::info!(dir = %opts.dir.display(), nodes, open_files = opens, takeovers, "took the FUSE session over");
        Ok(Self {
            path: opts.dir.clone(),
            core,
            state: Some(state),
            holder,
            info,
            tear_down: AtomicBool::new(false),
            hand_over: AtomicBool::new(false),
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
            session: self.info.clone(),
        }
    }

    /// Files and directories open on the mount now.
    pub fn open_files(&self) -> u64 {
        self.core.stats().open
    }

    /// Makes the next [`stop`](Self::stop) unmount even with files open
    /// (`gvfsctl unmount`): their users get errors.
    pub fn tear_down_at_stop(&self) {
        self.tear_down.store(true, Ordering::Relaxed);
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

    /// Makes the next [`stop`](Self::stop) a pause even with nothing open,
    /// for a proxy that takes the session over at once (a hot upgrade).
    /// False, and nothing changes, when neither a keeper nor systemd's
    /// store holds the connection (`--mount-keep none`): the stop can only
    /// unmount.
    pub fn hand_over_at_stop(&self) -> bool {
        if self.holder.is_none() {
            return false;
        }
        self.hand_over.store(true, Ordering::Relaxed);
        true
    }

    /// Stops serving the mount. With files open (or after
    /// [`hand_over_at_stop`](Self::hand_over_at_stop)) and a keeper or
    /// systemd's store holding the connection (and no
    /// [`tear_down_at_stop`](Self::tear_down_at_stop)), a pause: see
    /// [`pause`](Self::pause). Else it unmounts: no new
    /// request gets in, those running finish (within `drain`), and every
    /// write made through the mount is committed. A mount still in use (an
    /// open file, a working directory) is detached lazily: it is gone from
    /// the tree at once, and its users get errors once this process exits.
    pub async fn stop(&self, drain: Duration) -> Stopped {
        let hand_over = self.hand_over.load(Ordering::Relaxed);
        // The kernel sends RELEASE after a close returned: a file closed
        // just before the stop may still count for a moment.
        let mut open = self.open_files();
        let since = tokio::time::Instant::now();
        while !hand_over && open > 0 && since.elapsed() < RELEASE_GRACE {
            tokio::time::sleep(Duration::from_millis(20)).await;
            open = self.open_files();
        }
        if self.holder.is_some()
            && (open > 0 || hand_over)
            && !self.tear_down.load(Ordering::Relaxed)
        {
            self.pause(drain).await;
            tracing::info!(dir = %self.path.display(), open_files = open, "paused the FUSE mount: its users wait for the next proxy");
            return Stopped::Paused;
        }
        if let Some(h) = &self.holder
            && let Err(e) = h.stop()
        {
            tracing::warn!(error = %e, kept_by = h.kept_by(), "the FUSE session's holder did not let go; it does when the mount ends");
        }
        self.commit_within(drain).await;
        let path = self.path.clone();
        let clean = tokio::task::spawn_blocking(move || mountpoint::unmount(&path))
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
        Stopped::Unmounted
    }

    /// Pauses the session for the next proxy: the readers stop (nothing is
    /// read after), the requests already read are answered (within
    /// `drain`), and the writes made through the mount are committed. The
    /// mount stays, and so does the connection, which the keeper or
    /// systemd's store holds;
    /// requests made from now on wait in the kernel. A request still
    /// running after `drain` is never answered by this process: the
    /// kernel sends it again to the next one (Linux 6.9 and later).
    async fn pause(&self, drain: Duration) {
        let session = gvfs_nfs::layer::lock(&self.session).take();
        let Some(mut session) = session else {
            return;
        };
        let paused = tokio::task::spawn_blocking(move || {
            let paused = session.pause(READERS_STOP);
            session.forget_mount();
            (session, paused)
        })
        .await;
        match paused {
            Ok((session, paused)) => {
                if let Err(e) = paused {
                    tracing::warn!(error = %e, "the FUSE readers did not all stop; the requests they read are sent again to the next proxy");
                }
                // Nothing it holds may close or answer now.
                std::mem::forget(session);
            }
            Err(e) => tracing::warn!(error = %e, "pausing the FUSE session"),
        }
        let all = MAX_IN_FLIGHT as u32;
        if let Ok(Ok(permits)) = tokio::time::timeout(drain, self.slots.acquire_many(all)).await {
            permits.forget();
        } else {
            tracing::warn!(
                ?drain,
                "FUSE requests still running after the drain timeout: the next proxy gets them again"
            );
        }
        self.commit_within(drain).await;
    }
}

/// Has the connection `dev` of session `id` held while no proxy serves
/// it (systemd's store or a keeper, as `opts` says). A failure is logged:
/// the mount serves, but ends with this process.
fn hold(opts: &MountOptions, state: &SessionState, id: &str, dev: &OwnedFd) -> Option<Holder> {
    let exe = opts.keeper.as_deref();
    match Holder::start(opts.fd_store, exe, state.dir(), id, dev.as_fd()) {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(error = %e, fd_store = opts.fd_store, "cannot have the FUSE connection held: the mount ends with this process");
            None
        }
    }
}

/// Writes the session file of a new mount at `dir`: the connection's
/// device from mountinfo (read on a blocking thread; the mount itself is
/// not looked at), whether the kernel offered resends, and the root. A
/// failure is logged: the mount serves, but cannot be taken over.
async fn write_session(
    state: &SessionState,
    dir: &Path,
    core: &Core,
    root: &[u8],
    fileid: u64,
) -> Option<Header> {
    let at = dir.to_path_buf();
    let found = tokio::task::spawn_blocking(move || {
        let point = mountpoint::mount_point_path(&at);
        (mountpoint::mount_dev(&at), point)
    })
    .await;
    let Ok((dev, point)) = found else {
        return None;
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
    match state.write_header(&header) {
        Ok(()) => Some(header),
        Err(e) => {
            tracing::warn!(error = %e, "the FUSE mount cannot be taken over");
            None
        }
    }
}

/// How long a stop waits for the RELEASEs of files just closed before it
/// decides between an unmount and a pause. The kernel sends it as the
/// last close returns; the wait is spent in full by every pause (files
/// stay open), so it is short: it is part of the guests' stall.
const RELEASE_GRACE: Duration = Duration::from_millis(200);

/// How long a pause waits for the readers to stop.
const READERS_STOP: Duration = Duration::from_secs(1);

/// The file system fuser serves for `core`, and its request slots.
fn file_system(core: &Arc<Core>, opts: &MountOptions) -> (Fs, Arc<Semaphore>) {
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let fs = Fs::new(
        core.clone(),
        tokio::runtime::Handle::current(),
        slots.clone(),
        opts.read_ahead,
    );
    (fs, slots)
}

/// The stack's root: its handle and attributes.
async fn root_of(top: &dyn NfsService) -> Result<(Vec<u8>, fattr3), FuseError> {
    let cx = CallContext::with_cred(Credentials::unix(0, 0));
    let root = top.root(&cx).await.map_err(FuseError::Root)?;
    match gvfs_nfs::layer::Calls::getattr(top, &cx, root.data.as_ref())
        .await
        .map_err(FuseError::Root)?
    {
        nfs3_types::nfs3::Nfs3Result::Ok(r) => Ok((root.data.to_vec(), r.obj_attributes)),
        nfs3_types::nfs3::Nfs3Result::Err((status, _)) => {
            Err(FuseError::Root(ServiceError::UpstreamProtocol {
                upstream: top.describe(),
                reason: format!("GETATTR of the root answered {status}"),
            }))
        }
    }
}

/// The read trace `opts` asks for, if any.
fn open_trace(opts: &MountOptions) -> Result<Option<ReadTrace>, FuseError> {
    match &opts.trace {
        Some(path) => Ok(Some(ReadTrace::create(path).map_err(|cause| {
            FuseError::Trace {
                path: path.clone(),
                cause,
            }
        })?)),
        None => Ok(None),
    }
}

/// The session of the gvfs mount at `opts.dir` (connection `dev`), if
/// systemd passed its connection (`stored`) or its keeper answers in this
/// mount's state directory.
async fn find_session(
    opts: &MountOptions,
    dev: (u32, u32),
    root: &[u8],
    stored: Option<(String, OwnedFd)>,
) -> Result<Option<takeover::Found>, FuseError> {
    let Some(state_dir) = opts.state_dir.clone() else {
        return Ok(None);
    };
    let point = mountpoint::mount_point_path(&opts.dir);
    let root = root.to_vec();
    let at = state_dir.clone();
    tokio::task::spawn_blocking(move || takeover::find(&at, &point, dev, &root, stored))
        .await
        .unwrap_or_else(|e| {
            Err(FuseError::State {
                path: state_dir,
                cause: std::io::Error::other(e.to_string()),
            })
        })
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
