//! A session that outlives its process: finding the connection of a
//! gvfs mount left by a proxy that died or paused, checking that the
//! state on disk is that session's, and having the kernel send again
//! what the old process had read but not answered.
//!
//! The connection comes from the session's keeper, or from systemd's
//! file descriptor store (passed at start); from there on both take the
//! same path. The order matters. The holder gives a copy of the
//! connection; the state directory's lock proves the old process has ended (no reader of
//! it is left to take a request); the session file must name this
//! connection, this directory and this root before its node table is
//! applied; and the kernel is asked to resend only before this process
//! reads anything, or a request it had read would be done twice.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use crate::error::FuseError;
use crate::fdstore;
use crate::journal::{self, Table};
use crate::keeper::Keeper;
use crate::state::{Expected, Header, SessionState};

/// How long a takeover waits for the process that served the session to
/// end (to let go of the state directory's lock).
const OLD_PROCESS_GONE: Duration = Duration::from_secs(10);

/// How long a look at a gvfs mount nobody keeps may take: a dead one
/// answers at once (ENOTCONN), a served one quickly.
const LOOK_TIMEOUT: Duration = Duration::from_secs(2);

/// `FUSE_NOTIFY_RESEND` (Linux 6.9, protocol 7.40).
const FUSE_NOTIFY_RESEND: i32 = 7;

/// A session found, ready to be served by this process.
pub(crate) struct Found {
    /// The state directory, locked.
    pub(crate) state: SessionState,
    /// What gave the connection (it keeps its own copy).
    pub(crate) holder: Holder,
    /// This process's copy of the connection.
    pub(crate) dev: OwnedFd,
    /// The session file.
    pub(crate) header: Header,
    /// The node table, opens and hidden files.
    pub(crate) table: Table,
}

/// What holds a session's connection while no proxy does.
#[derive(Debug)]
pub(crate) enum Holder {
    /// A keeper process, in the state directory.
    Keeper(Keeper),
    /// systemd's file descriptor store, under `gvfs-fuse-SESSION`.
    FdStore {
        /// The session it is stored for.
        session: String,
    },
}

impl Holder {
    /// Has `dev`, session `session`'s connection, held from now on: by
    /// systemd's store if `fd_store`, else by a keeper running `keeper`
    /// (the proxy's binary) in `state`. None when neither is asked for.
    pub(crate) fn start(
        fd_store: bool,
        keeper: Option<&Path>,
        state: &Path,
        session: &str,
        dev: BorrowedFd<'_>,
    ) -> io::Result<Option<Self>> {
        if fd_store {
            fdstore::store(session, dev)?;
            return Ok(Some(Self::FdStore {
                session: session.to_string(),
            }));
        }
        match keeper {
            Some(exe) => Ok(Some(Self::Keeper(Keeper::start(exe, state, session, dev)?))),
            None => Ok(None),
        }
    }

    /// The session it holds.
    pub(crate) fn session(&self) -> &str {
        match self {
            Self::Keeper(k) => k.session(),
            Self::FdStore { session } => session,
        }
    }

    /// What `gvfsctl status` calls it (`SessionInfo::kept_by`).
    pub(crate) fn kept_by(&self) -> &'static str {
        match self {
            Self::Keeper(_) => "keeper",
            Self::FdStore { .. } => "fdstore",
        }
    }

    /// Lets go of the connection: the mount is being torn down.
    pub(crate) fn stop(&self) -> io::Result<()> {
        match self {
            Self::Keeper(k) => k.stop(),
            Self::FdStore { session } => fdstore::remove(session),
        }
    }
}

/// The session of the gvfs mount at `dir` (connection `dev`), if a
/// connection for it is at hand: `stored` (session, descriptor), passed
/// by systemd from its store, else what the keeper in `state_dir` gives.
/// Errors when the state there is not that session's, or the proxy
/// serving it is still alive.
pub(crate) fn find(
    state_dir: &Path,
    dir: &Path,
    dev: (u32, u32),
    root_fh: &[u8],
    stored: Option<(String, OwnedFd)>,
) -> Result<Option<Found>, FuseError> {
    let state_error = |cause| FuseError::State {
        path: state_dir.to_path_buf(),
        cause,
    };
    let given = match stored {
        Some((session, fd)) => Some((Holder::FdStore { session }, fd)),
        None => Keeper::give(state_dir)
            .map_err(state_error)?
            .map(|(k, fd)| (Holder::Keeper(k), fd)),
    };
    let Some((holder, fd)) = given else {
        return Ok(None);
    };
    let state = SessionState::open_existing(state_dir, OLD_PROCESS_GONE)?;
    let id = parse_id(holder.session()).ok_or_else(|| FuseError::DifferentSession {
        path: state_dir.join(crate::state::SESSION),
        what: match holder {
            Holder::Keeper(_) => "session id (the keeper's is not one)",
            Holder::FdStore { .. } => "session id (the stored connection's name holds none)",
        },
    })?;
    let header = state.check_header(&Expected {
        id: Some(id),
        dev,
        root_fh,
        dir,
    })?;
    let log = state_dir.join(journal::LOG);
    let table = journal::replay(&log).map_err(|cause| FuseError::State { path: log, cause })?;
    if table.torn {
        tracing::info!(
            "the node table's last record was cut short by the old process's end (its reply never left)"
        );
    }
    Ok(Some(Found {
        state,
        holder,
        dev: fd,
        header,
        table,
    }))
}

