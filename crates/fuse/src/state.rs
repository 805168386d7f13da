//! A FUSE session's state directory (mode 0700): what a later process
//! needs to take the live connection over after this one dies.
//!
//! - `lock`: held (`flock(LOCK_EX)`) while a proxy serves the session,
//!   with its pid in it. The kernel drops the lock when the process dies,
//!   so a successor that gets it knows no reader of the old process is
//!   left.
//! - `session`: written once per mount (a temporary file, then a rename):
//!   which connection, which root and which directory the table is for.
//! - `nodes.log`: the node table ([`crate::journal`]).
//!
//! A mount's stop removes it all; after a process death it stays, for
//! the next process.
//!
//! ```text
//! session (all integers LE):
//!  off  len  field
//!    0    4  magic "GVFS"
//!    4    4  version 1
//!    8   16  session id (random)
//!   24    8  the connection's MAJ:MIN from mountinfo (u32 each)
//!   32    8  flags: bit 0 the kernel offered FUSE_HAS_RESEND
//!   40    8  mounted at (unix µs)
//!   48    4  root fh length R (at most 64)
//!   52    R  root fh
//! 52+R    8  root file id
//! 60+R    2  mount dir length D (at most 4096)
//! 62+R    D  mount dir
//! end-4   4  CRC32 of everything before
//! ```
//!
//! Nothing is fsynced: the state has to outlive a process, not the host.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{FuseError, SessionProblem};
use crate::journal::{self, MAX_FH};
use crate::trace::unix_micros;

/// The lock's file name.
pub(crate) const LOCK: &str = "lock";
/// The session file's name.
pub(crate) const SESSION: &str = "session";
/// How many times the session was taken over (a decimal number).
const TAKEOVERS: &str = "takeovers";

const MAGIC: &[u8; 4] = b"GVFS";
const VERSION: u32 = 1;
/// Longest mount directory kept (Linux `PATH_MAX`).
const MAX_DIR: usize = 4096;
/// Bytes of a session file without its root fh and directory.
const FIXED: usize = 52 + 8 + 2 + 4;
/// Largest session file.
const MAX_SESSION: usize = FIXED + MAX_FH + MAX_DIR;
/// Flag: the kernel offered FUSE_HAS_RESEND at INIT.
pub(crate) const FLAG_RESEND: u64 = 1;
/// How often a lock held by another process is tried again.
const LOCK_POLL: Duration = Duration::from_millis(10);

/// What the session file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    /// Random, per mount.
    pub(crate) id: [u8; 16],
    /// The connection's device, MAJ:MIN, as mountinfo shows it.
    pub(crate) dev: (u32, u32),
    /// [`FLAG_RESEND`].
    pub(crate) flags: u64,
    /// When it was mounted (unix µs).
    pub(crate) mounted_at: u64,
    /// The root's NFS handle (node 1).
    pub(crate) root_fh: Vec<u8>,
    /// The root's file id.
    pub(crate) root_fileid: u64,
    /// The mount point, as mountinfo shows it.
    pub(crate) dir: PathBuf,
}

/// What a session must be to be taken over.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(test), allow(dead_code))] // For a process taking the session over.
pub(crate) struct Expected<'a> {
    /// The id the fd came with, when it came with one.
    pub(crate) id: Option<[u8; 16]>,
    /// The mount's MAJ:MIN in mountinfo now.
    pub(crate) dev: (u32, u32),
    /// The root handle the stack gives now.
    pub(crate) root_fh: &'a [u8],
    /// The directory mounted on.
    pub(crate) dir: &'a Path,
}

impl Header {
    /// A new session's header: a fresh random id, mounted now.
    pub(crate) fn new(dev: (u32, u32), root_fh: &[u8], root_fileid: u64, dir: &Path) -> Self {
        Self {
            id: random_id(),
            dev,
            flags: 0,
            mounted_at: unix_micros(),
            root_fh: root_fh.to_vec(),
            root_fileid,
            dir: dir.to_path_buf(),
        }
    }

    /// Notes whether the kernel offered FUSE_HAS_RESEND.
    pub(crate) fn set_resend(&mut self, offered: bool) {
        if offered {
            self.flags |= FLAG_RESEND;
        } else {
            self.flags &= !FLAG_RESEND;
        }
    }

    /// Whether the kernel offered FUSE_HAS_RESEND.
    #[cfg_attr(not(test), allow(dead_code))] // For a process taking the session over.
    pub(crate) fn resend(&self) -> bool {
        self.flags & FLAG_RESEND != 0
    }

