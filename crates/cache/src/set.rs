//! The in-memory state of frames and the replacement policy inside one set.

use crate::mask::SubBlockMask;

/// A file handle of at most 64 bytes (RFC 1813 `nfs_fh3`), as the cache keys
/// and reports it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FileHandle(Vec<u8>);

impl FileHandle {
    /// The handle's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
    pub(crate) fn from_checked(bytes: &[u8]) -> FileHandle {
        FileHandle(bytes.to_vec())
    }
}

impl std::borrow::Borrow<[u8]> for FileHandle {
    fn borrow(&self) -> &[u8] {
        &self.0
    }
}

/// One frame's state, mirroring its tag plus bookkeeping that is not stored.
#[derive(Debug, Clone, Default)]
pub(crate) struct Frame {
    /// `(file handle, block index)` held, or `None` when empty.
    pub(crate) key: Option<(FileHandle, u64)>,
    pub(crate) valid: SubBlockMask,
    /// Dirty sub-blocks: valid ones, and all partial ones.
    pub(crate) dirty: SubBlockMask,
    /// Sub-blocks of which only `extents[i]` is held (client bytes; the rest
    /// is upstream's and not cached). Disjoint from `valid`.
    pub(crate) partial: SubBlockMask,
    /// Per sub-block `(start, end)` of a partial sub-block's bytes; `(0, 0)`
    /// otherwise.
    pub(crate) extents: Vec<(u32, u32)>,
    /// Where the last dirty write into the block ended (0 when clean).
    pub(crate) dirty_end: u32,
    /// Committed bits the next tag write records.
    pub(crate) committed: SubBlockMask,
    /// Committed bits of the tag as of the last sync: what a crash could
    /// bring back. A frame with any is not reused before the next sync.
    pub(crate) durable_committed: SubBlockMask,
    pub(crate) crcs: Vec<u32>,
    pub(crate) lru: u64,
    /// Per sub-block sequence number of the last dirty write (memory only).
    pub(crate) dirty_seq: Vec<u64>,
    /// Generation of the last tag written.
    pub(crate) generation: u64,
    /// Tag slot holding the tag made durable by the last sync; tag writes go
    /// to the other one.
    pub(crate) durable_slot: u8,
    /// Slot written since the last sync, if any.
    pub(crate) written_slot: Option<u8>,
}

impl Frame {
    pub(crate) fn empty(sub_blocks: u32) -> Frame {
        Frame {
            crcs: vec![0; sub_blocks as usize],
            extents: vec![(0, 0); sub_blocks as usize],
            dirty_seq: vec![0; sub_blocks as usize],
            ..Frame::default()
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.key.is_none()
    }

    /// Whether the frame holds nothing worth keeping (no valid or partial
    /// sub-block).
    pub(crate) fn holds_nothing(&self) -> bool {
        self.valid.is_empty() && self.partial.is_empty()
    }

    /// The dirty bytes as ranges inside the block, ascending, coalesced.
    pub(crate) fn dirty_ranges(&self, sub_block_size: u32) -> Vec<std::ops::Range<u32>> {
        let mut out: Vec<std::ops::Range<u32>> = Vec::new();
        for sb in self.dirty.iter() {
            let base = sb * sub_block_size;
            let r = if self.partial.contains(sb) {
                let (a, b) = self.extents[sb as usize];
                base + a..base + b
            } else {
                base..base + sub_block_size
            };
            match out.last_mut() {
                Some(last) if last.end == r.start => last.end = r.end,
                _ => out.push(r),
            }
        }
        out
    }

    /// Forgets the content, keeping `durable_committed` (disk still has it).
    pub(crate) fn clear(&mut self) {
        self.key = None;
        self.valid = SubBlockMask::EMPTY;
        self.dirty = SubBlockMask::EMPTY;
        self.partial = SubBlockMask::EMPTY;
        self.dirty_end = 0;
        self.committed = SubBlockMask::EMPTY;
        self.crcs.iter_mut().for_each(|c| *c = 0);
        self.extents.iter_mut().for_each(|e| *e = (0, 0));
        self.dirty_seq.iter_mut().for_each(|c| *c = 0);
        self.lru = 0;
    }
}

/// Which way of a set to (re)use for a new block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Victim {
    /// An empty frame.
    Empty(usize),
    /// The least recently used clean frame.
    Clean(usize),
    /// The least recently used clean frame, but its tag on disk still claims
    /// committed dirty data: sync before reusing it.
    CleanAfterSync(usize),
    /// Every frame is dirty; this is the least recently used one, which must
    /// be written back first.
    AllDirty(usize),
}

/// LRU replacement inside one set (`frames` are its ways). Empty frames win,
/// then clean ones (those needing no sync first; an emptied frame whose
/// durable tag still claims committed data needs one too), and dirty frames
/// are never chosen for reuse.
pub(crate) fn choose_victim(frames: &[Frame]) -> Victim {
    if let Some(w) = frames
        .iter()
        .position(|f| f.is_empty() && f.durable_committed.is_empty())
    {
        return Victim::Empty(w);
    }
    let lru_of = |pred: &dyn Fn(&Frame) -> bool| {
        frames
            .iter()
            .enumerate()
            .filter(|(_, f)| pred(f))
            .min_by_key(|(_, f)| f.lru)
            .map(|(w, _)| w)
    };
    if let Some(w) = lru_of(&|f| f.dirty.is_empty() && f.durable_committed.is_empty()) {
        return Victim::Clean(w);
    }
    if let Some(w) = lru_of(&|f| f.dirty.is_empty()) {
        return Victim::CleanAfterSync(w);
    }
    Victim::AllDirty(lru_of(&|_| true).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(lru: u64, dirty: bool, durable: bool) -> Frame {
        let mut f = Frame::empty(4);
        f.key = Some((FileHandle::from_checked(b"f"), lru));
        f.valid = SubBlockMask::range(0..4);
        f.lru = lru;
        if dirty {
            f.dirty = SubBlockMask::range(0..1);
        }
        if durable {
            f.durable_committed = SubBlockMask::range(0..1);
        }
        f
    }

    #[test]
    fn prefers_empty_then_lru_clean_never_dirty() {
        let mut set = vec![
            frame(5, false, false),
            frame(3, false, false),
            frame(1, true, false),
        ];
        assert_eq!(choose_victim(&set), Victim::Clean(1));
        set[1].clear();
        assert_eq!(choose_victim(&set), Victim::Empty(1));
        let set = vec![
            frame(5, true, false),
            frame(3, false, true),
            frame(1, true, false),
        ];
        assert_eq!(choose_victim(&set), Victim::CleanAfterSync(1));
        let mut emptied = frame(7, false, true);
        emptied.clear();
        let set = vec![frame(5, true, false), emptied];
        assert_eq!(choose_victim(&set), Victim::CleanAfterSync(1));
        let set = vec![frame(5, true, false), frame(1, true, false)];
        assert_eq!(choose_victim(&set), Victim::AllDirty(1));
    }
}
