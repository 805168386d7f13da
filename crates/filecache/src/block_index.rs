//! Content-addressed blocks: where in the files this proxy holds a block
//! with a given fingerprint (the start of its BLAKE3, from the image's
//! metadata) lies, so that a block of another image with that fingerprint
//! is copied from here instead of fetched.
//!
//! The index lives in the proxy's [`MetaIndex`] (sled, beside the file
//! cache's records, so it survives restarts), under two kinds of keys:
//!
//! ```text
//!   'h' fingerprint[8]                -> fh_len[1] fh offset[8, BE]
//!   'r' fh_len[1] fh range[8, BE]     -> (offset[8, BE] fingerprint[8])*
//! ```
//!
//! The first finds a block by fingerprint (the last place it was seen); the
//! second lists the blocks of each range of a file noted together (one
//! write a range, not one a block: sled's writes are what dedup costs), so
//! they go with the file when it is let go or evicted. Nothing here is trusted: a block found is read and its
//! fingerprint checked, and the range it goes into is checked against the
//! piece hashes of the image's metadata before a byte of it is used
//! (`filecache/dedup.rs`); an entry that fails is dropped. So a stale entry
//! (a file rewritten, cut short by a crash) costs a read, and a collision
//! or a lying peer costs a fetch, never wrong bytes.
//!
//! Bounded: entries are made only for blocks held in the file cache or the
//! block cache (whose budgets bound them) and removed with them: with a
//! file the file cache lets go, with a block the block cache lets go.

use std::sync::Arc;

use crate::error::IndexError;
use crate::index::MetaIndex;
use gvfs_metafile::hashes::{FINGERPRINT_LEN, Fingerprint};

const FORWARD: u8 = b'h';
const REVERSE: u8 = b'r';
/// Ranges of one file removed at a time when it is let go.
const FORGET_BATCH: usize = 256;
/// Bytes of one block in a range's list.
const LISTED_LEN: usize = 8 + FINGERPRINT_LEN;

/// Where a block with some hash lies: a held file and an offset in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// The held file's handle.
    pub fh: Vec<u8>,
    /// Where the block starts.
    pub offset: u64,
}

/// The hash -> place index of the blocks held here.
#[derive(Clone)]
pub struct BlockIndex {
    index: Arc<dyn MetaIndex>,
}

impl std::fmt::Debug for BlockIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockIndex").finish_non_exhaustive()
    }
}

fn forward_key(hash: &Fingerprint) -> [u8; 1 + FINGERPRINT_LEN] {
    let mut k = [0u8; 1 + FINGERPRINT_LEN];
    k[0] = FORWARD;
    k[1..].copy_from_slice(hash);
    k
}

fn place_bytes(fh: &[u8], offset: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(1 + fh.len() + 8);
    v.push(fh.len() as u8);
    v.extend_from_slice(fh);
    v.extend_from_slice(&offset.to_be_bytes());
    v
}

fn file_prefix(fh: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + fh.len());
    k.push(REVERSE);
    k.push(fh.len() as u8);
    k.extend_from_slice(fh);
    k
}

fn reverse_key(fh: &[u8], offset: u64) -> Vec<u8> {
    let mut k = file_prefix(fh);
    k.extend_from_slice(&offset.to_be_bytes());
    k
}

fn parse_place(v: &[u8]) -> Option<Place> {
    let (&n, rest) = v.split_first()?;
    let n = usize::from(n);
    if rest.len() != n + 8 || n > 64 {
        return None;
    }
    let mut off = [0u8; 8];
    off.copy_from_slice(&rest[n..]);
    Some(Place {
        fh: rest[..n].to_vec(),
        offset: u64::from_be_bytes(off),
    })
}

impl BlockIndex {
    /// The index kept in `index`.
    pub fn new(index: Arc<dyn MetaIndex>) -> Self {
        Self { index }
    }

    /// Where a block with `hash` was last held, if anywhere.
    pub fn find(&self, hash: &Fingerprint) -> Result<Option<Place>, IndexError> {
        Ok(self
            .index
            .get(&forward_key(hash))?
            .as_deref()
            .and_then(parse_place))
    }

    /// Notes that file `fh` holds the `blocks` (offset and fingerprint
    /// each) of the range at `range`, replacing what was noted of it.
    pub fn note(
        &self,
        fh: &[u8],
        range: u64,
        blocks: &[(u64, Fingerprint)],
    ) -> Result<(), IndexError> {
        if fh.len() > 64 || blocks.is_empty() {
            return Ok(());
        }
        let mut list = Vec::with_capacity(blocks.len() * LISTED_LEN);
        for (offset, fp) in blocks {
            list.extend_from_slice(&offset.to_be_bytes());
            list.extend_from_slice(fp);
        }
        // The list first: a place is findable only once it can be dropped.
        self.index.put(&reverse_key(fh, range), &list)?;
        for (offset, fp) in blocks {
            self.index
                .put(&forward_key(fp), &place_bytes(fh, *offset))?;
        }
        Ok(())
    }

    /// Makes what was noted and dropped so far durable.
    pub fn flush(&self) -> Result<(), IndexError> {
        self.index.flush()
    }

    /// Drops the entry for `hash` if it still says `place` (which did not
    /// hold the block after all).
    pub fn drop_stale(&self, hash: &Fingerprint, place: &Place) -> Result<(), IndexError> {
        if self.find(hash)?.as_ref() == Some(place) {
            self.index.remove(&forward_key(hash))?;
        }
        Ok(())
    }

