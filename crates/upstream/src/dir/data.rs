//! READ, WRITE and COMMIT (RFC 1813 sections 3.3.6, 3.3.7, 3.3.21), on
//! descriptors kept open between calls.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::Opaque;
use rustix::fs::{Mode, OFlags, fchmod, openat};

use super::attr::{Attr, S_ISGID, S_ISUID, S_IXGRP, stat_fd};
use super::handle::{self, FileKey};
use super::perm::{Caller, R, W, X};
use super::status::Fail;
use super::{Export, MAX_IO, Node};

const OPEN_FLAGS: OFlags = OFlags::NOFOLLOW
    .union(OFlags::NONBLOCK)
    .union(OFlags::NOCTTY)
    .union(OFlags::CLOEXEC);

impl Export {
    /// The open regular file `fh` names, and its attributes; writable when
    /// `write` is asked. On failure, the attributes of what `fh` names,
    /// when found.
    fn open_file(
        &self,
        fh: &nfs_fh3,
        write: bool,
    ) -> Result<(Arc<File>, Attr), (Fail, Option<Attr>)> {
        let key = handle::decode(self.export_id, fh).map_err(|f| (f, None))?;
        if let Some(hit) = self.cached_file(key, write) {
            return Ok(hit);
        }
        let node = self.find_key(key).map_err(|f| (f, None))?;
        let attr = node.attr;
        let file = self.open_node(&node, write).map_err(|f| (f, Some(attr)))?;
        Ok((file, attr))
    }

    /// The cached descriptor for `key` and fresh attributes, if one is
    /// cached (and writable when `write` is asked) and its file still
    /// exists.
    pub(super) fn cached_file(&self, key: FileKey, write: bool) -> Option<(Arc<File>, Attr)> {
        let file = self.files.get(key, write)?;
        match stat_fd(file.as_fd()) {
            Ok(a) if a.nlink > 0 && a.key() == key => Some((file, a)),
            _ => {
                self.files.remove(key);
                None
            }
        }
    }

    /// A writable descriptor on the regular file `node` names.
    pub(super) fn writable_file(&self, node: &Node<'_>) -> Result<Arc<File>, Fail> {
        match self.files.get(node.attr.key(), true) {
            Some(f) => Ok(f),
            None => self.open_node(node, true),
        }
    }

    /// Opens the regular file `node` names (read-write when possible) and
    /// caches the descriptor.
    fn open_node(&self, node: &Node<'_>, write: bool) -> Result<Arc<File>, Fail> {
        if !node.attr.is_reg() {
            return Err(Fail(if node.attr.is_dir() {
                nfsstat3::NFS3ERR_ISDIR
            } else {
                nfsstat3::NFS3ERR_INVAL
            }));
        }
        let open = |mode: OFlags| {
            openat(
                node.dir.as_fd(),
                node.name.as_slice(),
                mode | OPEN_FLAGS,
                Mode::empty(),
            )
        };
        let (fd, writable) = match open(OFlags::RDWR) {
            Ok(fd) => (fd, true),
            Err(e) if write => return Err(e.into()),
            Err(_) => (open(OFlags::RDONLY)?, false),
        };
        let file = File::from(fd);
        let attr = stat_fd(file.as_fd())?;
        if attr.key() != node.attr.key() {
            return Err(Fail(nfsstat3::NFS3ERR_STALE));
        }
        let file = Arc::new(file);
        self.files.insert(attr.key(), Arc::clone(&file), writable);
        Ok(file)
    }

    /// Caches `file`, just created and open read-write, for `key`.
    pub(super) fn keep_open(&self, key: FileKey, file: Arc<File>) {
        self.files.insert(key, file, true);
    }

