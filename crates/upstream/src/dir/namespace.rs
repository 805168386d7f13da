//! Procedures on directory entries: LOOKUP, CREATE, MKDIR, SYMLINK, MKNOD,
//! REMOVE, RMDIR, RENAME, LINK (RFC 1813 sections 3.3.3, 3.3.8-15).
//!
//! Everything a caller creates is given to the caller when the proxy runs
//! as root (create, then `fchown`), then the requested attributes are
//! applied with the caller's own permissions.

use std::fs::File;
use std::os::fd::AsFd;
use std::sync::Arc;

use nfs3_types::nfs3::*;
use rustix::fs::{
    AtFlags, FileType, Gid, Mode, OFlags, Timespec, Timestamps, Uid, chownat, fchmod, fchown,
    futimens, linkat, mkdirat, mknodat, openat, renameat, symlinkat, unlinkat,
};

use super::attr::{Attr, S_ISGID, stat_at, stat_fd};
use super::name::{self, MAX_TARGET, Name};
use super::perm::{Caller, W, X};
use super::status::Fail;
use super::{DirNode, Export};

/// The reply of a procedure that makes an object (CREATE, MKDIR, SYMLINK,
/// MKNOD): its handle and attributes, or why not, with the directory's
/// wcc_data either way. The four replies differ only in their type names.
macro_rules! new_object_reply {
    ($export:expr, $out:expr, $dir_wcc:expr, $ok:ident, $fail:ident) => {
        match $out {
            Ok(attr) => Nfs3Result::Ok($ok {
                obj: Nfs3Option::Some($export.handle(attr.key())),
                obj_attributes: $export.post(Some(&attr)),
                dir_wcc: $dir_wcc,
            }),
            Err(Fail(s)) => Nfs3Result::Err((s, $fail { dir_wcc: $dir_wcc })),
        }
    };
}

