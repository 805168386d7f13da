//! One file in the cache ([`CachedFile`]): its local copy and the parts
//! that the other modules work on.
//!
//! - `versions` ([`FileVersions`], `versions.rs`): upstream's and the local
//!   attributes, and the client writes held here (`write.rs`,
//!   `writeback.rs`);
//! - `fetch` ([`FetchState`], `fetch/state.rs`): which chunks are here and
//!   who fetches the rest (`fetch/`), what readers wait on (`read.rs`);
//! - `frames` ([`FrameStore`], `frames.rs`): chunks kept as they were
//!   fetched, for other proxies;
//! - `learning` (`learn/`): the order readers first touch it in, while it
//!   is learned as a working-set profile;
//! - `content`: its metadata when that names block hashes (`dedup/`);
//! - `progress` ([`Progress`], `progress.rs`): while it is partial, the
//!   log of the pieces written, which a restart keeps it by; `kept`
//!   ([`Kept`], `progress.rs`): pieces kept from before a restart, not
//!   served before `fetch/kept.rs` checks them; `dormant`: kept at open and not yet
//!   resumed (nothing reads it until a fetch of the same version resumes
//!   it).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use gvfs_ext::CHUNK;
use gvfs_metafile::MetaFile;
use gvfs_nfs::nfs3_types::nfs3::fattr3;

use crate::chunks::chunk_len;
use crate::error::FileCacheError;
use crate::fetch::state::FetchState;
use crate::frames::FrameStore;
use crate::learn::learning::Learning;
use crate::names::frames_path;
use crate::progress::{Kept, Progress};
use crate::versions::{FileVersions, Versions};

/// Seconds since the epoch: the clock of `last_used`.
pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The next entry's serial number.
static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);

/// One file in the cache.
pub struct CachedFile {
    pub(crate) fh: Vec<u8>,
    /// Unique to this entry in the process (a later entry of the same file
    /// has another): what its kept run frames are found by.
    pub(crate) serial: u64,
    /// The local copy, in the cache's directory.
    pub(crate) path: PathBuf,
    pub(crate) file: std::fs::File,
    /// When it was last used (seconds since the epoch), for eviction.
    pub(crate) last_used: AtomicU64,
    /// Its versions and the writes held in it.
    pub(crate) versions: FileVersions,
    /// How far its fetch has come.
    pub(crate) fetch: FetchState,
    /// Frames of present chunks kept for other proxies (LAN proxies only).
    pub(crate) frames: FrameStore,
    /// The order readers first touch chunks in, while it is learned.
    pub(crate) learning: Mutex<Option<Learning>>,
    /// Wakes the learning's task when it is ended on request.
    pub(crate) learn_end: tokio::sync::Notify,
    /// The file's metadata when it has block hashes (for dedup).
    pub(crate) content: Option<Arc<MetaFile>>,
    /// Bytes of it copied from blocks held here instead of fetched.
    pub(crate) dedup_bytes: AtomicU64,
    /// Its progress log while it is partial (not kept without an index).
    pub(crate) progress: Mutex<Option<Progress>>,
    /// Pieces kept from before a restart (a resumed fetch only).
    pub(crate) kept: Option<Kept>,
    /// Kept at open, partly fetched, and not resumed yet.
    pub(crate) dormant: bool,
}

impl std::fmt::Debug for CachedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedFile")
            .field("path", &self.path)
            .finish()
    }
}

impl CachedFile {
    /// The entry of `fh`, held in `file` at `path`, with these versions and
    /// its fetch (its chunks' states), learning its readers' order when
    /// `learning` is given.
    pub(crate) fn new(
        fh: &[u8],
        path: PathBuf,
        file: std::fs::File,
        versions: Versions,
        fetch: FetchState,
        learning: Option<Learning>,
        content: Option<Arc<MetaFile>>,
    ) -> Self {
        Self {
            fh: fh.to_vec(),
            serial: NEXT_SERIAL.fetch_add(1, Ordering::Relaxed),
            versions: FileVersions::new(versions),
            frames: FrameStore::new(frames_path(&path)),
            path,
            file,
            fetch,
            last_used: AtomicU64::new(now_secs()),
            learning: Mutex::new(learning),
            learn_end: tokio::sync::Notify::new(),
            content,
            dedup_bytes: AtomicU64::new(0),
            progress: Mutex::new(None),
            kept: None,
            dormant: false,
        }
    }

    /// The entry with its progress log.
    pub(crate) fn with_progress(mut self, progress: Option<Progress>) -> Self {
        self.progress = Mutex::new(progress);
        self
    }

    /// The entry of a resumed fetch, with the pieces it kept.
    pub(crate) fn with_kept(mut self, kept: Kept) -> Self {
        self.kept = Some(kept);
        self
    }

    /// The entry kept at open, not to be read until resumed.
    pub(crate) fn into_dormant(mut self) -> Self {
        self.dormant = true;
        self
    }

    /// The attributes upstream gave the version held here.
    pub fn attrs(&self) -> fattr3 {
        self.versions.upstream()
    }

    /// The file's handle.
    pub fn fh(&self) -> &[u8] {
        &self.fh
    }

    /// The attributes clients see: upstream's, or after local writes
    /// their size and times.
    pub fn local_attrs(&self) -> fattr3 {
        self.versions.local()
    }

    /// Whether it holds writes not yet written back.
    pub fn is_dirty(&self) -> bool {
        self.versions.is_dirty()
    }

    /// Whether it must not be let go: it holds writes, or one is under way.
    pub(crate) fn busy(&self) -> bool {
        self.versions.busy()
    }

    /// The writes counter and the attributes of the bytes held now (the
    /// local ones once written here), or `None` while a WRITE is under way.
    pub(crate) fn stamp(&self) -> Option<(u64, fattr3)> {
        self.versions.stamp()
    }

    /// The size clients see.
    pub(crate) fn size(&self) -> u64 {
        self.versions.size()
    }

    /// Notes a use now, for eviction.
    pub(crate) fn used(&self) {
        self.last_used.store(now_secs(), Ordering::Relaxed);
    }

    /// Whether every chunk has arrived.
    pub fn complete(&self) -> bool {
        self.fetch.complete()
    }

    /// Why the fetch was abandoned, if it was.
    pub fn failure(&self) -> Option<FileCacheError> {
        self.fetch.failure()
    }

    /// Where chunk `idx` starts, and its bytes.
    pub(crate) fn chunk_range(&self, idx: usize) -> (u64, u32) {
        (idx as u64 * u64::from(CHUNK), chunk_len(self.size(), idx))
    }

    /// Abandons the fetch (the first reason stays).
    pub(crate) fn fail(&self, why: FileCacheError) {
        self.fetch.fail(why, &self.path);
    }
}
