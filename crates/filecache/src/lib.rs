//! The file cache: whole files fetched by compress-and-copy, decompressed
//! into local files, and served from there.
//!
//! A file is fetched as [`CHUNK`]-sized chunks from a [`ChunkSource`] (the
//! upstream's extension program). A background task keeps up to
//! [`WINDOW`] chunks in flight, in file order from the chunk after the
//! last one a reader fetched itself; a read needing bytes that have not
//! arrived fetches them itself (the pieces it reads, then the rest of
//! their chunk behind them) or waits for the fetch already under way, so
//! reads of early parts are served before the end arrives and a read far
//! ahead does not wait for the whole file. Such a fetch runs
//! in a task of its own: others wait on it, and it must arrive even if the
//! read that started it is dropped. Chunks the zero
//! map says are all zeros are never fetched: the local file is sparse.
//!
//! Every chunk must come with the attributes the file had when the fetch
//! started (size, mtime, ctime); a chunk from a changed file fails the
//! entry, and the reads waiting on it take the normal block path. One entry
//! per file handle: concurrent users of one file (READs here, FETCH calls
//! from other proxies when this is a LAN proxy) share one fetch.
//!
//! A proxy that answers other proxies' FETCHes from here (a LAN proxy)
//! also keeps each chunk's frame, as it arrived, in `NAME.frames` beside the
//! file, and hands that on: the many client proxies it serves cost it no
//! compression (see [`Frame`]).
//!
//! Writes into a held file stay here until written back: each dirty chunk
//! is sent with STORE_GUARDED, so a file changed at the origin since it was
//! fetched is not written over (a conflict: the writes stay, reported).
//! A SETATTR writes the file back and lets it go, refusing WRITEs that come
//! meanwhile, which the client then sends upstream. A full disk fails a
//! WRITE with [`HeldWriteError::NoSpace`] (NFS3ERR_NOSPC).
//!
//! Crash safety: a finished file is synced, then recorded in the
//! [`MetaIndex`] with its attributes (the record's bytes are specified in
//! `filecache/record.rs`: magic, version, CRC); files without such a
//! record (a fetch cut short), or whose record does not load, are deleted
//! when the cache is opened. Entries are evicted,
//! least recently used first, to keep the total under a byte budget.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use gvfs_nfs::layer::lock;
use gvfs_nfs::nfs3_types::nfs3::{fattr3, nfsstat3, writeverf3};
use gvfs_nfs::xdr::zeros;
use gvfs_nfs::{BoxFuture, Credentials};
use tokio::sync::watch;

use gvfs_ext::{
    CHUNK, ChunkSource, Codec, FetchArgs, FetchError, LEVEL, StoreArgs, Urgency, compress,
    decompress,
};
use gvfs_metafile::scan::data_extent;
use gvfs_metafile::{ByteRepeat, MetaFile};

pub use block_index::{BlockIndex, Place};
pub use error::{FileCacheError, HeldWriteError, IndexError, RecordError};
pub use index::{Entry, MemIndex, MetaIndex, SledIndex};
pub use profiles::Profiles;
pub use side::SideFiles;

mod block_index;
mod error;
mod index;
mod profiles;
mod side;

mod dedup;
pub use dedup::BlockReader;
pub use frames::Frame;
use frames::FrameStore;
mod fetch;
mod frames;
mod held;
mod learn;
mod pieces;
mod read;
mod record;
mod rest;
mod writeback;

use record::{decode_record, encode_record};

/// Chunks one file's background fetch keeps in flight.
pub const WINDOW: usize = 8;
/// ... while readers fetch chunks of their own (and for
/// [`DEMAND_HOLD_MS`] after): one compressed chunk is about a
/// bandwidth-delay product on a WAN, so the link stays busy while a piece
/// a reader waits for is queued behind no more than that (a guest
/// faulting in an image never cloned before waits for one fault after
/// another: with 2 it took 22% longer to run; with none, the link idle
/// between faults, its later reads took longer).
pub const UNDER_DEMAND: usize = 1;
/// Runs of pieces fetched at once first, because a working-set profile
/// names them (a guest's first touches are scattered: mostly one piece
/// each, so about a bandwidth-delay product of them in flight) ...
pub const PROFILE_WINDOW: usize = 96;
/// ... and at most these bytes of them (a reader's fault the profile
/// missed is queued behind no more on the link).
pub const PROFILE_BYTES: u64 = 1 << 20;
/// How long after a reader's own fetch the background stream stays at
/// [`UNDER_DEMAND`].
const DEMAND_HOLD_MS: u64 = 300;

