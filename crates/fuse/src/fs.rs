//! The FUSE side: fuser's [`Filesystem`], each request run as a task on
//! the proxy's runtime against [`Core`], and answered when it is done.
//!
//! fuser reads requests on a few threads; a request is handed to the
//! runtime and the thread goes back for the next, so slow calls (a WAN,
//! an upstream outage) run side by side. At most [`MAX_IN_FLIGHT`] run
//! at once: past that the reading threads wait, and so do the processes
//! calling, as on a hard NFS mount.

use std::ffi::OsStr;
use std::future::Future;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, Filesystem,
    FopenFlags, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyBmap, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};
use tokio::runtime::Handle as Runtime;
use tokio::sync::Semaphore;

use crate::attr::Changes;
use crate::core::{Core, NAME_MAX, Paging};
use crate::creds::Groups;

/// Requests running at once.
pub(crate) const MAX_IN_FLIGHT: usize = 128;
/// The largest READ and WRITE the kernel is asked to send, and its
/// read-ahead: one NFS READ or WRITE of the stack's largest.
pub(crate) const MAX_IO: u32 = gvfs_nfs::proc::MAX_DATA;

/// The file system fuser serves.
pub(crate) struct Fs {
    core: Arc<Core>,
    runtime: Runtime,
    slots: Arc<Semaphore>,
    groups: Groups,
    /// The read-ahead asked of the kernel (bytes).
    read_ahead: u32,
}

impl Fs {
    pub(crate) fn new(
        core: Arc<Core>,
        runtime: Runtime,
        slots: Arc<Semaphore>,
        read_ahead: u32,
    ) -> Self {
        Self {
            core,
            runtime,
            slots,
            read_ahead,
            groups: Groups::default(),
        }
    }

    fn cx(&self, req: &Request) -> gvfs_nfs::CallContext {
        if crate::takeover::is_resent(req.unique().0) {
            self.core.counters.resent_requests.inc();
        }
        self.groups.context(req.uid(), req.gid(), req.pid())
    }

