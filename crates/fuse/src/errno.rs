//! NFS status to errno: the one place a FUSE reply's error is chosen.
//!
//! The errors are those a Linux NFS client mount gives its callers for
//! the same status (`nfs3_stat_to_errno` in the kernel), except where the
//! kernel uses an errno of its own that user space never sees: those
//! become the nearest errno that it does (a bad handle is stale, a bad
//! cookie or a too-small reply is invalid).

use fuser::Errno;
use gvfs_nfs::ServiceError;
use nfs3_types::nfs3::nfsstat3;

/// The errno a process sees for an NFS status.
pub(crate) fn errno(status: nfsstat3) -> Errno {
    use nfsstat3::*;
    let e = match status {
        NFS3_OK => return Errno::EIO,
        NFS3ERR_PERM => libc::EPERM,
        NFS3ERR_NOENT => libc::ENOENT,
        NFS3ERR_IO => libc::EIO,
        NFS3ERR_NXIO => libc::ENXIO,
        NFS3ERR_ACCES => libc::EACCES,
        NFS3ERR_EXIST => libc::EEXIST,
        NFS3ERR_XDEV => libc::EXDEV,
        NFS3ERR_NODEV => libc::ENODEV,
        NFS3ERR_NOTDIR => libc::ENOTDIR,
        NFS3ERR_ISDIR => libc::EISDIR,
        NFS3ERR_INVAL => libc::EINVAL,
        NFS3ERR_FBIG => libc::EFBIG,
        NFS3ERR_NOSPC => libc::ENOSPC,
        NFS3ERR_ROFS => libc::EROFS,
        NFS3ERR_MLINK => libc::EMLINK,
        NFS3ERR_NAMETOOLONG => libc::ENAMETOOLONG,
        NFS3ERR_NOTEMPTY => libc::ENOTEMPTY,
        NFS3ERR_DQUOT => libc::EDQUOT,
        NFS3ERR_STALE | NFS3ERR_BADHANDLE => libc::ESTALE,
        NFS3ERR_REMOTE => libc::EREMOTE,
        NFS3ERR_NOT_SYNC => libc::EIO,
        NFS3ERR_BAD_COOKIE | NFS3ERR_TOOSMALL | NFS3ERR_BADTYPE => libc::EINVAL,
        NFS3ERR_NOTSUPP => libc::EOPNOTSUPP,
        NFS3ERR_SERVERFAULT => libc::EREMOTEIO,
        NFS3ERR_JUKEBOX => libc::EAGAIN,
    };
    Errno::from_i32(e)
}

/// The errno for a call the stack could not answer at all: an upstream
/// that stayed away past `--upstream-timeout`, a layer's own failure.
pub(crate) fn service_errno(e: &ServiceError) -> Errno {
    errno(e.nfsstat())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_as_a_kernel_nfs_mount_maps_them() {
        let cases = [
            (nfsstat3::NFS3ERR_STALE, libc::ESTALE),
            (nfsstat3::NFS3ERR_BADHANDLE, libc::ESTALE),
            (nfsstat3::NFS3ERR_ACCES, libc::EACCES),
            (nfsstat3::NFS3ERR_DQUOT, libc::EDQUOT),
            (nfsstat3::NFS3ERR_NOSPC, libc::ENOSPC),
            (nfsstat3::NFS3ERR_IO, libc::EIO),
            (nfsstat3::NFS3ERR_NAMETOOLONG, libc::ENAMETOOLONG),
            (nfsstat3::NFS3ERR_FBIG, libc::EFBIG),
            (nfsstat3::NFS3ERR_NOTEMPTY, libc::ENOTEMPTY),
            (nfsstat3::NFS3ERR_NOTSUPP, libc::EOPNOTSUPP),
            (nfsstat3::NFS3ERR_SERVERFAULT, libc::EREMOTEIO),
        ];
        for (status, e) in cases {
            assert_eq!(errno(status), Errno::from_i32(e), "{status}");
        }
    }

    #[test]
    fn an_upstream_gone_past_its_timeout_is_an_io_error() {
        let e = ServiceError::UpstreamUnavailable {
            upstream: "nfs://x/export".into(),
            reason: "timed out".into(),
        };
        assert_eq!(service_errno(&e), Errno::EIO);
    }
}