use learn::Learning;
pub use learn::{LEARN_QUIET, PROFILE_WAIT};
pub use read::Asked;

/// The unit readers' own fetches and profiles go by: a page fault of a
/// lazy clone whose image has a working-set profile fetches the pieces its
/// read covers, not its whole chunk, and a profile names pieces. Two of a
/// guest's 4 KiB pages: a resuming guest touches about one page in each
/// of the 64 KiB around it, so a larger piece multiplies the bytes it
/// waits for.
pub const PIECE: u32 = 8 << 10;
/// Pieces in a run of the rest of a chunk fetched behind a reader's.
const STREAM_RUN: u32 = 64;

/// A set of the pieces of one chunk (bit `i`: bytes `i * PIECE..` of it).
type Mask = u128;
const _: () = assert!(CHUNK / PIECE == Mask::BITS);

/// Which pieces of a chunk that is not whole yet are here, and which are
/// being fetched.
#[derive(Debug, Default, Clone, Copy)]
struct Pieces {
    here: Mask,
    fetching: Mask,
    /// Whether the rest of the chunk is being fetched behind a reader's
    /// pieces, a run at a time (the background stream leaves it).
    streaming: bool,
}

/// The state of a file's chunks, and the pieces of those not whole yet.
#[derive(Debug)]
struct Chunks {
    state: Vec<Chunk>,
    pieces: HashMap<usize, Pieces>,
}

impl Chunks {
    fn new(state: Vec<Chunk>) -> Self {
        Self {
            state,
            pieces: HashMap::new(),
        }
    }
}

impl std::ops::Deref for Chunks {
    type Target = Vec<Chunk>;
    fn deref(&self) -> &Vec<Chunk> {
        &self.state
    }
}

