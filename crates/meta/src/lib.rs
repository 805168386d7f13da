//! The gvfs metadata-action layer: zero-block maps and compress-and-copy of
//! whole files driven by `.NAME.gvfsmeta` files (DESIGN.md, "meta layer";
//! the GVFS paper, section 3.2.2).
//!
//! [`format`](mod@format) specifies the bytes of a metadata file and
//! decodes them defensively (they come from the image server); [`scan`]
//! makes one from a local file and [`write_beside`] puts it next to it;
//! [`MetaIndex`] is the small key-value store the proxy keeps about files
//! (negative lookups, file-cache entries, fetched maps), in memory or in
//! sled. The proxy layer that acts on the metadata stacks above the block
//! cache as a `gvfs_nfs::NfsService`.
#![warn(missing_docs)]

pub mod dedup;
mod error;
pub mod ext;
pub mod filecache;
pub mod format;
mod index;
pub mod layer;
pub mod profile;
mod scan;
pub mod server;
pub mod trust;

pub use error::{ChunkError, FileCacheError, IndexError, MetaError, RecordError};
pub use ext::{ChunkSource, ExtClient};
pub use filecache::{FileCache, FileCacheStats, FileDedup, HeldWriteError};
pub use format::{
    Actions, MAX_BLOCK_SIZE, MAX_META_LEN, META_SUFFIX, MIN_BLOCK_SIZE, MetaFile, ZeroMap,
    block_count, described_name, is_meta_name, meta_name,
};
pub use index::{Entry, MemIndex, MetaIndex, SledIndex};
pub use layer::{CopyPath, MetaFiles, MetaLayer, MetaStats};
pub use profile::{Profile, Profiles};
pub use scan::{scan, scan_work, write_beside};
pub use server::{ExtRefusal, ExtServer, ExtStats};
