//! Whether a metadata file may be believed about the file it describes.
//!
//! A zero map tells a caching proxy to answer reads with zeros without
//! asking the server, so whoever can write `.NAME.gvfsmeta` can make every
//! proxy serve zeros for `NAME`. Metadata is therefore trusted only when
//! nobody can change it who could not change the file itself. From the
//! attributes the server reports for both (NFSv3 has no group lists, so the
//! check is conservative), the metadata file must be a regular file and:
//!
//! 1. owned by root (uid 0) or by the file's owner, or else the file is
//!    writable by others (`o+w`: anyone may change it anyway);
//! 2. not group-writable, unless the file is writable by others, or is
//!    group-writable with the same group;
//! 3. not writable by others, unless the file is too.
//!
//! Root and an owner can always change a file (an owner by `chmod`), which
//! is why (1) names them; (2) and (3) keep the set of other writers of the
//! metadata within the file's. The directory does not matter: a user who
//! can write it can replace the metadata file, but the new file is theirs
//! and fails (1). A hard link to another trusted metadata file passes (1)
//! to (3), but has to match the file's size, mtime and ctime, and nobody
//! can set a ctime.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use gvfs_nfs::nfs3_types::nfs3::{fattr3, ftype3};

/// Group-write and other-write mode bits.
const GROUP_WRITE: u32 = 0o020;
const OTHER_WRITE: u32 = 0o002;

/// Who owns a file and who else may write it: what [`check`] needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ownership {
    /// Whether it is a regular file.
    pub regular: bool,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Mode bits (only the write bits matter).
    pub mode: u32,
}

impl From<&fattr3> for Ownership {
    fn from(a: &fattr3) -> Self {
        Self {
            regular: a.type_ == ftype3::NF3REG,
            uid: a.uid,
            gid: a.gid,
            mode: a.mode,
        }
    }
}

/// Why a metadata file is not trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Distrust {
    /// Not a regular file.
    #[error("not a regular file")]
    NotRegular,
    /// Owned by someone other than root and the file's owner.
    #[error("owned by uid {meta}, not by root or the file's owner (uid {file})")]
    Owner {
        /// The metadata file's owner.
        meta: u32,
        /// The described file's owner.
        file: u32,
    },
    /// Its group may write it, and may not write the file.
    #[error(
        "writable by group {meta_gid}, which cannot write the file (group {file_gid}, mode {file_mode:o})"
    )]
    GroupWritable {
        /// The metadata file's group.
        meta_gid: u32,
        /// The described file's group.
        file_gid: u32,
        /// The described file's mode.
        file_mode: u32,
    },
    /// Anyone may write it, and not the file.
    #[error("writable by anyone, and the file is not")]
    OtherWritable,
}

/// Whether metadata with attributes `meta` may be believed about a file
/// with attributes `file` (the rules in the [module docs](self)).
pub fn check(meta: &Ownership, file: &Ownership) -> Result<(), Distrust> {
    if !meta.regular {
        return Err(Distrust::NotRegular);
    }
    let file_other_writable = file.mode & OTHER_WRITE != 0;
    if meta.uid != 0 && meta.uid != file.uid && !file_other_writable {
        return Err(Distrust::Owner {
            meta: meta.uid,
            file: file.uid,
        });
    }
    if meta.mode & GROUP_WRITE != 0
        && !file_other_writable
        && !(file.mode & GROUP_WRITE != 0 && meta.gid == file.gid)
    {
        return Err(Distrust::GroupWritable {
            meta_gid: meta.gid,
            file_gid: file.gid,
            file_mode: file.mode & 0o7777,
        });
    }
    if meta.mode & OTHER_WRITE != 0 && !file_other_writable {
        return Err(Distrust::OtherWritable);
    }
    Ok(())
}

/// Lets through at most `max` warnings per `period`, and counts the rest
/// so the next one let through can say how many were held back: a
/// directory full of planted metadata files must not flood the log.
#[derive(Debug)]
pub struct WarnLimit {
    max: u32,
    period: Duration,
    state: Mutex<(Option<Instant>, u32, u64)>,
}

impl WarnLimit {
    /// At most `max` warnings let through in each `period`.
    pub const fn new(max: u32, period: Duration) -> Self {
        Self {
            max,
            period,
            state: Mutex::new((None, 0, 0)),
        }
    }

    /// `Some(n)` when a warning may be logged now, `n` being how many were
    /// held back since the last one; `None` to hold this one back.
    pub fn allow(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (start, shown, held) = &mut *s;
        if start.is_none_or(|t| now.duration_since(t) >= self.period) {
            *start = Some(now);
            *shown = 0;
        }
        if *shown >= self.max {
            *held += 1;
            return None;
        }
        *shown += 1;
        Some(std::mem::take(held))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(uid: u32, gid: u32, mode: u32) -> Ownership {
        Ownership {
            regular: true,
            uid,
            gid,
            mode,
        }
    }

    #[test]
    fn owners_and_root_are_trusted_others_not() {
        let image = o(0, 0, 0o644);
        assert_eq!(check(&o(0, 0, 0o644), &image), Ok(()));
        assert_eq!(
            check(&o(1000, 1000, 0o644), &image),
            Err(Distrust::Owner {
                meta: 1000,
                file: 0
            })
        );
        let users = o(1000, 100, 0o600);
        assert_eq!(check(&o(1000, 5, 0o644), &users), Ok(()));
        assert_eq!(check(&o(0, 0, 0o444), &users), Ok(()));
        assert!(check(&o(1001, 100, 0o644), &users).is_err());
        // Anyone may change a world-writable file: its metadata may be
        // anyone's too.
        assert_eq!(check(&o(1001, 7, 0o666), &o(0, 0, 0o666)), Ok(()));
        let mut dir = o(0, 0, 0o644);
        dir.regular = false;
        assert_eq!(check(&dir, &image), Err(Distrust::NotRegular));
    }

    #[test]
    fn other_writers_of_the_metadata_must_be_writers_of_the_file() {
        // Group-writable metadata: only for a file its group may write.
        let shared = o(0, 50, 0o664);
        assert_eq!(check(&o(0, 50, 0o664), &shared), Ok(()));
        assert!(matches!(
            check(&o(0, 51, 0o664), &shared),
            Err(Distrust::GroupWritable { .. })
        ));
        assert!(matches!(
            check(&o(0, 50, 0o664), &o(0, 50, 0o644)),
            Err(Distrust::GroupWritable { .. })
        ));
        // World-writable metadata: only for a world-writable file.
        assert_eq!(
            check(&o(0, 0, 0o646), &o(0, 0, 0o644)),
            Err(Distrust::OtherWritable)
        );
        assert_eq!(check(&o(0, 0, 0o666), &o(0, 0, 0o606)), Ok(()));
    }

    #[test]
    fn warnings_are_limited_per_period_and_say_how_many_were_held() {
        let limit = WarnLimit::new(2, Duration::from_secs(60));
        let t = Instant::now();
        assert_eq!(limit.allow(t), Some(0));
        assert_eq!(limit.allow(t), Some(0));
        assert_eq!(limit.allow(t), None);
        assert_eq!(limit.allow(t + Duration::from_secs(59)), None);
        assert_eq!(limit.allow(t + Duration::from_secs(60)), Some(2));
        assert_eq!(limit.allow(t + Duration::from_secs(61)), Some(0));
        assert_eq!(limit.allow(t + Duration::from_secs(62)), None);
    }
}
