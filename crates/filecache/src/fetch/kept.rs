//! A partly fetched file kept across a restart: its progress log
//! (`progress.rs`) written as ranges land, the file kept **dormant** at
//! open when its log loads, **resumed** by the next fetch of the same
//! version (recorded pieces kept, the rest fetched), and its kept pieces
//! **checked** before anyone is served them.
//!
//! The rules:
//! - A resumed entry starts with its kept pieces claimed as `fetching` in
//!   its [`FetchState`] (the chunks lock's claims, `fetch/state.rs`), so
//!   nobody fetches them and readers wait for them as for any piece on
//!   its way. Their check ends that claim as a fetch would: the pieces
//!   whose bytes match their CRC32 (and, where the trusted metadata has
//!   piece hashes and a whole hashed piece is kept, its hash) become
//!   `here`, the others are given
//!   back, missing, for whoever needs them to fetch (counted in
//!   `kept_bad_pieces`). Wrong bytes are never served.
//! - The check is lazy, so a restart's stall stays short: a reader's wait
//!   (`ensure`) checks the chunks it needs first, and a task of the
//!   fetch checks the rest in file order. Each chunk is checked once (it
//!   is taken out of [`Kept`] under its lock), on the blocking pool, and
//!   the check ends its claim even if the reader that started it goes
//!   away; a check that panics or never runs gives its chunks' claims
//!   back (`Taken`), to be fetched.
//! - The log goes when the file is whole and its record written and
//!   durable ([`FileCache::settle_progress`]; a record that failed leaves
//!   it, for a restart to keep the file by), or with the entry
//!   (`discard`). Either removes it by its path, so a log let go after a
//!   write to it failed (or one left half made) goes too.
//!
//! [`FetchState`]: super::state::FetchState

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use gvfs_ext::{CHUNK, Class, Tenant, Want};
use gvfs_metafile::MetaFile;
use gvfs_metafile::hashes::{HASH_PIECE, piece_hash};
use gvfs_nfs::layer::lock;

use crate::cache::FileCache;
use crate::chunks::{Chunk, Pieces, chunk_count, chunk_len};
use crate::entry::CachedFile;
use crate::error::{FileCacheError, ProgressError};
use crate::fetch::state::FetchState;
use crate::learn::learning::Learning;
use crate::names::progress_path;
use crate::pieces::{Mask, PIECE, all_pieces, span_bits};
use crate::progress::{Kept, Logged, Noted, Progress, check_pieces};
use crate::versions::Versions;

impl CachedFile {
    /// Checks the kept pieces of chunks `first..=last` that nobody has
    /// checked yet (blocking I/O, on the blocking pool), ending their
    /// claims: good pieces here, bad ones given back to be fetched.
    pub(crate) async fn check_kept(
        self: &Arc<Self>,
        cache: &Arc<FileCache>,
        first: usize,
        last: usize,
    ) -> Result<(), FileCacheError> {
        let Some(kept) = &self.kept else {
            return Ok(());
        };
        let taken = kept.take(first, last);
        if taken.is_empty() {
            return Ok(());
        }
        let taken = Taken {
            entry: self.clone(),
            left: taken,
        };
        let cache = cache.clone();
        tokio::task::spawn_blocking(move || check_taken(&cache, taken))
            .await
            .map_err(|e| FileCacheError::task("checking kept pieces", e))
    }

    /// Checks chunk `idx`'s kept pieces `logged` (blocking I/O) and ends
    /// their claim. A piece that cannot be read counts as bad.
    fn check_chunk(&self, cache: &FileCache, idx: usize, logged: &Logged) {
        let size = self.size();
        let good = check_pieces(&self.file, size, idx, logged.mask, logged).unwrap_or(0);
        let good = self.check_hashes(size, idx, good);
        let bad = logged.mask & !good;
        if bad != 0 {
            tracing::info!(
                file = %self.path.display(),
                chunk = idx,
                pieces = bad.count_ones(),
                "file cache: kept pieces failed their check; fetched again"
            );
            cache
                .counters
                .kept_bad_pieces
                .add(u64::from(bad.count_ones()));
        }
        if let Some(kept) = &self.kept {
            kept.passed(idx, good);
        }
        self.fetch
            .kept_checked(idx, chunk_len(size, idx), logged.mask, good);
    }

