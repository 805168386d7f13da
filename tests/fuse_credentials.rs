//! Credentials on the FUSE mount (`gvfs-proxy --mount DIR`), per call
//! (uid, gid, supplementary groups) and per open file (uid 1000 vs 1001),
//! on the `dir:` origin and on nfs-ganesha. Calls as another user run in
//! forked children ([`gvfs_testbed::fuse::in_child`]).
//!
//! Skipped (with a message) only when `/dev/fuse` or `fusermount3` is
//! missing; the tests run as root, as the CI does.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use gvfs_testbed::data::{compare_file_with, random_bytes};
use gvfs_testbed::fuse::{
    self, MountPoint, TOOL_TIMEOUT, drop_caches, errno_name, in_child, mounted,
};
use gvfs_testbed::process::run_ok;
use gvfs_testbed::require_fuse;
use gvfs_testbed::{Ganesha, Proxy, ProxyArgs};

/// How long a child process calling the mount as another user may take.
const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

const USER: u32 = 1000;
const STRANGER: u32 = 1001;
/// A supplementary group.
const GROUP: u32 = 2000;
/// A child's own failure codes (above every errno).
const CHILD_SHORT: i32 = 200;
const CHILD_DIFFERS: i32 = 201;
const CHILD_NOT_REFUSED: i32 = 202;

/// In a child: reads the file at `path` whole into `buf` and compares it
/// with `want`. Raw system calls only (see [`in_child`]).
fn child_read(path: &std::ffi::CStr, buf: &mut [u8], want: &[u8]) -> i32 {
    // SAFETY: a valid path; reads into `buf` within its length.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDONLY);
        if fd < 0 {
            return fuse::errno();
        }
        let mut n = 0usize;
        while n < buf.len() {
            let r = libc::read(fd, buf.as_mut_ptr().add(n).cast(), buf.len() - n);
            if r < 0 {
                return fuse::errno();
            }
            if r == 0 {
                break;
            }
            n += r as usize;
        }
        libc::close(fd);
        if n != want.len() {
            return CHILD_SHORT;
        }
        if libc::memcmp(buf.as_ptr().cast(), want.as_ptr().cast(), n) != 0 {
            return CHILD_DIFFERS;
        }
    }
    0
}

/// In a child: creates `path` with `mode` and writes `bytes`.
fn child_create(path: &std::ffi::CStr, mode: libc::mode_t, bytes: &[u8]) -> i32 {
    // SAFETY: a valid path; writes from `bytes` within its length.
    unsafe {
        let fd = libc::open(
            path.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            mode,
        );
        if fd < 0 {
            return fuse::errno();
        }
        let w = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        if w < 0 {
            return fuse::errno();
        }
        if w as usize != bytes.len() {
            return CHILD_SHORT;
        }
        if libc::fsync(fd) != 0 || libc::close(fd) != 0 {
            return fuse::errno();
        }
    }
    0
}

/// In a child running as root: opens `path` read-write as `USER`, then
/// switches its file system ids to `STRANGER` (who cannot open the file,
/// checked), and reads and writes through the descriptor: those calls
/// must carry the opener's credentials, as a kernel NFS client sends them.
fn child_open_then_switch(
    path: &std::ffi::CStr,
    buf: &mut [u8],
    want: &[u8],
    patch: &[u8],
    at: i64,
) -> i32 {
    let e = fuse::access_as(USER, USER);
    if e != 0 {
        return e;
    }
    // SAFETY: a valid path; reads into `buf` and writes from `patch`
    // within their lengths.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDWR);
        if fd < 0 {
            return fuse::errno();
        }
        let e = fuse::access_as(STRANGER, STRANGER);
        if e != 0 {
            return e;
        }
        let other = libc::open(path.as_ptr(), libc::O_RDONLY);
        if other >= 0 {
            return CHILD_NOT_REFUSED;
        }
        // The page cache would answer the read without asking: empty it.
        libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED);
        let n = want.len().min(buf.len());
        let r = libc::pread(fd, buf.as_mut_ptr().cast(), n, 0);
        if r < 0 {
            return fuse::errno();
        }
        if r as usize != n {
            return CHILD_SHORT;
        }
        if libc::memcmp(buf.as_ptr().cast(), want.as_ptr().cast(), n) != 0 {
            return CHILD_DIFFERS;
        }
        let w = libc::pwrite(fd, patch.as_ptr().cast(), patch.len(), at);
        if w < 0 {
            return fuse::errno();
        }
        if w as usize != patch.len() {
            return CHILD_SHORT;
        }
        if libc::fsync(fd) != 0 || libc::close(fd) != 0 {
            return fuse::errno();
        }
    }
    0
}

/// Reads `path` in a child running as `uid`/`gid` with `groups` (see
/// [`child_read`]): 0, or the errno that stopped it.
fn read_as(
    uid: u32,
    gid: u32,
    groups: &[u32],
    path: &std::ffi::CStr,
    buf: &mut [u8],
    want: &[u8],
) -> Result<i32> {
    in_child(CHILD_TIMEOUT, || {
        let e = fuse::become_user_in(uid, gid, groups);
        if e != 0 {
            return e;
        }
        child_read(path, buf, want)
    })
}

fn child_outcome(code: i32) -> String {
    match code {
        0 => "success".into(),
        CHILD_SHORT => "a short read or write".into(),
        CHILD_DIFFERS => "other bytes than written".into(),
        CHILD_NOT_REFUSED => "the stranger could open the file".into(),
        e => errno_name(Some(e)),
    }
}

