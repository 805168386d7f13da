//! Why a metadata file was refused.

use crate::limits::{MAX_META_LEN, META_VERSION, META_VERSION_HASHES};

/// Why a metadata file was refused. A proxy ignores such a file with a
/// warning and reads the described file the normal way.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum MetaError {
    /// The bytes end before the metadata file does.
    #[error("metadata file is truncated")]
    Truncated,
    /// The bytes do not start with `GVFSMETA`.
    #[error("not a gvfs metadata file (bad magic)")]
    BadMagic,
    /// A format version this build does not read.
    #[error(
        "metadata format version {0} is not supported (this build reads {low} to {high})",
        low = META_VERSION,
        high = META_VERSION_HASHES
    )]
    Version(u32),
    /// The CRC32 does not match the bytes.
    #[error("metadata file checksum mismatch")]
    Checksum,
    /// Longer than [`MAX_META_LEN`]: refused unread.
    #[error(
        "metadata file of {0} bytes is larger than the {limit} MiB limit",
        limit = MAX_META_LEN >> 20
    )]
    TooLarge(u64),
    /// Well-formed and checksummed, but a field is out of range or the zero
    /// map does not fit the file.
    #[error("invalid metadata: {0}")]
    Invalid(String),
}
