//! Is a directory fit to mount on: there, a directory, empty, and not a
//! mount left behind by a proxy that was killed.

use std::path::{Path, PathBuf};

use crate::error::FuseError;

/// Checks `dir` before mounting on it.
pub(crate) fn check(dir: &Path) -> Result<(), FuseError> {
    let path = dir.to_path_buf();
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
    if let Some(fstype) = mounted_fstype(dir) {
        return Err(FuseError::AlreadyMounted { path, fstype });
    }
    let mut entries = std::fs::read_dir(dir).map_err(|cause| FuseError::MountPoint {
        path: path.clone(),
        cause,
    })?;
    if entries.next().is_some() {
        return Err(FuseError::NotEmpty { path });
    }
    Ok(())
}

/// The type of the FUSE file system mounted at `dir`, if one is.
pub(crate) fn mounted_fstype(dir: &Path) -> Option<String> {
    let want = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    table.lines().find_map(|line| {
        let (mount_point, fstype) = mountinfo_entry(line)?;
        (mount_point == want && fstype.starts_with("fuse")).then_some(fstype)
    })
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
        _ => std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf()),
    }
}

/// The device (MAJ:MIN) of the FUSE mount at `dir` in
/// `/proc/self/mountinfo`: the connection's, as
/// `/sys/fs/fuse/connections/MIN` names it.
pub(crate) fn mount_dev(dir: &Path) -> Option<(u32, u32)> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    dev_in(&table, &mount_point_path(dir))
}

/// The device of the last (topmost) FUSE mount at `want` in `table`.
fn dev_in(table: &str, want: &Path) -> Option<(u32, u32)> {
    table.lines().rev().find_map(|line| {
        let (mount_point, fstype) = mountinfo_entry(line)?;
        if mount_point != want || !fstype.starts_with("fuse") {
            return None;
        }
        let (maj, min) = line.split(' ').nth(2)?.split_once(':')?;
        Some((maj.parse().ok()?, min.parse().ok()?))
    })
}

/// The mount point and type of one line of `/proc/self/mountinfo`
/// (`ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [FIELDS...] - TYPE ...`).
fn mountinfo_entry(line: &str) -> Option<(PathBuf, String)> {
    let mut fields = line.split(' ');
    let mount_point = fields.nth(4)?;
    let fstype = fields.skip_while(|f| *f != "-").nth(1)?;
    Some((PathBuf::from(unescape(mount_point)), fstype.to_string()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_are_read() {
        let line = "36 35 0:40 / /mnt/a\\040b rw,nosuid shared:1 - fuse.gvfs gvfs:dir rw,user_id=0";
        let (at, fstype) = mountinfo_entry(line).unwrap();
        assert_eq!(at, PathBuf::from("/mnt/a b"));
        assert_eq!(fstype, "fuse.gvfs");
    }

    #[test]
    fn a_mounts_device_is_read_from_mountinfo() {
        let table = "22 1 0:21 / /mnt/vm rw - ext4 /dev/sda rw\n\
                     36 35 0:40 / /mnt/vm rw shared:1 - fuse.gvfs gvfs:dir rw\n\
                     37 35 0:41 / /mnt/other rw - fuse.gvfs gvfs:dir rw\n";
        assert_eq!(dev_in(table, Path::new("/mnt/vm")), Some((0, 40)));
        assert_eq!(dev_in(table, Path::new("/mnt/other")), Some((0, 41)));
        assert_eq!(dev_in(table, Path::new("/mnt/none")), None);
        assert_eq!(
            mount_point_path(Path::new("/proc/self/../none")),
            PathBuf::from("/proc/none")
        );
    }

    #[test]
    fn a_missing_a_full_or_a_plain_file_mount_point_is_refused() {
        let dir = tempfile_dir();
        assert!(matches!(
            check(&dir.join("nope")),
            Err(FuseError::Missing { .. })
        ));
        std::fs::write(dir.join("f"), b"x").unwrap();
        assert!(matches!(
            check(&dir.join("f")),
            Err(FuseError::NotADirectory { .. })
        ));
        assert!(matches!(check(&dir), Err(FuseError::NotEmpty { .. })));
        std::fs::create_dir(dir.join("empty")).unwrap();
        assert!(check(&dir.join("empty")).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("gvfs-fuse-mp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
