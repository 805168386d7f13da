//! The entry's side of dedup: the blocks of a range held here already
//! ([`Held`]), a range checked against the metadata's piece hashes, and
//! the blocks of a range that passed noted in the index.

use gvfs_ext::{CHUNK, Have};
use gvfs_metafile::hashes::{Fingerprint, HASH_PIECE, fingerprint, piece_hash};

use super::parts::Job;
use super::stale;
use crate::block_index::Place;
use crate::cache::FileCache;
use crate::chunks::chunk_len;
use crate::entry::CachedFile;
use crate::pieces::piece_mask;

/// The blocks of a range held here already.
pub(crate) struct Held {
    /// Which blocks, for FETCH_HAVE.
    pub(crate) have: Have,
    /// Each one's bytes, by its index in the range, and where it was read.
    pub(crate) blocks: Vec<(usize, Vec<u8>, Place, Fingerprint)>,
    /// Whether they are every non-zero block of the range: nothing needs
    /// fetching.
    pub(crate) all: bool,
}

impl Held {
    /// Bytes held.
    pub(crate) fn bytes(&self) -> u64 {
        self.blocks.iter().map(|(_, b, _, _)| b.len() as u64).sum()
    }

    /// Copies the held blocks into `raw`, the range's bytes.
    pub(crate) fn place(&self, raw: &mut [u8]) {
        let bs = self.have.block_size as usize;
        for (i, bytes, _, _) in &self.blocks {
            let at = i * bs;
            if let Some(dst) = raw.get_mut(at..at + bytes.len()) {
                dst.copy_from_slice(bytes);
            }
        }
    }
}

impl CachedFile {
    /// Whether `offset..offset + len` has arrived here.
    pub(crate) fn has_arrived(&self, offset: u64, len: u64) -> bool {
        if self.failure().is_some() || offset.saturating_add(len) > self.size() {
            return false;
        }
        let idx = (offset / u64::from(CHUNK)) as usize;
        let chunks = self.fetch.chunks();
        match chunks.get(idx) {
            Some(c) if c.here() => true,
            Some(_) => {
                let want = piece_mask(idx, chunk_len(self.size(), idx), offset, offset + len);
                chunks
                    .pieces
                    .get(&idx)
                    .is_some_and(|p| p.here & want == want)
            }
            None => false,
        }
    }

    /// The blocks of `offset..offset + count` held here already, read and
    /// their fingerprints checked (blocking I/O); `None` without hashes,
    /// dedup, or a range of whole pieces (a fetch of a few file-cache
    /// pieces inside one: held blocks go only where a piece hash checks
    /// them).
    pub(crate) fn held_blocks(&self, cache: &FileCache, offset: u64, count: u32) -> Option<Held> {
        let meta = self.content.as_deref()?;
        let index = cache.dedup.blocks.as_ref()?;
        let bs = meta.block_size;
        let size = self.size();
        let end = offset + u64::from(count);
        if !offset.is_multiple_of(HASH_PIECE)
            || count == 0
            || !(end.is_multiple_of(HASH_PIECE) || end == size)
        {
            return None;
        }
        let first = offset / u64::from(bs);
        let n = count.div_ceil(bs) as usize;
        let mut held = Held {
            have: Have::new(bs, count),
            blocks: Vec::new(),
            all: true,
        };
        let mut buf = vec![0u8; bs as usize];
        for i in 0..n {
            let block = first + i as u64;
            let Some(&fp) = meta.block_fingerprint(block) else {
                // A zero block: a hole in the local file already.
                continue;
            };
            // Only whole blocks: the last one's fingerprint is of fewer
            // bytes.
            let place = if (block + 1) * u64::from(bs) <= size {
                cache.read_by_fingerprint(index, &fp, &mut buf, Some(self))
            } else {
                None
            };
            match place {
                Some(place) => {
                    held.have.set(i);
                    held.blocks.push((i, buf.clone(), place, fp));
                }
                None => held.all = false,
            }
        }
        Some(held)
    }

    /// Checks `raw`, the range at `offset`, against the metadata's piece
    /// hashes: the number of pieces that differ (counted as hash
    /// mismatches), `None` when there are no hashes to check or the range
    /// does not start on a piece.
    pub(crate) fn check_pieces(&self, cache: &FileCache, offset: u64, raw: &[u8]) -> Option<u64> {
        // Without dedup nothing here depends on the answer: no work.
        cache.dedup.blocks.as_ref()?;
        let meta = self.content.as_deref()?;
        if !offset.is_multiple_of(HASH_PIECE) {
            return None;
        }
        let size = self.size();
        let mut bad = 0;
        for (i, piece) in raw.chunks(HASH_PIECE as usize).enumerate() {
            let at = offset + i as u64 * HASH_PIECE;
            // A piece cut by the range's end (not the file's) is not checked.
            if piece.len() as u64 != HASH_PIECE.min(size.saturating_sub(at)) {
                continue;
            }
            if meta.piece_hash(at / HASH_PIECE) != Some(&piece_hash(piece)) {
                bad += 1;
            }
        }
        cache.counters.hash_mismatches.add(bad);
        Some(bad)
    }

    /// Drops from the index the `suspect` blocks whose bytes differ from
    /// `raw`, the range's bytes as fetched.
    pub(crate) fn drop_wrong(&self, cache: &FileCache, suspect: &Held, raw: &[u8]) {
        let Some(index) = cache.dedup.blocks.as_ref() else {
            return;
        };
        let bs = suspect.have.block_size as usize;
        for (i, bytes, place, fp) in &suspect.blocks {
            if raw.get(i * bs..i * bs + bytes.len()) != Some(bytes.as_slice()) {
                cache.counters.dedup_rejected.add(1);
                stale(index, fp, place);
            }
        }
    }

    /// Notes the blocks of `raw`, the bytes now at `offset` in the file (a
    /// range that passed its piece hashes), in the index: the fingerprints
    /// here, the index's writes on the [`Indexer`].
    pub(crate) fn note_blocks(&self, cache: &FileCache, offset: u64, raw: &[u8]) {
        let (Some(meta), Some(indexer)) = (self.content.as_deref(), cache.dedup.indexer.as_ref())
        else {
            return;
        };
        let bs = meta.block_size as usize;
        let first = offset / bs as u64;
        let mut blocks = Vec::with_capacity(raw.len() / bs);
        for (i, bytes) in raw.chunks_exact(bs).enumerate() {
            let block = first + i as u64;
            // A fingerprint of bytes other than these (the metadata's own
            // doing) would only cost reads: not noted.
            if let Some(fp) = meta.block_fingerprint(block)
                && fingerprint(bytes) == *fp
            {
                blocks.push((block * bs as u64, *fp));
            }
        }
        if !blocks.is_empty() {
            let job = Job::Note {
                fh: self.fh.clone(),
                range: offset,
                blocks,
            };
            indexer.send(job, &cache.dedup.indexed);
        }
    }
}
