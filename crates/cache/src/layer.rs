//! [`CacheLayer`]: the block cache as an NFSv3 layer (an
//! [`NfsService`] over the layer below it).
//!
//! * **READ** is served from the [`BlockStore`] when every block it touches
//!   is cached; missing blocks are fetched upstream whole (one READ per
//!   block, concurrent misses on one block coalesced into a single upstream
//!   READ), filled clean, and the reply is cut to the file size the layer
//!   knows. A READ that starts where the previous one of the file ended
//!   (or at the file's start) reads the next blocks ahead in the
//!   background, as far as the run of such READs has come, up to the
//!   configured window: a stream gets the whole window at once, two small
//!   reads that happen to touch (a disk image's tables) get a block.
//! * **WRITE** under [`WritePolicy::WriteBack`] goes to the store dirty and
//!   is answered UNSTABLE with the store's persistent verifier; COMMIT makes
//!   the store durable (fsync) and answers the same verifier (RFC 1813
//!   section 3.3.7). A WRITE never waits for a read from upstream: bytes
//!   that cover part of an uncached sub-block are kept as that sub-block's
//!   extent (see [`crate::store`]); only a later write leaving a gap inside
//!   such a sub-block fills its block first. Blocks wholly past upstream's
//!   end of file are zeros and never fetched. Dirty data reaches upstream only through
//!   [`CacheLayer::write_back`] (or when a full set needs a frame). Until
//!   then GETATTR, LOOKUP, READ and WRITE report the size and mtime the
//!   client wrote. Under [`WritePolicy::WriteThrough`] a WRITE goes
//!   upstream and its data is then cached clean.
//! * **Coherence**: each file's upstream size, mtime and ctime are
//!   remembered from every reply that carries them; when they change
//!   behind our back for a file without dirty data, its clean blocks are
//!   dropped. Session semantics beyond that (DESIGN.md, "Consistency").
//!
//! Cached data is served without asking upstream for permission, as the
//! GVFS paper's per-user proxies do: run one proxy per user or trust
//! domain. Writes are checked before they are kept (the caller's right to
//! write the file: by its mode, else by ACCESS upstream), since they reach
//! everyone the proxy serves.
//!
//! What the cache does not know after a restart: the attributes it last saw
//! (so a change made upstream while the proxy was down is only noticed at
//! the next change). The size of a file whose dirty data was recovered is
//! where the last dirty write into its last dirty block ended (kept in the
//! block's tag, trailing zeros included), or upstream's size if larger.

mod attrs;
mod writeback;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Instant, SystemTime};

use gvfs_nfs::proc::MAX_DATA;
use gvfs_nfs::{
    BoxFuture, CallContext, Credentials, NfsReply, NfsRequest, NfsService, ServiceError,
};
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::Opaque;
use tokio::sync::{Semaphore, watch};

use crate::error::Error;
use crate::geometry::Geometry;
use crate::store::{BlockStore, DirtyData, WriteMode, WriteOutcome};

use attrs::{FileTable, MAX_FILES, Overlay, Seen};

pub use writeback::WriteBackReport;

/// Read-ahead batches in flight at once, over all files.
const MAX_READAHEAD_TASKS: usize = 8;
/// Attempts at storing one block of a WRITE (each may first fill a partial
/// sub-block or write a victim back).
const MAX_STORE_ATTEMPTS: usize = 8;
/// Remembered read-ahead blocks not yet read, for the read-ahead hit count.
const MAX_PREFETCHED: usize = 64 * 1024;
/// How long upstream's word that a caller may write a file is trusted
/// before a write into the cache asks again.
const WRITE_CHECK_TTL: std::time::Duration = std::time::Duration::from_secs(30);
/// Most (file, caller) write permissions remembered; all are forgotten
/// when full.
const MAX_WRITE_CHECKS: usize = 4096;

/// How WRITEs are handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WritePolicy {
    /// Cache dirty, answer UNSTABLE, write upstream on write-back.
    #[default]
    WriteBack,
    /// Forward upstream at once, then cache the data clean.
    WriteThrough,
}

impl fmt::Display for WritePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WritePolicy::WriteBack => "write-back",
            WritePolicy::WriteThrough => "write-through",
        })
    }
}

/// A write policy name that is neither `write-back` nor `write-through`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown write policy {0:?}: expected \"write-back\" or \"write-through\"")]
pub struct UnknownWritePolicy(pub String);

impl FromStr for WritePolicy {
    type Err = UnknownWritePolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "write-back" | "writeback" => Ok(WritePolicy::WriteBack),
            "write-through" | "writethrough" => Ok(WritePolicy::WriteThrough),
            _ => Err(UnknownWritePolicy(s.to_string())),
        }
    }
}

/// Settings of a [`CacheLayer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// Write-back or write-through.
    pub policy: WritePolicy,
    /// Most blocks read ahead of a sequential reader (0 disables
    /// read-ahead); fewer while its run is shorter than that.
    pub readahead_blocks: u32,
}

impl Default for CacheConfig {
    /// Write-back, and 32 blocks of read-ahead: with 64 KiB blocks that is
    /// 2 MiB, twice a 1 MiB client READ, which the WAN benchmark needed to
    /// keep a 40 ms, 50 Mbit/s link busy (8 blocks reached 79%, 32 reached
    /// 99%; docs/BENCHMARKS.md).
    fn default() -> Self {
        CacheConfig {
            policy: WritePolicy::WriteBack,
            readahead_blocks: 32,
        }
    }
}

/// Counters and gauges of the layer, for `gvfsctl stats` and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct LayerStats {
    /// READ calls.
    pub reads: u64,
    /// READs served entirely from the cache.
    pub hits: u64,
    /// READs that needed at least one block from upstream.
    pub misses: u64,
    /// Bytes served by hits.
    pub hit_bytes: u64,
    /// Bytes returned by all READs.
    pub read_bytes: u64,
    /// Bytes fetched from upstream to fill the cache.
    pub fetched_bytes: u64,
    /// Blocks fetched by read-ahead.
    pub readahead_blocks: u64,
    /// READs served (at least partly) from blocks read ahead.
    pub readahead_hits: u64,
    /// Block fetches that joined one already in flight instead of asking
    /// upstream again.
    pub coalesced_misses: u64,
    /// WRITE calls.
    pub writes: u64,
    /// Bytes written by clients.
    pub write_bytes: u64,
    /// COMMIT calls.
    pub commits: u64,
    /// Bytes of dirty data cached.
    pub dirty_bytes: u64,
    /// Bytes of valid data cached.
    pub cached_bytes: u64,
    /// Data capacity of the cache.
    pub capacity_bytes: u64,
    /// Frames holding a block.
    pub frames_in_use: u64,
    /// Clean frames reused for another block.
    pub evictions: u64,
    /// Dirty blocks written upstream early to free a frame.
    pub eviction_write_backs: u64,
    /// Bytes written upstream by write-back (including evictions).
    pub write_back_bytes: u64,
    /// Completed write-back runs.
    pub write_backs: u64,
    /// Files whose clean blocks were dropped because they changed upstream.
    pub invalidations: u64,
    /// Calls sent to the layer below.
    pub upstream_calls: u64,
    /// Total time spent waiting for the layer below, in microseconds.
    pub upstream_latency_us_total: u64,
    /// Failures of the local cache storage.
    pub store_errors: u64,
    /// Clean sub-blocks whose bytes failed their checksum: dropped and
    /// fetched again, never served.
    pub corrupt_clean_dropped: u64,
    /// Dirty sub-blocks lost (failed their checksum, or their bank file was
    /// cut off): never written back; see the proxy's log and
    /// `CACHE_DIR/quarantine/`.
    pub dirty_sub_blocks_lost: u64,
    /// Bank files found missing or cut off at start.
    pub banks_lost: u64,
    /// Times the write verifier changed because acknowledged data was lost.
    pub verifier_changes: u64,
}

