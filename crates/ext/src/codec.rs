//! How a chunk's bytes travel: stored, or one zstd frame that never
//! decompresses to more than it announced.

use std::sync::Arc;

use gvfs_nfs::xdr::XdrError;

use crate::error::ChunkError;
use crate::proto::{CHUNK, MAX_FRAME_SLACK};

/// How a chunk's bytes travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// As they are (they did not compress).
    Stored = 0,
    /// One zstd frame.
    Zstd = 1,
}

pub(crate) fn codec_of(v: u32) -> Result<Codec, XdrError> {
    match v {
        0 => Ok(Codec::Stored),
        1 => Ok(Codec::Zstd),
        v => Err(XdrError::InvalidValue(v)),
    }
}

pub(crate) fn data_limit(codec: Codec, raw_len: u32) -> usize {
    match codec {
        Codec::Stored => raw_len as usize,
        Codec::Zstd => (CHUNK + MAX_FRAME_SLACK) as usize,
    }
}

pub(crate) fn unpack(codec: Codec, data: Vec<u8>, raw_len: u32) -> Result<Vec<u8>, ChunkError> {
    let raw = match codec {
        Codec::Stored => data,
        Codec::Zstd => {
            zstd::bulk::decompress(&data, raw_len as usize).map_err(|e| ChunkError::BadFrame {
                source: Arc::new(e),
            })?
        }
    };
    if raw.len() != raw_len as usize {
        return Err(ChunkError::WrongLength {
            got: raw.len(),
            announced: raw_len,
        });
    }
    Ok(raw)
}

/// Compresses one chunk: a zstd frame, or the bytes as they are when the
/// frame would not be smaller.
pub fn compress(raw: &[u8], level: i32) -> (Codec, Vec<u8>) {
    match zstd::bulk::compress(raw, level) {
        Ok(z) if z.len() < raw.len() => (Codec::Zstd, z),
        _ => (Codec::Stored, raw.to_vec()),
    }
}