    /// The pieces of `good` (of chunk `idx`, passed their CRC32) left
    /// once every hashed piece (`HASH_PIECE`) they hold whole is checked
    /// against the trusted metadata's piece hash, as a fetched range is
    /// (`dedup/file.rs`'s `check_pieces`): a lost piece whose bytes read
    /// back with a CRC32 that collides is still not served. Without
    /// hashes, `good` (blocking I/O).
    fn check_hashes(&self, size: u64, idx: usize, good: Mask) -> Mask {
        let Some(meta) = self.content.as_deref() else {
            return good;
        };
        let per = (HASH_PIECE / u64::from(PIECE)) as u32;
        let all = all_pieces(chunk_len(size, idx));
        let start = idx as u64 * u64::from(CHUNK);
        let mut out = good;
        let mut buf = Vec::new();
        for h in 0..Mask::BITS / per {
            let bits = span_bits(h * per, h * per + per - 1) & all;
            if bits == 0 || good & bits != bits {
                continue;
            }
            let at = start + u64::from(h) * HASH_PIECE;
            buf.resize(HASH_PIECE.min(size - at) as usize, 0);
            let same = self.file.read_exact_at(&mut buf, at).is_ok()
                && meta.piece_hash(at / HASH_PIECE) == Some(&piece_hash(&buf));
            if !same {
                out &= !bits;
            }
        }
        out
    }

    /// Records `raw`, just written at `offset`, in the progress log, if
    /// there is one (blocking I/O). A log that cannot be written is let go
    /// (what it holds stays true; only less is kept).
    pub(crate) fn note_progress(&self, offset: u64, raw: &[u8]) {
        // The CRCs are worked out outside the log's lock: only the append
        // is under it.
        let Some(size) = lock(&self.progress).as_ref().map(Progress::size) else {
            return;
        };
        let noted = Noted::of(size, offset, raw);
        let mut progress = lock(&self.progress);
        if let Some(log) = progress.as_mut()
            && let Err(e) = log.append(noted)
        {
            tracing::warn!(file = %self.path.display(), "file cache: cannot write a progress log: {e}");
            *progress = None;
        }
    }

    /// Lets the progress log go and removes it from the disk (blocking
    /// I/O): by its path, whether or not it is still open here (a log
    /// whose write failed, or that failed to be made whole, may be left).
    pub(crate) fn end_progress(&self) {
        let mut progress = lock(&self.progress);
        progress.take();
        let path = progress_path(&self.path);
        let _ = std::fs::remove_file(&path);
        let mut tmp = path.into_os_string();
        tmp.push(".new");
        let _ = std::fs::remove_file(tmp);
    }

    /// Counts the bytes of a range just fetched that were kept (and
    /// passed their check): fetched again for nothing.
    pub(crate) fn count_refetched(&self, cache: &FileCache, offset: u64, count: u32) {
        if let Some(kept) = &self.kept {
            let bytes = kept.refetched(self.size(), offset, count);
            cache.counters.refetched_bytes.add(bytes);
        }
    }
}

/// Chunks taken out of [`Kept`] for one check, their pieces claimed:
/// whatever is left of them when it is dropped unchecked (the check
/// panicked, or never ran) is given back, to be fetched, so that nobody
/// waits for those claims for ever.
pub(crate) struct Taken {
    pub(crate) entry: Arc<CachedFile>,
    /// The chunks not checked yet (last first, once checking).
    pub(crate) left: Vec<(usize, Logged)>,
}

impl Drop for Taken {
    fn drop(&mut self) {
        let size = self.entry.size();
        for (idx, logged) in self.left.drain(..) {
            self.entry
                .fetch
                .kept_checked(idx, chunk_len(size, idx), logged.mask, 0);
        }
    }
}

/// Checks the chunks `taken` (blocking I/O), one at a time, ending each
/// one's claims.
fn check_taken(cache: &FileCache, mut taken: Taken) {
    taken.left.reverse();
    // A chunk stays in `left` while it is checked: a panic in its check
    // gives it back too.
    while let Some((idx, logged)) = taken.left.last() {
        taken.entry.check_chunk(cache, *idx, logged);
        taken.left.pop();
    }
}