#[derive(Debug, Default)]
struct Counters {
    reads: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    hit_bytes: AtomicU64,
    read_bytes: AtomicU64,
    fetched_bytes: AtomicU64,
    readahead_blocks: AtomicU64,
    readahead_hits: AtomicU64,
    coalesced_misses: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    commits: AtomicU64,
    eviction_write_backs: AtomicU64,
    write_back_bytes: AtomicU64,
    write_backs: AtomicU64,
    invalidations: AtomicU64,
    upstream_calls: AtomicU64,
    upstream_latency_us: AtomicU64,
    store_errors: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// Async locks by file handle, kept only while held or awaited.
#[derive(Default)]
struct FileLocks(Mutex<HashMap<Vec<u8>, Arc<tokio::sync::Mutex<()>>>>);

/// A held [`FileLocks`] lock; frees its entry when nobody else waits.
struct FileLockGuard<'a> {
    locks: &'a FileLocks,
    fh: Vec<u8>,
    held: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl FileLocks {
    async fn lock(&self, fh: &[u8]) -> FileLockGuard<'_> {
        let m = lock(&self.0).entry(fh.to_vec()).or_default().clone();
        let held = Some(m.lock_owned().await);
        FileLockGuard {
            locks: self,
            fh: fh.to_vec(),
            held,
        }
    }
}

impl Drop for FileLockGuard<'_> {
    fn drop(&mut self) {
        self.held = None;
        let mut map = lock(&self.locks.0);
        // Only the map's own reference left: nobody holds or awaits it.
        if map.get(&self.fh).is_some_and(|m| Arc::strong_count(m) == 1) {
            map.remove(&self.fh);
        }
    }
}

/// Upstream's answers on writing: by (file, caller), when and the ACCESS
/// bits granted.
type WriteChecks = HashMap<(Vec<u8>, Vec<u32>), (Instant, u32)>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why a block could not be fetched: the layer below failed, or answered
/// with an NFS error the client should see.
#[derive(Debug, Clone)]
enum FetchError {
    Service(ServiceError),
    Nfs(nfsstat3),
}

impl From<ServiceError> for FetchError {
    fn from(e: ServiceError) -> Self {
        FetchError::Service(e)
    }
}

/// One block as upstream has it, not padded (zeros past its end).
#[derive(Debug)]
struct Fetched {
    data: Vec<u8>,
    readahead: bool,
    /// The file's generation when the fetch started: its bytes may be
    /// cached only while that still holds.
    generation: u64,
}

type FetchResult = Result<Arc<Fetched>, FetchError>;
type BlockKey = (Vec<u8>, u64);

/// The block cache as an NFSv3 layer. See the module docs.
pub struct CacheLayer {
    me: Weak<CacheLayer>,
    inner: Arc<dyn NfsService>,
    store: Arc<BlockStore>,
    geo: Geometry,
    config: CacheConfig,
    files: Arc<Mutex<FileTable>>,
    /// Block fetches in flight, for coalescing concurrent misses.
    flights: Mutex<HashMap<BlockKey, watch::Receiver<Option<FetchResult>>>>,
    /// Blocks read ahead and not read yet.
    prefetched: Mutex<HashSet<BlockKey>>,
    readahead_slots: Arc<Semaphore>,
    /// Says which byte ranges of a file are known to be zeros (a layer
    /// above with zero-block maps answers those itself): read-ahead skips
    /// them.
    zero_hint: Option<ZeroHint>,
    /// One write-back at a time; truncation waits for it.
    write_back_lock: tokio::sync::Mutex<()>,
    /// Upstream's ACCESS answers for writes kept here: the bits granted to
    /// a caller (by credentials) on a file, and when.
    write_checks: Mutex<WriteChecks>,
    /// What sends a file's dirty data upstream or truncates it (a
    /// write-back, an evicted dirty block, SETATTR of the size) does so one
    /// at a time per file, so no WRITE of older bytes lands after newer
    /// ones or past a truncation.
    file_locks: FileLocks,
    counters: Counters,
    closed: AtomicBool,
}

impl fmt::Debug for CacheLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheLayer")
            .field("inner", &self.inner.describe())
            .field("geometry", &self.geo)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// `(file handle, offset, length)` -> whether those bytes are known zeros
/// that the layer above answers without asking this one.
pub type ZeroHint = Arc<dyn Fn(&[u8], u64, u64) -> bool + Send + Sync>;

fn local(e: Error) -> ServiceError {
    ServiceError::Local(format!("block cache: {e}"))
}

fn fh3(fh: &[u8]) -> nfs_fh3 {
    nfs_fh3 {
        data: Opaque::owned(fh.to_vec()),
    }
}

fn now() -> nfstime3 {
    nfstime3::try_from(SystemTime::now()).unwrap_or_default()
}

fn wcc_of(a: &fattr3) -> wcc_attr {
    wcc_attr {
        size: a.size,
        mtime: a.mtime,
        ctime: a.ctime,
    }
}

fn post_op(a: Option<fattr3>) -> post_op_attr {
    match a {
        Some(a) => Nfs3Option::Some(a),
        None => Nfs3Option::None,
    }
}

fn mismatch(upstream: String, what: &str, got: &NfsReply) -> ServiceError {
    ServiceError::UpstreamProtocol {
        upstream,
        reason: format!("{what} answered with a {} reply", got.proc_().name()),
    }
}

impl CacheLayer {
    /// A cache layer over `inner` keeping its blocks in `store`, asking
    /// `zero_hint` (the metadata layer's table, when there is one above)
    /// which ranges read-ahead may skip. Files with dirty data recovered
    /// from an earlier session are noted, so that the next write-back sends
    /// them upstream.
    pub fn new(
        inner: Arc<dyn NfsService>,
        store: BlockStore,
        config: CacheConfig,
        zero_hint: Option<ZeroHint>,
    ) -> Arc<Self> {
        let geo = store.geometry();
        let mut files = FileTable::new(MAX_FILES);
        match store.dirty_blocks(None) {
            Ok(blocks) => {
                for b in blocks {
                    let fh = b.fh.as_bytes();
                    files.mark_recovered(fh);
                    // Written back as whoever wrote it (recorded beside the
                    // banks), not as root.
                    if let Some(who) = store.writer(fh).and_then(|w| Credentials::decode_xdr(&w)) {
                        files.entry(fh).writer = Some(who);
                    }
                }
            }
            Err(e) => tracing::error!("block cache: listing recovered dirty data failed: {e}"),
        }
        Arc::new_cyclic(|me| CacheLayer {
            me: me.clone(),
            inner,
            store: Arc::new(store),
            geo,
            config,
            files: Arc::new(Mutex::new(files)),
            flights: Mutex::new(HashMap::new()),
            prefetched: Mutex::new(HashSet::new()),
            readahead_slots: Arc::new(Semaphore::new(MAX_READAHEAD_TASKS)),
            zero_hint,
            write_back_lock: tokio::sync::Mutex::new(()),
            write_checks: Mutex::new(HashMap::new()),
            file_locks: FileLocks::default(),
            counters: Counters::default(),
            closed: AtomicBool::new(false),
        })
    }

    /// The configuration.
    pub fn config(&self) -> CacheConfig {
        self.config
    }

    /// Bytes of dirty data cached.
    pub fn dirty_bytes(&self) -> u64 {
        self.store.stats().dirty_bytes
    }

