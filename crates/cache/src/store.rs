//! [`BlockStore`]: the set-associative index, bank files and crash-safety
//! rules tied together behind one synchronous API.
//!
//! # Crash-safety rules
//!
//! * **Order of a write.** Data first, then the frame's tag; nothing is
//!   fsynced except as below. Each valid sub-block's CRC32 is in the tag, so
//!   a torn or reordered pair is detected on open.
//! * **Unsynced-dirty flag.** Before the first dirty write into a bank after
//!   a sync, that bank's header is set to "dirty writes since the last sync"
//!   and fsynced (a barrier: the flag is durable before the data). `sync`
//!   sets it back to "synced". A crash with the flag set means acknowledged
//!   but uncommitted writes may be lost, so the next open changes the write
//!   verifier (RFC 1813 section 3.3.7: the client then resends).
//! * **Committed bits.** `sync` fsyncs data and tags, then records in each
//!   changed tag which dirty sub-blocks are now durable ("committed"), then
//!   fsyncs again. On open, a sub-block whose CRC does not match is dropped,
//!   unless it is committed: its mismatch can only come from an in-flight
//!   overwrite, whose bytes the client resends, while its other bytes are the
//!   committed ones and must not be lost. It is kept dirty and the verifier
//!   changes. A clean fill merged around a committed partial sub-block's
//!   extent takes the sub-block's committed bit away until the next sync
//!   (its tag must not claim the merged bytes as durable); should that
//!   sub-block not match on open while still dirty, it goes back to the
//!   committed extent the frame's older tag names.
//! * **No resurrection.** A frame whose durable tag still claims committed
//!   dirty data is not reused before a sync makes its cleaner tag durable;
//!   `truncate` and `invalidate` always sync before returning (also making
//!   earlier evictions durable, so no stale copy of that file comes back); [`BlockStore::dirty_data`]
//!   syncs before handing out data to be written upstream, so what upstream
//!   receives is never newer than what a crash can bring back.
//! * **Verifier rule.** The verifier changes on open when: a bank header was
//!   unreadable, a header says dirty writes were not synced, the headers
//!   disagree, a tag was corrupt, a dirty sub-block was dropped, or a torn
//!   committed sub-block was kept. Otherwise it is kept, so a COMMIT verifier
//!   stays valid across a clean restart or a crash after a sync.
//!
//! # Partial sub-block rule
//!
//! Validity is per sub-block. A write that covers a sub-block only partly
//! updates it in place if it is already valid (read-modify-write). If it is
//! not valid, a dirty write keeps just the bytes written as the sub-block's
//! *extent* (the sub-block becomes "partial": dirty, not valid), so a client
//! writing part of a sub-block never waits for a read from upstream. Later
//! dirty writes that overlap or touch the extent grow it; one that would
//! leave a gap inside the sub-block is rejected whole with
//! [`Error::PartialSubBlockWrite`] (nothing written): the layer above fills
//! the block from upstream and retries. A clean fill that covers a partial
//! sub-block merges into it (upstream's bytes around the extent) and makes
//! it valid and still dirty; otherwise a clean fill skips partial sub-blocks
//! and never overwrites dirty ones (the cache's copy is newer than
//! upstream's). Reads treat a partial sub-block as a miss; write-back sends
//! only its extent.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{BuildHasher, Hasher};
use std::ops::Range;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, TryLockError};

use crate::error::{Error, IoContext, Result};
use crate::format::{
    BankLayout, HEADER_LEN, Header, HeaderError, MAX_FH_LEN, Shutdown, SyncState, Tag, TagError,
};
use crate::geometry::Geometry;
use crate::mask::SubBlockMask;
use crate::set::{FileHandle, Frame, Victim, choose_victim};
use crate::storage::{FileStorage, Storage};

/// When [`BlockStore::open`] checks every valid sub-block against its CRC.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum VerifyData {
    /// Only for banks not closed cleanly (or with an unreadable header).
    #[default]
    AfterUncleanShutdown,
    /// Always (reads the whole cache).
    Always,
}

/// Options of [`BlockStore::open`].
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenOptions {
    /// When to verify data CRCs.
    pub verify_data: VerifyData,
}

/// Whether a write is dirty data from a client or a clean fill from upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// Client data not yet upstream; kept until written back.
    Dirty,
    /// Data as upstream has it; may be evicted at any time.
    Clean,
}

/// Dirty sub-blocks of one block, as byte ranges inside the block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirtyBlock {
    /// File handle.
    pub fh: FileHandle,
    /// Block index in the file.
    pub block: u64,
    /// Byte ranges inside the block, ascending, coalesced.
    pub ranges: Vec<Range<u32>>,
}

/// Result of [`BlockStore::write`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum WriteOutcome {
    /// Stored (or, for a clean fill, nothing needed storing).
    Stored,
    /// Nothing was written: every frame of the block's set is dirty. Write
    /// this least recently used block upstream ([`BlockStore::dirty_data`],
    /// then [`BlockStore::mark_clean`]) and retry. A clean fill may simply
    /// be dropped instead.
    NeedsWriteBack(DirtyBlock),
}

/// One contiguous run of dirty bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirtyExtent {
    /// Offset inside the block.
    pub offset: u32,
    /// The bytes.
    pub data: Vec<u8>,
}

/// Dirty data of one block, to be written upstream and then passed to
/// [`BlockStore::mark_clean`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirtyData {
    /// File handle.
    pub fh: FileHandle,
    /// Block index in the file.
    pub block: u64,
    /// Dirty runs, ascending: whole sub-blocks and the extents of partial
    /// ones. The layer clips the last one to the file size it knows.
    pub extents: Vec<DirtyExtent>,
    /// Where the last dirty write into the block ended (bytes from the
    /// block's start): the file size the client wrote, if this is its last
    /// dirty block, trailing zeros included. Persistent.
    pub end: u32,
    /// Write sequence when taken: `mark_clean` leaves sub-blocks rewritten
    /// after this dirty.
    pub(crate) seq: u64,
}

impl DirtyData {
    /// Byte offset in the file of the block's first byte.
    pub fn file_offset(&self, block_size: u32) -> u64 {
        self.block * u64::from(block_size)
    }
}

/// What [`BlockStore::open`] found and repaired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecoveryReport {
    /// Banks created empty.
    pub banks_created: u32,
    /// Banks whose header was unreadable (recovered from tags alone).
    pub headers_lost: u32,
    /// Banks not closed cleanly by the last session.
    pub unclean_banks: u32,
    /// Banks whose header said dirty writes had not been synced.
    pub unsynced_banks: u32,
    /// Frames recovered into the index.
    pub frames_recovered: u64,
    /// Of those, frames holding dirty data.
    pub dirty_frames_recovered: u64,
    /// Frames whose both tag copies were corrupt (or misplaced, or
    /// duplicated): their data is dropped.
    pub corrupt_tags: u64,
    /// Torn tag writes that fell back to the other, older copy.
    pub torn_tag_writes: u64,
    /// Clean sub-blocks dropped because their data did not match the CRC.
    pub clean_sub_blocks_dropped: u64,
    /// Dirty sub-blocks dropped: client data lost.
    pub dirty_sub_blocks_lost: u64,
    /// Committed sub-blocks kept despite a torn in-flight overwrite.
    pub torn_committed_kept: u64,
    /// The cache was new: no bank had a valid header.
    pub new_cache: bool,
    /// The write verifier changed (dirty data may have been lost).
    pub verifier_changed: bool,
}

/// Counters and gauges for `gvfsctl stats` and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheStats {
    /// Reads served entirely from the cache.
    pub hits: u64,
    /// Reads not (entirely) cached.
    pub misses: u64,
    /// Bytes served by hits.
    pub hit_bytes: u64,
    /// Clean frames reused for another block.
    pub evictions: u64,
    /// Writes refused until a dirty block is written back.
    pub write_backs_needed: u64,
    /// Bytes of valid data cached.
    pub cached_bytes: u64,
    /// Bytes of dirty data cached.
    pub dirty_bytes: u64,
    /// Frames holding a block.
    pub frames_in_use: u64,
    /// Data capacity in bytes.
    pub capacity: u64,
}

#[derive(Debug)]
struct Bank {
    storage: Box<dyn Storage>,
    header: Header,
    /// Writes since this bank's last fsync.
    unsynced_io: bool,
}

#[derive(Debug)]
struct Inner {
    geo: Geometry,
    layout: BankLayout,
    banks: Vec<Bank>,
    frames: Vec<Frame>,
    index: BTreeMap<FileHandle, BTreeMap<u64, usize>>,
    /// Frames whose tag was written since the last sync.
    touched: BTreeSet<usize>,
    clock: u64,
    seq: u64,
    stats: CacheStats,
    poisoned: bool,
    /// Set by a close: the headers say "clean shutdown", so a later write
    /// would go unverified by the next open.
    closed: bool,
}

/// The block cache's storage core: a hashed set-associative store of blocks
/// in bank files, crash-safe, rebuilt warm from disk on open.
///
/// Synchronous and internally locked; the async layer calls it from
/// `spawn_blocking`.
#[derive(Debug)]
pub struct BlockStore {
    inner: Mutex<Inner>,
    /// The directory's lock file, held (locked) while the store is open.
    _dir_lock: Option<std::fs::File>,
}

fn check_fh(fh: &[u8]) -> Result<()> {
    if fh.len() > MAX_FH_LEN {
        return Err(Error::FileHandleTooLong(fh.len()));
    }
    Ok(())
}

fn new_verifier(old: &[[u8; 8]]) -> [u8; 8] {
    let state = std::collections::hash_map::RandomState::new();
    let mut salt = 0u64;
    loop {
        let mut h = state.build_hasher();
        h.write_u64(salt);
        if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(d.as_nanos());
        }
        h.write_u32(std::process::id());
        let v = h.finish().to_le_bytes();
        if v != [0; 8] && !old.contains(&v) {
            return v;
        }
        salt += 1;
    }
}

