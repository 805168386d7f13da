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
//!   dropped. Session semantics beyond that (docs/ARCHITECTURE.md, section 3: session semantics).
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
mod calls;
mod coherence;
mod read;
mod write;
mod writeback;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Instant, SystemTime};

use gvfs_nfs::layer::{
    Backlog, Calls, Layer, Lifecycle, Progress, WriteBackKind, WriteCheck, WriteTarget, lock,
};
use gvfs_nfs::proc::MAX_DATA;
use gvfs_nfs::{
    BoxFuture, CallContext, Credentials, NfsReply, NfsRequest, NfsService, ServiceError,
};
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::Opaque;
use tokio::sync::{Semaphore, watch};

use crate::error::{Error, LayerError, UpstreamCall};
use crate::geometry::Geometry;
use crate::store::{BlockStore, DirtyData, WriteMode, WriteOutcome};

use attrs::{FileTable, MAX_FILES, Overlay, Seen};

pub use gvfs_nfs::layer::WriteBackReport;

/// Read-ahead batches in flight at once, over all files.
const MAX_READAHEAD_TASKS: usize = 8;
/// Attempts at storing one block of a WRITE (each may first fill a partial
/// sub-block or write a victim back).
const MAX_STORE_ATTEMPTS: usize = 8;
/// Remembered read-ahead blocks not yet read, for the read-ahead hit count.
const MAX_PREFETCHED: usize = 64 * 1024;

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

gvfs_nfs::counters! {
    /// What the layer counts, for `gvfsctl stats` and metrics.
    pub struct Counters => LayerCounts {
        /// READ calls.
        reads,
        /// READs served entirely from the cache.
        hits,
        /// READs that needed at least one block from upstream.
        misses,
        /// Bytes served by hits.
        hit_bytes,
        /// Bytes returned by all READs.
        read_bytes,
        /// Bytes fetched from upstream to fill the cache.
        fetched_bytes,
        /// Bytes that filled missed blocks from copies of the same content
        /// held here (another file's blocks), instead of from upstream.
        held_fill_bytes,
        /// Blocks fetched by read-ahead.
        readahead_blocks,
        /// READs served (at least partly) from blocks read ahead.
        readahead_hits,
        /// Block fetches that joined one already in flight instead of asking
        /// upstream again.
        coalesced_misses,
        /// WRITE calls.
        writes,
        /// Bytes written by clients.
        write_bytes,
        /// COMMIT calls.
        commits,
        /// Dirty blocks written upstream early to free a frame.
        eviction_write_backs,
        /// Bytes written upstream by write-back (including evictions).
        write_back_bytes,
        /// Completed write-back runs.
        write_backs,
        /// Files whose clean blocks were dropped because they changed upstream.
        invalidations,
        /// Calls sent to the layer below.
        upstream_calls,
        /// Total time spent waiting for the layer below, in microseconds.
        upstream_latency_us_total,
        /// Failures of the local cache storage.
        store_errors,
    }
}

/// Counters and gauges of the layer, for `gvfsctl stats` and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct LayerStats {
    /// What the layer counted.
    #[serde(flatten)]
    pub counts: LayerCounts,
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

/// The layer below, timed: each call counts in `upstream_calls` and
/// `upstream_latency_us_total`.
struct Below {
    inner: Arc<dyn NfsService>,
    counters: Arc<Counters>,
}

