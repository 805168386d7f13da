//! Which version of a file attributes describe: the one type for every
//! "is this still the same file" check (a metadata file, a working-set
//! profile, a file-cache entry, a guarded write-back, cached blocks).
//!
//! A version is the file's size, mtime and ctime (RFC 1813, section 2.6,
//! `fattr3`). The ctime is what catches a change whose mtime was put back
//! (`touch -d`, `cp -p`): nobody can set a ctime, and any change to the
//! file's data or attributes moves it.

use nfs3_types::nfs3::{fattr3, nfstime3, wcc_attr};

/// A file's size, mtime and ctime: equal versions hold the same bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileVersion {
    /// Size in bytes.
    pub size: u64,
    /// Modification time: seconds, nanoseconds.
    pub mtime: (u64, u32),
    /// Change time (the change attribute): seconds, nanoseconds.
    pub ctime: (u64, u32),
}

impl FileVersion {
    /// The version attributes `a` describe.
    pub fn of(a: &fattr3) -> Self {
        let t = |t: nfstime3| (u64::from(t.seconds), t.nseconds);
        Self {
            size: a.size,
            mtime: t(a.mtime),
            ctime: t(a.ctime),
        }
    }

    /// The version a WRITE's or SETATTR's `before` attributes (weak cache
    /// consistency, RFC 1813 section 2.6) describe.
    pub fn of_wcc(a: &wcc_attr) -> Self {
        let t = |t: nfstime3| (u64::from(t.seconds), t.nseconds);
        Self {
            size: a.size,
            mtime: t(a.mtime),
            ctime: t(a.ctime),
        }
    }

    /// Whether attributes `a` describe this version.
    pub fn describes(&self, a: &fattr3) -> bool {
        *self == Self::of(a)
    }

    /// Whether `other` has the same size and mtime, whatever its ctime: the
    /// file's bytes are likely the same, but something (a copy, `chmod`)
    /// touched it since. Never enough to trust metadata; what a diagnosis
    /// tells apart from a real change.
    pub fn same_but_ctime(&self, other: &Self) -> bool {
        self.size == other.size && self.mtime == other.mtime
    }

    /// The mtime as NFSv3 sends it (seconds past `u32::MAX` saturate).
    pub fn mtime3(&self) -> nfstime3 {
        time3(self.mtime)
    }

    /// The ctime as NFSv3 sends it (seconds past `u32::MAX` saturate).
    pub fn ctime3(&self) -> nfstime3 {
        time3(self.ctime)
    }
}

/// Whether attributes `a` and `b` describe the same version of a file.
pub fn same_version(a: &fattr3, b: &fattr3) -> bool {
    FileVersion::of(a) == FileVersion::of(b)
}

fn time3((seconds, nseconds): (u64, u32)) -> nfstime3 {
    nfstime3 {
        seconds: u32::try_from(seconds).unwrap_or(u32::MAX),
        nseconds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::file_attrs;

    #[test]
    fn a_version_is_size_mtime_and_ctime() {
        let a = file_attrs(10, 5);
        assert!(FileVersion::of(&a).describes(&a));
        assert!(same_version(&a, &a));
        let mut b = a.clone();
        b.ctime.nseconds += 1;
        assert!(!same_version(&a, &b));
        assert!(FileVersion::of(&a).same_but_ctime(&FileVersion::of(&b)));
        b.size += 1;
        assert!(!FileVersion::of(&a).same_but_ctime(&FileVersion::of(&b)));
        let v = FileVersion::of(&a);
        assert_eq!((v.mtime3(), v.ctime3()), (a.mtime, a.ctime));
    }

    #[test]
    fn weak_cache_consistency_attributes_describe_the_same_version() {
        let a = file_attrs(10, 5);
        let mut w = wcc_attr {
            size: a.size,
            mtime: a.mtime,
            ctime: a.ctime,
        };
        assert_eq!(FileVersion::of_wcc(&w), FileVersion::of(&a));
        w.ctime.seconds += 1;
        assert_ne!(FileVersion::of_wcc(&w), FileVersion::of(&a));
    }
}
