//! Dedup in the file cache: before a range is fetched, the blocks of it
//! that some held file (another image, or this one further back) holds
//! with the same fingerprint are read from there (each read checked against
//! its fingerprint); only the rest is fetched (FETCH_HAVE says which blocks
//! the answer may leave as zeros). The range, held blocks placed, must
//! match the piece hashes the metadata names before it is written: if it
//! does not, it is fetched whole and the held blocks that differ from it
//! leave the index. Once a range is written, its blocks are noted in the
//! [`BlockIndex`].
//!
//! The file cache's side is here (`FileCache`'s dedup API), the entry's
//! side (a range's held blocks, its piece hashes) in `dedup/file.rs`, the
//! parts it keeps in `dedup/parts.rs`.

use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

use gvfs_metafile::MetaFile;
use gvfs_metafile::hashes::{Fingerprint, HASH_PIECE, fingerprint, piece_hash};
use gvfs_nfs::layer::lock;

use crate::block_index::{BlockIndex, Place};
use crate::cache::FileCache;
use crate::entry::CachedFile;
use crate::error::IndexError;
use parts::{Job, MAX_BLOCK_PATH_FILES};

pub(crate) mod file;
pub(crate) mod parts;

impl FileCache {
    /// Whether it copies held blocks instead of fetching them.
    pub fn dedup_on(&self) -> bool {
        self.dedup.blocks.is_some()
    }

