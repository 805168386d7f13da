//! The file cache: whole files fetched by compress-and-copy, decompressed
//! into local files, and served from there.
//!
//! A file is fetched as [`CHUNK`]-sized chunks from a [`ChunkSource`] (the
//! upstream's extension program). A background task keeps up to
//! [`WINDOW`] chunks in flight, in file order; a read needing a chunk that
//! has not arrived fetches that chunk itself (or waits for the fetch already
//! under way), so reads of early parts are served before the end arrives
//! and a read far ahead does not wait for the whole file. Such a fetch runs
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
//! [`MetaIndex`] with its attributes; files without such a record (a fetch
//! cut short) are deleted when the cache is opened. Entries are evicted,
//! least recently used first, to keep the total under a byte budget.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use gvfs_nfs::Credentials;
use gvfs_nfs::nfs3_types::nfs3::{fattr3, nfsstat3, writeverf3};
use gvfs_nfs::nfs3_types::xdr_codec::Unpack;
use gvfs_nfs::xdr::{XdrReader, encode_into, put_u32, zeros};
use tokio::sync::watch;

use crate::MetaIndex;
use crate::ext::{
    CHUNK, ChunkSource, Codec, FetchArgs, FetchError, LEVEL, StoreArgs, StoreGuard, compress,
    decompress,
};
use crate::format::{ByteRepeat, MetaFile};
use crate::scan::data_extent;

/// Chunks one file's background fetch keeps in flight.
pub const WINDOW: usize = 8;

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

/// A chunk in the form another proxy fetches it: the frame it arrived in,
/// or the one made here the first time another proxy asked for it.
#[derive(Debug)]
pub struct Frame {
    /// How `data` is encoded.
    pub codec: Codec,
    /// The bytes on the wire.
    pub data: Vec<u8>,
    /// Ranges sent as zeros that repeat earlier bytes, as the frame
    /// arrived with them (only callers that fill repeats get such frames).
    pub repeats: Vec<ByteRepeat>,
}

/// Where a chunk's frame lies in its file's frame file.
#[derive(Debug, Clone)]
struct Slot {
    at: u64,
    len: u32,
    codec: Codec,
    repeats: Arc<[ByteRepeat]>,
}

/// The frames of one file's chunks, kept by a LAN proxy in a file beside
/// the cached file (`NAME.frames`), so that serving the file to many client
/// proxies decompresses it once and compresses nothing. Frames are only a
/// cache: the file goes with its entry, and a restart drops it (they are
/// made again on demand). A write drops the touched chunks' frames; the
/// frame file stops growing at the file's size plus a chunk, past which
/// frames are made for each caller and not kept.
#[derive(Debug)]
struct FrameStore {
    path: PathBuf,
    file: Mutex<FrameFile>,
    end: AtomicU64,
    slots: Mutex<HashMap<usize, Slot>>,
}

/// The frame file's state. Once removed it is never opened again: a new
/// entry for the same file may have made its own at the same path.
#[derive(Debug)]
enum FrameFile {
    None,
    Open(Arc<std::fs::File>),
    Removed,
}

impl FrameStore {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            file: Mutex::new(FrameFile::None),
            end: AtomicU64::new(0),
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// Bytes of the frame file.
    fn bytes(&self) -> u64 {
        self.end.load(Ordering::Relaxed)
    }