/// A geometry as the proxy's options that make it.
fn as_options(g: &Geometry) -> String {
    format!(
        "--cache-size {} --cache-banks {} --cache-ways {} --block-size {}",
        size_option(g.capacity()),
        g.banks(),
        g.ways(),
        size_option(u64::from(g.block_size()))
    )
}

/// Bytes in the largest unit that divides them (`4G`, `64K`, `1000`).
fn size_option(bytes: u64) -> String {
    for (unit, shift) in [("T", 40), ("G", 30), ("M", 20), ("K", 10)] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

impl BlockStore {
    /// Opens (creating as needed) the bank files `DIR/bank-NNN.gvfs`, and
    /// holds `DIR/lock` while open: a second process is refused.
    pub fn open_dir(
        dir: &Path,
        geometry: Geometry,
        options: OpenOptions,
    ) -> Result<(BlockStore, RecoveryReport)> {
        std::fs::create_dir_all(dir).ctx("creating the cache directory")?;
        // One process per cache directory: two would each believe they
        // own every frame.
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("lock"))
            .ctx("opening the cache directory's lock file")?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::DirInUse {
                    dir: dir.to_path_buf(),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(e).ctx("locking the cache directory");
            }
        }
        let mut storages: Vec<Box<dyn Storage>> = Vec::new();
        for b in 0..geometry.banks() {
            let path = dir.join(format!("bank-{b:03}.gvfs"));
            storages.push(Box::new(
                FileStorage::open(&path).ctx("opening a bank file")?,
            ));
        }
        let (mut store, report) = BlockStore::open(storages, geometry, options)?;
        store._dir_lock = Some(lock);
        Ok((store, report))
    }

    /// Opens a cache over one storage per bank, recovering the index from
    /// the tag tables (the cache is warm after a restart) and repairing what
    /// a crash left behind. See the module docs for the verifier rule.
    pub fn open(
        storages: Vec<Box<dyn Storage>>,
        geometry: Geometry,
        options: OpenOptions,
    ) -> Result<(BlockStore, RecoveryReport)> {
        if storages.len() != geometry.banks() as usize {
            return Err(Error::BankCountMismatch {
                expected: geometry.banks(),
                given: storages.len(),
            });
        }
        let layout = BankLayout::new(&geometry);
        let mut report = RecoveryReport::default();
        let mut old_verifiers: Vec<[u8; 8]> = Vec::new();
        let mut max_epoch = 0u64;
        let mut change = false;
        let mut banks = Vec::new();
        let mut verify = Vec::new();
        for (b, storage) in storages.into_iter().enumerate() {
            let b32 = b as u32;
            let len = storage.len().ctx("reading a bank's length")?;
            let mut header_ok = None;
            if len == 0 {
                report.banks_created += 1;
            } else {
                let mut buf = [0u8; HEADER_LEN];
                let decoded = if len >= HEADER_LEN as u64 {
                    storage.read_at(&mut buf, 0).ctx("reading a bank header")?;
                    Header::decode(&buf)
                } else {
                    Err(HeaderError::Corrupt)
                };
                match decoded {
                    Ok(h) if !h.matches(&geometry, b32) => {
                        let found = Geometry::from_parts(
                            h.banks,
                            h.ways,
                            h.block_size,
                            h.sub_block_size,
                            h.sets_per_bank,
                        )
                        .map(|g| as_options(&g))
                        .unwrap_or_else(|e| format!("an invalid geometry ({e})"));
                        return Err(Error::GeometryMismatch {
                            bank: b32,
                            found,
                            wanted: as_options(&geometry),
                        });
                    }
                    Ok(h) => header_ok = Some(h),
                    Err(HeaderError::Version(version)) => {
                        return Err(Error::UnsupportedFormatVersion { bank: b32, version });
                    }
                    Err(HeaderError::Blank | HeaderError::Corrupt) => {
                        report.headers_lost += 1;
                        change = true;
                        tracing::warn!(bank = b, "bank header unreadable; recovering from tags");
                    }
                }
            }
            if len < layout.file_len() {
                storage
                    .set_len(layout.file_len())
                    .ctx("sizing a bank file")?;
            }
            let must_verify = match header_ok {
                Some(h) => {
                    old_verifiers.push(h.verifier);
                    max_epoch = max_epoch.max(h.epoch);
                    if h.sync == SyncState::DirtyUnsynced {
                        report.unsynced_banks += 1;
                        change = true;
                    }
                    if h.shutdown != Shutdown::Clean {
                        report.unclean_banks += 1;
                    }
                    h.shutdown != Shutdown::Clean || options.verify_data == VerifyData::Always
                }
                None => len != 0,
            };
            verify.push(must_verify);
            banks.push(Bank {
                storage,
                header: Header::new(&geometry, b32, [0; 8], 0),
                unsynced_io: true,
            });
        }
        old_verifiers.dedup();
        report.new_cache = old_verifiers.is_empty();
        if old_verifiers.len() > 1 {
            change = true;
        }
        let frames = (0..geometry.total_frames())
            .map(|_| Frame::empty(geometry.sub_blocks_per_block()))
            .collect();
        let mut inner = Inner {
            geo: geometry,
            layout,
            banks,
            frames,
            index: BTreeMap::new(),
            touched: BTreeSet::new(),
            clock: 1,
            seq: 1,
            stats: CacheStats {
                capacity: geometry.capacity(),
                ..CacheStats::default()
            },
            poisoned: false,
            closed: false,
        };
        // What recovery reads must be durable before it writes over it: a
        // tag a killed process left in the page cache may be the newest
        // copy, and recovery rewrites the other slot.
        for bank in &inner.banks {
            bank.storage.sync().ctx("syncing a bank before recovery")?;
        }
        for (b, must_verify) in verify.into_iter().enumerate() {
            inner.recover_bank(b, must_verify, &mut report)?;
        }
        if report.corrupt_tags > 0
            || report.dirty_sub_blocks_lost > 0
            || report.torn_committed_kept > 0
        {
            change = true;
        }
        if report.dirty_sub_blocks_lost > 0 || report.corrupt_tags > 0 {
            tracing::error!(
                dirty_sub_blocks_lost = report.dirty_sub_blocks_lost,
                corrupt_tags = report.corrupt_tags,
                "block cache recovery dropped data that may have been dirty; \
                 the write verifier changes so clients resend uncommitted writes"
            );
        }
        let verifier = match old_verifiers.as_slice() {
            [v] if !change => *v,
            _ => new_verifier(&old_verifiers),
        };
        report.verifier_changed = !report.new_cache && change;
        // New headers, then a sync: repairs become durable, then recovered
        // dirty data is recorded as committed (it is on disk now).
        for b in 0..inner.banks.len() {
            let mut h = Header::new(&geometry, b as u32, verifier, max_epoch + 1);
            h.shutdown = Shutdown::Open;
            h.sync = SyncState::Synced;
            inner.write_header(b, h)?;
        }
        inner.sync()?;
        if report.verifier_changed {
            tracing::warn!(?report, "block cache opened with a new write verifier");
        } else {
            tracing::info!(?report, "block cache opened");
        }
        Ok((
            BlockStore {
                inner: Mutex::new(inner),
                _dir_lock: None,
            },
            report,
        ))
    }

    fn lock(&self) -> Result<MutexGuard<'_, Inner>> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if g.poisoned {
            return Err(Error::Poisoned);
        }
        Ok(g)
    }

    /// Runs a mutating operation; an I/O error poisons the store because
    /// memory and disk may disagree afterwards (reopen to recover).
    fn mutate<T>(&self, op: impl FnOnce(&mut Inner) -> Result<T>) -> Result<T> {
        let mut g = self.lock()?;
        if g.closed {
            return Err(Error::Closed);
        }
        let r = op(&mut g);
        if let Err(Error::Io { .. }) = &r {
            g.poisoned = true;
        }
        r
    }

    /// The geometry.
    pub fn geometry(&self) -> Geometry {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).geo
    }

    /// The persistent write verifier (RFC 1813 `writeverf3`) to return from
    /// COMMIT and UNSTABLE WRITEs of data cached dirty.
    pub fn verifier(&self) -> [u8; 8] {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.banks
            .first()
            .map(|b| b.header.verifier)
            .unwrap_or_default()
    }

    /// Reads `len` bytes at `offset` of block `block` of `fh`: `Some` only if
    /// every sub-block the range touches is valid. Touches the LRU stamp.
    pub fn read(&self, fh: &[u8], block: u64, offset: u32, len: u32) -> Result<Option<Vec<u8>>> {
        let mut buf = vec![0u8; len as usize];
        Ok(self.read_into(fh, block, offset, &mut buf)?.then_some(buf))
    }

    /// [`read`](Self::read) into `buf` (`buf.len()` bytes at `offset` of the
    /// block), with no allocation: true on a hit; on a miss `buf` is left
    /// as it was.
    pub fn read_into(&self, fh: &[u8], block: u64, offset: u32, buf: &mut [u8]) -> Result<bool> {
        self.mutate(|inner| inner.read_into(fh, block, offset, buf))
    }

    /// Reads the file range `offset..offset + buf.len()` of `fh` into `buf`,
    /// block by block, and says per block touched (the first is
    /// `offset / block_size`) whether it was a hit. The part of `buf` that
    /// belongs to a missed block is left as it was, for the caller to fill.
    /// The store is locked per block, so concurrent readers interleave.
    pub fn read_range_into(&self, fh: &[u8], offset: u64, buf: &mut [u8]) -> Result<Vec<bool>> {
        let bs = u64::from(self.geometry().block_size());
        let end = offset + buf.len() as u64;
        let mut hits = Vec::new();
        let mut pos = offset;
        while pos < end {
            let block = pos / bs;
            let hi = end.min((block + 1) * bs);
            let dst = &mut buf[(pos - offset) as usize..(hi - offset) as usize];
            hits.push(self.read_into(fh, block, (pos - block * bs) as u32, dst)?);
            pos = hi;
        }
        Ok(hits)
    }

    /// The part of [`read_range_into`](Self::read_range_into) that needs no
    /// waiting, for an async thread: reads the range's blocks in order, from
    /// the first, while each is a hit whose bytes are in memory (see
    /// [`Storage::read_at_nowait`]) and the store is not locked by another
    /// thread. Returns how many blocks it read; the part of `buf` that
    /// belongs to the next block is then unspecified (nothing is counted
    /// for it), for `read_range_into` to do the rest.
    pub fn read_range_now(&self, fh: &[u8], offset: u64, buf: &mut [u8]) -> Result<usize> {
        let end = offset + buf.len() as u64;
        let mut done = 0;
        let mut pos = offset;
        while pos < end {
            let Some(mut g) = self.try_lock()? else {
                break;
            };
            let bs = u64::from(g.geo.block_size());
            let block = pos / bs;
            let hi = end.min((block + 1) * bs);
            let dst = &mut buf[(pos - offset) as usize..(hi - offset) as usize];
            if !g.read_into_now(fh, block, (pos - block * bs) as u32, dst)? {
                break;
            }
            done += 1;
            pos = hi;
        }
        Ok(done)
    }

    /// Whether every block in `blocks` is cached whole; `None` if the store
    /// is locked by another thread (ask [`valid_sub_blocks`](Self::valid_sub_blocks)
    /// from a blocking thread instead). Never waits.
    pub fn all_cached_now(&self, fh: &[u8], blocks: Range<u64>) -> Result<Option<bool>> {
        let Some(g) = self.try_lock()? else {
            return Ok(None);
        };
        let n = g.geo.sub_blocks_per_block();
        Ok(Some(blocks.into_iter().all(|b| {
            g.lookup(fh, b)
                .is_some_and(|id| g.frames[id].valid.count() >= n)
        })))
    }

    /// [`lock`](Self::lock) if no other thread holds the lock.
    fn try_lock(&self) -> Result<Option<MutexGuard<'_, Inner>>> {
        let g = match self.inner.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return Ok(None),
        };
        if g.poisoned {
            return Err(Error::Poisoned);
        }
        Ok(Some(g))
    }

    /// Which sub-blocks of a block are valid (empty if not cached).
    pub fn valid_sub_blocks(&self, fh: &[u8], block: u64) -> Result<SubBlockMask> {
        let g = self.lock()?;
        Ok(g.lookup(fh, block)
            .map(|id| g.frames[id].valid)
            .unwrap_or_default())
    }

    /// Writes `data` at `offset` of block `block` of `fh`. See the module
    /// docs for the partial sub-block rule.
    pub fn write(
        &self,
        fh: &[u8],
        block: u64,
        offset: u32,
        data: &[u8],
        mode: WriteMode,
    ) -> Result<WriteOutcome> {
        check_fh(fh)?;
        self.mutate(|inner| inner.write(fh, block, offset, data, mode))
    }

    /// [`write`](Self::write) if `still()` holds, asked under the store's
    /// lock, so nothing the caller orders around that lock (a truncation,
    /// a write-back marking blocks clean) comes between the check and the
    /// write. `None` when it did not hold.
    pub fn write_if(
        &self,
        fh: &[u8],
        block: u64,
        offset: u32,
        data: &[u8],
        mode: WriteMode,
        still: impl FnOnce() -> bool,
    ) -> Result<Option<WriteOutcome>> {
        check_fh(fh)?;
        self.mutate(|inner| {
            if !still() {
                return Ok(None);
            }
            inner.write(fh, block, offset, data, mode).map(Some)
        })
    }

    /// Blocks holding dirty data, of one file or all, in (file handle,
    /// block) order so the layer can coalesce neighbours into large WRITEs.
    pub fn dirty_blocks(&self, fh: Option<&[u8]>) -> Result<Vec<DirtyBlock>> {
        let g = self.lock()?;
        let mut out = Vec::new();
        let mut push = |blocks: &BTreeMap<u64, usize>| {
            for &id in blocks.values() {
                if !g.frames[id].dirty.is_empty() {
                    out.push(g.dirty_block(id));
                }
            }
        };
        match fh {
            Some(fh) => {
                if let Some(b) = g.index.get(fh) {
                    push(b)
                }
            }
            None => g.index.values().for_each(push),
        }
        Ok(out)
    }

    /// The dirty bytes of one block (`None` if it has none), to write
    /// upstream. Syncs first if dirty writes are unsynced, so upstream never
    /// gets data a crash could take back from the cache.
    pub fn dirty_data(&self, fh: &[u8], block: u64) -> Result<Option<DirtyData>> {
        self.mutate(|inner| inner.dirty_data(fh, block, true))
    }

    /// The dirty bytes of one block as they are now, without syncing: what
    /// to lay over upstream's bytes to read a block the cache holds only in
    /// part. Not for write-back (use [`dirty_data`](Self::dirty_data)).
    pub fn dirty_overlay(&self, fh: &[u8], block: u64) -> Result<Option<DirtyData>> {
        self.mutate(|inner| inner.dirty_data(fh, block, false))
    }

    /// Marks the sub-blocks of `written` clean after it reached upstream
    /// (and was committed there). Sub-blocks dirtied again since `written`
    /// was taken stay dirty, and partial sub-blocks written back are
    /// forgotten (the cache holds no more of them). Not durable by itself,
    /// except when it forgets a partial sub-block; a crash before the next
    /// sync only makes the block dirty again (written back twice, harmless).
    pub fn mark_clean(&self, written: &DirtyData) -> Result<()> {
        self.mutate(|inner| inner.mark_clean(written))
    }

    /// Drops cached data of `fh` (e.g. its upstream attributes changed):
    /// clean sub-blocks only, or dirty ones too if `force`. Durable before
    /// it returns. Returns the number of bytes dropped.
    pub fn invalidate(&self, fh: &[u8], force: bool) -> Result<u64> {
        self.mutate(|inner| inner.invalidate(fh, force))
    }

    /// Drops everything of `fh` past `new_size`, dirty data included, and
    /// zeroes the tail of a valid sub-block straddling it. Durable before it
    /// returns.
    pub fn truncate(&self, fh: &[u8], new_size: u64) -> Result<()> {
        self.mutate(|inner| inner.truncate(fh, new_size))
    }

    /// Makes every write so far durable (fsync data and tags, record
    /// committed bits, headers "synced", fsync). What COMMIT calls.
    pub fn sync(&self) -> Result<()> {
        self.mutate(|inner| inner.sync())
    }

    /// Counters and gauges. Gauges scan the index (cheap next to any I/O).
    pub fn stats(&self) -> CacheStats {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut s = g.stats.clone();
        let sbs = u64::from(g.geo.sub_block_size());
        for f in g.frames.iter().filter(|f| !f.is_empty()) {
            s.frames_in_use += 1;
            s.cached_bytes += u64::from(f.valid.count()) * sbs;
            let dirty: u32 = f
                .dirty_ranges(g.geo.sub_block_size())
                .iter()
                .map(|r| r.end - r.start)
                .sum();
            s.dirty_bytes += u64::from(dirty);
        }
        s
    }

    /// Drops every clean cached sub-block of every file (what a flush does
    /// after writing dirty data back). Durable before it returns. Returns
    /// the number of bytes dropped.
    pub fn drop_clean(&self) -> Result<u64> {
        self.mutate(|inner| {
            let ids: Vec<usize> = inner
                .index
                .values()
                .flat_map(|m| m.values().copied())
                .collect();
            let mut dropped = 0;
            for id in ids {
                let f = &inner.frames[id];
                let drop = f.valid.without(f.dirty);
                dropped += inner.drop_sub_blocks(id, drop)?;
            }
            inner.sync()?;
            Ok(dropped)
        })
    }

    /// Whether any block of `fh` is cached (clean or dirty).
    pub fn has_file(&self, fh: &[u8]) -> Result<bool> {
        Ok(self.lock()?.index.contains_key(fh))
    }

    /// Number of files with at least one cached block.
    pub fn cached_files(&self) -> Result<usize> {
        Ok(self.lock()?.index.len())
    }

    /// Syncs and records a clean shutdown, so the next open skips verifying
    /// data. Dirty data stays cached for the next session.
    pub fn close(self) -> Result<()> {
        self.close_shared()
    }

    /// [`close`](Self::close) for a store shared behind an `Arc`. The caller
    /// must not write to the store afterwards: the banks are marked closed
    /// cleanly, so a later write would go unverified on the next open.
    pub fn close_shared(&self) -> Result<()> {
        if self.lock()?.closed {
            return Ok(());
        }
        self.mutate(|inner| {
            inner.sync()?;
            for b in 0..inner.banks.len() {
                let mut h = inner.banks[b].header;
                h.shutdown = Shutdown::Clean;
                inner.write_header(b, h)?;
            }
            inner.fsync_all()?;
            inner.closed = true;
            Ok(())
        })
    }
}