impl std::ops::DerefMut for Chunks {
    fn deref_mut(&mut self) -> &mut Vec<Chunk> {
        &mut self.state
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    Missing,
    InFlight,
    Present,
    /// All zeros by the zero map (or, for a file kept across a restart, a
    /// hole in it): a hole in the local file, read as zeros without
    /// touching it.
    Zero,
}

impl Chunk {
    fn here(self) -> bool {
        matches!(self, Chunk::Present | Chunk::Zero)
    }
}

gvfs_nfs::counters! {
    /// What the file cache counts.
    pub struct Counters => FileCacheCounts {
        /// Whole-file fetches started.
        files_fetched,
        /// Fetches that finished (every chunk arrived).
        files_complete,
        /// Fetches abandoned (upstream error, file changed, local I/O).
        files_failed,
        /// Users that joined a fetch already under way instead of starting one.
        coalesced_fetches,
        /// FETCH calls sent upstream.
        chunks_fetched,
        /// Chunks never fetched because the zero map says they are zeros.
        zero_chunks,
        /// Bytes received on the wire (compressed).
        wire_bytes,
        /// File bytes those chunks held (decompressed).
        raw_bytes,
        /// Reads served from the file cache.
        hits,
        /// Bytes served from the file cache.
        hit_bytes,
        /// Chunks sent to other proxies in a kept frame, compressed by nobody.
        frames_reused,
        /// Chunks compressed here for other proxies (then kept).
        frames_made,
        /// Wall time of the whole-file fetches that finished, summed, from the
        /// start to the last chunk (microseconds).
        fetch_micros,
        /// Time spent decompressing arrived chunks (microseconds).
        decompress_micros,
        /// File bytes sent as zeros because they repeat earlier bytes, and
        /// copied from those here.
        repeat_bytes,
        /// Files evicted to stay under the budget.
        evicted,
        /// Files written back (compressed, uploaded with STORE).
        written_back_files,
        /// File bytes written back.
        written_back_bytes,
        /// Bytes sent for them (compressed).
        written_back_wire_bytes,
        /// Write-backs stopped because the file had changed at the origin
        /// since it was fetched: the local writes are kept, not stored over it.
        write_back_conflicts,
        /// Wire bytes of chunks fetched because a reader waited for them.
        demand_wire_bytes,
        /// Wire bytes of chunks fetched because a working-set profile
        /// named them.
        profile_wire_bytes,
        /// Wire bytes of chunks fetched by the background stream.
        background_wire_bytes,
        /// Reads that waited for a chunk not here yet (faults).
        faults_waited,
        /// Time those reads waited, summed (microseconds).
        fault_wait_micros,
        /// Whole-file fetches that started with a working-set profile.
        profile_hits,
        /// Pieces fetched first because a profile named them.
        profile_pieces,
        /// Working-set profiles learned here and sent upstream.
        profiles_sent,
        /// Learned read orders not kept as profiles: the file was read in
        /// file order (a copy, not a working set).
        profiles_discarded,
        /// File bytes copied from blocks held here (of another image, or
        /// earlier in the same one) with the content hash the metadata
        /// names, instead of fetched.
        dedup_bytes,
        /// Fetches not sent at all: every block was held here.
        dedup_fetches_saved,
        /// Held blocks that were not what their fingerprint promised (a
        /// file rewritten since, a damaged disk, a fingerprint shared by
        /// other bytes): not used, fetched.
        dedup_rejected,
        /// 64 KiB pieces that did not match their hash in the image's
        /// metadata: with held blocks in them, fetched again whole;
        /// otherwise as upstream sent them (the metadata is wrong), and
        /// their blocks not offered for dedup.
        hash_mismatches,
    }
}

/// Counters, for `gvfsctl stats` and the metrics endpoint.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct FileCacheStats {
    /// What the file cache counted.
    #[serde(flatten)]
    pub counts: FileCacheCounts,
    /// Bytes of frame files held now (counted in the budget).
    pub frame_bytes: u64,
    /// Bytes of files held now.
    pub cached_bytes: u64,
    /// Files holding writes not yet written back.
    pub dirty_files: u64,
    /// Bytes copied from held blocks instead of fetched, per held file
    /// (the largest [`DEDUP_FILES_SHOWN`]).
    pub dedup_files: Vec<FileDedup>,
    /// Blocks written into the dedup index and made durable (in the
    /// background, at low priority).
    pub blocks_indexed: u64,
    /// Blocks taken out of the index again (their file or block let go).
    pub blocks_forgotten: u64,
    /// Ranges not indexed because the indexer's queue was full.
    pub index_dropped: u64,
}

/// Files listed in [`FileCacheStats::dedup_files`].
pub const DEDUP_FILES_SHOWN: usize = 32;

/// What dedup saved one held file.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileDedup {
    /// The file's handle, in hex.
    pub fh: String,
    /// Its name, where the metadata layer knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its bytes copied from blocks held here instead of fetched.
    pub bytes: u64,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub use gvfs_nfs::same_version;

/// What a file-cache entry knows of its file's versions.
#[derive(Debug, Clone)]
struct Versions {
    /// The attributes upstream gave the version fetched (or written back).
    upstream: fattr3,
    /// What clients see: `upstream`, or after local writes their size and
    /// times.
    local: fattr3,
    /// Chunks written here and not yet written back, each with the number
    /// of the write that last touched it.
    dirty: BTreeMap<usize, u64>,
    /// Who wrote last: the credentials write-back uses.
    writer: Option<Credentials>,
    /// WRITEs under way (between marking their chunks dirty and updating
    /// the attributes): the entry is not let go, and FETCH answers are
    /// not made, while there are any.
    writing: u32,
    /// The largest end of a WRITE started: a record lists chunks before
    /// their bytes land, so its size covers them.
    reserved: u64,
    /// Dirty chunks a durable (flushed) record lists: a WRITE touching
    /// only these needs no record made durable before its bytes land.
    durable: BTreeSet<usize>,
    /// Bumped when write-back takes chunks out of `dirty`, so a record
    /// made durable meanwhile does not add them to `durable`.
    epoch: u64,
    /// Being written back to be let go: no WRITE starts.
    closing: bool,
}

impl Versions {
    fn new(upstream: fattr3) -> Self {
        Self {
            local: upstream.clone(),
            upstream,
            dirty: BTreeMap::new(),
            writer: None,
            writing: 0,
            reserved: 0,
            durable: BTreeSet::new(),
            epoch: 0,
            closing: false,
        }
    }
}