    /// Counters for `gvfsctl stats` and the metrics endpoint.
    pub fn stats(&self) -> LayerStats {
        let s = self.store.stats();
        let c = &self.counters;
        LayerStats {
            reads: get(&c.reads),
            hits: get(&c.hits),
            misses: get(&c.misses),
            hit_bytes: get(&c.hit_bytes),
            read_bytes: get(&c.read_bytes),
            fetched_bytes: get(&c.fetched_bytes),
            readahead_blocks: get(&c.readahead_blocks),
            readahead_hits: get(&c.readahead_hits),
            coalesced_misses: get(&c.coalesced_misses),
            writes: get(&c.writes),
            write_bytes: get(&c.write_bytes),
            commits: get(&c.commits),
            dirty_bytes: s.dirty_bytes,
            cached_bytes: s.cached_bytes,
            capacity_bytes: s.capacity,
            frames_in_use: s.frames_in_use,
            evictions: s.evictions,
            eviction_write_backs: get(&c.eviction_write_backs),
            write_back_bytes: get(&c.write_back_bytes),
            write_backs: get(&c.write_backs),
            invalidations: get(&c.invalidations),
            upstream_calls: get(&c.upstream_calls),
            upstream_latency_us_total: get(&c.upstream_latency_us),
            store_errors: get(&c.store_errors),
            corrupt_clean_dropped: s.corrupt_clean_dropped,
            dirty_sub_blocks_lost: s.dirty_sub_blocks_lost,
            banks_lost: s.banks_lost,
            verifier_changes: s.verifier_changes,
        }
    }

