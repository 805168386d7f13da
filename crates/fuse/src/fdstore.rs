//! systemd's file descriptor store: the holder of a mount's FUSE
//! connection when the proxy runs as a unit with
//! `FileDescriptorStoreMax=` (systemd then sets `$FDSTORE`, and
//! `$NOTIFY_SOCKET`). systemd keeps what the proxy stores while the proxy
//! dies and restarts, and passes it to the next start as it passes
//! sockets (`LISTEN_PID`, `LISTEN_FDS`, `LISTEN_FDNAMES`, fds from 3), so
//! no keeper process is needed: the store is systemd's own, and lives as
//! long as the unit (across a stop too, with `FileDescriptorStorePreserve=yes`).
//!
//! | when | message (sd_notify(3)) |
//! |---|---|
//! | after a fresh mount or a takeover | `FDSTORE=1`, `FDNAME=gvfs-fuse-SESSION`, with a copy of the connection |
//! | at the unmount | `FDSTOREREMOVE=1`, `FDNAME=gvfs-fuse-SESSION` |
//!
//! SESSION is the session id, 32 hex digits, as in the state directory's
//! `session` file: the next start checks the name against it, as it
//! checks a keeper's session. systemd keeps one copy of a descriptor
//! (storing the same one again is ignored), and drops it by itself when
//! the connection ends (POLLERR).

use std::io;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use sd_notify::NotifyState;

/// What a stored connection's name starts with; the session id follows.
pub const NAME_PREFIX: &str = "gvfs-fuse-";

/// Whether systemd offers this process a file descriptor store:
/// `$NOTIFY_SOCKET` is set, and `$FDSTORE` is a number above 0.
pub fn offered() -> bool {
    offered_by(
        std::env::var_os("NOTIFY_SOCKET").is_some(),
        std::env::var("FDSTORE").ok().as_deref(),
    )
}

/// [`offered`], given whether `$NOTIFY_SOCKET` is set and `$FDSTORE`.
fn offered_by(notify_socket: bool, fdstore: Option<&str>) -> bool {
    notify_socket
        && fdstore
            .and_then(|n| n.trim().parse::<u32>().ok())
            .is_some_and(|n| n > 0)
}

/// The name a session's connection is stored under.
pub fn name_of(session: &str) -> String {
    format!("{NAME_PREFIX}{session}")
}

/// The session a stored descriptor's name is for, if it is a gvfs
/// connection's.
pub fn session_of(name: &str) -> Option<&str> {
    name.strip_prefix(NAME_PREFIX).filter(|s| !s.is_empty())
}

/// Stores a copy of `dev`, session `session`'s connection, in systemd's
/// store.
pub(crate) fn store(session: &str, dev: BorrowedFd<'_>) -> io::Result<()> {
    let name = name_of(session);
    sd_notify::notify_with_fds(&[NotifyState::FdStore, NotifyState::FdName(&name)], &[dev])
}

/// Has systemd drop session `session`'s connection from its store (the
/// mount is being torn down).
pub(crate) fn remove(session: &str) -> io::Result<()> {
    let name = name_of(session);
    sd_notify::notify(&[NotifyState::FdStoreRemove, NotifyState::FdName(&name)])
}

/// A connection systemd passed back from its store, for the mount to take
/// over. Clones share the one descriptor: the first
/// [`take`](Self::take) gets it, and it closes when the last clone drops
/// if nobody took it.
#[derive(Debug, Clone)]
pub struct StoredFd {
    session: String,
    fd: Arc<Mutex<Option<OwnedFd>>>,
}

impl StoredFd {
    /// A connection of session `session` (as its name says).
    pub fn new(session: &str, fd: OwnedFd) -> Self {
        Self {
            session: session.to_string(),
            fd: Arc::new(Mutex::new(Some(fd))),
        }
    }

    /// The session its name says it is.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// The descriptor, unless already taken.
    pub(crate) fn take(&self) -> Option<OwnedFd> {
        self.fd.lock().map(|mut fd| fd.take()).unwrap_or(None)
    }
}

/// What systemd passed at start.
#[derive(Debug, Default)]
pub struct Passed {
    /// The gvfs connection, if one was passed.
    pub stored: Option<StoredFd>,
    /// The names of the descriptors closed: not a gvfs connection, or a
    /// second one (a unit has one mount).
    pub closed: Vec<String>,
    /// Why the passed descriptors could not be read, if they could not.
    pub error: Option<io::Error>,
}