/// A WRITE under way: while it lives the entry counts as busy.
struct WritePin<'a>(&'a CachedFile);

impl Drop for WritePin<'_> {
    fn drop(&mut self) {
        let mut v = lock(&self.0.versions);
        v.writing = v.writing.saturating_sub(1);
        drop(v);
        self.0.unpinned.notify_waiters();
    }
}

/// One file in the cache.
pub struct CachedFile {
    fh: Vec<u8>,
    versions: Mutex<Versions>,
    writes: AtomicU64,
    path: PathBuf,
    file: std::fs::File,
    chunks: Mutex<Chunks>,
    /// Frames of present chunks kept for other proxies (LAN proxies only).
    frames: FrameStore,
    /// Bumped whenever a chunk arrives or the fetch fails.
    changed: watch::Sender<u64>,
    failed: Mutex<Option<FileCacheError>>,
    last_used: AtomicU64,
    /// Told whenever a WRITE under way ends.
    unpinned: tokio::sync::Notify,
    /// When the entry was made: the clock of `last_demand_ms`.
    born: Instant,
    /// When a reader's own fetch last ended (ms since `born`, plus 1; 0:
    /// never).
    last_demand_ms: AtomicU64,
    /// Readers' own fetches under way.
    demand_in_flight: AtomicUsize,
    /// The rests of chunks readers fetch behind their pieces, under way.
    behind_in_flight: AtomicUsize,
    /// The chunk after the last one a reader fetched itself, plus 1 (0:
    /// none yet): where the background stream goes on from, because a
    /// guest faulting its memory in walks through regions of it.
    follow: AtomicUsize,
    /// Whether the background fetch follows a working-set profile: a
    /// reader's fault then fetches only the pieces it needs (the profile
    /// brings the rest of the working set); without one, the whole chunk.
    profiled: AtomicBool,
    /// The order readers first touch chunks in, while it is learned.
    learning: Mutex<Option<Learning>>,
    /// The file's metadata when it has block hashes (for dedup).
    content: Option<Arc<MetaFile>>,
    /// Bytes of it copied from blocks held here instead of fetched.
    dedup_bytes: AtomicU64,
}

impl std::fmt::Debug for CachedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedFile")
            .field("path", &self.path)
            .finish()
    }
}

impl CachedFile {
    /// The attributes upstream gave the version held here.
    pub fn attrs(&self) -> fattr3 {
        lock(&self.versions).upstream.clone()
    }

    /// The file's handle.
    pub fn fh(&self) -> &[u8] {
        &self.fh
    }

    /// The attributes clients see: upstream's, or after local writes
    /// their size and times.
    pub fn local_attrs(&self) -> fattr3 {
        lock(&self.versions).local.clone()
    }

    /// Whether it holds writes not yet written back.
    pub fn is_dirty(&self) -> bool {
        !lock(&self.versions).dirty.is_empty()
    }

    /// Whether it must not be let go: it holds writes, or one is under way.
    fn busy(&self) -> bool {
        let v = lock(&self.versions);
        !v.dirty.is_empty() || v.writing > 0
    }

    /// The writes counter and the attributes of the bytes held now (the
    /// local ones once written here), or `None` while a WRITE is under way.
    fn stamp(&self) -> Option<(u64, fattr3)> {
        let v = lock(&self.versions);
        if v.writing > 0 {
            return None;
        }
        let attrs = if v.dirty.is_empty() {
            v.upstream.clone()
        } else {
            v.local.clone()
        };
        Some((self.writes.load(Ordering::Acquire), attrs))
    }

    fn size(&self) -> u64 {
        lock(&self.versions).local.size
    }

    /// Whether every chunk has arrived.
    pub fn complete(&self) -> bool {
        lock(&self.chunks).iter().all(|c| c.here())
    }

    /// Why the fetch was abandoned, if it was.
    pub fn failure(&self) -> Option<FileCacheError> {
        lock(&self.failed).clone()
    }

    fn chunk_count(size: u64) -> usize {
        usize::try_from(size.div_ceil(u64::from(CHUNK))).unwrap_or(usize::MAX)
    }

