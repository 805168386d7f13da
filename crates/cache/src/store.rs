//! [`BlockStore`]: the set-associative index, bank files and crash-safety
//! rules tied together behind one synchronous API.
//!
//! # Crash-safety rules
//!
//! * **Order of a write.** The frame's tag first, then the data; nothing is
//!   fsynced except as below. Each valid sub-block's CRC32 is in the tag, so
//!   a torn or reordered pair is detected on open. Tag first, and a dirty
//!   write into a sub-block taking its committed bit away in that tag until
//!   the next sync, mean that when only the process dies (the system's page
//!   cache keeps every write, in order) bytes that changed since the last
//!   sync always have a tag saying so (or a tag torn while saying so): bytes
//!   that differ from both tags of an untouched frame are rot. Every write
//!   in place into dirty data (a truncation's zeroing too) first flags its
//!   bank unsynced, as below.
//! * **Unsynced-dirty flag.** Before the first dirty write into a bank after
//!   a sync, that bank's header is set to "dirty writes since the last sync"
//!   and fsynced (a barrier: the flag is durable before the data). `sync`
//!   sets it back to "synced". A crash with the flag set means acknowledged
//!   but uncommitted writes may be lost, so the next open changes the write
//!   verifier (RFC 1813 section 3.3.7: the client then resends).
//! * **Committed bits.** `sync` fsyncs data and tags, then records in each
//!   changed tag which dirty sub-blocks are now durable ("committed"), then
//!   fsyncs again. On open after an unclean shutdown, a sub-block whose CRC
//!   does not match is judged (`judge` in [`recovery`]): bytes that match the
//!   frame's older tag go back to it (the newest write never landed); a
//!   committed sub-block of an unsynced bank that the tags show was being
//!   rewritten is kept dirty (its mismatch is an in-flight overwrite, whose
//!   bytes the client resends, while its other bytes are the committed ones
//!   and must not be lost); after a system crash, when writes may have
//!   landed in any order, every committed sub-block of an unsynced bank is
//!   kept so. Anything else is rot and is dropped: a synced bank had no
//!   write in flight. A clean fill merged around a committed partial
//!   sub-block's extent takes the sub-block's committed bit away until the
//!   next sync (its tag must not claim the merged bytes as durable).
//! * **Checked on use.** Bytes are checked against their CRC every time
//!   they are used, not only on open ([`integrity`]): a sub-block that fails
//!   is never served or written back; a dirty one is set aside in
//!   `DIR/quarantine/` and changes the verifier.
//! * **No resurrection.** A frame whose durable tag still claims committed
//!   dirty data is not reused before a sync makes its cleaner tag durable;
//!   `truncate` and `invalidate` always sync before returning (also making
//!   earlier evictions durable, so no stale copy of that file comes back); [`BlockStore::dirty_data`]
//!   syncs before handing out data to be written upstream, so what upstream
//!   receives is never newer than what a crash can bring back.
//! * **Bank files.** Their space is reserved when they are opened, so a
//!   full disk cannot fail a write into them. One found missing beside the
//!   others (or every one, in a directory that held a cache), or shorter
//!   than its layout, lost what it held: that is reported, nothing past a
//!   cut is trusted (the cut is recorded in the header region before the
//!   file is grown back, until recovery is durable), and the verifier
//!   changes. In a bank closed cleanly a tag slot that fails its checksum
//!   is rot, and may have been the newer one: its frame is dropped, its
//!   dirty bytes set aside and reported.
//! * **Verifier rule.** The verifier changes on open when: a bank header was
//!   unreadable, a header says dirty writes were not synced, the headers
//!   disagree, a bank file was missing or cut short, a tag was corrupt, a
//!   dirty sub-block was dropped, a sub-block went back to its older tag,
//!   or a torn committed sub-block was kept; and while running when dirty
//!   bytes fail their checksum. Otherwise it is kept, so a COMMIT verifier
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
use std::ops::Range;
use std::sync::{Mutex, MutexGuard, TryLockError};

use crate::error::{Error, IoContext, Result};
use crate::format::{BankLayout, Header, MAX_FH_LEN, Shutdown, SyncState, Tag, TagError};
use crate::geometry::Geometry;
use crate::mask::SubBlockMask;
use crate::set::{FileHandle, Frame, Victim, choose_victim};
use crate::storage::Storage;

mod inner;
mod integrity;
mod quarantine;
mod recovery;
mod verifier;
mod writers;
mod writes;

use quarantine::Quarantine;
pub use writers::MAX_WRITER_LEN;
use writers::Writers;

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

/// What an unclean shutdown may have done to writes not yet synced, which
/// decides how much recovery may assume about bytes that fail their CRC.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum UncleanShutdown {
    /// Not known: [`BlockStore::open_dir`] finds out from the boot id it
    /// records; [`BlockStore::open`] assumes [`SystemCrash`](Self::SystemCrash).
    #[default]
    Unknown,
    /// The system went down (power loss, kernel crash): the disk may hold
    /// any subset of the unsynced writes, in any order, torn anywhere.
    SystemCrash,
    /// Only the process died (kill -9, a panic): the system kept every write
    /// it made, in order.
    ProcessOnly,
}

