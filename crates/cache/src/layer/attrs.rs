//! What the cache layer remembers per file: the attributes upstream last
//! reported (for coherence and for answering hits), the size and mtime the
//! client wrote while it has dirty data (the overlay), the last writer's
//! credentials and the read-ahead state.
//!
//! The table is bounded: past its capacity the least recently used entries
//! that hold no overlay are forgotten. Entries with an overlay are kept,
//! since their dirty data must be written back with the size the client
//! wrote; they are bounded by the cache's capacity anyway.

use std::collections::HashMap;

use gvfs_nfs::{Credentials, FileVersion, same_version};
use nfs3_types::nfs3::{fattr3, ftype3, nfstime3, wcc_attr};

/// How many files the table remembers before forgetting clean ones.
pub(super) const MAX_FILES: usize = 64 * 1024;

/// The size and mtime a client's cached writes gave a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Overlay {
    /// The file size as the client sees it.
    pub(super) size: u64,
    /// The time of the last write (also reported as ctime).
    pub(super) mtime: nfstime3,
    /// Bumped on every change, so a write-back can tell whether the client
    /// wrote while it ran.
    pub(super) seq: u64,
}

/// Where attributes seen in a reply came from.
#[derive(Debug, Clone, Copy)]
pub(super) enum Seen {
    /// A reply to someone's call that did not change the file through us:
    /// any change since last time was made by someone else.
    Foreign,
    /// The reply to a change we sent upstream ourselves; `before` is the
    /// reply's pre-operation attributes, if it had them. The change is not
    /// foreign if `before` matches what we knew (or is absent).
    Own(Option<wcc_attr>),
}

/// One file's state.
#[derive(Debug, Default)]
pub(super) struct FileState {
    /// Attributes upstream last reported.
    pub(super) upstream: Option<fattr3>,
    /// Set while the file has (or may have) dirty data in the cache.
    pub(super) overlay: Option<Overlay>,
    /// Dirty data of this file was recovered from an earlier session; the
    /// overlay must be rebuilt from it before the file is served.
    pub(super) recovered: bool,
    /// Credentials of the last client that wrote the file, used to write
    /// its data back.
    pub(super) writer: Option<Credentials>,
    /// Bumped whenever cached data of the file must not be refilled by a
    /// fetch that started earlier (invalidation, truncation, write-through).
    pub(super) generation: u64,
    /// Where the last READ ended, to detect sequential access.
    pub(super) next_read: Option<u64>,
    /// Where the current sequential run of READs started: read-ahead goes
    /// as far past a READ as the run has come, up to the configured window.
    pub(super) run_start: u64,
    /// First block read-ahead has not been issued for yet.
    pub(super) readahead_next: u64,
    lru: u64,
}

impl FileState {
    /// Whether the file has, or may have, dirty data in the cache.
    pub(super) fn pinned(&self) -> bool {
        self.overlay.is_some() || self.recovered
    }

    /// The attributes the client should see: upstream's, with the overlay's
    /// size and times for a file with dirty data.
    pub(super) fn effective(&self) -> Option<fattr3> {
        let mut a = self.upstream.clone()?;
        if let Some(ov) = self.overlay {
            a.size = ov.size;
            a.used = a.used.max(ov.size);
            a.mtime = ov.mtime;
            a.ctime = ov.mtime;
        }
        Some(a)
    }
}

/// The bounded per-file table.
#[derive(Debug)]
pub(super) struct FileTable {
    map: HashMap<Vec<u8>, FileState>,
    clock: u64,
    capacity: usize,
    seq: u64,
}

fn older(a: nfstime3, b: nfstime3) -> bool {
    (a.seconds, a.nseconds) < (b.seconds, b.nseconds)
}

impl FileTable {
    pub(super) fn new(capacity: usize) -> FileTable {
        FileTable {
            map: HashMap::new(),
            clock: 0,
            capacity: capacity.max(1),
            seq: 0,
        }
    }

    pub(super) fn get(&self, fh: &[u8]) -> Option<&FileState> {
        self.map.get(fh)
    }

    /// The file's entry, created if needed; touches its LRU stamp.
    pub(super) fn entry(&mut self, fh: &[u8]) -> &mut FileState {
        self.clock += 1;
        let clock = self.clock;
        if !self.map.contains_key(fh) {
            self.shrink();
            self.map.insert(fh.to_vec(), FileState::default());
        }
        let st = self.map.entry(fh.to_vec()).or_default();
        st.lru = clock;
        st
    }