    /// Bytes copied from held blocks instead of fetched, per held file
    /// that had any (its handle), most first, at most `max`.
    pub fn dedup_by_file(&self, max: usize) -> Vec<(Vec<u8>, u64)> {
        let mut out: Vec<(Vec<u8>, u64)> = lock(&self.files)
            .values()
            .map(|f| (f.fh.clone(), f.dedup_bytes.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect();
        for (fh, n) in lock(&self.dedup.block_path.by_file).iter() {
            match out.iter_mut().find(|(f, _)| f == fh) {
                Some((_, m)) => *m += n,
                None => out.push((fh.clone(), *n)),
            }
        }
        out.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        out.truncate(max);
        out
    }

    /// How many of `hashes` (block fingerprints) this proxy holds a block
    /// of, by its index (not read back).
    pub fn blocks_held(&self, hashes: &[Fingerprint]) -> Result<u64, IndexError> {
        let Some(index) = self.dedup.blocks.as_ref() else {
            return Ok(0);
        };
        let mut n = 0;
        for h in hashes {
            if index.find(h)?.is_some() {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Drops the index entries of `fh`'s blocks, on the indexer (a file is
    /// let go under the table's lock), after the notes of it already sent.
    /// An entry a new fetch of the same file makes meanwhile may go too: a
    /// block missing from the index costs only a fetch.
    pub(crate) fn forget_blocks(&self, fh: &[u8]) {
        if let Some(indexer) = self.dedup.indexer.as_ref() {
            indexer.send(Job::Forget(fh.to_vec()), &self.dedup.indexed);
        }
    }
}

impl FileCache {
    /// Reads into `buf` a held block with fingerprint `fp`, from a file
    /// held here (`me` is the file asking, perhaps not in the table yet)
    /// or from the block cache, and says where; drops an index entry whose
    /// block is gone or holds other bytes.
    pub(crate) fn read_by_fingerprint(
        &self,
        index: &BlockIndex,
        fp: &Fingerprint,
        buf: &mut [u8],
        me: Option<&CachedFile>,
    ) -> Option<Place> {
        let place = match index.find(fp) {
            Ok(p) => p?,
            Err(e) => {
                tracing::debug!(error = %e, "dedup: index lookup failed");
                return None;
            }
        };
        // The file that holds it, if a held file does.
        let entry = match me.filter(|m| m.fh == place.fh) {
            Some(_) => None,
            None => lock(&self.files).get(&place.fh).cloned(),
        };
        let read = match (me.filter(|m| m.fh == place.fh), entry.as_deref()) {
            (Some(file), _) | (None, Some(file)) => {
                if !file.has_arrived(place.offset, buf.len() as u64) {
                    // Not arrived yet: nothing wrong with the entry.
                    return None;
                }
                file.file.read_exact_at(buf, place.offset).is_ok()
            }
            (None, None) => self
                .dedup
                .block_path
                .reader
                .as_ref()
                .is_some_and(|read| read(&place.fh, place.offset, buf)),
        };
        if !read {
            stale(index, fp, &place);
            return None;
        }
        if fingerprint(buf) != *fp {
            self.counters.dedup_rejected.add(1);
            stale(index, fp, &place);
            return None;
        }
        Some(place)
    }

    /// Fills `buf` with `fh`'s bytes at `offset` from blocks held here (in
    /// any file, in either cache) with the fingerprints `meta` (its
    /// trusted metadata) names, every piece they make checked against its
    /// hash before a byte is used: true when all of `buf` is filled. For
    /// the block cache's misses (blocking I/O).
    pub fn fill_from_held(&self, fh: &[u8], meta: &MetaFile, offset: u64, buf: &mut [u8]) -> bool {
        let (Some(index), Some(_)) = (self.dedup.blocks.as_ref(), meta.hashes.as_ref()) else {
            return false;
        };
        let size = meta.file_size;
        let end = offset.saturating_add(buf.len() as u64);
        let bs = u64::from(meta.block_size);
        if buf.is_empty() || end > size || bs > HASH_PIECE {
            return false;
        }
        let mut piece = vec![0u8; HASH_PIECE as usize];
        let mut block = vec![0u8; bs as usize];
        for p in offset / HASH_PIECE..end.div_ceil(HASH_PIECE) {
            let at = p * HASH_PIECE;
            let len = HASH_PIECE.min(size - at) as usize;
            let piece = &mut piece[..len];
            piece.fill(0);
            let mut used = Vec::new();
            for (i, dst) in piece.chunks_mut(bs as usize).enumerate() {
                let b = at / bs + i as u64;
                // A zero block: zeros already.
                let Some(fp) = meta.block_fingerprint(b) else {
                    continue;
                };
                let src = &mut block[..dst.len()];
                match self.read_by_fingerprint(index, fp, src, None) {
                    Some(place) => {
                        dst.copy_from_slice(src);
                        used.push((*fp, place));
                    }
                    None => return false,
                }
            }
            if meta.piece_hash(p) != Some(&piece_hash(piece)) {
                // One of them is not what its fingerprint says: none is
                // trusted again.
                self.counters.hash_mismatches.add(1);
                for (fp, place) in &used {
                    stale(index, fp, place);
                }
                return false;
            }
            let (lo, hi) = (offset.max(at), end.min(at + len as u64));
            buf[(lo - offset) as usize..(hi - offset) as usize]
                .copy_from_slice(&piece[(lo - at) as usize..(hi - at) as usize]);
        }
        let n = buf.len() as u64;
        self.counters.dedup_bytes.add(n);
        let mut by_file = lock(&self.dedup.block_path.by_file);
        if by_file.len() < MAX_BLOCK_PATH_FILES || by_file.contains_key(fh) {
            *by_file.entry(fh.to_vec()).or_default() += n;
        }
        true
    }

    /// Notes that the block cache holds `fh`'s `offset..offset + len`,
    /// whose blocks `meta` fingerprints (checked when used, not now).
    pub fn note_held(&self, fh: &[u8], meta: &MetaFile, offset: u64, len: u64) {
        let Some(indexer) = self.dedup.indexer.as_ref() else {
            return;
        };
        let bs = u64::from(meta.block_size);
        let end = offset.saturating_add(len).min(meta.file_size);
        let blocks: Vec<(u64, Fingerprint)> = (offset.div_ceil(bs)..end / bs)
            .filter_map(|b| meta.block_fingerprint(b).map(|fp| (b * bs, *fp)))
            .collect();
        if !blocks.is_empty() {
            let job = Job::Note {
                fh: fh.to_vec(),
                range: offset,
                blocks,
            };
            indexer.send(job, &self.dedup.indexed);
        }
    }

    /// The block cache let go of `fh`'s range at `offset`: its blocks
    /// leave the index (on the indexer; never waits).
    pub fn forget_held(&self, fh: &[u8], offset: u64) {
        if let Some(indexer) = self.dedup.indexer.as_ref() {
            indexer.send(Job::ForgetRange(fh.to_vec(), offset), &self.dedup.indexed);
        }
    }
}

/// Drops an index entry that did not hold its block; `false`, as a block
/// not found.
pub(crate) fn stale(index: &BlockIndex, hash: &Fingerprint, place: &Place) -> bool {
    if let Err(e) = index.drop_stale(hash, place) {
        tracing::debug!(error = %e, "dedup: cannot drop a stale entry");
    }
    false
}
