//! The cache's table of entries ([`FileCache`]): opening it (keeping the
//! files a record describes, deleting the rest), looking entries up,
//! recording them in the index, and letting them go (evicted to stay under
//! the byte budget, or forgotten). Fetching, reading, writing and dedup
//! add their methods in their own modules.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use gvfs_ext::{Class, Tenant};
use gvfs_nfs::layer::lock;
use gvfs_nfs::nfs3_types::nfs3::writeverf3;

use crate::block_index::BlockIndex;
use crate::chunks::restored_chunks;
use crate::dedup::parts::{BlockReader, Dedup};
use crate::entry::CachedFile;
use crate::error::{FileCacheError, HeldWriteError, IndexError};
use crate::fetch::state::FetchState;
use crate::index::MetaIndex;
use crate::learn::LearnSettings;
use crate::names::{file_name, index_key, parse_name, progress_path};
use crate::profiles::Profiles;
use crate::record::{decode_record, encode_record};
use crate::run_frames::{RUN_FRAMES_BYTES, RunFrames};
use crate::stats::{Counters, DEDUP_FILES_SHOWN, FileCacheStats, FileDedup};

/// The file cache of one proxy.
pub struct FileCache {
    pub(crate) dir: PathBuf,
    /// The write verifier of WRITEs kept here: new at every start, so
    /// clients resend writes they did not COMMIT before a crash.
    verifier: [u8; 8],
    pub(crate) index: Option<Arc<dyn MetaIndex>>,
    /// The entries, by file handle.
    pub(crate) files: Mutex<HashMap<Vec<u8>, Arc<CachedFile>>>,
    pub(crate) max_bytes: u64,
    /// Set once this proxy answers another proxy's FETCH from here.
    pub(crate) keep_frames: AtomicBool,
    /// Frames of runs (not whole chunks) made for other proxies, kept for
    /// the next that asks (with `keep_frames`).
    pub(crate) run_frames: RunFrames,
    /// Where working-set profiles are kept (without, they are only passed
    /// on).
    pub(crate) profiles: Option<Arc<Profiles>>,
    /// How learnings of working sets end.
    pub(crate) learn: LearnSettings,
    /// Copies of blocks held here instead of fetches (with dedup on).
    pub(crate) dedup: Dedup,
    pub(crate) counters: Counters,
}

impl std::fmt::Debug for FileCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileCache")
            .field("dir", &self.dir)
            .field("max_bytes", &self.max_bytes)
            .finish()
    }
}

/// What a file cache is given at open besides its directory and index:
/// nothing by default (no profiles kept, no dedup).
#[derive(Clone, Default)]
pub struct FileCacheParts {
    /// Where the working-set profiles learned or fetched here are kept
    /// (without, they are only passed on).
    pub profiles: Option<Arc<Profiles>>,
    /// With dedup on: where held blocks are found by content hash, so
    /// blocks shared with other held files are copied instead of fetched.
    pub blocks: Option<BlockIndex>,
    /// With dedup on: reads the block cache's blocks, so they are found
    /// there too.
    pub block_reader: Option<BlockReader>,
    /// How learnings of working sets end (the window after the first
    /// touch).
    pub learn: LearnSettings,
}

impl std::fmt::Debug for FileCacheParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileCacheParts")
            .field("profiles", &self.profiles.is_some())
            .field("blocks", &self.blocks.is_some())
            .field("block_reader", &self.block_reader.is_some())
            .field("learn", &self.learn)
            .finish()
    }
}