    /// Forgets the oldest eighth of the unpinned entries once full.
    fn shrink(&mut self) {
        if self.map.len() < self.capacity {
            return;
        }
        let mut old: Vec<(u64, Vec<u8>)> = self
            .map
            .iter()
            .filter(|(_, s)| !s.pinned())
            .map(|(k, s)| (s.lru, k.clone()))
            .collect();
        old.sort_unstable();
        let n = (self.capacity / 8).max(1).min(old.len());
        for (_, k) in old.into_iter().take(n) {
            self.map.remove(&k);
        }
    }

    pub(super) fn remove(&mut self, fh: &[u8]) {
        self.map.remove(fh);
    }

    pub(super) fn generation(&self, fh: &[u8]) -> u64 {
        self.map.get(fh).map_or(0, |s| s.generation)
    }

    pub(super) fn bump_generation(&mut self, fh: &[u8]) {
        self.entry(fh).generation += 1;
    }

    /// Cancels every fill in flight (a flush is dropping all clean data).
    pub(super) fn bump_all_generations(&mut self) {
        for st in self.map.values_mut() {
            st.generation += 1;
        }
    }

    pub(super) fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Records attributes upstream reported for `fh`. Returns true when the
    /// file changed behind our back and has no dirty data: its clean cached
    /// blocks must then be dropped. Only regular files are remembered.
    pub(super) fn observe(&mut self, fh: &[u8], a: &fattr3, seen: Seen) -> bool {
        if a.type_ != ftype3::NF3REG {
            return false;
        }
        let st = self.entry(fh);
        if let Some(old) = &st.upstream
            && older(a.ctime, old.ctime)
        {
            // A reply overtaken by a newer one (calls run concurrently).
            return false;
        }
        let stale = match (&st.upstream, seen) {
            (None, _) => false,
            (Some(old), Seen::Foreign) => !same_version(old, a),
            // A `before` older than what we know: our own concurrent calls
            // answered out of order, not someone else's change.
            (Some(old), Seen::Own(Some(b))) => {
                !older(b.ctime, old.ctime) && FileVersion::of(old) != FileVersion::of_wcc(&b)
            }
            (Some(_), Seen::Own(None)) => false,
        };
        let stale = stale && !st.pinned();
        if stale {
            st.generation += 1;
        }
        st.upstream = Some(a.clone());
        stale
    }

    /// Files whose dirty data was recovered from an earlier session.
    pub(super) fn mark_recovered(&mut self, fh: &[u8]) {
        self.entry(fh).recovered = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use gvfs_nfs::testing::file_attrs as attrs;

    #[test]
    fn foreign_change_is_stale_unless_pinned() {
        let mut t = FileTable::new(16);
        assert!(!t.observe(b"a", &attrs(10, 1), Seen::Foreign));
        assert!(!t.observe(b"a", &attrs(10, 1), Seen::Foreign));
        assert!(t.observe(b"a", &attrs(20, 2), Seen::Foreign));
        let g = t.generation(b"a");
        t.entry(b"a").overlay = Some(Overlay {
            size: 5,
            mtime: nfstime3::default(),
            seq: 1,
        });
        assert!(!t.observe(b"a", &attrs(30, 3), Seen::Foreign));
        assert_eq!(t.generation(b"a"), g);
        assert_eq!(
            t.get(b"a").and_then(|s| s.effective()).map(|a| a.size),
            Some(5)
        );
    }

    #[test]
    fn own_change_is_stale_only_if_before_differs() {
        let mut t = FileTable::new(16);
        t.observe(b"a", &attrs(10, 1), Seen::Foreign);
        let before = wcc_attr {
            size: 10,
            mtime: attrs(10, 1).mtime,
            ctime: attrs(10, 1).ctime,
        };
        assert!(!t.observe(b"a", &attrs(20, 2), Seen::Own(Some(before))));
        // Our two writes answered out of order: not a foreign change.
        assert!(!t.observe(b"a", &attrs(30, 3), Seen::Own(Some(before))));
        let someone_else = wcc_attr {
            size: 25,
            mtime: attrs(25, 4).mtime,
            ctime: attrs(25, 4).ctime,
        };
        assert!(t.observe(b"a", &attrs(40, 5), Seen::Own(Some(someone_else))));
        // An overtaken reply changes nothing.
        assert!(!t.observe(b"a", &attrs(10, 1), Seen::Foreign));
        assert_eq!(
            t.get(b"a").and_then(|s| s.upstream.clone()).map(|a| a.size),
            Some(40)
        );
    }

    #[test]
    fn table_stays_bounded_but_keeps_pinned_entries() {
        let mut t = FileTable::new(8);
        t.entry(b"pinned").recovered = true;
        for i in 0..100u32 {
            t.entry(&i.to_le_bytes());
        }
        assert!(t.map.len() <= 8);
        assert!(t.get(b"pinned").is_some());
    }
}
