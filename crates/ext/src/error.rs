//! The crate's errors.

use std::io;
use std::sync::Arc;

use gvfs_nfs::net::client::ClientError;
use gvfs_nfs::nfs3_types::nfs3::nfsstat3;
use gvfs_nfs::xdr::XdrError;

/// Why a FETCH (or STORE) through a [`ChunkSource`] failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// Upstream answered with an NFS error.
    #[error("upstream answered {0:?}")]
    Nfs(nfsstat3),
    /// Upstream did not answer, refused us, or did not run the call.
    #[error(transparent)]
    Transport(#[from] ClientError),
    /// Upstream's results do not decode.
    #[error("{server}: bad {call} reply: {source}")]
    BadReply {
        /// Where the client connects.
        server: String,
        /// Which call ("FETCH", "STORE").
        call: &'static str,
        /// What is wrong with the results.
        source: XdrError,
    },
}

/// Why a chunk of a whole-file transfer (a FETCH answer, a STORE's
/// arguments) was refused: what its sender said does not hold.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ChunkError {
    /// The zstd frame does not decompress, or not into at most the bytes
    /// announced.
    #[error("bad zstd frame: {source}")]
    BadFrame {
        /// What zstd said.
        source: Arc<io::Error>,
    },
    /// The chunk holds another number of bytes than announced.
    #[error("chunk holds {got} bytes, announced {announced}")]
    WrongLength {
        /// Bytes it holds.
        got: usize,
        /// Bytes announced (`raw_len`).
        announced: u32,
    },
    /// A repeat lies outside the chunk, out of order, overlapping the one
    /// before, or with its source not before it.
    #[error("repeat of {to}+{len} from {from} does not fit the chunk at {offset}")]
    RepeatOutside {
        /// Where the repeated bytes go.
        to: u64,
        /// How many.
        len: u32,
        /// Where they come from.
        from: u64,
        /// Where the chunk starts.
        offset: u64,
    },
}
