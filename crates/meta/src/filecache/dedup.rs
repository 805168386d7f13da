//! Dedup in the file cache: before a range is fetched, the blocks of it
//! that some held file (another image, or this one further back) holds
//! with the same fingerprint are read from there (each read checked against
//! its fingerprint); only the rest is fetched (FETCH_HAVE says which blocks
//! the answer may leave as zeros). The range, held blocks placed, must
//! match the piece hashes the metadata names before it is written: if it
//! does not, it is fetched whole and the held blocks that differ from it
//! leave the index. Once a range is written, its blocks are noted in the
//! [`BlockIndex`].

use super::*;
use crate::dedup::{BlockIndex, Place};
use crate::ext::Have;
use crate::format::{Fingerprint, HASH_PIECE, fingerprint, piece_hash};
use fetch::{chunk_len, piece_mask};

/// The blocks of a range held here already.
pub(super) struct Held {
    /// Which blocks, for FETCH_HAVE.
    pub(super) have: Have,
    /// Each one's bytes, by its index in the range, and where it was read.
    pub(super) blocks: Vec<(usize, Vec<u8>, Place, Fingerprint)>,
    /// Whether they are every non-zero block of the range: nothing needs
    /// fetching.
    pub(super) all: bool,
}

impl Held {
    /// Bytes held.
    pub(super) fn bytes(&self) -> u64 {
        self.blocks.iter().map(|(_, b, _, _)| b.len() as u64).sum()
    }

    /// Copies the held blocks into `raw`, the range's bytes.
    pub(super) fn place(&self, raw: &mut [u8]) {
        let bs = self.have.block_size as usize;
        for (i, bytes, _, _) in &self.blocks {
            let at = i * bs;
            if let Some(dst) = raw.get_mut(at..at + bytes.len()) {
                dst.copy_from_slice(bytes);
            }
        }
    }
}

/// Ranges waiting for the indexer; past this a range is not noted (its
/// blocks are fetched, not copied, by the next image that shares them).
const INDEX_QUEUE: usize = 4096;

/// What the indexer thread does, in order.
enum Job {
    /// Note a range's blocks.
    Note {
        fh: Vec<u8>,
        range: u64,
        blocks: Vec<(u64, Fingerprint)>,
    },
    /// Drop a file's blocks.
    Forget(Vec<u8>),
}

/// The index's writes (sled's, which cost more than the rest of dedup) on
/// a thread of their own at the lowest CPU priority: nothing waits for
/// them, so they use what clients leave idle. One queue keeps a file's
/// notes before its forgetting.
pub(super) struct Indexer {
    jobs: std::sync::mpsc::SyncSender<Job>,
}

impl Indexer {
    fn start(index: BlockIndex, counters: Arc<IndexerCounts>) -> std::io::Result<Self> {
        let (jobs, rx) = std::sync::mpsc::sync_channel::<Job>(INDEX_QUEUE);
        std::thread::Builder::new()
            .name("gvfs-dedup-index".into())
            .spawn(move || {
                let me = rustix::thread::gettid();
                if let Err(e) = rustix::process::setpriority_process(Some(me), 19) {
                    tracing::debug!(error = %e, "dedup: the indexer keeps its priority");
                }
                let run = |job| {
                    let done = match job {
                        Job::Note { fh, range, blocks } => index
                            .note(&fh, range, &blocks)
                            .map(|()| blocks.len() as u64),
                        Job::Forget(fh) => index.forget_file(&fh).map(|_| 0),
                    };
                    done.unwrap_or_else(|e| {
                        tracing::warn!(error = %e, "dedup: the block index was not updated");
                        0
                    })
                };
                // Each time the queue runs dry, what it did is made durable
                // (the thread outlives the last handle of the index, so
                // sled's flush at its drop would not come), then counted.
                while let Ok(job) = rx.recv() {
                    let mut noted = run(job);
                    while let Ok(job) = rx.try_recv() {
                        noted += run(job);
                    }
                    if let Err(e) = index.flush() {
                        tracing::warn!(error = %e, "dedup: the block index was not flushed");
                    }
                    counters.noted.fetch_add(noted, Ordering::Relaxed);
                }
            })?;
        Ok(Self { jobs })
    }

