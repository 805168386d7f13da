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
use crate::block_index::{BlockIndex, Place};
use gvfs_ext::Have;
use gvfs_metafile::hashes::{Fingerprint, HASH_PIECE, fingerprint, piece_hash};
use pieces::{chunk_len, piece_mask};

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
    /// Drop the blocks of one range of a file.
    ForgetRange(Vec<u8>, u64),
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
                // Blocks (noted, forgotten) by a job.
                let run = |job| {
                    let done = match job {
                        Job::Note { fh, range, blocks } => index
                            .note(&fh, range, &blocks)
                            .map(|()| (blocks.len() as u64, 0)),
                        Job::Forget(fh) => index.forget_file(&fh).map(|n| (0, n)),
                        Job::ForgetRange(fh, range) => {
                            index.forget_range(&fh, range).map(|n| (0, n))
                        }
                    };
                    done.unwrap_or_else(|e| {
                        tracing::warn!(error = %e, "dedup: the block index was not updated");
                        (0, 0)
                    })
                };
                // Each time the queue runs dry, what it did is made durable
                // (the thread outlives the last handle of the index, so
                // sled's flush at its drop would not come), then counted.
                while let Ok(job) = rx.recv() {
                    let (mut noted, mut forgotten) = run(job);
                    while let Ok(job) = rx.try_recv() {
                        let (n, f) = run(job);
                        noted += n;
                        forgotten += f;
                    }
                    if let Err(e) = index.flush() {
                        tracing::warn!(error = %e, "dedup: the block index was not flushed");
                    }
                    counters.noted.fetch_add(noted, Ordering::Relaxed);
                    counters.forgotten.fetch_add(forgotten, Ordering::Relaxed);
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
    pub(super) forgotten: AtomicU64,
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
        for (fh, n) in lock(&self.block_path.by_file).iter() {
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

/// Reads a block of the block cache: `(file handle, offset, buffer)` ->
/// whether it holds all of those bytes (checked), without fetching.
pub type BlockReader = Arc<dyn Fn(&[u8], u64, &mut [u8]) -> bool + Send + Sync>;

/// Files read through the block cache a proxy deduplicates too.
#[derive(Default)]
pub(super) struct BlockPath {
    /// Reads the block cache, where their blocks are held.
    reader: std::sync::OnceLock<BlockReader>,
    /// Bytes copied from held blocks instead of fetched, per file (at most
    /// [`MAX_BLOCK_PATH_FILES`] files).
    by_file: Mutex<HashMap<Vec<u8>, u64>>,
}

/// Files whose dedup bytes through the block cache are counted one by one.
const MAX_BLOCK_PATH_FILES: usize = 4096;

impl FileCache {
    /// Finds blocks in the block cache too, with `reader` (set once).
    pub fn read_block_cache_with(&self, reader: BlockReader) {
        let _ = self.block_path.reader.set(reader);
    }

    /// Reads into `buf` a held block with fingerprint `fp`, from a file
    /// held here (`me` is the file asking, perhaps not in the table yet)
    /// or from the block cache, and says where; drops an index entry whose
    /// block is gone or holds other bytes.
    fn read_by_fingerprint(
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
                if !file.holds(place.offset, buf.len() as u64) {
                    // Not arrived yet: nothing wrong with the entry.
                    return None;
                }
                file.file.read_exact_at(buf, place.offset).is_ok()
            }
            (None, None) => self
                .block_path
                .reader
                .get()
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
        let (Some(index), Some(_)) = (self.blocks.get(), meta.hashes.as_ref()) else {
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
        let mut by_file = lock(&self.block_path.by_file);
        if by_file.len() < MAX_BLOCK_PATH_FILES || by_file.contains_key(fh) {
            *by_file.entry(fh.to_vec()).or_default() += n;
        }
        true
    }

    /// Notes that the block cache holds `fh`'s `offset..offset + len`,
    /// whose blocks `meta` fingerprints (checked when used, not now).
    pub fn note_held(&self, fh: &[u8], meta: &MetaFile, offset: u64, len: u64) {
        let Some(indexer) = self.indexer.get() else {
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
            indexer.send(job, &self.indexed);
        }
    }

    /// The block cache let go of `fh`'s range at `offset`: its blocks
    /// leave the index (on the indexer; never waits).
    pub fn forget_held(&self, fh: &[u8], offset: u64) {
        if let Some(indexer) = self.indexer.get() {
            indexer.send(Job::ForgetRange(fh.to_vec(), offset), &self.indexed);
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
    /// dedup, or a range of whole pieces (a fetch of a few file-cache
    /// pieces inside one: held blocks go only where a piece hash checks
    /// them).
    pub(super) fn held_blocks(&self, cache: &FileCache, offset: u64, count: u32) -> Option<Held> {
        let meta = self.content.as_deref()?;
        let index = cache.blocks.get()?;
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
