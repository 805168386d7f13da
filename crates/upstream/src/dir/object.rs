//! Procedures on one object: GETATTR, SETATTR, ACCESS, READLINK, FSSTAT,
//! FSINFO, PATHCONF (RFC 1813 sections 3.3.1-5, 3.3.18-20), and the
//! attribute setting CREATE, MKDIR, SYMLINK and MKNOD share.

use std::os::fd::{AsFd, AsRawFd};

use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::{Opaque, Void};
use rustix::fs::{
    AtFlags, CWD, Gid, Mode, OFlags, Timespec, Timestamps, UTIME_NOW, UTIME_OMIT, Uid, chmodat,
    chownat, openat, utimensat,
};

use super::attr::S_ISGID;
use super::handle;
use super::perm::{Caller, W};
use super::status::Fail;
use super::{Export, MAX_IO, Node};

impl Export {
    pub(super) fn getattr(&self, a: GETATTR3args) -> GETATTR3res {
        // Files being read or written answer from their open descriptor.
        let cached = handle::decode(self.export_id, &a.object)
            .ok()
            .and_then(|key| self.cached_file(key, false));
        let found = match cached {
            Some((_, attr)) => Ok(attr),
            None => self.find(&a.object).map(|node| node.attr),
        };
        match found {
            Ok(attr) => Nfs3Result::Ok(GETATTR3resok {
                obj_attributes: attr.fattr(self.export_id),
            }),
            Err(Fail(s)) => Nfs3Result::Err((s, Void)),
        }
    }

    pub(super) fn setattr(&self, c: &Caller, a: SETATTR3args) -> SETATTR3res {
        let node = match self.find(&a.object) {
            Ok(n) => n,
            Err(Fail(s)) => return Nfs3Result::Err((s, SETATTR3resfail::default())),
        };
        let out = match a.guard {
            // RFC 1813 section 3.3.2: the guard is the object's ctime.
            Nfs3Option::Some(t) if t != node.attr.ctime => Err(Fail(nfsstat3::NFS3ERR_NOT_SYNC)),
            _ => self.apply_sattr(c, &node, &a.new_attributes),
        };
        let post = node.restat().ok();
        let obj_wcc = self.wcc(Some(&node.attr), post.as_ref());
        match out {
            Ok(()) => Nfs3Result::Ok(SETATTR3resok { obj_wcc }),
            Err(Fail(s)) => Nfs3Result::Err((s, SETATTR3resfail { obj_wcc })),
        }
    }

    /// Applies `s` to `node` for `c`, with Linux's rules: size needs write
    /// permission (or ownership), explicit times, mode and owner need
    /// ownership, "now" times need write permission, only root gives files
    /// away, an owner may change the group to one of its own. Mode changes
    /// on symlinks are ignored, as knfsd does. Every check is made before
    /// anything is changed.
    pub(super) fn apply_sattr(&self, c: &Caller, node: &Node<'_>, s: &sattr3) -> Result<(), Fail> {
        let a = &node.attr;
        let owner_or_root = c.is_root() || c.owns(a);
        let size = match s.size {
            Nfs3Option::Some(size) => Some(size),
            Nfs3Option::None => None,
        };
        let times = times_of(s)?;
        let uid = match s.uid {
            Nfs3Option::Some(u) if u != a.uid && u != u32::MAX => Some(u),
            _ => None,
        };
        let gid = match s.gid {
            Nfs3Option::Some(g) if g != a.gid && g != u32::MAX => Some(g),
            _ => None,
        };
        let mode = match s.mode {
            Nfs3Option::Some(m) if !a.is_symlink() => Some(m & 0o7777),
            _ => None,
        };

        // Only regular files have a size to set: BADTYPE, as nfs-ganesha
        // answers (knfsd says ISDIR for a directory, INVAL for the rest;
        // RFC 1813 section 3.3.2 does not say).
        if size.is_some() && !a.is_reg() {
            return Err(Fail(nfsstat3::NFS3ERR_BADTYPE));
        }
        // Permission to write (knfsd's fh_verify): ACCES.
        if size.is_some() && !c.owns(a) && !c.may(a, W) {
            return Err(Fail(nfsstat3::NFS3ERR_ACCES));
        }
        if let Some((_, false)) = times
            && !owner_or_root
            && !c.may(a, W)
        {
            return Err(Fail(nfsstat3::NFS3ERR_ACCES));
        }
        // Ownership (the VFS's setattr_prepare): PERM.
        let perm = Fail(nfsstat3::NFS3ERR_PERM);
        if matches!(times, Some((_, true))) && !owner_or_root {
            return Err(perm);
        }
        if uid.is_some() && !c.is_root() {
            return Err(perm);
        }
        if let Some(g) = gid
            && !(c.is_root() || (c.owns(a) && c.in_group(g)))
        {
            return Err(perm);
        }
        if mode.is_some() && !owner_or_root {
            return Err(perm);
        }

        if let Some(size) = size {
            let file = self.writable_file(node)?;
            file.set_len(size)?;
        }
        if uid.is_some() || gid.is_some() {
            chownat(
                node.dir.as_fd(),
                node.name.as_slice(),
                uid.map(Uid::from_raw),
                gid.map(Gid::from_raw),
                AtFlags::SYMLINK_NOFOLLOW,
            )?;
        }
        if let Some(mut m) = mode {
            // Like Linux: a caller outside the file's group cannot keep it
            // set-group-id.
            let group = gid.unwrap_or(a.gid);
            if !c.is_root() && !c.in_group(group) {
                m &= !S_ISGID;
            }
            self.chmod(node, m)?;
        }
        if let Some((ts, _)) = times {
            utimensat(
                node.dir.as_fd(),
                node.name.as_slice(),
                &ts,
                AtFlags::SYMLINK_NOFOLLOW,
            )?;
        }
        Ok(())
    }