impl NfsService for Below {
    fn call<'a>(
        &'a self,
        cx: &'a CallContext,
        req: NfsRequest,
    ) -> BoxFuture<'a, Result<NfsReply, ServiceError>> {
        Box::pin(async move {
            let t = Instant::now();
            let r = self.inner.call(cx, req).await;
            self.counters.upstream_calls.inc();
            self.counters
                .upstream_latency_us_total
                .add(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
            r
        })
    }

    fn root<'a>(&'a self, cx: &'a CallContext) -> BoxFuture<'a, Result<nfs_fh3, ServiceError>> {
        self.inner.root(cx)
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
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
    below: Below,
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
    /// Where a missed block may be copied from before it is read below
    /// (a proxy that deduplicates).
    held_elsewhere: Option<Arc<dyn HeldElsewhere>>,
    /// One write-back at a time; truncation waits for it.
    write_back_lock: tokio::sync::Mutex<()>,
    /// Whether callers may write files whose writes are kept here.
    write_checks: WriteCheck,
    /// What sends a file's dirty data upstream or truncates it (a
    /// write-back, an evicted dirty block, SETATTR of the size) does so one
    /// at a time per file, so no WRITE of older bytes lands after newer
    /// ones or past a truncation.
    file_locks: FileLocks,
    counters: Arc<Counters>,
    closed: AtomicBool,
}

impl fmt::Debug for CacheLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheLayer")
            .field("inner", &self.below.describe())
            .field("geometry", &self.geo)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// `(file handle, offset, length)` -> whether those bytes are known zeros
/// that the layer above answers without asking this one.
pub type ZeroHint = Arc<dyn Fn(&[u8], u64, u64) -> bool + Send + Sync>;

/// What a [`CacheLayer`] asks of the rest of the proxy besides the layer
/// below, given at construction (none by default: a cache alone).
#[derive(Clone, Default)]
pub struct SideChannels {
    /// Which ranges read-ahead may skip (the metadata layer's table, when
    /// there is one above).
    pub zero_hint: Option<ZeroHint>,
    /// Where missed blocks may be copied from, and who is told of the
    /// blocks the cache holds and lets go (a proxy that deduplicates).
    pub held_elsewhere: Option<Arc<dyn HeldElsewhere>>,
}

impl fmt::Debug for SideChannels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SideChannels")
            .field("zero_hint", &self.zero_hint.is_some())
            .field("held_elsewhere", &self.held_elsewhere.is_some())
            .finish()
    }
}

/// Copies of a file's bytes held elsewhere on this proxy (the blocks of
/// other files with the same content, found by content hash): a missed
/// block is filled from them when they have it all, instead of read below,
/// and the blocks the cache holds and lets go are told, to be found by
/// others. Called from blocking threads; `dropped` under the store's lock,
/// so it must not block.
pub trait HeldElsewhere: Send + Sync {
    /// Whether copies of `fh`'s blocks may be found at all (cheap; asked
    /// before each miss).
    fn knows(&self, fh: &[u8]) -> bool;
    /// Fills `buf` with the bytes of `fh` at `offset`, checked against the
    /// file's content hashes; false if it cannot (`buf` unspecified).
    fn read(&self, fh: &[u8], offset: u64, buf: &mut [u8]) -> bool;
    /// The cache now holds `fh`'s `offset..offset + len`.
    fn held(&self, fh: &[u8], offset: u64, len: u64);
    /// The cache let go of `fh`'s block that starts at `offset`.
    fn dropped(&self, fh: &[u8], offset: u64);
}

fn local(e: Error) -> ServiceError {
    LayerError::Store(e).into()
}