    /// Makes everything durable locally (fsync) and marks a clean shutdown.
    /// Call on exit; afterwards every call fails with a local error.
    pub fn close(&self) -> Result<(), ServiceError> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.store.close_shared().map_err(local)
    }

    fn me(&self) -> Option<Arc<CacheLayer>> {
        self.me.upgrade()
    }

    fn files(&self) -> MutexGuard<'_, FileTable> {
        lock(&self.files)
    }

    fn block_size(&self) -> u64 {
        u64::from(self.geo.block_size())
    }

    // ---- the store, off the async threads ----

    /// Runs `op` on the store in a blocking thread.
    async fn store_raw<T, F>(&self, op: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&BlockStore) -> Result<T, Error> + Send + 'static,
    {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::Poisoned);
        }
        let store = self.store.clone();
        let r = match tokio::task::spawn_blocking(move || op(&store)).await {
            Ok(r) => r,
            Err(e) => Err(Error::Io {
                op: "running a cache task",
                source: std::io::Error::other(e.to_string()),
            }),
        };
        self.noted(r)
    }

    /// Runs `op` on the store right here, on the async thread: only for
    /// operations that never wait ([`BlockStore::read_range_now`]).
    fn store_now<T>(
        &self,
        op: impl FnOnce(&BlockStore) -> Result<T, Error>,
    ) -> Result<T, ServiceError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(local(Error::Poisoned));
        }
        self.noted(op(&self.store)).map_err(local)
    }

    /// Counts and logs a store error.
    fn noted<T>(&self, r: Result<T, Error>) -> Result<T, Error> {
        if let Err(e) = &r
            && !matches!(e, Error::PartialSubBlockWrite { .. })
        {
            bump(&self.counters.store_errors, 1);
            tracing::warn!("block cache: {e}");
        }
        r
    }

    /// [`store_raw`](Self::store_raw) with errors as a [`ServiceError`].
    async fn store_op<T, F>(&self, op: F) -> Result<T, ServiceError>
    where
        T: Send + 'static,
        F: FnOnce(&BlockStore) -> Result<T, Error> + Send + 'static,
    {
        self.store_raw(op).await.map_err(local)
    }

    // ---- the layer below ----

    async fn up(&self, cx: &CallContext, req: NfsRequest) -> Result<NfsReply, ServiceError> {
        let t = Instant::now();
        let r = self.inner.call(cx, req).await;
        bump(&self.counters.upstream_calls, 1);
        bump(
            &self.counters.upstream_latency_us,
            u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX),
        );
        r
    }

    async fn up_getattr(&self, cx: &CallContext, fh: &[u8]) -> Result<GETATTR3res, ServiceError> {
        let req = NfsRequest::Getattr(GETATTR3args { object: fh3(fh) });
        match self.up(cx, req).await? {
            NfsReply::Getattr(r) => Ok(r),
            other => Err(mismatch(self.inner.describe(), "GETATTR", &other)),
        }
    }

    async fn up_read(
        &self,
        cx: &CallContext,
        fh: &[u8],
        offset: u64,
        count: u32,
    ) -> Result<READ3res<'static>, ServiceError> {
        let req = NfsRequest::Read(READ3args {
            file: fh3(fh),
            offset,
            count,
        });
        match self.up(cx, req).await? {
            NfsReply::Read(r) => Ok(r),
            other => Err(mismatch(self.inner.describe(), "READ", &other)),
        }
    }

    async fn up_lookup(
        &self,
        cx: &CallContext,
        dir: &nfs_fh3,
        name: &filename3<'_>,
    ) -> Result<Option<(Vec<u8>, Option<fattr3>)>, ServiceError> {
        let req = NfsRequest::Lookup(LOOKUP3args {
            what: diropargs3 {
                dir: dir.clone(),
                name: name.clone_to_owned(),
            },
        });
        match self.up(cx, req).await? {
            NfsReply::Lookup(Nfs3Result::Ok(ok)) => {
                let a = match ok.obj_attributes {
                    Nfs3Option::Some(a) => Some(a),
                    Nfs3Option::None => None,
                };
                Ok(Some((ok.object.data.to_vec(), a)))
            }
            NfsReply::Lookup(Nfs3Result::Err(_)) => Ok(None),
            other => Err(mismatch(self.inner.describe(), "LOOKUP", &other)),
        }
    }

    // ---- attributes and coherence ----

    /// Records attributes upstream reported for `fh`, dropping its clean
    /// blocks if it changed behind our back.
    async fn note(&self, fh: &[u8], a: &fattr3, seen: Seen) {
        let stale = self.files().observe(fh, a, seen);
        if stale {
            let key = fh.to_vec();
            let r = self
                .store_raw(move |s| {
                    if s.has_file(&key)? {
                        s.invalidate(&key, false).map(Some)
                    } else {
                        Ok(None)
                    }
                })
                .await;
            if let Ok(Some(_)) = r {
                bump(&self.counters.invalidations, 1);
                tracing::debug!(fh = ?fh, "file changed upstream; clean blocks dropped");
            }
        }
    }

    async fn note_post_op(&self, fh: &[u8], a: &post_op_attr, seen: Seen) {
        if let Nfs3Option::Some(a) = a {
            self.note(fh, a, seen).await;
        }
    }

    /// Records the wcc data of our own change of `fh`.
    async fn note_wcc(&self, fh: &[u8], wcc: &wcc_data) {
        let before = match wcc.before {
            Nfs3Option::Some(b) => Some(b),
            Nfs3Option::None => None,
        };
        self.note_post_op(fh, &wcc.after, Seen::Own(before)).await;
    }

    /// Replaces upstream attributes in a reply by what the client should
    /// see (the dirty overlay).
    fn overlay_attrs(&self, fh: &[u8], a: &mut post_op_attr) {
        if let Nfs3Option::Some(attrs) = a {
            let files = self.files();
            if let Some(st) = files.get(fh)
                && let Some(ov) = st.overlay
            {
                attrs.size = ov.size;
                attrs.used = attrs.used.max(ov.size);
                attrs.mtime = ov.mtime;
                attrs.ctime = ov.mtime;
            }
        }
    }

    fn effective(&self, fh: &[u8]) -> Option<fattr3> {
        self.files().get(fh).and_then(|s| s.effective())
    }

    /// The attributes the client should see for `fh`, asking upstream if
    /// none are known; `Err(status)` if upstream refused.
    async fn file_attrs(
        &self,
        cx: &CallContext,
        fh: &[u8],
    ) -> Result<Result<fattr3, nfsstat3>, ServiceError> {
        self.ensure_recovered(cx, fh).await?;
        if let Some(a) = self.effective(fh) {
            return Ok(Ok(a));
        }
        match self.up_getattr(cx, fh).await? {
            Nfs3Result::Ok(ok) => {
                self.note(fh, &ok.obj_attributes, Seen::Foreign).await;
                // Only regular files are remembered; others answer as is.
                Ok(Ok(self.effective(fh).unwrap_or(ok.obj_attributes)))
            }
            Nfs3Result::Err((st, _)) => Ok(Err(st)),
        }
    }

    /// For a file whose dirty data was recovered from an earlier session,
    /// rebuilds the size the client wrote (see the module docs).
    async fn ensure_recovered(&self, cx: &CallContext, fh: &[u8]) -> Result<(), ServiceError> {
        let (recovered, known) = {
            let files = self.files();
            let st = files.get(fh);
            (
                st.is_some_and(|s| s.recovered),
                st.and_then(|s| s.upstream.clone()),
            )
        };
        if !recovered {
            return Ok(());
        }
        let upstream_size = match known {
            Some(a) => a.size,
            None => match self.up_getattr(cx, fh).await? {
                Nfs3Result::Ok(ok) => {
                    self.note(fh, &ok.obj_attributes, Seen::Foreign).await;
                    ok.obj_attributes.size
                }
                Nfs3Result::Err((nfsstat3::NFS3ERR_STALE, _)) => {
                    tracing::error!(fh = ?fh, "file with recovered dirty data is gone upstream; dropping its data");
                    let key = fh.to_vec();
                    self.store_op(move |s| s.invalidate(&key, true)).await?;
                    self.files().remove(fh);
                    return Ok(());
                }
                Nfs3Result::Err((st, _)) => {
                    return Err(ServiceError::Local(format!(
                        "block cache: GETATTR of a file with recovered dirty data failed: {st}"
                    )));
                }
            },
        };
        let key = fh.to_vec();
        let bs = self.block_size();
        let end = self
            .store_op(move |s| {
                let Some(last) = s.dirty_blocks(Some(&key))?.pop() else {
                    return Ok(0);
                };
                let Some(dd) = s.dirty_data(&key, last.block)? else {
                    return Ok(0);
                };
                Ok(recovered_end(&dd, bs))
            })
            .await?;
        let mut files = self.files();
        let seq = files.next_seq();
        let st = files.entry(fh);
        if st.recovered {
            st.recovered = false;
            st.overlay = Some(Overlay {
                size: upstream_size.max(end),
                mtime: now(),
                seq,
            });
            tracing::info!(fh = ?fh, size = upstream_size.max(end), "recovered dirty file");
        }
        Ok(())
    }

    // ---- READ ----

    async fn read(&self, cx: &CallContext, args: READ3args) -> Result<NfsReply, ServiceError> {
        bump(&self.counters.reads, 1);
        let fh = args.file.data.to_vec();
        let attrs = match self.file_attrs(cx, &fh).await? {
            Ok(a) => a,
            Err(st) => return Ok(NfsReply::error(gvfs_nfs::NfsProc::Read, st)),
        };
        if attrs.type_ != ftype3::NF3REG {
            return self.up(cx, NfsRequest::Read(args)).await;
        }
        let dirty_file = self.files().get(&fh).is_some_and(|s| s.overlay.is_some());
        match self
            .read_cached(cx, &fh, args.offset, args.count, attrs)
            .await
        {
            Ok(reply) => Ok(reply),
            Err(e @ ServiceError::Local(_)) if !dirty_file => {
                tracing::warn!("block cache read failed ({e}); forwarding the READ");
                self.up(cx, NfsRequest::Read(args)).await
            }
            Err(e) => Err(e),
        }
    }

    async fn read_cached(
        &self,
        cx: &CallContext,
        fh: &[u8],
        offset: u64,
        count: u32,
        attrs: fattr3,
    ) -> Result<NfsReply, ServiceError> {
        let count = u64::from(count.min(MAX_DATA));
        let size = attrs.size;
        if offset >= size || count == 0 {
            return Ok(read_reply(Some(attrs), Vec::new(), offset >= size));
        }
        let bs = self.block_size();
        let end = (offset + count).min(size);
        let first = offset / bs;
        let last = (end - 1) / bs;
        // (block, offset in block, length)
        let spans: Vec<(u64, u32, u32)> = (first..=last)
            .map(|b| {
                let lo = offset.max(b * bs);
                let hi = end.min((b + 1) * bs);
                (b, (lo - b * bs) as u32, (hi - lo) as u32)
            })
            .collect();
        // One buffer for the whole reply: hits are read straight into it,
        // here if their bytes are in memory, else with one blocking hop for
        // the rest; misses are filled in below.
        let mut data = vec![0u8; (end - offset) as usize];
        let now = self.store_now(|s| s.read_range_now(fh, offset, &mut data))?;
        let (mut data, hits) = if now == spans.len() {
            (data, vec![true; now])
        } else {
            let key = fh.to_vec();
            let from = offset.max((first + now as u64) * bs);
            self.store_op(move |s| {
                let mut hits = vec![true; now];
                hits.extend(s.read_range_into(
                    &key,
                    from,
                    &mut data[(from - offset) as usize..],
                )?);
                Ok((data, hits))
            })
            .await?
        };
        let missing: Vec<usize> = (0..spans.len()).filter(|&i| !hits[i]).collect();
        let hit = missing.is_empty();
        let mut readahead_hit = self.take_prefetched(fh, &spans, &hits);
        if !missing.is_empty() {
            let me = self
                .me()
                .ok_or_else(|| ServiceError::Local("block cache layer dropped".into()))?;
            let mut set = tokio::task::JoinSet::new();
            for &i in &missing {
                let (me, cred, key, block) = (me.clone(), cx.cred.clone(), fh.to_vec(), spans[i].0);
                set.spawn(async move { (i, me.fetch_block(cred, key, block, false).await) });
            }
            let mut fetched: Vec<(usize, Arc<Fetched>)> = Vec::new();
            while let Some(joined) = set.join_next().await {
                let (i, r) = joined
                    .map_err(|e| ServiceError::Local(format!("block cache fetch task: {e}")))?;
                match r {
                    Ok(f) => {
                        readahead_hit |= f.readahead;
                        fetched.push((i, f));
                    }
                    Err(FetchError::Service(e)) => return Err(e),
                    Err(FetchError::Nfs(st)) => {
                        let a = self.effective(fh);
                        return Ok(NfsReply::Read(Nfs3Result::Err((
                            st,
                            READ3resfail {
                                file_attributes: post_op(a),
                            },
                        ))));
                    }
                }
            }
            // Read back through the store, which merges dirty sub-blocks;
            // fall back to upstream's bytes with the dirty data laid over.
            let key = fh.to_vec();
            // (block, offset in block, length, position in `data`, bytes)
            let wanted: Vec<(u64, u32, usize, usize, Arc<Fetched>)> = fetched
                .into_iter()
                .map(|(i, f)| {
                    let (b, o, n) = spans[i];
                    (
                        b,
                        o,
                        n as usize,
                        (b * bs + u64::from(o) - offset) as usize,
                        f,
                    )
                })
                .collect();
            data = self
                .store_op(move |s| {
                    for (b, o, n, at, f) in wanted {
                        let dst = &mut data[at..at + n];
                        if !s.read_into(&key, b, o, dst)? {
                            compose_into(&f, s.dirty_overlay(&key, b)?.as_ref(), o, dst);
                        }
                    }
                    Ok(data)
                })
                .await?;
        }
        // Upstream may have reported a new size while we fetched.
        let attrs = self.effective(fh).unwrap_or(attrs);
        let keep = attrs.size.saturating_sub(offset).min(data.len() as u64) as usize;
        data.truncate(keep);
        let eof = offset + data.len() as u64 >= attrs.size;
        let n = data.len() as u64;
        bump(&self.counters.read_bytes, n);
        if hit {
            bump(&self.counters.hits, 1);
            bump(&self.counters.hit_bytes, n);
        } else {
            bump(&self.counters.misses, 1);
        }
        if readahead_hit {
            bump(&self.counters.readahead_hits, 1);
        }
        self.maybe_read_ahead(cx, fh, offset, offset + n, attrs.size);
        Ok(read_reply(Some(attrs), data, eof))
    }

    /// Forgets blocks of `spans` that were read ahead and are now served
    /// from the cache; true if there was any.
    fn take_prefetched(&self, fh: &[u8], spans: &[(u64, u32, u32)], hits: &[bool]) -> bool {
        let mut p = lock(&self.prefetched);
        if p.is_empty() {
            return false;
        }
        let mut any = false;
        for (&(b, _, _), &hit) in spans.iter().zip(hits) {
            if hit {
                any |= p.remove(&(fh.to_vec(), b));
            }
        }
        any
    }

    /// Fetches block `block` of `fh` from upstream and fills it into the
    /// store clean, joining a fetch of the same block already in flight.
    async fn fetch_block(
        self: Arc<Self>,
        cred: Credentials,
        fh: Vec<u8>,
        block: u64,
        readahead: bool,
    ) -> FetchResult {
        let key = (fh.clone(), block);
        let role = {
            let mut flights = lock(&self.flights);
            match flights.get(&key) {
                Some(rx) => Err(rx.clone()),
                None => {
                    let (tx, rx) = watch::channel(None);
                    flights.insert(key.clone(), rx);
                    Ok(tx)
                }
            }
        };
        match role {
            Err(mut rx) => {
                bump(&self.counters.coalesced_misses, 1);
                if let Ok(v) = rx.wait_for(|v| v.is_some()).await
                    && let Some(r) = v.as_ref()
                {
                    return r.clone();
                }
                // The fetch we joined was abandoned: do it ourselves.
                self.fetch_and_fill(&cred, &fh, block, readahead).await
            }
            Ok(tx) => {
                let _flight = FlightGuard {
                    layer: &self,
                    key: Some(key),
                };
                // A fetch that ended between our miss and taking the flight
                // (read-ahead, usually) has filled the block already.
                let generation = self.files().generation(&fh);
                let r = match self.cached_block(&fh, block).await {
                    Some(data) => Ok(Arc::new(Fetched {
                        data,
                        readahead: false,
                        generation,
                    })),
                    None => self.fetch_and_fill(&cred, &fh, block, readahead).await,
                };
                tx.send_replace(Some(r.clone()));
                r
            }
        }
    }

    /// The whole of `block` of `fh` when the store holds it all.
    async fn cached_block(&self, fh: &[u8], block: u64) -> Option<Vec<u8>> {
        let (key, bs) = (fh.to_vec(), self.block_size() as usize);
        self.store_raw(move |s| {
            let mut buf = vec![0u8; bs];
            Ok(s.read_into(&key, block, 0, &mut buf)?.then_some(buf))
        })
        .await
        .ok()
        .flatten()
    }

    async fn fetch_and_fill(
        &self,
        cred: &Credentials,
        fh: &[u8],
        block: u64,
        readahead: bool,
    ) -> FetchResult {
        let cx = CallContext::with_cred(cred.clone());
        let generation = self.files().generation(fh);
        let bs = self.block_size();
        let start = block * bs;
        let mut data: Vec<u8> = Vec::new();
        // A block wholly past upstream's end reads as zeros: no READ.
        let past_end = self
            .files()
            .get(fh)
            .and_then(|st| st.upstream.as_ref())
            .is_some_and(|a| a.size <= start);
        let mut eof = past_end;
        while !eof && (data.len() as u64) < bs {
            let want = (bs - data.len() as u64) as u32;
            match self
                .up_read(&cx, fh, start + data.len() as u64, want)
                .await?
            {
                Nfs3Result::Ok(ok) => {
                    self.note_post_op(fh, &ok.file_attributes, Seen::Foreign)
                        .await;
                    let got = ok.data.len().min(want as usize);
                    data.extend_from_slice(&ok.data[..got]);
                    if ok.eof || got == 0 {
                        eof = true;
                        break;
                    }
                }
                Nfs3Result::Err((st, fail)) => {
                    self.note_post_op(fh, &fail.file_attributes, Seen::Foreign)
                        .await;
                    return Err(FetchError::Nfs(st));
                }
            }
        }
        bump(&self.counters.fetched_bytes, data.len() as u64);
        // Past the end of the file a block reads as zeros: cache the whole
        // block so the tail sub-block and later extending writes fit.
        let mut fill = data.clone();
        if eof {
            fill.resize(bs as usize, 0);
        }
        let files = self.files.clone();
        let key = fh.to_vec();
        let filled = self
            .store_raw(move |s| {
                let still = || lock(&files).generation(&key) == generation;
                let outcome = s.write_if(&key, block, 0, &fill, WriteMode::Clean, still)?;
                Ok(outcome == Some(WriteOutcome::Stored))
            })
            .await;
        if readahead && matches!(filled, Ok(true)) {
            let mut p = lock(&self.prefetched);
            if p.len() >= MAX_PREFETCHED {
                p.clear();
            }
            p.insert((fh.to_vec(), block));
        }
        Ok(Arc::new(Fetched {
            data,
            readahead,
            generation,
        }))
    }

    /// Starts read-ahead after a READ of `offset..end` when it continued
    /// the previous READ of the file.
    fn maybe_read_ahead(&self, cx: &CallContext, fh: &[u8], offset: u64, end: u64, size: u64) {
        let ra = u64::from(self.config.readahead_blocks);
        let bs = self.block_size();
        let window = {
            let mut files = self.files();
            let st = files.entry(fh);
            // Reads that skip only known zeros (answered above us) are
            // still one sequential stream.
            let sequential = st.next_read == Some(offset)
                || st.next_read.is_some_and(|n| {
                    n < offset
                        && self
                            .zero_hint
                            .as_ref()
                            .is_some_and(|h| h(fh, n, offset - n))
                });
            st.next_read = Some(end);
            if !sequential {
                st.readahead_next = 0;
                st.run_start = offset;
            }
            // A read at the start of a file starts a run, as a kernel's
            // does: whoever opens a file reads its header, then what it
            // points to.
            if !(sequential || offset == 0) || ra == 0 || end == 0 {
                return;
            }
            // The window grows with the run, as a kernel's does: two small
            // reads that happen to touch (a disk image's tables) do not pull
            // a whole window across the WAN; a stream reaches it at once.
            let run = end.saturating_sub(st.run_start).div_ceil(bs).max(1);
            let from = ((end - 1) / bs + 1).max(st.readahead_next);
            let to = ((end - 1) / bs + 1 + ra.min(run)).min(size.div_ceil(bs));
            if from >= to {
                return;
            }
            (from, to)
        };
        // All there already (the usual case on a warm cache): no task and
        // no blocking hop just to find that out.
        if let Ok(Some(true)) = self.store.all_cached_now(fh, window.0..window.1) {
            self.files().entry(fh).readahead_next = window.1;
            return;
        }
        let Ok(permit) = self.readahead_slots.clone().try_acquire_owned() else {
            return;
        };
        let Some(me) = self.me() else { return };
        self.files().entry(fh).readahead_next = window.1;
        let (cred, key) = (cx.cred.clone(), fh.to_vec());
        tokio::spawn(async move {
            let _permit = permit;
            me.read_ahead(cred, key, window.0..window.1).await;
        });
    }

    async fn read_ahead(
        self: Arc<Self>,
        cred: Credentials,
        fh: Vec<u8>,
        blocks: std::ops::Range<u64>,
    ) {
        let key = fh.clone();
        let n = self.geo.sub_blocks_per_block();
        let wanted: Vec<u64> = match self
            .store_raw(move |s| {
                let mut out = Vec::new();
                for b in blocks {
                    if s.valid_sub_blocks(&key, b)?.count() < n {
                        out.push(b);
                    }
                }
                Ok(out)
            })
            .await
        {
            Ok(w) => w,
            Err(_) => return,
        };
        let bs = self.block_size();
        let known_zero = |b: u64| self.zero_hint.as_ref().is_some_and(|h| h(&fh, b * bs, bs));
        let mut set = tokio::task::JoinSet::new();
        for b in wanted.into_iter().filter(|&b| !known_zero(b)) {
            let (me, cred, fh) = (self.clone(), cred.clone(), fh.clone());
            set.spawn(async move { me.fetch_block(cred, fh, b, true).await });
            bump(&self.counters.readahead_blocks, 1);
        }
        while set.join_next().await.is_some() {}
    }

    // ---- WRITE and COMMIT ----

    async fn write(
        &self,
        cx: &CallContext,
        args: WRITE3args<'static>,
    ) -> Result<NfsReply, ServiceError> {
        bump(&self.counters.writes, 1);
        let n = (args.count as usize).min(args.data.len());
        bump(&self.counters.write_bytes, n as u64);
        match self.config.policy {
            WritePolicy::WriteBack => self.write_cached(cx, args).await,
            WritePolicy::WriteThrough => self.write_through(cx, args).await,
        }
    }

    /// Whether upstream lets this caller write `fh` (and make it longer,
    /// if `extends`), for a caller the file's mode does not let write (an
    /// ACL may): ACCESS with the caller's credentials, remembered for
    /// [`WRITE_CHECK_TTL`].
    async fn may_write(
        &self,
        cx: &CallContext,
        fh: &[u8],
        extends: bool,
    ) -> Result<Result<(), nfsstat3>, ServiceError> {
        let want = ACCESS3_MODIFY | if extends { ACCESS3_EXTEND } else { 0 };
        let key = (fh.to_vec(), cx.cred.key());
        let known = lock(&self.write_checks)
            .get(&key)
            .filter(|(at, _)| at.elapsed() < WRITE_CHECK_TTL)
            .map(|(_, granted)| *granted);
        let granted = match known {
            Some(g) => g,
            None => {
                let req = NfsRequest::Access(ACCESS3args {
                    object: nfs_fh3 {
                        data: Opaque::owned(fh.to_vec()),
                    },
                    access: ACCESS3_MODIFY | ACCESS3_EXTEND,
                });
                let granted = match self.up(cx, req).await? {
                    NfsReply::Access(Nfs3Result::Ok(ok)) => ok.access,
                    other => return Ok(Err(other.status())),
                };
                let mut checks = lock(&self.write_checks);
                if checks.len() >= MAX_WRITE_CHECKS {
                    checks.clear();
                }
                checks.insert(key, (Instant::now(), granted));
                granted
            }
        };
        Ok(if granted & want == want {
            Ok(())
        } else {
            Err(nfsstat3::NFS3ERR_ACCES)
        })
    }

    async fn write_cached(
        &self,
        cx: &CallContext,
        args: WRITE3args<'static>,
    ) -> Result<NfsReply, ServiceError> {
        let fh = args.file.data.to_vec();
        let attrs = match self.file_attrs(cx, &fh).await? {
            Ok(a) => a,
            Err(st) => return Ok(NfsReply::error(gvfs_nfs::NfsProc::Write, st)),
        };
        if attrs.type_ != ftype3::NF3REG {
            return self.up(cx, NfsRequest::Write(args)).await;
        }
        let n = (args.count as usize).min(args.data.len());
        let data = &args.data[..n];
        let end = args.offset.saturating_add(n as u64);
        // Upstream would check this caller's right to write when the WRITE
        // reached it; kept here, it is checked first: by the file's mode
        // (no round trip, so writes go on during an outage), and when the
        // mode says no, by asking upstream (an ACL may say yes).
        let current = self
            .files()
            .get(&fh)
            .and_then(|s| s.overlay)
            .map_or(attrs.size, |o| o.size);
        if !cx.cred.may_write_by_mode(attrs.uid, attrs.gid, attrs.mode)
            && let Err(st) = self.may_write(cx, &fh, end > current).await?
        {
            return Ok(NfsReply::error(gvfs_nfs::NfsProc::Write, st));
        }
        // The size grows before the data lands, so a concurrent write-back
        // never clips data it has taken (see writeback.rs).
        let new_writer = {
            let mut files = self.files();
            let seq = files.next_seq();
            let st = files.entry(&fh);
            let size = st.overlay.map_or(attrs.size, |o| o.size).max(end);
            st.overlay = Some(Overlay {
                size,
                mtime: now(),
                seq,
            });
            let new = st.writer.as_ref() != Some(&cx.cred);
            st.writer = Some(cx.cred.clone());
            new
        };
        // The verifier before the data lands: should dirty data be lost
        // meanwhile, the verifier this WRITE returns is not the new one.
        let verf = writeverf3(self.store.verifier());
        let bs = self.block_size();
        let mut pos = 0usize;
        while pos < n {
            let off = args.offset + pos as u64;
            let block = off / bs;
            let in_block = (off % bs) as u32;
            let len = ((bs - u64::from(in_block)) as usize).min(n - pos);
            self.store_dirty(cx, &fh, block, in_block, data[pos..pos + len].to_vec())
                .await?;
            pos += len;
        }
        if new_writer {
            // Recorded once the file has dirty data (so it is kept), made
            // durable with the store's next sync (a COMMIT): data recovered
            // after a crash is written back as its writer.
            let (key, mut who) = (fh.clone(), Vec::new());
            cx.cred.encode(&mut who);
            self.store_op(move |s| s.set_writer(&key, &who)).await?;
        }
        let committed = if args.stable == stable_how::UNSTABLE {
            stable_how::UNSTABLE
        } else {
            self.store_op(|s| s.sync()).await?;
            stable_how::FILE_SYNC
        };
        let after = self.effective(&fh);
        Ok(NfsReply::Write(Nfs3Result::Ok(WRITE3resok {
            file_wcc: wcc_data {
                before: Nfs3Option::Some(wcc_of(&attrs)),
                after: post_op(after),
            },
            count: n as u32,
            committed,
            verf,
        })))
    }

    /// Stores dirty data in one block: fills a partly covered sub-block
    /// from upstream first, or writes a victim back to free a frame.
    async fn store_dirty(
        &self,
        cx: &CallContext,
        fh: &[u8],
        block: u64,
        offset: u32,
        data: Vec<u8>,
    ) -> Result<(), ServiceError> {
        let data = Arc::new(data);
        for _ in 0..MAX_STORE_ATTEMPTS {
            let (key, d) = (fh.to_vec(), data.clone());
            match self
                .store_raw(move |s| s.write(&key, block, offset, &d, WriteMode::Dirty))
                .await
            {
                Ok(WriteOutcome::Stored) => return Ok(()),
                Ok(WriteOutcome::NeedsWriteBack(victim)) => {
                    self.write_back_victim(victim.fh.as_bytes(), victim.block)
                        .await?;
                }
                Err(Error::PartialSubBlockWrite { .. }) => {
                    let me = self
                        .me()
                        .ok_or_else(|| ServiceError::Local("block cache layer dropped".into()))?;
                    match me
                        .fetch_block(cx.cred.clone(), fh.to_vec(), block, false)
                        .await
                    {
                        Ok(f) => self.fill_making_room(fh, block, &f).await?,
                        Err(FetchError::Service(e)) => return Err(e),
                        Err(FetchError::Nfs(st)) => {
                            return Err(ServiceError::Local(format!(
                                "block cache: reading block {block} to complete a partial write failed: {st}"
                            )));
                        }
                    }
                }
                Err(e) => return Err(local(e)),
            }
        }
        Err(ServiceError::Local(format!(
            "block cache: could not store block {block} after {MAX_STORE_ATTEMPTS} attempts"
        )))
    }

    /// Fills a fetched block clean, writing a dirty victim back first if
    /// its set is full (a read miss just drops such a fill; a partial
    /// write needs it).
    async fn fill_making_room(
        &self,
        fh: &[u8],
        block: u64,
        f: &Fetched,
    ) -> Result<(), ServiceError> {
        // Shorter than a block only at the end of the file: zeros past it.
        let mut fill = f.data.clone();
        fill.resize(self.geo.block_size() as usize, 0);
        let fill = Arc::new(fill);
        for _ in 0..MAX_STORE_ATTEMPTS {
            let (key, d, files, generation) =
                (fh.to_vec(), fill.clone(), self.files.clone(), f.generation);
            match self
                .store_op(move |s| {
                    let still = || lock(&files).generation(&key) == generation;
                    s.write_if(&key, block, 0, &d, WriteMode::Clean, still)
                })
                .await?
            {
                // Stale (truncated, written back or dropped meanwhile):
                // the caller fetches again.
                None | Some(WriteOutcome::Stored) => return Ok(()),
                Some(WriteOutcome::NeedsWriteBack(victim)) => {
                    self.write_back_victim(victim.fh.as_bytes(), victim.block)
                        .await?
                }
            }
        }
        Ok(())
    }

    async fn write_through(
        &self,
        cx: &CallContext,
        args: WRITE3args<'static>,
    ) -> Result<NfsReply, ServiceError> {
        let fh = args.file.data.to_vec();
        // Dirty data left by an earlier write-back session would later
        // overwrite this write: send it first.
        let pending = self
            .files()
            .get(&fh)
            .is_some_and(|s| s.overlay.is_some() || s.recovered);
        if pending {
            let _wb = self.write_back_lock.lock().await;
            let mut report = WriteBackReport::default();
            self.write_back_file(&fh, &mut report, &mut |_| {}).await?;
        }
        self.files().bump_generation(&fh);
        let n = (args.count as usize).min(args.data.len());
        let data = args.data[..n].to_vec();
        let offset = args.offset;
        let reply = self.up(cx, NfsRequest::Write(args)).await?;
        let NfsReply::Write(res) = &reply else {
            return Err(mismatch(self.inner.describe(), "WRITE", &reply));
        };
        let Nfs3Result::Ok(ok) = res else {
            if let Nfs3Result::Err((_, fail)) = res {
                self.note_wcc(&fh, &fail.file_wcc).await;
            }
            return Ok(reply);
        };
        self.note_wcc(&fh, &ok.file_wcc).await;
        let written = (ok.count as usize).min(n);
        let bs = self.block_size();
        let key = fh.clone();
        let r = self
            .store_raw(move |s| {
                let mut pos = 0usize;
                while pos < written {
                    let off = offset + pos as u64;
                    let in_block = (off % bs) as u32;
                    let len = ((bs - u64::from(in_block)) as usize).min(written - pos);
                    let _ = s.write(
                        &key,
                        off / bs,
                        in_block,
                        &data[pos..pos + len],
                        WriteMode::Clean,
                    )?;
                    pos += len;
                }
                Ok(())
            })
            .await;
        if let Err(e) = r {
            // The data is upstream; make sure no stale copy is served.
            tracing::warn!("block cache: caching written data failed: {e}");
            let key = fh.clone();
            self.store_op(move |s| s.invalidate(&key, false)).await?;
        }
        Ok(reply)
    }

    async fn commit(&self, cx: &CallContext, args: COMMIT3args) -> Result<NfsReply, ServiceError> {
        bump(&self.counters.commits, 1);
        if self.config.policy == WritePolicy::WriteThrough {
            let fh = args.file.data.to_vec();
            let reply = self.up(cx, NfsRequest::Commit(args)).await?;
            if let NfsReply::Commit(Nfs3Result::Ok(ok)) = &reply {
                self.note_wcc(&fh, &ok.file_wcc).await;
            }
            return Ok(reply);
        }
        let fh = args.file.data.to_vec();
        self.store_op(|s| s.sync()).await?;
        Ok(NfsReply::Commit(Nfs3Result::Ok(COMMIT3resok {
            file_wcc: wcc_data {
                before: Nfs3Option::None,
                after: post_op(self.effective(&fh)),
            },
            verf: writeverf3(self.store.verifier()),
        })))
    }

    // ---- metadata ----

    async fn setattr(
        &self,
        cx: &CallContext,
        args: SETATTR3args,
    ) -> Result<NfsReply, ServiceError> {
        let fh = args.object.data.to_vec();
        // A time the client sets must be the file's last change upstream:
        // its dirty data goes there first (as a kernel client flushes
        // before such a SETATTR), or write-back would stamp the file later
        // and the client's mtime (`touch -d`, `cp -p`, tar) would be lost.
        let sets_mtime = !matches!(args.new_attributes.mtime, set_mtime::DONT_CHANGE);
        if sets_mtime && self.files().get(&fh).is_some_and(|s| s.pinned()) {
            self.write_back_one(&fh).await?;
        }
        let new_size = match args.new_attributes.size {
            Nfs3Option::Some(s) => Some(s),
            Nfs3Option::None => None,
        };
        let Some(size) = new_size else {
            let mut reply = self.up(cx, NfsRequest::Setattr(args)).await?;
            self.note_setattr(&fh, &mut reply).await;
            return Ok(reply);
        };
        // No write-back may be sending data past the new size meanwhile.
        let _wb = self.write_back_lock.lock().await;
        let _file = self.file_locks.lock(&fh).await;
        self.ensure_recovered(cx, &fh).await?;
        let mut reply = self.up(cx, NfsRequest::Setattr(args)).await?;
        if reply.status() == nfsstat3::NFS3_OK {
            // Only now: dirty data past the size is the client's, kept
            // (and written back) if upstream refuses the truncation.
            self.truncate_cached(&fh, size).await?;
            let mut files = self.files();
            let seq = files.next_seq();
            if let Some(ov) = &mut files.entry(&fh).overlay {
                ov.size = size;
                ov.mtime = now();
                ov.seq = seq;
            }
        }
        self.note_setattr(&fh, &mut reply).await;
        Ok(reply)
    }

    async fn truncate_cached(&self, fh: &[u8], size: u64) -> Result<(), ServiceError> {
        self.files().bump_generation(fh);
        let key = fh.to_vec();
        self.store_op(move |s| {
            if s.has_file(&key)? {
                s.truncate(&key, size)?;
            }
            Ok(())
        })
        .await
    }

    async fn note_setattr(&self, fh: &[u8], reply: &mut NfsReply) {
        if let NfsReply::Setattr(r) = reply {
            let wcc = match r {
                Nfs3Result::Ok(ok) => &mut ok.obj_wcc,
                Nfs3Result::Err((_, fail)) => &mut fail.obj_wcc,
            };
            self.note_wcc(fh, wcc).await;
            self.overlay_attrs(fh, &mut wcc.after);
        }
    }

    /// Drops everything cached of a file that no longer exists upstream.
    async fn forget_file(&self, fh: &[u8]) -> Result<(), ServiceError> {
        self.files().remove(fh);
        let key = fh.to_vec();
        self.store_op(move |s| {
            if s.has_file(&key)? {
                s.invalidate(&key, true)?;
            }
            Ok(())
        })
        .await
    }

    /// The handle of `dir/name` if the cache may hold data of it.
    async fn doomed_target(
        &self,
        cx: &CallContext,
        dir: &nfs_fh3,
        name: &filename3<'_>,
    ) -> Result<Option<(Vec<u8>, Option<fattr3>)>, ServiceError> {
        let anything = self.store_op(|s| Ok(s.cached_files()? > 0)).await?;
        if !anything {
            return Ok(None);
        }
        self.up_lookup(cx, dir, name).await
    }

    async fn remove(
        &self,
        cx: &CallContext,
        args: REMOVE3args<'static>,
    ) -> Result<NfsReply, ServiceError> {
        let target = self
            .doomed_target(cx, &args.object.dir, &args.object.name)
            .await?;
        let reply = self.up(cx, NfsRequest::Remove(args)).await?;
        if reply.status() == nfsstat3::NFS3_OK
            && let Some((fh, attrs)) = target
            && attrs.is_none_or(|a| a.nlink <= 1 && a.type_ == ftype3::NF3REG)
        {
            self.forget_file(&fh).await?;
        }
        Ok(reply)
    }

    async fn rename(
        &self,
        cx: &CallContext,
        args: RENAME3args<'static, 'static>,
    ) -> Result<NfsReply, ServiceError> {
        let target = self.doomed_target(cx, &args.to.dir, &args.to.name).await?;
        let source = match &target {
            Some(_) => self.up_lookup(cx, &args.from.dir, &args.from.name).await?,
            None => None,
        };
        let reply = self.up(cx, NfsRequest::Rename(args)).await?;
        if reply.status() == nfsstat3::NFS3_OK
            && let Some((fh, attrs)) = target
            && source.is_none_or(|(s, _)| s != fh)
            && attrs.is_none_or(|a| a.nlink <= 1 && a.type_ == ftype3::NF3REG)
        {
            self.forget_file(&fh).await?;
        }
        Ok(reply)
    }

    async fn forward(&self, cx: &CallContext, req: NfsRequest) -> Result<NfsReply, ServiceError> {
        let mut reply = self.up(cx, req).await?;
        match &mut reply {
            NfsReply::Lookup(Nfs3Result::Ok(ok)) => {
                let fh = ok.object.data.to_vec();
                self.note_post_op(&fh, &ok.obj_attributes, Seen::Foreign)
                    .await;
                self.ensure_recovered(cx, &fh).await?;
                self.overlay_attrs(&fh, &mut ok.obj_attributes);
            }
            NfsReply::Readdirplus(Nfs3Result::Ok(ok)) => {
                for e in ok.reply.entries.0.iter_mut() {
                    if let Nfs3Option::Some(h) = &e.name_handle {
                        let fh = h.data.to_vec();
                        self.note_post_op(&fh, &e.name_attributes, Seen::Foreign)
                            .await;
                        self.overlay_attrs(&fh, &mut e.name_attributes);
                    }
                }
            }
            _ => {}
        }
        Ok(reply)
    }

    async fn getattr(
        &self,
        cx: &CallContext,
        args: GETATTR3args,
    ) -> Result<NfsReply, ServiceError> {
        let fh = args.object.data.to_vec();
        let mut reply = self.up(cx, NfsRequest::Getattr(args)).await?;
        if let NfsReply::Getattr(Nfs3Result::Ok(ok)) = &mut reply {
            self.note(&fh, &ok.obj_attributes, Seen::Foreign).await;
            self.ensure_recovered(cx, &fh).await?;
            let mut a = Nfs3Option::Some(ok.obj_attributes.clone());
            self.overlay_attrs(&fh, &mut a);
            if let Nfs3Option::Some(a) = a {
                ok.obj_attributes = a;
            }
        }
        Ok(reply)
    }

    async fn access(&self, cx: &CallContext, args: ACCESS3args) -> Result<NfsReply, ServiceError> {
        let fh = args.object.data.to_vec();
        let mut reply = self.up(cx, NfsRequest::Access(args)).await?;
        if let NfsReply::Access(Nfs3Result::Ok(ok)) = &mut reply {
            self.note_post_op(&fh, &ok.obj_attributes, Seen::Foreign)
                .await;
            self.overlay_attrs(&fh, &mut ok.obj_attributes);
        }
        Ok(reply)
    }

    async fn create(
        &self,
        cx: &CallContext,
        args: CREATE3args<'static>,
    ) -> Result<NfsReply, ServiceError> {
        // CREATE UNCHECKED with a size truncates an existing file.
        let truncating = match &args.how {
            createhow3::UNCHECKED(s) => match s.size {
                Nfs3Option::Some(n) => Some(n),
                Nfs3Option::None => None,
            },
            _ => None,
        };
        let mut reply = self.up(cx, NfsRequest::Create(args)).await?;
        if let NfsReply::Create(Nfs3Result::Ok(ok)) = &mut reply
            && let Nfs3Option::Some(h) = &ok.obj
        {
            let fh = h.data.to_vec();
            if let Some(size) = truncating {
                let _wb = self.write_back_lock.lock().await;
                let _file = self.file_locks.lock(&fh).await;
                self.truncate_cached(&fh, size).await?;
                let mut files = self.files();
                if let Some(ov) = &mut files.entry(&fh).overlay {
                    ov.size = size;
                }
            }
            self.note_post_op(&fh, &ok.obj_attributes, Seen::Foreign)
                .await;
            self.overlay_attrs(&fh, &mut ok.obj_attributes);
        }
        Ok(reply)
    }

    async fn dispatch(&self, cx: &CallContext, req: NfsRequest) -> Result<NfsReply, ServiceError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(ServiceError::Local("block cache is closed".into()));
        }
        match req {
            NfsRequest::Read(a) => self.read(cx, a).await,
            NfsRequest::Write(a) => self.write(cx, a).await,
            NfsRequest::Commit(a) => self.commit(cx, a).await,
            NfsRequest::Getattr(a) => self.getattr(cx, a).await,
            NfsRequest::Setattr(a) => self.setattr(cx, a).await,
            NfsRequest::Access(a) => self.access(cx, a).await,
            NfsRequest::Create(a) => self.create(cx, a).await,
            NfsRequest::Remove(a) => self.remove(cx, a).await,
            NfsRequest::Rename(a) => self.rename(cx, a).await,
            other => self.forward(cx, other).await,
        }
    }
}

