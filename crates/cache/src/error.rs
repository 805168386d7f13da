//! The one error type of the block cache.

use std::io;

/// Why a [`Geometry`](crate::Geometry) was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GeometryError {
    /// The block size is not a power of two in `4 KiB..=1 MiB`.
    #[error("block size {0} is not a power of two between 4 KiB and 1 MiB")]
    BlockSize(u32),
    /// The sub-block size is not a power of two in `512..=block size`.
    #[error(
        "sub-block size {sub_block} is not a power of two between 512 and the block size {block}"
    )]
    SubBlockSize {
        /// Requested sub-block size.
        sub_block: u32,
        /// Requested block size.
        block: u32,
    },
    /// A block would hold more than [`MAX_SUB_BLOCKS`](crate::MAX_SUB_BLOCKS) sub-blocks.
    #[error("{0} sub-blocks per block exceeds the limit of 256")]
    TooManySubBlocks(u32),
    /// The bank count is zero or above [`MAX_BANKS`](crate::MAX_BANKS).
    #[error("bank count {0} is not in 1..=4096")]
    Banks(u32),
    /// The associativity is zero or above [`MAX_WAYS`](crate::MAX_WAYS).
    #[error("associativity {0} is not in 1..=1024")]
    Ways(u32),
    /// The capacity is too small for one set per bank.
    #[error("capacity {capacity} is below one set per bank ({minimum} bytes)")]
    CapacityTooSmall {
        /// Requested capacity in bytes.
        capacity: u64,
        /// Smallest capacity accepted: banks x ways x block size.
        minimum: u64,
    },
    /// The capacity needs more frames per bank than the format can address.
    #[error("capacity {0} needs too many frames per bank")]
    CapacityTooLarge(u64),
}

/// Errors of the block cache.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The requested geometry is invalid.
    #[error("invalid cache geometry: {0}")]
    InvalidGeometry(#[from] GeometryError),
    /// A bank on disk was written with a different geometry than the one requested.
    #[error(
        "the cache here was made with {found}, not {wanted} (bank {bank}); \
         start with the settings it was made with, or use another --cache-dir"
    )]
    GeometryMismatch {
        /// Bank index.
        bank: u32,
        /// The geometry recorded in the bank header, as the proxy's options.
        found: String,
        /// The geometry asked for, likewise.
        wanted: String,
    },
    /// Another process holds the cache directory.
    #[error(
        "cache directory {} is in use by another running gvfs-proxy; give each proxy its own --cache-dir",
        dir.display()
    )]
    DirInUse {
        /// The directory.
        dir: std::path::PathBuf,
    },
    /// A bank header has an unknown format version.
    #[error("bank {bank} has unsupported format version {version}")]
    UnsupportedFormatVersion {
        /// Bank index.
        bank: u32,
        /// The version found.
        version: u32,
    },
    /// `open` was given a different number of storages than the geometry has banks.
    #[error("geometry has {expected} banks but {given} storages were given")]
    BankCountMismatch {
        /// Banks in the geometry.
        expected: u32,
        /// Storages given.
        given: usize,
    },
    /// The filesystem holding the cache has no room for its bank files.
    #[error(
        "the cache needs {needed} bytes on disk for its bank files and its filesystem has no \
         room for them; free space there, or give a smaller --cache-size"
    )]
    NoSpaceForBanks {
        /// Bytes of all the bank files.
        needed: u64,
    },
    /// A file handle is longer than NFSv3 allows (RFC 1813 section 2.5, `NFS3_FHSIZE` = 64).
    #[error("file handle of {0} bytes exceeds the NFSv3 limit of 64")]
    FileHandleTooLong(usize),
    /// The byte range does not fit inside one block.
    #[error("range {offset}+{len} does not fit in a block of {block_size} bytes")]
    RangeOutsideBlock {
        /// Offset inside the block.
        offset: u32,
        /// Length in bytes.
        len: usize,
        /// Block size.
        block_size: u32,
    },
    /// A dirty write covers only part of a sub-block that holds no valid data.
    ///
    /// The cache cannot keep part of a sub-block: the caller must first fill
    /// that sub-block from upstream (a clean write of the whole sub-block) or
    /// write the data through. Nothing was written.
    #[error(
        "dirty write covers sub-block {sub_block} only partly and that sub-block is not cached"
    )]
    PartialSubBlockWrite {
        /// Index of the offending sub-block inside the block.
        sub_block: u32,
    },
    /// An earlier I/O error left the in-memory index possibly out of step with
    /// disk; the store must be reopened (recovery repairs it).
    #[error("block store disabled by an earlier I/O error; reopen it")]
    Poisoned,
    /// The store was closed (shutdown recorded as clean): nothing more may
    /// be written to it.
    #[error("block store closed; nothing more is written to it")]
    Closed,
    /// An I/O error of the storage backend.
    #[error("cache storage I/O failed while {op}: {source}")]
    Io {
        /// What the store was doing.
        op: &'static str,
        /// The underlying error.
        source: io::Error,
    },
}