/// What a gvfs mount nobody keeps is.
pub(crate) enum Unkept {
    /// Its connection ended (its proxy and keeper are gone): detach it.
    Dead,
    /// Another proxy serves it, or pauses it with a keeper this one does
    /// not know (another state directory).
    Alive,
}

/// Looks at the gvfs mount at `dir` whose keeper, if any, is not in this
/// proxy's state directory. A `statfs` of a live mount nobody serves
/// would wait for ever, so it runs on a thread of its own and is given
/// up after [`LOOK_TIMEOUT`] (the thread ends when the mount is served
/// or ended).
pub(crate) fn look_at_unkept(dir: &Path) -> Unkept {
    let (tx, rx) = std::sync::mpsc::channel();
    let at = dir.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("fuse-look".into())
        .spawn(move || {
            // STATFS always asks the connection (a stat may be answered
            // from the kernel's attribute cache, even on a dead one).
            let _ = tx.send(rustix::fs::statfs(&at).map(|_| ()).map_err(io::Error::from));
        });
    if spawned.is_err() {
        return Unkept::Alive;
    }
    match rx.recv_timeout(LOOK_TIMEOUT) {
        Err(_) => Unkept::Alive,
        Ok(Ok(())) => Unkept::Alive,
        Ok(Err(e)) if e.raw_os_error() == Some(libc::ENOTCONN) => Unkept::Dead,
        Ok(Err(_)) => Unkept::Alive,
    }
}

/// Detaches the dead mount at `dir` (`umount2(MNT_DETACH)`, else
/// `fusermount3 -u -z`).
pub(crate) fn detach(dir: &Path) -> io::Result<()> {
    if let Ok(c) = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(dir.as_os_str())) {
        // SAFETY: `c` is a valid NUL-terminated path for the call's duration.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
            return Ok(());
        }
    }
    let status = std::process::Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(dir)
        .stdin(std::process::Stdio::null())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "fusermount3 -u -z exited with {status}"
        )))
    }
}

/// Asks the kernel to send again every request of the connection that
/// was read and not answered (by a process now gone), with
/// `FUSE_UNIQUE_RESEND` set in their ids. Whether the kernel can: before
/// Linux 6.9 it answers EINVAL, and those requests wait for ever.
pub(crate) fn resend(dev: BorrowedFd<'_>) -> io::Result<bool> {
    // fuse_out_header { len: u32, error: i32, unique: u64 }; unique 0
    // makes it a notification, and `error` its code.
    let mut msg = [0u8; 16];
    msg[0..4].copy_from_slice(&16u32.to_ne_bytes());
    msg[4..8].copy_from_slice(&FUSE_NOTIFY_RESEND.to_ne_bytes());
    match rustix::io::write(dev, &msg) {
        Ok(_) => Ok(true),
        Err(rustix::io::Errno::INVAL) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The session id as the keeper and the fd store name it: 32 hex digits.
pub(crate) fn id_hex(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_id(s: &str) -> Option<[u8; 16]> {
    if s.len() != 32 {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(id)
}

/// Whether a request id carries the kernel's resend mark.
pub(crate) fn is_resent(unique: u64) -> bool {
    unique & (1 << 63) != 0
}

/// This process's copy of a connection, for a keeper or a resend.
pub(crate) fn copy_of(fd: &impl AsFd) -> io::Result<OwnedFd> {
    fd.as_fd().try_clone_to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_round_trip_and_bad_ones_are_refused() {
        let id = [0xab; 16];
        assert_eq!(parse_id(&id_hex(&id)), Some(id));
        assert_eq!(parse_id("abc"), None);
        assert_eq!(parse_id(&"zz".repeat(16)), None);
        assert!(is_resent(1 << 63 | 5));
        assert!(!is_resent(5));
    }

    #[test]
    fn a_resend_is_one_notification_header() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(resend(a.as_fd()).unwrap());
        let mut got = [0u8; 32];
        let n = rustix::io::read(&b, &mut got).unwrap();
        assert_eq!(n, 16);
        assert_eq!(&got[0..4], &16u32.to_ne_bytes());
        assert_eq!(&got[4..8], &7i32.to_ne_bytes());
        assert_eq!(&got[8..16], &[0; 8]);
    }
}
