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
//! `filecache/record.rs`: magic, version, CRC). A file being fetched has a
//! progress log beside it (`filecache/progress.rs`) naming the pieces
//! written and their CRC32s; a file without a record but with a log that
//! loads is kept when the cache is opened, and the next fetch of the same
//! version resumes it, checking each kept piece before serving it
//! (`fetch/kept.rs`). Other files without a record, or whose record does
//! not load, are deleted. Entries are evicted, least recently used first,
//! to keep the total under a byte budget.
//!
//! Where things are. The public API is re-exported here; dependencies
//! between the files point one way: the modules that work on an entry
//! (`fetch/`, `read.rs`, `write.rs`, `writeback.rs`, `learn.rs`,
//! `dedup.rs`) -> the table and the entry (`cache.rs`: [`FileCache`],
//! `entry.rs`: [`CachedFile`]) -> their parts (`fetch/state.rs`,
//! `versions.rs`, `frames.rs`, `learn/learning.rs`, `dedup/parts.rs`) ->
//! shared leaf types (`chunks.rs`, `pieces.rs`, `names.rs`, `stats.rs`,
//! `record.rs`, `progress.rs`, `error.rs`, the indexes).
//!
//! [`CHUNK`]: gvfs_ext::CHUNK
//! [`ChunkSource`]: gvfs_ext::ChunkSource

pub use block_index::{BlockIndex, Place};
pub use cache::{FileCache, FileCacheParts};
pub use dedup::parts::BlockReader;
pub use entry::CachedFile;
pub use error::{FileCacheError, HeldWriteError, IndexError, RecordError};
pub use fetch::{PROFILE_BYTES, PROFILE_WINDOW, UNDER_DEMAND, WINDOW};
pub use frames::Frame;
pub use gvfs_nfs::same_version;
pub use index::{Entry, MemIndex, MetaIndex, SledIndex};
pub use learn::{
    DEFAULT_LEARN_WINDOW, KEEP_SHARE, LEARN_MAX, LEARN_QUIET, LearnSettings, PROFILE_WAIT,
};
pub use names::parse_handle;
pub use pieces::PIECE;
pub use profiles::Profiles;
pub use read::Asked;
pub use seq::{BULK_BYTES, BULK_MEAN_READ, BULK_READS, SEQ_BACK, SEQ_SLACK};
pub use side::SideFiles;
pub use stats::{Counters, DEDUP_FILES_SHOWN, FileCacheCounts, FileCacheStats, FileDedup};

// The table and its entries.
mod cache;
mod entry;

// What works on them.
mod dedup;
mod fetch;
mod learn;
mod read;
mod run_frames;
mod seq;
mod write;
mod writeback;

// Their parts and shared leaf types.
mod block_index;
mod chunks;
mod error;
mod frames;
mod index;
mod names;
mod pieces;
mod profiles;
mod progress;
mod record;
mod side;
mod stats;
mod versions;

#[cfg(test)]
pub(crate) mod tests;
