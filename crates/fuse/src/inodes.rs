//! Inode numbers for the kernel, NFS file handles for the stack.
//!
//! FUSE names a file by a 64-bit node id that the file system hands out
//! in each entry it returns (LOOKUP, CREATE, MKDIR, ...), and the kernel
//! counts those hand-outs: a FORGET of `n` says it dropped `n` of them.
//! The table keeps, per node id, the NFS handle passed down unchanged and
//! that count, and drops the entry when the count falls to zero. The same
//! handle always gets the same node id while the kernel knows it (so hard
//! links are one inode).
//!
//! A node id is also what `stat` shows as the inode number, and a
//! directory listing shows the server's file id, so a file's node id is
//! its file id wherever that is free: `ls -i`, `find` and `du` see one
//! number for a file either way. The root is node 1 (FUSE's), and a file
//! whose file id is taken by another handle still known to the kernel,
//! or is 0 or 1, gets an id from a range file ids do not reach (from
//! 2^63). An id is free again only once the kernel forgot its old file,
//! so a generation of 0 is enough. The table is bounded: past
//! [`Inodes::MAX`] live entries a new file cannot be looked up (ENFILE)
//! until the kernel forgets some.
//!
//! With a [`Journal`], every hand-out and FORGET is recorded before the
//! reply that carries the id leaves (a hand-out that cannot be recorded
//! is refused), so a process taking the session over can
//! [`restore`](Inodes::restore) the table.

use std::collections::HashMap;
use std::sync::Arc;

use crate::journal::{Journal, NodeEntry, Snapshot};
use crate::limits;

/// A handle shared between the two maps.
pub(crate) type Handle = Arc<[u8]>;

/// What the table knows of one node.
#[derive(Debug)]
struct Node {
    fh: Handle,
    /// Entries handed to the kernel and not yet forgotten.
    lookups: u64,
    /// The file's size, mtime and ctime when it was last opened, to tell
    /// the kernel it may keep its cached pages at the next open.
    opened: Option<Stamp>,
}

/// What says a file's data may have changed: size, mtime, ctime.
pub(crate) type Stamp = (u64, (u32, u32), (u32, u32));

/// The node table.
#[derive(Debug)]
pub(crate) struct Inodes {
    nodes: HashMap<u64, Node>,
    by_fh: HashMap<Handle, u64>,
    next: u64,
    max: usize,
    root_fileid: u64,
    /// Where hand-outs and FORGETs are recorded, if anywhere.
    journal: Option<Arc<Journal>>,
}

/// Why a handle was not handed to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The table is full.
    Full,
    /// The journal could not record it.
    Unrecorded,
}

impl Inodes {
    /// The root's node id (FUSE's).
    pub(crate) const ROOT: u64 = limits::ROOT;

    /// Most live nodes (about 200 bytes each with a 64-byte handle).
    pub(crate) const MAX: usize = limits::MAX_NODES;

    /// Where ids for files whose file id cannot be theirs start.
    const SPARE: u64 = 1 << 63;

    /// A table holding only the root, `root_fh`.
    /// `root_fileid` is the root's file id (listed as node 1).
    pub(crate) fn new(root_fh: &[u8], root_fileid: u64) -> Self {
        Self::with_max(root_fh, root_fileid, Self::MAX)
    }

    /// A table of at most `max` live nodes.
    fn with_max(root_fh: &[u8], root_fileid: u64, max: usize) -> Self {
        let fh: Handle = root_fh.into();
        let mut t = Self {
            nodes: HashMap::new(),
            by_fh: HashMap::new(),
            next: Self::SPARE,
            max,
            root_fileid,
            journal: None,
        };
        t.by_fh.insert(fh.clone(), Self::ROOT);
        t.nodes.insert(
            Self::ROOT,
            Node {
                fh,
                lookups: 1,
                opened: None,
            },
        );
        t
    }