/// Upstream answered `call`, which the layer made of its own accord, with
/// `status`.
fn upstream_failed(call: UpstreamCall, status: nfsstat3) -> ServiceError {
    LayerError::Upstream { call, status }.into()
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

impl CacheLayer {
    /// A cache layer over `inner` keeping its blocks in `store`, with the
    /// rest of the proxy reached through `sides`. Files with dirty data
    /// recovered from an earlier session are noted, so that the next
    /// write-back sends them upstream.
    pub fn new(
        inner: Arc<dyn NfsService>,
        store: impl Into<Arc<BlockStore>>,
        config: CacheConfig,
        sides: SideChannels,
    ) -> Arc<Self> {
        let store = store.into();
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
        let SideChannels {
            zero_hint,
            held_elsewhere,
        } = sides;
        let held_elsewhere = held_elsewhere.filter(|held| {
            // Told of every block the store lets go from now on.
            let bs = u64::from(geo.block_size());
            let told = held.clone();
            let hook = crate::store::DropHook::new(move |fh: &[u8], block: u64| {
                told.dropped(fh, block * bs)
            });
            match store.on_drop(hook) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(error = %e, "block cache: cannot report the blocks it lets go");
                    false
                }
            }
        });
        let counters = Arc::new(Counters::default());
        Arc::new_cyclic(|me| CacheLayer {
            me: me.clone(),
            below: Below {
                inner,
                counters: counters.clone(),
            },
            store,
            geo,
            config,
            files: Arc::new(Mutex::new(files)),
            flights: Mutex::new(HashMap::new()),
            prefetched: Mutex::new(HashSet::new()),
            readahead_slots: Arc::new(Semaphore::new(MAX_READAHEAD_TASKS)),
            zero_hint,
            held_elsewhere,
            write_back_lock: tokio::sync::Mutex::new(()),
            write_checks: WriteCheck::default(),
            file_locks: FileLocks::default(),
            counters,
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
        LayerStats {
            counts: self.counters.snapshot(),
            dirty_bytes: s.dirty_bytes,
            cached_bytes: s.cached_bytes,
            capacity_bytes: s.capacity,
            frames_in_use: s.frames_in_use,
            evictions: s.evictions,
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
            self.counters.store_errors.add(1);
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

    async fn up_lookup(
        &self,
        cx: &CallContext,
        dir: &nfs_fh3,
        name: &filename3<'_>,
    ) -> Result<Option<(Vec<u8>, Option<fattr3>)>, ServiceError> {
        match self.below.lookup(cx, dir, name).await? {
            Nfs3Result::Ok(ok) => {
                let a = match ok.obj_attributes {
                    Nfs3Option::Some(a) => Some(a),
                    Nfs3Option::None => None,
                };
                Ok(Some((ok.object.data.to_vec(), a)))
            }
            Nfs3Result::Err(_) => Ok(None),
        }
    }

    // ---- the calls ----

    /// Hands each call to the path that serves it.
    async fn dispatch(&self, cx: &CallContext, req: NfsRequest) -> Result<NfsReply, ServiceError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(LayerError::Closed.into());
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

impl Layer for CacheLayer {
    fn below(&self) -> &dyn NfsService {
        &self.below
    }

    fn what(&self) -> String {
        format!(
            "block cache ({}, {} MiB in {} banks, {}-way, {} KiB blocks)",
            self.config.policy,
            self.geo.capacity() >> 20,
            self.geo.banks(),
            self.geo.ways(),
            self.geo.block_size() >> 10,
        )
    }

    async fn handle(&self, cx: &CallContext, req: NfsRequest) -> Result<NfsReply, ServiceError> {
        self.dispatch(cx, req).await
    }
}

/// The block cache's part in write-back and exit: its dirty blocks are
/// written back (or flushed), and it is closed (made durable, marked
/// clean) at exit.
impl Lifecycle for CacheLayer {
    fn name(&self) -> &'static str {
        "block cache"
    }

    fn write_back<'a>(
        &'a self,
        kind: WriteBackKind,
        progress: Progress<'a>,
    ) -> Option<gvfs_nfs::BoxFuture<'a, Result<WriteBackReport, ServiceError>>> {
        Some(match kind {
            WriteBackKind::WriteBack => Box::pin(CacheLayer::write_back(self, progress)),
            WriteBackKind::Flush => Box::pin(self.flush()),
        })
    }

    fn close(&self) -> Result<(), ServiceError> {
        CacheLayer::close(self)
    }

    fn backlog(&self) -> Backlog {
        Backlog {
            dirty_bytes: self.dirty_bytes(),
            ..Backlog::default()
        }
    }
}
