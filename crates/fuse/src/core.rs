//! The operations, as async functions over the stack: each FUSE request
//! becomes NFSv3 calls on [`Core::top`], as the Linux NFS client would
//! make them, and its answer or errno.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fuser::{Errno, FileAttr};
use gvfs_nfs::layer::{fh3, lock};
use gvfs_nfs::{CallContext, NfsReply, NfsRequest, NfsService};
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::Opaque;

use crate::attr::{Changes, file_attr, stamp};
use crate::errno::{errno, service_errno};
use crate::inodes::{Handle, Inodes};
use crate::stats::{Counters, FuseStats};
use crate::trace::{ReadTrace, unix_micros};
use crate::writes::{Uncommitted, Write};

/// Longest name in a directory, as a local file system allows.
pub(crate) const NAME_MAX: usize = 255;
/// Most open files and directories at once.
pub(crate) const MAX_OPEN: usize = 65_536;
/// How often, and how long at most between, a call the server answered
/// JUKEBOX (try again later) is sent again.
const JUKEBOX_TRIES: u32 = 20;
const JUKEBOX_WAIT_MAX: Duration = Duration::from_secs(2);

/// Shorthand for an operation's outcome.
pub(crate) type Res<T> = Result<T, Errno>;

/// An open file or directory.
#[derive(Debug)]
struct Open {
    ino: u64,
    /// The opener's credentials: reads and writes through the file are
    /// sent with them, as the kernel NFS client does (so the kernel's own
    /// write-back of mapped pages is written as the opener).
    cx: CallContext,
    /// A directory's cookie verifier, from its last READDIRPLUS.
    verf: [u8; 8],
    /// The part of a directory's last READDIRPLUS the kernel did not take
    /// yet (its reply buffer was full): the next page, without a call.
    listing: Option<Listing>,
}

/// How the kernel caches an open file's pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Paging {
    /// It may keep the pages it has (the file's size, mtime and ctime are
    /// those of its last open).
    pub(crate) keep: bool,
    /// It keeps none: reads and writes go to the stack as they come.
    pub(crate) direct: bool,
}

/// A file removed while it was open: renamed to a hidden name instead,
/// and removed at its last close (the NFS client's "silly rename").
#[derive(Debug)]
struct Hidden {
    dir: Handle,
    name: Vec<u8>,
    cx: CallContext,
}

/// What every request shares.
pub(crate) struct Core {
    pub(crate) top: Arc<dyn NfsService>,
    pub(crate) inodes: Mutex<Inodes>,
    opens: Mutex<HashMap<u64, Open>>,
    open_count: Mutex<HashMap<u64, u32>>,
    hidden: Mutex<HashMap<u64, Hidden>>,
    next_fh: AtomicU64,
    pub(crate) uncommitted: Uncommitted,
    /// Bytes of listings kept (see [`Listing`]).
    listing_bytes: AtomicU64,
    /// One commit of a file at a time, so that writes sent again go in
    /// order; files are committed side by side.
    commit_locks: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<()>>>>,
    /// How long the kernel may keep names and attributes.
    pub(crate) ttl: Duration,
    pub(crate) counters: Counters,
    /// Where reads are traced, if anywhere (`MountOptions::trace`).
    pub(crate) trace: Option<ReadTrace>,
}

/// The success arm of a result, or its status as an errno.
fn ok<T, E>(r: Nfs3Result<T, E>) -> Res<T> {
    match r {
        Nfs3Result::Ok(v) => Ok(v),
        Nfs3Result::Err((status, _)) => Err(errno(status)),
    }
}

/// A reply of the kind the call asked for, or EIO.
macro_rules! reply {
    ($reply:expr, $variant:ident) => {
        match $reply {
            NfsReply::$variant(r) => ok(r),
            _ => Err(Errno::EIO),
        }
    };
}

fn name3(name: &[u8]) -> Res<filename3<'static>> {
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok(filename3(Opaque::owned(name.to_vec())))
}

fn dirop(dir: &Handle, name: &[u8]) -> Res<diropargs3<'static>> {
    Ok(diropargs3 {
        dir: fh3(dir),
        name: name3(name)?,
    })
}

mod dir;
mod io;
mod listing;

use listing::Listing;