/// Removes a block fetch from the in-flight map when its leader finishes
/// (or is dropped).
struct FlightGuard<'a> {
    layer: &'a CacheLayer,
    key: Option<BlockKey>,
}

impl Drop for FlightGuard<'_> {
    fn drop(&mut self) {
        if let Some(k) = self.key.take() {
            lock(&self.layer.flights).remove(&k);
        }
    }
}

fn read_reply(attrs: Option<fattr3>, data: Vec<u8>, eof: bool) -> NfsReply {
    NfsReply::Read(Nfs3Result::Ok(READ3resok {
        file_attributes: post_op(attrs),
        count: data.len() as u32,
        eof,
        data: Opaque::owned(data),
    }))
}

/// Fills `out` with the `out.len()` bytes at `offset` of a block:
/// upstream's bytes (zeros past its end) with the cache's dirty bytes laid
/// over them.
fn compose_into(f: &Fetched, dirty: Option<&DirtyData>, offset: u32, out: &mut [u8]) {
    let (lo, hi) = (offset as usize, offset as usize + out.len());
    let have = f.data.len().min(hi);
    if have > lo {
        out[..have - lo].copy_from_slice(&f.data[lo..have]);
        out[have - lo..].fill(0);
    } else {
        out.fill(0);
    }
    for e in dirty.map(|d| d.extents.as_slice()).unwrap_or_default() {
        let (elo, ehi) = (e.offset as usize, e.offset as usize + e.data.len());
        let (a, b) = (elo.max(lo), ehi.min(hi));
        if a < b {
            out[a - lo..b - lo].copy_from_slice(&e.data[a - elo..b - elo]);
        }
    }
}

