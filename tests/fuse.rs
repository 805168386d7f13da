//! The FUSE front end (`gvfs-proxy --mount DIR`): the proxy's export
//! mounted as a local file system through the kernel's FUSE client, next
//! to its NFS listener, with the same layer stack.
//!
//! Everything on the mount is done with plain system calls (std::fs,
//! std::os::unix, libc) and real programs (`dd`, `qemu-img`, `qemu-io`),
//! which is the kernel FUSE client's path; the end state is then checked
//! by reading the origin directly (the `dir:` directory, or nfs-ganesha's
//! export directory), after `gvfsctl writeback --wait` for a write-back
//! cache:
//! - the workload the Linux kernel NFS client passes (`src/kernel/init.sh`,
//!   plus mmap, statfs and utimes) against `dir:`, nfs-ganesha, `dir:`
//!   with a block cache, and a chain (cache proxy -> proxy -> ganesha);
//!   the same files through the proxy's NFS listener (`nfs-cat`, `nfs-cp`);
//! - QEMU images (qcow2 made, checked and written by `qemu-img` and
//!   `qemu-io`; a raw memory image converted in and mapped);
//! - concurrent writers and readers, every byte checked;
//! - bad input and errors: too long names, names with every byte, writes
//!   past the largest file size, a full origin, failing calls (the errno
//!   of a local directory), a file removed behind the mount (ESTALE);
//! - the mount's life: refused directories, a dead mount left by SIGKILL,
//!   SIGTERM's unmount after write-back, `gvfsctl status`, the TOML key,
//!   `--listen none` (the mount and no NFS listener);
//! - an upstream outage (nfs-ganesha behind `gvfs-wanlink`, cut and
//!   restored): a read waits like a hard mount by default, and fails with
//!   EIO after `--upstream-timeout`;
//! - credentials per call (uid, gid, supplementary groups) and per open
//!   file (uid 1000 vs 1001).
//!
//! Skipped (with a message) only when `/dev/fuse` or `fusermount3` is
//! missing; the tests run as root, as the CI does.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use gvfs::data::{compare_bytes, compare_file_with, compare_files, random_bytes, random_bytes_at};
use gvfs::fuse::{self, MountPoint, drop_caches, in_child};
use gvfs::libnfs::{nfs_cat, nfs_cp, qemu_img};
use gvfs::process::{self, run_ok};
use gvfs::proxy::{gvfsctl, proxy_binary};
use gvfs::tmpfs::Tmpfs;
use gvfs::{Ganesha, Proxy, ProxyArgs};
use gvfs_proxy::exit::ExitCode;

const MIB: usize = 1 << 20;
/// How long one program run on the mount may take.
const TOOL_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a child process calling the mount as another user may take.
const CHILD_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the file system may take to drop a file removed while open
/// after its last close (FUSE sends RELEASE after close(2) returns).
const RELEASE_WAIT: Duration = Duration::from_secs(10);

/// Returns from the test (passing) with a message when FUSE is missing.
macro_rules! require_fuse {
    () => {
        if let Some(why) = gvfs::fuse::unavailable() {
            eprintln!("skipping: {why}");
            return Ok(());
        }
    };
}

/// Starts a proxy with `args` and `--mount` on `mnt`; fails unless the
/// mount is a live FUSE mount by the time the proxy says it listens.
fn mounted(args: ProxyArgs, mnt: &MountPoint) -> Result<Proxy> {
    let p = Proxy::spawn(args.arg("--mount").arg(mnt.path().display().to_string()))?;
    ensure!(
        mnt.is_mounted()?,
        "{} is not a mount point after the proxy printed `listening on`; output:\n{}",
        mnt.path().display(),
        p.output()
    );
    let ty = fuse::fs_type(mnt.path())?;
    ensure!(
        ty == fuse::FUSE_SUPER_MAGIC,
        "{} is mounted with f_type {ty:#x}, not FUSE's",
        mnt.path().display()
    );
    Ok(p)
}

/// `--cache-dir DIR --cache-size 64M`.
fn with_cache(args: ProxyArgs, dir: &Path) -> ProxyArgs {
    args.arg("--cache-dir")
        .arg(dir.display().to_string())
        .arg("--cache-size")
        .arg("64M")
}

/// The errno of an I/O result, or `None` when it succeeded.
fn errno_of<T>(r: &std::io::Result<T>) -> Option<i32> {
    r.as_ref().err().map(|e| e.raw_os_error().unwrap_or(-1))
}

fn errno_name(e: Option<i32>) -> String {
    match e {
        None => "success".into(),
        Some(e) => std::io::Error::from_raw_os_error(e).to_string(),
    }
}

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

// ---------------------------------------------------------------------------
// The expected tree, and checking a directory tree against it.

/// One thing the workload leaves behind.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Want {
    File {
        bytes: Vec<u8>,
        mode: u32,
        nlink: u64,
    },
    Dir {
        mode: u32,
    },
    Symlink {
        target: PathBuf,
    },
}

/// What the workload left, by path relative to the mount's root.
#[derive(Debug, Default)]
struct Model {
    entries: BTreeMap<PathBuf, Want>,
    /// Files whose mtime was set (seconds).
    mtimes: BTreeMap<PathBuf, i64>,
    /// Pairs of hard links: the same inode.
    same_inode: Vec<(PathBuf, PathBuf)>,
}

impl Model {
    fn file(&mut self, rel: &str, bytes: Vec<u8>, mode: u32) {
        self.entries.insert(
            rel.into(),
            Want::File {
                bytes,
                mode,
                nlink: 1,
            },
        );
    }

    fn dir(&mut self, rel: &str, mode: u32) {
        self.entries.insert(rel.into(), Want::Dir { mode });
    }

    fn bytes(&mut self, rel: &str) -> Result<&mut Vec<u8>> {
        match self.entries.get_mut(Path::new(rel)) {
            Some(Want::File { bytes, .. }) => Ok(bytes),
            other => bail!("the model has no file {rel} ({other:?})"),
        }
    }

