//! How a failed step of a procedure becomes an `nfsstat3`: the one place an
//! errno is mapped.

use std::io;

use nfs3_types::nfs3::nfsstat3;

/// A failed step of a procedure, as the client will see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Fail(pub(super) nfsstat3);

impl From<nfsstat3> for Fail {
    fn from(s: nfsstat3) -> Self {
        Self(s)
    }
}

impl From<io::Error> for Fail {
    fn from(e: io::Error) -> Self {
        Self(nfsstat_from_errno(e.raw_os_error().unwrap_or(libc::EIO)))
    }
}

impl From<rustix::io::Errno> for Fail {
    fn from(e: rustix::io::Errno) -> Self {
        Self(nfsstat_from_errno(e.raw_os_error()))
    }
}

/// The NFSv3 status for a failed system call, as Linux knfsd answers it
/// (`nfserrno()` in fs/nfsd/nfsproc.c); anything unlisted is an I/O error.
pub(super) fn nfsstat_from_errno(errno: i32) -> nfsstat3 {
    use nfsstat3::*;
    match errno {
        libc::EPERM => NFS3ERR_PERM,
        libc::ENOENT => NFS3ERR_NOENT,
        libc::EIO | libc::ETXTBSY => NFS3ERR_IO,
        libc::ENXIO => NFS3ERR_NXIO,
        libc::E2BIG | libc::EFBIG => NFS3ERR_FBIG,
        libc::EBADF | libc::ESTALE => NFS3ERR_STALE,
        libc::EACCES => NFS3ERR_ACCES,
        libc::EEXIST => NFS3ERR_EXIST,
        libc::EXDEV => NFS3ERR_XDEV,
        libc::EMLINK => NFS3ERR_MLINK,
        libc::ENODEV => NFS3ERR_NODEV,
        libc::ENOTDIR => NFS3ERR_NOTDIR,
        libc::EISDIR => NFS3ERR_ISDIR,
        libc::EINVAL => NFS3ERR_INVAL,
        libc::ENOSPC => NFS3ERR_NOSPC,
        libc::EROFS => NFS3ERR_ROFS,
        libc::ENAMETOOLONG => NFS3ERR_NAMETOOLONG,
        libc::ENOTEMPTY => NFS3ERR_NOTEMPTY,
        libc::EDQUOT => NFS3ERR_DQUOT,
        libc::ETIMEDOUT | libc::EAGAIN | libc::ENOMEM => NFS3ERR_JUKEBOX,
        libc::EOPNOTSUPP => NFS3ERR_NOTSUPP,
        libc::ENFILE | libc::EMFILE => NFS3ERR_SERVERFAULT,
        _ => NFS3ERR_IO,
    }
}
