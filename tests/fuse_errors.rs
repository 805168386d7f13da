//! Bad input and errors on the FUSE mount (`gvfs-proxy --mount DIR`):
//! too long names, names with every byte, writes past the largest file
//! size, a full origin, failing calls (each must give the errno of a local
//! directory), a file removed behind the mount (ESTALE). After each the
//! proxy must still serve.
//!
//! Skipped (with a message) only when `/dev/fuse` or `fusermount3` is
//! missing; the tests run as root, as the CI does.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::FileExt;
use std::path::Path;

use anyhow::{Context, Result, ensure};
use gvfs_testbed::data::{MIB, compare_file_with, random_bytes};
use gvfs_testbed::fuse::{self, MountPoint, drop_caches, errno_name, errno_of, mounted};
use gvfs_testbed::require_fuse;
use gvfs_testbed::tmpfs::Tmpfs;
use gvfs_testbed::tree::{Model, check_tree};
use gvfs_testbed::{Proxy, ProxyArgs};

/// Fails unless the proxy still answers `gvfsctl status` and the mount
/// still writes and reads a file.
fn still_serves(p: &Proxy, mnt: &MountPoint, name: &str) -> Result<()> {
    p.status()
        .with_context(|| format!("gvfsctl status after {name}; output:\n{}", p.output()))?;
    let path = mnt.path().join(format!("alive-after-{name}"));
    let bytes = random_bytes(77, 100_000);
    fs::write(&path, &bytes).with_context(|| {
        format!(
            "writing through the mount after {name}; output:\n{}",
            p.output()
        )
    })?;
    drop_caches();
    compare_file_with(&bytes, &path)?;
    fs::remove_file(&path)?;
    Ok(())
}

#[test]
fn names_of_255_bytes_work_and_256_are_too_long() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    let p = mounted(ProxyArgs::dir(origin.path()), &mnt)?;
    let ok = "n".repeat(255);
    fs::write(mnt.path().join(&ok), b"longest name\n")?;
    ensure!(fs::read(mnt.path().join(&ok))? == b"longest name\n");
    ensure!(fs::read(origin.path().join(&ok))? == b"longest name\n");
    fs::create_dir(mnt.path().join(format!("d{}", "n".repeat(254))))?;
    let long = "n".repeat(256);
    let cases: [(&str, std::io::Result<()>); 4] = [
        ("create", File::create(mnt.path().join(&long)).map(drop)),
        ("stat", fs::metadata(mnt.path().join(&long)).map(drop)),
        ("mkdir", fs::create_dir(mnt.path().join(&long))),
        (
            "rename to",
            fs::rename(mnt.path().join(&ok), mnt.path().join(&long)),
        ),
    ];
    for (what, r) in cases {
        ensure!(
            errno_of(&r) == Some(libc::ENAMETOOLONG),
            "{what} of a 256-byte name: {}, expected ENAMETOOLONG",
            errno_name(errno_of(&r))
        );
    }
    ensure!(
        !origin.path().join(&long).exists() && mnt.path().join(&ok).exists(),
        "a failed call changed the origin"
    );
    still_serves(&p, &mnt, "long-names")
}

#[test]
fn names_with_every_byte_round_trip() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    let p = mounted(ProxyArgs::dir(origin.path()), &mnt)?;
    let every: Vec<u8> = (1..=255u8).filter(|&b| b != b'/').collect();
    let mut names: Vec<Vec<u8>> = every.chunks(64).map(<[u8]>::to_vec).collect();
    names.push(every.clone());
    // Each byte alone too, but "." (and the control bytes alone read
    // badly in a message, not in a test): all but '.'.
    names.extend(every.iter().filter(|&&b| b != b'.').map(|&b| vec![b'x', b]));
    fs::create_dir(mnt.path().join("names"))?;
    let content = |name: &[u8]| -> Vec<u8> { name.iter().rev().copied().collect() };
    for name in &names {
        let path = mnt
            .path()
            .join("names")
            .join(OsString::from_vec(name.clone()));
        fs::write(&path, content(name))
            .with_context(|| format!("creating a file named {name:?}"))?;
    }
    drop_caches();
    let want: BTreeSet<Vec<u8>> = names.iter().cloned().collect();
    for (root, label) in [
        (mnt.path(), "through the mount"),
        (origin.path(), "at the origin"),
    ] {
        let dir = root.join("names");
        let listed: Vec<Vec<u8>> = fs::read_dir(&dir)?
            .map(|e| e.map(|e| e.file_name().into_vec()))
            .collect::<std::io::Result<_>>()?;
        let set: BTreeSet<Vec<u8>> = listed.iter().cloned().collect();
        ensure!(
            listed.len() == set.len() && set == want,
            "{label}: readdir lists {} names ({} distinct), expected {}; missing {:?}, unexpected {:?}",
            listed.len(),
            set.len(),
            want.len(),
            want.difference(&set).collect::<Vec<_>>(),
            set.difference(&want).collect::<Vec<_>>()
        );
        for name in &names {
            let path = dir.join(OsString::from_vec(name.clone()));
            let got = fs::read(&path).with_context(|| format!("{label}: reading {name:?}"))?;
            ensure!(got == content(name), "{label}: {name:?} holds {got:?}");
        }
    }
    still_serves(&p, &mnt, "odd-names")
}