/// What a write does to one sub-block it touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Covered whole: the data replaces it.
    Whole,
    /// Valid and partly covered: read, update, write.
    Update,
    /// A clean fill covering a partial sub-block: upstream's bytes around
    /// the extent, which is kept.
    Merge,
    /// Not cached, partly covered by a dirty write: becomes partial with
    /// this extent.
    Extent(u32, u32),
    /// Partial, and the dirty write overlaps or touches its extent: the
    /// extent grows to this.
    Grow(u32, u32),
}

impl Inner {
    fn ways(&self) -> usize {
        self.geo.ways() as usize
    }

    /// Bank and frame-in-bank of a global frame id (`set * ways + way`).
    fn locate(&self, id: usize) -> (usize, u64) {
        let ways = self.ways();
        let (bank, local) = self.geo.bank_of_set((id / ways) as u64);
        (bank as usize, local * ways as u64 + (id % ways) as u64)
    }

    fn data_pos(&self, id: usize, sub_block: u32) -> (usize, u64) {
        let (b, f) = self.locate(id);
        let off = self.layout.data_offset(f) + u64::from(sub_block * self.geo.sub_block_size());
        (b, off)
    }

    fn lookup(&self, fh: &[u8], block: u64) -> Option<usize> {
        self.index.get(fh)?.get(&block).copied()
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn check_range(&self, offset: u32, len: usize) -> Result<()> {
        let bs = self.geo.block_size();
        if u64::from(offset) + len as u64 > u64::from(bs) {
            return Err(Error::RangeOutsideBlock {
                offset,
                len,
                block_size: bs,
            });
        }
        Ok(())
    }

    fn write_header(&mut self, b: usize, h: Header) -> Result<()> {
        self.banks[b]
            .storage
            .write_at(&h.encode(), 0)
            .ctx("writing a bank header")?;
        self.banks[b].header = h;
        self.banks[b].unsynced_io = true;
        Ok(())
    }

    fn fsync_all(&mut self) -> Result<()> {
        for bank in self.banks.iter_mut().filter(|b| b.unsynced_io) {
            bank.storage.sync().ctx("syncing a bank")?;
            bank.unsynced_io = false;
        }
        Ok(())
    }

    /// Writes frame `id`'s tag into its scratch slot (never the durable one).
    fn write_tag(&mut self, id: usize) -> Result<()> {
        let (b, f) = self.locate(id);
        let mut buf = vec![0u8; self.layout.tag_len];
        let frame = &mut self.frames[id];
        frame.generation += 1;
        let slot = 1 - frame.durable_slot;
        let (fh, block) = match &frame.key {
            Some((fh, block)) => (fh.as_bytes().to_vec(), *block),
            None => (Vec::new(), 0),
        };
        Tag {
            fh,
            block,
            lru: frame.lru,
            generation: frame.generation,
            dirty_end: frame.dirty_end,
            valid: frame.valid,
            dirty: frame.dirty,
            committed: frame.committed,
            partial: frame.partial,
            crcs: frame.crcs.clone(),
            extents: frame.extents.clone(),
        }
        .encode(&self.layout, &mut buf);
        frame.written_slot = Some(slot);
        let off = self.layout.tag_offset(f, slot);
        self.banks[b]
            .storage
            .write_at(&buf, off)
            .ctx("writing a tag")?;
        self.banks[b].unsynced_io = true;
        self.touched.insert(id);
        Ok(())
    }

    /// After an fsync: the slots written since become the durable ones.
    fn promote(&mut self, ids: &BTreeSet<usize>) {
        for &id in ids {
            let f = &mut self.frames[id];
            if let Some(s) = f.written_slot.take() {
                f.durable_slot = s;
            }
        }
    }

    /// Rebuilds the index from one bank's tag table.
    fn recover_bank(&mut self, b: usize, verify: bool, report: &mut RecoveryReport) -> Result<()> {
        let frames = self.layout.frames;
        let tag_len = self.layout.tag_len;
        let ways = self.ways() as u64;
        let sets_per_bank = self.geo.sets_per_bank();
        let sbs = self.geo.sub_block_size() as usize;
        const CHUNK: u64 = 1024;
        let mut table = Vec::new();
        let mut block_buf = vec![0u8; self.geo.block_size() as usize];
        for chunk_start in (0..frames).step_by(CHUNK as usize) {
            let n = CHUNK.min(frames - chunk_start);
            table.resize(2 * n as usize * tag_len, 0);
            self.banks[b]
                .storage
                .read_at(&mut table, self.layout.tag_offset(chunk_start, 0))
                .ctx("reading a tag table")?;
            for i in 0..n as usize {
                let fib = chunk_start + i as u64;
                let id = ((b as u64 * sets_per_bank + fib / ways) * ways + fib % ways) as usize;
                let slots = [
                    Tag::decode(&self.layout, &table[2 * i * tag_len..(2 * i + 1) * tag_len]),
                    Tag::decode(
                        &self.layout,
                        &table[(2 * i + 1) * tag_len..(2 * i + 2) * tag_len],
                    ),
                ];
                let newest = match (&slots[0], &slots[1]) {
                    (Ok(a), Ok(b)) => u8::from(b.generation > a.generation),
                    (Ok(_), _) => 0,
                    (_, Ok(_)) => 1,
                    (Err(TagError::Empty), Err(TagError::Empty)) => continue,
                    (Err(TagError::Corrupt), Err(TagError::Corrupt)) => {
                        // Both copies bad: whatever was durable here is lost.
                        report.corrupt_tags += 1;
                        self.frames[id].durable_slot = 0;
                        self.write_tag(id)?;
                        continue;
                    }
                    // A torn first tag write next to a never-written slot:
                    // nothing durable was ever here.
                    _ => {
                        report.torn_tag_writes += 1;
                        let corrupt =
                            u8::from(slots[1].is_err() && slots[1] != Err(TagError::Empty));
                        self.frames[id].durable_slot = 1 - corrupt;
                        self.write_tag(id)?;
                        continue;
                    }
                };
                if slots[usize::from(1 - newest)] == Err(TagError::Corrupt) {
                    report.torn_tag_writes += 1;
                }
                let Ok(mut tag) = slots[usize::from(newest)].clone() else {
                    continue;
                };
                let older = slots[usize::from(1 - newest)].clone().ok();
                // Only the current copy's committed bits count: an older
                // copy's may have been cleared by a durable mark_clean
                // before the frame was reused.
                let committed = tag.committed;
                {
                    let f = &mut self.frames[id];
                    f.generation = tag.generation;
                    f.durable_slot = newest;
                }
                if tag.valid.is_empty() && tag.partial.is_empty() {
                    continue;
                }
                let set = self.geo.set_index(&tag.fh, tag.block);
                if set as usize != id / ways as usize {
                    report.corrupt_tags += 1;
                    self.write_tag(id)?;
                    continue;
                }
                let mut changed = false;
                if verify {
                    let (bank, off) = self.data_pos(id, 0);
                    self.banks[bank]
                        .storage
                        .read_at(&mut block_buf, off)
                        .ctx("reading frame data")?;
                    for sb in tag.valid.or(tag.partial).iter().collect::<Vec<_>>() {
                        let i = sb as usize;
                        let (a, b) = if tag.partial.contains(sb) {
                            let (a, b) = tag.extents[i];
                            (a as usize, b as usize)
                        } else {
                            (0, sbs)
                        };
                        let crc = crc32fast::hash(&block_buf[i * sbs + a..i * sbs + b]);
                        if crc == tag.crcs[i] {
                            continue;
                        }
                        changed = true;
                        // A committed partial sub-block made whole since
                        // its commit (a clean fill merged around it; such a
                        // tag does not claim the whole as committed) whose
                        // data did not all land: the older tag names the
                        // committed extent. While the sub-block is still
                        // dirty the frame has not been reused (that takes a
                        // write-back, then a sync, see "No resurrection"),
                        // so whatever differs in the extent can only come
                        // from an in-flight overwrite the client resends, as
                        // below; the bytes around it go.
                        let committed_extent = older
                            .as_ref()
                            .filter(|o| {
                                o.fh == tag.fh
                                    && o.block == tag.block
                                    && o.partial.contains(sb)
                                    && o.committed.contains(sb)
                                    && tag.dirty.contains(sb)
                                    && !tag.partial.contains(sb)
                            })
                            .map(|o| o.extents[i]);
                        if committed.contains(sb) {
                            // Committed whole: its mismatch is an in-flight
                            // overwrite's, which the client resends.
                            report.torn_committed_kept += 1;
                            tag.crcs[i] = crc;
                            tag.dirty.insert(sb);
                            tag.committed.insert(sb);
                        } else if let Some((a, b)) = committed_extent {
                            report.torn_committed_kept += 1;
                            tag.valid.remove(sb);
                            tag.partial.insert(sb);
                            tag.dirty.insert(sb);
                            tag.committed.insert(sb);
                            tag.extents[i] = (a, b);
                            tag.crcs[i] = crc32fast::hash(
                                &block_buf[i * sbs + a as usize..i * sbs + b as usize],
                            );
                        } else {
                            if tag.dirty.contains(sb) {
                                report.dirty_sub_blocks_lost += 1;
                            } else {
                                report.clean_sub_blocks_dropped += 1;
                            }
                            tag.valid.remove(sb);
                            tag.dirty.remove(sb);
                            tag.committed.remove(sb);
                            tag.partial.remove(sb);
                            tag.extents[i] = (0, 0);
                        }
                    }
                }
                for (i, c) in tag.crcs.iter_mut().enumerate() {
                    if !tag.valid.or(tag.partial).contains(i as u32) {
                        *c = 0;
                    }
                }
                if tag.dirty.is_empty() {
                    tag.dirty_end = 0;
                }
                // Two tags for one block (cannot happen unless corrupt): keep
                // the more recently used.
                if let Some(other) = self.lookup(&tag.fh, tag.block) {
                    report.corrupt_tags += 1;
                    if self.frames[other].lru >= tag.lru {
                        self.write_tag(id)?;
                        continue;
                    }
                    if let Some((fh, block)) = self.frames[other].key.take() {
                        self.unindex(&fh, block);
                    }
                    self.frames[other].clear();
                    self.write_tag(other)?;
                    report.frames_recovered -= 1;
                }
                self.clock = self.clock.max(tag.lru + 1);
                if tag.valid.is_empty() && tag.partial.is_empty() {
                    self.write_tag(id)?;
                    continue;
                }
                let fh = FileHandle::from_checked(&tag.fh);
                let f = &mut self.frames[id];
                f.key = Some((fh.clone(), tag.block));
                f.valid = tag.valid;
                f.dirty = tag.dirty;
                f.committed = tag.committed;
                f.partial = tag.partial;
                f.extents = tag.extents;
                f.dirty_end = tag.dirty_end;
                f.durable_committed = committed;
                f.crcs = tag.crcs;
                f.lru = tag.lru;
                self.index.entry(fh).or_default().insert(tag.block, id);
                report.frames_recovered += 1;
                if changed || f.committed != f.dirty {
                    self.write_tag(id)?;
                }
            }
        }
        report.dirty_frames_recovered =
            self.frames.iter().filter(|f| !f.dirty.is_empty()).count() as u64;
        Ok(())
    }

    /// Where the `len` bytes at `offset` of a cached block are, as (frame,
    /// bank, position in the bank): `None` unless every sub-block they touch
    /// is valid. `len` must be within the block and not 0.
    fn hit_at(
        &self,
        fh: &[u8],
        block: u64,
        offset: u32,
        len: usize,
    ) -> Option<(usize, usize, u64)> {
        let id = self.lookup(fh, block)?;
        let need = SubBlockMask::range(self.geo.sub_blocks_touched(offset, len as u32));
        if !self.frames[id].valid.contains_all(need) {
            return None;
        }
        let (b, base) = self.data_pos(id, 0);
        Some((id, b, base + u64::from(offset)))
    }

    fn count_hit(&mut self, id: usize, len: usize) {
        let now = self.tick();
        self.frames[id].lru = now;
        self.stats.hits += 1;
        self.stats.hit_bytes += len as u64;
    }

    fn read_into(&mut self, fh: &[u8], block: u64, offset: u32, buf: &mut [u8]) -> Result<bool> {
        self.check_range(offset, buf.len())?;
        if buf.is_empty() {
            let hit = self.lookup(fh, block).is_some();
            if !hit {
                self.stats.misses += 1;
            }
            return Ok(hit);
        }
        let Some((id, b, pos)) = self.hit_at(fh, block, offset, buf.len()) else {
            self.stats.misses += 1;
            return Ok(false);
        };
        self.banks[b]
            .storage
            .read_at(buf, pos)
            .ctx("reading cached data")?;
        self.count_hit(id, buf.len());
        Ok(true)
    }

    /// [`read_into`](Self::read_into) of a hit whose bytes are in memory;
    /// false (nothing counted, `buf` unspecified) otherwise.
    fn read_into_now(
        &mut self,
        fh: &[u8],
        block: u64,
        offset: u32,
        buf: &mut [u8],
    ) -> Result<bool> {
        self.check_range(offset, buf.len())?;
        if buf.is_empty() {
            return Ok(self.lookup(fh, block).is_some());
        }
        let Some((id, b, pos)) = self.hit_at(fh, block, offset, buf.len()) else {
            return Ok(false);
        };
        if !self.banks[b].storage.read_at_nowait(buf, pos) {
            return Ok(false);
        }
        self.count_hit(id, buf.len());
        Ok(true)
    }

    fn dirty_block(&self, id: usize) -> DirtyBlock {
        let f = &self.frames[id];
        let sbs = self.geo.sub_block_size();
        let (fh, block) = f.key.clone().unwrap_or((FileHandle::from_checked(&[]), 0));
        DirtyBlock {
            fh,
            block,
            ranges: f.dirty_ranges(sbs),
        }
    }

    /// Finds a frame for a block not cached: `Err(victim)` if the set is all
    /// dirty.
    fn allocate(&mut self, fh: &[u8], block: u64) -> Result<Result<usize, DirtyBlock>> {
        let ways = self.ways();
        let base = self.geo.set_index(fh, block) as usize * ways;
        let id = match choose_victim(&self.frames[base..base + ways]) {
            Victim::Empty(w) => base + w,
            Victim::Clean(w) => base + w,
            Victim::CleanAfterSync(w) => {
                self.sync()?;
                base + w
            }
            Victim::AllDirty(w) => {
                self.stats.write_backs_needed += 1;
                return Ok(Err(self.dirty_block(base + w)));
            }
        };
        if let Some((old_fh, old_block)) = self.frames[id].key.take() {
            self.unindex(&old_fh, old_block);
            self.stats.evictions += 1;
        }
        self.frames[id].clear();
        let fh = FileHandle::from_checked(fh);
        self.frames[id].key = Some((fh.clone(), block));
        self.index.entry(fh).or_default().insert(block, id);
        Ok(Ok(id))
    }

    fn unindex(&mut self, fh: &FileHandle, block: u64) {
        if let Some(m) = self.index.get_mut(fh.as_bytes()) {
            m.remove(&block);
            if m.is_empty() {
                self.index.remove(fh.as_bytes());
            }
        }
    }

    /// Durably flags bank `b` as holding unsynced dirty writes (a barrier
    /// before the first such write).
    fn flag_unsynced(&mut self, b: usize) -> Result<()> {
        if self.banks[b].header.sync == SyncState::DirtyUnsynced {
            return Ok(());
        }
        let mut h = self.banks[b].header;
        h.sync = SyncState::DirtyUnsynced;
        self.write_header(b, h)?;
        self.banks[b].storage.sync().ctx("syncing a bank header")?;
        self.banks[b].unsynced_io = false;
        Ok(())
    }

    fn write(
        &mut self,
        fh: &[u8],
        block: u64,
        offset: u32,
        data: &[u8],
        mode: WriteMode,
    ) -> Result<WriteOutcome> {
        self.check_range(offset, data.len())?;
        if data.is_empty() {
            return Ok(WriteOutcome::Stored);
        }
        let len = data.len() as u32;
        let sbs = self.geo.sub_block_size();
        let existing = self.lookup(fh, block);
        let (valid, dirty, partial) = existing
            .map(|id| {
                let f = &self.frames[id];
                (f.valid, f.dirty, f.partial)
            })
            .unwrap_or_default();
        let mut plan: Vec<(u32, Step)> = Vec::new();
        for sb in self.geo.sub_blocks_touched(offset, len) {
            let lo = offset.max(sb * sbs) - sb * sbs;
            let hi = (offset + len).min((sb + 1) * sbs) - sb * sbs;
            let full = lo == 0 && hi == sbs;
            let step = match mode {
                WriteMode::Clean if partial.contains(sb) && full => Step::Merge,
                WriteMode::Clean if dirty.contains(sb) => continue,
                WriteMode::Clean | WriteMode::Dirty if full => Step::Whole,
                _ if valid.contains(sb) => Step::Update,
                WriteMode::Clean => continue,
                WriteMode::Dirty if partial.contains(sb) => {
                    let (a, b) = existing
                        .map(|id| self.frames[id].extents[sb as usize])
                        .unwrap_or_default();
                    if lo > b || hi < a {
                        return Err(Error::PartialSubBlockWrite { sub_block: sb });
                    }
                    Step::Grow(a.min(lo), b.max(hi))
                }
                WriteMode::Dirty => Step::Extent(lo, hi),
            };
            plan.push((sb, step));
        }
        if plan.is_empty() {
            return Ok(WriteOutcome::Stored);
        }
        let id = match existing {
            Some(id) => id,
            None => match self.allocate(fh, block)? {
                Ok(id) => id,
                Err(victim) => return Ok(WriteOutcome::NeedsWriteBack(victim)),
            },
        };
        let (bank, _) = self.locate(id);
        if mode == WriteMode::Dirty {
            self.flag_unsynced(bank)?;
            self.seq += 1;
        }
        // Write each run of consecutive planned sub-blocks with one call.
        let sbu = sbs as usize;
        let mut i = 0;
        while i < plan.len() {
            let mut j = i + 1;
            while j < plan.len() && plan[j].0 == plan[j - 1].0 + 1 {
                j += 1;
            }
            let first = plan[i].0;
            let run_start = first * sbs;
            let mut buf = vec![0u8; (j - i) * sbu];
            let (b, pos) = self.data_pos(id, first);
            // Bytes a merge keeps: (position in `buf`, the extent's bytes).
            let mut kept: Vec<(usize, Vec<u8>)> = Vec::new();
            for &(sb, step) in &plan[i..j] {
                let at = ((sb - first) * sbs) as usize;
                if matches!(step, Step::Update | Step::Merge | Step::Grow(..)) {
                    let (_, sb_pos) = self.data_pos(id, sb);
                    self.banks[b]
                        .storage
                        .read_at(&mut buf[at..at + sbu], sb_pos)
                        .ctx("reading a sub-block to update")?;
                }
                if step == Step::Merge {
                    let (x, y) = self.frames[id].extents[sb as usize];
                    let (x, y) = (at + x as usize, at + y as usize);
                    kept.push((x, buf[x..y].to_vec()));
                }
            }
            let run_end = run_start + buf.len() as u32;
            let lo = offset.max(run_start);
            let hi = (offset + len).min(run_end);
            buf[(lo - run_start) as usize..(hi - run_start) as usize]
                .copy_from_slice(&data[(lo - offset) as usize..(hi - offset) as usize]);
            for (x, bytes) in kept {
                buf[x..x + bytes.len()].copy_from_slice(&bytes);
            }
            self.banks[b]
                .storage
                .write_at(&buf, pos)
                .ctx("writing data")?;
            self.banks[b].unsynced_io = true;
            let seq = self.seq;
            let f = &mut self.frames[id];
            for (k, &(sb, step)) in plan[i..j].iter().enumerate() {
                let chunk = &buf[k * sbu..(k + 1) * sbu];
                let s = sb as usize;
                match step {
                    Step::Extent(x, y) | Step::Grow(x, y) => {
                        f.crcs[s] = crc32fast::hash(&chunk[x as usize..y as usize]);
                        f.partial.insert(sb);
                        f.extents[s] = (x, y);
                    }
                    Step::Whole | Step::Update | Step::Merge => {
                        f.crcs[s] = crc32fast::hash(chunk);
                        f.valid.insert(sb);
                        f.partial.remove(sb);
                        f.extents[s] = (0, 0);
                        if step == Step::Merge {
                            // Only the extent was committed, not the bytes
                            // merged around it: until a sync, the tag must
                            // not claim the whole sub-block (recovery then
                            // goes back to the extent the older tag names).
                            f.committed.remove(sb);
                        }
                    }
                }
                if mode == WriteMode::Dirty {
                    f.dirty.insert(sb);
                    f.dirty_seq[s] = seq;
                }
            }
            i = j;
        }
        let now = self.tick();
        let f = &mut self.frames[id];
        f.lru = now;
        if mode == WriteMode::Dirty {
            f.dirty_end = f.dirty_end.max(offset + len);
        }
        self.write_tag(id)?;
        Ok(WriteOutcome::Stored)
    }

    fn dirty_data(&mut self, fh: &[u8], block: u64, sync: bool) -> Result<Option<DirtyData>> {
        let Some(id) = self.lookup(fh, block) else {
            return Ok(None);
        };
        if self.frames[id].dirty.is_empty() {
            return Ok(None);
        }
        if sync
            && self
                .banks
                .iter()
                .any(|b| b.header.sync == SyncState::DirtyUnsynced)
        {
            self.sync()?;
        }
        let sbs = self.geo.sub_block_size();
        let (b, base) = self.data_pos(id, 0);
        let mut extents = Vec::new();
        for r in self.frames[id].dirty_ranges(sbs) {
            let mut data = vec![0u8; (r.end - r.start) as usize];
            self.banks[b]
                .storage
                .read_at(&mut data, base + u64::from(r.start))
                .ctx("reading dirty data")?;
            extents.push(DirtyExtent {
                offset: r.start,
                data,
            });
        }
        let end = self.frames[id].dirty_end;
        let (fh, block) = self.frames[id]
            .key
            .clone()
            .unwrap_or((FileHandle::from_checked(fh), block));
        Ok(Some(DirtyData {
            fh,
            block,
            extents,
            end,
            seq: self.seq,
        }))
    }

    fn mark_clean(&mut self, written: &DirtyData) -> Result<()> {
        let Some(id) = self.lookup(written.fh.as_bytes(), written.block) else {
            return Ok(());
        };
        let sbs = self.geo.sub_block_size();
        let f = &self.frames[id];
        let mut clean = SubBlockMask::EMPTY;
        for e in &written.extents {
            let end = e.offset.saturating_add(e.data.len() as u32);
            for sb in e.offset / sbs..end.div_ceil(sbs) {
                if f.dirty.contains(sb) && f.dirty_seq[sb as usize] <= written.seq {
                    clean.insert(sb);
                }
            }
        }
        if clean.is_empty() {
            return Ok(());
        }
        // A partial sub-block written back is upstream's now, and the cache
        // holds none of it beyond what it wrote: forget it.
        let forgotten = f.partial.and(clean);
        self.forget(id, forgotten, clean)?;
        if !forgotten.is_empty() {
            // The durable tag still claims the forgotten extent as committed
            // dirty data; a later write may reuse its bytes, so make the
            // forgetting durable first (once or twice per file: partial
            // sub-blocks are at the edges of writes).
            self.sync()?;
        }
        Ok(())
    }

    /// Drops `drop` sub-blocks of frame `id` (and the frame if none is left).
    fn drop_sub_blocks(&mut self, id: usize, drop: SubBlockMask) -> Result<u64> {
        let f = &self.frames[id];
        let drop = drop.and(f.valid.or(f.partial));
        if drop.is_empty() {
            return Ok(0);
        }
        let sbs = self.geo.sub_block_size();
        let bytes: u64 = drop
            .iter()
            .map(|sb| {
                let (a, b) = f.extents[sb as usize];
                u64::from(if f.partial.contains(sb) { b - a } else { sbs })
            })
            .sum();
        self.forget(id, drop, drop)?;
        Ok(bytes)
    }

    /// Frame `id` no longer holds the bytes of `gone` and no longer has
    /// `undirty` dirty; the frame is emptied when nothing is left. Writes the
    /// tag.
    fn forget(&mut self, id: usize, gone: SubBlockMask, undirty: SubBlockMask) -> Result<()> {
        let f = &mut self.frames[id];
        for sb in gone.iter() {
            f.crcs[sb as usize] = 0;
            f.extents[sb as usize] = (0, 0);
        }
        f.valid = f.valid.without(gone);
        f.partial = f.partial.without(gone);
        f.dirty = f.dirty.without(undirty.or(gone));
        f.committed = f.committed.and(f.dirty);
        if f.dirty.is_empty() {
            f.dirty_end = 0;
        }
        if f.holds_nothing() {
            if let Some((fh, block)) = f.key.take() {
                self.unindex(&fh, block);
            }
            self.frames[id].clear();
        }
        self.write_tag(id)
    }

    fn invalidate(&mut self, fh: &[u8], force: bool) -> Result<u64> {
        let ids: Vec<usize> = self
            .index
            .get(fh)
            .map(|m| m.values().copied().collect())
            .unwrap_or_default();
        let mut dropped = 0;
        for id in ids {
            let f = &self.frames[id];
            let drop = if force {
                f.valid.or(f.partial)
            } else {
                f.valid.without(f.dirty)
            };
            dropped += self.drop_sub_blocks(id, drop)?;
        }
        // Always sync: an eviction not yet durable could otherwise bring
        // back a stale copy of this file's data after a crash.
        self.sync()?;
        Ok(dropped)
    }

    fn truncate(&mut self, fh: &[u8], new_size: u64) -> Result<()> {
        let bs = u64::from(self.geo.block_size());
        let sbs = self.geo.sub_block_size();
        let n = self.geo.sub_blocks_per_block();
        let blocks: Vec<(u64, usize)> = self
            .index
            .get(fh)
            .map(|m| m.range(new_size / bs..).map(|(&b, &id)| (b, id)).collect())
            .unwrap_or_default();
        for (block, id) in blocks {
            let start = block * bs;
            if start >= new_size {
                self.drop_sub_blocks(id, SubBlockMask::range(0..n))?;
                continue;
            }
            // new_size - start < bs here, so it fits in u32.
            let cut = (new_size - start) as u32;
            let keep = cut.div_ceil(sbs);
            self.drop_sub_blocks(id, SubBlockMask::range(keep..n))?;
            let straddling = cut / sbs;
            let from = cut % sbs;
            let f = &self.frames[id];
            if from != 0 && f.partial.contains(straddling) {
                let (a, b) = f.extents[straddling as usize];
                if a >= from {
                    self.drop_sub_blocks(id, SubBlockMask::range(straddling..straddling + 1))?;
                } else if b > from {
                    let (bk, pos) = self.data_pos(id, straddling);
                    let mut buf = vec![0u8; (from - a) as usize];
                    self.banks[bk]
                        .storage
                        .read_at(&mut buf, pos + u64::from(a))
                        .ctx("reading a sub-block to truncate")?;
                    let f = &mut self.frames[id];
                    f.extents[straddling as usize] = (a, from);
                    f.crcs[straddling as usize] = crc32fast::hash(&buf);
                    self.write_tag(id)?;
                }
            } else if from != 0 && f.valid.contains(straddling) {
                let (b, pos) = self.data_pos(id, straddling);
                let mut buf = vec![0u8; sbs as usize];
                self.banks[b]
                    .storage
                    .read_at(&mut buf, pos)
                    .ctx("reading a sub-block to truncate")?;
                let from = from as usize;
                if buf[from..].iter().any(|&x| x != 0) {
                    buf[from..].fill(0);
                    self.banks[b]
                        .storage
                        .write_at(&buf, pos)
                        .ctx("zeroing a truncated sub-block")?;
                    self.frames[id].crcs[straddling as usize] = crc32fast::hash(&buf);
                    self.write_tag(id)?;
                }
            }
            let f = &mut self.frames[id];
            if f.dirty_end > cut {
                f.dirty_end = cut;
                self.write_tag(id)?;
            }
        }
        // Always sync: an eviction not yet durable could otherwise bring
        // back a stale block past the new size after a crash.
        self.sync()
    }

    fn sync(&mut self) -> Result<()> {
        self.fsync_all()?;
        let first = std::mem::take(&mut self.touched);
        self.promote(&first);
        for &id in &first {
            let f = &self.frames[id];
            if f.key.is_some() && f.committed != f.dirty {
                self.frames[id].committed = self.frames[id].dirty;
                self.write_tag(id)?;
            }
        }
        for b in 0..self.banks.len() {
            if self.banks[b].header.sync == SyncState::DirtyUnsynced {
                let mut h = self.banks[b].header;
                h.sync = SyncState::Synced;
                self.write_header(b, h)?;
            }
        }
        self.fsync_all()?;
        let second = std::mem::take(&mut self.touched);
        self.promote(&second);
        for id in first.into_iter().chain(second) {
            let f = &mut self.frames[id];
            f.durable_committed = f.committed;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::GeometryConfig;
    use crate::storage::{FaultyStorage, MemStorage};

    const FH: &[u8] = b"fh-1";

    fn stored(r: Result<WriteOutcome>) {
        assert_eq!(r.expect("write"), WriteOutcome::Stored);
    }

    fn geo() -> Geometry {
        crate::geometry::tiny_for_tests()
    }

    fn open(mem: &[MemStorage]) -> (BlockStore, RecoveryReport) {
        let s = mem
            .iter()
            .map(|m| Box::new(m.clone()) as Box<dyn Storage>)
            .collect();
        BlockStore::open(s, geo(), OpenOptions::default()).expect("open")
    }

    fn mems() -> Vec<MemStorage> {
        vec![MemStorage::new(), MemStorage::new()]
    }

    #[test]
    fn read_range_into_fills_hits_and_leaves_misses() {
        let (s, _) = open(&mems());
        let bs = 16384u64;
        // Block 0 whole, block 1 absent, block 2 only its first sub-block.
        stored(s.write(FH, 0, 0, &[1; 16384], WriteMode::Clean));
        stored(s.write(FH, 2, 0, &[3; 4096], WriteMode::Clean));
        let offset = bs - 100;
        let mut buf = vec![9u8; (bs + 100 + 50) as usize];
        let hits = s.read_range_into(FH, offset, &mut buf).expect("read");
        assert_eq!(hits, [true, false, true]);
        assert!(buf[..100].iter().all(|&b| b == 1));
        assert!(buf[100..100 + bs as usize].iter().all(|&b| b == 9));
        assert!(buf[100 + bs as usize..].iter().all(|&b| b == 3));
        // Past the valid sub-block of block 2: a miss, untouched.
        let mut tail = [9u8; 10];
        assert!(!s.read_into(FH, 2, 4096, &mut tail).expect("read"));
        assert_eq!(tail, [9; 10]);
    }

    #[test]
    fn read_range_now_stops_at_the_first_block_it_cannot_read_at_once() {
        let (s, _) = open(&mems());
        let bs = 16384u64;
        stored(s.write(FH, 0, 0, &[1; 16384], WriteMode::Clean));
        stored(s.write(FH, 1, 0, &[2; 16384], WriteMode::Clean));
        stored(s.write(FH, 3, 0, &[4; 16384], WriteMode::Clean));
        let before = s.stats();
        let offset = bs - 100;
        let mut buf = vec![9u8; (3 * bs) as usize];
        // Blocks 0 and 1 are hits, block 2 is not: stop there.
        assert_eq!(s.read_range_now(FH, offset, &mut buf).expect("read"), 2);
        assert!(buf[..100].iter().all(|&b| b == 1));
        assert!(buf[100..100 + bs as usize].iter().all(|&b| b == 2));
        let after = s.stats();
        assert_eq!(after.hits - before.hits, 2);
        assert_eq!(after.misses, before.misses, "a block not read is no miss");
        // Someone else holding the store: nothing read, nothing waited for.
        assert_eq!(s.all_cached_now(FH, 0..2).expect("ask"), Some(true));
        assert_eq!(s.all_cached_now(FH, 1..4).expect("ask"), Some(false));
        let held = s.inner.lock().expect("lock");
        assert_eq!(s.read_range_now(FH, 0, &mut buf[..10]).expect("read"), 0);
        assert_eq!(s.all_cached_now(FH, 0..2).expect("ask"), None);
        drop(held);
        // A backend that cannot read without blocking declines every block.
        let faulty: Vec<Box<dyn Storage>> = mems()
            .into_iter()
            .map(|m| Box::new(FaultyStorage::new(m)) as Box<dyn Storage>)
            .collect();
        let (f, _) = BlockStore::open(faulty, geo(), OpenOptions::default()).expect("open");
        stored(f.write(FH, 0, 0, &[1; 16384], WriteMode::Clean));
        assert_eq!(f.read_range_now(FH, 0, &mut buf[..10]).expect("read"), 0);
        assert_eq!(
            f.read_range_into(FH, 0, &mut buf[..10]).expect("read"),
            [true]
        );
    }

    #[test]
    fn partial_sub_block_rule() {
        let (s, _) = open(&mems());
        // A dirty write into part of an uncached sub-block keeps just its
        // bytes: dirty, not valid, so a read of it misses.
        stored(s.write(FH, 0, 100, &[1; 10], WriteMode::Dirty));
        assert_eq!(
            s.valid_sub_blocks(FH, 0).expect("valid"),
            SubBlockMask::EMPTY
        );
        assert_eq!(s.read(FH, 0, 100, 10).expect("read"), None);
        assert_eq!(s.stats().dirty_bytes, 10);
        let extent = |s: &BlockStore| {
            let d = s.dirty_data(FH, 0).expect("dirty").expect("some");
            assert_eq!(
                d.end,
                d.extents
                    .last()
                    .map_or(0, |e| e.offset + e.data.len() as u32)
            );
            d.extents
                .iter()
                .map(|e| (e.offset, e.data.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(extent(&s), [(100, vec![1; 10])]);
        // Touching and overlapping writes grow the extent; a gap is refused
        // whole.
        stored(s.write(FH, 0, 110, &[2; 5], WriteMode::Dirty));
        stored(s.write(FH, 0, 95, &[3; 6], WriteMode::Dirty));
        let mut want = vec![3u8; 6];
        want.extend([1; 9]);
        want.extend([2; 5]);
        assert_eq!(extent(&s), [(95, want.clone())]);
        let e = s
            .write(FH, 0, 200, &[4; 8000], WriteMode::Dirty)
            .expect_err("gap");
        assert!(matches!(e, Error::PartialSubBlockWrite { sub_block: 0 }));
        assert_eq!(extent(&s), [(95, want.clone())]);
        // A partial clean fill is skipped; a whole one merges around the
        // extent and makes the sub-block valid, still dirty.
        stored(s.write(FH, 0, 0, &[7; 50], WriteMode::Clean));
        assert_eq!(s.read(FH, 0, 0, 1).expect("read"), None);
        stored(s.write(FH, 0, 0, &[7; 8192], WriteMode::Clean));
        let got = s.read(FH, 0, 93, 24).expect("read").expect("hit");
        let mut expect = vec![7u8, 7];
        expect.extend(&want);
        expect.extend([7, 7]);
        assert_eq!(got, expect);
        assert_eq!(s.read(FH, 0, 4096, 1).expect("read"), Some(vec![7]));
        let ranges = &s.dirty_blocks(Some(FH)).expect("dirty")[0].ranges;
        assert_eq!((ranges.len(), &ranges[0]), (1, &(0..4096)));
        // Now a partial dirty write is a read-modify-write.
        stored(s.write(FH, 0, 100, &[5; 2], WriteMode::Dirty));
        assert_eq!(s.read(FH, 0, 99, 4).expect("read"), Some(vec![3, 5, 5, 1]));
        // A whole dirty write over a partial sub-block makes it valid.
        stored(s.write(FH, 1, 10, &[6; 10], WriteMode::Dirty));
        stored(s.write(FH, 1, 0, &[8; 4096], WriteMode::Dirty));
        assert_eq!(s.read(FH, 1, 0, 4096).expect("read"), Some(vec![8; 4096]));
        // Written back, a partial sub-block is forgotten.
        stored(s.write(FH, 2, 4096 + 7, &[9; 3], WriteMode::Dirty));
        let d = s.dirty_data(FH, 2).expect("dirty").expect("some");
        assert_eq!(d.end, 4096 + 10);
        s.mark_clean(&d).expect("clean");
        assert!(
            !s.dirty_blocks(Some(FH))
                .expect("dirty")
                .iter()
                .any(|b| b.block == 2)
        );
        assert_eq!(s.dirty_data(FH, 2).expect("dirty"), None);
        assert!(matches!(
            s.write(FH, 0, 16000, &[0; 1000], WriteMode::Clean),
            Err(Error::RangeOutsideBlock { .. })
        ));
        assert!(matches!(
            s.write(&[0; 65], 0, 0, &[0; 1], WriteMode::Clean),
            Err(Error::FileHandleTooLong(65))
        ));
    }

    #[test]
    fn dirty_frames_are_never_evicted() {
        let (s, _) = open(&mems());
        let g = geo();
        // Three blocks of different files in one set of two ways.
        let target = g.set_index(b"a", 0);
        let mut fhs = Vec::new();
        for i in 0u32.. {
            let fh = i.to_le_bytes().to_vec();
            if g.set_index(&fh, 0) == target {
                fhs.push(fh);
                if fhs.len() == 3 {
                    break;
                }
            }
        }
        for fh in &fhs[..2] {
            let w = s
                .write(fh, 0, 0, &[7; 4096], WriteMode::Dirty)
                .expect("write");
            assert_eq!(w, WriteOutcome::Stored);
        }
        let w = s
            .write(&fhs[2], 0, 0, &[8; 4096], WriteMode::Dirty)
            .expect("write");
        let WriteOutcome::NeedsWriteBack(victim) = w else {
            panic!("expected a write-back request, got {w:?}");
        };
        assert_eq!(victim.fh.as_bytes(), &fhs[0][..]);
        assert_eq!(victim.ranges, std::iter::once(0..4096).collect::<Vec<_>>());
        let d = s.dirty_data(&fhs[0], 0).expect("dirty").expect("some");
        assert_eq!(
            d.extents,
            vec![DirtyExtent {
                offset: 0,
                data: vec![7; 4096]
            }]
        );
        s.mark_clean(&d).expect("clean");
        let w = s
            .write(&fhs[2], 0, 0, &[8; 4096], WriteMode::Dirty)
            .expect("write");
        assert_eq!(w, WriteOutcome::Stored);
        assert_eq!(s.stats().evictions, 1);
        assert_eq!(s.read(&fhs[0], 0, 0, 1).expect("read"), None);
        assert_eq!(s.read(&fhs[1], 0, 0, 1).expect("read"), Some(vec![7]));
    }

    #[test]
    fn mark_clean_keeps_rewritten_sub_blocks_dirty() {
        let (s, _) = open(&mems());
        stored(s.write(FH, 3, 0, &[1; 8192], WriteMode::Dirty));
        let d = s.dirty_data(FH, 3).expect("dirty").expect("some");
        stored(s.write(FH, 3, 4096, &[2; 4096], WriteMode::Dirty));
        s.mark_clean(&d).expect("clean");
        let left = s.dirty_blocks(Some(FH)).expect("dirty");
        assert_eq!(
            left,
            vec![DirtyBlock {
                fh: FileHandle::from_checked(FH),
                block: 3,
                ranges: std::iter::once(4096..8192).collect()
            }]
        );
        assert_eq!(s.stats().dirty_bytes, 4096);
    }

    #[test]
    fn truncate_and_invalidate() {
        let (s, _) = open(&mems());
        for b in 0..3 {
            stored(s.write(FH, b, 0, &[9; 16384], WriteMode::Dirty));
        }
        stored(s.write(b"other", 0, 0, &[5; 4096], WriteMode::Clean));
        s.truncate(FH, 16384 + 5000).expect("truncate");
        assert_eq!(s.read(FH, 2, 0, 1).expect("read"), None);
        assert_eq!(
            s.valid_sub_blocks(FH, 1).expect("v"),
            SubBlockMask::range(0..2)
        );
        let tail = s.read(FH, 1, 4096, 4096).expect("read").expect("hit");
        assert!(tail[..904].iter().all(|&b| b == 9) && tail[904..].iter().all(|&b| b == 0));
        assert_eq!(s.invalidate(b"other", false).expect("inv"), 4096);
        assert_eq!(s.invalidate(FH, false).expect("inv"), 0, "dirty data stays");
        assert_eq!(s.invalidate(FH, true).expect("inv"), 16384 + 8192);
        assert_eq!(s.stats().frames_in_use, 0);
    }

    #[test]
    fn warm_after_clean_close_and_verifier_kept() {
        let m = mems();
        let (s, r) = open(&m);
        assert!(r.new_cache);
        stored(s.write(FH, 1, 0, &[4; 16384], WriteMode::Dirty));
        let v = s.verifier();
        s.close().expect("close");
        let (s, r) = open(&m);
        assert!(!r.verifier_changed && r.unclean_banks == 0, "{r:?}");
        assert_eq!(s.verifier(), v);
        assert_eq!(s.read(FH, 1, 0, 16384).expect("read"), Some(vec![4; 16384]));
        assert_eq!(s.dirty_blocks(None).expect("dirty").len(), 1);
    }

    #[test]
    fn nothing_is_written_after_a_close() {
        let m = mems();
        let (s, _) = open(&m);
        stored(s.write(FH, 1, 0, &[4; 16384], WriteMode::Dirty));
        s.close_shared().expect("close");
        // A late write (one that passed a layer's own check just before
        // the close) is refused, not written under a "clean" header.
        assert!(matches!(
            s.write(FH, 2, 0, &[5; 16384], WriteMode::Dirty),
            Err(Error::Closed)
        ));
        s.close_shared().expect("closing twice is harmless");
        drop(s);
        let (s, r) = open(&m);
        assert_eq!(r.unclean_banks, 0, "{r:?}");
        assert_eq!(s.read(FH, 2, 0, 16384).expect("read"), None);
        assert_eq!(s.read(FH, 1, 0, 16384).expect("read"), Some(vec![4; 16384]));
    }

    #[test]
    fn partial_extents_and_dirty_end_survive_a_crash_and_truncate() {
        let m = mems();
        let (s, _) = open(&m);
        // Trailing zeros written by the client, and a partial extent.
        stored(s.write(FH, 0, 0, &[0; 4096], WriteMode::Dirty));
        stored(s.write(FH, 1, 5000, &[6; 20], WriteMode::Dirty));
        s.sync().expect("sync");
        drop(s); // crash after the sync (COMMIT): everything kept
        let (s, r) = open(&m);
        assert!(!r.verifier_changed && r.dirty_sub_blocks_lost == 0, "{r:?}");
        let d0 = s.dirty_data(FH, 0).expect("dirty").expect("some");
        assert_eq!(d0.end, 4096);
        let d1 = s.dirty_data(FH, 1).expect("dirty").expect("some");
        assert_eq!(d1.end, 5020);
        assert_eq!(d1.extents.len(), 1);
        assert_eq!(
            (d1.extents[0].offset, &d1.extents[0].data[..]),
            (5000, &[6u8; 20][..])
        );
        // Truncating into the extent clips it and the end.
        s.truncate(FH, 16384 + 5010).expect("truncate");
        let d1 = s.dirty_data(FH, 1).expect("dirty").expect("some");
        assert_eq!((d1.end, d1.extents[0].data.len()), (5010, 10));
        s.truncate(FH, 16384 + 4999).expect("truncate");
        assert_eq!(s.dirty_data(FH, 1).expect("dirty"), None);
        assert!(!s.has_file(b"other").expect("has"));
        // A torn extent that was not committed is dropped on open.
        stored(s.write(FH, 2, 100, &[1; 10], WriteMode::Dirty));
        drop(s);
        let (s, r) = open(&m);
        assert!(r.verifier_changed, "{r:?}");
        assert!(s.dirty_data(FH, 2).expect("dirty").is_some());
    }

    #[test]
    fn unsynced_dirty_write_changes_verifier_synced_does_not() {
        let m = mems();
        let (s, _) = open(&m);
        stored(s.write(FH, 0, 0, &[1; 4096], WriteMode::Dirty));
        s.sync().expect("sync");
        let v = s.verifier();
        drop(s); // crash after sync: nothing lost
        let (s, r) = open(&m);
        assert!(!r.verifier_changed, "{r:?}");
        assert_eq!(s.verifier(), v);
        stored(s.write(FH, 0, 4096, &[1; 4096], WriteMode::Dirty));
        drop(s); // crash with an unsynced dirty write
        let (s, r) = open(&m);
        assert!(r.verifier_changed && r.unsynced_banks == 1, "{r:?}");
        assert_ne!(s.verifier(), v);
    }

    #[test]
    fn corrupt_tags_are_dropped_and_reported() {
        let m = mems();
        let (s, _) = open(&m);
        stored(s.write(FH, 0, 0, &[1; 4096], WriteMode::Dirty));
        s.close().expect("close");
        let layout = BankLayout::new(&geo());
        // Smash both tag copies of every frame.
        for mem in &m {
            let junk = vec![0xa5; 2 * layout.frames as usize * layout.tag_len];
            mem.write_at(&junk, layout.tag_offset(0, 0)).expect("smash");
        }
        let (s, r) = open(&m);
        assert_eq!(r.corrupt_tags, 2 * layout.frames);
        assert!(r.verifier_changed);
        assert_eq!(s.stats().frames_in_use, 0);
    }

    #[test]
    fn refuses_other_geometry_and_opens_dirs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (s, _) = BlockStore::open_dir(dir.path(), geo(), OpenOptions::default()).expect("open");
        stored(s.write(FH, 0, 0, &[6; 4096], WriteMode::Clean));
        s.close().expect("close");
        assert!(dir.path().join("bank-001.gvfs").exists());
        let other = Geometry::new(GeometryConfig {
            capacity: 2 * 8 * 2 * 16384,
            ..GeometryConfig {
                banks: 2,
                ways: 2,
                block_size: 16384,
                sub_block_size: 4096,
                capacity: 0,
            }
        })
        .expect("valid");
        let e =
            BlockStore::open_dir(dir.path(), other, OpenOptions::default()).expect_err("mismatch");
        assert!(matches!(e, Error::GeometryMismatch { bank: 0, .. }));
        // Said as the options that would open it.
        let msg = e.to_string();
        assert!(
            msg.contains(
                "made with --cache-size 256K --cache-banks 2 --cache-ways 2 --block-size 16K"
            ) && msg.contains("not --cache-size 512K"),
            "{msg}"
        );
        let opts = OpenOptions {
            verify_data: VerifyData::Always,
        };
        let (s, r) = BlockStore::open_dir(dir.path(), geo(), opts).expect("reopen");
        assert_eq!(r.frames_recovered, 1);
        assert_eq!(s.read(FH, 0, 0, 2).expect("read"), Some(vec![6, 6]));
        // A second process (or store) on the same directory is refused
        // while the first has it open.
        let e =
            BlockStore::open_dir(dir.path(), geo(), OpenOptions::default()).expect_err("in use");
        assert!(matches!(e, Error::DirInUse { .. }), "{e}");
        drop(s);
        BlockStore::open_dir(dir.path(), geo(), OpenOptions::default()).expect("free again");
    }

    #[test]
    fn io_error_poisons_until_reopen() {
        let f = crate::storage::FaultyStorage::new(MemStorage::new());
        let s: Vec<Box<dyn Storage>> = vec![Box::new(f.clone()), Box::new(MemStorage::new())];
        let (s, _) = BlockStore::open(s, geo(), OpenOptions::default()).expect("open");
        // Find a block in bank 0 and fail its data write.
        let b = (0..)
            .find(|&b| geo().bank_of_set(geo().set_index(FH, b)).0 == 0)
            .expect("block");
        f.fail_nth_op(0);
        assert!(matches!(
            s.write(FH, b, 0, &[1; 4096], WriteMode::Clean),
            Err(Error::Io { .. })
        ));
        assert!(matches!(s.read(FH, b, 0, 1), Err(Error::Poisoned)));
    }
}