    fn set_mode(&mut self, rel: &str, m: u32) -> Result<()> {
        match self.entries.get_mut(Path::new(rel)) {
            Some(Want::File { mode, .. } | Want::Dir { mode }) => {
                *mode = m;
                Ok(())
            }
            other => bail!("the model has no file or directory {rel} ({other:?})"),
        }
    }

    fn set_nlink(&mut self, rel: &str, n: u64) -> Result<()> {
        match self.entries.get_mut(Path::new(rel)) {
            Some(Want::File { nlink, .. }) => {
                *nlink = n;
                Ok(())
            }
            other => bail!("the model has no file {rel} ({other:?})"),
        }
    }

    /// Moves `from` (and everything under it) to `to`.
    fn rename(&mut self, from: &str, to: &str) {
        let (from, to) = (Path::new(from), Path::new(to));
        let moved: Vec<PathBuf> = self
            .entries
            .keys()
            .filter(|p| p.starts_with(from))
            .cloned()
            .collect();
        for p in moved {
            if let Some(w) = self.entries.remove(&p) {
                let rest = p.strip_prefix(from).unwrap_or(Path::new(""));
                let dest = if rest.as_os_str().is_empty() {
                    to.to_path_buf()
                } else {
                    to.join(rest)
                };
                self.entries.insert(dest, w);
            }
        }
    }
}

/// Everything under `root` (not `root` itself), by relative path, with its
/// lstat.
fn walk(root: &Path) -> Result<BTreeMap<PathBuf, fs::Metadata>> {
    let mut found = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
            let path = e
                .with_context(|| format!("listing {}", dir.display()))?
                .path();
            let meta =
                fs::symlink_metadata(&path).with_context(|| format!("lstat {}", path.display()))?;
            if meta.is_dir() {
                stack.push(path.clone());
            }
            let rel = path.strip_prefix(root).context("a path outside the root")?;
            found.insert(rel.to_path_buf(), meta);
        }
    }
    Ok(found)
}

/// Fails, listing every difference, unless the tree under `root` is
/// exactly `model`: the same names and kinds; for files the same bytes,
/// size, permission bits and link count; for directories the permission
/// bits; for symbolic links the target; the mtimes set; hard links on one
/// inode.
fn check_tree(root: &Path, model: &Model, label: &str) -> Result<()> {
    let found = walk(root)?;
    let mut diffs = Vec::new();
    for (rel, want) in &model.entries {
        let shown = rel.display();
        let Some(meta) = found.get(rel) else {
            diffs.push(format!("{shown}: missing"));
            continue;
        };
        let path = root.join(rel);
        let perm = meta.mode() & 0o7777;
        match want {
            Want::File { bytes, mode, nlink } => {
                if !meta.is_file() {
                    diffs.push(format!(
                        "{shown}: not a regular file ({:?})",
                        meta.file_type()
                    ));
                    continue;
                }
                if meta.len() != bytes.len() as u64 {
                    diffs.push(format!(
                        "{shown}: size {}, expected {}",
                        meta.len(),
                        bytes.len()
                    ));
                }
                if perm != *mode {
                    diffs.push(format!("{shown}: mode {perm:o}, expected {mode:o}"));
                }
                if meta.nlink() != *nlink {
                    diffs.push(format!("{shown}: {} links, expected {nlink}", meta.nlink()));
                }
                match fs::read(&path) {
                    Ok(got) => {
                        if let Err(e) = compare_bytes(bytes, &got) {
                            diffs.push(format!("{shown}: {e}"));
                        }
                    }
                    Err(e) => diffs.push(format!("{shown}: reading: {e}")),
                }
            }
            Want::Dir { mode } => {
                if !meta.is_dir() {
                    diffs.push(format!("{shown}: not a directory ({:?})", meta.file_type()));
                } else if perm != *mode {
                    diffs.push(format!("{shown}: mode {perm:o}, expected {mode:o}"));
                }
            }
            Want::Symlink { target } => {
                if !meta.file_type().is_symlink() {
                    diffs.push(format!(
                        "{shown}: not a symbolic link ({:?})",
                        meta.file_type()
                    ));
                    continue;
                }
                match fs::read_link(&path) {
                    Ok(t) if t == *target => {}
                    Ok(t) => diffs.push(format!(
                        "{shown}: points to {}, expected {}",
                        t.display(),
                        target.display()
                    )),
                    Err(e) => diffs.push(format!("{shown}: readlink: {e}")),
                }
            }
        }
    }
    for (rel, meta) in &found {
        if !model.entries.contains_key(rel) {
            diffs.push(format!(
                "{}: not expected ({:?}, {} bytes)",
                rel.display(),
                meta.file_type(),
                meta.len()
            ));
        }
    }
    for (rel, secs) in &model.mtimes {
        if let Some(meta) = found.get(rel)
            && meta.mtime() != *secs
        {
            diffs.push(format!(
                "{}: mtime {}, expected {secs}",
                rel.display(),
                meta.mtime()
            ));
        }
    }
    for (a, b) in &model.same_inode {
        if let (Some(ma), Some(mb)) = (found.get(a), found.get(b))
            && (ma.ino(), ma.dev()) != (mb.ino(), mb.dev())
        {
            diffs.push(format!(
                "{} and {} are hard links but have inodes {} and {}",
                a.display(),
                b.display(),
                ma.ino(),
                mb.ino()
            ));
        }
    }
    ensure!(
        diffs.is_empty(),
        "{label} ({}): {} differences from what the workload wrote:\n{}",
        root.display(),
        diffs.len(),
        diffs.join("\n")
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// The workload.

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
        check_tree(self.mnt, &self.model, "through the mount")
    }
}

