//! The FUSE front end (`gvfs-proxy --mount DIR`) under the workload the
//! Linux kernel NFS client passes (`src/kernel/init.sh`, plus mmap, statfs
//! and utimes): the proxy's export mounted as a local file system through
//! the kernel's FUSE client, next to its NFS listener, with the same layer
//! stack.
//!
//! Everything on the mount is done with plain system calls (std::fs,
//! std::os::unix, libc) and real programs (`dd`), which is the kernel FUSE
//! client's path; the end state is then checked by reading the origin
//! directly (the `dir:` directory, or nfs-ganesha's export directory),
//! after `gvfsctl writeback --wait` for a write-back cache. The workload
//! runs against `dir:`, nfs-ganesha, `dir:` with a block cache, and a
//! chain (cache proxy -> proxy -> ganesha); the same files are read and
//! written through the proxy's NFS listener too (`nfs-cat`, `nfs-cp`).
//!
//! Skipped (with a message) only when `/dev/fuse` or `fusermount3` is
//! missing; the tests run as root, as the CI does.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use gvfs_testbed::data::{MIB, compare_bytes, compare_file_with, random_bytes};
use gvfs_testbed::fuse::{
    self, Mapping, MountPoint, TOOL_TIMEOUT, drop_caches, errno_name, errno_of, mounted,
};
use gvfs_testbed::libnfs::{nfs_cat, nfs_cp};
use gvfs_testbed::process::run_ok;
use gvfs_testbed::require_fuse;
use gvfs_testbed::tree::{Model, Want, check_tree};
use gvfs_testbed::{Ganesha, Proxy, ProxyArgs};

/// How long the file system may take to drop a file removed while open
/// after its last close (FUSE sends RELEASE after close(2) returns).
const RELEASE_WAIT: Duration = Duration::from_secs(10);

/// `dd if=SRC of=DST OPERANDS... status=none`.
fn dd(src: &Path, dst: &Path, operands: &[&str]) -> Result<()> {
    run_ok(
        Command::new("dd")
            .arg(format!("if={}", src.display()))
            .arg(format!("of={}", dst.display()))
            .args(operands)
            .arg("status=none"),
        TOOL_TIMEOUT,
    )?;
    Ok(())
}

const BIG: usize = 6 * MIB;
const ODD: usize = 1_337_000;
const PATCH: usize = 70_000;
/// Where the sparse file's only data start.
const SPARSE_AT: u64 = 16 * MIB as u64 + 5;
/// The mtime the workload sets.
const STAMP: i64 = 1_000_000_000;
/// Entries of the big directory.
const MANY: usize = 300;
/// The memory-mapped file's size (not a multiple of the page size).
const MAPPED: usize = 200_003;

/// Runs the workload on the mount at `mnt`; returns what it should have
/// left there.
struct Workload<'a> {
    mnt: &'a Path,
    local: tempfile::TempDir,
    model: Model,
    file_mode: u32,
    dir_mode: u32,
}

impl<'a> Workload<'a> {
    fn new(mnt: &'a Path) -> Result<Self> {
        let umask = fuse::umask()?;
        Ok(Self {
            mnt,
            local: tempfile::tempdir()?,
            model: Model::default(),
            file_mode: 0o666 & !umask,
            dir_mode: 0o777 & !umask,
        })
    }