impl Core {
    pub(crate) fn new(
        top: Arc<dyn NfsService>,
        root: &[u8],
        root_attr: &fattr3,
        ttl: Duration,
        trace: Option<ReadTrace>,
    ) -> Self {
        Self {
            top,
            inodes: Mutex::new(Inodes::new(root, root_attr.fileid)),
            opens: Mutex::new(HashMap::new()),
            open_count: Mutex::new(HashMap::new()),
            hidden: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            uncommitted: Uncommitted::new(Uncommitted::BUDGET),
            listing_bytes: AtomicU64::new(0),
            commit_locks: Mutex::new(HashMap::new()),
            ttl,
            counters: Counters::default(),
            trace,
        }
    }

    /// The counters and gauges now.
    pub(crate) fn stats(&self) -> FuseStats {
        FuseStats {
            counts: self.counters.snapshot(),
            inodes: lock(&self.inodes).len() as u64,
            open: lock(&self.opens).len() as u64,
            uncommitted_bytes: self.uncommitted.bytes(),
            ..FuseStats::default()
        }
    }

    /// One call down the stack, its request made by `make`; a JUKEBOX
    /// answer is waited out and the call made again, as the NFS client
    /// does.
    async fn call(&self, cx: &CallContext, make: impl Fn() -> Res<NfsRequest>) -> Res<NfsReply> {
        self.counters.calls.inc();
        let mut wait = Duration::from_millis(50);
        let mut tries = 1;
        loop {
            match self.top.call(cx, make()?).await {
                Ok(r) if r.status() == nfsstat3::NFS3ERR_JUKEBOX && tries < JUKEBOX_TRIES => {
                    tries += 1;
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(JUKEBOX_WAIT_MAX);
                }
                Ok(r) => return Ok(r),
                Err(e) => {
                    self.counters.failed.inc();
                    tracing::debug!(error = %e, "a FUSE call failed below");
                    return Err(service_errno(&e));
                }
            }
        }
    }

    pub(crate) fn handle(&self, ino: u64) -> Res<Handle> {
        lock(&self.inodes).handle(ino).ok_or(Errno::ESTALE)
    }

    async fn getattr_fh(&self, cx: &CallContext, fh: &Handle) -> Res<fattr3> {
        let r = reply!(
            self.call(cx, || Ok(NfsRequest::Getattr(GETATTR3args {
                object: fh3(fh)
            })))
            .await?,
            Getattr
        )?;
        Ok(r.obj_attributes)
    }

    async fn attrs_or_get(&self, cx: &CallContext, fh: &Handle, a: post_op_attr) -> Res<fattr3> {
        match a {
            Nfs3Option::Some(a) => Ok(a),
            Nfs3Option::None => self.getattr_fh(cx, fh).await,
        }
    }

    /// Hands a new entry to the kernel: its node id and attributes.
    async fn entry(&self, cx: &CallContext, fh: nfs_fh3, a: post_op_attr) -> Res<FileAttr> {
        let fh: Handle = fh.data.as_ref().into();
        let a = self.attrs_or_get(cx, &fh, a).await?;
        let ino = lock(&self.inodes).remember(&fh, a.fileid).map_err(|_| {
            tracing::warn!(max = Inodes::MAX, "the FUSE inode table is full");
            Errno::ENFILE
        })?;
        Ok(file_attr(ino, &a))
    }

    /// A new object's entry, from a CREATE, MKDIR, SYMLINK or MKNOD reply;
    /// looked up by name when the server sent no handle.
    async fn made(
        &self,
        cx: &CallContext,
        dir: &Handle,
        name: &[u8],
        obj: post_op_fh3,
        a: post_op_attr,
    ) -> Res<FileAttr> {
        match obj {
            Nfs3Option::Some(fh) => self.entry(cx, fh, a).await,
            Nfs3Option::None => self.lookup_fh(cx, dir, name).await,
        }
    }

    async fn lookup_fh(&self, cx: &CallContext, dir: &Handle, name: &[u8]) -> Res<FileAttr> {
        let r = reply!(
            self.call(cx, || Ok(NfsRequest::Lookup(LOOKUP3args {
                what: dirop(dir, name)?
            })))
            .await?,
            Lookup
        )?;
        self.entry(cx, r.object, r.obj_attributes).await
    }

    pub(crate) async fn lookup(&self, cx: &CallContext, parent: u64, name: &[u8]) -> Res<FileAttr> {
        let dir = self.handle(parent)?;
        self.lookup_fh(cx, &dir, name).await
    }