/// A memory mapping, unmapped on drop.
struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Mapping {
    fn new(f: &File, len: usize, prot: i32, flags: i32) -> Result<Self> {
        // SAFETY: a new mapping of an open descriptor; checked below.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, f.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mmap");
        }
        Ok(Self { ptr, len })
    }

    fn write(&self, bytes: &[u8]) {
        let n = bytes.len().min(self.len);
        // SAFETY: the mapping is writable and at least `n` bytes long.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.cast::<u8>(), n) };
    }

    fn read(&self) -> Vec<u8> {
        // SAFETY: the mapping is readable and `len` bytes long.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }.to_vec()
    }

    fn msync(&self) -> Result<()> {
        // SAFETY: the whole mapping.
        let rc = unsafe { libc::msync(self.ptr, self.len, libc::MS_SYNC) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error()).context("msync");
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
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
        with_cache(ProxyArgs::dir(origin.path()), cache.path()),
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
        with_cache(ProxyArgs::new(middle.upstream_url()), cache.path()),
        &mnt,
    )?;
    workload_on(&front, &mnt, g.export_dir(), true)
        .with_context(|| format!("middle proxy output:\n{}", middle.output()))
}

// ---------------------------------------------------------------------------
// QEMU.

#[test]
fn qemu_images_on_the_mount() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    let local = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    let p = mounted(ProxyArgs::dir(origin.path()), &mnt)?;
    let disk = mnt.path().join("disk.qcow2");
    let disk_s = disk.display().to_string();
    let inner = || -> Result<()> {
        qemu_img(&["create", "-f", "qcow2", &disk_s, "64M"])?;
        qemu_img(&["check", &disk_s])?;
        // What the image should hold: 1 MiB of 0xab, then zeros.
        let expected = local.path().join("expected.raw");
        let f = File::create(&expected)?;
        f.set_len(64 * MIB as u64)?;
        f.write_all_at(&vec![0xab; MIB], 0)?;
        drop(f);
        let expected_s = expected.display().to_string();
        if fuse::which("qemu-io").is_some() {
            let out = run_ok(
                Command::new("qemu-io")
                    .args(["-f", "qcow2"])
                    .args(["-c", "write -P 0xab 0 1M"])
                    .args(["-c", "read -P 0xab 0 1M"])
                    .arg(&disk),
                TOOL_TIMEOUT,
            )?;
            let said = format!("{}{}", out.stdout_text(), out.stderr_text());
            ensure!(
                !said.contains("fail") && !said.contains("error"),
                "qemu-io: {said}"
            );
            ensure!(said.contains("wrote 1048576/1048576"), "qemu-io: {said}");
            ensure!(said.contains("read 1048576/1048576"), "qemu-io: {said}");
        } else {
            eprintln!("qemu-io not installed: writing the image with qemu-img convert -n");
            qemu_img(&[
                "convert",
                "-n",
                "-f",
                "raw",
                "-O",
                "qcow2",
                &expected_s,
                &disk_s,
            ])?;
        }
        qemu_img(&["check", &disk_s])?;
        drop_caches();
        qemu_img(&["compare", "-f", "raw", "-F", "qcow2", &expected_s, &disk_s])
            .context("the image through the mount")?;
        let at_origin = origin.path().join("disk.qcow2").display().to_string();
        qemu_img(&["check", &at_origin]).context("the image at the origin")?;
        qemu_img(&[
            "compare",
            "-f",
            "raw",
            "-F",
            "qcow2",
            &expected_s,
            &at_origin,
        ])
        .context("the image at the origin")?;

        // A raw memory image, converted in by path and compared.
        let mem = local.path().join("mem.img");
        gvfs::data::write_memory_image(&mem, 32 * MIB as u64, 11)?;
        let on_mount = mnt.path().join("mem.raw");
        qemu_img(&[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &mem.display().to_string(),
            &on_mount.display().to_string(),
        ])?;
        drop_caches();
        compare_files(&mem, &on_mount).context("the memory image through the mount")?;
        compare_files(&mem, &origin.path().join("mem.raw"))
            .context("the memory image at the origin")?;
        // Mapped privately, as a VM's RAM from a golden memory file.
        let f = File::open(&on_mount)?;
        let mapped = Mapping::new(&f, 32 * MIB, libc::PROT_READ, libc::MAP_PRIVATE)?.read();
        compare_bytes(&fs::read(&mem)?, &mapped).context("the memory image mapped privately")?;
        Ok(())
    };
    inner().with_context(|| format!("proxy output:\n{}", p.output()))
}

// ---------------------------------------------------------------------------
// Concurrency.

const WRITERS: usize = 4;
const READERS: usize = 4;
/// Each writer's own file, each reader's file, each writer's region of the
/// shared file.
const PART: usize = 2 * MIB;
/// Chunk of the writers' and readers' calls: not a multiple of a page.
const CHUNK: usize = 100_003;
const SHARED_OLD: u64 = 900;

/// The writers' content of the shared file's `[at, at + n)`: writer w
/// writes seed 200 + w over its region `[w * PART, (w + 1) * PART)`.
fn shared_new(at: u64, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n);
    let mut pos = at;
    let end = at + n as u64;
    while pos < end {
        let w = pos / PART as u64;
        let region_end = ((w + 1) * PART as u64).min(end);
        out.extend(random_bytes_at(200 + w, pos, (region_end - pos) as usize));
        pos = region_end;
    }
    out
}