impl Passed {
    /// Logs what was closed or could not be read.
    pub fn log(&self) {
        if let Some(e) = &self.error {
            tracing::warn!(error = %e, "cannot read the descriptors systemd passed (LISTEN_FDS)");
        }
        for name in &self.closed {
            tracing::warn!(%name, "closed a descriptor systemd passed: not a gvfs FUSE connection, or a second one");
        }
        if let Some(s) = &self.stored {
            tracing::info!(session = %s.session(), "systemd passed a stored FUSE connection");
        }
    }
}

/// Takes the descriptors systemd passed (`LISTEN_PID`, `LISTEN_FDS`,
/// `LISTEN_FDNAMES`, fds from 3), keeps the first gvfs connection and
/// closes the rest, and unsets those variables so no child sees them.
///
/// # Safety
///
/// Must run before any other thread starts (it changes the environment),
/// and before anything else opens or closes a descriptor: fds 3 on must
/// still be the ones systemd passed.
pub unsafe fn take_passed() -> Passed {
    // SAFETY: no other thread runs yet (this function's contract).
    let listed = unsafe { sd_notify::listen_fds_with_names_and_unset_env() };
    let fds = match listed {
        Ok(fds) => fds
            // SAFETY: systemd passed these, open, to this process (the
            // LISTEN_PID check), and nothing else here owns them yet.
            .map(|(raw, name)| (unsafe { OwnedFd::from_raw_fd(raw) }, name))
            .collect(),
        Err(e) => {
            return Passed {
                error: Some(e),
                ..Passed::default()
            };
        }
    };
    let Picked { kept, others } = pick(fds);
    Passed {
        stored: kept.map(|(session, fd)| StoredFd::new(&session, fd)),
        // Dropping them closes them.
        closed: others.into_iter().map(|(_, name)| name).collect(),
        error: None,
    }
}

/// Passed descriptors sorted out by [`pick`].
struct Picked<T> {
    /// The first gvfs connection: its session, and itself.
    kept: Option<(String, T)>,
    /// The others, with their names.
    others: Vec<(T, String)>,
}

/// The first of `passed` (descriptors and their names) named as a gvfs
/// connection, and the others.
fn pick<T>(passed: Vec<(T, String)>) -> Picked<T> {
    let mut picked = Picked {
        kept: None,
        others: Vec::new(),
    };
    for (fd, name) in passed {
        match session_of(&name) {
            Some(session) if picked.kept.is_none() => {
                picked.kept = Some((session.to_string(), fd));
            }
            _ => picked.others.push((fd, name)),
        }
    }
    picked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_session() {
        let id = "ab".repeat(16);
        assert_eq!(name_of(&id), format!("gvfs-fuse-{id}"));
        assert_eq!(session_of(&name_of(&id)), Some(id.as_str()));
        assert_eq!(session_of("gvfs-fuse-"), None);
        assert_eq!(session_of("stored"), None);
        assert_eq!(session_of("unknown"), None);
    }

    #[test]
    fn the_first_gvfs_connection_is_kept_and_the_rest_closed() {
        let passed = vec![
            (3, "unknown".to_string()),
            (4, "gvfs-fuse-0011".to_string()),
            (5, "gvfs-fuse-2233".to_string()),
            (6, "gvfs-fuse-".to_string()),
        ];
        let picked = pick(passed);
        assert_eq!(picked.kept, Some(("0011".to_string(), 4)));
        let closed: Vec<i32> = picked.others.iter().map(|(fd, _)| *fd).collect();
        assert_eq!(closed, [3, 5, 6]);
        let picked = pick(vec![(3, "socket".to_string())]);
        assert_eq!(picked.kept, None);
        assert_eq!(picked.others.len(), 1);
        assert!(pick::<i32>(Vec::new()).kept.is_none());
    }

    #[test]
    fn a_stored_fd_is_taken_once() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let stored = StoredFd::new("0011", a.into());
        let clone = stored.clone();
        assert_eq!(clone.session(), "0011");
        assert!(clone.take().is_some());
        assert!(stored.take().is_none());
    }

    #[test]
    fn the_store_is_offered_only_with_both_variables() {
        assert!(offered_by(true, Some("4")));
        assert!(!offered_by(true, Some("0")));
        assert!(!offered_by(true, Some("many")));
        assert!(!offered_by(true, None));
        assert!(!offered_by(false, Some("4")));
    }
}
