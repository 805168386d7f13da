//! What is at the directory to mount on: an empty directory fit for a
//! fresh mount, or a gvfs mount (live, paused or dead) whose session a
//! new proxy may take over; and what is done to the mount itself from
//! outside FUSE: its read-ahead, and the unmount.

use std::path::{Path, PathBuf};

use crate::error::FuseError;

/// What is at the directory to mount on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Found {
    /// An empty directory with nothing mounted on it.
    Free,
    /// A gvfs FUSE mount; `dev` is its connection's `MAJ:MIN`.
    Gvfs {
        /// The connection's device numbers.
        dev: (u32, u32),
    },
}

/// Examines `dir` before mounting on it. The mount table is read first,
/// and a FUSE mount found there is never `stat`ed: with its proxy gone,
/// the request would wait for an answer nobody gives.
pub(crate) fn inspect(dir: &Path) -> Result<Found, FuseError> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    inspect_in(dir, &table)
}

fn inspect_in(dir: &Path, table: &str) -> Result<Found, FuseError> {
    let path = dir.to_path_buf();
    if let Some(m) = mounted(dir, table) {
        if m.is_gvfs() {
            return Ok(Found::Gvfs { dev: m.dev });
        }
        if m.fstype.starts_with("fuse") {
            return Err(FuseError::AlreadyMounted {
                path,
                fstype: m.fstype,
            });
        }
    }
    let meta = match std::fs::metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(FuseError::Missing { path });
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return Err(FuseError::Stale { path });
        }
        Err(cause) => return Err(FuseError::MountPoint { path, cause }),
    };
    if !meta.is_dir() {
        return Err(FuseError::NotADirectory { path });
    }
    let mut entries = std::fs::read_dir(dir).map_err(|cause| FuseError::MountPoint {
        path: path.clone(),
        cause,
    })?;
    if entries.next().is_some() {
        return Err(FuseError::NotEmpty { path });
    }
    Ok(Found::Free)
}

/// One mount, as the mount table has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mounted {
    /// Where.
    pub at: PathBuf,
    /// Its `MAJ:MIN`.
    pub dev: (u32, u32),
    /// Its type (`fuse`, or `fuse.gvfs` through fusermount3).
    pub fstype: String,
    /// What is mounted (`gvfs:...` for ours).
    pub source: String,
}

impl Mounted {
    /// Whether a gvfs proxy made it: a FUSE mount whose source (or
    /// subtype, as fusermount3 shows it) names gvfs.
    pub(crate) fn is_gvfs(&self) -> bool {
        self.fstype == "fuse.gvfs" || (self.fstype == "fuse" && self.source.starts_with("gvfs:"))
    }
}

/// `dir` as mountinfo shows a mount point: its parent canonicalized and
/// its own name joined, so a live FUSE mount at `dir` is never looked at
/// (a `stat` of it is a request to its server).
pub(crate) fn mount_point_path(dir: &Path) -> PathBuf {
    match (dir.parent(), dir.file_name()) {
        (Some(parent), Some(name)) => {
            let parent = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            std::fs::canonicalize(parent)
                .map(|p| p.join(name))
                .unwrap_or_else(|_| dir.to_path_buf())
        }
        _ => dir.to_path_buf(),
    }
}

/// The device (MAJ:MIN) of the FUSE mount at `dir` in
/// `/proc/self/mountinfo`: the connection's, as
/// `/sys/fs/fuse/connections/MIN` names it.
pub(crate) fn mount_dev(dir: &Path) -> Option<(u32, u32)> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounted(dir, &table)
        .filter(|m| m.fstype.starts_with("fuse"))
        .map(|m| m.dev)
}

/// The topmost mount at `dir` in `table` (`/proc/self/mountinfo`), if
/// any.
pub(crate) fn mounted(dir: &Path, table: &str) -> Option<Mounted> {
    let want = mount_point_path(dir);
    table
        .lines()
        .filter_map(mountinfo_entry)
        .rfind(|m| m.at == want)
}