    /// The file's bytes. `None` if the root fh or the directory is longer
    /// than the format holds.
    pub(crate) fn encode(&self) -> Option<Vec<u8>> {
        let dir = self.dir.as_os_str().as_bytes();
        if self.root_fh.len() > MAX_FH || dir.len() > MAX_DIR {
            return None;
        }
        let mut b = Vec::with_capacity(FIXED + self.root_fh.len() + dir.len());
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&self.id);
        b.extend_from_slice(&self.dev.0.to_le_bytes());
        b.extend_from_slice(&self.dev.1.to_le_bytes());
        b.extend_from_slice(&self.flags.to_le_bytes());
        b.extend_from_slice(&self.mounted_at.to_le_bytes());
        b.extend_from_slice(&(self.root_fh.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.root_fh);
        b.extend_from_slice(&self.root_fileid.to_le_bytes());
        b.extend_from_slice(&(dir.len() as u16).to_le_bytes());
        b.extend_from_slice(dir);
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        Some(b)
    }

    /// Reads a session file's bytes: magic, version and CRC checked, every
    /// length bounded.
    pub(crate) fn decode(b: &[u8]) -> Result<Self, SessionProblem> {
        if b.len() < FIXED {
            return Err(SessionProblem::Short);
        }
        if b.len() > MAX_SESSION {
            return Err(SessionProblem::Long);
        }
        if &b[..4] != MAGIC {
            return Err(SessionProblem::Magic);
        }
        let (body, crc) = b.split_at(b.len() - 4);
        let u32_at = |at: usize| -> u32 {
            let mut x = [0; 4];
            x.copy_from_slice(&b[at..at + 4]);
            u32::from_le_bytes(x)
        };
        let u64_at = |at: usize| -> u64 {
            let mut x = [0; 8];
            x.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(x)
        };
        let version = u32_at(4);
        if version != VERSION {
            return Err(SessionProblem::Version(version));
        }
        if crc32fast::hash(body).to_le_bytes() != crc {
            return Err(SessionProblem::Crc);
        }
        let r = u32_at(48) as usize;
        if r > MAX_FH || FIXED + r > b.len() {
            return Err(SessionProblem::Length);
        }
        let d_at = 60 + r;
        let d = usize::from(u16::from_le_bytes([b[d_at], b[d_at + 1]]));
        if d > MAX_DIR || FIXED + r + d != b.len() {
            return Err(SessionProblem::Length);
        }
        let mut id = [0; 16];
        id.copy_from_slice(&b[8..24]);
        Ok(Self {
            id,
            dev: (u32_at(24), u32_at(28)),
            flags: u64_at(32),
            mounted_at: u64_at(40),
            root_fh: b[52..52 + r].to_vec(),
            root_fileid: u64_at(52 + r),
            dir: PathBuf::from(std::ffi::OsString::from_vec(
                b[d_at + 2..d_at + 2 + d].to_vec(),
            )),
        })
    }