/// Four writers (each its own file and its own region of a shared file)
/// and four readers (each a file of its own written before, and the
/// shared file while it is being written) at once; every byte checked
/// while running and after, through the mount and at the origin.
fn concurrency(front: &Proxy, mnt: &MountPoint, origin: &Path, write_back: bool) -> Result<()> {
    let root = Arc::new(mnt.path().to_path_buf());
    let shared_len = (WRITERS * PART) as u64;
    // Written before: the readers' files, and the shared file's old content.
    for r in 0..READERS {
        fs::write(
            root.join(format!("ro-{r}")),
            random_bytes(100 + r as u64, PART),
        )?;
    }
    fs::write(
        root.join("shared"),
        random_bytes(SHARED_OLD, shared_len as usize),
    )?;
    drop_caches();
    let mut threads = Vec::new();
    for w in 0..WRITERS {
        let root = root.clone();
        threads.push(std::thread::spawn(move || -> Result<()> {
            let seed = 200 + w as u64;
            let own = File::create(root.join(format!("own-{w}")))?;
            let shared = OpenOptions::new().write(true).open(root.join("shared"))?;
            let base = (w * PART) as u64;
            let mut off = 0;
            while off < PART {
                let n = CHUNK.min(PART - off);
                own.write_all_at(&random_bytes_at(seed, off as u64, n), off as u64)
                    .with_context(|| format!("writer {w}: own file at {off}"))?;
                let at = base + off as u64;
                shared
                    .write_all_at(&random_bytes_at(seed, at, n), at)
                    .with_context(|| format!("writer {w}: shared file at {at}"))?;
                off += n;
            }
            own.sync_all()?;
            shared.sync_all()?;
            Ok(())
        }));
    }
    for r in 0..READERS {
        let root = root.clone();
        threads.push(std::thread::spawn(move || -> Result<()> {
            let mine = File::open(root.join(format!("ro-{r}")))?;
            let shared = File::open(root.join("shared"))?;
            let mut buf = vec![0u8; CHUNK];
            for pass in 0..2 {
                let mut off = 0;
                while off < PART {
                    let n = CHUNK.min(PART - off);
                    mine.read_exact_at(&mut buf[..n], off as u64)?;
                    compare_bytes(&random_bytes_at(100 + r as u64, off as u64, n), &buf[..n])
                        .with_context(|| format!("reader {r} pass {pass}: own file at {off}"))?;
                    off += n;
                }
                // The shared file, while the writers write it: each byte is
                // the old content or the writer's new one.
                let mut at = (r * CHUNK) as u64 % shared_len;
                let mut done = 0u64;
                while done < shared_len {
                    let n = (CHUNK as u64).min(shared_len - at) as usize;
                    shared.read_exact_at(&mut buf[..n], at)?;
                    let old = random_bytes_at(SHARED_OLD, at, n);
                    let new = shared_new(at, n);
                    let writer = (at / PART as u64) as usize;
                    if let Some(i) = (0..n).find(|&i| buf[i] != old[i] && buf[i] != new[i]) {
                        bail!(
                            "reader {r} pass {pass}: shared file byte {} (writer {writer}'s \
                             region) is {:#04x}, neither the old {:#04x} nor the new {:#04x}",
                            at + i as u64,
                            buf[i],
                            old[i],
                            new[i]
                        );
                    }
                    done += n as u64;
                    at = (at + n as u64) % shared_len;
                }
            }
            Ok(())
        }));
    }
    let mut errors = Vec::new();
    for t in threads {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(format!("{e:#}")),
            Err(_) => errors.push("a thread panicked".into()),
        }
    }
    ensure!(
        errors.is_empty(),
        "concurrent calls failed:\n{}\nproxy output:\n{}",
        errors.join("\n"),
        front.output()
    );
    let mut model = Model::default();
    let mode = 0o666 & !fuse::umask()?;
    for r in 0..READERS {
        model.file(&format!("ro-{r}"), random_bytes(100 + r as u64, PART), mode);
    }
    let mut shared = Vec::with_capacity(shared_len as usize);
    for w in 0..WRITERS {
        model.file(
            &format!("own-{w}"),
            random_bytes(200 + w as u64, PART),
            mode,
        );
        shared.extend(random_bytes_at(200 + w as u64, (w * PART) as u64, PART));
    }
    model.file("shared", shared, mode);
    drop_caches();
    check_tree(mnt.path(), &model, "through the mount")?;
    if write_back {
        front.write_back()?;
    }
    check_tree(origin, &model, "at the origin")
}

#[test]
fn concurrent_writers_and_readers_on_the_dir_origin() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    let p = mounted(ProxyArgs::dir(origin.path()), &mnt)?;
    concurrency(&p, &mnt, origin.path(), false)
}

#[test]
fn concurrent_writers_and_readers_through_a_block_cache() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    let cache = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    let p = mounted(
        with_cache(ProxyArgs::dir(origin.path()), cache.path()),
        &mnt,
    )?;
    concurrency(&p, &mnt, origin.path(), true)
}

// ---------------------------------------------------------------------------
// Bad input.

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

// ---------------------------------------------------------------------------
// The mount's life.

/// Runs gvfs-proxy serving `origin` with `--mount mnt`, expecting it to refuse at once: returns its stderr
/// once it exited with the local-resource code (4).
fn refused_mount(origin: &Path, mnt: &Path) -> Result<String> {
    let ctl = tempfile::tempdir()?;
    let mut cmd = Command::new(proxy_binary()?);
    cmd.args(["--listen", "127.0.0.1:0", "--control"])
        .arg(ctl.path().join("ctl.sock"))
        .arg("--upstream")
        .arg(format!("dir:{}", origin.display()))
        .arg("--mount")
        .arg(mnt);
    let out = process::run(&mut cmd, Duration::from_secs(30))?;
    let stderr = out.stderr_text();
    let want = ExitCode::LocalResource.code();
    ensure!(
        out.status.code() == Some(i32::from(want)),
        "gvfs-proxy --mount {} exited with {}, expected {want}; stderr:\n{stderr}",
        mnt.display(),
        out.status
    );
    Ok(stderr)
}

#[test]
fn a_missing_or_non_empty_directory_is_refused() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    let missing = mnt.path().join("missing");
    let said = refused_mount(origin.path(), &missing)?;
    ensure!(said.contains("does not exist"), "stderr: {said}");
    fs::write(mnt.path().join("something"), b"x")?;
    let said = refused_mount(origin.path(), mnt.path())?;
    ensure!(said.contains("not empty"), "stderr: {said}");
    ensure!(!mnt.is_mounted()?, "mounted anyway");
    Ok(())
}

