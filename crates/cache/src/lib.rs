//! The gvfs block cache: a hashed set-associative write-back disk cache of
//! NFS blocks (docs/ARCHITECTURE.md, "The stack"; the GVFS paper, section 3.2.1).
//!
//! This crate is the synchronous storage core: [`Geometry`] cuts the
//! capacity into banks (files) of sets of frames; [`format`](mod@format) specifies the
//! bytes of a bank; [`Storage`] abstracts where they live; [`BlockStore`]
//! keeps blocks with per-sub-block valid and dirty bits, survives crashes and
//! comes back warm after a restart. The NFS layer (write-back policy,
//! read-ahead, control) is built on top of it: [`CacheLayer`], a
//! `gvfs_nfs::NfsService`.
#![warn(missing_docs)]

mod error;
pub mod format;
mod geometry;
mod layer;
mod mask;
mod set;
mod storage;
mod store;

pub use error::{Error, GeometryError, LayerError, Result, UpstreamCall};
pub use geometry::{
    Geometry, GeometryConfig, MAX_BANKS, MAX_BLOCK_SIZE, MAX_SUB_BLOCKS, MAX_WAYS, MIN_BLOCK_SIZE,
    MIN_SUB_BLOCK_SIZE,
};
pub use layer::{
    CacheConfig, CacheLayer, HeldElsewhere, LayerStats, SideChannels, UnknownWritePolicy,
    WriteBackReport, WritePolicy, ZeroHint,
};
pub use mask::SubBlockMask;
pub use set::FileHandle;
pub use storage::{FaultyStorage, FileStorage, MemStorage, Storage, WriteFate};
pub use store::{
    BlockStore, CacheStats, DirtyBlock, DirtyData, DirtyExtent, DropHook, MAX_WRITER_LEN,
    OpenOptions, RecoveryReport, UncleanShutdown, VerifyData, WriteMode, WriteOutcome,
};
