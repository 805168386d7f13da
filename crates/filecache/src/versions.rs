//! What a file-cache entry knows of its file's versions, and the client
//! writes held in it (see `write.rs`, `writeback.rs`).
//!
//! [`FileVersions`] is that part of an entry:
//! - its mutex guards [`Versions`]: upstream's attributes, the local ones,
//!   the dirty chunks and what a durable record lists of them. A leaf
//!   lock: held for short sections, never across an `.await`, and nothing
//!   else is locked while it is held (it may be taken under the cache's
//!   table lock or the fetch state's chunks lock).
//! - `writes` counts WRITEs, twice each: when they mark their chunks dirty
//!   (before their bytes land) and when their bytes have landed. A reader
//!   that must not mix two versions (a frame kept or handed to another
//!   proxy) loads it before reading and compares after.
//! - `unpinned` is told whenever a WRITE under way ends (its [`WritePin`]
//!   drops): a write-back that lets the entry go waits for it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use gvfs_nfs::Credentials;
use gvfs_nfs::layer::lock;
use gvfs_nfs::nfs3_types::nfs3::fattr3;
use tokio::sync::Notify;
use tokio::sync::futures::Notified;

/// What a file-cache entry knows of its file's versions.
#[derive(Debug, Clone)]
pub(crate) struct Versions {
    /// The attributes upstream gave the version fetched (or written back).
    pub(crate) upstream: fattr3,
    /// What clients see: `upstream`, or after local writes their size and
    /// times.
    pub(crate) local: fattr3,
    /// Chunks written here and not yet written back, each with the number
    /// of the write that last touched it.
    pub(crate) dirty: BTreeMap<usize, u64>,
    /// Who wrote last: the credentials write-back uses.
    pub(crate) writer: Option<Credentials>,
    /// WRITEs under way (between marking their chunks dirty and updating
    /// the attributes): the entry is not let go, and FETCH answers are
    /// not made, while there are any.
    pub(crate) writing: u32,
    /// The largest end of a WRITE started: a record lists chunks before
    /// their bytes land, so its size covers them.
    pub(crate) reserved: u64,
    /// Dirty chunks a durable (flushed) record lists: a WRITE touching
    /// only these needs no record made durable before its bytes land.
    pub(crate) durable: BTreeSet<usize>,
    /// Bumped when write-back takes chunks out of `dirty`, so a record
    /// made durable meanwhile does not add them to `durable`.
    pub(crate) epoch: u64,
    /// Being written back to be let go: no WRITE starts.
    pub(crate) closing: bool,
}

impl Versions {
    pub(crate) fn new(upstream: fattr3) -> Self {
        Self {
            local: upstream.clone(),
            upstream,
            dirty: BTreeMap::new(),
            writer: None,
            writing: 0,
            reserved: 0,
            durable: BTreeSet::new(),
            epoch: 0,
            closing: false,
        }
    }
}

/// An entry's versions and the writes held in it (see the module doc for
/// what each part guards).
#[derive(Debug)]
pub(crate) struct FileVersions {
    versions: Mutex<Versions>,
    writes: AtomicU64,
    unpinned: Notify,
}

impl FileVersions {
    pub(crate) fn new(versions: Versions) -> Self {
        Self {
            versions: Mutex::new(versions),
            writes: AtomicU64::new(0),
            unpinned: Notify::new(),
        }
    }

    /// The versions, locked.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Versions> {
        lock(&self.versions)
    }

    /// The writes counter (see the module doc).
    pub(crate) fn writes(&self) -> &AtomicU64 {
        &self.writes
    }

    /// The writes counter now.
    pub(crate) fn writes_seen(&self) -> u64 {
        self.writes.load(Ordering::Acquire)
    }

    /// Counts a WRITE's step; returns the counter after it.
    pub(crate) fn count_write(&self) -> u64 {
        self.writes.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Resolves when a WRITE under way ends after this call (enable it
    /// before checking, so none is missed).
    pub(crate) fn unpinned(&self) -> Notified<'_> {
        self.unpinned.notified()
    }

    /// The attributes upstream gave the version held here.
    pub(crate) fn upstream(&self) -> fattr3 {
        self.lock().upstream.clone()
    }

    /// The attributes clients see.
    pub(crate) fn local(&self) -> fattr3 {
        self.lock().local.clone()
    }

    /// The size clients see.
    pub(crate) fn size(&self) -> u64 {
        self.lock().local.size
    }

    /// Whether it holds writes not yet written back.
    pub(crate) fn is_dirty(&self) -> bool {
        !self.lock().dirty.is_empty()
    }

    /// Whether the entry must not be let go: it holds writes, or one is
    /// under way.
    pub(crate) fn busy(&self) -> bool {
        let v = self.lock();
        !v.dirty.is_empty() || v.writing > 0
    }

    /// The writes counter and the attributes of the bytes held now (the
    /// local ones once written here), or `None` while a WRITE is under way.
    pub(crate) fn stamp(&self) -> Option<(u64, fattr3)> {
        let v = self.lock();
        if v.writing > 0 {
            return None;
        }
        let attrs = if v.dirty.is_empty() {
            v.upstream.clone()
        } else {
            v.local.clone()
        };
        Some((self.writes.load(Ordering::Acquire), attrs))
    }

    /// Marks chunks `first..=last` dirty and a write under way (until the
    /// pin is dropped), before its bytes land. Returns the pin and whether
    /// a durable record lists those chunks already; `None` when the entry
    /// is being let go.
    pub(crate) fn pin_write(
        &self,
        first: usize,
        last: usize,
        end: u64,
    ) -> Option<(WritePin<'_>, bool)> {
        let mut v = self.lock();
        if v.closing {
            return None;
        }
        v.writing += 1;
        let n = self.count_write();
        for c in first..=last {
            v.dirty.insert(c, n);
        }
        v.reserved = v.reserved.max(end);
        let recorded = (first..=last).all(|c| v.durable.contains(&c));
        Some((WritePin(self), recorded))
    }
}

/// A WRITE under way: while it lives the entry counts as busy.
pub(crate) struct WritePin<'a>(&'a FileVersions);

impl Drop for WritePin<'_> {
    fn drop(&mut self) {
        let mut v = self.0.lock();
        v.writing = v.writing.saturating_sub(1);
        drop(v);
        self.0.unpinned.notify_waiters();
    }
}