    /// Sets the permission bits of the (non-symlink) file `node` names,
    /// through an `O_PATH` descriptor so that nothing swapped in under the
    /// name is changed instead.
    pub(super) fn chmod(&self, node: &Node<'_>, mode: u32) -> Result<(), Fail> {
        let mode = Mode::from_raw_mode(mode);
        let fd = openat(
            node.dir.as_fd(),
            node.name.as_slice(),
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let attr = super::attr::stat_fd(fd.as_fd())?;
        if attr.key() != node.attr.key() || attr.is_symlink() {
            return Err(Fail(nfsstat3::NFS3ERR_STALE));
        }
        let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        match chmodat(CWD, proc_path.as_str(), mode, AtFlags::empty()) {
            Err(rustix::io::Errno::NOENT) => {
                // No /proc: fall back to the name.
                chmodat(
                    node.dir.as_fd(),
                    node.name.as_slice(),
                    mode,
                    AtFlags::empty(),
                )?;
            }
            other => other?,
        }
        Ok(())
    }

    pub(super) fn access(&self, c: &Caller, a: ACCESS3args) -> ACCESS3res {
        match self.find(&a.object) {
            Ok(node) => Nfs3Result::Ok(ACCESS3resok {
                obj_attributes: self.post(Some(&node.attr)),
                access: c.access3(&node.attr, a.access),
            }),
            Err(Fail(s)) => Nfs3Result::Err((s, ACCESS3resfail::default())),
        }
    }

    pub(super) fn readlink(&self, a: READLINK3args) -> READLINK3res<'static> {
        let node = match self.find(&a.symlink) {
            Ok(n) => n,
            Err(Fail(s)) => return Nfs3Result::Err((s, READLINK3resfail::default())),
        };
        let fail = |s: nfsstat3| {
            Nfs3Result::Err((
                s,
                READLINK3resfail {
                    symlink_attributes: self.post(Some(&node.attr)),
                },
            ))
        };
        if !node.attr.is_symlink() {
            return fail(nfsstat3::NFS3ERR_INVAL);
        }
        match rustix::fs::readlinkat(node.dir.as_fd(), node.name.as_slice(), Vec::new()) {
            Ok(target) => Nfs3Result::Ok(READLINK3resok {
                symlink_attributes: self.post(Some(&node.attr)),
                data: nfspath3(Opaque::owned(target.into_bytes())),
            }),
            Err(e) => fail(Fail::from(e).0),
        }
    }