/// What the error cases start from: `file`, `dir/inner`, `dir2/z`.
fn error_fixture(root: &Path) -> Result<()> {
    fs::write(root.join("file"), b"x")?;
    fs::create_dir(root.join("dir"))?;
    fs::write(root.join("dir/inner"), b"y")?;
    fs::create_dir(root.join("dir2"))?;
    fs::write(root.join("dir2/z"), b"z")?;
    Ok(())
}

type Op = fn(&Path) -> std::io::Result<()>;

/// Calls that fail, each on the fixture of [`error_fixture`].
const FAILING: [(&str, Op); 14] = [
    ("open a missing file", |r| {
        File::open(r.join("missing")).map(drop)
    }),
    ("O_CREAT|O_EXCL over a file", |r| {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(r.join("file"))
            .map(drop)
    }),
    ("mkdir over a directory", |r| fs::create_dir(r.join("dir"))),
    ("mkdir in a missing directory", |r| {
        fs::create_dir(r.join("missing/d"))
    }),
    ("rmdir of a non-empty directory", |r| {
        fs::remove_dir(r.join("dir"))
    }),
    ("rmdir of a file", |r| fs::remove_dir(r.join("file"))),
    ("unlink of a directory", |r| fs::remove_file(r.join("dir"))),
    ("a file as a directory", |r| {
        fs::metadata(r.join("file/x")).map(drop)
    }),
    ("rename a missing file", |r| {
        fs::rename(r.join("missing"), r.join("other"))
    }),
    ("rename a directory into itself", |r| {
        fs::rename(r.join("dir"), r.join("dir/sub"))
    }),
    ("rename a directory over a non-empty one", |r| {
        fs::rename(r.join("dir2"), r.join("dir"))
    }),
    ("hard link to a directory", |r| {
        fs::hard_link(r.join("dir"), r.join("dirlink"))
    }),
    ("symlink over a file", |r| {
        std::os::unix::fs::symlink("target", r.join("file"))
    }),
    ("readlink of a file", |r| {
        fs::read_link(r.join("file")).map(drop)
    }),
];

/// Every failing call gives the errno it gives on a local directory (the
/// origin's file system), and changes nothing.
#[test]
fn errors_are_those_of_a_local_file_system() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    let local = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    let p = mounted(ProxyArgs::dir(origin.path()), &mnt)?;
    error_fixture(local.path())?;
    error_fixture(mnt.path())?;
    let mut diffs = Vec::new();
    for (what, op) in FAILING {
        let want = errno_of(&op(local.path()));
        ensure!(want.is_some(), "{what} succeeded on a local directory");
        let got = errno_of(&op(mnt.path()));
        if got != want {
            diffs.push(format!(
                "{what}: {} through the mount, {} on a local directory",
                errno_name(got),
                errno_name(want)
            ));
        }
    }
    ensure!(diffs.is_empty(), "{}", diffs.join("\n"));
    let mut model = Model::default();
    let (f, d) = (0o666 & !fuse::umask()?, 0o777 & !fuse::umask()?);
    model.file("file", b"x".to_vec(), f);
    model.dir("dir", d);
    model.file("dir/inner", b"y".to_vec(), f);
    model.dir("dir2", d);
    model.file("dir2/z", b"z".to_vec(), f);
    check_tree(
        origin.path(),
        &model,
        "at the origin after the failed calls",
    )?;
    still_serves(&p, &mnt, "errors")
}

