//! READDIR and READDIRPLUS (RFC 1813 sections 3.3.16, 3.3.17).
//!
//! A cookie is a 63-bit hash of the entry's name ("." is 1, ".." is 2,
//! names hash to 3 and up), and a directory is served sorted by cookie. A
//! cookie therefore means "after this name" forever: it survives entries
//! coming and going between calls and restarts of the proxy, so the cookie
//! verifier never changes and no cookie is ever refused. Entries sharing a
//! cookie (a hash collision) are never split across two replies.

use std::os::fd::AsFd;

use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::{List, Opaque};
use rustix::fs::{Dir, Mode, OFlags, openat};

use super::attr::{Attr, stat_at};
use super::handle::HANDLE_LEN;
use super::perm::{Caller, R};
use super::status::Fail;
use super::{DirNode, Export, mix64};

/// Cookie of ".".
const COOKIE_DOT: u64 = 1;
/// Cookie of "..".
const COOKIE_DOTDOT: u64 = 2;
/// Smallest cookie of a named entry.
const FIRST_NAME_COOKIE: u64 = 3;

/// Largest reply built, whatever the client allows.
const MAX_REPLY: u32 = 1 << 20;

/// Encoded size of a fattr3.
const FATTR3_SIZE: usize = 84;
/// Status, directory post_op_attr, cookie verifier, end of list, eof.
const REPLY_BASE: usize = 4 + (4 + FATTR3_SIZE) + 8 + 4 + 4;

/// The cookie of the entry `name`: stable across calls, processes and
/// directory changes.
pub(super) fn name_cookie(name: &[u8]) -> u64 {
    // FNV-1a, then a finaliser so that similar names spread.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let c = mix64(h) >> 1;
    if c < FIRST_NAME_COOKIE {
        c + FIRST_NAME_COOKIE
    } else {
        c
    }
}

fn padded(len: usize) -> usize {
    (len + 3) & !3
}

/// Encoded size of an entry3 with its list marker.
fn entry3_size(name_len: usize) -> usize {
    4 + 8 + 4 + padded(name_len) + 8
}

/// Encoded size of an entryplus3 (attributes and handle included) with its
/// list marker.
fn entryplus3_size(name_len: usize) -> usize {
    entry3_size(name_len) + (4 + FATTR3_SIZE) + (4 + 4 + padded(HANDLE_LEN))
}

/// What READDIRPLUS's dircount counts of an entry: fileid, name, cookie.
fn entry_dir_size(name_len: usize) -> usize {
    8 + 4 + padded(name_len) + 8
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dot,
    DotDot,
    Child,
}

#[derive(Debug)]
struct Entry {
    cookie: u64,
    name: Vec<u8>,
    /// The inode as the directory lists it (0 for "..", found on demand).
    ino: u64,
    kind: Kind,
}

/// The entries after `cookie` that `fits` accepts one by one (it is told
/// whether the entry would be the first), and whether they reach the end.
fn page(
    entries: &[Entry],
    cookie: u64,
    mut fits: impl FnMut(&Entry, bool) -> bool,
) -> Result<(&[Entry], bool), Fail> {
    let start = entries.partition_point(|e| e.cookie <= cookie);
    let rest = &entries[start..];
    let mut n = 0;
    while n < rest.len() && fits(&rest[n], n == 0) {
        n += 1;
    }
    let eof = n == rest.len();
    if !eof {
        while n > 0 && rest[n - 1].cookie == rest[n].cookie {
            n -= 1;
        }
        if n == 0 {
            return Err(Fail(nfsstat3::NFS3ERR_TOOSMALL));
        }
    }
    Ok((&rest[..n], eof))
}