    fn at(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    fn local(&self, name: &str, bytes: &[u8]) -> Result<PathBuf> {
        let p = self.local.path().join(name);
        fs::write(&p, bytes)?;
        Ok(p)
    }

    /// Every step, each failure naming its step.
    fn run(mut self) -> Result<Model> {
        type Step<'a> = fn(&mut Workload<'a>) -> Result<()>;
        let steps: [(&str, Step<'a>); 18] = [
            ("create", Self::create),
            ("write with dd", Self::write_dd),
            ("write with std::fs", Self::write_std),
            ("overwrite and append", Self::patch),
            ("read back after dropping caches", Self::read_back),
            ("rename", Self::rename),
            ("hard link", Self::hard_link),
            ("symbolic link", Self::symlink),
            ("truncate down and up", Self::truncate),
            ("sparse file", Self::sparse),
            ("chmod", Self::chmod),
            ("utimes", Self::utimes),
            ("remove while open", Self::remove_while_open),
            ("300-entry directory", Self::many),
            ("statfs", Self::statfs),
            ("mmap", Self::mmap),
            ("remove", Self::remove),
            ("verify after dropping caches", Self::verify),
        ];
        for (name, step) in steps {
            step(&mut self).with_context(|| format!("workload step `{name}`"))?;
        }
        Ok(self.model)
    }

    fn create(&mut self) -> Result<()> {
        fs::write(self.at("hello.txt"), b"hello\n")?;
        fs::create_dir(self.at("dir"))?;
        fs::write(self.at("dir/inner"), b"inner\n")?;
        File::create(self.at("empty"))?;
        let (f, d) = (self.file_mode, self.dir_mode);
        self.model.file("hello.txt", b"hello\n".to_vec(), f);
        self.model.dir("dir", d);
        self.model.file("dir/inner", b"inner\n".to_vec(), f);
        self.model.file("empty", Vec::new(), f);
        ensure!(fs::read(self.at("hello.txt"))? == b"hello\n");
        let m = fs::metadata(self.at("dir"))?;
        ensure!(m.is_dir(), "dir is not a directory: {:?}", m.file_type());
        ensure!(
            m.mode() & 0o7777 == d,
            "dir has mode {:o}, expected {d:o}",
            m.mode() & 0o7777
        );
        let m = fs::metadata(self.at("empty"))?;
        ensure!(m.len() == 0 && m.is_file(), "empty: {m:?}");
        ensure!(
            m.mode() & 0o7777 == f,
            "a new file has mode {:o}, expected {f:o}",
            m.mode() & 0o7777
        );
        Ok(())
    }

    fn write_dd(&mut self) -> Result<()> {
        let big = random_bytes(1, BIG);
        let odd = random_bytes(2, ODD);
        let (sb, so) = (self.local("big", &big)?, self.local("odd", &odd)?);
        dd(&sb, &self.at("big"), &["bs=1M"])?;
        dd(&so, &self.at("odd"), &["bs=4096"])?;
        ensure!(fs::metadata(self.at("big"))?.len() == BIG as u64);
        ensure!(fs::metadata(self.at("odd"))?.len() == ODD as u64);
        let f = self.file_mode;
        self.model.file("big", big, f);
        self.model.file("odd", odd, f);
        Ok(())
    }

    /// Odd-sized writes through one descriptor, then `sync_all`.
    fn write_std(&mut self) -> Result<()> {
        let want = random_bytes(4, 5 * 100_001 + 17);
        let mut f = File::create(self.at("written"))?;
        for chunk in want.chunks(100_001) {
            f.write_all(chunk)?;
        }
        f.sync_all()?;
        drop(f);
        compare_file_with(&want, &self.at("written"))?;
        let m = self.file_mode;
        self.model.file("written", want, m);
        Ok(())
    }

    /// 70,000 bytes across the first 1 MiB boundary of big (dd
    /// conv=notrunc), 5,000 at an odd offset of odd (pwrite), 3,000
    /// appended to odd (O_APPEND).
    fn patch(&mut self) -> Result<()> {
        let patch = random_bytes(3, PATCH);
        let sp = self.local("patch", &patch)?;
        dd(
            &sp,
            &self.at("big"),
            &["bs=1000", "seek=1000", "count=70", "conv=notrunc"],
        )?;
        self.model.bytes("big")?[1_000_000..1_070_000].copy_from_slice(&patch);
        let f = OpenOptions::new().write(true).open(self.at("odd"))?;
        f.write_all_at(&patch[..5000], 123_457)?;
        drop(f);
        self.model.bytes("odd")?[123_457..128_457].copy_from_slice(&patch[..5000]);
        let mut f = OpenOptions::new().append(true).open(self.at("odd"))?;
        f.write_all(&patch[..3000])?;
        drop(f);
        self.model.bytes("odd")?.extend_from_slice(&patch[..3000]);
        ensure!(fs::metadata(self.at("odd"))?.len() == (ODD + 3000) as u64);
        Ok(())
    }

    fn read_back(&mut self) -> Result<()> {
        drop_caches();
        for name in ["big", "odd", "written", "hello.txt", "dir/inner"] {
            let want = self.model.bytes(name)?.clone();
            compare_file_with(&want, &self.at(name))?;
        }
        Ok(())
    }

    /// A file, a file over another one, a directory into another.
    fn rename(&mut self) -> Result<()> {
        fs::rename(self.at("hello.txt"), self.at("renamed.txt"))?;
        ensure!(!self.at("hello.txt").exists(), "hello.txt still there");
        ensure!(fs::read(self.at("renamed.txt"))? == b"hello\n");
        self.model.rename("hello.txt", "renamed.txt");

        fs::write(self.at("r1"), b"one\n")?;
        fs::write(self.at("r2"), b"two\n")?;
        fs::rename(self.at("r1"), self.at("r2"))?;
        ensure!(!self.at("r1").exists(), "r1 still there");
        ensure!(fs::read(self.at("r2"))? == b"one\n", "r2 not replaced");
        let f = self.file_mode;
        self.model.file("r2", b"one\n".to_vec(), f);

        fs::create_dir(self.at("sub"))?;
        fs::write(self.at("sub/deep"), b"deep\n")?;
        fs::rename(self.at("sub"), self.at("dir/sub"))?;
        ensure!(!self.at("sub").exists(), "sub still there");
        ensure!(fs::read(self.at("dir/sub/deep"))? == b"deep\n");
        let d = self.dir_mode;
        self.model.dir("dir/sub", d);
        self.model.file("dir/sub/deep", b"deep\n".to_vec(), f);
        Ok(())
    }

    fn hard_link(&mut self) -> Result<()> {
        fs::hard_link(self.at("big"), self.at("big.link"))?;
        let (a, b) = (
            fs::metadata(self.at("big"))?,
            fs::metadata(self.at("big.link"))?,
        );
        ensure!(a.nlink() == 2, "big has {} links after ln", a.nlink());
        let size = self.model.bytes("big")?.len() as u64;
        ensure!(
            (a.len(), b.len()) == (size, size),
            "after ln big has {} bytes and big.link {}, expected {size}",
            a.len(),
            b.len()
        );
        ensure!(
            a.ino() == b.ino(),
            "big and big.link have inodes {} and {}",
            a.ino(),
            b.ino()
        );
        let big = self.model.bytes("big")?.clone();
        compare_file_with(&big, &self.at("big.link"))?;
        self.model.set_nlink("big", 2)?;
        let f = self.file_mode;
        self.model.entries.insert(
            "big.link".into(),
            Want::File {
                bytes: big,
                mode: f,
                nlink: 2,
            },
        );
        self.model
            .same_inode
            .push(("big".into(), "big.link".into()));

        fs::hard_link(self.at("odd"), self.at("odd.link"))?;
        ensure!(fs::metadata(self.at("odd"))?.nlink() == 2);
        fs::remove_file(self.at("odd.link"))?;
        let n = fs::metadata(self.at("odd"))?.nlink();
        ensure!(n == 1, "odd has {n} links after removing its second");
        Ok(())
    }

    fn symlink(&mut self) -> Result<()> {
        std::os::unix::fs::symlink("big", self.at("big.sym"))?;
        ensure!(fs::read_link(self.at("big.sym"))? == Path::new("big"));
        ensure!(
            fs::symlink_metadata(self.at("big.sym"))?
                .file_type()
                .is_symlink()
        );
        let big = self.model.bytes("big")?.clone();
        compare_file_with(&big, &self.at("big.sym"))?;
        self.model.entries.insert(
            "big.sym".into(),
            Want::Symlink {
                target: "big".into(),
            },
        );
        Ok(())
    }

    /// A copy of big cut to 2,500,000 bytes, then extended to 3,000,000:
    /// the end reads as zeros, not as the bytes cut off.
    fn truncate(&mut self) -> Result<()> {
        let mut want = self.model.bytes("big")?.clone();
        fs::write(self.at("trunc"), &want)?;
        let f = OpenOptions::new().write(true).open(self.at("trunc"))?;
        f.set_len(2_500_000)?;
        ensure!(f.metadata()?.len() == 2_500_000);
        f.set_len(3_000_000)?;
        drop(f);
        want.truncate(2_500_000);
        want.resize(3_000_000, 0);
        ensure!(fs::metadata(self.at("trunc"))?.len() == 3_000_000);
        compare_file_with(&want, &self.at("trunc"))?;
        let m = self.file_mode;
        self.model.file("trunc", want, m);
        Ok(())
    }

    fn sparse(&mut self) -> Result<()> {
        let patch = random_bytes(3, PATCH);
        let f = File::create(self.at("sparse"))?;
        f.write_all_at(&patch, SPARSE_AT)?;
        drop(f);
        let mut want = vec![0u8; SPARSE_AT as usize];
        want.extend_from_slice(&patch);
        ensure!(fs::metadata(self.at("sparse"))?.len() == want.len() as u64);
        compare_file_with(&want, &self.at("sparse"))?;
        let m = self.file_mode;
        self.model.file("sparse", want, m);
        Ok(())
    }

    fn chmod(&mut self) -> Result<()> {
        fs::set_permissions(self.at("renamed.txt"), fs::Permissions::from_mode(0o640))?;
        let m = fs::metadata(self.at("renamed.txt"))?.mode() & 0o7777;
        ensure!(m == 0o640, "mode {m:o} after chmod 640");
        self.model.set_mode("renamed.txt", 0o640)?;
        fs::set_permissions(self.at("dir"), fs::Permissions::from_mode(0o750))?;
        self.model.set_mode("dir", 0o750)?;
        Ok(())
    }

    /// Sets a written file's mtime (utimensat by path, as `touch -d`).
    fn utimes(&mut self) -> Result<()> {
        let bytes = random_bytes(5, 12_345);
        let mut f = File::create(self.at("stamped"))?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        drop(f);
        let c = fuse::cstring(&self.at("stamped"))?;
        let times = [
            libc::timespec {
                tv_sec: STAMP - 1000,
                tv_nsec: 0,
            },
            libc::timespec {
                tv_sec: STAMP,
                tv_nsec: 0,
            },
        ];
        // SAFETY: a valid path and an array of two timespecs.
        let rc = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) };
        ensure!(rc == 0, "utimensat: {}", std::io::Error::last_os_error());
        let m = fs::metadata(self.at("stamped"))?;
        ensure!(
            (m.mtime(), m.atime()) == (STAMP, STAMP - 1000),
            "mtime {} atime {} after setting {STAMP} and {}",
            m.mtime(),
            m.atime(),
            STAMP - 1000
        );
        let mode = self.file_mode;
        self.model.file("stamped", bytes, mode);
        self.model.mtimes.insert("stamped".into(), STAMP);
        Ok(())
    }

    /// A file removed while open: the name goes at once, the open
    /// descriptor still reads and writes, and nothing is left once it is
    /// closed. Likewise a file renamed over while open.
    fn remove_while_open(&mut self) -> Result<()> {
        fs::create_dir(self.at("held"))?;
        let d = self.dir_mode;
        self.model.dir("held", d);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(self.at("held/f"))?;
        f.write_all_at(b"still here\n", 0)?;
        fs::remove_file(self.at("held/f"))?;
        ensure!(
            fs::symlink_metadata(self.at("held/f")).is_err(),
            "held/f still there after rm"
        );
        drop_caches();
        let mut buf = [0u8; 64];
        let n = f.read_at(&mut buf, 0).context("reading the removed file")?;
        ensure!(&buf[..n] == b"still here\n", "read {:?}", &buf[..n]);
        f.write_all_at(b"and more\n", 11)
            .context("writing the removed file")?;
        f.sync_all().context("fsync of the removed file")?;
        drop_caches();
        let n = f.read_at(&mut buf, 0)?;
        ensure!(
            &buf[..n] == b"still here\nand more\n",
            "read {:?}",
            &buf[..n]
        );
        ensure!(
            f.metadata()?.len() == 20,
            "fstat size {}",
            f.metadata()?.len()
        );
        drop(f);

        // A file renamed over while open: the descriptor keeps reading the
        // old file, the name gives the new one.
        fs::write(self.at("held/g"), b"old\n")?;
        let g = File::open(self.at("held/g"))?;
        fs::write(self.at("held/new"), b"new\n")?;
        fs::rename(self.at("held/new"), self.at("held/g"))?;
        drop_caches();
        // SAFETY: advice on an open descriptor.
        unsafe { libc::posix_fadvise(g.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        let n = g
            .read_at(&mut buf, 0)
            .context("reading a file renamed over while open")?;
        ensure!(
            &buf[..n] == b"old\n",
            "a file renamed over while open reads {:?}",
            &buf[..n]
        );
        ensure!(fs::read(self.at("held/g"))? == b"new\n");
        drop(g);
        let f = self.file_mode;
        self.model.file("held/g", b"new\n".to_vec(), f);

        let held = self.at("held");
        let names = || -> Vec<OsString> {
            fs::read_dir(&held)
                .map(|d| d.filter_map(|e| e.ok().map(|e| e.file_name())).collect())
                .unwrap_or_default()
        };
        let settled = fuse::wait_until(RELEASE_WAIT, || names() == [OsString::from("g")]);
        ensure!(
            settled,
            "held/ still lists {:?} {RELEASE_WAIT:?} after the last close of the files \
             removed and renamed over while open (expected only g)",
            names()
        );
        Ok(())
    }

    /// 300 files; readdir lists each exactly once.
    fn many(&mut self) -> Result<()> {
        fs::create_dir(self.at("many"))?;
        let (f, d) = (self.file_mode, self.dir_mode);
        self.model.dir("many", d);
        for i in 1..=MANY {
            let text = format!("entry {i}\n").into_bytes();
            fs::write(self.at(&format!("many/f{i}")), &text)?;
            self.model.file(&format!("many/f{i}"), text, f);
        }
        drop_caches();
        let names: Vec<OsString> = fs::read_dir(self.at("many"))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<_>>()?;
        let unique: BTreeSet<&OsString> = names.iter().collect();
        let want: BTreeSet<OsString> = (1..=MANY).map(|i| format!("f{i}").into()).collect();
        ensure!(
            names.len() == MANY && unique.len() == MANY,
            "readdir gave {} names, {} distinct, expected {MANY}",
            names.len(),
            unique.len()
        );
        ensure!(
            unique.into_iter().cloned().collect::<BTreeSet<_>>() == want,
            "readdir lists other names than f1..f{MANY}"
        );
        ensure!(fs::read(self.at("many/f1"))? == b"entry 1\n");
        ensure!(
            fs::read(self.at(&format!("many/f{MANY}")))? == format!("entry {MANY}\n").as_bytes()
        );
        Ok(())
    }

    fn statfs(&mut self) -> Result<()> {
        let st = fuse::statvfs(self.mnt)?;
        ensure!(
            st.f_blocks > 0 && st.f_bsize > 0 && st.f_bavail <= st.f_blocks,
            "statvfs: {} blocks of {} bytes, {} available",
            st.f_blocks,
            st.f_bsize,
            st.f_bavail
        );
        Ok(())
    }

    /// MAP_SHARED writes, msync, munmap; then a MAP_PRIVATE read of the
    /// file after dropping caches.
    fn mmap(&mut self) -> Result<()> {
        let want = random_bytes(9, MAPPED);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(self.at("mapped"))?;
        f.set_len(MAPPED as u64)?;
        {
            let map = Mapping::new(
                &f,
                MAPPED,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
            )?;
            map.write(&want);
            map.msync()?;
        }
        drop(f);
        drop_caches();
        let f = File::open(self.at("mapped"))?;
        let got = Mapping::new(&f, MAPPED, libc::PROT_READ, libc::MAP_PRIVATE)?.read();
        compare_bytes(&want, &got).context("MAP_PRIVATE read of the mapped file")?;
        compare_file_with(&want, &self.at("mapped")).context("read(2) of the mapped file")?;
        let m = self.file_mode;
        self.model.file("mapped", want, m);
        Ok(())
    }

    fn remove(&mut self) -> Result<()> {
        fs::write(self.at("gone"), b"x\n")?;
        fs::remove_file(self.at("gone"))?;
        ensure!(!self.at("gone").exists(), "gone still exists");
        fs::create_dir(self.at("gonedir"))?;
        fs::remove_dir(self.at("gonedir"))?;
        ensure!(!self.at("gonedir").exists(), "gonedir still exists");
        let err = fs::remove_dir(self.at("dir"));
        ensure!(
            errno_of(&err) == Some(libc::ENOTEMPTY),
            "rmdir of a non-empty directory: {}",
            errno_name(errno_of(&err))
        );
        Ok(())
    }

    fn verify(&mut self) -> Result<()> {
        drop_caches();
        // A file removed while open lives on under a hidden name until its
        // last RELEASE, which the kernel sends after close() has returned:
        // give those a moment to go (one that never goes still fails).
        let deadline = std::time::Instant::now() + RELEASE_WAIT;
        while hidden_removed(self.mnt)? && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        check_tree(self.mnt, &self.model, "through the mount")
    }
}

/// Whether any file under `dir` is one the mount keeps for a removed file
/// still open (`.gvfs-fuse` and 16 hex digits).
fn hidden_removed(dir: &Path) -> Result<bool> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(".gvfs-fuse")
        {
            return Ok(true);
        }
        if entry.file_type()?.is_dir() && hidden_removed(&entry.path())? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Runs the workload on `mnt` (mounted by `front`), then checks `origin`
/// after writing back a cache's dirty data when `write_back`.
fn workload_on(front: &Proxy, mnt: &MountPoint, origin: &Path, write_back: bool) -> Result<()> {
    let mut model = Workload::new(mnt.path())?
        .run()
        .with_context(|| format!("front proxy output:\n{}", front.output()))?;
    // The proxy's NFS listener serves the same files: what the mount wrote
    // reads the same through it, and what an NFS client writes shows on
    // the mount.
    let odd = model.bytes("odd")?.clone();
    let got = nfs_cat(&front.url("odd"))?;
    compare_bytes(&odd, &got).context("nfs-cat of odd, written through the mount")?;
    let local = tempfile::tempdir()?;
    let src = local.path().join("via-nfs");
    let bytes = random_bytes(41, 333_333);
    fs::write(&src, &bytes)?;
    nfs_cp(&src.display().to_string(), &front.url("via-nfs"))?;
    compare_file_with(&bytes, &mnt.path().join("via-nfs"))
        .context("a file nfs-cp wrote, read through the mount")?;
    let mode = fs::metadata(mnt.path().join("via-nfs"))?.mode() & 0o7777;
    model.file("via-nfs", bytes, mode);
    if write_back {
        let said = front.write_back()?;
        ensure!(said.contains("done"), "gvfsctl writeback said {said:?}");
    }
    check_tree(origin, &model, "at the origin")
}

#[test]
fn workload_on_the_dir_origin() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    let p = mounted(ProxyArgs::dir(origin.path()), &mnt)?;
    workload_on(&p, &mnt, origin.path(), false)
}

#[test]
fn workload_on_ganesha() -> Result<()> {
    require_fuse!();
    let g = Ganesha::start()?;
    let mnt = MountPoint::new()?;
    let p = mounted(ProxyArgs::new(g.upstream_url()), &mnt)?;
    workload_on(&p, &mnt, g.export_dir(), false)
}

#[test]
fn workload_through_a_block_cache_on_the_dir_origin() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    let cache = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    let p = mounted(
        ProxyArgs::dir(origin.path()).cache(cache.path(), "64M"),
        &mnt,
    )?;
    workload_on(&p, &mnt, origin.path(), true)
}

#[test]
fn workload_through_a_chain_to_ganesha() -> Result<()> {
    require_fuse!();
    let g = Ganesha::start()?;
    let middle = Proxy::spawn(ProxyArgs::new(g.upstream_url()))?;
    let cache = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    let front = mounted(
        ProxyArgs::new(middle.upstream_url()).cache(cache.path(), "64M"),
        &mnt,
    )?;
    workload_on(&front, &mnt, g.export_dir(), true)
        .with_context(|| format!("middle proxy output:\n{}", middle.output()))
}
