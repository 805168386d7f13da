//! The operations, as async functions over the stack: each FUSE request
//! becomes NFSv3 calls on [`Core::top`], as the Linux NFS client would
//! make them, and its answer or errno.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fuser::{Errno, FileAttr};
use gvfs_nfs::layer::{fh3, lock};
use gvfs_nfs::{CallContext, NfsReply, NfsRequest, NfsService};
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::Opaque;

use crate::attr::{Changes, file_attr};
use crate::errno::{errno, service_errno};
use crate::inodes::{Handle, Inodes, Refused};
use crate::journal::Journal;
use crate::stats::{Counters, FuseStats};
use crate::trace::{ReadTrace, unix_micros};
use crate::writes::{Uncommitted, Write};

pub(crate) use crate::limits::{MAX_OPEN, NAME_MAX};
/// How often, and how long at most between, a call the server answered
/// JUKEBOX (try again later) is sent again.
const JUKEBOX_TRIES: u32 = 20;
const JUKEBOX_WAIT_MAX: Duration = Duration::from_secs(2);

/// Shorthand for an operation's outcome.
pub(crate) type Res<T> = Result<T, Errno>;

/// How the kernel caches an open file's pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Paging {
    /// It may keep the pages it has (the file's size, mtime and ctime are
    /// those of its last open).
    pub(crate) keep: bool,
    /// It keeps none: reads and writes go to the stack as they come.
    pub(crate) direct: bool,
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
    /// Bytes of listings kept (see [`Listing`](listing::Listing)).
    listing_bytes: AtomicU64,
    /// One commit of a file at a time, so that writes sent again go in
    /// order; files are committed side by side.
    commit_locks: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<()>>>>,
    /// How long the kernel may keep names and attributes.
    pub(crate) ttl: Duration,
    pub(crate) counters: Counters,
    /// Where reads are traced, if anywhere (`MountOptions::trace`).
    pub(crate) trace: Option<ReadTrace>,
    /// Where nodes, opens and hidden files are recorded for a process
    /// taking the session over, if anywhere (`MountOptions::state_dir`).
    journal: Option<Arc<Journal>>,
    /// Whether the kernel offered FUSE_HAS_RESEND at INIT.
    pub(crate) resend_offered: AtomicBool,
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
mod held;
mod io;
mod listing;
mod opens;

use held::{Hidden, Open};

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
            journal: None,
            resend_offered: AtomicBool::new(false),
        }
    }

    /// Records nodes, opens and hidden files in `journal` from now on
    /// (before the session serves a request).
    pub(crate) fn with_journal(mut self, journal: Arc<Journal>) -> Self {
        lock(&self.inodes).set_journal(Some(journal.clone()));
        self.journal = Some(journal);
        self
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
        let ino = lock(&self.inodes).remember(&fh, a.fileid);
        self.compact_if_due();
        Ok(file_attr(refused_errno(ino)?, &a))
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

    pub(crate) fn forget(&self, ino: u64, n: u64) {
        lock(&self.inodes).forget(ino, n);
        self.compact_if_due();
    }
}

/// A node id, or the errno of a hand-out refused: ENFILE for a full
/// table, EIO for one the journal could not record (the kernel must not
/// hold an id the journal lacks).
fn refused_errno(ino: Result<u64, Refused>) -> Res<u64> {
    ino.map_err(|r| match r {
        Refused::Full => {
            tracing::warn!(max = Inodes::MAX, "the FUSE inode table is full");
            Errno::ENFILE
        }
        Refused::Unrecorded => Errno::EIO,
    })
}

#[cfg(test)]
mod tests;
