//! Directory listings: READDIRPLUS below, each entry's attributes and
//! node for the kernel, and what its page had no room for kept for its
//! next call.

use std::sync::atomic::Ordering;

use fuser::{Errno, FileAttr, FileType};
use gvfs_nfs::layer::{fh3, lock};
use gvfs_nfs::{CallContext, NfsReply, NfsRequest};
use nfs3_types::nfs3::{LOOKUP3args, Nfs3Option, READDIRPLUS3args, cookieverf3, fattr3};

use crate::attr::{bare_attr, file_attr, kind};
use crate::inodes::Handle;

use super::listing::{Listed, Listing};
use super::{Core, Res, dirop, ok};

/// Bytes asked for per READDIRPLUS.
const DIR_COUNT: u32 = 32 << 10;
/// Most bytes of a READDIRPLUS reply.
const DIR_MAX: u32 = 128 << 10;
/// Most bytes of listings kept for the kernel's next READDIRs, all
/// directories together.
const MAX_LISTINGS: u64 = 32 << 20;

impl Core {
    /// Directory `ino`'s entries from `offset` (a cookie), and whether
    /// they end it: what is left of the last READDIRPLUS if it continues
    /// from there, else a new READDIRPLUS.
    pub(crate) async fn readdir(
        &self,
        cx: &CallContext,
        ino: u64,
        h: u64,
        offset: u64,
    ) -> Res<(Vec<Listed>, bool)> {
        let dir = self.handle(ino)?;
        let (verf, kept) = match lock(&self.opens).get_mut(&h) {
            Some(o) => (o.verf, o.listing.take()),
            None => ([0; 8], None),
        };
        if let Some(l) = kept {
            self.listing_bytes.fetch_sub(l.bytes, Ordering::Relaxed);
            if l.from == offset && offset != 0 {
                return Ok((l.entries, l.eof));
            }
        }
        let verf = if offset == 0 { [0; 8] } else { verf };
        let r = reply!(
            self.call(cx, || Ok(NfsRequest::Readdirplus(READDIRPLUS3args {
                dir: fh3(&dir),
                cookie: offset,
                cookieverf: cookieverf3(verf),
                dircount: DIR_COUNT,
                maxcount: DIR_MAX,
            })))
            .await?,
            Readdirplus
        )?;
        if let Some(o) = lock(&self.opens).get_mut(&h) {
            o.verf = r.cookieverf.0;
        }
        let eof = r.reply.eof;
        let mut out = Vec::with_capacity(r.reply.entries.0.len());
        for e in r.reply.entries.0 {
            let name = e.name.0.into_owned();
            let dot = name == b"." || name == b"..";
            let fh: Option<Handle> = match &e.name_handle {
                Nfs3Option::Some(fh) => Some(fh.data.as_ref().into()),
                Nfs3Option::None => None,
            };
            let attrs = match (e.name_attributes, &fh) {
                (Nfs3Option::Some(a), _) => Some(a),
                (Nfs3Option::None, Some(fh)) => Some(self.getattr_fh(cx, fh).await?),
                (Nfs3Option::None, None) => None,
            };
            // A server that left out the handle: the name's own LOOKUP.
            let (fh, attrs) = match (fh, attrs) {
                (None, _) if !dot => match self.lookup_entry(cx, &dir, &name).await {
                    Ok((fh, a)) => (Some(fh), Some(a)),
                    Err(_) => (None, None),
                },
                other => other,
            };
            let n = lock(&self.inodes).listed_ino(e.fileid, fh.as_deref());
            out.push(Listed {
                ino: n,
                next: e.cookie,
                kind: attrs
                    .as_ref()
                    .map_or(FileType::RegularFile, |a| kind(a.type_)),
                name,
                plus: fh.zip(attrs),
            });
        }
        Ok((out, eof))
    }

    async fn lookup_entry(
        &self,
        cx: &CallContext,
        dir: &Handle,
        name: &[u8],
    ) -> Res<(Handle, fattr3)> {
        let r = reply!(
            self.call(cx, || Ok(NfsRequest::Lookup(LOOKUP3args {
                what: dirop(dir, name)?
            })))
            .await?,
            Lookup
        )?;
        let fh: Handle = r.object.data.as_ref().into();
        let a = self.attrs_or_get(cx, &fh, r.obj_attributes).await?;
        Ok((fh, a))
    }

    /// The attributes a READDIRPLUS entry hands the kernel, and whether
    /// they hand it a node (counted as a lookup, as the kernel counts it):
    /// a node for a file with a handle, while the table has room; none
    /// (node id 0, which the kernel does not keep) for `.`, `..` and the
    /// rest.
    pub(crate) fn listed_entry(&self, e: &Listed) -> (FileAttr, bool) {
        if let (false, Some((fh, a))) = (e.is_dot(), &e.plus) {
            let ino = lock(&self.inodes).remember(fh, a.fileid);
            self.compact_if_due();
            if let Ok(ino) = ino {
                return (file_attr(ino, a), true);
            }
        }
        let ino = if e.is_dot() { e.ino } else { 0 };
        match &e.plus {
            Some((_, a)) => (file_attr(ino, a), false),
            None => (bare_attr(ino, e.kind), false),
        }
    }

    /// Hands `entries` (listed from `offset`) to `add` until it says the
    /// kernel's page is full, and keeps the rest, and whether they end
    /// the directory, for the next call on `h`.
    pub(crate) fn fill_listing(
        &self,
        h: u64,
        offset: u64,
        entries: Vec<Listed>,
        eof: bool,
        mut add: impl FnMut(&Listed) -> bool,
    ) {
        let mut from = offset;
        let mut taken = 0;
        for e in &entries {
            if add(e) {
                break;
            }
            from = e.next;
            taken += 1;
        }
        let rest: Vec<_> = entries.into_iter().skip(taken).collect();
        if !rest.is_empty() || eof {
            self.keep_listing(h, from, rest, eof);
        }
    }

    /// Keeps the entries the kernel had no room for (they continue from
    /// `from`), for its next READDIR of `h`; within [`MAX_LISTINGS`] for
    /// all directories.
    fn keep_listing(&self, h: u64, from: u64, entries: Vec<Listed>, eof: bool) {
        let bytes = entries
            .iter()
            .map(|e| {
                32 + e.name.len() as u64
                    + e.plus.as_ref().map_or(0, |(fh, _)| 100 + fh.len() as u64)
            })
            .sum::<u64>()
            + 32;
        if self.listing_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes > MAX_LISTINGS {
            self.listing_bytes.fetch_sub(bytes, Ordering::Relaxed);
            return;
        }
        match lock(&self.opens).get_mut(&h) {
            Some(o) => {
                if let Some(old) = o.listing.replace(Listing {
                    from,
                    entries,
                    eof,
                    bytes,
                }) {
                    self.listing_bytes.fetch_sub(old.bytes, Ordering::Relaxed);
                }
            }
            None => {
                self.listing_bytes.fetch_sub(bytes, Ordering::Relaxed);
            }
        }
    }
}