/// Result alias of the cache.
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) trait IoContext<T> {
    fn ctx(self, op: &'static str) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, op: &'static str) -> Result<T> {
        self.map_err(|source| Error::Io { op, source })
    }
}

/// Why the block cache layer failed a call with no NFS status to give for
/// it: the client sees `NFS3ERR_IO` (through
/// [`ServiceError::Layer`](gvfs_nfs::ServiceError::Layer)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LayerError {
    /// The block store failed.
    #[error("block cache: {0}")]
    Store(#[source] Error),
    /// The layer was closed at shutdown: it takes no more calls.
    #[error("block cache is closed")]
    Closed,
    /// The layer was dropped while a call of it was still running.
    #[error("block cache layer dropped")]
    Dropped,
    /// A task the layer ran a call's work in panicked or was cancelled.
    #[error("block cache {task} task: {source}")]
    Task {
        /// Which work ("fetch", "write-back").
        task: &'static str,
        /// What tokio said.
        source: tokio::task::JoinError,
    },
    /// Upstream answered a call the layer made of its own accord (to fill
    /// a block, to write dirty data back) with an error.
    #[error("block cache: {call} failed upstream: {status}")]
    Upstream {
        /// What the layer asked.
        call: UpstreamCall,
        /// What upstream answered.
        status: nfs3_types::nfs3::nfsstat3,
    },
    /// Upstream's write verifier changed again and again while a file's
    /// data was written back: it kept restarting.
    #[error("block cache: upstream write verifier keeps changing")]
    VerifierKeepsChanging,
    /// Upstream restarted (its write verifier changed) while an evicted
    /// block was written to it: the block stays dirty.
    #[error("block cache: upstream restarted while an evicted block was written; retry")]
    RestartedDuringEviction,
    /// A block could not be stored: each attempt found its set full of
    /// blocks being written back or filled.
    #[error("block cache: could not store block {block} after {attempts} attempts")]
    NoRoom {
        /// The block.
        block: u64,
        /// How many times it was tried.
        attempts: usize,
    },
}

/// A call the block cache layer makes upstream of its own accord, as
/// [`LayerError::Upstream`] names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum UpstreamCall {
    /// GETATTR of a file found with dirty data at start-up.
    RecoveredGetattr,
    /// READ of a block, to complete a partial write into it.
    FillForPartialWrite {
        /// The block.
        block: u64,
    },
    /// GETATTR before a file's data is written back.
    WriteBackGetattr,
    /// WRITE of a file's dirty data.
    WriteBackWrite {
        /// Where the WRITE starts.
        offset: u64,
    },
    /// COMMIT after a file's dirty data was written.
    WriteBackCommit,
    /// WRITE of a dirty block evicted to make room.
    EvictionWrite,
    /// COMMIT of a dirty block evicted to make room.
    EvictionCommit,
}

impl std::fmt::Display for UpstreamCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::RecoveredGetattr => f.write_str("GETATTR of a file with recovered dirty data"),
            Self::FillForPartialWrite { block } => {
                write!(f, "reading block {block} to complete a partial write")
            }
            Self::WriteBackGetattr => f.write_str("GETATTR before write-back"),
            Self::WriteBackWrite { offset } => write!(f, "write-back WRITE at {offset}"),
            Self::WriteBackCommit => f.write_str("write-back COMMIT"),
            Self::EvictionWrite => f.write_str("writing an evicted block"),
            Self::EvictionCommit => f.write_str("COMMIT of an evicted block"),
        }
    }
}

impl From<LayerError> for gvfs_nfs::ServiceError {
    fn from(e: LayerError) -> Self {
        Self::layer(e)
    }
}