    fn chunk_range(&self, idx: usize) -> (u64, u32) {
        (
            idx as u64 * u64::from(CHUNK),
            pieces::chunk_len(self.size(), idx),
        )
    }

    fn fail(&self, why: FileCacheError) {
        let mut f = lock(&self.failed);
        if f.is_none() {
            tracing::warn!(file = %self.path.display(), "file cache fetch abandoned: {why}");
            *f = Some(why);
        }
        drop(f);
        self.changed.send_modify(|v| *v += 1);
    }
}

fn data_is_empty(offset: u64, end: u64) -> bool {
    end <= offset
}

/// The first and last chunk of `offset..end` (`end > offset`).
fn chunks_of(offset: u64, end: u64) -> (usize, usize) {
    (
        (offset / u64::from(CHUNK)) as usize,
        ((end - 1) / u64::from(CHUNK)) as usize,
    )
}

fn now_time() -> gvfs_nfs::nfs3_types::nfs3::nfstime3 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    gvfs_nfs::nfs3_types::nfs3::nfstime3 {
        seconds: d.as_secs() as u32,
        nseconds: d.subsec_nanos(),
    }
}

/// The file cache of one proxy.
pub struct FileCache {
    dir: PathBuf,
    /// The write verifier of WRITEs kept here: new at every start, so
    /// clients resend writes they did not COMMIT before a crash.
    verifier: [u8; 8],
    index: Option<Arc<dyn MetaIndex>>,
    files: Mutex<HashMap<Vec<u8>, Arc<CachedFile>>>,
    max_bytes: u64,
    /// Set once this proxy answers another proxy's FETCH from here.
    keep_frames: AtomicBool,
    /// Where working-set profiles are kept (set by the proxy with an index).
    profiles: std::sync::OnceLock<Arc<Profiles>>,
    /// Where held blocks are found by content hash (set with dedup on).
    blocks: std::sync::OnceLock<crate::block_index::BlockIndex>,
    /// Writes to it, in the background.
    indexer: std::sync::OnceLock<dedup::Indexer>,
    indexed: Arc<dedup::IndexerCounts>,
    /// Dedup of files read block by block (through the block cache).
    block_path: dedup::BlockPath,
    /// Files removed at open as unfinished: their blocks leave the index
    /// when it is set.
    unfinished: Mutex<Vec<Vec<u8>>>,
    counters: Counters,
}

impl std::fmt::Debug for FileCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileCache")
            .field("dir", &self.dir)
            .field("max_bytes", &self.max_bytes)
            .finish()
    }
}

/// The index key of a file-cache entry.
fn index_key(fh: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + fh.len());
    k.push(b'f');
    k.extend_from_slice(fh);
    k
}

fn file_name(fh: &[u8]) -> String {
    fh.iter().map(|b| format!("{b:02x}")).collect()
}

/// The frame file beside a cached file (removed at open, as its name is not
/// a handle's).
fn frames_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".frames");
    PathBuf::from(p)
}

/// The handle a cached file's name (or [`FileDedup::fh`]) spells in hex.
pub fn parse_handle(name: &str) -> Option<Vec<u8>> {
    parse_name(name)
}

fn parse_name(name: &str) -> Option<Vec<u8>> {
    if !name.len().is_multiple_of(2) || name.len() > 128 {
        return None;
    }
    (0..name.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(name.get(i..i + 2)?, 16).ok())
        .collect()
}