/// Options of [`BlockStore::open`].
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenOptions {
    /// When to verify data CRCs.
    pub verify_data: VerifyData,
    /// What an unclean shutdown may have done.
    pub unclean: UncleanShutdown,
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
    /// Of those, banks that were missing from a cache whose other banks
    /// were there: whatever they held, dirty data included, is lost.
    pub banks_lost: u32,
    /// Bank files found shorter than their layout: what was past the cut
    /// is lost.
    pub banks_truncated: u32,
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
    /// Sub-blocks whose newest write had not landed, taken back to the
    /// state the frame's older tag describes.
    pub unlanded_writes_reverted: u64,
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
    /// Clean sub-blocks whose bytes failed their checksum (on open or when
    /// used): dropped, to be fetched again.
    pub corrupt_clean_dropped: u64,
    /// Dirty sub-blocks lost: their bytes failed their checksum (on open or
    /// when used) or were past the end of a cut-off bank file. Never
    /// written back; set aside in `DIR/quarantine/` where there were bytes.
    pub dirty_sub_blocks_lost: u64,
    /// Bank files missing or cut off when the cache was opened.
    pub banks_lost: u64,
    /// Times the write verifier changed because acknowledged data was lost
    /// (on open or while running).
    pub verifier_changes: u64,
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
    /// Reused buffer for checking sub-blocks around odd-sized reads.
    scratch: Vec<u8>,
    /// Where dirty bytes that fail their checksum are set aside.
    quarantine: Option<Quarantine>,
    /// Who wrote each file's dirty data.
    writers: Writers,
    /// Told of each block let go (evicted, invalidated, cut off).
    on_drop: DropHook,
}

/// What the store calls, under its lock, with the file handle and block
/// number of each block it lets go (so an index of what it holds can
/// forget them): it must not block.
#[derive(Clone, Default)]
pub struct DropHook(Option<std::sync::Arc<DropFn>>);

type DropFn = dyn Fn(&[u8], u64) + Send + Sync;

impl DropHook {
    /// A hook calling `f`.
    pub fn new(f: impl Fn(&[u8], u64) + Send + Sync + 'static) -> Self {
        Self(Some(std::sync::Arc::new(f)))
    }

    pub(crate) fn call(&self, fh: &[u8], block: u64) {
        if let Some(f) = &self.0 {
            f(fh, block);
        }
    }
}

impl std::fmt::Debug for DropHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "DropHook(set)"
        } else {
            "DropHook(none)"
        })
    }
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

/// Whether any cached block of `fh` holds dirty data.
fn has_dirty(
    index: &BTreeMap<FileHandle, BTreeMap<u64, usize>>,
    frames: &[Frame],
    fh: &[u8],
) -> bool {
    index
        .get(fh)
        .is_some_and(|blocks| blocks.values().any(|&id| !frames[id].dirty.is_empty()))
}

fn check_fh(fh: &[u8]) -> Result<()> {
    if fh.len() > MAX_FH_LEN {
        return Err(Error::FileHandleTooLong(fh.len()));
    }
    Ok(())
}

impl BlockStore {
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

    /// Reads `buf.len()` bytes of `fh` at `offset` (any number of blocks)
    /// only if the store holds them all, each sub-block checked; false,
    /// and `buf` unspecified, otherwise. Counts no hit or miss: for readers
    /// other than the cache's clients (copies of shared blocks).
    pub fn read_held(&self, fh: &[u8], offset: u64, buf: &mut [u8]) -> Result<bool> {
        let bs = u64::from(self.geometry().block_size());
        let end = offset + buf.len() as u64;
        let mut pos = offset;
        while pos < end {
            let block = pos / bs;
            let hi = end.min((block + 1) * bs);
            let dst = &mut buf[(pos - offset) as usize..(hi - offset) as usize];
            if !self.mutate(|g| g.read_held(fh, block, (pos - block * bs) as u32, dst))? {
                return Ok(false);
            }
            pos = hi;
        }
        Ok(true)
    }

    /// Calls `hook` for every block let go from now on.
    pub fn on_drop(&self, hook: DropHook) -> Result<()> {
        self.lock()?.on_drop = hook;
        Ok(())
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

    /// Records `who` (opaque, at most [`MAX_WRITER_LEN`] bytes) as the
    /// writer of `fh`'s dirty data; durable with the next [`sync`](Self::sync),
    /// and kept until the file has no dirty data left.
    pub fn set_writer(&self, fh: &[u8], who: &[u8]) -> Result<()> {
        let mut g = self.lock()?;
        let inner = &mut *g;
        let (index, frames) = (&inner.index, &inner.frames);
        inner
            .writers
            .set(fh, who, |fh| has_dirty(index, frames, fh));
        Ok(())
    }

    /// The writer recorded for `fh`'s dirty data (by this session, or by the
    /// one whose dirty data was recovered).
    pub fn writer(&self, fh: &[u8]) -> Option<Vec<u8>> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.writers.get(fh).map(<[u8]>::to_vec)
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

#[cfg(test)]
mod crash_tests;
#[cfg(test)]
mod integrity_tests;
#[cfg(test)]
mod tests;
