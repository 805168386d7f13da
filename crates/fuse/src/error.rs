//! Why a mount could not be made.

use std::path::PathBuf;

use gvfs_nfs::ServiceError;

/// Why a mount could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FuseError {
    /// The directory does not exist.
    #[error("cannot mount on {}: it does not exist (create it with mkdir)", .path.display())]
    Missing {
        /// The directory.
        path: PathBuf,
    },
    /// Not a directory.
    #[error("cannot mount on {}: not a directory", .path.display())]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// Not empty.
    #[error("cannot mount on {}: the directory is not empty (mount on an empty one)", .path.display())]
    NotEmpty {
        /// The directory.
        path: PathBuf,
    },
    /// A FUSE mount whose server is gone.
    #[error(
        "cannot mount on {p}: it is a stale FUSE mount left by a proxy that was killed \
         (\"Transport endpoint is not connected\"); clear it with: fusermount3 -u {p} \
         (or, as root: umount -l {p})",
        p = .path.display()
    )]
    Stale {
        /// The directory.
        path: PathBuf,
    },
    /// Something is mounted there.
    #[error(
        "cannot mount on {}: a {fstype} file system is mounted there (another gvfs-proxy?)",
        .path.display()
    )]
    AlreadyMounted {
        /// The directory.
        path: PathBuf,
        /// What is mounted.
        fstype: String,
    },
    /// The directory could not be examined.
    #[error("cannot mount on {}: {cause}", .path.display())]
    MountPoint {
        /// The directory.
        path: PathBuf,
        /// Why (part of the message, so not also a `source`).
        cause: std::io::Error,
    },
    /// The read trace file could not be created.
    #[error("cannot create the read trace {}: {cause}", .path.display())]
    Trace {
        /// The file.
        path: PathBuf,
        /// Why (part of the message, so not also a `source`).
        cause: std::io::Error,
    },
    /// The stack did not give its root.
    #[error("cannot mount: the stack's root: {0}")]
    Root(ServiceError),
    /// The kernel or fusermount3 refused the mount.
    #[error(
        "cannot mount on {}: {cause} (FUSE needs /dev/fuse; as a user other than root, \
         fusermount3 from the fuse3 package)",
        .path.display()
    )]
    Mount {
        /// The directory.
        path: PathBuf,
        /// Why (part of the message, so not also a `source`).
        cause: std::io::Error,
    },
    /// The session's state directory (or a file in it) could not be
    /// made, locked, written or read.
    #[error("cannot use the FUSE session's state at {}: {cause}", .path.display())]
    State {
        /// The directory or file.
        path: PathBuf,
        /// Why (part of the message, so not also a `source`).
        cause: std::io::Error,
    },
    /// Another process holds the session's lock: it serves the mount.
    #[error(
        "the FUSE session's state at {} is locked by {}: another gvfs-proxy serves this mount",
        .path.display(),
        .pid.map_or_else(|| "another process".to_string(), |p| format!("pid {p}"))
    )]
    StateBusy {
        /// The state directory.
        path: PathBuf,
        /// The holder, if it noted its pid.
        pid: Option<u32>,
    },
    /// The session file is not one this code can read.
    #[error("cannot read the FUSE session file {}: {problem}", .path.display())]
    SessionFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: SessionProblem,
    },
    /// The session file is another session's: its table must not be
    /// applied to this connection.
    #[error("different session: the FUSE session file {} has another {what}", .path.display())]
    DifferentSession {
        /// The file.
        path: PathBuf,
        /// What differs.
        what: &'static str,
    },
}

/// What is wrong with a session file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionProblem {
    /// Shorter than its fixed fields.
    #[error("too short")]
    Short,
    /// Longer than the longest root handle and directory allow.
    #[error("too long")]
    Long,
    /// Not a gvfs session file.
    #[error("no GVFS magic")]
    Magic,
    /// A format version this code does not read.
    #[error("format version {0} (this build reads 1)")]
    Version(u32),
    /// The checksum does not match.
    #[error("bad CRC")]
    Crc,
    /// A length field out of bounds.
    #[error("a length out of bounds")]
    Length,
}
