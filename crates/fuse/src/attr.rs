//! NFS attributes as FUSE wants them, and FUSE's changes as NFS `sattr3`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo, TimeOrNow};
use nfs3_types::nfs3::{Nfs3Option, fattr3, ftype3, nfstime3, sattr3, set_atime, set_mtime};

use crate::inodes::Stamp;

/// The block size `stat` reports: the largest READ and WRITE, so that
/// programs that size their buffers by it (cp, stdio) move 1 MiB at once.
pub(crate) const BLKSIZE: u32 = 1 << 20;

/// `a` as node `ino`'s attributes.
pub(crate) fn file_attr(ino: u64, a: &fattr3) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: a.size,
        blocks: a.used.div_ceil(512),
        atime: time(&a.atime),
        mtime: time(&a.mtime),
        ctime: time(&a.ctime),
        crtime: time(&a.ctime),
        kind: kind(a.type_),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: libc::makedev(a.rdev.specdata1, a.rdev.specdata2) as u32,
        blksize: BLKSIZE,
        flags: 0,
    }
}

/// Attributes of node `ino` of `kind` with nothing else known, for a
/// listed entry the server sent no attributes for.
pub(crate) fn bare_attr(ino: u64, kind: FileType) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind,
        perm: 0,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: BLKSIZE,
        flags: 0,
    }
}

/// The FUSE file type of an NFS one.
pub(crate) fn kind(t: ftype3) -> FileType {
    match t {
        ftype3::NF3REG => FileType::RegularFile,
        ftype3::NF3DIR => FileType::Directory,
        ftype3::NF3BLK => FileType::BlockDevice,
        ftype3::NF3CHR => FileType::CharDevice,
        ftype3::NF3LNK => FileType::Symlink,
        ftype3::NF3SOCK => FileType::Socket,
        ftype3::NF3FIFO => FileType::NamedPipe,
    }
}

fn time(t: &nfstime3) -> SystemTime {
    UNIX_EPOCH + Duration::new(u64::from(t.seconds), t.nseconds.min(999_999_999))
}

/// What says whether `a`'s data changed.
pub(crate) fn stamp(a: &fattr3) -> Stamp {
    (
        a.size,
        (a.mtime.seconds, a.mtime.nseconds),
        (a.ctime.seconds, a.ctime.nseconds),
    )
}

/// A time as NFS carries it: seconds since 1970 in 32 bits. A time
/// before 1970 or after 2106 cannot be sent (EINVAL, as NFSv3 would).
fn nfs_time(t: SystemTime) -> Option<nfstime3> {
    let d = t.duration_since(UNIX_EPOCH).ok()?;
    Some(nfstime3 {
        seconds: u32::try_from(d.as_secs()).ok()?,
        nseconds: d.subsec_nanos(),
    })
}

/// A time FUSE cannot put into NFS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BadTime;

/// The changes of a SETATTR, as `sattr3`.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Changes {
    pub(crate) mode: Option<u32>,
    pub(crate) uid: Option<u32>,
    pub(crate) gid: Option<u32>,
    pub(crate) size: Option<u64>,
    pub(crate) atime: Option<TimeOrNow>,
    pub(crate) mtime: Option<TimeOrNow>,
}

impl Changes {
    /// Only a mode (a new file's, less the umask).
    pub(crate) fn mode(mode: u32) -> Self {
        Self {
            mode: Some(mode & 0o7777),
            ..Self::default()
        }
    }

    /// As NFS's `sattr3`.
    pub(crate) fn sattr(&self) -> Result<sattr3, BadTime> {
        let opt = |v: Option<u32>| v.map_or(Nfs3Option::None, Nfs3Option::Some);
        Ok(sattr3 {
            mode: opt(self.mode.map(|m| m & 0o7777)),
            uid: opt(self.uid),
            gid: opt(self.gid),
            size: self.size.map_or(Nfs3Option::None, Nfs3Option::Some),
            atime: match self.atime {
                None => set_atime::DONT_CHANGE,
                Some(TimeOrNow::Now) => set_atime::SET_TO_SERVER_TIME,
                Some(TimeOrNow::SpecificTime(t)) => {
                    set_atime::SET_TO_CLIENT_TIME(nfs_time(t).ok_or(BadTime)?)
                }
            },
            mtime: match self.mtime {
                None => set_mtime::DONT_CHANGE,
                Some(TimeOrNow::Now) => set_mtime::SET_TO_SERVER_TIME,
                Some(TimeOrNow::SpecificTime(t)) => {
                    set_mtime::SET_TO_CLIENT_TIME(nfs_time(t).ok_or(BadTime)?)
                }
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_carry_over() {
        let mut a = gvfs_nfs::testing::file_attrs(5000, 1_700_000_000);
        a.mode = 0o104_755;
        a.used = 4097;
        let f = file_attr(7, &a);
        assert_eq!(f.ino, INodeNo(7));
        assert_eq!(f.perm, 0o4755);
        assert_eq!(f.blocks, 9);
        assert_eq!(f.kind, FileType::RegularFile);
        assert_eq!(
            f.mtime,
            UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            "mtime"
        );
    }

    #[test]
    fn times_outside_nfs_range_are_refused() {
        let c = Changes {
            mtime: Some(TimeOrNow::SpecificTime(UNIX_EPOCH - Duration::from_secs(1))),
            ..Changes::default()
        };
        assert_eq!(c.sattr().err(), Some(BadTime));
        let c = Changes {
            mtime: Some(TimeOrNow::SpecificTime(UNIX_EPOCH + Duration::from_secs(5))),
            size: Some(3),
            ..Changes::default()
        };
        let s = c.sattr().unwrap();
        assert!(matches!(s.mtime, set_mtime::SET_TO_CLIENT_TIME(t) if t.seconds == 5));
        assert!(matches!(s.size, Nfs3Option::Some(3)));
    }
}