#[test]
fn a_dead_mount_is_refused_with_the_command_that_clears_it() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    let mut p = mounted(ProxyArgs::dir(origin.path()), &mnt)?;
    fs::write(mnt.path().join("first"), b"first\n")?;
    p.kill();
    ensure!(mnt.is_mounted()?, "no mount left after SIGKILL");
    let stat = fs::metadata(mnt.path());
    ensure!(
        errno_of(&stat) == Some(libc::ENOTCONN),
        "stat of the dead mount: {}, expected ENOTCONN",
        errno_name(errno_of(&stat))
    );
    let said = refused_mount(origin.path(), mnt.path())?;
    let clear = format!("fusermount3 -u {}", mnt.path().display());
    ensure!(said.contains(&clear), "stderr lacks `{clear}`: {said}");
    run_ok(
        Command::new("fusermount3").arg("-u").arg(mnt.path()),
        TOOL_TIMEOUT,
    )?;
    ensure!(!mnt.is_mounted()?, "still mounted after fusermount3 -u");
    let mut p = mounted(ProxyArgs::dir(origin.path()), &mnt)?;
    ensure!(fs::read(mnt.path().join("first"))? == b"first\n");
    fs::write(mnt.path().join("second"), b"second\n")?;
    ensure!(fs::read(origin.path().join("second"))? == b"second\n");
    let status = p.terminate()?;
    ensure!(
        status.success(),
        "exit {status} on SIGTERM; output:\n{}",
        p.output()
    );
    ensure!(!mnt.is_mounted()?, "still mounted after SIGTERM");
    Ok(())
}

#[test]
fn sigterm_writes_back_then_unmounts_and_status_shows_the_mount() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    let cache = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    let mut p = mounted(
        with_cache(ProxyArgs::dir(origin.path()), cache.path()),
        &mnt,
    )?;
    let status = p.status()?;
    ensure!(
        status["mount"]["path"].as_str() == Some(&*mnt.path().display().to_string()),
        "gvfsctl status --json: mount is {}, expected path {}",
        status["mount"],
        mnt.path().display()
    );
    let bytes = random_bytes(31, 3 * MIB + 1234);
    let mut f = File::create(mnt.path().join("kept"))?;
    f.write_all(&bytes)?;
    f.sync_all()?;
    drop(f);
    let exit = p.terminate()?;
    ensure!(
        exit.success(),
        "exit {exit} on SIGTERM; output:\n{}",
        p.output()
    );
    ensure!(!mnt.is_mounted()?, "still mounted after SIGTERM");
    compare_file_with(&bytes, &origin.path().join("kept"))
        .context("the cache's dirty data at the origin after SIGTERM")?;
    // A proxy without --mount reports none.
    let plain = Proxy::spawn(ProxyArgs::dir(origin.path()))?;
    let status = plain.status()?;
    ensure!(
        status["mount"].is_null(),
        "a proxy without --mount reports mount {}",
        status["mount"]
    );
    Ok(())
}

#[test]
fn the_config_file_key_mounts_too() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    fs::write(origin.path().join("placed"), b"placed at the origin\n")?;
    let cfg_dir = tempfile::tempdir()?;
    let mnt = MountPoint::new()?;
    let cfg = cfg_dir.path().join("proxy.toml");
    fs::write(&cfg, format!("mount = \"{}\"\n", mnt.path().display()))?;
    let mut p = Proxy::spawn(
        ProxyArgs::dir(origin.path())
            .arg("--config")
            .arg(cfg.display().to_string()),
    )?;
    ensure!(
        mnt.is_mounted()?,
        "mount = in the config file did not mount"
    );
    ensure!(fs::read(mnt.path().join("placed"))? == b"placed at the origin\n");
    ensure!(p.status()?["mount"]["path"].as_str() == Some(&*mnt.path().display().to_string()));
    let exit = p.terminate()?;
    ensure!(exit.success(), "exit {exit} on SIGTERM");
    ensure!(!mnt.is_mounted()?, "still mounted after SIGTERM");
    Ok(())
}

/// A `gvfs-proxy` started by hand (not through [`Proxy::spawn`], which
/// waits for `listening on`); killed when dropped.
struct Spawned(Option<std::process::Child>);

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The line a proxy without an NFS listener prints instead of
/// `listening on ADDR`.
const NO_LISTENER_LINE: &str = "no NFS listener (--listen none)";
/// The last line of the proxy's start-up banner.
const BANNER_END: &str = "Stop with Ctrl-C";

