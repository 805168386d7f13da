//! Who is calling and what the mode bits let them do.
//!
//! The proxy usually runs as root, so the kernel checks nothing on the
//! caller's behalf: these checks are the only ones, and they follow what
//! Linux (and so knfsd) decides from owner, group and mode bits. ACLs are
//! not consulted.

use gvfs_nfs::rpc::Credentials;
use nfs3_types::nfs3::{
    ACCESS3_DELETE, ACCESS3_EXECUTE, ACCESS3_EXTEND, ACCESS3_LOOKUP, ACCESS3_MODIFY, ACCESS3_READ,
};

use super::attr::{Attr, S_ISGID, S_ISUID, S_ISVTX, S_IXGRP};

/// Read permission bit.
pub(super) const R: u32 = 4;
/// Write permission bit.
pub(super) const W: u32 = 2;
/// Execute (search) permission bit.
pub(super) const X: u32 = 1;

/// The identity AUTH_NONE callers get (nobody:nogroup).
pub(super) const NOBODY: u32 = 65_534;

/// The caller of one procedure, from its credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Caller {
    pub(super) uid: u32,
    pub(super) gid: u32,
    groups: Vec<u32>,
}

impl Caller {
    pub(super) fn from_cred(cred: &Credentials) -> Self {
        match cred {
            Credentials::Unix(u) => Self {
                uid: u.uid,
                gid: u.gid,
                groups: u.gids.clone(),
            },
            Credentials::None => Self {
                uid: NOBODY,
                gid: NOBODY,
                groups: Vec::new(),
            },
        }
    }

    pub(super) fn is_root(&self) -> bool {
        self.uid == 0
    }

    pub(super) fn owns(&self, a: &Attr) -> bool {
        self.uid == a.uid
    }

    pub(super) fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    /// Whether the mode bits of `a` grant all of `want` (`R`, `W`, `X`).
    /// Root may do anything, except execute a non-directory without any x
    /// bit, as on Linux.
    pub(super) fn may(&self, a: &Attr, want: u32) -> bool {
        if self.is_root() {
            return want & X == 0 || a.is_dir() || a.mode & 0o111 != 0;
        }
        let bits = if self.owns(a) {
            a.mode >> 6
        } else if self.in_group(a.gid) {
            a.mode >> 3
        } else {
            a.mode
        } & 7;
        bits & want == want
    }

    /// What ACCESS answers for `requested` (RFC 1813 section 3.3.4), as
    /// knfsd computes it: for a directory, changing or removing entries
    /// needs write and search permission; DELETE is never granted on
    /// anything but a directory.
    pub(super) fn access3(&self, a: &Attr, requested: u32) -> u32 {
        let mut granted = 0;
        if self.may(a, R) {
            granted |= ACCESS3_READ;
        }
        if a.is_dir() {
            if self.may(a, X) {
                granted |= ACCESS3_LOOKUP;
            }
            if self.may(a, W | X) {
                granted |= ACCESS3_MODIFY | ACCESS3_EXTEND | ACCESS3_DELETE;
            }
        } else {
            if self.may(a, X) {
                granted |= ACCESS3_EXECUTE;
            }
            if self.may(a, W) {
                granted |= ACCESS3_MODIFY | ACCESS3_EXTEND;
            }
        }
        granted & requested
    }

    /// Whether the sticky bit of `dir` lets the caller remove or rename
    /// `victim` out of it (owner of either, or root).
    pub(super) fn may_unlink_from(&self, dir: &Attr, victim: &Attr) -> bool {
        dir.mode & S_ISVTX == 0 || self.is_root() || self.owns(victim) || self.owns(dir)
    }

    /// Linux's `fs.protected_hardlinks`: a caller may hard-link a file it
    /// does not own only if it is a plain, non-set-id file it can read and
    /// write.
    pub(super) fn may_hardlink(&self, a: &Attr) -> bool {
        if self.is_root() || self.owns(a) {
            return true;
        }
        let setid = a.mode & S_ISUID != 0 || a.mode & (S_ISGID | S_IXGRP) == S_ISGID | S_IXGRP;
        a.is_reg() && !setid && self.may(a, R | W)
    }
}

#[cfg(test)]
mod tests;