/// Where the dirty data of a block ends as a file offset: where the last
/// dirty write into it ended, as its tag recorded (trailing zeros
/// included), or the end of its last dirty run if the tag has no such end.
fn recovered_end(dd: &DirtyData, block_size: u64) -> u64 {
    let end = match dd.end {
        0 => dd
            .extents
            .last()
            .map_or(0, |e| u64::from(e.offset) + e.data.len() as u64),
        n => u64::from(n),
    };
    dd.block * block_size + end
}

impl NfsService for CacheLayer {
    fn call<'a>(
        &'a self,
        cx: &'a CallContext,
        req: NfsRequest,
    ) -> BoxFuture<'a, Result<NfsReply, ServiceError>> {
        Box::pin(self.dispatch(cx, req))
    }

    fn root<'a>(&'a self, cx: &'a CallContext) -> BoxFuture<'a, Result<nfs_fh3, ServiceError>> {
        self.inner.root(cx)
    }

    fn describe(&self) -> String {
        format!(
            "block cache ({}, {} MiB in {} banks, {}-way, {} KiB blocks) over {}",
            self.config.policy,
            self.geo.capacity() >> 20,
            self.geo.banks(),
            self.geo.ways(),
            self.geo.block_size() >> 10,
            self.inner.describe()
        )
    }
}
