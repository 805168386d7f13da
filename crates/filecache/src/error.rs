//! The crate's errors.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use gvfs_ext::{ChunkError, FetchError};
use gvfs_nfs::nfs3_types::nfs3::nfsstat3;

/// Why a small index operation failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    /// The sled database failed (I/O, corruption, or already open). Its
    /// error is part of the message, so it is not also a `source`.
    #[error("index storage: {0}")]
    Sled(sled::Error),
}

impl From<sled::Error> for IndexError {
    fn from(e: sled::Error) -> Self {
        Self::Sled(e)
    }
}

/// Why the file cache could not fetch, hold, serve or write back a file.
/// Cloned: a fetch that fails fails every reader waiting on it.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum FileCacheError {
    /// A FETCH failed: the upstream said no (an NFS error), or did not
    /// answer.
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// A chunk came with other attributes than the file had when its
    /// fetch started: the file changed at the origin meanwhile.
    #[error("the file changed upstream during the fetch")]
    ChangedUpstream,
    /// A FETCH answer holds another number of bytes than asked for.
    #[error("chunk at {offset} holds {got} bytes, expected {expected}")]
    ShortChunk {
        /// Where the chunk starts.
        offset: u64,
        /// Bytes it holds.
        got: u32,
        /// Bytes asked for.
        expected: u32,
    },
    /// A fetched chunk failed its checks.
    #[error(transparent)]
    Chunk(#[from] ChunkError),
    /// A repeat's source lies past the end of the file.
    #[error("a repeat points past the file")]
    RepeatPastEnd,
    /// A repeat's source lies in a chunk the zero map says is all zeros:
    /// the metadata and the bytes sent disagree.
    #[error("a repeat's source at {from} lies in a chunk of zeros")]
    RepeatFromZeros {
        /// Where the repeat's source starts.
        from: u64,
    },
    /// The entry's fetch ended (it was dropped) before the chunks waited
    /// for arrived.
    #[error("the fetch went away")]
    FetchGone,
    /// I/O on a file of the cache failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done ("reading", "writing", "creating", "syncing").
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: Arc<io::Error>,
    },
    /// The index that records the cache's files failed.
    #[error("{op}: {source}")]
    Index {
        /// What was being done.
        op: &'static str,
        /// What the index said.
        source: IndexError,
    },
    /// The file is larger than the whole file cache.
    #[error("the file ({size} bytes) is larger than the file cache ({max} bytes)")]
    TooLarge {
        /// The file's size.
        size: u64,
        /// The cache's budget.
        max: u64,
    },
    /// No room can be made: every file held is still being fetched or
    /// holds writes.
    #[error("the file cache is full of fetches under way")]
    Full,
    /// A WRITE into the file ran while a FETCH answer was made from it:
    /// the bytes might belong to neither version.
    #[error("the file was written during the FETCH")]
    WrittenDuringFetch,
    /// A write-back found the file changed at the origin since it was
    /// fetched: nothing more is stored over it, the local writes stay.
    #[error(
        "write-back conflict: {name} changed at the origin since it was fetched; \
         the local writes are kept in {}",
        path.display()
    )]
    WriteBackConflict {
        /// The file's name in the cache (its handle in hex).
        name: String,
        /// The local copy holding the writes.
        path: PathBuf,
    },
    /// The upstream refused to store a written-back chunk.
    #[error("upstream refused the write-back: {0:?}")]
    StoreRefused(nfsstat3),
    /// A task doing the cache's work panicked or was cancelled.
    #[error("{task} stopped: {source}")]
    Task {
        /// Which work.
        task: &'static str,
        /// What tokio said.
        source: Arc<tokio::task::JoinError>,
    },
    /// The layer has no file cache to hold the file in.
    #[error("no file cache")]
    NoFileCache,
    /// Several files failed to be written back: the first failure, and how
    /// many more there were.
    #[error("{first} (and {more} more files)")]
    Several {
        /// The first failure.
        first: Box<FileCacheError>,
        /// Files that failed besides.
        more: usize,
    },
}

impl FileCacheError {
    /// I/O failure `source` while doing `op` on `path`.
    pub(crate) fn io(op: &'static str, path: &std::path::Path, source: io::Error) -> Self {
        Self::Io {
            op,
            path: path.to_path_buf(),
            source: Arc::new(source),
        }
    }

    /// `task` stopped before it finished.
    pub(crate) fn task(task: &'static str, source: tokio::task::JoinError) -> Self {
        Self::Task {
            task,
            source: Arc::new(source),
        }
    }

    /// Whether the disk holding the cache (or its index) is full or over
    /// quota.
    pub fn is_no_space(&self) -> bool {
        let full = |e: &io::Error| {
            matches!(
                e.kind(),
                io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
            )
        };
        match self {
            Self::Io { source, .. } => full(source),
            Self::Index {
                source: IndexError::Sled(sled::Error::Io(e)),
                ..
            } => full(e),
            _ => false,
        }
    }
}

