//! Open files and directories, files hidden while open (the NFS client's
//! "silly rename"), and both recorded in the node journal and restored
//! from it.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use fuser::Errno;
use gvfs_nfs::layer::lock;
use gvfs_nfs::{CallContext, NfsReply, NfsRequest};
use nfs3_types::nfs3::*;

use crate::attr::stamp;
use crate::inodes::{Handle, Inodes};
use crate::journal::{HiddenEntry, OpenEntry, Table};

use super::held::{Hidden, Open};
use super::{Core, MAX_OPEN, Paging, Res, dirop, ok};

/// The first bytes of a hidden file's name (then the hex of a number
/// drawn from the file handles' counter).
const HIDDEN_PREFIX: &[u8] = b".gvfs-fuse";

impl Core {
    /// If `name` in `dir` is a file open through this mount, renames it to
    /// a hidden name (removed at its last close) and says so.
    pub(super) async fn hide_if_open(
        &self,
        cx: &CallContext,
        dir: &Handle,
        name: &[u8],
    ) -> Res<bool> {
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
        let mut hidden = HIDDEN_PREFIX.to_vec();
        hidden.extend_from_slice(
            format!("{:016x}", self.next_fh.fetch_add(1, Ordering::Relaxed)).as_bytes(),
        );
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
                let mut hidden = lock(&self.hidden);
                if let Some(j) = &self.journal
                    && j.hidden(ino, &h.dir, &h.name, &h.cx.cred).is_err()
                {
                    tracing::warn!(name = %String::from_utf8_lossy(&h.name),
                        "a hidden file is not in the node journal: a process taking the mount over would leave it");
                }
                hidden.insert(ino, h);
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
    pub(super) fn writes_only(&self, ino: u64, flags: i32) -> bool {
        flags & libc::O_ACCMODE == libc::O_WRONLY
            && lock(&self.open_count).get(&ino).copied() == Some(1)
    }

    pub(crate) fn opendir(&self, cx: &CallContext, ino: u64) -> Res<u64> {
        self.handle(ino)?;
        self.add_open(ino, cx)
    }

    /// A new file handle for `ino` opened as `cx`, recorded in the
    /// journal before the kernel is told it (EIO if it cannot be).
    pub(super) fn add_open(&self, ino: u64, cx: &CallContext) -> Res<u64> {
        let h = self.add_open_locked(ino, cx)?;
        self.compact_if_due();
        Ok(h)
    }

    fn add_open_locked(&self, ino: u64, cx: &CallContext) -> Res<u64> {
        let mut opens = lock(&self.opens);
        if opens.len() >= MAX_OPEN {
            return Err(Errno::ENFILE);
        }
        let h = self.next_fh.fetch_add(1, Ordering::Relaxed);
        if let Some(j) = &self.journal {
            j.open(h, ino, &cx.cred).map_err(|_| Errno::EIO)?;
        }
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

    pub(super) fn opener(&self, h: u64) -> Option<CallContext> {
        lock(&self.opens).get(&h).map(|o| o.cx.clone())
    }

    /// The opener's context for I/O through `h`, else the caller's.
    pub(super) fn io_context(&self, h: u64, caller: &CallContext) -> CallContext {
        self.opener(h).unwrap_or_else(|| caller.clone())
    }

    /// Closes `h`; the last close of a hidden file removes it.
    pub(crate) async fn release(&self, h: u64) -> Res<()> {
        let open = {
            let mut opens = lock(&self.opens);
            let open = opens.remove(&h);
            if let (Some(_), Some(j)) = (&open, &self.journal) {
                // Not recorded: the next process keeps a handle nobody
                // uses (and a hidden file until it unmounts).
                let _ = j.release(h);
            }
            open
        };
        self.compact_if_due();
        let Some(open) = open else {
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
        let hidden = self.unhide(open.ino);
        if let Some(h) = hidden {
            self.remove_hidden_file(&h).await?;
        }
        Ok(())
    }

    /// Removes the files hidden because they were removed while open
    /// and are still open (at unmount: nobody can close them now).
    pub(crate) async fn remove_hidden(&self) {
        let inos: Vec<u64> = lock(&self.hidden).keys().copied().collect();
        let hidden: Vec<Hidden> = inos
            .into_iter()
            .filter_map(|ino| self.unhide(ino))
            .collect();
        for h in hidden {
            if let Err(e) = self.remove_hidden_file(&h).await {
                tracing::warn!(name = %String::from_utf8_lossy(&h.name), error = ?e, "cannot remove a hidden file");
            }
        }
    }

    /// Takes hidden file `ino` out of the table (and the journal), to be
    /// removed.
    fn unhide(&self, ino: u64) -> Option<Hidden> {
        let mut hidden = lock(&self.hidden);
        let h = hidden.remove(&ino)?;
        if let Some(j) = &self.journal {
            let _ = j.unhidden(ino);
        }
        Some(h)
    }

    /// Takes over what a journal's replay says the kernel holds: the
    /// nodes, open handles and hidden files of `table`. Call before the
    /// session serves a request. New handles start past every restored
    /// one and every restored hidden name's number, so none is given
    /// twice. Listings are not kept: a READDIR continued across a
    /// takeover starts again from its cookie with a zero verifier.
    #[cfg_attr(not(test), allow(dead_code))] // For a process taking the session over.
    pub(crate) fn restore(&self, table: Table) {
        {
            let mut inodes = lock(&self.inodes);
            let (root_fh, root_fileid) = inodes.root();
            let mut t = Inodes::restore(&root_fh, root_fileid, table.nodes);
            t.set_journal(self.journal.clone());
            *inodes = t;
        }
        self.restore_opens(table.opens, table.hidden);
    }

    /// [`restore`](Self::restore)'s open handles and hidden files.
    pub(crate) fn restore_opens(
        &self,
        opens: HashMap<u64, OpenEntry>,
        hidden: HashMap<u64, HiddenEntry>,
    ) {
        let mut next = 1_u64;
        let mut table = lock(&self.opens);
        let mut counts = lock(&self.open_count);
        table.clear();
        counts.clear();
        for (h, o) in opens.into_iter().take(MAX_OPEN) {
            next = next.max(h.saturating_add(1));
            *counts.entry(o.ino).or_insert(0) += 1;
            table.insert(
                h,
                Open {
                    ino: o.ino,
                    cx: CallContext::with_cred(o.cred),
                    verf: [0; 8],
                    listing: None,
                },
            );
        }
        let mut kept = lock(&self.hidden);
        kept.clear();
        for (ino, h) in hidden {
            if let Some(n) = hidden_number(&h.name) {
                next = next.max(n.saturating_add(1));
            }
            kept.insert(
                ino,
                Hidden {
                    dir: h.dir.into(),
                    name: h.name,
                    cx: CallContext::with_cred(h.cred),
                },
            );
        }
        self.next_fh.store(next, Ordering::Relaxed);
    }

    /// Compacts the journal if it has grown past its bound, under the
    /// inodes, opens and hidden locks (in that order), so that the
    /// snapshot is what the kernel holds. Called with no lock held.
    pub(super) fn compact_if_due(&self) {
        let Some(j) = &self.journal else {
            return;
        };
        if !j.due() {
            return;
        }
        let inodes = lock(&self.inodes);
        let opens = lock(&self.opens);
        let hidden = lock(&self.hidden);
        let done = j.compact(|s| {
            inodes.snapshot(s)?;
            for (h, o) in opens.iter() {
                s.open(*h, o.ino, &o.cx.cred)?;
            }
            for (ino, h) in hidden.iter() {
                s.hidden(*ino, &h.dir, &h.name, &h.cx.cred)?;
            }
            Ok(())
        });
        if let Err(e) = done {
            tracing::warn!(path = %j.path().display(), error = %e, "cannot compact the FUSE node journal");
        }
    }
}

/// The number in a hidden file's name.
fn hidden_number(name: &[u8]) -> Option<u64> {
    let hex = std::str::from_utf8(name.strip_prefix(HIDDEN_PREFIX)?).ok()?;
    u64::from_str_radix(hex, 16).ok()
}