    pub(super) fn fsstat(&self, a: FSSTAT3args) -> FSSTAT3res {
        let node = match self.find(&a.fsroot) {
            Ok(n) => n,
            Err(Fail(s)) => return Nfs3Result::Err((s, FSSTAT3resfail::default())),
        };
        match rustix::fs::fstatvfs(&self.root_fd) {
            Ok(v) => {
                let unit = if v.f_frsize != 0 {
                    v.f_frsize
                } else {
                    v.f_bsize
                };
                Nfs3Result::Ok(FSSTAT3resok {
                    obj_attributes: self.post(Some(&node.attr)),
                    tbytes: v.f_blocks.saturating_mul(unit),
                    fbytes: v.f_bfree.saturating_mul(unit),
                    abytes: v.f_bavail.saturating_mul(unit),
                    tfiles: v.f_files,
                    ffiles: v.f_ffree,
                    afiles: v.f_favail,
                    invarsec: 0,
                })
            }
            Err(e) => Nfs3Result::Err((
                Fail::from(e).0,
                FSSTAT3resfail {
                    obj_attributes: self.post(Some(&node.attr)),
                },
            )),
        }
    }

    pub(super) fn fsinfo(&self, a: FSINFO3args) -> FSINFO3res {
        match self.find(&a.fsroot) {
            Ok(node) => Nfs3Result::Ok(FSINFO3resok {
                obj_attributes: self.post(Some(&node.attr)),
                rtmax: MAX_IO,
                rtpref: MAX_IO,
                rtmult: 4096,
                wtmax: MAX_IO,
                wtpref: MAX_IO,
                wtmult: 4096,
                dtpref: 64 * 1024,
                maxfilesize: i64::MAX as u64,
                time_delta: nfstime3 {
                    seconds: 0,
                    nseconds: 1,
                },
                properties: FSF3_LINK | FSF3_SYMLINK | FSF3_HOMOGENEOUS | FSF3_CANSETTIME,
            }),
            Err(Fail(s)) => Nfs3Result::Err((s, FSINFO3resfail::default())),
        }
    }

    pub(super) fn pathconf(&self, a: PATHCONF3args) -> PATHCONF3res {
        match self.find(&a.object) {
            Ok(node) => Nfs3Result::Ok(PATHCONF3resok {
                obj_attributes: self.post(Some(&node.attr)),
                linkmax: self.link_max,
                name_max: self.name_max,
                no_trunc: true,
                chown_restricted: true,
                case_insensitive: false,
                case_preserving: true,
            }),
            Err(Fail(s)) => Nfs3Result::Err((s, PATHCONF3resfail::default())),
        }
    }
}

/// The times `s` asks for, and whether any is an explicit client time
/// (which needs ownership) rather than "now" (which needs write
/// permission). `None` when neither changes.
fn times_of(s: &sattr3) -> Result<Option<(Timestamps, bool)>, Fail> {
    let omit = Timespec {
        tv_sec: 0,
        tv_nsec: UTIME_OMIT,
    };
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: UTIME_NOW,
    };
    let given = |t: &nfstime3| -> Result<Timespec, Fail> {
        if t.nseconds >= 1_000_000_000 {
            return Err(Fail(nfsstat3::NFS3ERR_INVAL));
        }
        Ok(Timespec {
            tv_sec: i64::from(t.seconds),
            tv_nsec: i64::from(t.nseconds),
        })
    };
    let mut explicit = false;
    let atime = match &s.atime {
        set_atime::DONT_CHANGE => omit,
        set_atime::SET_TO_SERVER_TIME => now,
        set_atime::SET_TO_CLIENT_TIME(t) => {
            explicit = true;
            given(t)?
        }
    };
    let mtime = match &s.mtime {
        set_mtime::DONT_CHANGE => omit,
        set_mtime::SET_TO_SERVER_TIME => now,
        set_mtime::SET_TO_CLIENT_TIME(t) => {
            explicit = true;
            given(t)?
        }
    };
    if atime.tv_nsec == UTIME_OMIT && mtime.tv_nsec == UTIME_OMIT {
        return Ok(None);
    }
    Ok(Some((
        Timestamps {
            last_access: atime,
            last_modification: mtime,
        },
        explicit,
    )))
}

#[cfg(test)]
mod tests {
    use gvfs_nfs::{NfsReply, NfsRequest, NfsService};
    use nfs3_types::nfs3::*;

    use crate::dir::testing::{Fixture, call, root};