    /// Runs `op` on the runtime once a slot is free. A request whose task
    /// never answers (it cannot: every arm answers) would get EIO from
    /// fuser when its reply is dropped.
    fn spawn<F, Fut>(&self, op: F)
    where
        F: FnOnce(Arc<Core>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let permit = match self.slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => match self.runtime.block_on(self.slots.clone().acquire_owned()) {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let fut = op(self.core.clone());
        self.runtime.spawn(async move {
            let _slot = permit;
            fut.await;
        });
    }
}

fn bytes(name: &OsStr) -> Vec<u8> {
    name.as_bytes().to_vec()
}

impl Filesystem for Fs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Whether a process taking the session over may ask the kernel to
        // send again what the dead one had read (FUSE_NOTIFY_RESEND).
        let resend = config.capabilities().contains(InitFlags::FUSE_HAS_RESEND);
        self.core
            .resend_offered
            .store(resend, std::sync::atomic::Ordering::Relaxed);
        if let Err(max) = config.set_max_readahead(self.read_ahead.min(MAX_IO)) {
            let _ = config.set_max_readahead(max);
        }
        if let Err(max) = config.set_max_write(MAX_IO) {
            let _ = config.set_max_write(max);
        }
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        // The kernel drops its cached pages of a file whose mtime or size
        // changed when it next sees its attributes, as an NFS client does;
        // lookups and readdirs of one directory may run at once.
        // Listings always carry attributes and nodes (READDIRPLUS): the
        // stack is asked READDIRPLUS anyway (for the entries' types), and
        // `ls -l` or a VM monitor's scan then needs no LOOKUP per name. The
        // kernel's adaptive mode would use it for a directory's first page
        // only when the names are looked up after the whole listing.
        for flag in [
            InitFlags::FUSE_AUTO_INVAL_DATA,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_DO_READDIRPLUS,
        ] {
            let _ = config.add_capabilities(flag);
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let (cx, name) = (self.cx(req), bytes(name));
        self.spawn(move |core| async move {
            let done = core.lookup(&cx, parent.0, &name).await;
            entry(reply, &core.ttl, done)
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.core.forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let cx = self.cx(req);
        self.spawn(move |core| async move {
            let done = core.getattr(&cx, ino.0).await;
            attr(reply, &core.ttl, done)
        });
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let cx = self.cx(req);
        let changes = Changes {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
        };
        self.spawn(move |core| async move {
            let done = core.setattr(&cx, ino.0, fh.map(|h| h.0), changes).await;
            attr(reply, &core.ttl, done)
        });
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let cx = self.cx(req);
        self.spawn(move |core| async move {
            match core.readlink(&cx, ino.0).await {
                Ok(target) => reply.data(&target),
                Err(e) => reply.error(e),
            }
        });
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let (cx, name) = (self.cx(req), bytes(name));
        self.spawn(move |core| async move {
            let done = core.mknod(&cx, parent.0, &name, mode & !umask, rdev).await;
            entry(reply, &core.ttl, done)
        });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let (cx, name) = (self.cx(req), bytes(name));
        self.spawn(move |core| async move {
            let done = core.mkdir(&cx, parent.0, &name, mode & !umask).await;
            entry(reply, &core.ttl, done)
        });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (cx, name) = (self.cx(req), bytes(name));
        self.spawn(
            move |core| async move { answer(reply, core.unlink(&cx, parent.0, &name).await) },
        );
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (cx, name) = (self.cx(req), bytes(name));
        self.spawn(
            move |core| async move { answer(reply, core.rmdir(&cx, parent.0, &name).await) },
        );
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let (cx, name) = (self.cx(req), bytes(link_name));
        let target = target.as_os_str().as_bytes().to_vec();
        self.spawn(move |core| async move {
            let done = core.symlink(&cx, parent.0, &name, &target).await;
            entry(reply, &core.ttl, done)
        });
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (cx, name, newname) = (self.cx(req), bytes(name), bytes(newname));
        let flags = flags.bits();
        self.spawn(move |core| async move {
            let done = core
                .rename(&cx, parent.0, &name, newparent.0, &newname, flags)
                .await;
            answer(reply, done)
        });
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let (cx, name) = (self.cx(req), bytes(newname));
        self.spawn(move |core| async move {
            let done = core.link(&cx, ino.0, newparent.0, &name).await;
            entry(reply, &core.ttl, done)
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let cx = self.cx(req);
        self.spawn(move |core| async move {
            match core.open(&cx, ino.0, flags.0).await {
                Ok((h, paging)) => reply.opened(FileHandle(h), open_flags(paging)),
                Err(e) => reply.error(e),
            }
        });
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let cx = self.cx(req);
        self.spawn(move |core| async move {
            match core.read(&cx, ino.0, fh.0, offset, size).await {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(e),
            }
        });
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let (cx, data) = (self.cx(req), self.core.write_buffer(data));
        self.spawn(move |core| async move {
            match core.write(&cx, ino.0, fh.0, offset, data).await {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(e),
            }
        });
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2): the file's writes are committed, and a failure is the
        // close's error (close-to-open, as on an NFS mount).
        self.spawn(move |core| async move { answer(reply, core.commit(ino.0).await) });
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.spawn(move |core| async move { answer(reply, core.release(fh.0).await) });
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.spawn(move |core| async move { answer(reply, core.commit(ino.0).await) });
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.core.opendir(&self.cx(req), ino.0) {
            Ok(h) => reply.opened(FileHandle(h), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let cx = self.cx(req);
        self.spawn(move |core| async move {
            match core.readdir(&cx, ino.0, fh.0, offset).await {
                Ok((entries, eof)) => {
                    core.fill_listing(fh.0, offset, entries, eof, |e| {
                        reply.add(INodeNo(e.ino), e.next, e.kind, OsStr::from_bytes(&e.name))
                    });
                    reply.ok();
                }
                Err(e) => reply.error(e),
            }
        });
    }

    /// READDIR with each entry's attributes and node (the kernel asks for
    /// it on a directory's first page, and while its names are looked up
    /// after listing: `ls -l`, `find`), so a listing saves a LOOKUP per
    /// name. Every entry added is a lookup the kernel counts (`.` and `..`
    /// aside); one that did not fit is not counted and is kept for the
    /// next call.
    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let cx = self.cx(req);
        self.spawn(move |core| async move {
            match core.readdir(&cx, ino.0, fh.0, offset).await {
                Ok((entries, eof)) => {
                    core.fill_listing(fh.0, offset, entries, eof, |e| {
                        let (attr, counted) = core.listed_entry(e);
                        let name = OsStr::from_bytes(&e.name);
                        let full =
                            reply.add(attr.ino, e.next, name, &core.ttl, &attr, Generation(0));
                        if full && counted {
                            core.forget(attr.ino.0, 1);
                        }
                        full
                    });
                    reply.ok();
                }
                Err(e) => reply.error(e),
            }
        });
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.spawn(move |core| async move { answer(reply, core.release(fh.0).await) });
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let cx = self.cx(req);
        self.spawn(move |core| async move {
            match core.statfs(&cx, ino.0).await {
                Ok(s) => {
                    let bsize = 4096_u64;
                    reply.statfs(
                        s.tbytes / bsize,
                        s.fbytes / bsize,
                        s.abytes / bsize,
                        s.tfiles,
                        s.afiles,
                        bsize as u32,
                        NAME_MAX as u32,
                        bsize as u32,
                    );
                }
                Err(e) => reply.error(e),
            }
        });
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let cx = self.cx(req);
        self.spawn(
            move |core| async move { answer(reply, core.access(&cx, ino.0, mask.bits()).await) },
        );
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        Self::unsupported(reply);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        Self::unsupported(reply);
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        Self::unsupported(reply);
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: ReplyLseek,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn bmap(&self, _req: &Request, _ino: INodeNo, _blocksize: u32, _idx: u64, reply: ReplyBmap) {
        reply.error(Errno::ENOSYS);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let (cx, name) = (self.cx(req), bytes(name));
        self.spawn(move |core| async move {
            match core
                .create(&cx, parent.0, &name, mode & !umask, flags)
                .await
            {
                Ok((h, a, paging)) => reply.created(
                    &core.ttl,
                    &a,
                    Generation(0),
                    FileHandle(h),
                    open_flags(paging),
                ),
                Err(e) => reply.error(e),
            }
        });
    }
}

/// Operations NFSv3 has no call for. fuser's defaults answer them too,
/// but log a warning each time; these answer at once, quietly. ENOSYS
/// makes the kernel stop asking and do without (extended attributes:
/// EOPNOTSUPP to the caller; fallocate: EOPNOTSUPP; lseek and
/// copy_file_range: its own generic code); an ioctl is not for a file on
/// this file system (ENOTTY, as on an NFS mount).
impl Fs {
    fn unsupported(reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS);
    }
}

fn open_flags(p: Paging) -> FopenFlags {
    let mut f = FopenFlags::empty();
    if p.keep {
        f |= FopenFlags::FOPEN_KEEP_CACHE;
    }
    if p.direct {
        f |= FopenFlags::FOPEN_DIRECT_IO;
    }
    f
}

fn entry(reply: ReplyEntry, ttl: &std::time::Duration, done: Result<FileAttr, Errno>) {
    match done {
        Ok(a) => reply.entry(ttl, &a, Generation(0)),
        Err(e) => reply.error(e),
    }
}

fn attr(reply: ReplyAttr, ttl: &std::time::Duration, done: Result<FileAttr, Errno>) {
    match done {
        Ok(a) => reply.attr(ttl, &a),
        Err(e) => reply.error(e),
    }
}

fn answer(reply: ReplyEmpty, done: Result<(), Errno>) {
    match done {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}