impl Export {
    /// Runs `op` in the directory `fh` names; returns its outcome with the
    /// directory's wcc_data (RFC 1813 section 2.6).
    fn in_dir<T>(
        &self,
        fh: &nfs_fh3,
        op: impl FnOnce(&DirNode<'_>) -> Result<T, Fail>,
    ) -> (Result<T, Fail>, wcc_data) {
        let dir = match self.find_dir(fh) {
            Ok(d) => d,
            Err((fail, attr)) => return (Err(fail), self.wcc(None, attr.as_ref())),
        };
        let out = op(&dir);
        let post = stat_fd(dir.fd.as_fd()).ok();
        (out, self.wcc(Some(&dir.attr), post.as_ref()))
    }

    pub(super) fn lookup(&self, c: &Caller, a: LOOKUP3args<'static>) -> LOOKUP3res {
        let dir = match self.find_dir(&a.what.dir) {
            Ok(d) => d,
            Err((Fail(s), attr)) => {
                return Nfs3Result::Err((
                    s,
                    LOOKUP3resfail {
                        dir_attributes: self.post(attr.as_ref()),
                    },
                ));
            }
        };
        match self.lookup_in(c, &dir, a.what.name.as_ref()) {
            Ok(attr) => Nfs3Result::Ok(LOOKUP3resok {
                object: self.handle(attr.key()),
                obj_attributes: self.post(Some(&attr)),
                dir_attributes: self.post(Some(&dir.attr)),
            }),
            Err(Fail(s)) => Nfs3Result::Err((
                s,
                LOOKUP3resfail {
                    dir_attributes: self.post(Some(&dir.attr)),
                },
            )),
        }
    }

    fn lookup_in(&self, c: &Caller, dir: &DirNode<'_>, name: &[u8]) -> Result<Attr, Fail> {
        if !c.may(&dir.attr, X) {
            return Err(Fail(nfsstat3::NFS3ERR_ACCES));
        }
        match name::parse(name)? {
            Name::Dot => Ok(dir.attr),
            // ".." of the export root is the root: nothing above it exists.
            Name::DotDot if dir.attr.ino == self.root.ino => Ok(dir.attr),
            Name::DotDot => Ok(stat_at(dir.fd.as_fd(), b"..")?),
            Name::Entry(n) => {
                let attr = stat_at(dir.fd.as_fd(), n)?;
                self.index.insert(attr.ino, dir.attr.ino, n);
                Ok(attr)
            }
        }
    }

    /// The checks every procedure creating an entry makes: write and
    /// search permission on the directory, then an ordinary name.
    fn creatable<'n>(c: &Caller, dir: &DirNode<'_>, name: &'n [u8]) -> Result<&'n [u8], Fail> {
        if !c.may(&dir.attr, W | X) {
            return Err(Fail(nfsstat3::NFS3ERR_ACCES));
        }
        name::entry(name, nfsstat3::NFS3ERR_EXIST)
    }

    /// Mode for a new directory or device node when the caller gave none:
    /// 0 as knfsd does, unless the proxy does not run as root and must
    /// still open it. (CREATE has its own default.)
    fn default_mode(&self, dir: bool) -> u32 {
        match (self.as_root, dir) {
            (true, _) => 0,
            (false, true) => 0o700,
            (false, false) => 0o600,
        }
    }

    /// Gives `name` in `dir`, just created, to the caller (when the proxy
    /// runs as root).
    fn give_to_caller(&self, c: &Caller, dir: &DirNode<'_>, name: &[u8]) -> Result<(), Fail> {
        if let Some((uid, gid)) = self.owner_ids(c, dir) {
            chownat(
                dir.fd.as_fd(),
                name,
                Some(uid),
                Some(gid),
                AtFlags::SYMLINK_NOFOLLOW,
            )?;
        }
        Ok(())
    }

    fn owner_ids(&self, c: &Caller, dir: &DirNode<'_>) -> Option<(Uid, Gid)> {
        if !self.as_root {
            return None;
        }
        let (uid, gid) = self.new_owner(c, &dir.attr);
        if uid == u32::MAX || gid == u32::MAX {
            return None;
        }
        Some((Uid::from_raw(uid), Gid::from_raw(gid)))
    }

    /// Hands `name` in `dir`, just made by MKDIR, MKNOD or SYMLINK, over to
    /// the caller: gives it to them, sets `mode` exactly (the umask narrowed
    /// it when it was made; symlinks have none), then applies what is left
    /// of `s` but a mode and a size.
    fn hand_over(
        &self,
        c: &Caller,
        dir: &DirNode<'_>,
        name: &[u8],
        mode: Option<u32>,
        s: &sattr3,
    ) -> Result<Attr, Fail> {
        self.give_to_caller(c, dir, name)?;
        if let Some(mode) = mode {
            let attr = stat_at(dir.fd.as_fd(), name)?;
            self.chmod(&dir.child(name, attr), mode)?;
        }
        let rest = sattr3 {
            mode: Nfs3Option::None,
            size: Nfs3Option::None,
            ..s.clone()
        };
        self.finish_new(c, dir, name, &rest)
    }

    /// Indexes `name` in `dir`, applies what is left of `s` for the caller
    /// and returns the final attributes.
    fn finish_new(
        &self,
        c: &Caller,
        dir: &DirNode<'_>,
        name: &[u8],
        s: &sattr3,
    ) -> Result<Attr, Fail> {
        let attr = stat_at(dir.fd.as_fd(), name)?;
        self.index.insert(attr.ino, dir.attr.ino, name);
        let wants_more = s.uid.is_some()
            || s.gid.is_some()
            || s.size.is_some()
            || !matches!(s.atime, set_atime::DONT_CHANGE)
            || !matches!(s.mtime, set_mtime::DONT_CHANGE);
        if !wants_more {
            return Ok(attr);
        }
        let node = dir.child(name, attr);
        self.apply_sattr(c, &node, s)?;
        Ok(node.restat()?)
    }

    pub(super) fn create(&self, c: &Caller, a: CREATE3args<'static>) -> CREATE3res {
        let (out, dir_wcc) = self.in_dir(&a.where_.dir, |dir| {
            self.create_in(c, dir, a.where_.name.as_ref(), &a.how)
        });
        new_object_reply!(self, out, dir_wcc, CREATE3resok, CREATE3resfail)
    }

    fn create_in(
        &self,
        c: &Caller,
        dir: &DirNode<'_>,
        name: &[u8],
        how: &createhow3,
    ) -> Result<Attr, Fail> {
        let name = Self::creatable(c, dir, name)?;
        let (s, verf) = match how {
            createhow3::UNCHECKED(s) | createhow3::GUARDED(s) => (s.clone(), None),
            createhow3::EXCLUSIVE(v) => (sattr3::default(), Some(exclusive_times(v))),
        };
        // nfs-ganesha gives a file created without a mode (always the
        // case for EXCLUSIVE) 0600 rather than knfsd's 0; RFC 1813 section
        // 3.3.8 leaves it open, as the client must follow an exclusive
        // create with a SETATTR.
        let mode = requested_mode(&s, CREATE_DEFAULT_MODE);
        let flags = OFlags::RDWR
            | OFlags::CREATE
            | OFlags::EXCL
            | OFlags::NOFOLLOW
            | OFlags::NONBLOCK
            | OFlags::NOCTTY
            | OFlags::CLOEXEC;
        let fd = match openat(dir.fd.as_fd(), name, flags, Mode::from_raw_mode(mode)) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::EXIST) => return self.create_existing(c, dir, name, how, verf),
            Err(e) => return Err(e.into()),
        };
        let file = File::from(fd);
        if let Some((uid, gid)) = self.owner_ids(c, dir) {
            fchown(&file, Some(uid), Some(gid))?;
        }
        // Exact mode: the process umask does not apply to NFS creates.
        fchmod(&file, Mode::from_raw_mode(mode))?;
        if let Some((atime, mtime)) = verf {
            // RFC 1813 section 3.3.8: the verifier is kept with the file;
            // like knfsd, in its atime and mtime.
            futimens(
                &file,
                &Timestamps {
                    last_access: atime,
                    last_modification: mtime,
                },
            )?;
        }
        let attr = stat_fd(file.as_fd())?;
        self.keep_open(attr.key(), Arc::new(file));
        let rest = sattr3 {
            mode: Nfs3Option::None,
            ..s
        };
        self.finish_new(c, dir, name, &rest)
    }

    /// CREATE of a name that exists: GUARDED fails, EXCLUSIVE succeeds when
    /// it is the retransmission of the create that made the file (same
    /// verifier, still empty), UNCHECKED truncates a regular file to 0 if
    /// asked and otherwise leaves it as it is; like nfs-ganesha, it refuses
    /// anything else with ISDIR (a directory) or BADTYPE. RFC 1813 section
    /// 3.3.8 does not say; knfsd applies any size, and answers EXIST (since
    /// Linux 5.18 NFS3_OK with the existing object) for other kinds.
    fn create_existing(
        &self,
        c: &Caller,
        dir: &DirNode<'_>,
        name: &[u8],
        how: &createhow3,
        verf: Option<(Timespec, Timespec)>,
    ) -> Result<Attr, Fail> {
        let exist = Fail(nfsstat3::NFS3ERR_EXIST);
        let attr = stat_at(dir.fd.as_fd(), name)?;
        match how {
            createhow3::GUARDED(_) => Err(exist),
            createhow3::EXCLUSIVE(_) => {
                let (atime, mtime) = verf.ok_or(exist)?;
                let same = attr.is_reg()
                    && attr.size == 0
                    && i64::from(attr.atime.seconds) == atime.tv_sec
                    && i64::from(attr.mtime.seconds) == mtime.tv_sec;
                if !same {
                    return Err(exist);
                }
                self.index.insert(attr.ino, dir.attr.ino, name);
                Ok(attr)
            }
            createhow3::UNCHECKED(s) => {
                if attr.is_dir() {
                    return Err(Fail(nfsstat3::NFS3ERR_ISDIR));
                }
                if !attr.is_reg() {
                    return Err(Fail(nfsstat3::NFS3ERR_BADTYPE));
                }
                self.index.insert(attr.ino, dir.attr.ino, name);
                // The other attributes are for a new file; nfs-ganesha
                // ignores them, and any size but 0, on an existing one.
                if !matches!(s.size, Nfs3Option::Some(0)) {
                    return Ok(attr);
                }
                let only_size = sattr3 {
                    size: Nfs3Option::Some(0),
                    ..sattr3::default()
                };
                let node = dir.child(name, attr);
                self.apply_sattr(c, &node, &only_size)?;
                Ok(node.restat()?)
            }
        }
    }

    pub(super) fn mkdir(&self, c: &Caller, a: MKDIR3args<'static>) -> MKDIR3res {
        let (out, dir_wcc) = self.in_dir(&a.where_.dir, |dir| {
            let name = Self::creatable(c, dir, a.where_.name.as_ref())?;
            let s = &a.attributes;
            let mut mode = requested_mode(s, self.default_mode(true));
            // New directories inherit set-group-id, as on Linux.
            mode |= dir.attr.mode & S_ISGID;
            mkdirat(dir.fd.as_fd(), name, Mode::from_raw_mode(mode))?;
            self.hand_over(c, dir, name, Some(mode), s)
        });
        new_object_reply!(self, out, dir_wcc, MKDIR3resok, MKDIR3resfail)
    }

    pub(super) fn symlink(&self, c: &Caller, a: SYMLINK3args<'static>) -> SYMLINK3res {
        let (out, dir_wcc) = self.in_dir(&a.where_.dir, |dir| {
            let name = Self::creatable(c, dir, a.where_.name.as_ref())?;
            let target: &[u8] = a.symlink.symlink_data.as_ref();
            if target.is_empty() {
                return Err(Fail(nfsstat3::NFS3ERR_NOENT));
            }
            if target.len() > MAX_TARGET {
                return Err(Fail(nfsstat3::NFS3ERR_NAMETOOLONG));
            }
            if target.contains(&0) {
                return Err(Fail(nfsstat3::NFS3ERR_INVAL));
            }
            symlinkat(target, dir.fd.as_fd(), name)?;
            self.hand_over(c, dir, name, None, &a.symlink.symlink_attributes)
        });
        new_object_reply!(self, out, dir_wcc, SYMLINK3resok, SYMLINK3resfail)
    }

    pub(super) fn mknod(&self, c: &Caller, a: MKNOD3args<'static>) -> MKNOD3res {
        let (out, dir_wcc) = self.in_dir(&a.where_.dir, |dir| {
            let (kind, s, dev) = match &a.what {
                mknoddata3::NF3CHR(d) => {
                    (FileType::CharacterDevice, &d.dev_attributes, Some(&d.spec))
                }
                mknoddata3::NF3BLK(d) => (FileType::BlockDevice, &d.dev_attributes, Some(&d.spec)),
                mknoddata3::NF3SOCK(s) => (FileType::Socket, s, None),
                mknoddata3::NF3FIFO(s) => (FileType::Fifo, s, None),
                mknoddata3::default => return Err(Fail(nfsstat3::NFS3ERR_BADTYPE)),
            };
            let name = Self::creatable(c, dir, a.where_.name.as_ref())?;
            // Device nodes need CAP_MKNOD, which only root callers have.
            if dev.is_some() && !c.is_root() {
                return Err(Fail(nfsstat3::NFS3ERR_PERM));
            }
            let rdev = dev.map_or(0, |d| rustix::fs::makedev(d.specdata1, d.specdata2));
            let mode = requested_mode(s, self.default_mode(false));
            mknodat(dir.fd.as_fd(), name, kind, Mode::from_raw_mode(mode), rdev)?;
            self.hand_over(c, dir, name, Some(mode), s)
        });
        new_object_reply!(self, out, dir_wcc, MKNOD3resok, MKNOD3resfail)
    }

    /// Removes `name` from `dir` for `c`: a directory with `rmdir`.
    fn unlink_in(
        &self,
        c: &Caller,
        dir: &DirNode<'_>,
        name: &[u8],
        rmdir: bool,
    ) -> Result<(), Fail> {
        let name = match name::parse(name)? {
            Name::Entry(n) => n,
            // RFC 1813 section 3.3.13: servers on which "." is illegal
            // answer INVAL to RMDIR, those on which ".." is, EXIST.
            Name::Dot if rmdir => return Err(Fail(nfsstat3::NFS3ERR_INVAL)),
            Name::DotDot if rmdir => return Err(Fail(nfsstat3::NFS3ERR_EXIST)),
            // REMOVE names a directory: ISDIR, as nfs-ganesha answers
            // (knfsd says ACCES; RFC 1813 section 3.3.12 does not say).
            Name::Dot | Name::DotDot => return Err(Fail(nfsstat3::NFS3ERR_ISDIR)),
        };
        if !c.may(&dir.attr, W | X) {
            return Err(Fail(nfsstat3::NFS3ERR_ACCES));
        }
        let victim = stat_at(dir.fd.as_fd(), name)?;
        if !c.may_unlink_from(&dir.attr, &victim) {
            return Err(Fail(nfsstat3::NFS3ERR_PERM));
        }
        let flags = if rmdir {
            AtFlags::REMOVEDIR
        } else {
            AtFlags::empty()
        };
        unlinkat(dir.fd.as_fd(), name, flags)?;
        self.unlinked(&victim, dir.attr.ino, name);
        Ok(())
    }

    /// Bookkeeping after the entry `parent`/`name` for `victim` went away.
    fn unlinked(&self, victim: &Attr, parent: u64, name: &[u8]) {
        self.index.forget(victim.ino, parent, name);
        if victim.nlink <= 1 || victim.is_dir() {
            self.index.mark_gone(victim.key());
            self.files.remove(victim.key());
        }
    }

    pub(super) fn remove(&self, c: &Caller, a: REMOVE3args<'static>) -> REMOVE3res {
        let (out, dir_wcc) = self.in_dir(&a.object.dir, |dir| {
            self.unlink_in(c, dir, a.object.name.as_ref(), false)
        });
        match out {
            Ok(()) => Nfs3Result::Ok(REMOVE3resok { dir_wcc }),
            Err(Fail(s)) => Nfs3Result::Err((s, REMOVE3resfail { dir_wcc })),
        }
    }

    pub(super) fn rmdir(&self, c: &Caller, a: RMDIR3args<'static>) -> RMDIR3res {
        let (out, dir_wcc) = self.in_dir(&a.object.dir, |dir| {
            self.unlink_in(c, dir, a.object.name.as_ref(), true)
        });
        match out {
            Ok(()) => Nfs3Result::Ok(RMDIR3resok { dir_wcc }),
            Err(Fail(s)) => Nfs3Result::Err((s, RMDIR3resfail { dir_wcc })),
        }
    }

    pub(super) fn rename(&self, c: &Caller, a: RENAME3args<'static, 'static>) -> RENAME3res {
        let from = match self.find_dir(&a.from.dir) {
            Ok(d) => d,
            Err((Fail(s), attr)) => {
                return Nfs3Result::Err((
                    s,
                    RENAME3resfail {
                        fromdir_wcc: self.wcc(None, attr.as_ref()),
                        todir_wcc: wcc_data::default(),
                    },
                ));
            }
        };
        let (out, todir_wcc) = self.in_dir(&a.to.dir, |to| {
            self.rename_between(c, &from, a.from.name.as_ref(), to, a.to.name.as_ref())
        });
        let post = stat_fd(from.fd.as_fd()).ok();
        let fromdir_wcc = self.wcc(Some(&from.attr), post.as_ref());
        match out {
            Ok(()) => Nfs3Result::Ok(RENAME3resok {
                fromdir_wcc,
                todir_wcc,
            }),
            Err(Fail(s)) => Nfs3Result::Err((
                s,
                RENAME3resfail {
                    fromdir_wcc,
                    todir_wcc,
                },
            )),
        }
    }

    fn rename_between(
        &self,
        c: &Caller,
        from: &DirNode<'_>,
        fname: &[u8],
        to: &DirNode<'_>,
        tname: &[u8],
    ) -> Result<(), Fail> {
        if !c.may(&from.attr, W | X) || !c.may(&to.attr, W | X) {
            return Err(Fail(nfsstat3::NFS3ERR_ACCES));
        }
        // RFC 1813 section 3.3.14: servers on which "." and ".." are
        // illegal names answer INVAL (as nfs-ganesha does; knfsd says PERM).
        let fname = name::entry(fname, nfsstat3::NFS3ERR_INVAL)?;
        let tname = name::entry(tname, nfsstat3::NFS3ERR_INVAL)?;
        let src = stat_at(from.fd.as_fd(), fname)?;
        if !c.may_unlink_from(&from.attr, &src) {
            return Err(Fail(nfsstat3::NFS3ERR_PERM));
        }
        // Moving a directory to another parent rewrites its "..": Linux
        // wants write permission on it too.
        if src.is_dir() && from.attr.ino != to.attr.ino && !c.may(&src, W) {
            return Err(Fail(nfsstat3::NFS3ERR_ACCES));
        }
        let dst = stat_at(to.fd.as_fd(), tname).ok();
        if let Some(d) = &dst
            && !c.may_unlink_from(&to.attr, d)
        {
            return Err(Fail(nfsstat3::NFS3ERR_PERM));
        }
        renameat(from.fd.as_fd(), fname, to.fd.as_fd(), tname)?;
        if let Some(d) = dst.filter(|d| d.ino != src.ino) {
            self.unlinked(&d, to.attr.ino, tname);
        }
        self.index.insert(src.ino, to.attr.ino, tname);
        Ok(())
    }

    pub(super) fn link(&self, c: &Caller, a: LINK3args<'static>) -> LINK3res {
        let file = match self.find(&a.file) {
            Ok(n) => n,
            Err(Fail(s)) => {
                return Nfs3Result::Err((
                    s,
                    LINK3resfail {
                        file_attributes: Nfs3Option::None,
                        linkdir_wcc: wcc_data::default(),
                    },
                ));
            }
        };
        let (out, linkdir_wcc) = self.in_dir(&a.link.dir, |dir| {
            // A directory cannot be linked; nfs-ganesha says BADTYPE and
            // knfsd ISDIR, both before looking at the name (RFC 1813
            // section 3.3.15 lists neither).
            if file.attr.is_dir() {
                return Err(Fail(nfsstat3::NFS3ERR_BADTYPE));
            }
            let name = Self::creatable(c, dir, a.link.name.as_ref())?;
            if !c.may_hardlink(&file.attr) {
                return Err(Fail(nfsstat3::NFS3ERR_PERM));
            }
            linkat(
                file.dir.as_fd(),
                file.name.as_slice(),
                dir.fd.as_fd(),
                name,
                AtFlags::empty(),
            )?;
            Ok(())
        });
        let file_attributes = self.post(file.restat().ok().as_ref());
        match out {
            Ok(()) => Nfs3Result::Ok(LINK3resok {
                file_attributes,
                linkdir_wcc,
            }),
            Err(Fail(s)) => Nfs3Result::Err((
                s,
                LINK3resfail {
                    file_attributes,
                    linkdir_wcc,
                },
            )),
        }
    }
}

/// The permission bits `s` asks a new object to have, or `default`.
fn requested_mode(s: &sattr3, default: u32) -> u32 {
    match s.mode {
        Nfs3Option::Some(m) => m & 0o7777,
        Nfs3Option::None => default,
    }
}

/// Permission bits of a file CREATE makes without a mode.
const CREATE_DEFAULT_MODE: u32 = 0o600;

/// The atime and mtime an EXCLUSIVE create stores its verifier in, as
/// knfsd does: one 31-bit half in each, in whole seconds.
fn exclusive_times(v: &createverf3) -> (Timespec, Timespec) {
    let half = |b: &[u8]| {
        let mut w = [0u8; 4];
        w.copy_from_slice(b);
        i64::from(u32::from_be_bytes(w) & 0x7fff_ffff)
    };
    let at = |secs| Timespec {
        tv_sec: secs,
        tv_nsec: 0,
    };
    (at(half(&v.0[4..8])), at(half(&v.0[0..4])))
}

#[cfg(test)]
mod tests;