impl From<FileCacheError> for gvfs_nfs::ServiceError {
    fn from(e: FileCacheError) -> Self {
        Self::layer(e)
    }
}

/// Why a WRITE into a held file was not taken.
#[derive(Debug, Clone, thiserror::Error)]
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
    #[error(transparent)]
    Local(FileCacheError),
    /// The file cache's disk is full (or over quota): the write is not
    /// kept; writes go on once there is room again.
    #[error(transparent)]
    NoSpace(FileCacheError),
}

impl From<FileCacheError> for HeldWriteError {
    /// [`NoSpace`](Self::NoSpace) when the disk is full, else
    /// [`Local`](Self::Local).
    fn from(e: FileCacheError) -> Self {
        if e.is_no_space() {
            Self::NoSpace(e)
        } else {
            Self::Local(e)
        }
    }
}

impl HeldWriteError {
    /// The status a client sees (RFC 1813, section 3.3.7).
    pub fn nfsstat(&self) -> nfsstat3 {
        match self {
            Self::LetGo => nfsstat3::NFS3ERR_JUKEBOX,
            Self::TooLarge { .. } => nfsstat3::NFS3ERR_FBIG,
            Self::NoSpace(_) => nfsstat3::NFS3ERR_NOSPC,
            Self::NotHeld | Self::Local(_) => nfsstat3::NFS3ERR_IO,
        }
    }
}

/// Why the record of a file-cache entry (see `filecache::record`) was not
/// loaded. The file it describes is then deleted, as one with no record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// Neither the magic `GVFC` nor the unnumbered layout before it.
    #[error("file-cache record: bad magic (not a record this build knows)")]
    BadMagic,
    /// A record version this build does not read: a newer build's.
    #[error(
        "file-cache record version {0} is not one this build reads \
         (version 1, or the unnumbered layout before it)"
    )]
    Version(u32),
    /// The CRC32 does not match the bytes.
    #[error("file-cache record: checksum mismatch")]
    Checksum,
    /// The bytes end before the record does.
    #[error("file-cache record: truncated")]
    Truncated,
    /// Bytes follow the record's end.
    #[error("file-cache record: {0} bytes past its end")]
    Trailing(usize),
    /// Flags this build does not know.
    #[error("file-cache record: unknown flags {0:#x}")]
    UnknownFlags(u32),
    /// A file type NFSv3 does not have.
    #[error("file-cache record: file type {0} is not an NFSv3 file type")]
    FileType(u32),
    /// More dirty chunks than the file has.
    #[error("file-cache record: {count} dirty chunks in a file of {chunks}")]
    TooManyChunks {
        /// Dirty chunks listed.
        count: u32,
        /// Chunks of the file.
        chunks: usize,
    },
    /// A dirty chunk past the end of the file.
    #[error("file-cache record: dirty chunk {chunk} lies past the file's {chunks} chunks")]
    ChunkPastEnd {
        /// The chunk's index.
        chunk: u32,
        /// Chunks of the file.
        chunks: usize,
    },
}

/// Why a progress log (see `filecache::progress`) was not loaded. The
/// partly fetched file beside it is then deleted, as one without a log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum ProgressError {
    /// The log could not be read (it may not exist).
    #[error("file-cache progress log: {0}")]
    Io(#[from] io::Error),
    /// Not the magic `GVFP`.
    #[error("file-cache progress log: bad magic")]
    BadMagic,
    /// A log version this build does not read.
    #[error("file-cache progress log version {0} is not one this build reads (1)")]
    Version(u32),
    /// The header's CRC32 does not match its bytes.
    #[error("file-cache progress log: header checksum mismatch")]
    Checksum,
    /// The log ends inside its header.
    #[error("file-cache progress log: truncated header")]
    Truncated,
    /// The header's attributes do not load.
    #[error("file-cache progress log: {0}")]
    Attrs(#[from] RecordError),
    /// The header's size is not its attributes' size.
    #[error("file-cache progress log: size {size} but attributes of {attrs} bytes")]
    SizeMismatch {
        /// The header's size.
        size: u64,
        /// The size its attributes give.
        attrs: u64,
    },
    /// The file it describes is larger than the cache may hold.
    #[error("file-cache progress log: a file of {size} bytes, over the budget of {max}")]
    TooLarge {
        /// The header's size.
        size: u64,
        /// The cache's budget.
        max: u64,
    },
    /// The log is longer than one of its file's size can grow to.
    #[error("file-cache progress log: {len} bytes, more than the {max} it may grow to")]
    TooLong {
        /// The log's length.
        len: u64,
        /// The most it may be.
        max: u64,
    },
}