/// The mount point, device and type of one line of
/// `/proc/self/mountinfo` (`ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS
/// [FIELDS...] - TYPE ...`).
fn mountinfo_entry(line: &str) -> Option<Mounted> {
    let mut fields = line.split(' ');
    let dev = fields.nth(2)?;
    let (major, minor) = dev.split_once(':')?;
    let dev = (major.parse().ok()?, minor.parse().ok()?);
    let mount_point = fields.nth(1)?;
    let mut rest = fields.skip_while(|f| *f != "-").skip(1);
    let fstype = rest.next()?;
    let source = rest.next().unwrap_or_default();
    Some(Mounted {
        at: PathBuf::from(unescape(mount_point)),
        dev,
        fstype: fstype.to_string(),
        source: unescape(source),
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Sets the mount's read-ahead to `kb` KiB. The FUSE INIT reply can only
/// lower the kernel's default (128 KiB), so it is set where the kernel
/// keeps it, `/sys/class/bdi/MAJOR:MINOR/read_ahead_kb`; only root may,
/// and elsewhere what INIT asked for stays.
pub(crate) fn set_read_ahead(dir: &Path, kb: u32) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(dir) else {
        return;
    };
    let dev = meta.dev();
    let path = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    if let Err(e) = std::fs::write(&path, kb.to_string()) {
        tracing::debug!(%path, error = %e, "cannot raise the mount's read-ahead (not root?)");
    }
}

/// Unmounts `dir`: plainly if nothing uses it, else detached. Whether
/// it was a plain unmount.
pub(crate) fn unmount(dir: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(dir.as_os_str()))
    else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated path for the call's duration.
    if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
        return true;
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EBUSY) {
        tracing::warn!(dir = %dir.display(), "the mount is in use: detaching it (its users get errors once the proxy exits)");
        // SAFETY: as above.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
            return false;
        }
    }
    // Not root: fusermount3 unmounts a user's own mount.
    let plain = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success());
    if plain {
        return true;
    }
    let lazy = std::process::Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success());
    if !lazy {
        tracing::error!(dir = %dir.display(), error = %err, "cannot unmount");
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_are_read() {
        let line = "36 35 0:40 / /mnt/a\\040b rw,nosuid shared:1 - fuse.gvfs gvfs:dir rw,user_id=0";
        let m = mountinfo_entry(line).unwrap();
        assert_eq!(m.at, PathBuf::from("/mnt/a b"));
        assert_eq!(m.dev, (0, 40));
        assert_eq!(m.fstype, "fuse.gvfs");
    }

    #[test]
    fn a_mounts_device_is_read_from_mountinfo() {
        let table = "22 1 0:21 / /mnt/vm rw - ext4 /dev/sda rw\n\
                     36 35 0:40 / /mnt/vm rw shared:1 - fuse.gvfs gvfs:dir rw\n\
                     37 35 0:41 / /mnt/other rw - fuse.gvfs gvfs:dir rw\n";
        let dev = |at: &str| mounted(Path::new(at), table).map(|m| m.dev);
        assert_eq!(dev("/mnt/vm"), Some((0, 40)));
        assert_eq!(dev("/mnt/other"), Some((0, 41)));
        assert_eq!(dev("/mnt/none"), None);
        assert_eq!(
            mount_point_path(Path::new("/proc/self/../none")),
            PathBuf::from("/proc/none")
        );
    }

    #[test]
    fn a_missing_a_full_or_a_plain_file_mount_point_is_refused() {
        let dir = tempfile_dir("plain");
        assert!(matches!(
            inspect(&dir.join("nope")),
            Err(FuseError::Missing { .. })
        ));
        std::fs::write(dir.join("f"), b"x").unwrap();
        assert!(matches!(
            inspect(&dir.join("f")),
            Err(FuseError::NotADirectory { .. })
        ));
        assert!(matches!(inspect(&dir), Err(FuseError::NotEmpty { .. })));
        std::fs::create_dir(dir.join("empty")).unwrap();
        assert_eq!(inspect(&dir.join("empty")).unwrap(), Found::Free);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_gvfs_mount_is_found_by_the_table_alone() {
        // The directory does not exist, so any look at it (a stat, a
        // canonicalize of the directory itself) would fail: the answer
        // must come from the table.
        let dir = tempfile_dir("table");
        let at = dir.join("mnt");
        let table = format!(
            "36 35 0:40 / {} rw - tmpfs tmpfs rw\n37 36 0:57 / {} rw - fuse.gvfs gvfs rw\n",
            at.display(),
            at.display()
        );
        assert_eq!(
            inspect_in(&at, &table).unwrap(),
            Found::Gvfs { dev: (0, 57) }
        );
        // As root, the kernel shows the type without its subtype.
        let as_root = format!(
            "37 36 0:59 / {} rw - fuse gvfs:dir:/srv rw,user_id=0\n",
            at.display()
        );
        assert_eq!(
            inspect_in(&at, &as_root).unwrap(),
            Found::Gvfs { dev: (0, 59) }
        );
        let not_ours = format!("37 36 0:60 / {} rw - fuse sshfs rw\n", at.display());
        assert!(matches!(
            inspect_in(&at, &not_ours),
            Err(FuseError::AlreadyMounted { .. })
        ));
        let other = format!("37 36 0:58 / {} rw - fuse.sshfs host: rw\n", at.display());
        assert!(matches!(
            inspect_in(&at, &other),
            Err(FuseError::AlreadyMounted { fstype, .. }) if fstype == "fuse.sshfs"
        ));
        // Another directory's mount is not this one's.
        let elsewhere = format!("37 36 0:57 / {}/x rw - fuse.gvfs gvfs rw\n", at.display());
        assert!(matches!(
            inspect_in(&at, &elsewhere),
            Err(FuseError::Missing { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gvfs-fuse-mp-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