    pub(crate) async fn getattr(&self, cx: &CallContext, ino: u64) -> Res<FileAttr> {
        let fh = self.handle(ino)?;
        Ok(file_attr(ino, &self.getattr_fh(cx, &fh).await?))
    }

    pub(crate) async fn setattr(
        &self,
        cx: &CallContext,
        ino: u64,
        fh_open: Option<u64>,
        c: Changes,
    ) -> Res<FileAttr> {
        let fh = self.handle(ino)?;
        // A truncation or a time set comes after the writes before it,
        // as the kernel client flushes first.
        if (c.size.is_some() || c.mtime.is_some()) && self.uncommitted.has(ino) {
            self.commit(ino).await?;
        }
        let cx = match fh_open.and_then(|h| self.opener(h)) {
            Some(opener) if c.size.is_some() => opener,
            _ => cx.clone(),
        };
        let sattr = c.sattr().map_err(|_| Errno::EINVAL)?;
        let r = reply!(
            self.call(&cx, || Ok(NfsRequest::Setattr(SETATTR3args {
                object: fh3(&fh),
                new_attributes: sattr.clone(),
                guard: Nfs3Option::None
            })))
            .await?,
            Setattr
        )?;
        let a = self.attrs_or_get(&cx, &fh, r.obj_wcc.after).await?;
        Ok(file_attr(ino, &a))
    }

    pub(crate) async fn readlink(&self, cx: &CallContext, ino: u64) -> Res<Vec<u8>> {
        let fh = self.handle(ino)?;
        let r = reply!(
            self.call(cx, || Ok(NfsRequest::Readlink(READLINK3args {
                symlink: fh3(&fh)
            })))
            .await?,
            Readlink
        )?;
        Ok(r.data.0.into_owned())
    }

    pub(crate) async fn mknod(
        &self,
        cx: &CallContext,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u32,
    ) -> Res<FileAttr> {
        let dir = self.handle(parent)?;
        let attrs = Changes::mode(mode).sattr().map_err(|_| Errno::EINVAL)?;
        let (major, minor) = (libc::major(rdev.into()), libc::minor(rdev.into()));
        let spec = || specdata3 {
            specdata1: major,
            specdata2: minor,
        };
        let what = || match mode & libc::S_IFMT {
            libc::S_IFIFO => Ok(mknoddata3::NF3FIFO(attrs.clone())),
            libc::S_IFSOCK => Ok(mknoddata3::NF3SOCK(attrs.clone())),
            libc::S_IFCHR => Ok(mknoddata3::NF3CHR(devicedata3 {
                dev_attributes: attrs.clone(),
                spec: spec(),
            })),
            libc::S_IFBLK => Ok(mknoddata3::NF3BLK(devicedata3 {
                dev_attributes: attrs.clone(),
                spec: spec(),
            })),
            _ => Err(Errno::EINVAL),
        };
        if mode & libc::S_IFMT == libc::S_IFREG {
            let (h, attr, _) = self.create(cx, parent, name, mode, libc::O_EXCL).await?;
            self.release(h).await?;
            return Ok(attr);
        }
        let r = reply!(
            self.call(cx, || Ok(NfsRequest::Mknod(MKNOD3args {
                where_: dirop(&dir, name)?,
                what: what()?
            })))
            .await?,
            Mknod
        )?;
        self.made(cx, &dir, name, r.obj, r.obj_attributes).await
    }

    pub(crate) async fn mkdir(
        &self,
        cx: &CallContext,
        parent: u64,
        name: &[u8],
        mode: u32,
    ) -> Res<FileAttr> {
        let dir = self.handle(parent)?;
        let attributes = Changes::mode(mode).sattr().map_err(|_| Errno::EINVAL)?;
        let r = reply!(
            self.call(cx, || Ok(NfsRequest::Mkdir(MKDIR3args {
                where_: dirop(&dir, name)?,
                attributes: attributes.clone()
            })))
            .await?,
            Mkdir
        )?;
        self.made(cx, &dir, name, r.obj, r.obj_attributes).await
    }

