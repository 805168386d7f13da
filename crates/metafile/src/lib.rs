//! The metadata file `.NAME.gvfsmeta` that describes an image `NAME` (the
//! GVFS paper, section 3.2.2): its bytes, made and read here without I/O
//! but for [`scan`] of a local file.
//!
//! - [`format`](mod@format): the byte layout (specified there), the
//!   decoded [`MetaFile`] and its defensive decoder (the bytes come from the
//!   image server).
//! - [`zeromap`]: which blocks are all zeros, run-length encoded.
//! - [`hashes`]: block fingerprints and piece hashes (dedup across images).
//! - [`scan`](mod@scan): a metadata file made from a local file;
//!   [`write_beside`] puts it next to it.
//! - [`trust`]: whether a metadata file may be believed about its file.
//!
//! Nothing here knows NFS calls or the network: the proxy's layers read
//! metadata files through the stack and decode them here.
#![warn(missing_docs)]

mod error;
pub mod format;
pub mod hashes;
pub mod limits;
pub mod scan;
pub mod trust;
pub mod zeromap;

pub use error::MetaError;
pub use format::{
    Actions, ByteRepeat, LEVEL, MAX_BLOCK_SIZE, MAX_META_LEN, META_SUFFIX, MIN_BLOCK_SIZE,
    MetaFile, Repeat, block_count, described_name, is_meta_name, meta_name,
};
pub use hashes::{BlockHashes, Fingerprint, PieceHash};
pub use scan::{scan, scan_work, write_beside};
pub use zeromap::ZeroMap;