impl FileCache {
    /// The dormant entry of `fh`, a file at `path` without a record, when
    /// a progress log beside it loads and is of a file of its length.
    pub(crate) fn restore_partial(&self, fh: &[u8], path: &Path) -> Option<Arc<CachedFile>> {
        // Without an index nothing is kept across a restart.
        self.index.as_ref()?;
        let log = match Progress::load(&progress_path(path), self.max_bytes) {
            Ok(log) => log,
            Err(ProgressError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::info!(path = %path.display(), error = %e, "file cache: a progress log does not load");
                return None;
            }
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .ok()?;
        if file.metadata().ok()?.len() != log.size() {
            return None;
        }
        let bytes = log.recorded_bytes();
        tracing::info!(
            path = %path.display(),
            bytes,
            "file cache: kept a partly fetched file"
        );
        self.counters.kept_files.add(1);
        self.counters.kept_bytes.add(bytes);
        let chunks = vec![Chunk::Missing; chunk_count(log.size())];
        let versions = Versions::new(log.attrs().clone());
        let entry = CachedFile::new(
            fh,
            path.to_path_buf(),
            file,
            versions,
            FetchState::new(chunks, Tenant::LOCAL, Class::Background),
            None,
            None,
        );
        Some(Arc::new(entry.with_progress(Some(log)).into_dormant()))
    }

    /// The entry that resumes the fetch of `dormant` (of the version
    /// fetched now): its recorded pieces kept, to be checked, the chunks
    /// of zeros by `zero`, the rest missing. `None` when its log or file
    /// is gone (a fresh fetch then).
    pub(crate) fn resume(
        &self,
        dormant: &CachedFile,
        zero: Option<&MetaFile>,
        learn: bool,
        first: &Want,
    ) -> Option<Arc<CachedFile>> {
        let file = dormant.file.try_clone().ok()?;
        let log = lock(&dormant.progress).take()?;
        let size = log.size();
        let mut chunks = vec![Chunk::Missing; chunk_count(size)];
        let mut unchecked = BTreeMap::new();
        let mut zeros = 0;
        for (i, c) in chunks.iter_mut().enumerate() {
            let start = i as u64 * u64::from(CHUNK);
            if zero.is_some_and(|m| m.range_is_zero(start, u64::from(chunk_len(size, i)))) {
                *c = Chunk::Zero;
                zeros += 1;
            } else if let Some(logged) = log.logged(i) {
                unchecked.insert(i, logged.clone());
            }
        }
        self.counters.zero_chunks.add(zeros);
        self.counters.files_fetched.add(1);
        let content = zero
            .filter(|m| m.hashes.is_some() && m.file_size == size)
            .map(|m| Arc::new(m.clone()));
        let learning = learn.then(|| Learning::new(size, &chunks, &self.learn));
        let fetch = FetchState::new(chunks, first.tenant, first.class);
        {
            let mut c = fetch.chunks();
            for (idx, logged) in &unchecked {
                let pieces = Pieces {
                    fetching: logged.mask,
                    ..Pieces::default()
                };
                c.pieces.insert(*idx, pieces);
            }
        }
        tracing::info!(
            file = %dormant.path.display(),
            chunks = unchecked.len(),
            log_bytes = log.log_len(),
            "file cache: a fetch resumes"
        );
        let entry = CachedFile::new(
            &dormant.fh,
            dormant.path.clone(),
            file,
            Versions::new(log.attrs().clone()),
            fetch,
            learning,
            content,
        );
        Some(Arc::new(
            entry
                .with_progress(Some(log))
                .with_kept(Kept::new(unchecked)),
        ))
    }

    /// Checks the kept pieces of `entry` nobody has checked yet, in file
    /// order, one chunk at a time (readers check theirs meanwhile).
    pub(crate) async fn check_all_kept(self: Arc<Self>, entry: Arc<CachedFile>) {
        let Some(kept) = &entry.kept else {
            return;
        };
        while let Some(idx) = kept.next() {
            if let Err(e) = entry.check_kept(&self, idx, idx).await {
                tracing::warn!(file = %entry.path.display(), "file cache: {e}");
                return;
            }
        }
    }

    /// Removes the progress log of `entry`, whole and synced and recorded,
    /// once its record is durable (it keeps the file then), if it is still
    /// the entry of its file (one let go lost its log with it). Without an
    /// index there is no log.
    pub(crate) async fn settle_progress(&self, entry: &Arc<CachedFile>) {
        let Some(index) = self.index.clone() else {
            return;
        };
        let flushed = tokio::task::spawn_blocking(move || index.flush()).await;
        if !matches!(flushed, Ok(Ok(()))) {
            // The log stays: a restart keeps the file by it instead.
            tracing::debug!(file = %entry.path.display(), "file cache: index not flushed; progress log kept");
            return;
        }
        // Under the files lock, as `discard`: no newer entry's log is at
        // the path yet.
        let files = lock(&self.files);
        if files.get(&entry.fh).is_some_and(|f| Arc::ptr_eq(f, entry)) {
            entry.end_progress();
        }
    }
}