    fn send(&self, job: Job, counters: &IndexerCounts) {
        if self.jobs.try_send(job).is_err() {
            counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// What the indexer did (read into the file cache's stats).
#[derive(Debug, Default)]
pub(super) struct IndexerCounts {
    pub(super) noted: AtomicU64,
    pub(super) dropped: AtomicU64,
}

impl FileCache {
    /// Copies blocks shared with other held files instead of fetching
    /// them, using `blocks` (set once, by a proxy with dedup on).
    pub fn keep_blocks(&self, blocks: BlockIndex) {
        match Indexer::start(blocks.clone(), self.indexed.clone()) {
            Ok(indexer) => {
                let _ = self.indexer.set(indexer);
            }
            Err(e) => {
                tracing::warn!(error = %e, "dedup off: cannot start the block indexer");
                return;
            }
        }
        let _ = self.blocks.set(blocks);
        for fh in std::mem::take(&mut *lock(&self.unfinished)) {
            self.forget_blocks(&fh);
        }
    }

    /// Whether it copies held blocks instead of fetching them.
    pub fn dedup_on(&self) -> bool {
        self.blocks.get().is_some()
    }

    /// Bytes copied from held blocks instead of fetched, per held file
    /// that had any (its handle), most first, at most `max`.
    pub fn dedup_by_file(&self, max: usize) -> Vec<(Vec<u8>, u64)> {
        let mut out: Vec<(Vec<u8>, u64)> = lock(&self.files)
            .values()
            .map(|f| (f.fh.clone(), f.dedup_bytes.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect();
        out.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        out.truncate(max);
        out
    }

    /// How many of `hashes` (block fingerprints) this proxy holds a block
    /// of, by its index (not read back).
    pub fn blocks_held(&self, hashes: &[Fingerprint]) -> Result<u64, IndexError> {
        let Some(index) = self.blocks.get() else {
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
    pub(super) fn forget_blocks(&self, fh: &[u8]) {
        if let Some(indexer) = self.indexer.get() {
            indexer.send(Job::Forget(fh.to_vec()), &self.indexed);
        }
    }
}

/// Drops an index entry that did not hold its block; `false`, as a block
/// not found.
fn stale(index: &BlockIndex, hash: &Fingerprint, place: &Place) -> bool {
    if let Err(e) = index.drop_stale(hash, place) {
        tracing::debug!(error = %e, "dedup: cannot drop a stale entry");
    }
    false
}

impl CachedFile {
    /// Whether `offset..offset + len` has arrived here.
    fn holds(&self, offset: u64, len: u64) -> bool {
        if self.failure().is_some() || offset.saturating_add(len) > self.size() {
            return false;
        }
        let idx = (offset / u64::from(CHUNK)) as usize;
        let chunks = lock(&self.chunks);
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
    /// dedup, or a range on a piece.
    pub(super) fn held_blocks(&self, cache: &FileCache, offset: u64, count: u32) -> Option<Held> {
        let meta = self.content.as_deref()?;
        let index = cache.blocks.get()?;
        let bs = meta.block_size;
        if !offset.is_multiple_of(HASH_PIECE) || count == 0 {
            return None;
        }
        let size = self.size();
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
                self.copy_of(cache, index, &fp, &mut buf)
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

    /// Reads into `buf` a held block with fingerprint `fp`, and says where;
    /// drops an index entry whose block is gone or holds other bytes.
    fn copy_of(
        &self,
        cache: &FileCache,
        index: &BlockIndex,
        fp: &Fingerprint,
        buf: &mut [u8],
    ) -> Option<Place> {
        let place = match index.find(fp) {
            Ok(p) => p?,
            Err(e) => {
                tracing::debug!(error = %e, "dedup: index lookup failed");
                return None;
            }
        };
        let entry = if place.fh == self.fh {
            None
        } else {
            match lock(&cache.files).get(&place.fh).cloned() {
                Some(f) => Some(f),
                None => {
                    stale(index, fp, &place);
                    return None;
                }
            }
        };
        let file = entry.as_deref().unwrap_or(self);
        if !file.holds(place.offset, buf.len() as u64) {
            return None;
        }
        if file.file.read_exact_at(buf, place.offset).is_err() || fingerprint(buf) != *fp {
            cache.counters.dedup_rejected.add(1);
            stale(index, fp, &place);
            return None;
        }
        Some(place)
    }

    /// Checks `raw`, the range at `offset`, against the metadata's piece
    /// hashes: the number of pieces that differ (counted as hash
    /// mismatches), `None` when there are no hashes to check or the range
    /// does not start on a piece.
    pub(super) fn check_pieces(&self, cache: &FileCache, offset: u64, raw: &[u8]) -> Option<u64> {
        // Without dedup nothing here depends on the answer: no work.
        cache.blocks.get()?;
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
    pub(super) fn drop_wrong(&self, cache: &FileCache, suspect: &Held, raw: &[u8]) {
        let Some(index) = cache.blocks.get() else {
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
    pub(super) fn note_blocks(&self, cache: &FileCache, offset: u64, raw: &[u8]) {
        let (Some(meta), Some(indexer)) = (self.content.as_deref(), cache.indexer.get()) else {
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
            indexer.send(job, &cache.indexed);
        }
    }
}