impl FileCache {
    /// Opens (creating) the cache in `dir`, keeping at most `max_bytes` of
    /// files, with `parts`. Finished files recorded in `index` are kept;
    /// anything else in the directory (fetches cut short by a crash) is
    /// deleted, and with dedup its blocks leave the block index.
    pub fn open(
        dir: &Path,
        index: Option<Arc<dyn MetaIndex>>,
        max_bytes: u64,
        parts: FileCacheParts,
    ) -> std::io::Result<Arc<Self>> {
        std::fs::create_dir_all(dir)?;
        let boot = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let cache = Arc::new(Self {
            verifier: (boot ^ u64::from(std::process::id()) << 40).to_be_bytes(),
            dir: dir.to_path_buf(),
            index,
            files: Mutex::new(HashMap::new()),
            max_bytes,
            keep_frames: AtomicBool::new(false),
            run_frames: RunFrames::new(RUN_FRAMES_BYTES),
            profiles: parts.profiles,
            learn: parts.learn,
            dedup: Dedup::new(parts.blocks, parts.block_reader),
            counters: Counters::default(),
        });
        // Side files (frames, progress logs, temporary files) once the
        // files they belong to are known.
        let mut side = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let path = entry.path();
            let Some(fh) = entry.file_name().to_str().and_then(parse_name) else {
                side.push(path);
                continue;
            };
            let kept = cache
                .restore(&fh, &path)
                .or_else(|| cache.restore_partial(&fh, &path));
            match kept {
                Some(f) => {
                    lock(&cache.files).insert(f.fh.clone(), f);
                }
                None => {
                    cache.forget_blocks(&fh);
                    tracing::info!(path = %path.display(), "file cache: removing an unfinished file");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        // The progress logs of files kept partial stay; all else goes.
        let logs: HashSet<PathBuf> = lock(&cache.files)
            .values()
            .filter(|f| f.dormant)
            .map(|f| progress_path(&f.path))
            .collect();
        for path in side.into_iter().filter(|p| !logs.contains(p)) {
            tracing::debug!(path = %path.display(), "file cache: removing a side file");
            let _ = std::fs::remove_file(&path);
        }
        Ok(cache)
    }

    fn restore(&self, fh: &[u8], path: &Path) -> Option<Arc<CachedFile>> {
        let v = self.index.as_ref()?.get(&index_key(fh)).ok()??;
        let versions = match decode_record(&v) {
            Ok(versions) => versions,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "file cache: a file's record does not load");
                return None;
            }
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .ok()?;
        let size = versions.local.size;
        let len = file.metadata().ok()?.len();
        if versions.dirty.is_empty() {
            // Synced whole before it was recorded: shorter is not ours.
            if len < size {
                return None;
            }
        } else if len != size {
            // A crash in a WRITE extending the file: its record (made
            // durable before the bytes land) or its bytes (past the size
            // of the last durable record) did not make it. Neither was
            // acknowledged as stable.
            file.set_len(size).ok()?;
        }
        if !versions.dirty.is_empty() {
            tracing::info!(
                path = %path.display(),
                chunks = versions.dirty.len(),
                "file cache: kept a file with writes not yet written back"
            );
        }
        let chunks = restored_chunks(&file, size);
        Some(Arc::new(CachedFile::new(
            fh,
            path.to_path_buf(),
            file,
            versions,
            FetchState::new(chunks, Tenant::LOCAL, Class::Background),
            None,
            None,
        )))
    }

    /// Keeps chunks' frames from now on, for answering other proxies'
    /// FETCHes without compressing again (see [`Frame`]).
    pub fn keep_frames(&self) {
        self.keep_frames.store(true, Ordering::Relaxed);
    }

    /// The write verifier of WRITEs and COMMITs answered from here.
    pub fn verifier(&self) -> writeverf3 {
        writeverf3(self.verifier)
    }

    /// The counters.
    pub fn stats(&self) -> FileCacheStats {
        let (cached_bytes, frame_bytes, dirty_files) = {
            let files = lock(&self.files);
            (
                files.values().map(|f| f.size()).sum(),
                files.values().map(|f| f.frames.bytes()).sum(),
                files.values().filter(|f| f.is_dirty()).count() as u64,
            )
        };
        let dedup_files = self
            .dedup_by_file(DEDUP_FILES_SHOWN)
            .into_iter()
            .map(|(fh, bytes)| FileDedup {
                fh: file_name(&fh),
                name: None,
                bytes,
            })
            .collect();
        FileCacheStats {
            counts: self.counters.snapshot(),
            frame_bytes,
            run_frame_bytes: self.run_frames.bytes(),
            cached_bytes,
            dirty_files,
            dedup_files,
            blocks_indexed: self.dedup.indexed.noted.load(Ordering::Relaxed),
            blocks_forgotten: self.dedup.indexed.forgotten.load(Ordering::Relaxed),
            index_dropped: self.dedup.indexed.dropped.load(Ordering::Relaxed),
        }
    }

    /// The entry for `fh`, if there is a usable one (not failed, and not
    /// a partial file kept at open: [`start`](Self::start) resumes that).
    pub fn get(&self, fh: &[u8]) -> Option<Arc<CachedFile>> {
        lock(&self.files)
            .get(fh)
            .filter(|f| f.failure().is_none() && !f.dormant)
            .cloned()
    }

    /// Drops the entry for `fh` (the file changed, or a client wrote it
    /// through the block path), unless it holds writes not written back
    /// or one is under way.
    pub fn forget(&self, fh: &[u8]) {
        let mut files = lock(&self.files);
        if files.get(fh).is_some_and(|f| f.busy()) {
            return;
        }
        if let Some(f) = files.remove(fh) {
            self.discard(&f);
        }
    }

    /// Whether writes kept here survive a restart: the index they are
    /// recorded in is persistent. When it is not, WRITEs to held files
    /// should go upstream instead.
    pub fn keeps_writes(&self) -> bool {
        self.index.as_ref().is_some_and(|i| i.persistent())
    }

    /// Whether `f` is still the entry of its file.
    pub(crate) fn holds(&self, f: &Arc<CachedFile>) -> bool {
        lock(&self.files)
            .get(&f.fh)
            .is_some_and(|g| Arc::ptr_eq(g, f))
    }

    /// Records a file in the index (finished, with its dirty chunks), if
    /// it is still the entry of its file: under the lock that replacing it
    /// takes, so a record of a let-go entry never outlives it. Returns the
    /// `epoch` and the dirty chunks recorded, or `None` when it was let go.
    pub(crate) fn record(
        &self,
        f: &Arc<CachedFile>,
    ) -> Result<Option<(u64, Vec<usize>)>, IndexError> {
        let files = lock(&self.files);
        if !files.get(&f.fh).is_some_and(|g| Arc::ptr_eq(g, f)) {
            return Ok(None);
        }
        let (bytes, epoch, chunks) = {
            let v = f.versions.lock();
            (
                encode_record(&v),
                v.epoch,
                v.dirty.keys().copied().collect(),
            )
        };
        if let Some(index) = &self.index {
            index.put(&index_key(&f.fh), &bytes)?;
        }
        Ok(Some((epoch, chunks)))
    }

    /// [`record`](Self::record), logging a failure: for records whose loss
    /// in a crash costs only a fetch. Returns whether it was recorded (not
    /// when it failed or the entry was let go).
    pub(crate) fn record_lazily(&self, f: &Arc<CachedFile>) -> bool {
        match self.record(f) {
            Ok(recorded) => recorded.is_some(),
            Err(e) => {
                tracing::warn!(file = %f.path.display(), "file cache: cannot record a file: {e}");
                false
            }
        }
    }

    /// Records a file and waits until the record is durable. Returns
    /// whether it is still the entry of its file.
    pub(crate) async fn record_durably(&self, f: &Arc<CachedFile>) -> Result<bool, HeldWriteError> {
        let index_failure = |source| FileCacheError::Index {
            op: "cannot record a file in the file-cache index",
            source,
        };
        let Some((epoch, chunks)) = self.record(f).map_err(index_failure)? else {
            return Ok(false);
        };
        if let Some(index) = self.index.clone() {
            tokio::task::spawn_blocking(move || index.flush())
                .await
                .map_err(|e| FileCacheError::task("recording a file", e))?
                .map_err(index_failure)?;
        }
        let mut v = f.versions.lock();
        if v.epoch == epoch {
            v.durable.extend(chunks);
        }
        Ok(true)
    }

    /// Files holding writes not yet written back.
    pub fn dirty(&self) -> Vec<Arc<CachedFile>> {
        lock(&self.files)
            .values()
            .filter(|f| f.is_dirty())
            .cloned()
            .collect()
    }

    /// Evicts finished, failed or dormant files, least recently used
    /// first, until `size` more bytes fit.
    pub(crate) fn make_room(
        &self,
        files: &mut HashMap<Vec<u8>, Arc<CachedFile>>,
        size: u64,
    ) -> Result<(), FileCacheError> {
        if size > self.max_bytes {
            return Err(FileCacheError::TooLarge {
                size,
                max: self.max_bytes,
            });
        }
        loop {
            let held: u64 = files.values().map(|f| f.size() + f.frames.bytes()).sum();
            if held + size <= self.max_bytes {
                return Ok(());
            }
            let victim = files
                .values()
                .filter(|f| !f.busy() && (f.complete() || f.failure().is_some() || f.dormant))
                .min_by_key(|f| f.last_used.load(Ordering::Relaxed))
                .map(|f| f.fh.clone());
            let Some(fh) = victim else {
                return Err(FileCacheError::Full);
            };
            if let Some(f) = files.remove(&fh) {
                self.discard(&f);
                self.counters.evicted.add(1);
            }
        }
    }

    /// Removes a let-go entry's record, file, frames and progress log
    /// (its fetch, if still running, writes no more of it). Called under the
    /// files lock that took it out of the map: a new entry of the same file
    /// (at the same path) cannot have been made yet.
    pub(crate) fn discard(&self, f: &CachedFile) {
        if let Some(index) = &self.index {
            let _ = index.remove(&index_key(&f.fh));
        }
        self.forget_blocks(&f.fh);
        let _ = std::fs::remove_file(&f.path);
        f.frames.remove();
        f.end_progress();
    }
}