    /// Drops every entry of file `fh`, which is no longer held; returns the
    /// number of blocks its lists named.
    pub fn forget_file(&self, fh: &[u8]) -> Result<u64, IndexError> {
        if fh.len() > 64 {
            return Ok(0);
        }
        let prefix = file_prefix(fh);
        let mut dropped = 0;
        loop {
            let batch = self.index.scan_prefix(&prefix, FORGET_BATCH)?;
            if batch.is_empty() {
                return Ok(dropped);
            }
            for (key, list) in batch {
                dropped += self.forget_list(fh, &key, &list)?;
            }
        }
    }

    /// Drops the entries of the range of `fh` noted at `range` (a block
    /// the block cache let go); returns the number of blocks its list
    /// named.
    pub fn forget_range(&self, fh: &[u8], range: u64) -> Result<u64, IndexError> {
        if fh.len() > 64 {
            return Ok(0);
        }
        let key = reverse_key(fh, range);
        match self.index.get(&key)? {
            Some(list) => self.forget_list(fh, &key, &list),
            None => Ok(0),
        }
    }

    /// Drops `list` (under `key`) and each place in it the index still
    /// finds its block at.
    fn forget_list(&self, fh: &[u8], key: &[u8], list: &[u8]) -> Result<u64, IndexError> {
        let mut dropped = 0;
        for item in list.chunks_exact(LISTED_LEN) {
            let (offset, fp) = item.split_at(8);
            let (Ok(offset), Ok(fp)) = (<[u8; 8]>::try_from(offset), <Fingerprint>::try_from(fp))
            else {
                continue;
            };
            let place = Place {
                fh: fh.to_vec(),
                offset: u64::from_be_bytes(offset),
            };
            if self.find(&fp)?.as_ref() == Some(&place) {
                self.index.remove(&forward_key(&fp))?;
            }
            dropped += 1;
        }
        self.index.remove(key)?;
        Ok(dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::MemIndex;

    fn h(b: u8) -> Fingerprint {
        [b; FINGERPRINT_LEN]
    }

    #[test]
    fn blocks_are_found_by_hash_and_go_with_their_file() {
        let index = BlockIndex::new(Arc::new(MemIndex::new(1000)));
        index.note(b"fileA", 0, &[(0, h(1)), (4096, h(2))]).unwrap();
        index.note(b"fileB", 8192, &[(8192, h(2))]).unwrap();
        index.note(b"fileAB", 0, &[(0, h(3))]).unwrap();
        let at = |fh: &[u8], offset| {
            Some(Place {
                fh: fh.to_vec(),
                offset,
            })
        };
        assert_eq!(index.find(&h(1)).unwrap(), at(b"fileA", 0));
        // The last place a block was seen.
        assert_eq!(index.find(&h(2)).unwrap(), at(b"fileB", 8192));
        assert_eq!(index.find(&h(9)).unwrap(), None);
        // Forgetting A leaves B's copy of block 2, and file "fileAB" (whose
        // handle starts with A's) alone.
        assert_eq!(index.forget_file(b"fileA").unwrap(), 2);
        assert_eq!(index.find(&h(1)).unwrap(), None);
        assert_eq!(index.find(&h(2)).unwrap(), at(b"fileB", 8192));
        assert_eq!(index.find(&h(3)).unwrap(), at(b"fileAB", 0));
        // A stale entry is dropped only where it still points.
        index
            .drop_stale(
                &h(2),
                &Place {
                    fh: b"fileA".to_vec(),
                    offset: 4096,
                },
            )
            .unwrap();
        assert_eq!(index.find(&h(2)).unwrap(), at(b"fileB", 8192));
        index
            .drop_stale(
                &h(2),
                &Place {
                    fh: b"fileB".to_vec(),
                    offset: 8192,
                },
            )
            .unwrap();
        assert_eq!(index.find(&h(2)).unwrap(), None);
        // Its list still names the block; nothing of it is found any more.
        assert_eq!(index.forget_file(b"fileB").unwrap(), 1);
        assert_eq!(index.forget_file(b"fileB").unwrap(), 0);
    }

    #[test]
    fn a_range_goes_alone() {
        let index = BlockIndex::new(Arc::new(MemIndex::new(1000)));
        index.note(b"disk", 0, &[(0, h(1)), (4096, h(2))]).unwrap();
        index.note(b"disk", 65536, &[(65536, h(3))]).unwrap();
        // Block 2 is seen later in another file: its entry is not the
        // range's any more.
        index.note(b"other", 0, &[(0, h(2))]).unwrap();
        assert_eq!(index.forget_range(b"disk", 0).unwrap(), 2);
        assert_eq!(index.find(&h(1)).unwrap(), None);
        assert_eq!(
            index.find(&h(2)).unwrap().map(|p| p.fh),
            Some(b"other".to_vec())
        );
        assert_eq!(index.find(&h(3)).unwrap().map(|p| p.offset), Some(65536));
        // Gone, and a range never noted: nothing to drop.
        assert_eq!(index.forget_range(b"disk", 0).unwrap(), 0);
        assert_eq!(index.forget_range(b"disk", 4096).unwrap(), 0);
        assert_eq!(index.forget_file(b"disk").unwrap(), 1);
    }

    #[test]
    fn a_damaged_entry_finds_nothing() {
        let raw = Arc::new(MemIndex::new(10));
        let index = BlockIndex::new(raw.clone());
        raw.put(&forward_key(&h(4)), b"\x05ab").unwrap();
        assert_eq!(index.find(&h(4)).unwrap(), None);
        raw.put(&forward_key(&h(4)), &[200; 209]).unwrap();
        assert_eq!(index.find(&h(4)).unwrap(), None);
    }
}