/// uid 1000 creates a 0600 file in its directory through the mount (the
/// origin shows it as the owner); uid 1000 reads it, uid 1001 gets EACCES;
/// uid 1001 reads a 0640 file of group 2000 only with 2000 among its
/// supplementary groups; a descriptor uid 1000 opened keeps reading and
/// writing after its process switches to uid 1001.
fn credentials(p: &Proxy, mnt: &MountPoint, origin: &Path) -> Result<()> {
    let home = mnt.path().join("home");
    fs::create_dir(&home)?;
    std::os::unix::fs::chown(&home, Some(USER), Some(USER))?;
    fs::set_permissions(&home, fs::Permissions::from_mode(0o755))?;
    let file = home.join("mine");
    let c = fuse::cstring(&file)?;
    let bytes = random_bytes(61, 200_000);
    let code = in_child(CHILD_TIMEOUT, || {
        let e = fuse::become_user(USER, USER);
        if e != 0 {
            return e;
        }
        child_create(&c, 0o600, &bytes)
    })?;
    ensure!(
        code == 0,
        "uid {USER} creating {} through the mount: {}; proxy output:\n{}",
        file.display(),
        child_outcome(code),
        p.output()
    );
    for (root, label) in [(mnt.path(), "through the mount"), (origin, "at the origin")] {
        let m = fs::metadata(root.join("home/mine"))?;
        ensure!(
            (m.uid(), m.gid(), m.mode() & 0o7777, m.len())
                == (USER, USER, 0o600, bytes.len() as u64),
            "{label}: home/mine is uid {} gid {} mode {:o} size {}, expected {USER} {USER} 600 {}",
            m.uid(),
            m.gid(),
            m.mode() & 0o7777,
            m.len(),
            bytes.len()
        );
    }
    compare_file_with(&bytes, &origin.join("home/mine"))?;
    drop_caches();
    let mut buf = vec![0u8; bytes.len() + 1];
    let code = read_as(USER, USER, &[], &c, &mut buf, &bytes)?;
    ensure!(
        code == 0,
        "uid {USER} reading its file: {}",
        child_outcome(code)
    );
    let code = read_as(STRANGER, STRANGER, &[], &c, &mut buf, &bytes)?;
    ensure!(
        code == libc::EACCES,
        "uid {STRANGER} reading uid {USER}'s 0600 file: {}, expected EACCES",
        child_outcome(code)
    );
    // The same with setpriv, as a user would run it.
    if fuse::which("setpriv").is_some() {
        let out = run_ok(
            Command::new("setpriv")
                .args([
                    "--reuid",
                    "1000",
                    "--regid",
                    "1000",
                    "--clear-groups",
                    "cat",
                ])
                .arg(&file),
            TOOL_TIMEOUT,
        )?;
        ensure!(
            out.stdout == bytes,
            "setpriv cat as uid 1000 read other bytes"
        );
    }
    // Supplementary groups travel too: a group-readable file of group
    // 2000 reads for uid 1001 in that group, not for uid 1001 without it.
    let shared = home.join("shared");
    let cs = fuse::cstring(&shared)?;
    let group_bytes = random_bytes(63, 5000);
    fs::write(&shared, &group_bytes)?;
    std::os::unix::fs::chown(&shared, Some(0), Some(GROUP))?;
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o640))?;
    drop_caches();
    let mut small = vec![0u8; group_bytes.len() + 1];
    let code = read_as(STRANGER, STRANGER, &[GROUP], &cs, &mut small, &group_bytes)?;
    ensure!(
        code == 0,
        "uid {STRANGER} in group {GROUP} reading a 0640 file of group {GROUP}: {}",
        child_outcome(code)
    );
    let code = read_as(STRANGER, STRANGER, &[], &cs, &mut small, &group_bytes)?;
    ensure!(
        code == libc::EACCES,
        "uid {STRANGER} outside group {GROUP} reading a 0640 file of group {GROUP}: {}, \
         expected EACCES",
        child_outcome(code)
    );

    let patch = random_bytes(62, 4321);
    let at = 77_777;
    let code = in_child(CHILD_TIMEOUT, || {
        child_open_then_switch(&c, &mut buf, &bytes, &patch, at)
    })?;
    ensure!(
        code == 0,
        "reading and writing as uid {STRANGER} through a descriptor uid {USER} opened: {}; proxy output:\n{}",
        child_outcome(code),
        p.output()
    );
    let mut want = bytes.clone();
    want[at as usize..at as usize + patch.len()].copy_from_slice(&patch);
    compare_file_with(&want, &origin.join("home/mine"))
        .context("the write through uid 1000's descriptor at the origin")?;
    Ok(())
}

#[test]
fn credentials_travel_per_call_on_the_dir_origin() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    fs::set_permissions(origin.path(), fs::Permissions::from_mode(0o755))?;
    let mnt = MountPoint::new()?;
    let p = mounted(ProxyArgs::dir(origin.path()), &mnt)?;
    credentials(&p, &mnt, origin.path())
}

#[test]
fn credentials_travel_per_call_to_ganesha() -> Result<()> {
    require_fuse!();
    let g = Ganesha::start()?;
    fs::set_permissions(g.export_dir(), fs::Permissions::from_mode(0o755))?;
    let mnt = MountPoint::new()?;
    let p = mounted(ProxyArgs::new(g.upstream_url()), &mnt)?;
    credentials(&p, &mnt, g.export_dir())
}