    /// The table the kernel holds, from a journal's replay: the root
    /// `root_fh` (file id `root_fileid`) and `entries` (id, handle, count).
    /// New spare ids start past the largest restored one, so none is
    /// handed out twice. Entries that cannot be the kernel's (the root's
    /// id, 0, no lookups, no handle) are left out.
    pub(crate) fn restore(
        root_fh: &[u8],
        root_fileid: u64,
        entries: impl IntoIterator<Item = (u64, NodeEntry)>,
    ) -> Self {
        let mut t = Self::new(root_fh, root_fileid);
        for (ino, e) in entries {
            if ino <= Self::ROOT || e.lookups == 0 || e.fh.is_empty() || t.nodes.len() >= t.max {
                continue;
            }
            let fh: Handle = e.fh.into();
            t.by_fh.entry(fh.clone()).or_insert(ino);
            if ino > t.next {
                t.next = ino;
            }
            t.nodes.insert(
                ino,
                Node {
                    fh,
                    lookups: e.lookups,
                    opened: None,
                },
            );
        }
        t
    }

    /// The root's handle and file id.
    pub(crate) fn root(&self) -> (Handle, u64) {
        let fh = self.nodes.get(&Self::ROOT).map(|n| n.fh.clone());
        (
            fh.unwrap_or_else(|| Handle::from(&[][..])),
            self.root_fileid,
        )
    }

    /// Records hand-outs and FORGETs in `journal` from now on.
    pub(crate) fn set_journal(&mut self, journal: Option<Arc<Journal>>) {
        self.journal = journal;
    }

    /// Adds each live node but the root to `s`.
    pub(crate) fn snapshot(&self, s: &mut Snapshot) -> std::io::Result<()> {
        for (ino, n) in &self.nodes {
            s.node(*ino, n.lookups, &n.fh)?;
        }
        Ok(())
    }

    /// Records one hand-out of `ino` (new with handle `fh`, else known).
    fn record(&self, ino: u64, fh: &[u8]) -> Result<(), Refused> {
        match &self.journal {
            Some(j) => j.node(ino, 1, fh).map_err(|_| Refused::Unrecorded),
            None => Ok(()),
        }
    }

    /// The handle of node `ino`, if the kernel still holds it.
    pub(crate) fn handle(&self, ino: u64) -> Option<Handle> {
        self.nodes.get(&ino).map(|n| n.fh.clone())
    }

    /// Hands `fh` (file id `fileid`) to the kernel once more: its node
    /// id, made if new. Recorded in the journal first, if there is one:
    /// a hand-out it cannot record is refused, and the table unchanged.
    pub(crate) fn remember(&mut self, fh: &[u8], fileid: u64) -> Result<u64, Refused> {
        if let Some(&ino) = self.by_fh.get(fh) {
            // The root's count is never used (it is not forgotten).
            if ino != Self::ROOT {
                self.record(ino, &[])?;
            }
            if let Some(n) = self.nodes.get_mut(&ino) {
                n.lookups += 1;
            }
            return Ok(ino);
        }
        if self.nodes.len() >= self.max {
            return Err(Refused::Full);
        }
        if fh.is_empty() && self.journal.is_some() {
            // A new node's record is told from a known one's by its handle.
            return Err(Refused::Unrecorded);
        }
        let (ino, next) = if fileid > Self::ROOT
            && fileid < Self::SPARE
            && fileid != self.root_fileid
            && !self.nodes.contains_key(&fileid)
        {
            (fileid, self.next)
        } else {
            let n = self.next.checked_add(1).ok_or(Refused::Full)?;
            (n, n)
        };
        self.record(ino, fh)?;
        self.next = next;
        let fh: Handle = fh.into();
        self.by_fh.insert(fh.clone(), ino);
        self.nodes.insert(
            ino,
            Node {
                fh,
                lookups: 1,
                opened: None,
            },
        );
        Ok(ino)
    }

    /// The kernel dropped `n` of the entries of `ino`. Recorded if it
    /// can be; if not, the node's count stays too high in the journal
    /// (a leak within [`Inodes::MAX`], not a lost id).
    pub(crate) fn forget(&mut self, ino: u64, n: u64) {
        if ino == Self::ROOT {
            return;
        }
        let Some(node) = self.nodes.get_mut(&ino) else {
            return;
        };
        if let Some(j) = &self.journal {
            let _ = j.forget(ino, n);
        }
        node.lookups = node.lookups.saturating_sub(n);
        if node.lookups == 0
            && let Some(node) = self.nodes.remove(&ino)
        {
            self.by_fh.remove(&node.fh);
        }
    }