/// `--listen none --mount DIR`: the banner says there is no NFS listener
/// (and never `listening on`), the mount serves (a file written through it
/// reads back and is at the origin), `gvfsctl status --json` shows
/// `"listen": "none"` and the mount, the process listens on no TCP port,
/// and SIGTERM exits 0 and unmounts. Without --mount, `--listen none` is a
/// configuration error (exit 2, "nothing to serve").
#[test]
fn listen_none_serves_the_mount_only() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    let ctl = tempfile::tempdir()?;
    let control = ctl.path().join("ctl.sock");
    let mnt = MountPoint::new()?;
    let mut cmd = Command::new(proxy_binary()?);
    cmd.args(["--listen", "none", "--upstream"])
        .arg(format!("dir:{}", origin.path().display()))
        .arg("--mount")
        .arg(mnt.path())
        .arg("--control")
        .arg(&control)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let line = process::describe(&cmd);
    let mut child = cmd.spawn().with_context(|| format!("spawning `{line}`"))?;
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let mut proxy = Spawned(Some(child));
    let (tx, lines) = mpsc::channel::<String>();
    if let Some(out) = stdout {
        thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
    }
    let stderr = stderr.map(|mut err| {
        thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        })
    });
    // The whole banner, up to its last line (or the end of stdout).
    let mut banner = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !banner.iter().any(|l: &String| l.starts_with(BANNER_END)) {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(l) => banner.push(l),
            Err(_) => {
                let child = proxy.0.as_mut().context("the proxy is gone")?;
                let status = child.try_wait()?;
                if status.is_some() {
                    // Gone: its stderr says why.
                    let said = stderr.and_then(|h| h.join().ok()).unwrap_or_default();
                    bail!(
                        "`{line}` exited ({status:?}) before its banner ended; stdout:\n{}\nstderr:\n{said}",
                        banner.join("\n")
                    );
                }
                bail!(
                    "`{line}` printed no `{BANNER_END}` line within 10 s; stdout:\n{}",
                    banner.join("\n")
                );
            }
        }
    }
    let shown = banner.join("\n");
    ensure!(
        banner.iter().any(|l| l == NO_LISTENER_LINE),
        "no `{NO_LISTENER_LINE}` line; stdout:\n{shown}"
    );
    ensure!(
        !banner.iter().any(|l| l.starts_with("listening on")),
        "--listen none printed a `listening on` line; stdout:\n{shown}"
    );
    // The mount is live once the banner is out.
    ensure!(
        mnt.is_mounted()?,
        "{} is not mounted after the banner; stdout:\n{shown}",
        mnt.path().display()
    );
    let ty = fuse::fs_type(mnt.path())?;
    ensure!(ty == fuse::FUSE_SUPER_MAGIC, "f_type {ty:#x}, not FUSE's");

    let bytes = random_bytes(91, 300_001);
    let mut f = File::create(mnt.path().join("only-fuse"))?;
    f.write_all(&bytes)?;
    f.sync_all()?;
    drop(f);
    drop_caches();
    compare_file_with(&bytes, &mnt.path().join("only-fuse"))
        .context("read back through the mount")?;
    compare_file_with(&bytes, &origin.path().join("only-fuse")).context("at the origin")?;

    let out = gvfsctl(&control, &["status", "--json"])?;
    ensure!(
        out.status.success(),
        "gvfsctl status failed: {}",
        out.stderr_text()
    );
    let status: serde_json::Value =
        serde_json::from_str(&out.stdout_text()).context("parsing gvfsctl status --json")?;
    ensure!(
        status["listen"].as_str() == Some("none"),
        "gvfsctl status --json: listen is {}, expected \"none\"",
        status["listen"]
    );
    ensure!(
        status["mount"]["path"].as_str() == Some(&*mnt.path().display().to_string()),
        "gvfsctl status --json: mount is {}, expected path {}",
        status["mount"],
        mnt.path().display()
    );

    let child = proxy.0.as_mut().context("the proxy is gone")?;
    let ports = fuse::listening_tcp_ports(child.id())?;
    ensure!(
        ports.is_empty(),
        "--listen none, yet the proxy listens on TCP ports {ports:?}"
    );

    let (exit, killed) = process::terminate(child, Duration::from_secs(10))?;
    let said = stderr.and_then(|h| h.join().ok()).unwrap_or_default();
    ensure!(!killed, "ignored SIGTERM for 10 s; stderr:\n{said}");
    ensure!(exit.success(), "exit {exit} on SIGTERM; stderr:\n{said}");
    ensure!(!mnt.is_mounted()?, "still mounted after SIGTERM");

    // With nothing to serve, it refuses to start.
    let elsewhere = tempfile::tempdir()?;
    let mut cmd = Command::new(proxy_binary()?);
    cmd.args(["--listen", "none", "--upstream"])
        .arg(format!("dir:{}", elsewhere.path().display()))
        .arg("--control")
        .arg(ctl.path().join("nothing.sock"));
    let out = process::run(&mut cmd, Duration::from_secs(30))?;
    let want = ExitCode::Config.code();
    ensure!(
        out.status.code() == Some(i32::from(want)),
        "--listen none without --mount exited with {}, expected {want}; stderr:\n{}",
        out.status,
        out.stderr_text()
    );
    ensure!(
        out.stderr_text().contains("nothing to serve"),
        "stderr: {}",
        out.stderr_text()
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Upstream outages.

/// How long a read must still be waiting while the link is cut.
const STILL_BLOCKED: Duration = Duration::from_secs(3);
/// How long the read may take to complete after the link is restored.
const AFTER_RESTORE: Duration = Duration::from_secs(60);
/// `--upstream-timeout` of the soft-mount case, seconds.
const UPSTREAM_TIMEOUT: &str = "2";
/// How long a read may be refused for before `--upstream-timeout` can
/// have passed: it must still be waiting then.
const BEFORE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long after the cut a read must have failed with
/// `--upstream-timeout 2`.
const FAILED_WITHIN: Duration = Duration::from_secs(20);
/// The size of the files read through the outage (small: one or two READs).
const SMALL: usize = 100_003;

/// nfs-ganesha behind two `gvfs-wanlink` processes, one relaying its NFS
/// port and one its MOUNT port, cut and restored together as one WAN link.
struct Wan {
    nfs: fuse::WanLinkProcess,
    mount: fuse::WanLinkProcess,
    g: Ganesha,
}

impl Wan {
    fn start() -> Result<Self> {
        let g = Ganesha::start()?;
        let nfs = fuse::WanLinkProcess::start(g.nfs_addr())?;
        let mount = fuse::WanLinkProcess::start(SocketAddr::new(g.ip(), g.mount_port()))?;
        Ok(Self { nfs, mount, g })
    }

    /// The `--upstream` URL that reaches ganesha through the links.
    fn upstream_url(&self) -> String {
        format!(
            "nfs://127.0.0.1:{}{}?mountport={}",
            self.nfs.addr().port(),
            gvfs::ganesha::EXPORT,
            self.mount.addr().port()
        )
    }

    /// Places `name` with `SMALL` bytes of seed `seed` at the origin.
    fn place(&self, name: &str, seed: u64) -> Result<Vec<u8>> {
        let bytes = random_bytes(seed, SMALL);
        fs::write(self.g.export_dir().join(name), &bytes)?;
        Ok(bytes)
    }

    fn cut(&mut self, mode: &str) -> Result<()> {
        self.nfs.cut(mode)?;
        self.mount.cut(mode)
    }

    fn restore(&mut self) -> Result<()> {
        self.nfs.restore()?;
        self.mount.restore()
    }

    /// Bytes ganesha has sent back through the NFS link so far.
    fn down_bytes(&mut self) -> Result<u64> {
        Ok(self.nfs.stats()?.get("down").copied().unwrap_or(0))
    }
}

/// What a read on a thread came to.
type ReadResult = std::io::Result<Vec<u8>>;

/// Reads the open file `f` to its end on a thread of its own, with plain
/// read(2) calls only (no stat, no open: every call the kernel makes is a
/// READ); the bytes or the error arrive on the receiver.
fn read_on_a_thread(mut f: File, len: usize) -> mpsc::Receiver<ReadResult> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut buf = vec![0u8; len + 1];
        let mut n = 0;
        let r = loop {
            match f.read(&mut buf[n..]) {
                Ok(0) => break Ok(()),
                Ok(k) => {
                    n += k;
                    if n == buf.len() {
                        break Ok(());
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        buf.truncate(n);
        let _ = tx.send(r.map(|()| buf));
    });
    rx
}

/// `path` read whole (open and read) on a thread, within `within`.
fn read_within(path: &Path, within: Duration) -> Result<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    let p = path.to_path_buf();
    thread::spawn(move || {
        let _ = tx.send(fs::read(p));
    });
    match rx.recv_timeout(within) {
        Ok(r) => r.with_context(|| format!("reading {}", path.display())),
        Err(_) => bail!("reading {} took more than {within:?}", path.display()),
    }
}

/// How many calls the mount's file system made that failed below it
/// (`mount.failed` of `gvfsctl status --json`).
fn failed_below(p: &Proxy) -> Result<u64> {
    let status = p.status()?;
    status["mount"]["failed"].as_u64().with_context(|| {
        format!(
            "no mount.failed in gvfsctl status --json: {}",
            status["mount"]
        )
    })
}

fn outcome(r: &ReadResult) -> String {
    match r {
        Ok(b) => format!("{} bytes", b.len()),
        Err(e) => format!("{e} (errno {:?})", e.raw_os_error()),
    }
}

/// Default (hard) behaviour: `name` (looked up and opened while the link
/// is up, never read) is read on a thread while the link is cut in `mode`;
/// the read must still be waiting after [`STILL_BLOCKED`] (no error, no
/// data), then complete with the right bytes once the link is restored.
/// Returns how long it took after the restore.
fn hard_outage(
    wan: &mut Wan,
    p: &Proxy,
    mnt: &MountPoint,
    mode: &str,
    name: &str,
    bytes: &[u8],
) -> Result<Duration> {
    let f = File::open(mnt.path().join(name))?;
    let down = wan.down_bytes()?;
    let failed = failed_below(p)?;
    wan.cut(mode)?;
    let rx = read_on_a_thread(f, bytes.len());
    match rx.recv_timeout(STILL_BLOCKED) {
        Err(mpsc::RecvTimeoutError::Timeout) => {}
        Ok(r) => {
            wan.restore()?;
            bail!(
                "cut {mode}: the read of {name} finished during the outage ({}), \
                 expected it to wait like a hard mount; proxy output:\n{}",
                outcome(&r),
                p.output()
            );
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => bail!("the reading thread died"),
    }
    let restored = Instant::now();
    wan.restore()?;
    let got = match rx.recv_timeout(AFTER_RESTORE) {
        Ok(Ok(got)) => got,
        Ok(Err(e)) => bail!(
            "cut {mode}: the read of {name} failed after the restore: {e} (errno {:?}); \
             proxy output:\n{}",
            e.raw_os_error(),
            p.output()
        ),
        Err(_) => bail!(
            "cut {mode}: the read of {name} still waits {AFTER_RESTORE:?} after the restore; \
             proxy output:\n{}",
            p.output()
        ),
    };
    let took = restored.elapsed();
    compare_bytes(bytes, &got)
        .with_context(|| format!("cut {mode}: {name} read after the outage"))?;
    // No call below the mount gave up in the meantime (the kernel would
    // have asked again and hidden it).
    let failed_since = failed_below(p)? - failed;
    ensure!(
        failed_since == 0,
        "cut {mode}: {failed_since} calls failed below the mount during the outage, \
         expected them to wait; proxy output:\n{}",
        p.output()
    );
    let crossed = wan.down_bytes()? - down;
    ensure!(
        crossed >= bytes.len() as u64,
        "cut {mode}: only {crossed} bytes came back through the link for a {}-byte read",
        bytes.len()
    );
    Ok(took)
}

/// With `--upstream-timeout 2`: `name` (looked up and opened while the
/// link is up) is read on a thread while the link is cut in `mode`; the
/// read must still be waiting after [`BEFORE_TIMEOUT`], then fail with EIO
/// within [`FAILED_WITHIN`] of the cut. After the restore the same file
/// and `fresh` (never read) read back whole. Returns how long the failure
/// took after the cut.
fn soft_outage(
    wan: &mut Wan,
    p: &Proxy,
    mnt: &MountPoint,
    mode: &str,
    (name, bytes): (&str, &[u8]),
    (fresh, fresh_bytes): (&str, &[u8]),
) -> Result<Duration> {
    let f = File::open(mnt.path().join(name))?;
    wan.cut(mode)?;
    let cut = Instant::now();
    let rx = read_on_a_thread(f, bytes.len());
    let early = rx.recv_timeout(BEFORE_TIMEOUT);
    let ended_early = early.is_ok();
    let failed = match early {
        Err(mpsc::RecvTimeoutError::Timeout) => {
            rx.recv_timeout(FAILED_WITHIN.saturating_sub(cut.elapsed()))
        }
        other => other,
    };
    let took = cut.elapsed();
    wan.restore()?;
    match (ended_early, failed) {
        (false, Ok(Err(e))) if e.raw_os_error() == Some(libc::EIO) => {}
        (true, Ok(r)) => bail!(
            "cut {mode}, --upstream-timeout {UPSTREAM_TIMEOUT}: the read of {name} ended \
             after {took:?}, before the timeout could pass ({}); proxy output:\n{}",
            outcome(&r),
            p.output()
        ),
        (_, Ok(r)) => bail!(
            "cut {mode}, --upstream-timeout {UPSTREAM_TIMEOUT}: the read of {name} gave {} \
             after {took:?}, expected EIO; proxy output:\n{}",
            outcome(&r),
            p.output()
        ),
        (_, Err(_)) => bail!(
            "cut {mode}, --upstream-timeout {UPSTREAM_TIMEOUT}: the read of {name} still \
             waits {took:?} after the cut, expected EIO; proxy output:\n{}",
            p.output()
        ),
    }
    let again = read_within(&mnt.path().join(name), AFTER_RESTORE)
        .with_context(|| format!("cut {mode}: {name} again after the restore"))?;
    compare_bytes(bytes, &again)
        .with_context(|| format!("cut {mode}: {name} after the restore"))?;
    let got = read_within(&mnt.path().join(fresh), AFTER_RESTORE)
        .with_context(|| format!("cut {mode}: {fresh} after the restore"))?;
    compare_bytes(fresh_bytes, &got)
        .with_context(|| format!("cut {mode}: {fresh} after the restore"))?;
    Ok(took)
}

/// A mount whose upstream (nfs-ganesha, over gvfs-wanlink relays, no block
/// cache: every read goes upstream) goes away. By default the proxy waits
/// like a hard NFS mount: a read during the outage is still waiting after
/// 3 s, and completes with the right bytes once the link is back, for a
/// blackhole cut (bytes held, then delivered) and a reset cut (connections
/// reset, the proxy reconnects). With `--upstream-timeout 2` the same read
/// fails with EIO (not at once, and within 20 s), and the proxy serves
/// again after the restore.
#[test]
fn an_upstream_outage_blocks_like_a_hard_mount_then_fails_with_eio_after_the_timeout() -> Result<()>
{
    require_fuse!();
    let mut wan = Wan::start()?;
    let modes = ["blackhole", "reset"];
    let mut files = BTreeMap::new();
    for (i, mode) in modes.iter().enumerate() {
        let seed = 120 + 10 * i as u64;
        for (j, kind) in ["hard", "soft", "fresh"].iter().enumerate() {
            let name = format!("{kind}-{mode}");
            let bytes = wan.place(&name, seed + j as u64)?;
            files.insert(name, bytes);
        }
    }
    let mut timings = Vec::new();

    // Hard (the default).
    let mnt = MountPoint::new()?;
    let mut p = mounted(ProxyArgs::new(wan.upstream_url()), &mnt)?;
    let listed = fs::read_dir(mnt.path())?.count();
    ensure!(
        listed == files.len(),
        "{listed} entries listed, expected {}",
        files.len()
    );
    for mode in modes {
        let name = format!("hard-{mode}");
        let took = hard_outage(&mut wan, &p, &mnt, mode, &name, &files[&name])?;
        timings.push(format!("hard, cut {mode}: done {took:?} after the restore"));
    }
    let exit = p.terminate()?;
    ensure!(
        exit.success(),
        "exit {exit} on SIGTERM; output:\n{}",
        p.output()
    );
    drop(mnt);

    // Soft: --upstream-timeout 2.
    let mnt = MountPoint::new()?;
    let p = mounted(
        ProxyArgs::new(wan.upstream_url())
            .arg("--upstream-timeout")
            .arg(UPSTREAM_TIMEOUT),
        &mnt,
    )?;
    for mode in modes {
        let (soft, fresh) = (format!("soft-{mode}"), format!("fresh-{mode}"));
        let took = soft_outage(
            &mut wan,
            &p,
            &mnt,
            mode,
            (&soft, &files[&soft]),
            (&fresh, &files[&fresh]),
        )?;
        timings.push(format!(
            "--upstream-timeout {UPSTREAM_TIMEOUT}, cut {mode}: EIO {took:?} after the cut"
        ));
    }
    eprintln!("{}", timings.join("\n"));
    Ok(())
}

// ---------------------------------------------------------------------------
// Credentials.

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

/// The mount's counters from `gvfsctl status --json`.
fn mount_stat(p: &Proxy, key: &str) -> Result<u64> {
    p.status()?["mount"][key]
        .as_u64()
        .with_context(|| format!("no mount.{key} in gvfsctl status"))
}

/// A listing hands the kernel every entry's attributes and node
/// (READDIRPLUS): `ls -l` of 1,000 files needs no LOOKUP per name, and
/// every node it handed out is forgotten again when the kernel drops its
/// inodes (no node kept too long, none dropped too early: each file still
/// reads right after).
#[test]
fn listings_carry_attributes_and_every_node_is_forgotten() -> Result<()> {
    require_fuse!();
    let origin = tempfile::tempdir()?;
    let dir = origin.path().join("many");
    fs::create_dir(&dir)?;
    for i in 0..1000 {
        fs::write(
            dir.join(format!("entry-with-a-longer-name-{i:04}")),
            i.to_string(),
        )?;
    }
    let mnt = MountPoint::new()?;
    let p = mounted(ProxyArgs::dir(origin.path()), &mnt)?;
    let baseline = mount_stat(&p, "inodes")?;
    let calls = mount_stat(&p, "calls")?;
    let listed = mnt.path().join("many");
    let mut sizes = 0;
    for e in fs::read_dir(&listed)? {
        let e = e?;
        sizes += e.metadata()?.len();
    }
    let expected: u64 = (0..1000).map(|i: u64| i.to_string().len() as u64).sum();
    ensure!(
        sizes == expected,
        "sizes listed {sizes}, expected {expected}"
    );
    let spent = mount_stat(&p, "calls")? - calls;
    ensure!(
        spent < 100,
        "listing and stat-ing 1,000 names took {spent} calls: a LOOKUP per name"
    );
    ensure!(
        mount_stat(&p, "inodes")? >= baseline + 1000,
        "the listing handed out no nodes"
    );
    // The kernel drops its dentries and inodes: it forgets every node.
    let mut left = u64::MAX;
    for _ in 0..50 {
        drop_caches();
        left = mount_stat(&p, "inodes")?;
        if left <= baseline + 1 {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    ensure!(
        left <= baseline + 1,
        "{left} nodes left after the kernel dropped its inodes (from {baseline}): some never forgotten"
    );
    for i in [0, 517, 999] {
        let got = fs::read_to_string(listed.join(format!("entry-with-a-longer-name-{i:04}")))?;
        ensure!(got == i.to_string(), "entry {i} reads {got:?}");
    }
    Ok(())
}