impl Export {
    /// Every entry of `dir`, "." and ".." first, then by cookie.
    fn list(&self, dir: &DirNode<'_>) -> Result<Vec<Entry>, Fail> {
        let fd = openat(
            dir.fd.as_fd(),
            c".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let mut listing = Dir::new(fd)?;
        let mut out = vec![
            Entry {
                cookie: COOKIE_DOT,
                name: b".".to_vec(),
                ino: dir.attr.ino,
                kind: Kind::Dot,
            },
            Entry {
                cookie: COOKIE_DOTDOT,
                name: b"..".to_vec(),
                ino: 0,
                kind: Kind::DotDot,
            },
        ];
        while let Some(e) = listing.read() {
            let e = e?;
            let name = e.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            out.push(Entry {
                cookie: name_cookie(name),
                name: name.to_vec(),
                ino: e.ino(),
                kind: Kind::Child,
            });
        }
        out[2..].sort_unstable_by(|a, b| a.cookie.cmp(&b.cookie).then_with(|| a.name.cmp(&b.name)));
        Ok(out)
    }

    /// Attributes of the parent of `dir`; the export root is its own parent.
    fn parent_attr(&self, dir: &DirNode<'_>) -> Option<Attr> {
        if dir.attr.ino == self.root.ino {
            Some(dir.attr)
        } else {
            stat_at(dir.fd.as_fd(), b"..").ok()
        }
    }

    fn remember(&self, dir: &DirNode<'_>, page: &[Entry]) {
        let children = page.iter().filter(|e| e.kind == Kind::Child);
        self.index
            .insert_many(dir.attr.ino, children.map(|e| (e.ino, e.name.as_slice())));
    }

    fn cookie_verf(&self) -> cookieverf3 {
        cookieverf3(self.export_id.to_be_bytes())
    }

    /// What READDIR and READDIRPLUS share: finds the directory `fh` names,
    /// checks the caller may read it, lists it and takes the page after
    /// `cookie` that `fits` accepts (as `page` does), turning each entry of
    /// it into a reply entry with `to_entry`. Returns the directory's
    /// attributes, the reply entries and whether they reach the end; on
    /// failure, the status and the directory's attributes when found.
    fn listed_page<T>(
        &self,
        c: &Caller,
        fh: &nfs_fh3,
        cookie: u64,
        fits: impl FnMut(&Entry, bool) -> bool,
        mut to_entry: impl FnMut(&DirNode<'_>, &Entry) -> T,
    ) -> Result<(Attr, Vec<T>, bool), (nfsstat3, post_op_attr)> {
        let dir = self
            .find_dir(fh)
            .map_err(|(Fail(s), attr)| (s, self.post(attr.as_ref())))?;
        let fail = |Fail(s)| (s, self.post(Some(&dir.attr)));
        if !c.may(&dir.attr, R) {
            return Err(fail(Fail(nfsstat3::NFS3ERR_ACCES)));
        }
        let entries = self.list(&dir).map_err(fail)?;
        let (page, eof) = page(&entries, cookie, fits).map_err(fail)?;
        let out = page.iter().map(|e| to_entry(&dir, e)).collect();
        self.remember(&dir, page);
        Ok((dir.attr, out, eof))
    }

    pub(super) fn readdir(&self, c: &Caller, a: READDIR3args) -> READDIR3res<'static> {
        let limit = a.count.min(MAX_REPLY) as usize;
        let mut used = REPLY_BASE;
        let mut parent = None;
        let listed = self.listed_page(
            c,
            &a.dir,
            a.cookie,
            |e, _| {
                used += entry3_size(e.name.len());
                used <= limit
            },
            |dir, e| entry3 {
                fileid: match e.kind {
                    Kind::DotDot => parent
                        .get_or_insert_with(|| self.parent_attr(dir))
                        .map_or(dir.attr.ino, |p| p.ino),
                    Kind::Dot | Kind::Child => e.ino,
                },
                name: filename3(Opaque::owned(e.name.clone())),
                cookie: e.cookie,
            },
        );
        match listed {
            Ok((dir, out, eof)) => Nfs3Result::Ok(READDIR3resok {
                dir_attributes: self.post(Some(&dir)),
                cookieverf: self.cookie_verf(),
                reply: dirlist3 {
                    entries: List(out),
                    eof,
                },
            }),
            Err((s, dir_attributes)) => Nfs3Result::Err((s, READDIR3resfail { dir_attributes })),
        }
    }

    pub(super) fn readdirplus(&self, c: &Caller, a: READDIRPLUS3args) -> READDIRPLUS3res<'static> {
        let limit = a.maxcount.min(MAX_REPLY) as usize;
        let dir_limit = a.dircount.min(MAX_REPLY) as usize;
        let (mut used, mut dir_used) = (REPLY_BASE, 0);
        let listed = self.listed_page(
            c,
            &a.dir,
            a.cookie,
            |e, first| {
                used += entryplus3_size(e.name.len());
                dir_used += entry_dir_size(e.name.len());
                used <= limit && (first || dir_used <= dir_limit)
            },
            |dir, e| {
                // Like knfsd: no handle for ".." of the export root.
                let attr = match e.kind {
                    Kind::Dot => Some(dir.attr),
                    Kind::DotDot if dir.attr.ino == self.root.ino => None,
                    Kind::DotDot => self.parent_attr(dir),
                    Kind::Child => stat_at(dir.fd.as_fd(), &e.name).ok(),
                };
                entryplus3 {
                    fileid: attr.map_or(e.ino, |a| a.ino),
                    name: filename3(Opaque::owned(e.name.clone())),
                    cookie: e.cookie,
                    name_attributes: self.post(attr.as_ref()),
                    name_handle: match attr {
                        Some(a) => Nfs3Option::Some(self.handle(a.key())),
                        None => Nfs3Option::None,
                    },
                }
            },
        );
        match listed {
            Ok((dir, out, eof)) => Nfs3Result::Ok(READDIRPLUS3resok {
                dir_attributes: self.post(Some(&dir)),
                cookieverf: self.cookie_verf(),
                reply: dirlistplus3 {
                    entries: List(out),
                    eof,
                },
            }),
            Err((s, dir_attributes)) => {
                Nfs3Result::Err((s, READDIRPLUS3resfail { dir_attributes }))
            }
        }
    }
}

#[cfg(test)]
mod tests;