    /// The node id of `fh`, if the kernel holds it.
    pub(crate) fn ino_of(&self, fh: &[u8]) -> Option<u64> {
        self.by_fh.get(fh).copied()
    }

    /// The inode number a directory listing shows for an entry with
    /// `fileid` and, when the server sent it, handle `fh`: the one `stat`
    /// will show.
    pub(crate) fn listed_ino(&self, fileid: u64, fh: Option<&[u8]>) -> u64 {
        if let Some(&ino) = fh.and_then(|fh| self.by_fh.get(fh)) {
            return ino;
        }
        if fileid == self.root_fileid {
            Self::ROOT
        } else {
            fileid
        }
    }

    /// Notes that `ino` is opened with data stamped `now`; whether the
    /// stamp is the one of its last open (the kernel's cached pages are
    /// still the file's).
    pub(crate) fn opened(&mut self, ino: u64, now: Stamp) -> bool {
        match self.nodes.get_mut(&ino) {
            Some(n) => n.opened.replace(now) == Some(now),
            None => false,
        }
    }

    /// Live nodes, the root included.
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_keeps_its_id_until_every_lookup_is_forgotten() {
        let mut t = Inodes::new(b"root", 2);
        let a = t.remember(b"a", 10).unwrap();
        assert_eq!(a, 10, "a file's node id is its file id");
        assert_eq!(t.remember(b"a", 10).unwrap(), a, "a hard link is one inode");
        let b = t.remember(b"b", 11).unwrap();
        assert_ne!(a, b);
        t.forget(a, 1);
        assert_eq!(t.handle(a).as_deref(), Some(&b"a"[..]));
        t.forget(a, 1);
        assert_eq!(t.handle(a), None, "forgotten");
        assert_eq!(
            t.remember(b"c", 10).unwrap(),
            10,
            "free again once forgotten"
        );
        t.forget(Inodes::ROOT, 100);
        assert_eq!(t.handle(Inodes::ROOT).as_deref(), Some(&b"root"[..]));
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn file_ids_that_cannot_be_node_ids_get_spare_ones() {
        let mut t = Inodes::new(b"root", 2);
        let a = t.remember(b"a", 10).unwrap();
        let clash = t.remember(b"other fs", 10).unwrap();
        assert_ne!(clash, a);
        assert!(clash > Inodes::SPARE);
        assert!(t.remember(b"one", 1).unwrap() > Inodes::SPARE);
        assert!(t.remember(b"zero", 0).unwrap() > Inodes::SPARE);
        assert!(t.remember(b"like root", 2).unwrap() > Inodes::SPARE);
        assert_eq!(t.listed_ino(10, Some(b"other fs")), clash);
        assert_eq!(t.listed_ino(2, None), Inodes::ROOT);
        assert_eq!(t.listed_ino(42, None), 42);
    }

    #[test]
    fn a_full_table_refuses_new_files_until_the_kernel_forgets() {
        let mut t = Inodes::with_max(b"root", 2, 3);
        let a = t.remember(b"a", 10).unwrap();
        t.remember(b"b", 11).unwrap();
        assert_eq!(t.remember(b"c", 12), Err(Refused::Full));
        assert_eq!(t.remember(b"a", 10), Ok(a), "known files are still found");
        t.forget(a, 2);
        assert!(t.remember(b"c", 12).is_ok());
    }

    #[test]
    fn the_kernel_may_keep_its_pages_only_for_an_unchanged_file() {
        let mut t = Inodes::new(b"root", 2);
        let a = t.remember(b"a", 10).unwrap();
        let s = (10, (1, 0), (1, 0));
        assert!(!t.opened(a, s), "first open");
        assert!(t.opened(a, s), "unchanged");
        assert!(!t.opened(a, (11, (2, 0), (2, 0))), "written by someone");
    }
}