/// A file removed at the origin behind the proxy's back: a descriptor
/// open on it through the mount reads ESTALE, as on a kernel NFS mount.
#[test]
fn a_file_removed_behind_the_mount_is_stale() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    let p = mounted(ProxyArgs::dir(origin.path()), &mnt)?;
    fs::write(mnt.path().join("doomed"), b"soon gone\n")?;
    let f = File::open(mnt.path().join("doomed"))?;
    fs::remove_file(origin.path().join("doomed"))?;
    // Past the page cache: the read must reach the file system.
    // SAFETY: advice on an open descriptor.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let mut buf = [0u8; 32];
    let got = errno_of(&f.read_at(&mut buf, 0));
    ensure!(
        got == Some(libc::ESTALE),
        "pread of a file removed at the origin: {}, expected ESTALE",
        errno_name(got)
    );
    drop(f);
    still_serves(&p, &mnt, "stale")
}

/// The outcome of `pwrite(fd, "x", 1, offset)` on `f`: `None` if it
/// wrote, else the errno.
fn pwrite_outcome(f: &File, offset: u64) -> Option<i32> {
    errno_of(&f.write_at(b"x", offset))
}

#[test]
fn writes_past_the_largest_file_size_fail_as_on_a_local_file_system() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    let p = mounted(ProxyArgs::dir(origin.path()), &mnt)?;
    // The reference: a file on the origin's own file system.
    let reference = tempfile::tempfile_in(origin.path().parent().unwrap_or(origin.path()))?;
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(mnt.path().join("huge"))?;
    let offsets = [(1u64 << 44) + 5, 1 << 62, i64::MAX as u64 - 10];
    let mut diffs = Vec::new();
    for off in offsets {
        let local = pwrite_outcome(&reference, off);
        let got = pwrite_outcome(&f, off);
        let synced = errno_of(&f.sync_all());
        eprintln!(
            "pwrite at {off}: local file system {}, mount {}, then fsync {}",
            errno_name(local),
            errno_name(got),
            errno_name(synced)
        );
        if got != local {
            diffs.push(format!(
                "pwrite(fd, \"x\", 1, {off}): {} through the mount, {} on the origin's file system",
                errno_name(got),
                errno_name(local)
            ));
        }
        if local.is_some() && synced.is_some() {
            diffs.push(format!(
                "fsync after the refused pwrite at {off}: {}",
                errno_name(synced)
            ));
        }
        if local.is_some() {
            let len = fs::metadata(mnt.path().join("huge"))?.len();
            let at_origin = fs::metadata(origin.path().join("huge"))?.len();
            if len != 0 || at_origin != 0 {
                diffs.push(format!(
                    "after the refused pwrite at {off} the file has {len} bytes through \
                     the mount and {at_origin} at the origin"
                ));
            }
        }
        // Whatever happened, the file is emptied for the next offset.
        f.set_len(0)?;
        reference.set_len(0)?;
    }
    drop(f);
    ensure!(
        diffs.is_empty(),
        "{}\nproxy output:\n{}",
        diffs.join("\n"),
        p.output()
    );
    still_serves(&p, &mnt, "huge-offsets")
}

#[test]
fn a_full_origin_gives_enospc() -> Result<()> {
    require_fuse!();
    let disk = Tmpfs::mount("8m")?;
    let mnt = MountPoint::new()?;
    let p = mounted(ProxyArgs::dir(disk.path()), &mnt)?;
    fs::write(mnt.path().join("before"), b"room left\n")?;
    disk.fill()?;
    let mut f = File::create(mnt.path().join("overflow"))?;
    let chunk = vec![0x5a; MIB];
    let mut result = Ok(());
    for _ in 0..4 {
        result = f.write_all(&chunk);
        if result.is_err() {
            break;
        }
    }
    if result.is_ok() {
        result = f.sync_all();
    }
    drop(f);
    ensure!(
        errno_of(&result) == Some(libc::ENOSPC),
        "writing 4 MiB to a full origin: {}, expected ENOSPC; proxy output:\n{}",
        errno_name(errno_of(&result)),
        p.output()
    );
    fs::remove_file(mnt.path().join("overflow"))?;
    disk.unfill()?;
    ensure!(fs::read(mnt.path().join("before"))? == b"room left\n");
    still_serves(&p, &mnt, "enospc")
}