    /// Whether this is the session `want` describes: what differs, if
    /// something does.
    pub(crate) fn differs_from(&self, want: &Expected<'_>) -> Option<&'static str> {
        if want.id.is_some_and(|id| id != self.id) {
            Some("session id")
        } else if want.dev != self.dev {
            Some("device (MAJ:MIN)")
        } else if want.root_fh != self.root_fh.as_slice() {
            Some("root file handle")
        } else if want.dir != self.dir {
            Some("mount directory")
        } else {
            None
        }
    }
}

/// 16 random bytes from the kernel (else from the clock and pid, which is
/// unique enough to tell two mounts apart).
fn random_id() -> [u8; 16] {
    let mut id = [0_u8; 16];
    // SAFETY: `id` is valid for writes of its length for the call.
    let n = unsafe { libc::getrandom(id.as_mut_ptr().cast(), id.len(), 0) };
    if n != id.len() as isize {
        id[..8].copy_from_slice(&unix_micros().to_le_bytes());
        id[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    }
    id
}

/// The state directory, locked by this process.
#[derive(Debug)]
pub(crate) struct SessionState {
    dir: PathBuf,
    /// Holds the lock while open.
    _lock: File,
}

impl SessionState {
    /// Makes `dir` (0700; if it is there, it must be a directory of this
    /// user's) and takes its lock, for a new mount. Fails with
    /// [`FuseError::StateBusy`] if another process holds it.
    pub(crate) fn create(dir: &Path) -> Result<Self, FuseError> {
        make_dir(dir).map_err(|cause| state_error(dir, cause))?;
        Self::try_lock(dir)?.ok_or_else(|| busy(dir))
    }

    /// Takes the lock of an existing state directory, waiting at most
    /// `within` for a process that holds it to end: for a process taking
    /// a session over.
    #[cfg_attr(not(test), allow(dead_code))] // For a process taking the session over.
    pub(crate) fn open_existing(dir: &Path, within: Duration) -> Result<Self, FuseError> {
        check_dir(dir).map_err(|cause| state_error(dir, cause))?;
        Self::lock_within(dir, within)?.ok_or_else(|| busy(dir))
    }

    /// The lock of `dir`, if nobody holds it.
    pub(crate) fn try_lock(dir: &Path) -> Result<Option<Self>, FuseError> {
        Self::lock_within(dir, Duration::ZERO)
    }

    /// The lock of `dir`, waiting at most `within` for its holder to let
    /// go (or die); `None` if it still holds it.
    pub(crate) fn lock_within(dir: &Path, within: Duration) -> Result<Option<Self>, FuseError> {
        let path = dir.join(LOCK);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|cause| state_error(&path, cause))?;
        let start = Instant::now();
        loop {
            // SAFETY: `file` is an open fd for the call's duration.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                break;
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) && e.kind() != io::ErrorKind::Interrupted
            {
                return Err(state_error(&path, e));
            }
            if start.elapsed() >= within {
                return Ok(None);
            }
            std::thread::sleep(LOCK_POLL.min(within.saturating_sub(start.elapsed())));
        }
        // Who holds it, for a process that finds it taken.
        let pid = format!("{}\n", std::process::id());
        let noted = file
            .set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| file.write_all(pid.as_bytes()));
        if let Err(e) = noted {
            tracing::debug!(path = %path.display(), error = %e, "cannot note this pid in the lock");
        }
        Ok(Some(Self {
            dir: dir.to_path_buf(),
            _lock: file,
        }))
    }

    /// The directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes the session file (a temporary file, then a rename).
    pub(crate) fn write_header(&self, h: &Header) -> Result<(), FuseError> {
        let path = self.dir.join(SESSION);
        let bytes = h.encode().ok_or_else(|| FuseError::SessionFile {
            path: path.clone(),
            problem: SessionProblem::Length,
        })?;
        let tmp = self.dir.join(format!("{SESSION}.new"));
        let written = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| f.write_all(&bytes))
            .and_then(|()| std::fs::rename(&tmp, &path));
        written.map_err(|cause| {
            let _ = std::fs::remove_file(&tmp);
            state_error(&path, cause)
        })
    }

    /// Reads the session file back, checked.
    pub(crate) fn read_header(&self) -> Result<Header, FuseError> {
        let path = self.dir.join(SESSION);
        let mut b = Vec::new();
        File::open(&path)
            .and_then(|f| f.take(MAX_SESSION as u64 + 1).read_to_end(&mut b))
            .map_err(|cause| state_error(&path, cause))?;
        Header::decode(&b).map_err(|problem| FuseError::SessionFile { path, problem })
    }

    /// Reads the session file and checks it is the session `want` says:
    /// else [`FuseError::DifferentSession`], and no table may be applied.
    #[cfg_attr(not(test), allow(dead_code))] // For a process taking the session over.
    pub(crate) fn check_header(&self, want: &Expected<'_>) -> Result<Header, FuseError> {
        let h = self.read_header()?;
        match h.differs_from(want) {
            Some(what) => Err(FuseError::DifferentSession {
                path: self.dir.join(SESSION),
                what,
            }),
            None => Ok(h),
        }
    }

    /// Counts one more takeover of the session, and says how many there
    /// have been since it was mounted.
    pub(crate) fn count_takeover(&self) -> u64 {
        let path = self.dir.join(TAKEOVERS);
        let n = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0)
            .saturating_add(1);
        if let Err(e) = std::fs::write(&path, format!("{n}\n")) {
            tracing::debug!(path = %path.display(), error = %e, "cannot count the takeover");
        }
        n
    }

    /// Removes the state (the session ended, or never began): the
    /// session file, the node table, then the lock and the directory,
    /// still held, so a process waiting for the lock finds no session.
    pub(crate) fn clear(&self) {
        for name in [
            SESSION,
            TAKEOVERS,
            crate::keeper::SOCKET,
            crate::keeper::PID_FILE,
            journal::LOG,
            journal::NEW,
            LOCK,
        ] {
            let path = self.dir.join(name);
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove the FUSE session's state");
                }
                _ => {}
            }
        }
        // Left if something else was put there.
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn state_error(path: &Path, cause: io::Error) -> FuseError {
    FuseError::State {
        path: path.to_path_buf(),
        cause,
    }
}

/// A lock another process holds, with its pid if it noted one.
fn busy(dir: &Path) -> FuseError {
    let pid = std::fs::read_to_string(dir.join(LOCK))
        .ok()
        .and_then(|s| s.trim().parse().ok());
    FuseError::StateBusy {
        path: dir.to_path_buf(),
        pid,
    }
}

/// Makes `dir` with mode 0700, or checks the one there.
fn make_dir(dir: &Path) -> io::Result<()> {
    match DirBuilder::new().recursive(true).mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    check_dir(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// `dir` must be a directory (not a link to one) of this user's.
fn check_dir(dir: &Path) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a directory",
        ));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("owned by uid {}, not {me}", meta.uid()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