    fn file(&self) -> std::io::Result<Arc<std::fs::File>> {
        let mut f = lock(&self.file);
        match &*f {
            FrameFile::Open(file) => return Ok(file.clone()),
            FrameFile::Removed => {
                return Err(std::io::Error::other("the entry was let go"));
            }
            FrameFile::None => {}
        }
        let file = Arc::new(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&self.path)?,
        );
        *f = FrameFile::Open(file.clone());
        Ok(file)
    }

    /// Appends chunk `idx`'s frame (blocking I/O), unless the file was
    /// written since `writes_seen` or the frame file is full for `size`.
    fn keep(
        &self,
        idx: usize,
        frame: &Frame,
        size: u64,
        writes_seen: u64,
        writes: &AtomicU64,
    ) -> std::io::Result<bool> {
        let len = frame.data.len() as u64;
        let at = self.end.fetch_add(len, Ordering::Relaxed);
        if at + len > size + u64::from(CHUNK) {
            self.end.fetch_sub(len, Ordering::Relaxed);
            return Ok(false);
        }
        self.file()?.write_all_at(&frame.data, at)?;
        let mut slots = lock(&self.slots);
        if writes.load(Ordering::Acquire) != writes_seen {
            return Ok(false);
        }
        slots.insert(
            idx,
            Slot {
                at,
                len: len as u32,
                codec: frame.codec,
                repeats: frame.repeats.clone().into(),
            },
        );
        Ok(true)
    }

    fn slot(&self, idx: usize) -> Option<Slot> {
        lock(&self.slots).get(&idx).cloned()
    }

    /// Reads a kept frame (blocking I/O).
    fn read(&self, slot: Slot) -> std::io::Result<Frame> {
        let mut data = vec![0u8; slot.len as usize];
        self.file()?.read_exact_at(&mut data, slot.at)?;
        Ok(Frame {
            codec: slot.codec,
            data,
            repeats: slot.repeats.to_vec(),
        })
    }

    /// Drops the frames of chunks `first..=last`.
    fn forget(&self, first: usize, last: usize) {
        lock(&self.slots).retain(|c, _| !(first..=last).contains(c));
    }

    fn remove(&self) {
        let was = std::mem::replace(&mut *lock(&self.file), FrameFile::Removed);
        if matches!(was, FrameFile::Open(_)) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Counters, for `gvfsctl stats` and the metrics endpoint.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FileCacheStats {
    /// Whole-file fetches started.
    pub files_fetched: u64,
    /// Fetches that finished (every chunk arrived).
    pub files_complete: u64,
    /// Fetches abandoned (upstream error, file changed, local I/O).
    pub files_failed: u64,
    /// Users that joined a fetch already under way instead of starting one.
    pub coalesced_fetches: u64,
    /// FETCH calls sent upstream.
    pub chunks_fetched: u64,
    /// Chunks never fetched because the zero map says they are zeros.
    pub zero_chunks: u64,
    /// Bytes received on the wire (compressed).
    pub wire_bytes: u64,
    /// File bytes those chunks held (decompressed).
    pub raw_bytes: u64,
    /// Reads served from the file cache.
    pub hits: u64,
    /// Bytes served from the file cache.
    pub hit_bytes: u64,
    /// Chunks sent to other proxies in a kept frame, compressed by nobody.
    pub frames_reused: u64,
    /// Chunks compressed here for other proxies (then kept).
    pub frames_made: u64,
    /// Bytes of frame files held now (counted in the budget).
    pub frame_bytes: u64,
    /// Wall time of the whole-file fetches that finished, summed, from the
    /// start to the last chunk (microseconds).
    pub fetch_micros: u64,
    /// Time spent decompressing arrived chunks (microseconds).
    pub decompress_micros: u64,
    /// File bytes sent as zeros because they repeat earlier bytes, and
    /// copied from those here.
    pub repeat_bytes: u64,
    /// Files evicted to stay under the budget.
    pub evicted: u64,
    /// Bytes of files held now.
    pub cached_bytes: u64,
    /// Files holding writes not yet written back.
    pub dirty_files: u64,
    /// Files written back (compressed, uploaded with STORE).
    pub written_back_files: u64,
    /// File bytes written back.
    pub written_back_bytes: u64,
    /// Bytes sent for them (compressed).
    pub written_back_wire_bytes: u64,
    /// Write-backs stopped because the file had changed at the origin
    /// since it was fetched: the local writes are kept, not stored over it.
    pub write_back_conflicts: u64,
}

#[derive(Debug, Default)]
struct Counters {
    files_fetched: AtomicU64,
    files_complete: AtomicU64,
    files_failed: AtomicU64,
    coalesced_fetches: AtomicU64,
    chunks_fetched: AtomicU64,
    zero_chunks: AtomicU64,
    wire_bytes: AtomicU64,
    raw_bytes: AtomicU64,
    hits: AtomicU64,
    hit_bytes: AtomicU64,
    frames_reused: AtomicU64,
    frames_made: AtomicU64,
    fetch_micros: AtomicU64,
    decompress_micros: AtomicU64,
    repeat_bytes: AtomicU64,
    evicted: AtomicU64,
    written_back_files: AtomicU64,
    written_back_bytes: AtomicU64,
    written_back_wire_bytes: AtomicU64,
    write_back_conflicts: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Whether two sets of attributes describe the same version of a file.
pub fn same_version(a: &fattr3, b: &fattr3) -> bool {
    a.size == b.size
        && (a.mtime.seconds, a.mtime.nseconds) == (b.mtime.seconds, b.mtime.nseconds)
        && (a.ctime.seconds, a.ctime.nseconds) == (b.ctime.seconds, b.ctime.nseconds)
}

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

/// Why a WRITE into a held file was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeldWriteError {
    /// The file is not held whole (or its fetch failed): the caller
    /// forwards the WRITE.
    #[error("the file is not held whole")]
    NotHeld,
    /// The write ends past what the file cache can hold.
    #[error("a write ending at {end} does not fit the file cache ({max} bytes)")]
    TooLarge {
        /// Where the write ends.
        end: u64,
        /// The cache's budget.
        max: u64,
    },
    /// The entry was let go (written back, evicted, replaced) while the
    /// write was under way: nothing was kept, and the client should send
    /// the WRITE again (NFS3ERR_JUKEBOX), which then goes upstream.
    #[error("the file was let go during the write")]
    LetGo,
    /// Local I/O (the file, the index) failed: the write is not durable.
    #[error("{0}")]
    Local(String),
    /// The file cache's disk is full (or over quota): the write is not
    /// kept; writes go on once there is room again.
    #[error("{0}")]
    NoSpace(String),
}

/// Whether an I/O error says the disk is full or over quota.
fn no_space(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

/// A local I/O failure of a WRITE kept here, as what the client is told.
fn local_failure(what: String, e: &std::io::Error) -> HeldWriteError {
    if no_space(e) {
        HeldWriteError::NoSpace(format!("{what}: {e}"))
    } else {
        HeldWriteError::Local(format!("{what}: {e}"))
    }
}

/// A failure of the file cache's index, as what a WRITE's client is told.
fn index_failure(e: crate::IndexError) -> HeldWriteError {
    let full = matches!(&e, crate::IndexError::Sled(sled::Error::Io(io)) if no_space(io));
    let what = format!("cannot record a file in the file-cache index: {e}");
    if full {
        HeldWriteError::NoSpace(what)
    } else {
        HeldWriteError::Local(what)
    }
}

impl HeldWriteError {
    /// The status a client sees (RFC 1813, section 3.3.7).
    pub fn nfsstat(&self) -> gvfs_nfs::nfs3_types::nfs3::nfsstat3 {
        use gvfs_nfs::nfs3_types::nfs3::nfsstat3;
        match self {
            Self::LetGo => nfsstat3::NFS3ERR_JUKEBOX,
            Self::TooLarge { .. } => nfsstat3::NFS3ERR_FBIG,
            Self::NoSpace(_) => nfsstat3::NFS3ERR_NOSPC,
            Self::NotHeld | Self::Local(_) => nfsstat3::NFS3ERR_IO,
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
    chunks: Mutex<Vec<Chunk>>,
    /// Frames of present chunks kept for other proxies (LAN proxies only).
    frames: FrameStore,
    /// Bumped whenever a chunk arrives or the fetch fails.
    changed: watch::Sender<u64>,
    failed: Mutex<Option<String>>,
    last_used: AtomicU64,
    /// Told whenever a WRITE under way ends.
    unpinned: tokio::sync::Notify,
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
    pub fn failure(&self) -> Option<String> {
        lock(&self.failed).clone()
    }

    fn chunk_count(size: u64) -> usize {
        usize::try_from(size.div_ceil(u64::from(CHUNK))).unwrap_or(usize::MAX)
    }

    fn chunk_range(&self, idx: usize) -> (u64, u32) {
        let start = idx as u64 * u64::from(CHUNK);
        let len = self.size().saturating_sub(start).min(u64::from(CHUNK)) as u32;
        (start, len)
    }

    fn fail(&self, why: String) {
        let mut f = lock(&self.failed);
        if f.is_none() {
            tracing::warn!(file = %self.path.display(), "file cache fetch abandoned: {why}");
            *f = Some(why);
        }
        drop(f);
        self.changed.send_modify(|v| *v += 1);
    }

    /// Claims the first chunk at or after `from` that nobody fetches yet.
    fn claim_next(&self, from: usize) -> Option<usize> {
        let mut chunks = lock(&self.chunks);
        let idx = chunks
            .iter()
            .skip(from)
            .position(|c| *c == Chunk::Missing)?
            + from;
        chunks[idx] = Chunk::InFlight;
        Some(idx)
    }

    fn set(&self, idx: usize, state: Chunk) {
        lock(&self.chunks)[idx] = state;
        self.changed.send_modify(|v| *v += 1);
    }

    /// Fetches chunk `idx` (already claimed) and writes it into the file.
    async fn fetch_chunk(
        self: &Arc<Self>,
        cache: &FileCache,
        source: &dyn ChunkSource,
        cred: &Credentials,
        idx: usize,
    ) -> Result<(), String> {
        let (offset, count) = self.chunk_range(idx);
        let writes = self.writes.load(Ordering::Acquire);
        let args = FetchArgs {
            fh: self.fh.clone(),
            offset,
            count,
        };
        let result = async {
            let ok = source.fetch(cred, &args).await.map_err(|e| match e {
                FetchError::Nfs(st) => format!("upstream answered {st:?}"),
                FetchError::Transport(t) => t,
            })?;
            if !same_version(&ok.attrs, &self.attrs()) {
                return Err("the file changed upstream during the fetch".to_string());
            }
            if ok.raw_len != count {
                return Err(format!(
                    "chunk at {offset} holds {} bytes, expected {count}",
                    ok.raw_len
                ));
            }
            let wire = ok.data.len() as u64;
            ok.check_repeats(offset)?;
            let mut ok = ok;
            let repeats = std::mem::take(&mut ok.repeats);
            // Their sources before this chunk must be here first: earlier
            // chunks, which never wait for later ones.
            for r in repeats.iter().filter(|r| r.from < offset) {
                let end = (r.from + u64::from(r.len)).min(offset);
                self.wait_for(r.from, end).await?;
            }
            let repeated: u64 = repeats.iter().map(|r| u64::from(r.len)).sum();
            let keep = cache.keep_frames.load(Ordering::Relaxed);
            let me = self.clone();
            let spent = tokio::task::spawn_blocking(move || {
                // Kept with its repeats: handed on only to callers that
                // fill them.
                let frame = keep.then(|| Frame {
                    codec: ok.codec,
                    data: ok.data.clone(),
                    repeats: repeats.clone(),
                });
                let t = Instant::now();
                let mut raw = decompress(ok)?;
                let spent = t.elapsed().as_micros() as u64;
                me.fill_repeats(&mut raw, offset, &repeats)?;
                me.file
                    .write_all_at(&raw, offset)
                    .map_err(|e| format!("writing {}: {e}", me.path.display()))?;
                if let Some(frame) = frame {
                    me.keep_frame(idx, &frame, writes);
                }
                Ok::<_, String>(spent)
            })
            .await
            .map_err(|e| e.to_string())??;
            bump(&cache.counters.decompress_micros, spent);
            bump(&cache.counters.repeat_bytes, repeated);
            bump(&cache.counters.chunks_fetched, 1);
            bump(&cache.counters.wire_bytes, wire);
            bump(&cache.counters.raw_bytes, u64::from(count));
            Ok(())
        }
        .await;
        match result {
            Ok(()) => {
                self.set(idx, Chunk::Present);
                Ok(())
            }
            Err(why) => {
                self.set(idx, Chunk::Missing);
                self.fail(why.clone());
                Err(why)
            }
        }
    }

    /// Waits until the data chunks under `from..end` have arrived (someone
    /// else fetches them: they come before the chunk that waits). A chunk
    /// of zeros there contradicts the repeat that points at it.
    async fn wait_for(&self, from: u64, end: u64) -> Result<(), String> {
        if end <= from {
            return Ok(());
        }
        let (first, last) = chunks_of(from, end);
        let mut rx = self.changed.subscribe();
        loop {
            if let Some(why) = self.failure() {
                return Err(why);
            }
            let here = {
                let chunks = lock(&self.chunks);
                let span = chunks
                    .get(first..=last)
                    .ok_or("a repeat points past the file")?;
                if span.contains(&Chunk::Zero) {
                    return Err(format!(
                        "a repeat's source at {from} lies in a chunk of zeros"
                    ));
                }
                span.iter().all(|c| *c == Chunk::Present)
            };
            if here {
                return Ok(());
            }
            rx.changed()
                .await
                .map_err(|_| "the fetch went away".to_string())?;
        }
    }

    /// Copies each repeat's source into `raw`, the chunk at `offset` (blocking
    /// I/O): bytes before the chunk from the file, the rest from `raw`.
    fn fill_repeats(
        &self,
        raw: &mut [u8],
        offset: u64,
        repeats: &[ByteRepeat],
    ) -> Result<(), String> {
        for r in repeats {
            let to = (r.to - offset) as usize;
            let len = r.len as usize;
            let before = offset.saturating_sub(r.from).min(u64::from(r.len)) as usize;
            if before > 0 {
                self.file
                    .read_exact_at(&mut raw[to..to + before], r.from)
                    .map_err(|e| format!("reading {}: {e}", self.path.display()))?;
            }
            if before < len {
                let from = (r.from + before as u64 - offset) as usize;
                raw.copy_within(from..from + (len - before), to + before);
            }
        }
        Ok(())
    }

    /// Waits until `offset..offset + len` has arrived, fetching chunks that
    /// nobody fetches yet.
    async fn ensure(
        self: &Arc<Self>,
        cache: &Arc<FileCache>,
        source: &Arc<dyn ChunkSource>,
        cred: &Credentials,
        offset: u64,
        len: u64,
    ) -> Result<(), String> {
        if len == 0 {
            return Ok(());
        }
        let first = (offset / u64::from(CHUNK)) as usize;
        let last = ((offset + len - 1) / u64::from(CHUNK)) as usize;
        let mut rx = self.changed.subscribe();
        loop {
            if let Some(why) = self.failure() {
                return Err(why);
            }
            let (missing, waiting) = {
                let mut chunks = lock(&self.chunks);
                let mut missing = None;
                let mut waiting = false;
                for (i, c) in chunks.iter_mut().enumerate().take(last + 1).skip(first) {
                    match *c {
                        Chunk::Missing if missing.is_none() => {
                            *c = Chunk::InFlight;
                            missing = Some(i);
                        }
                        Chunk::Missing | Chunk::InFlight => waiting = true,
                        Chunk::Present | Chunk::Zero => {}
                    }
                }
                (missing, waiting)
            };
            match missing {
                // Its own task: readers waiting for this chunk (and the
                // background fetch, which has passed it) must not depend on
                // this one, whose client may go away mid-fetch.
                Some(idx) => {
                    let (me, cache, source, cred) =
                        (self.clone(), cache.clone(), source.clone(), cred.clone());
                    tokio::spawn(async move {
                        me.fetch_chunk(&cache, source.as_ref(), &cred, idx).await
                    })
                    .await
                    .map_err(|e| format!("a chunk's fetch stopped: {e}"))??;
                }
                None if waiting => {
                    rx.changed()
                        .await
                        .map_err(|_| "the fetch went away".to_string())?;
                }
                None => return Ok(()),
            }
        }
    }

    /// Reads `offset..offset + count` (clipped to the file), waiting for
    /// (or fetching) the chunks it needs. Returns the bytes and whether they
    /// reach the end of the file.
    pub async fn read(
        self: &Arc<Self>,
        cache: &Arc<FileCache>,
        source: &Arc<dyn ChunkSource>,
        cred: &Credentials,
        offset: u64,
        count: u32,
    ) -> Result<(Cow<'static, [u8]>, bool), String> {
        let size = self.size();
        let end = offset.saturating_add(u64::from(count)).min(size);
        let len = end.saturating_sub(offset);
        self.ensure(cache, source, cred, offset, len).await?;
        self.last_used.store(now_secs(), Ordering::Relaxed);
        let pieces = self.data_pieces(offset, end);
        let data = if pieces.is_empty() {
            // Only zero chunks (most of a memory image): no file, no buffer.
            zeros(len as usize)
        } else {
            let me = self.clone();
            tokio::task::spawn_blocking(move || {
                // Holes in the file are not read, or zeroed twice.
                let mut buf = vec![0u8; len as usize];
                for (from, to) in pieces {
                    let at = (from - offset) as usize..(to - offset) as usize;
                    me.file
                        .read_exact_at(&mut buf[at], from)
                        .map_err(|e| format!("reading {}: {e}", me.path.display()))?;
                }
                Ok::<_, String>(Cow::Owned(buf))
            })
            .await
            .map_err(|e| e.to_string())??
        };
        bump(&cache.counters.hits, 1);
        bump(&cache.counters.hit_bytes, len);
        Ok((data, end >= size))
    }

    /// The parts of `offset..end` outside chunks of zeros, as ranges.
    fn data_pieces(&self, offset: u64, end: u64) -> Vec<(u64, u64)> {
        if end <= offset {
            return Vec::new();
        }
        let (first, last) = chunks_of(offset, end);
        let chunks = lock(&self.chunks);
        let mut pieces: Vec<(u64, u64)> = Vec::new();
        for idx in first..=last {
            if chunks.get(idx) == Some(&Chunk::Zero) {
                continue;
            }
            let from = (idx as u64 * u64::from(CHUNK)).max(offset);
            let to = ((idx as u64 + 1) * u64::from(CHUNK)).min(end);
            match pieces.last_mut() {
                Some(p) if p.1 == from => p.1 = to,
                _ => pieces.push((from, to)),
            }
        }
        pieces
    }

    /// Keeps chunk `idx`'s frame in the frame file (blocking I/O); a
    /// frame that cannot be kept is only not kept.
    fn keep_frame(&self, idx: usize, frame: &Frame, writes_seen: u64) -> bool {
        let size = self.size();
        match self
            .frames
            .keep(idx, frame, size, writes_seen, &self.writes)
        {
            Ok(kept) => kept,
            Err(e) => {
                tracing::debug!(path = %self.frames.path.display(), "cannot keep a frame: {e}");
                false
            }
        }
    }

    /// `offset..offset + count` for another proxy's FETCH, as a frame: the
    /// one kept for that chunk (one with repeats only when the caller fills
    /// them, `repeats`), or compressed now (and kept, when it is a whole
    /// chunk and none is). Returns the frame, the file bytes it holds,
    /// whether they reach the end of the file, and the attributes of the
    /// version they belong to: upstream's, or once clients wrote here the
    /// local ones (so the caller's version check sees the difference).
    /// Fails when a WRITE ran at the same time: the bytes might belong to
    /// neither version.
    pub async fn read_frame(
        self: &Arc<Self>,
        cache: &Arc<FileCache>,
        source: &Arc<dyn ChunkSource>,
        cred: &Credentials,
        offset: u64,
        count: u32,
        repeats: bool,
    ) -> Result<(Frame, u32, bool, fattr3), String> {
        const RACED: &str = "the file was written during the FETCH";
        let (seen, attrs) = self.stamp().ok_or(RACED)?;
        let (frame, len, eof) = self
            .frame_of(cache, source, cred, offset, count, repeats)
            .await?;
        match self.stamp() {
            Some((now, _)) if now == seen => Ok((frame, len, eof, attrs)),
            _ => Err(RACED.into()),
        }
    }

    async fn frame_of(
        self: &Arc<Self>,
        cache: &Arc<FileCache>,
        source: &Arc<dyn ChunkSource>,
        cred: &Credentials,
        offset: u64,
        count: u32,
        repeats: bool,
    ) -> Result<(Frame, u32, bool), String> {
        let idx = usize::try_from(offset / u64::from(CHUNK)).unwrap_or(usize::MAX);
        let (start, len) = self.chunk_range(idx);
        let whole = len > 0 && offset == start && count >= len;
        if whole {
            self.ensure(cache, source, cred, offset, u64::from(len))
                .await?;
            if let Some(slot) = self
                .frames
                .slot(idx)
                .filter(|s| repeats || s.repeats.is_empty())
            {
                let me = self.clone();
                let kept = tokio::task::spawn_blocking(move || me.frames.read(slot))
                    .await
                    .map_err(|e| e.to_string())?;
                match kept {
                    Ok(frame) => {
                        self.last_used.store(now_secs(), Ordering::Relaxed);
                        bump(&cache.counters.frames_reused, 1);
                        bump(&cache.counters.hits, 1);
                        bump(&cache.counters.hit_bytes, u64::from(len));
                        let eof = start + u64::from(len) >= self.size();
                        return Ok((frame, len, eof));
                    }
                    Err(e) => {
                        tracing::debug!(path = %self.frames.path.display(), "cannot read a frame: {e}");
                        self.frames.forget(idx, idx);
                    }
                }
            }
        }
        let writes = self.writes.load(Ordering::Acquire);
        let (raw, eof) = self.read(cache, source, cred, offset, count).await?;
        let raw_len = raw.len() as u32;
        let keep = whole && raw_len == len && self.frames.slot(idx).is_none();
        let me = self.clone();
        let (frame, kept) = tokio::task::spawn_blocking(move || {
            let (codec, data) = compress(&raw, LEVEL);
            let frame = Frame {
                codec,
                data,
                repeats: Vec::new(),
            };
            let kept = keep && me.keep_frame(idx, &frame, writes);
            (frame, kept)
        })
        .await
        .map_err(|e| e.to_string())?;
        if kept {
            bump(&cache.counters.frames_made, 1);
        }
        Ok((frame, raw_len, eof))
    }
}

impl CachedFile {
    /// A client's WRITE into a file held whole: written here, marked dirty
    /// (written back by `gvfsctl writeback`), synced when `sync`. Returns
    /// the attributes clients saw before and see after. See
    /// [`try_write`](Self::try_write), which tells why a write failed.
    pub async fn write(
        self: &Arc<Self>,
        cache: &FileCache,
        cred: &Credentials,
        offset: u64,
        data: Vec<u8>,
        sync: bool,
    ) -> Result<(fattr3, fattr3), String> {
        self.try_write(cache, cred, offset, data, sync)
            .await
            .map_err(|e| e.to_string())
    }

    /// [`write`](Self::write), failing with why.
    ///
    /// Crash safety: the chunks a write touches are marked dirty before
    /// its bytes land (so nothing lets the entry go meanwhile), and unless
    /// a durable record already lists them, a record listing them is made
    /// durable first: a crash never leaves changed bytes under a record
    /// that calls them upstream's. A `sync` write is acknowledged only once
    /// the file is synced and its record (size, times) is durable.
    pub async fn try_write(
        self: &Arc<Self>,
        cache: &FileCache,
        cred: &Credentials,
        offset: u64,
        data: Vec<u8>,
        sync: bool,
    ) -> Result<(fattr3, fattr3), HeldWriteError> {
        if !self.complete() || self.failure().is_some() {
            return Err(HeldWriteError::NotHeld);
        }
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or(HeldWriteError::TooLarge {
                end: u64::MAX,
                max: cache.max_bytes,
            })?;
        // The chunk table grows with the file: a client's offset is capped
        // by the cache's budget before anything is allocated for it.
        if end > cache.max_bytes {
            return Err(HeldWriteError::TooLarge {
                end,
                max: cache.max_bytes,
            });
        }
        if data_is_empty(offset, end) {
            // A WRITE of no bytes changes nothing, not even the size
            // (RFC 1813, section 3.3.7).
            let now = self.local_attrs();
            return Ok((now.clone(), now));
        }
        let (first, last) = chunks_of(offset, end);
        // Refused while the entry is being let go (a SETATTR writes it
        // back first): the client's retry goes upstream.
        let (pin, recorded) = self
            .pin_write(first, last, end)
            .ok_or(HeldWriteError::LetGo)?;
        self.last_used.store(now_secs(), Ordering::Relaxed);
        if !recorded && !cache.record_durably(self).await? {
            return Err(HeldWriteError::LetGo);
        }
        {
            let mut chunks = lock(&self.chunks);
            for c in chunks.iter_mut().take(last + 1).skip(first) {
                if *c == Chunk::Zero {
                    *c = Chunk::Present;
                }
            }
        }
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            me.file.write_all_at(&data, offset)?;
            if sync { me.file.sync_data() } else { Ok(()) }
        })
        .await
        .map_err(|e| HeldWriteError::Local(e.to_string()))?
        .map_err(|e| local_failure(format!("writing {}", self.path.display()), &e))?;
        self.frames.forget(first, last);
        let (before, after, recorded) = {
            let mut v = lock(&self.versions);
            // Numbered again now the bytes are here: a write-back that read
            // the chunk before they landed leaves it dirty.
            let n = self.writes.fetch_add(1, Ordering::AcqRel) + 1;
            let before = v.local.clone();
            if end > v.local.size {
                v.local.size = end;
                v.local.used = end;
            }
            let t = now_time();
            v.local.mtime = t;
            v.local.ctime = t;
            for c in first..=last {
                v.dirty.insert(c, n);
            }
            v.writer = Some(cred.clone());
            let recorded = (first..=last).all(|c| v.durable.contains(&c));
            (before, v.local.clone(), recorded)
        };
        drop(pin);
        {
            let mut chunks = lock(&self.chunks);
            let want = Self::chunk_count(after.size);
            if chunks.len() < want {
                chunks.resize(want, Chunk::Present);
            }
        }
        let kept = if sync || !recorded {
            cache.record_durably(self).await?
        } else {
            cache.holds(self)
        };
        if !kept {
            return Err(HeldWriteError::LetGo);
        }
        Ok((before, after))
    }

    /// Marks chunks `first..=last` dirty and a write under way (until the
    /// pin is dropped), before its bytes land. Returns the pin and whether
    /// a durable record lists those chunks already; `None` when the entry
    /// is being let go.
    fn pin_write(&self, first: usize, last: usize, end: u64) -> Option<(WritePin<'_>, bool)> {
        let mut v = lock(&self.versions);
        if v.closing {
            return None;
        }
        v.writing += 1;
        let n = self.writes.fetch_add(1, Ordering::AcqRel) + 1;
        for c in first..=last {
            v.dirty.insert(c, n);
        }
        v.reserved = v.reserved.max(end);
        let recorded = (first..=last).all(|c| v.durable.contains(&c));
        Some((WritePin(self), recorded))
    }

    /// A client's COMMIT: the file synced and its dirty chunks recorded
    /// durably, so they survive a crash, before it is acknowledged.
    pub async fn commit(self: &Arc<Self>, cache: &FileCache) -> Result<fattr3, HeldWriteError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.file.sync_all())
            .await
            .map_err(|e| HeldWriteError::Local(e.to_string()))?
            .map_err(|e| local_failure(format!("syncing {}", self.path.display()), &e))?;
        // An entry let go held no writes any more: they were written back,
        // durably, upstream.
        cache.record_durably(self).await?;
        Ok(self.local_attrs())
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

/// What the index keeps for a finished file: upstream's attributes, and
/// when it holds writes, the attributes clients see and the dirty chunks.
/// The size recorded covers the writes under way, whose chunks are listed
/// before their bytes land.
fn encode_record(v: &Versions) -> Vec<u8> {
    let mut out = Vec::with_capacity(172 + 4 * v.dirty.len());
    encode_into(&mut out, &v.upstream);
    if !v.dirty.is_empty() {
        let mut local = v.local.clone();
        local.size = local.size.max(v.reserved);
        encode_into(&mut out, &local);
        put_u32(&mut out, v.dirty.len() as u32);
        for c in v.dirty.keys() {
            put_u32(&mut out, *c as u32);
        }
    }
    out
}

fn decode_record(bytes: &[u8]) -> Option<Versions> {
    let mut cur = std::io::Cursor::new(bytes);
    let (upstream, _) = fattr3::unpack(&mut cur).ok()?;
    let mut v = Versions::new(upstream);
    if cur.position() as usize == bytes.len() {
        return Some(v);
    }
    let (local, _) = fattr3::unpack(&mut cur).ok()?;
    let mut r = XdrReader::new(bytes.get(cur.position() as usize..)?);
    let n = r.u32().ok()? as usize;
    let most = CachedFile::chunk_count(local.size);
    if n > most {
        return None;
    }
    for _ in 0..n {
        let c = r.u32().ok()? as usize;
        if c >= most {
            return None;
        }
        v.dirty.insert(c, 0);
    }
    if !r.rest().is_empty() {
        return None;
    }
    v.durable = v.dirty.keys().copied().collect();
    v.local = local;
    Some(v)
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
                    tracing::info!(path = %path.display(), "file cache: removing an unfinished file");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        Ok(cache)
    }

    fn restore(&self, fh: &[u8], path: &Path) -> Option<Arc<CachedFile>> {
        let v = self.index.as_ref()?.get(&index_key(fh)).ok()??;
        let versions = decode_record(&v)?;
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
            chunks: Mutex::new(chunks),
            frames: FrameStore::new(frames_path(path)),
            changed: watch::channel(0).0,
            failed: Mutex::new(None),
            last_used: AtomicU64::new(now_secs()),
            unpinned: tokio::sync::Notify::new(),
        }))
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
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let c = &self.counters;
        let (cached_bytes, frame_bytes, dirty_files) = {
            let files = lock(&self.files);
            (
                files.values().map(|f| f.size()).sum(),
                files.values().map(|f| f.frames.bytes()).sum(),
                files.values().filter(|f| f.is_dirty()).count() as u64,
            )
        };
        FileCacheStats {
            files_fetched: g(&c.files_fetched),
            files_complete: g(&c.files_complete),
            files_failed: g(&c.files_failed),
            coalesced_fetches: g(&c.coalesced_fetches),
            chunks_fetched: g(&c.chunks_fetched),
            zero_chunks: g(&c.zero_chunks),
            wire_bytes: g(&c.wire_bytes),
            raw_bytes: g(&c.raw_bytes),
            hits: g(&c.hits),
            hit_bytes: g(&c.hit_bytes),
            frames_reused: g(&c.frames_reused),
            frames_made: g(&c.frames_made),
            frame_bytes,
            fetch_micros: g(&c.fetch_micros),
            decompress_micros: g(&c.decompress_micros),
            repeat_bytes: g(&c.repeat_bytes),
            evicted: g(&c.evicted),
            cached_bytes,
            dirty_files,
            written_back_files: g(&c.written_back_files),
            written_back_bytes: g(&c.written_back_bytes),
            written_back_wire_bytes: g(&c.written_back_wire_bytes),
            write_back_conflicts: g(&c.write_back_conflicts),
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
    fn record(&self, f: &Arc<CachedFile>) -> Result<Option<(u64, Vec<usize>)>, crate::IndexError> {
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
        let Some((epoch, chunks)) = self.record(f).map_err(index_failure)? else {
            return Ok(false);
        };
        if let Some(index) = self.index.clone() {
            tokio::task::spawn_blocking(move || index.flush())
                .await
                .map_err(|e| HeldWriteError::Local(e.to_string()))?
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

    /// Writes every dirty file back through `source` (STORE: compressed
    /// chunks, written durably upstream), then lets go of it: the file's
    /// metadata describes the version before the writes. Returns the file
    /// bytes written back. A file that fails (a conflict, upstream down)
    /// stays dirty and the others are still written back; the error then
    /// names the first failure and how many there were.
    pub async fn write_back(&self, source: &dyn ChunkSource) -> Result<u64, String> {
        let mut total = 0;
        let mut failed = Vec::new();
        for f in self.dirty() {
            match self.write_back_file(source, &f).await {
                Ok(n) => total += n,
                Err(e) => failed.push(e),
            }
        }
        match failed.len() {
            0 => Ok(total),
            1 => Err(failed.swap_remove(0)),
            n => Err(format!(
                "{} (and {} more files)",
                failed.swap_remove(0),
                n - 1
            )),
        }
    }

    /// Writes one file's dirty chunks back; see [`write_back`](Self::write_back).
    ///
    /// Each chunk is sent with STORE_GUARDED: written only if the file at
    /// the origin still has the size, mtime and ctime of the version this
    /// copy was fetched at (then of the write-back's previous chunk). A
    /// file changed there meanwhile is a conflict: nothing more is stored,
    /// the local writes stay (dirty, served to this proxy's clients), it is
    /// logged as an error and counted in `write_back_conflicts`.
    pub async fn write_back_file(
        &self,
        source: &dyn ChunkSource,
        f: &Arc<CachedFile>,
    ) -> Result<u64, String> {
        let (snapshot, cred, mut expected) = {
            let v = lock(&f.versions);
            let cred = v
                .writer
                .clone()
                .unwrap_or_else(|| Credentials::unix(v.local.uid, v.local.gid));
            (v.dirty.clone(), cred, v.upstream.clone())
        };
        let mut bytes = 0;
        let mut wire = 0;
        let mut stored = Ok(());
        for (&c, &n) in &snapshot {
            let (offset, len) = f.chunk_range(c);
            let me = f.clone();
            let read = tokio::task::spawn_blocking(move || {
                let mut raw = vec![0u8; len as usize];
                me.file.read_exact_at(&mut raw, offset)?;
                Ok::<_, std::io::Error>(StoreArgs::new(me.fh.clone(), offset, &raw, LEVEL))
            })
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| format!("reading {}: {e}", f.path.display())));
            let mut args = match read {
                Ok(a) => a,
                Err(e) => {
                    stored = Err(e);
                    break;
                }
            };
            args.guard = Some(StoreGuard::of(&expected));
            wire += args.data.len() as u64;
            match source.store(&cred, &args).await {
                Ok(attrs) => {
                    bytes += u64::from(len);
                    // Clean now, unless written again meanwhile; the next
                    // chunk expects the file as this STORE left it.
                    let mut v = lock(&f.versions);
                    if v.dirty.get(&c) == Some(&n) {
                        v.dirty.remove(&c);
                        v.durable.remove(&c);
                        v.epoch += 1;
                    }
                    v.upstream = attrs.clone();
                    expected = attrs;
                }
                Err(FetchError::Nfs(nfsstat3::NFS3ERR_NOT_SYNC)) => {
                    bump(&self.counters.write_back_conflicts, 1);
                    tracing::error!(
                        file = %f.path.display(),
                        "file cache: write-back conflict: the file changed at the origin \
                         since this proxy fetched it; its local writes are kept here and \
                         not written over the origin's (see the README: \"write-back \
                         conflicts\")"
                    );
                    stored = Err(format!(
                        "write-back conflict: {} changed at the origin since it was fetched; \
                         the local writes are kept in {}",
                        file_name(&f.fh),
                        f.path.display()
                    ));
                    break;
                }
                Err(FetchError::Nfs(st)) => {
                    stored = Err(format!("upstream refused the write-back: {st:?}"));
                    break;
                }
                Err(FetchError::Transport(t)) => {
                    stored = Err(t);
                    break;
                }
            }
        }
        bump(&self.counters.written_back_bytes, bytes);
        bump(&self.counters.written_back_wire_bytes, wire);
        if let Err(e) = stored {
            // What was stored is clean; the record says so.
            self.record_lazily(f);
            return Err(e);
        }
        let clean = !f.is_dirty();
        if clean {
            bump(&self.counters.written_back_files, 1);
        }
        // Let go unless written again meanwhile (or being written now),
        // under the lock a WRITE checks it is still the entry with.
        let let_go = clean && {
            let mut files = lock(&self.files);
            let free = files.get(&f.fh).is_some_and(|g| Arc::ptr_eq(g, f)) && !f.busy();
            if free {
                files.remove(&f.fh);
                self.discard(f);
            }
            free
        };
        if !let_go {
            self.record_lazily(f);
        }
        tracing::info!(file = %f.path.display(), bytes, wire, "file cache: wrote a file back");
        Ok(bytes)
    }

    /// Writes one file back and lets it go, for a call that changes the
    /// file upstream (SETATTR): WRITEs that come meanwhile are refused
    /// ([`HeldWriteError::LetGo`]: the client sends them again, and they go
    /// upstream), and those already under way are waited for and written
    /// back too, so the file is not left holding writes the call's change
    /// does not see. On failure the entry keeps its writes and takes WRITEs
    /// again.
    pub async fn write_back_and_let_go(
        &self,
        source: &dyn ChunkSource,
        f: &Arc<CachedFile>,
    ) -> Result<u64, String> {
        lock(&f.versions).closing = true;
        let mut total = 0;
        loop {
            let unpinned = f.unpinned.notified();
            tokio::pin!(unpinned);
            // Registered before the check, so a pin dropped after it wakes us.
            unpinned.as_mut().enable();
            if f.is_dirty() {
                match self.write_back_file(source, f).await {
                    Ok(n) => total += n,
                    Err(e) => {
                        lock(&f.versions).closing = false;
                        return Err(e);
                    }
                }
                continue;
            }
            if lock(&f.versions).writing > 0 {
                unpinned.await;
                continue;
            }
            // Clean and idle: let go (written back, or never written).
            let mut files = lock(&self.files);
            if files.get(&f.fh).is_some_and(|g| Arc::ptr_eq(g, f)) {
                files.remove(&f.fh);
                self.discard(f);
            }
            return Ok(total);
        }
    }

    /// Removes a let-go entry's record, file and frames. Called under the
    /// files lock that took it out of the map: a new entry of the same file
    /// (at the same path) cannot have been made yet.
    fn discard(&self, f: &CachedFile) {
        if let Some(index) = &self.index {
            let _ = index.remove(&index_key(&f.fh));
        }
        let _ = std::fs::remove_file(&f.path);
        f.frames.remove();
    }

    /// The entry for this version of the file, starting its fetch from
    /// `source` when there is none. `zero` (the file's valid metadata)
    /// spares fetching chunks of zeros. Fails when the file cannot be held
    /// (over the budget, local I/O).
    pub fn start(
        self: &Arc<Self>,
        fh: &[u8],
        attrs: &fattr3,
        zero: Option<&MetaFile>,
        source: Arc<dyn ChunkSource>,
        cred: &Credentials,
    ) -> Result<Arc<CachedFile>, String> {
        let mut files = lock(&self.files);
        if let Some(f) = files.get(fh) {
            if f.busy() || (f.failure().is_none() && same_version(&f.attrs(), attrs)) {
                if !f.complete() {
                    bump(&self.counters.coalesced_fetches, 1);
                }
                return Ok(f.clone());
            }
            let old = files.remove(fh);
            if let Some(old) = old {
                self.discard(&old);
            }
        }
        self.make_room(&mut files, attrs.size)?;
        // A record left of an earlier entry (let go without a flush since)
        // must not survive a crash to describe the half-fetched file about
        // to be made at its path.
        if let Some(index) = &self.index {
            index
                .remove(&index_key(fh))
                .and_then(|()| index.flush())
                .map_err(|e| format!("clearing the record of a file: {e}"))?;
        }
        let path = self.dir.join(file_name(fh));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .and_then(|f| f.set_len(attrs.size).map(|()| f))
            .map_err(|e| format!("creating {}: {e}", path.display()))?;
        let n = CachedFile::chunk_count(attrs.size);
        let mut chunks = vec![Chunk::Missing; n];
        let mut zeros = 0;
        if let Some(m) = zero {
            for (i, c) in chunks.iter_mut().enumerate() {
                let start = i as u64 * u64::from(CHUNK);
                let len = (attrs.size - start).min(u64::from(CHUNK));
                if m.range_is_zero(start, len) {
                    *c = Chunk::Zero;
                    zeros += 1;
                }
            }
        }
        bump(&self.counters.zero_chunks, zeros);
        bump(&self.counters.files_fetched, 1);
        let entry = Arc::new(CachedFile {
            fh: fh.to_vec(),
            versions: Mutex::new(Versions::new(attrs.clone())),
            writes: AtomicU64::new(0),
            frames: FrameStore::new(frames_path(&path)),
            path,
            file,
            chunks: Mutex::new(chunks),
            changed: watch::channel(0).0,
            failed: Mutex::new(None),
            last_used: AtomicU64::new(now_secs()),
            unpinned: tokio::sync::Notify::new(),
        });
        files.insert(fh.to_vec(), entry.clone());
        drop(files);
        tokio::spawn(self.clone().fetch_all(entry.clone(), source, cred.clone()));
        Ok(entry)
    }

    /// Evicts finished or failed files, least recently used first, until
    /// `size` more bytes fit.
    fn make_room(
        &self,
        files: &mut HashMap<Vec<u8>, Arc<CachedFile>>,
        size: u64,
    ) -> Result<(), String> {
        if size > self.max_bytes {
            return Err(format!(
                "the file ({size} bytes) is larger than the file cache ({} bytes)",
                self.max_bytes
            ));
        }
        loop {
            let held: u64 = files.values().map(|f| f.size() + f.frames.bytes()).sum();
            if held + size <= self.max_bytes {
                return Ok(());
            }
            let victim = files
                .values()
                .filter(|f| !f.busy() && (f.complete() || f.failure().is_some()))
                .min_by_key(|f| f.last_used.load(Ordering::Relaxed))
                .map(|f| f.fh.clone());
            let Some(fh) = victim else {
                return Err("the file cache is full of fetches under way".into());
            };
            if let Some(f) = files.remove(&fh) {
                self.discard(&f);
                bump(&self.counters.evicted, 1);
            }
        }
    }

    /// The background fetch of a whole file: [`WINDOW`] chunks in flight,
    /// in file order; then sync and record it.
    async fn fetch_all(
        self: Arc<Self>,
        entry: Arc<CachedFile>,
        source: Arc<dyn ChunkSource>,
        cred: Credentials,
    ) {
        let started = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        let mut next = 0;
        loop {
            while set.len() < WINDOW
                && entry.failure().is_none()
                && let Some(idx) = entry.claim_next(next)
            {
                next = idx + 1;
                let (cache, entry, source, cred) =
                    (self.clone(), entry.clone(), source.clone(), cred.clone());
                set.spawn(
                    async move { entry.fetch_chunk(&cache, source.as_ref(), &cred, idx).await },
                );
            }
            if set.join_next().await.is_none() {
                break;
            }
        }
        // Chunks that readers fetched themselves may still be arriving.
        let mut rx = entry.changed.subscribe();
        while entry.failure().is_none() && !entry.complete() {
            if rx.changed().await.is_err() {
                break;
            }
        }
        if let Some(why) = entry.failure() {
            bump(&self.counters.files_failed, 1);
            tracing::debug!(%why, "file fetch failed");
            let mut files = lock(&self.files);
            if files.get(&entry.fh).is_some_and(|f| Arc::ptr_eq(f, &entry)) {
                files.remove(&entry.fh);
                self.discard(&entry);
            }
            return;
        }
        let e = entry.clone();
        let synced = tokio::task::spawn_blocking(move || e.file.sync_all()).await;
        if !matches!(synced, Ok(Ok(()))) {
            entry.fail("cannot sync the fetched file".into());
            return;
        }
        // Only if still the entry: one let go meanwhile must leave no
        // record to describe the file a newer entry makes at its path.
        self.record_lazily(&entry);
        bump(&self.counters.files_complete, 1);
        bump(
            &self.counters.fetch_micros,
            started.elapsed().as_micros() as u64,
        );
        tracing::info!(
            file = %entry.path.display(),
            bytes = entry.size(),
            secs = started.elapsed().as_secs_f64(),
            "file cache: fetched a whole file"
        );
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
pub(crate) mod tests {
    use super::*;
    use crate::ext::{FetchOk, compress};
    use crate::{MemIndex, ZeroMap};
    use gvfs_nfs::BoxFuture;
    use gvfs_nfs::nfs3_types::nfs3::nfsstat3;

    pub(crate) use gvfs_nfs::testing::file_attrs as attrs;

    /// A source serving `data` as a file, counting FETCHes, optionally
    /// holding every fetch until released.
    pub(crate) struct Fake {
        pub data: Vec<u8>,
        pub attrs: fattr3,
        pub calls: AtomicU64,
        pub gate: tokio::sync::Semaphore,
        pub stored: Mutex<Vec<(u64, Vec<u8>)>>,
        /// Ranges of `data` repeating earlier ranges: sent as zeros and
        /// listed, as a server with a repeat map does.
        pub repeats: Mutex<Vec<ByteRepeat>>,
        /// Files' attributes at the origin now (`attrs` for files not
        /// listed): a STORE's guard is checked against them, and each
        /// STORE moves their times on.
        pub origin: Mutex<HashMap<Vec<u8>, fattr3>>,
        /// STOREs started, and a gate each waits at (open unless a test
        /// closes it).
        pub stores: AtomicU64,
        pub store_gate: tokio::sync::Semaphore,
    }

    impl Fake {
        pub(crate) fn new(data: Vec<u8>, open: bool) -> Arc<Self> {
            Arc::new(Self {
                attrs: attrs(data.len() as u64, 7),
                data,
                calls: AtomicU64::new(0),
                gate: tokio::sync::Semaphore::new(if open { 1 << 20 } else { 0 }),
                stored: Mutex::new(Vec::new()),
                repeats: Mutex::new(Vec::new()),
                origin: Mutex::new(HashMap::new()),
                stores: AtomicU64::new(0),
                store_gate: tokio::sync::Semaphore::new(1 << 20),
            })
        }
    }

    impl ChunkSource for Fake {
        fn fetch<'a>(
            &'a self,
            _cred: &'a Credentials,
            args: &'a FetchArgs,
        ) -> BoxFuture<'a, Result<FetchOk, FetchError>> {
            Box::pin(async move {
                self.calls.fetch_add(1, Ordering::Relaxed);
                // Each fetch uses up a permit: the test decides how many pass.
                if let Ok(p) = self.gate.acquire().await {
                    p.forget();
                }
                let s = args.offset as usize;
                let e = (s + args.count as usize).min(self.data.len());
                let mut raw = self.data[s..e].to_vec();
                let mut listed = Vec::new();
                for r in lock(&self.repeats).iter() {
                    let (a, b) = (
                        (r.to as usize).max(s),
                        (r.to as usize + r.len as usize).min(e),
                    );
                    if a < b {
                        raw[a - s..b - s].fill(0);
                        listed.push(ByteRepeat {
                            to: a as u64,
                            from: r.from + (a as u64 - r.to),
                            len: (b - a) as u32,
                        });
                    }
                }
                let (codec, data) = compress(&raw, 3);
                Ok(FetchOk {
                    attrs: self.attrs.clone(),
                    raw_len: (e - s) as u32,
                    eof: e == self.data.len(),
                    codec,
                    data,
                    repeats: listed,
                })
            })
        }
        fn store<'a>(
            &'a self,
            _cred: &'a Credentials,
            args: &'a StoreArgs,
        ) -> BoxFuture<'a, Result<fattr3, FetchError>> {
            Box::pin(async move {
                self.stores.fetch_add(1, Ordering::Relaxed);
                if let Ok(p) = self.store_gate.acquire().await {
                    p.forget();
                }
                let raw = args.clone().raw().map_err(FetchError::Transport)?;
                let mut files = lock(&self.origin);
                let origin = files
                    .entry(args.fh.clone())
                    .or_insert_with(|| self.attrs.clone());
                if args.guard.is_some_and(|g| !g.passes(origin)) {
                    return Err(FetchError::Nfs(nfsstat3::NFS3ERR_NOT_SYNC));
                }
                let end = args.offset + raw.len() as u64;
                lock(&self.stored).push((args.offset, raw));
                let t = origin.mtime.seconds + 1;
                *origin = attrs(origin.size.max(end), t);
                Ok(origin.clone())
            })
        }
        fn supported(&self) -> BoxFuture<'_, bool> {
            Box::pin(async { true })
        }
        fn forward<'a>(
            &'a self,
            _cred: &'a Credentials,
            _args: &'a [u8],
        ) -> BoxFuture<'a, Result<Vec<u8>, FetchError>> {
            Box::pin(async { Err(FetchError::Transport("no".into())) })
        }
    }

    /// `fake` as the file cache's reads take their source.
    fn src(fake: &Arc<Fake>) -> Arc<dyn ChunkSource> {
        fake.clone()
    }

    fn content(len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| {
                if (i >> 20) % 3 == 1 {
                    0
                } else {
                    (i * 7 / 4096) as u8
                }
            })
            .collect()
    }

    fn index() -> Arc<dyn MetaIndex> {
        Arc::new(MemIndex::new(100))
    }

    /// Opens (or reopens, as after a restart) a 1 GiB cache in `dir`.
    fn reopen(dir: &Path, index: &Arc<dyn MetaIndex>) -> Arc<FileCache> {
        FileCache::open(dir, Some(index.clone()), 1 << 30).unwrap_or_else(|e| panic!("{e}"))
    }

    fn cache(dir: &Path) -> Arc<FileCache> {
        reopen(dir, &index())
    }

    /// A fresh directory, an index, a cache opened on both (reopen it with
    /// [`reopen`] to stand for a restart) and an upstream holding `data`.
    fn restartable(
        data: Vec<u8>,
    ) -> (
        tempfile::TempDir,
        Arc<dyn MetaIndex>,
        Arc<FileCache>,
        Arc<Fake>,
    ) {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let index = index();
        let c = reopen(dir.path(), &index);
        (dir, index, c, Fake::new(data, true))
    }

    /// A cache in a fresh directory (keeping frames when `frames`) with the
    /// fetch of `data` as file `fh` started, its fetches let through when
    /// `open`.
    fn started(
        fh: &[u8],
        data: Vec<u8>,
        open: bool,
        zero: Option<&MetaFile>,
        frames: bool,
    ) -> (
        tempfile::TempDir,
        Arc<Fake>,
        Arc<FileCache>,
        Arc<CachedFile>,
    ) {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let fake = Fake::new(data, open);
        let c = cache(dir.path());
        if frames {
            c.keep_frames();
        }
        let f = c
            .start(fh, &fake.attrs, zero, fake.clone(), &Credentials::default())
            .unwrap_or_else(|e| panic!("{e}"));
        (dir, fake, c, f)
    }

    #[tokio::test]
    async fn fetches_whole_file_and_skips_zero_chunks() {
        let len = 10 * CHUNK as usize + 1234;
        // Chunks 1, 4, 7 are zeros (content() makes them so).
        let meta = zero_meta(len, &[1, 4, 7]);
        let (_dir, fake, c, f) = started(b"fh1", content(len), true, Some(&meta), false);
        let cred = Credentials::default();
        let (all, eof) = f
            .read(&c, &src(&fake), &cred, 0, len as u32)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(eof);
        assert!(all == fake.data, "file cache bytes differ");
        assert_eq!(
            fake.calls.load(Ordering::Relaxed),
            8,
            "3 of 11 chunks are zeros"
        );
        let s = c.stats();
        assert_eq!((s.zero_chunks, s.chunks_fetched), (3, 8));
        assert!(s.wire_bytes < s.raw_bytes);
    }

    /// `data` with `(to, from, len)` made repeats of earlier bytes, and
    /// those repeats listed.
    fn with_repeats(mut data: Vec<u8>, list: &[(u64, u64, u32)]) -> (Vec<u8>, Vec<ByteRepeat>) {
        let mut out = Vec::new();
        for &(to, from, len) in list {
            let (t, f, n) = (to as usize, from as usize, len as usize);
            data.copy_within(f..f + n, t);
            out.push(ByteRepeat { to, from, len });
        }
        (data, out)
    }

    #[tokio::test]
    async fn repeated_bytes_are_copied_from_earlier_ones_in_any_order() {
        let c = u64::from(CHUNK);
        let len = 6 * CHUNK as usize;
        let (data, list) = with_repeats(
            content(len),
            &[
                // From chunk 0 into chunk 2.
                (2 * c + 4096, 8192, 3 * 4096),
                // Within chunk 3.
                (3 * c + 65536, 3 * c, 4096),
                // From across the end of chunk 3 into chunk 5 (chunk 4 is
                // zeros in content()).
                (5 * c + 4096, 4 * c - 4096, 8192),
                // Into the last bytes of the file.
                (6 * c - 4096, 5 * 4096, 4096),
            ],
        );
        for read_last_first in [false, true] {
            let (_dir, fake, cache, f) = started(b"fhr", data.clone(), true, None, false);
            *lock(&fake.repeats) = list.clone();
            let cred = Credentials::default();
            if read_last_first {
                // A reader that needs the last chunk before the others came.
                let at = 6 * c - 4096;
                let (got, _) = f
                    .read(&cache, &src(&fake), &cred, at, 4096)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(*got, data[at as usize..]);
            }
            let (all, _) = f
                .read(&cache, &src(&fake), &cred, 0, len as u32)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(
                all == data,
                "file cache bytes differ (last first: {read_last_first})"
            );
            assert_eq!(cache.stats().repeat_bytes, 3 * 4096 + 4096 + 8192 + 4096);
        }
    }

    #[tokio::test]
    async fn a_lan_proxy_hands_frames_with_repeats_only_to_callers_that_fill_them() {
        let c = u64::from(CHUNK);
        let len = 3 * CHUNK as usize;
        let (data, list) = with_repeats(content(len), &[(2 * c + 8192, 4096, 8192)]);
        let (_dir, fake, cache, f) = started(b"fhl", data.clone(), true, None, true);
        *lock(&fake.repeats) = list.clone();
        let cred = Credentials::default();
        let (all, _) = f
            .read(&cache, &src(&fake), &cred, 0, len as u32)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(all == data);
        // As it came: zeros where the repeat is, and the list.
        let (frame, n, _, _) = f
            .read_frame(&cache, &src(&fake), &cred, 2 * c, CHUNK, true)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(frame.repeats, list);
        let mut holes = data[2 * c as usize..].to_vec();
        holes[8192..16384].fill(0);
        assert!(unframe(&frame, n) == holes);
        // A caller that does not fill repeats gets the whole chunk.
        let (frame, n, _, _) = f
            .read_frame(&cache, &src(&fake), &cred, 2 * c, CHUNK, false)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(frame.repeats.is_empty());
        assert!(unframe(&frame, n) == data[2 * c as usize..]);
        let s = cache.stats();
        assert_eq!((s.frames_reused, s.frames_made), (1, 0), "{s:?}");
    }

    #[tokio::test]
    async fn repeats_that_do_not_fit_their_chunk_fail_the_fetch() {
        let c = u64::from(CHUNK);
        for bad in [
            // The source after the repeat; the source overlapping it; out
            // of order.
            vec![ByteRepeat {
                to: c + 4096,
                from: c + 8192,
                len: 4096,
            }],
            vec![ByteRepeat {
                to: c + 4096,
                from: c,
                len: 8192,
            }],
            vec![
                ByteRepeat {
                    to: c + 8192,
                    from: 0,
                    len: 4096,
                },
                ByteRepeat {
                    to: c + 4096,
                    from: 0,
                    len: 4096,
                },
            ],
        ] {
            let (_dir, fake, cache, f) =
                started(b"fhb", content(3 * CHUNK as usize), true, None, false);
            *lock(&fake.repeats) = bad.clone();
            let err = f
                .read(&cache, &src(&fake), &Credentials::default(), 0, 3 * CHUNK)
                .await
                .map(|_| ())
                .expect_err("a lying repeat");
            assert!(err.contains("does not fit"), "{bad:?}: {err}");
        }
    }

    #[tokio::test]
    async fn a_repeat_from_a_chunk_of_zeros_fails_the_fetch() {
        let len = 3 * CHUNK as usize;
        // content() makes chunk 1 zeros; the zero map says so.
        let meta = zero_meta(len, &[1]);
        let (_dir, fake, cache, f) = started(b"fhz", content(len), true, Some(&meta), false);
        *lock(&fake.repeats) = vec![ByteRepeat {
            to: 2 * u64::from(CHUNK),
            from: u64::from(CHUNK) + 4096,
            len: 4096,
        }];
        let cred = Credentials::default();
        let err = f
            .read(&cache, &src(&fake), &cred, 0, len as u32)
            .await
            .map(|_| ())
            .expect_err("the repeat contradicts the zero map");
        assert!(err.contains("chunk of zeros"), "{err}");
    }

    #[tokio::test]
    async fn a_read_far_ahead_is_served_before_the_rest() {
        let len = 40 * CHUNK as usize;
        let (_dir, fake, c, f) = started(b"fh2", content(len), false, None, false);
        let cred = Credentials::default();
        // Let the background window and the reader's own chunk through.
        fake.gate.add_permits(WINDOW + 1);
        let at = 30 * u64::from(CHUNK) + 5;
        let (got, _) = f
            .read(&c, &src(&fake), &cred, at, 1000)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(*got, fake.data[at as usize..at as usize + 1000]);
        assert!(!f.complete(), "served before the end arrived");
        fake.gate.add_permits(1 << 20);
        let (all, _) = f
            .read(&c, &src(&fake), &cred, 0, len as u32)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(all == fake.data);
    }

    #[tokio::test]
    async fn a_reader_that_goes_away_mid_fetch_leaves_no_chunk_stranded() {
        let len = 40 * CHUNK as usize;
        let (_dir, fake, c, f) = started(b"fh9", content(len), false, None, false);
        let cred = Credentials::default();
        // A client asks far ahead of the background window, then goes
        // away (its connection closed) while its chunk is on the wire.
        let at = 30 * u64::from(CHUNK);
        let gone = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            f.read(&c, &src(&fake), &cred, at, 1000),
        )
        .await;
        assert!(gone.is_err(), "the read waited for its chunk");
        fake.gate.add_permits(1 << 20);
        // Its chunk still arrives: the file completes, and reads of it end.
        whole(&c).await;
        let (got, _) = f
            .read(&c, &src(&fake), &cred, at, 1000)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(*got, fake.data[at as usize..at as usize + 1000]);
        assert_eq!(
            fake.calls.load(Ordering::Relaxed),
            40,
            "one fetch per chunk"
        );
    }

    #[tokio::test]
    async fn concurrent_users_share_one_fetch_and_restart_keeps_it() {
        let len = 6 * CHUNK as usize;
        let (dir, index, c, fake) = restartable(content(len));
        let cred = Credentials::default();
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (c, fake, cred) = (c.clone(), fake.clone(), cred.clone());
            tasks.push(tokio::spawn(async move {
                let f = c.start(b"fh3", &fake.attrs, None, fake.clone(), &cred)?;
                f.read(&c, &src(&fake), &cred, 0, len as u32).await
            }));
        }
        for t in tasks {
            let (got, _) = t
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(got == fake.data);
        }
        assert_eq!(fake.calls.load(Ordering::Relaxed), 6, "one fetch per chunk");
        // Wait for the record, then reopen: the file is kept, nothing fetched.
        whole(&c).await;
        drop(c);
        std::fs::write(dir.path().join("abcd"), b"half a fetch").unwrap_or_else(|e| panic!("{e}"));
        let c = reopen(dir.path(), &index);
        assert!(
            !dir.path().join("abcd").exists(),
            "unfinished files are removed"
        );
        let f = c
            .get(b"fh3")
            .unwrap_or_else(|| panic!("kept across reopen"));
        let (got, _) = f
            .read(&c, &src(&fake), &cred, 0, len as u32)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(got == fake.data);
        assert_eq!(fake.calls.load(Ordering::Relaxed), 6);
    }

    #[tokio::test]
    async fn zero_chunks_stay_unread_after_a_restart() {
        let len = 10 * CHUNK as usize + 1234;
        let meta = zero_meta(len, &[1, 4, 7]);
        let (dir, index, c, fake) = restartable(content(len));
        let cred = Credentials::default();
        c.start(b"fh0", &fake.attrs, Some(&meta), fake.clone(), &cred)
            .unwrap_or_else(|e| panic!("{e}"));
        whole(&c).await;
        drop(c);
        // The zero map is not asked again: the file's holes tell.
        let c = reopen(dir.path(), &index);
        let f = c
            .get(b"fh0")
            .unwrap_or_else(|| panic!("kept across reopen"));
        let zero: Vec<usize> = lock(&f.chunks)
            .iter()
            .enumerate()
            .filter(|(_, c)| **c == Chunk::Zero)
            .map(|(i, _)| i)
            .collect();
        assert_eq!(zero, [1, 4, 7]);
        let at = 4 * u64::from(CHUNK);
        let (got, _) = f
            .read(&c, &src(&fake), &cred, at, CHUNK)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            matches!(got, Cow::Borrowed(_)) && got.iter().all(|&b| b == 0),
            "a zero chunk was read from the file"
        );
        let (all, _) = f
            .read(&c, &src(&fake), &cred, 0, len as u32)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(all == fake.data);
        assert_eq!(
            fake.calls.load(Ordering::Relaxed),
            8,
            "nothing fetched again"
        );
    }

    #[tokio::test]
    async fn writes_stay_local_survive_a_reopen_and_are_written_back() {
        let len = 5 * CHUNK as usize;
        let (dir, index, c, fake) = restartable(content(len));
        let cred = Credentials::unix(7, 8);
        let f = c
            .start(b"fh5", &fake.attrs, None, fake.clone(), &cred)
            .unwrap_or_else(|e| panic!("{e}"));
        // A write before the file is whole is refused (the caller forwards it).
        f.read(&c, &src(&fake), &cred, 0, 10)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        whole(&c).await;
        // A write far past the end is refused before anything grows.
        let huge = f.write(&c, &cred, 1 << 60, b"x".to_vec(), false).await;
        assert!(huge.is_err(), "a write at 2^60 was taken");
        let at = 2 * u64::from(CHUNK) - 3;
        let (before, after) = f
            .write(&c, &cred, at, b"abcdef".to_vec(), false)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((before.size, after.size), (len as u64, len as u64));
        // Past the end: the file grows.
        let (_, after) = f
            .write(&c, &cred, len as u64 + 10, b"tail".to_vec(), false)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(after.size, len as u64 + 14);
        f.commit(&c).await.unwrap_or_else(|e| panic!("{e}"));
        let mut want = fake.data.clone();
        want[at as usize..at as usize + 6].copy_from_slice(b"abcdef");
        want.resize(len + 10, 0);
        want.extend_from_slice(b"tail");
        // Reopened (a restart after COMMIT): the writes are still there.
        drop((f, c));
        let c = reopen(dir.path(), &index);
        let f = c.get(b"fh5").unwrap_or_else(|| panic!("dirty file kept"));
        assert!(f.is_dirty());
        let (got, eof) = f
            .read(&c, &src(&fake), &cred, 0, len as u32 + 100)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(eof && got == want, "reads see the writes");
        // Write-back sends chunks 1, 2 and 5 (the touched ones), compressed.
        let bytes = c
            .write_back(fake.as_ref())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let stored = lock(&fake.stored).clone();
        let offsets: Vec<u64> = stored.iter().map(|(o, _)| *o).collect();
        assert_eq!(
            offsets,
            vec![u64::from(CHUNK), 2 * u64::from(CHUNK), 5 * u64::from(CHUNK)]
        );
        assert_eq!(bytes, 2 * u64::from(CHUNK) + 14);
        for (o, raw) in &stored {
            assert!(raw[..] == want[*o as usize..*o as usize + raw.len()]);
        }
        assert!(c.get(b"fh5").is_none(), "a written-back file is let go");
        assert!(c.stats().written_back_wire_bytes < bytes);
    }

    /// Item 6a of issue 20: a file changed at the origin after it was
    /// fetched is not written over. The write-back stops at the guard, the
    /// local writes stay (served, dirty, kept across a reopen), the
    /// conflict is counted; the other dirty files are still written back.
    #[tokio::test]
    async fn a_write_back_does_not_overwrite_a_change_made_at_the_origin() {
        let len = 3 * CHUNK as usize;
        let (dir, index, c, fake) = restartable(content(len));
        let other = Fake::new(content(CHUNK as usize), true);
        let cred = Credentials::unix(7, 8);
        let f = c
            .start(b"fhA", &fake.attrs, None, fake.clone(), &cred)
            .unwrap_or_else(|e| panic!("{e}"));
        whole(&c).await;
        let g = c
            .start(b"fhB", &other.attrs, None, other.clone(), &cred)
            .unwrap_or_else(|e| panic!("{e}"));
        for _ in 0..500 {
            if c.stats().files_complete == 2 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        f.write(&c, &cred, 10, b"local".to_vec(), true)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        g.write(&c, &cred, 10, b"other".to_vec(), true)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // Someone changes fhA at the origin (its mtime even put back: the
        // ctime moves).
        let mut changed = fake.attrs.clone();
        changed.ctime.seconds += 100;
        lock(&fake.origin).insert(b"fhA".to_vec(), changed);
        lock(&fake.origin).insert(b"fhB".to_vec(), other.attrs.clone());

        let e = c.write_back(fake.as_ref()).await;
        assert!(
            e.is_err_and(|e| e.contains("conflict")),
            "conflict not reported"
        );
        // Only fhB's chunk was stored; fhA's origin change stands.
        let stored: Vec<u64> = lock(&fake.stored).iter().map(|(o, _)| *o).collect();
        assert_eq!(stored, [0], "the origin's change was overwritten");
        assert!(
            c.get(b"fhB").is_none(),
            "the unchanged file was not written back"
        );
        lock(&fake.stored).clear();
        assert!(
            f.is_dirty() && c.get(b"fhA").is_some(),
            "the local writes were dropped"
        );
        assert_eq!(c.stats().write_back_conflicts, 1);
        let (got, _) = f
            .read(&c, &src(&fake), &cred, 10, 5)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&got[..], b"local");
        // Kept across a restart too, and refused again.
        drop((f, g, c));
        let c = reopen(dir.path(), &index);
        let f = c
            .get(b"fhA")
            .unwrap_or_else(|| panic!("kept across reopen"));
        assert!(f.is_dirty());
        assert!(c.write_back_file(fake.as_ref(), &f).await.is_err());
        assert!(lock(&fake.stored).is_empty());
        // Unchanged at the origin, a file is written back: the guard of
        // each chunk after the first is what the STORE before left.
        let h = Fake::new(content(len), true);
        let (_dir2, _index2, c2, _) = restartable(content(len));
        let f2 = c2
            .start(b"fhC", &h.attrs, None, h.clone(), &cred)
            .unwrap_or_else(|e| panic!("{e}"));
        whole(&c2).await;
        for at in [0, u64::from(CHUNK) + 5, 2 * u64::from(CHUNK) + 5] {
            f2.write(&c2, &cred, at, b"w".to_vec(), false)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        c2.write_back(h.as_ref())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(lock(&h.stored).len(), 3);
    }

    /// Item 6b of issue 20: a WRITE that comes while a SETATTR writes the
    /// file back is not kept behind it: it is refused (the client sends it
    /// again, upstream), and the file is let go, holding nothing dirty.
    #[tokio::test]
    async fn a_write_during_a_setattrs_write_back_does_not_stay_behind() {
        let len = 2 * CHUNK as usize;
        let (_dir, _index, c, fake) = restartable(content(len));
        let cred = Credentials::unix(7, 8);
        let f = c
            .start(b"fhS", &fake.attrs, None, fake.clone(), &cred)
            .unwrap_or_else(|e| panic!("{e}"));
        whole(&c).await;
        f.write(&c, &cred, 0, b"first".to_vec(), false)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // Hold the write-back's STORE.
        fake.store_gate.forget_permits(1 << 20);
        let back = {
            let (c, f, fake) = (c.clone(), f.clone(), fake.clone());
            tokio::spawn(async move { c.write_back_and_let_go(fake.as_ref(), &f).await })
        };
        while fake.stores.load(Ordering::Relaxed) == 0 {
            tokio::task::yield_now().await;
        }
        let late = f
            .try_write(&c, &cred, u64::from(CHUNK) + 7, b"late".to_vec(), false)
            .await;
        assert_eq!(late.err(), Some(HeldWriteError::LetGo));
        fake.store_gate.add_permits(1 << 20);
        back.await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!f.is_dirty(), "a write stayed dirty behind the SETATTR");
        assert!(c.get(b"fhS").is_none(), "the file was not let go");
        assert_eq!(c.stats().dirty_files, 0);
    }

    fn zero_meta(len: usize, zero_chunks: &[u64]) -> MetaFile {
        let mut zero = ZeroMap::new(crate::block_count(len as u64, 65_536));
        for c in zero_chunks {
            zero.set_zero_range(c * 16, c * 16 + 16);
        }
        MetaFile {
            block_size: 65_536,
            file_size: len as u64,
            mtime: (7, 0),
            ctime: (7, 0),
            actions: crate::Actions::COMPRESS_AND_COPY,
            compressed_size: 0,
            zero,
            repeats: Vec::new(),
        }
    }

    async fn whole(c: &FileCache) {
        for _ in 0..500 {
            if c.stats().files_complete == 1 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the file never arrived whole");
    }

    #[tokio::test]
    async fn chunks_of_zeros_are_not_read_until_written() {
        let len = 6 * CHUNK as usize;
        let meta = zero_meta(len, &[1, 4]);
        let (dir, fake, c, f) = started(b"fz", content(len), true, Some(&meta), false);
        let cred = Credentials::default();
        whole(&c).await;
        // Bytes behind the cache's back in a chunk of zeros are not read:
        // the zero map answers for it.
        let path = dir.path().join(file_name(b"fz"));
        let local = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("{e}"));
        local
            .write_all_at(b"junk", u64::from(CHUNK) + 10)
            .unwrap_or_else(|e| panic!("{e}"));
        let at = u64::from(CHUNK) - 100;
        let (got, _) = f
            .read(&c, &src(&fake), &cred, at, 2 * CHUNK)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(got[..] == fake.data[at as usize..at as usize + 2 * CHUNK as usize]);
        // A write into one makes it data.
        let at = 4 * u64::from(CHUNK) + 100;
        f.write(&c, &cred, at, b"hello".to_vec(), false)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let (got, _) = f
            .read(&c, &src(&fake), &cred, at - 1, 7)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&*got, b"\0hello\0");
    }

    /// Bytes that do not compress.
    fn noise(len: usize) -> Vec<u8> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn unframe(frame: &Frame, raw_len: u32) -> Vec<u8> {
        crate::ext::decompress(FetchOk {
            attrs: attrs(0, 0),
            raw_len,
            eof: false,
            codec: frame.codec,
            data: frame.data.clone(),
            repeats: Vec::new(),
        })
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[tokio::test]
    async fn other_proxies_get_the_frames_chunks_came_in() {
        let len = 3 * CHUNK as usize + 500;
        let (_dir, fake, c, f) = started(b"ff", content(len), true, None, true);
        let cred = Credentials::default();
        whole(&c).await;
        let s = c.stats();
        assert!(s.fetch_micros > 0 && s.decompress_micros > 0, "{s:?}");
        let mut served = Vec::new();
        for i in 0..4u64 {
            let (frame, n, eof, _) = f
                .read_frame(&c, &src(&fake), &cred, i * u64::from(CHUNK), CHUNK, true)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(eof, i == 3);
            served.extend(unframe(&frame, n));
        }
        assert!(served == fake.data);
        let s = c.stats();
        assert_eq!((s.frames_reused, s.frames_made), (4, 0), "{s:?}");
        assert!(s.frame_bytes > 0 && s.frame_bytes < len as u64);
        // A write drops the chunk's frame: the next FETCH sees the write.
        f.write(&c, &cred, 10, b"new".to_vec(), false)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let (frame, n, _, _) = f
            .read_frame(&c, &src(&fake), &cred, 0, CHUNK, true)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&unframe(&frame, n)[10..13], b"new");
        assert_eq!(c.stats().frames_made, 1);
        // A piece of a chunk is compressed for the caller, not kept.
        let (frame, n, _, _) = f
            .read_frame(&c, &src(&fake), &cred, u64::from(CHUNK) + 7, 100, true)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let at = CHUNK as usize + 7;
        assert!(unframe(&frame, n)[..] == fake.data[at..at + 100]);
        let s = c.stats();
        assert_eq!((s.frames_reused, s.frames_made), (4, 1));
    }

    #[tokio::test]
    async fn frames_live_beside_their_file_and_go_with_it() {
        let len = 4 * CHUNK as usize;
        let (dir, index, c, fake) = restartable(noise(len));
        c.keep_frames();
        let cred = Credentials::default();
        let f = c
            .start(b"fb", &fake.attrs, None, fake.clone(), &cred)
            .unwrap_or_else(|e| panic!("{e}"));
        whole(&c).await;
        // These chunks do not compress: the frames hold the whole file.
        let frames = dir.path().join(format!("{}.frames", file_name(b"fb")));
        let on_disk = std::fs::metadata(&frames).map_or(0, |m| m.len());
        assert_eq!(on_disk, len as u64);
        assert_eq!(c.stats().frame_bytes, len as u64);
        // Made again after a write, they stop growing at a chunk past the
        // file's size, and are still served.
        for round in 0..3u8 {
            for i in 0..4u64 {
                let at = i * u64::from(CHUNK);
                f.write(&c, &cred, at, vec![round; 10], false)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                let (frame, n, _, _) = f
                    .read_frame(&c, &src(&fake), &cred, at, CHUNK, true)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(unframe(&frame, n)[..10], vec![round; 10][..]);
            }
        }
        let s = c.stats();
        assert!(s.frame_bytes <= len as u64 + u64::from(CHUNK), "{s:?}");
        assert_eq!(s.frames_made, 1, "{s:?}");
        // A restart drops them; so does letting the file go.
        c.write_back(fake.as_ref())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!frames.exists(), "frames outlived their file");
        std::fs::write(&frames, b"left by a crash").unwrap_or_else(|e| panic!("{e}"));
        drop(c);
        reopen(dir.path(), &index);
        assert!(!frames.exists(), "a restart kept old frames");
    }

    /// An index that loses, in a crash, what was not flushed: `put` and
    /// `remove` change the live map, `flush` makes it the durable one, and
    /// [`CrashIndex::crashed`] is what a restart after a crash finds.
    #[derive(Default)]
    struct CrashIndex {
        live: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
        durable: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    }

    impl CrashIndex {
        fn crashed(&self) -> Arc<CrashIndex> {
            let kept = lock(&self.durable).clone();
            Arc::new(CrashIndex {
                live: Mutex::new(kept.clone()),
                durable: Mutex::new(kept),
            })
        }
    }

    impl MetaIndex for CrashIndex {
        fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, crate::IndexError> {
            Ok(lock(&self.live).get(key).cloned())
        }
        fn put(&self, key: &[u8], value: &[u8]) -> Result<(), crate::IndexError> {
            lock(&self.live).insert(key.to_vec(), value.to_vec());
            Ok(())
        }
        fn remove(&self, key: &[u8]) -> Result<(), crate::IndexError> {
            lock(&self.live).remove(key);
            Ok(())
        }
        fn flush(&self) -> Result<(), crate::IndexError> {
            *lock(&self.durable) = lock(&self.live).clone();
            Ok(())
        }
        fn persistent(&self) -> bool {
            true
        }
    }

    /// A cache in `dir` on `index`, reopened as after a crash.
    fn crash_open(dir: &Path, index: &Arc<CrashIndex>) -> Arc<FileCache> {
        let index: Arc<dyn MetaIndex> = index.clone();
        reopen(dir, &index)
    }

    /// The dirty chunks of `fh` in a cache reopened after a crash, and the
    /// bytes it serves at `at`.
    async fn after_crash(
        dir: &Path,
        index: &CrashIndex,
        fake: &Arc<Fake>,
        fh: &[u8],
        at: u64,
        len: u32,
    ) -> (Arc<CrashIndex>, Vec<usize>, Vec<u8>) {
        let index = index.crashed();
        let c = crash_open(dir, &index);
        let f = c.get(fh).unwrap_or_else(|| panic!("the file was not kept"));
        let dirty = lock(&f.versions).dirty.keys().copied().collect();
        let (got, _) = f
            .read(&c, &src(fake), &Credentials::default(), at, len)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        (index, dirty, got.to_vec())
    }

    #[tokio::test]
    async fn writes_are_recorded_durably_before_they_land_or_are_acknowledged() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let index = Arc::new(CrashIndex::default());
        let c = crash_open(dir.path(), &index);
        let fake = Fake::new(content(4 * CHUNK as usize), true);
        let cred = Credentials::default();
        let f = c
            .start(b"fd", &fake.attrs, None, fake.clone(), &cred)
            .unwrap_or_else(|e| panic!("{e}"));
        whole(&c).await;
        // Sled's own flush, half a second later: the clean record is durable.
        index.flush().unwrap_or_else(|e| panic!("{e}"));
        let chunk = u64::from(CHUNK);
        // A FILE_SYNC write is acknowledged: a crash right after keeps it.
        f.write(&c, &cred, chunk + 5, b"stable".to_vec(), true)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let (_, dirty, got) = after_crash(dir.path(), &index, &fake, b"fd", chunk + 5, 6).await;
        assert_eq!((dirty, &got[..]), (vec![1], &b"stable"[..]));
        // An UNSTABLE write into a clean chunk: a crash right after it
        // lists the chunk dirty (its bytes are not upstream's any more).
        f.write(&c, &cred, 2 * chunk, b"loose".to_vec(), false)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let (_, dirty, _) = after_crash(dir.path(), &index, &fake, b"fd", 0, 1).await;
        assert_eq!(dirty, vec![1, 2]);
        // A COMMIT is acknowledged: a crash right after keeps the writes
        // before it, and the size they gave the file.
        let end = 4 * chunk;
        f.write(&c, &cred, end, b"tail".to_vec(), false)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        f.commit(&c).await.unwrap_or_else(|e| panic!("{e}"));
        let (_, dirty, got) = after_crash(dir.path(), &index, &fake, b"fd", end, 100).await;
        assert_eq!((dirty, &got[..]), (vec![1, 2, 4], &b"tail"[..]));
    }

    #[tokio::test]
    async fn a_write_pins_its_entry_and_is_not_acknowledged_into_one_let_go() {
        let len = 3 * CHUNK as usize;
        let (_dir, fake, c, f) = started(b"fp", content(len), true, None, false);
        let cred = Credentials::default();
        whole(&c).await;
        // While a write is under way nothing lets the entry go: not a
        // client's write through the block path, nor room for another file,
        // nor a write-back.
        f.last_used.store(0, Ordering::Relaxed);
        let (pin, _) = f
            .pin_write(0, 0, 10)
            .unwrap_or_else(|| panic!("not being let go"));
        c.forget(b"fp");
        assert!(c.make_room(&mut lock(&c.files), c.max_bytes).is_err());
        c.write_back(fake.as_ref())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(c.holds(&f), "the entry was let go under a write");
        drop(pin);
        // Clean (written back) and with no write under way, it goes; a
        // write that still holds it lands nowhere and is refused, for the
        // client to send again.
        c.forget(b"fp");
        assert!(c.get(b"fp").is_none());
        let late = f.try_write(&c, &cred, 7, b"lost".to_vec(), true).await;
        assert_eq!(late.map(|_| ()), Err(HeldWriteError::LetGo));
        assert_eq!(HeldWriteError::LetGo.nfsstat(), nfsstat3::NFS3ERR_JUKEBOX);
        // A write counts as a use.
        let (_dir, _fake, c, f) = started(b"fq", content(len), true, None, false);
        whole(&c).await;
        f.last_used.store(0, Ordering::Relaxed);
        f.write(&c, &cred, 7, b"used".to_vec(), false)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(f.last_used.load(Ordering::Relaxed) > 0);
    }

    #[tokio::test]
    async fn a_record_of_an_entry_let_go_does_not_describe_its_successor() {
        let len = 3 * CHUNK as usize;
        let (dir, index, c, fake) = restartable(content(len));
        let cred = Credentials::default();
        // The file changes before its fetch runs: the old entry's fetch
        // finishes into its unlinked file while the new one's is held.
        c.start(b"fs", &fake.attrs, None, fake.clone(), &cred)
            .unwrap_or_else(|e| panic!("{e}"));
        let newer = Fake::new(content(len), false);
        c.start(b"fs", &attrs(len as u64, 9), None, newer.clone(), &cred)
            .unwrap_or_else(|e| panic!("{e}"));
        whole(&c).await;
        drop(c);
        let c = reopen(dir.path(), &index);
        assert!(c.get(b"fs").is_none(), "a half-fetched file was kept");
        // A record removed but not yet flushed when the entry was let go:
        // a crash after the new file is made must not bring it back.
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let index = Arc::new(CrashIndex::default());
        let c = crash_open(dir.path(), &index);
        c.start(b"ft", &fake.attrs, None, fake.clone(), &cred)
            .unwrap_or_else(|e| panic!("{e}"));
        whole(&c).await;
        index.flush().unwrap_or_else(|e| panic!("{e}"));
        c.forget(b"ft");
        c.start(b"ft", &attrs(len as u64, 9), None, newer.clone(), &cred)
            .unwrap_or_else(|e| panic!("{e}"));
        let c = crash_open(dir.path(), &index.crashed());
        assert!(c.get(b"ft").is_none(), "a half-fetched file was kept");
    }

    #[tokio::test]
    async fn a_write_of_no_bytes_past_the_end_changes_nothing() {
        let len = 2 * CHUNK as usize;
        let (dir, index, c, fake) = restartable(content(len));
        let cred = Credentials::default();
        let f = c
            .start(b"fn", &fake.attrs, None, fake.clone(), &cred)
            .unwrap_or_else(|e| panic!("{e}"));
        whole(&c).await;
        f.write(&c, &cred, 3, b"kept".to_vec(), true)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let (_, after) = f
            .write(&c, &cred, len as u64 + 100, Vec::new(), true)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(after.size, len as u64);
        f.commit(&c).await.unwrap_or_else(|e| panic!("{e}"));
        drop((f, c));
        let c = reopen(dir.path(), &index);
        let f = c
            .get(b"fn")
            .unwrap_or_else(|| panic!("the writes were dropped"));
        let (got, _) = f
            .read(&c, &src(&fake), &cred, 3, 4)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&*got, b"kept");
    }

    #[tokio::test]
    async fn a_fetch_of_a_file_written_here_carries_its_local_attributes() {
        let len = 2 * CHUNK as usize;
        let (_dir, fake, c, f) = started(b"fl", content(len), true, None, true);
        let cred = Credentials::default();
        whole(&c).await;
        let (_, _, _, a) = f
            .read_frame(&c, &src(&fake), &cred, 0, CHUNK, true)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(same_version(&a, &fake.attrs));
        f.write(&c, &cred, 10, b"new".to_vec(), false)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let (frame, n, _, a) = f
            .read_frame(&c, &src(&fake), &cred, 0, CHUNK, true)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&unframe(&frame, n)[10..13], b"new");
        assert!(
            !same_version(&a, &fake.attrs),
            "the written bytes as upstream's"
        );
        assert!(same_version(&a, &f.local_attrs()));
        // Nor is a FETCH answered while a write is under way.
        let pin = f.pin_write(0, 0, 10);
        let raced = f.read_frame(&c, &src(&fake), &cred, 0, CHUNK, true).await;
        assert!(raced.is_err());
        drop(pin);
    }

    #[tokio::test]
    async fn a_changed_file_fails_the_fetch() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let len = 3 * CHUNK as usize;
        let fake = Fake::new(content(len), true);
        let c = cache(dir.path());
        let cred = Credentials::default();
        // The proxy believes in an older version of the file.
        let old = attrs(len as u64, 6);
        let f = c
            .start(b"fh4", &old, None, fake.clone(), &cred)
            .unwrap_or_else(|e| panic!("{e}"));
        let r = f.read(&c, &src(&fake), &cred, 0, 100).await;
        assert!(r.is_err(), "bytes of another version were served");
        assert!(c.get(b"fh4").is_none());
    }
}
