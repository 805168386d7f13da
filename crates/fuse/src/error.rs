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
}
