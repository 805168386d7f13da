//! File attributes: one `statx` (never following a symlink) turned into
//! what NFSv3 reports (`fattr3`, `wcc_attr`; RFC 1813 section 2.6).

use std::io;
use std::os::fd::BorrowedFd;

use nfs3_types::nfs3::{fattr3, ftype3, nfstime3, specdata3, wcc_attr};
use rustix::fs::{AtFlags, StatxFlags, StatxTimestamp, statx};

use super::handle::FileKey;

pub(super) const S_IFMT: u32 = 0o170_000;
pub(super) const S_IFREG: u32 = 0o100_000;
pub(super) const S_IFDIR: u32 = 0o040_000;
pub(super) const S_IFLNK: u32 = 0o120_000;
pub(super) const S_IFCHR: u32 = 0o020_000;
pub(super) const S_IFBLK: u32 = 0o060_000;
pub(super) const S_IFIFO: u32 = 0o010_000;
pub(super) const S_IFSOCK: u32 = 0o140_000;
pub(super) const S_ISUID: u32 = 0o4000;
pub(super) const S_ISGID: u32 = 0o2000;
pub(super) const S_ISVTX: u32 = 0o1000;
pub(super) const S_IXGRP: u32 = 0o010;

/// What `statx` said about one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Attr {
    pub(super) ino: u64,
    /// Birth time in nanoseconds, 0 when the filesystem keeps none.
    pub(super) generation: u64,
    /// Type and permission bits (`st_mode`).
    pub(super) mode: u32,
    pub(super) nlink: u32,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) size: u64,
    /// 512-byte blocks allocated.
    pub(super) blocks: u64,
    pub(super) rdev: (u32, u32),
    pub(super) atime: nfstime3,
    pub(super) mtime: nfstime3,
    pub(super) ctime: nfstime3,
}

const STATX_MASK: StatxFlags = StatxFlags::BASIC_STATS.union(StatxFlags::BTIME);

/// Attributes of `name` in `dir`, not following a symlink.
pub(super) fn stat_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<Attr> {
    let s = statx(dir, name, AtFlags::SYMLINK_NOFOLLOW, STATX_MASK)?;
    Ok(Attr::from_statx(&s))
}

/// Attributes of the file `fd` is open on (an `O_PATH` descriptor will do).
pub(super) fn stat_fd(fd: BorrowedFd<'_>) -> io::Result<Attr> {
    let s = statx(fd, c"", AtFlags::EMPTY_PATH, STATX_MASK)?;
    Ok(Attr::from_statx(&s))
}

/// NFSv3 times are unsigned 32-bit seconds; like knfsd, keep the low bits.
fn nfstime(t: &StatxTimestamp) -> nfstime3 {
    nfstime3 {
        seconds: t.tv_sec as u32,
        nseconds: t.tv_nsec,
    }
}

impl Attr {
    fn from_statx(s: &rustix::fs::Statx) -> Self {
        let generation = if StatxFlags::from_bits_retain(s.stx_mask).contains(StatxFlags::BTIME) {
            (s.stx_btime.tv_sec as u64)
                .wrapping_mul(1_000_000_000)
                .wrapping_add(u64::from(s.stx_btime.tv_nsec))
        } else {
            0
        };
        Self {
            ino: s.stx_ino,
            generation,
            mode: u32::from(s.stx_mode),
            nlink: s.stx_nlink,
            uid: s.stx_uid,
            gid: s.stx_gid,
            size: s.stx_size,
            blocks: s.stx_blocks,
            rdev: (s.stx_rdev_major, s.stx_rdev_minor),
            atime: nfstime(&s.stx_atime),
            mtime: nfstime(&s.stx_mtime),
            ctime: nfstime(&s.stx_ctime),
        }
    }

    pub(super) fn key(&self) -> FileKey {
        FileKey {
            ino: self.ino,
            generation: self.generation,
        }
    }

    pub(super) fn kind(&self) -> u32 {
        self.mode & S_IFMT
    }

    pub(super) fn is_dir(&self) -> bool {
        self.kind() == S_IFDIR
    }

    pub(super) fn is_reg(&self) -> bool {
        self.kind() == S_IFREG
    }

    pub(super) fn is_symlink(&self) -> bool {
        self.kind() == S_IFLNK
    }

    /// Permission bits, set-id and sticky bits included.
    pub(super) fn perm(&self) -> u32 {
        self.mode & 0o7777
    }

    fn ftype(&self) -> ftype3 {
        match self.kind() {
            S_IFDIR => ftype3::NF3DIR,
            S_IFLNK => ftype3::NF3LNK,
            S_IFCHR => ftype3::NF3CHR,
            S_IFBLK => ftype3::NF3BLK,
            S_IFIFO => ftype3::NF3FIFO,
            S_IFSOCK => ftype3::NF3SOCK,
            _ => ftype3::NF3REG,
        }
    }

    /// The attributes as NFSv3 reports them (RFC 1813 section 2.5, fattr3).
    pub(super) fn fattr(&self, fsid: u64) -> fattr3 {
        fattr3 {
            type_: self.ftype(),
            mode: self.perm(),
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            size: self.size,
            used: self.blocks.saturating_mul(512),
            rdev: specdata3 {
                specdata1: self.rdev.0,
                specdata2: self.rdev.1,
            },
            fsid,
            fileid: self.ino,
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
        }
    }

    /// The pre-operation part of wcc_data (RFC 1813 section 2.6).
    pub(super) fn wcc(&self) -> wcc_attr {
        wcc_attr {
            size: self.size,
            mtime: self.mtime,
            ctime: self.ctime,
        }
    }
}