impl FileCache {
    /// Opens (creating) the cache in `dir`, keeping at most `max_bytes` of
    /// files. Finished files recorded in `index` are kept; anything else in
    /// the directory (fetches cut short by a crash) is deleted.
    pub fn open(
        dir: &Path,
        index: Option<Arc<dyn MetaIndex>>,
        max_bytes: u64,
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
            profiles: std::sync::OnceLock::new(),
            blocks: std::sync::OnceLock::new(),
            indexer: std::sync::OnceLock::new(),
            indexed: Arc::default(),
            block_path: dedup::BlockPath::default(),
            unfinished: Mutex::new(Vec::new()),
            counters: Counters::default(),
        });
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let path = entry.path();
            let kept = entry
                .file_name()
                .to_str()
                .and_then(parse_name)
                .and_then(|fh| cache.restore(&fh, &path));
            match kept {
                Some(f) => {
                    lock(&cache.files).insert(f.fh.clone(), f);
                }
                None => {
                    if let Some(fh) = entry.file_name().to_str().and_then(parse_name) {
                        lock(&cache.unfinished).push(fh);
                    }
                    tracing::info!(path = %path.display(), "file cache: removing an unfinished file");
                    let _ = std::fs::remove_file(&path);
                }
            }
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
        Some(Arc::new(CachedFile {
            fh: fh.to_vec(),
            versions: Mutex::new(versions),
            writes: AtomicU64::new(0),
            path: path.to_path_buf(),
            file,
            chunks: Mutex::new(Chunks::new(chunks)),
            frames: FrameStore::new(frames_path(path)),
            changed: watch::channel(0).0,
            failed: Mutex::new(None),
            last_used: AtomicU64::new(now_secs()),
            unpinned: tokio::sync::Notify::new(),
            born: Instant::now(),
            last_demand_ms: AtomicU64::new(0),
            demand_in_flight: AtomicUsize::new(0),
            behind_in_flight: AtomicUsize::new(0),
            follow: AtomicUsize::new(0),
            profiled: AtomicBool::new(false),
            learning: Mutex::new(None),
            content: None,
            dedup_bytes: AtomicU64::new(0),
        }))
    }

    /// Keeps the working-set profiles learned or fetched here in
    /// `profiles` (without, they are only passed on).
    pub fn keep_profiles(&self, profiles: Arc<Profiles>) {
        let _ = self.profiles.set(profiles);
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
            cached_bytes,
            dirty_files,
            dedup_files,
            blocks_indexed: self.indexed.noted.load(Ordering::Relaxed),
            blocks_forgotten: self.indexed.forgotten.load(Ordering::Relaxed),
            index_dropped: self.indexed.dropped.load(Ordering::Relaxed),
        }
    }

    /// The entry for `fh`, if there is a usable one (not failed).
    pub fn get(&self, fh: &[u8]) -> Option<Arc<CachedFile>> {
        lock(&self.files)
            .get(fh)
            .filter(|f| f.failure().is_none())
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
    fn holds(&self, f: &Arc<CachedFile>) -> bool {
        lock(&self.files)
            .get(&f.fh)
            .is_some_and(|g| Arc::ptr_eq(g, f))
    }

    /// Records a file in the index (finished, with its dirty chunks), if
    /// it is still the entry of its file: under the lock that replacing it
    /// takes, so a record of a let-go entry never outlives it. Returns the
    /// `epoch` and the dirty chunks recorded, or `None` when it was let go.
    fn record(&self, f: &Arc<CachedFile>) -> Result<Option<(u64, Vec<usize>)>, IndexError> {
        let files = lock(&self.files);
        if !files.get(&f.fh).is_some_and(|g| Arc::ptr_eq(g, f)) {
            return Ok(None);
        }
        let (bytes, epoch, chunks) = {
            let v = lock(&f.versions);
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
    /// in a crash costs only a fetch.
    fn record_lazily(&self, f: &Arc<CachedFile>) {
        if let Err(e) = self.record(f) {
            tracing::warn!(file = %f.path.display(), "file cache: cannot record a file: {e}");
        }
    }

    /// Records a file and waits until the record is durable. Returns
    /// whether it is still the entry of its file.
    async fn record_durably(&self, f: &Arc<CachedFile>) -> Result<bool, HeldWriteError> {
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
        let mut v = lock(&f.versions);
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
}

/// The chunks of a file kept from before a restart: those wholly in holes
/// of the (sparse) file are zeros, as the zero map made them when it was
/// fetched, and are answered without reading it; the rest are data.
fn restored_chunks(file: &std::fs::File, size: u64) -> Vec<Chunk> {
    let mut chunks = vec![Chunk::Zero; CachedFile::chunk_count(size)];
    let chunk = u64::from(CHUNK);
    let mut pos = 0;
    while pos < size {
        let (start, end) = data_extent(file, pos, size);
        if start >= end {
            break;
        }
        let (first, last) = ((start / chunk) as usize, ((end - 1) / chunk) as usize);
        for c in chunks.iter_mut().take(last + 1).skip(first) {
            *c = Chunk::Present;
        }
        pos = end;
    }
    chunks
}

#[cfg(test)]
pub(crate) mod tests;