    pub(crate) async fn symlink(
        &self,
        cx: &CallContext,
        parent: u64,
        name: &[u8],
        target: &[u8],
    ) -> Res<FileAttr> {
        let dir = self.handle(parent)?;
        let symlink = || -> Res<symlinkdata3<'static>> {
            Ok(symlinkdata3 {
                symlink_attributes: Changes::default().sattr().map_err(|_| Errno::EINVAL)?,
                symlink_data: nfspath3(Opaque::owned(target.to_vec())),
            })
        };
        let r = reply!(
            self.call(cx, || Ok(NfsRequest::Symlink(SYMLINK3args {
                where_: dirop(&dir, name)?,
                symlink: symlink()?
            })))
            .await?,
            Symlink
        )?;
        self.made(cx, &dir, name, r.obj, r.obj_attributes).await
    }

    pub(crate) async fn link(
        &self,
        cx: &CallContext,
        ino: u64,
        parent: u64,
        name: &[u8],
    ) -> Res<FileAttr> {
        let fh = self.handle(ino)?;
        let dir = self.handle(parent)?;
        let r = reply!(
            self.call(cx, || Ok(NfsRequest::Link(LINK3args {
                file: fh3(&fh),
                link: dirop(&dir, name)?
            })))
            .await?,
            Link
        )?;
        self.entry(cx, fh3(&fh), r.file_attributes).await
    }

    pub(crate) async fn unlink(&self, cx: &CallContext, parent: u64, name: &[u8]) -> Res<()> {
        let dir = self.handle(parent)?;
        if self.hide_if_open(cx, &dir, name).await? {
            return Ok(());
        }
        reply!(
            self.call(cx, || Ok(NfsRequest::Remove(REMOVE3args {
                object: dirop(&dir, name)?
            })))
            .await?,
            Remove
        )?;
        Ok(())
    }

    pub(crate) async fn rmdir(&self, cx: &CallContext, parent: u64, name: &[u8]) -> Res<()> {
        let dir = self.handle(parent)?;
        reply!(
            self.call(cx, || Ok(NfsRequest::Rmdir(RMDIR3args {
                object: dirop(&dir, name)?
            })))
            .await?,
            Rmdir
        )?;
        Ok(())
    }

    pub(crate) async fn rename(
        &self,
        cx: &CallContext,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
    ) -> Res<()> {
        let from = self.handle(parent)?;
        let to = self.handle(newparent)?;
        if flags & libc::RENAME_EXCHANGE != 0
            || flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0
        {
            return Err(Errno::EINVAL);
        }
        if flags & libc::RENAME_NOREPLACE != 0 {
            match self.lookup_handle(cx, &to, newname).await {
                Ok(_) => return Err(Errno::EEXIST),
                Err(e) if e == Errno::ENOENT => {}
                Err(e) => return Err(e),
            }
        } else {
            // A file renamed over while open stays readable, as a removed one.
            self.hide_if_open(cx, &to, newname).await?;
        }
        reply!(
            self.call(cx, || Ok(NfsRequest::Rename(RENAME3args {
                from: dirop(&from, name)?,
                to: dirop(&to, newname)?
            })))
            .await?,
            Rename
        )?;
        Ok(())
    }

    async fn lookup_handle(&self, cx: &CallContext, dir: &Handle, name: &[u8]) -> Res<Handle> {
        let r = reply!(
            self.call(cx, || Ok(NfsRequest::Lookup(LOOKUP3args {
                what: dirop(dir, name)?
            })))
            .await?,
            Lookup
        )?;
        Ok(r.object.data.as_ref().into())
    }

    /// If `name` in `dir` is a file open through this mount, renames it to
    /// a hidden name (removed at its last close) and says so.
    async fn hide_if_open(&self, cx: &CallContext, dir: &Handle, name: &[u8]) -> Res<bool> {
        if lock(&self.open_count).is_empty() {
            return Ok(false);
        }
        let fh = match self.lookup_handle(cx, dir, name).await {
            Ok(fh) => fh,
            Err(_) => return Ok(false),
        };
        let Some(ino) = lock(&self.inodes).ino_of(&fh) else {
            return Ok(false);
        };
        if !lock(&self.open_count).contains_key(&ino) || lock(&self.hidden).contains_key(&ino) {
            return Ok(false);
        }
        let hidden = format!(
            ".gvfs-fuse{:016x}",
            self.next_fh.fetch_add(1, Ordering::Relaxed)
        )
        .into_bytes();
        reply!(
            self.call(cx, || Ok(NfsRequest::Rename(RENAME3args {
                from: dirop(dir, name)?,
                to: dirop(dir, &hidden)?
            })))
            .await?,
            Rename
        )?;
        let h = Hidden {
            dir: dir.clone(),
            name: hidden,
            cx: cx.clone(),
        };
        // The last close may have come while the rename was on its way (the
        // kernel sends RELEASE after close() has returned, and an unlink
        // right after it can pass it): decided under the open counts' lock,
        // which `release` decides the last close under.
        let h = {
            let counts = lock(&self.open_count);
            if counts.contains_key(&ino) {
                lock(&self.hidden).insert(ino, h);
                None
            } else {
                Some(h)
            }
        };
        if let Some(h) = h {
            self.remove_hidden_file(&h).await?;
        }
        Ok(true)
    }

    /// Removes hidden file `h` upstream.
    async fn remove_hidden_file(&self, h: &Hidden) -> Res<()> {
        reply!(
            self.call(&h.cx, || Ok(NfsRequest::Remove(REMOVE3args {
                object: dirop(&h.dir, &h.name)?
            })))
            .await?,
            Remove
        )?;
        Ok(())
    }

    /// ACCESS for `want` (ACCESS3 bits): granted or EACCES. Returns the
    /// file's attributes when the server sent them.
    async fn check_access(&self, cx: &CallContext, fh: &Handle, want: u32) -> Res<post_op_attr> {
        let r = reply!(
            self.call(cx, || Ok(NfsRequest::Access(ACCESS3args {
                object: fh3(fh),
                access: want
            })))
            .await?,
            Access
        )?;
        if r.access & want != want {
            return Err(Errno::EACCES);
        }
        Ok(r.obj_attributes)
    }

    pub(crate) async fn access(&self, cx: &CallContext, ino: u64, mask: i32) -> Res<()> {
        let fh = self.handle(ino)?;
        if mask == libc::F_OK {
            self.getattr_fh(cx, &fh).await?;
            return Ok(());
        }
        let mut want = 0;
        if mask & libc::R_OK != 0 {
            want |= ACCESS3_READ;
        }
        if mask & libc::W_OK != 0 {
            want |= ACCESS3_MODIFY;
        }
        let r = reply!(
            self.call(cx, || Ok(NfsRequest::Access(ACCESS3args {
                object: fh3(&fh),
                access: want | ACCESS3_LOOKUP | ACCESS3_EXECUTE
            })))
            .await?,
            Access
        )?;
        if r.access & want != want {
            return Err(Errno::EACCES);
        }
        if mask & libc::X_OK != 0 {
            let a = self.attrs_or_get(cx, &fh, r.obj_attributes).await?;
            let bit = if a.type_ == ftype3::NF3DIR {
                ACCESS3_LOOKUP
            } else {
                ACCESS3_EXECUTE
            };
            if r.access & bit == 0 {
                return Err(Errno::EACCES);
            }
        }
        Ok(())
    }

    /// Opens `ino` for the access `flags` ask, checked by the server (the
    /// kernel NFS client's ACCESS at open). Returns the file handle and
    /// how the kernel caches its pages.
    pub(crate) async fn open(&self, cx: &CallContext, ino: u64, flags: i32) -> Res<(u64, Paging)> {
        let fh = self.handle(ino)?;
        let want = match flags & libc::O_ACCMODE {
            libc::O_WRONLY => ACCESS3_MODIFY,
            libc::O_RDWR => ACCESS3_READ | ACCESS3_MODIFY,
            _ => ACCESS3_READ,
        };
        let a = self.check_access(cx, &fh, want).await?;
        let a = self.attrs_or_get(cx, &fh, a).await?;
        let keep = lock(&self.inodes).opened(ino, stamp(&a));
        let h = self.add_open(ino, cx)?;
        Ok((
            h,
            Paging {
                keep,
                direct: self.writes_only(ino, flags),
            },
        ))
    }

    /// Whether an open of `ino` with `flags` is its only one and writes
    /// only: its writes then go to the stack without the kernel copying
    /// them into cached pages first, which nobody would read (a file
    /// opened for writing only cannot be mapped), and which slow every
    /// later copy once the page cache is full of them.
    fn writes_only(&self, ino: u64, flags: i32) -> bool {
        flags & libc::O_ACCMODE == libc::O_WRONLY
            && lock(&self.open_count).get(&ino).copied() == Some(1)
    }

    pub(crate) fn opendir(&self, cx: &CallContext, ino: u64) -> Res<u64> {
        self.handle(ino)?;
        self.add_open(ino, cx)
    }

    fn add_open(&self, ino: u64, cx: &CallContext) -> Res<u64> {
        let mut opens = lock(&self.opens);
        if opens.len() >= MAX_OPEN {
            return Err(Errno::ENFILE);
        }
        let h = self.next_fh.fetch_add(1, Ordering::Relaxed);
        opens.insert(
            h,
            Open {
                ino,
                cx: cx.clone(),
                verf: [0; 8],
                listing: None,
            },
        );
        *lock(&self.open_count).entry(ino).or_insert(0) += 1;
        Ok(h)
    }

    fn opener(&self, h: u64) -> Option<CallContext> {
        lock(&self.opens).get(&h).map(|o| o.cx.clone())
    }

    /// The opener's context for I/O through `h`, else the caller's.
    fn io_context(&self, h: u64, caller: &CallContext) -> CallContext {
        self.opener(h).unwrap_or_else(|| caller.clone())
    }

    /// Closes `h`; the last close of a hidden file removes it.
    pub(crate) async fn release(&self, h: u64) -> Res<()> {
        let Some(open) = lock(&self.opens).remove(&h) else {
            return Ok(());
        };
        if let Some(l) = &open.listing {
            self.listing_bytes.fetch_sub(l.bytes, Ordering::Relaxed);
        }
        let last = {
            let mut counts = lock(&self.open_count);
            match counts.get_mut(&open.ino) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                _ => {
                    counts.remove(&open.ino);
                    true
                }
            }
        };
        if !last {
            return Ok(());
        }
        if self.uncommitted.has(open.ino) {
            self.commit(open.ino).await?;
        }
        let hidden = lock(&self.hidden).remove(&open.ino);
        if let Some(h) = hidden {
            self.remove_hidden_file(&h).await?;
        }
        Ok(())
    }

    pub(crate) async fn create(
        &self,
        cx: &CallContext,
        parent: u64,
        name: &[u8],
        mode: u32,
        flags: i32,
    ) -> Res<(u64, FileAttr, Paging)> {
        let exclusive = flags & libc::O_EXCL != 0;
        let dir = self.handle(parent)?;
        let attrs = Changes::mode(mode).sattr().map_err(|_| Errno::EINVAL)?;
        let how = || {
            if exclusive {
                createhow3::GUARDED(attrs.clone())
            } else {
                createhow3::UNCHECKED(attrs.clone())
            }
        };
        let r = reply!(
            self.call(cx, || Ok(NfsRequest::Create(CREATE3args {
                where_: dirop(&dir, name)?,
                how: how()
            })))
            .await?,
            Create
        )?;
        let attr = self.made(cx, &dir, name, r.obj, r.obj_attributes).await?;
        let ino = attr.ino.0;
        let h = match self.add_open(ino, cx) {
            Ok(h) => h,
            Err(e) => {
                lock(&self.inodes).forget(ino, 1);
                return Err(e);
            }
        };
        let paging = Paging {
            keep: false,
            direct: self.writes_only(ino, flags),
        };
        Ok((h, attr, paging))
    }

    pub(crate) async fn statfs(&self, cx: &CallContext, ino: u64) -> Res<FSSTAT3resok> {
        let fh = self.handle(ino)?;
        reply!(
            self.call(cx, || Ok(NfsRequest::Fsstat(FSSTAT3args {
                fsroot: fh3(&fh)
            })))
            .await?,
            Fsstat
        )
    }

    /// Removes the files hidden because they were removed while open
    /// and are still open (at unmount: nobody can close them now).
    pub(crate) async fn remove_hidden(&self) {
        let hidden: Vec<Hidden> = lock(&self.hidden).drain().map(|(_, h)| h).collect();
        for h in hidden {
            if let Err(e) = self.remove_hidden_file(&h).await {
                tracing::warn!(name = %String::from_utf8_lossy(&h.name), error = ?e, "cannot remove a hidden file");
            }
        }
    }

    pub(crate) fn forget(&self, ino: u64, n: u64) {
        lock(&self.inodes).forget(ino, n);
    }
}

#[cfg(test)]
mod tests;