    #[tokio::test]
    async fn setattr_truncate_times_and_guard() {
        let f = Fixture::new().await;
        let fh = f.file_with(&f.root, "f", b"0123456789").await;
        let attr = f.getattr(&fh).await.unwrap();
        let wrong = nfstime3 {
            seconds: attr.ctime.seconds.wrapping_add(1),
            nseconds: attr.ctime.nseconds,
        };
        let truncate = sattr3 {
            size: Nfs3Option::Some(4),
            ..sattr3::default()
        };
        assert_eq!(
            f.setattr(&root(), &fh, truncate.clone(), Some(wrong))
                .await
                .unwrap_err(),
            nfsstat3::NFS3ERR_NOT_SYNC
        );
        assert_eq!(f.getattr(&fh).await.unwrap().size, 10);
        let ok = f
            .setattr(&root(), &fh, truncate, Some(attr.ctime))
            .await
            .unwrap();
        let Nfs3Option::Some(after) = ok.obj_wcc.after else {
            panic!("no post-op attributes")
        };
        assert_eq!(after.size, 4);
        assert_eq!(std::fs::read(f.tmp.path().join("f")).unwrap(), b"0123");

        let when = nfstime3 {
            seconds: 1_000_000_000,
            nseconds: 123,
        };
        let times = sattr3 {
            mode: Nfs3Option::Some(0o4755),
            atime: set_atime::SET_TO_CLIENT_TIME(when),
            mtime: set_mtime::SET_TO_CLIENT_TIME(when),
            ..sattr3::default()
        };
        f.setattr(&root(), &fh, times, None).await.unwrap();
        let attr = f.getattr(&fh).await.unwrap();
        assert_eq!((attr.mode, attr.atime, attr.mtime), (0o4755, when, when));
        let now = sattr3 {
            mtime: set_mtime::SET_TO_SERVER_TIME,
            ..sattr3::default()
        };
        f.setattr(&root(), &fh, now, None).await.unwrap();
        assert!(f.getattr(&fh).await.unwrap().mtime.seconds > when.seconds);
        assert_eq!(
            f.setattr(
                &root(),
                &f.root,
                sattr3 {
                    size: Nfs3Option::Some(0),
                    ..sattr3::default()
                },
                None
            )
            .await
            .unwrap_err(),
            nfsstat3::NFS3ERR_BADTYPE
        );
    }

    #[tokio::test]
    async fn fsinfo_fsstat_pathconf() {
        let f = Fixture::new().await;
        let ok = call!(
            f,
            &root(),
            Fsinfo(FSINFO3args {
                fsroot: f.root.clone(),
            })
        )
        .unwrap();
        assert_eq!(
            (ok.rtmax, ok.rtpref, ok.wtmax, ok.wtpref),
            (1 << 20, 1 << 20, 1 << 20, 1 << 20)
        );
        assert_eq!(ok.dtpref, 64 * 1024);
        assert_eq!(
            ok.time_delta,
            nfstime3 {
                seconds: 0,
                nseconds: 1
            }
        );
        assert_eq!(
            ok.properties,
            FSF3_LINK | FSF3_SYMLINK | FSF3_HOMOGENEOUS | FSF3_CANSETTIME
        );
        assert!(ok.maxfilesize >= 1 << 40);
        let Nfs3Option::Some(attr) = ok.obj_attributes else {
            panic!("no attributes")
        };
        assert_eq!(attr.type_, ftype3::NF3DIR);

        let ok = call!(
            f,
            &root(),
            Fsstat(FSSTAT3args {
                fsroot: f.root.clone(),
            })
        )
        .unwrap();
        assert!(ok.tbytes > 0 && ok.tbytes >= ok.fbytes && ok.fbytes >= ok.abytes);

        let ok = call!(
            f,
            &root(),
            Pathconf(PATHCONF3args {
                object: f.root.clone(),
            })
        )
        .unwrap();
        assert_eq!(ok.name_max, 255);
        assert!(ok.no_trunc && ok.case_preserving && !ok.case_insensitive);

        let r = f
            .call(&root(), NfsRequest::Null(nfs3_types::xdr_codec::Void))
            .await;
        assert!(matches!(r, NfsReply::Null(_)));
        assert!(f.up.describe().starts_with("dir:/"));
    }
}