    pub(super) fn read(&self, c: &Caller, a: READ3args) -> READ3res<'static> {
        let (file, attr) = match self.open_file(&a.file, false) {
            Ok(x) => x,
            Err((Fail(s), attr)) => {
                return Nfs3Result::Err((
                    s,
                    READ3resfail {
                        file_attributes: self.post(attr.as_ref()),
                    },
                ));
            }
        };
        let fail = |s: nfsstat3| {
            Nfs3Result::Err((
                s,
                READ3resfail {
                    file_attributes: self.post(Some(&attr)),
                },
            ))
        };
        // knfsd lets the owner read regardless of mode, and anyone read
        // what they may execute.
        if !c.owns(&attr) && !c.may(&attr, R) && !c.may(&attr, X) {
            return fail(nfsstat3::NFS3ERR_ACCES);
        }
        let want = u64::from(a.count.min(MAX_IO)).min(attr.size.saturating_sub(a.offset));
        let mut buf = vec![0u8; want as usize];
        let n = match read_full(&file, &mut buf, a.offset) {
            Ok(n) => n,
            Err(e) => return fail(Fail::from(e).0),
        };
        buf.truncate(n);
        let post = stat_fd(file.as_fd()).unwrap_or(attr);
        let eof = a.offset.saturating_add(n as u64) >= post.size;
        Nfs3Result::Ok(READ3resok {
            file_attributes: self.post(Some(&post)),
            count: n as u32,
            eof,
            data: Opaque::owned(buf),
        })
    }

    pub(super) fn write(&self, c: &Caller, a: WRITE3args<'static>) -> WRITE3res {
        let (file, pre) = match self.open_file(&a.file, true) {
            Ok(x) => x,
            Err((Fail(s), attr)) => {
                return Nfs3Result::Err((
                    s,
                    WRITE3resfail {
                        file_wcc: self.wcc(None, attr.as_ref()),
                    },
                ));
            }
        };
        let out = self.write_to(c, &file, &pre, &a);
        let post = stat_fd(file.as_fd()).ok();
        let file_wcc = self.wcc(Some(&pre), post.as_ref());
        match out {
            Ok(count) => Nfs3Result::Ok(WRITE3resok {
                file_wcc,
                count,
                committed: a.stable,
                verf: writeverf3(self.write_verf),
            }),
            Err(Fail(s)) => Nfs3Result::Err((s, WRITE3resfail { file_wcc })),
        }
    }

    fn write_to(
        &self,
        c: &Caller,
        file: &File,
        pre: &Attr,
        a: &WRITE3args<'_>,
    ) -> Result<u32, Fail> {
        if !c.owns(pre) && !c.may(pre, W) {
            return Err(Fail(nfsstat3::NFS3ERR_ACCES));
        }
        if a.data.len() < a.count as usize {
            return Err(Fail(nfsstat3::NFS3ERR_INVAL));
        }
        // Like knfsd, a write longer than wtmax is cut to wtmax.
        let count = a.count.min(MAX_IO);
        let data = &a.data[..count as usize];
        if a.offset
            .checked_add(u64::from(count))
            .is_none_or(|end| end > i64::MAX as u64)
        {
            return Err(Fail(nfsstat3::NFS3ERR_FBIG));
        }
        file.write_all_at(data, a.offset)?;
        match a.stable {
            stable_how::UNSTABLE => {}
            stable_how::DATA_SYNC => file.sync_data()?,
            stable_how::FILE_SYNC => file.sync_all()?,
        }
        // A write by anyone but root clears set-id bits, as the kernel
        // would had it been that caller writing.
        let setid = pre.mode & S_ISUID != 0 || pre.mode & (S_ISGID | S_IXGRP) == S_ISGID | S_IXGRP;
        if self.as_root && !c.is_root() && setid && count > 0 {
            fchmod(file, Mode::from_raw_mode(pre.perm() & !(S_ISUID | S_ISGID)))?;
        }
        Ok(count)
    }

    pub(super) fn commit(&self, c: &Caller, a: COMMIT3args) -> COMMIT3res {
        let (file, pre) = match self.open_file(&a.file, false) {
            Ok(x) => x,
            Err((Fail(nfsstat3::NFS3ERR_ISDIR), Some(dir))) => {
                return self.commit_dir(&a.file, dir);
            }
            Err((Fail(s), attr)) => {
                return Nfs3Result::Err((
                    s,
                    COMMIT3resfail {
                        file_wcc: self.wcc(None, attr.as_ref()),
                    },
                ));
            }
        };
        let out = if !c.owns(&pre) && !c.may(&pre, W) {
            Err(Fail(nfsstat3::NFS3ERR_ACCES))
        } else {
            file.sync_all().map_err(Fail::from)
        };
        let post = stat_fd(file.as_fd()).ok();
        let file_wcc = self.wcc(Some(&pre), post.as_ref());
        match out {
            Ok(()) => Nfs3Result::Ok(COMMIT3resok {
                file_wcc,
                verf: writeverf3(self.write_verf),
            }),
            Err(Fail(s)) => Nfs3Result::Err((s, COMMIT3resfail { file_wcc })),
        }
    }

    /// COMMIT of a directory: flushes its entries and answers NFS3_OK, as
    /// nfs-ganesha does (knfsd says ISDIR; RFC 1813 section 3.3.21 lists
    /// neither).
    fn commit_dir(&self, fh: &nfs_fh3, pre: Attr) -> COMMIT3res {
        let synced = self.find(fh).and_then(|node| {
            let fd = openat(
                node.dir.as_fd(),
                node.name.as_slice(),
                OFlags::RDONLY | OFlags::DIRECTORY | OPEN_FLAGS,
                Mode::empty(),
            )?;
            let post = stat_fd(fd.as_fd())?;
            if post.key() != pre.key() {
                return Err(Fail(nfsstat3::NFS3ERR_STALE));
            }
            rustix::fs::fsync(&fd)?;
            Ok(stat_fd(fd.as_fd()).unwrap_or(post))
        });
        match synced {
            Ok(post) => Nfs3Result::Ok(COMMIT3resok {
                file_wcc: self.wcc(Some(&pre), Some(&post)),
                verf: writeverf3(self.write_verf),
            }),
            Err(Fail(s)) => Nfs3Result::Err((
                s,
                COMMIT3resfail {
                    file_wcc: self.wcc(Some(&pre), None),
                },
            )),
        }
    }
}

/// Reads into all of `buf` from `offset`, stopping early only at the end
/// of the file.
fn read_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests;
