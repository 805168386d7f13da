//! FETCH_HAVE: a FETCH whose caller says which blocks of the range it
//! holds already (copied from other images it holds with the same content
//! hash, the file cache's block index), so the answer carries zeros there (which compress
//! to nothing).
//!
//! ```text
//!   8  FETCH_HAVE  (fetch_have_args) -> fetch_repeats_res
//!
//! struct fetch_have_args {
//!     fetch_args args;
//!     bool       demand;      /* a reader waits (as FETCH_DEMAND), else as
//!                                FETCH_REPEATS */
//!     uint32     block_size;  /* a power of two, 4 KiB..=1 MiB */
//!     opaque     have<32>;    /* bit i (byte i / 8, bit i % 8): the caller
//!                                holds offset + i * block_size.., clipped
//!                                to the range; offset is a multiple of
//!                                block_size */
//! };
//! ```
//!
//! Why the receiver says what it has, rather than the sender listing
//! hashes first: the receiver already knows every block's hash from the
//! image's metadata file, so it costs one bit per block inside the call it
//! makes anyway (at most 32 bytes a chunk), where a list of hashes would
//! cost a round trip and 32 bytes a block before any data moved.
//!
//! The answer may carry the held blocks after all: a proxy answering from
//! its file cache sends a whole chunk in the frame it keeps for its site's
//! callers (compressing it again for each would cost more than the bytes
//! on a LAN); only the proxy next to the image server, which keeps no
//! frames, and a part of a chunk always leave them out. The caller places
//! its own blocks over whatever came.
//!
//! A caller whose upstream answers PROC_UNAVAIL (an older proxy) asks
//! with FETCH_REPEATS or FETCH_DEMAND from then on and gets every byte.

use gvfs_metafile::MIN_BLOCK_SIZE;

use crate::proto::CHUNK;

/// Most bytes of a have bitmap: one bit per 4 KiB block of a chunk.
pub const MAX_HAVE_BYTES: usize = (CHUNK / MIN_BLOCK_SIZE / 8) as usize;

/// Blocks of a FETCH's range the caller holds already.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Have {
    /// The blocks' size.
    pub block_size: u32,
    /// Bit `i`: the caller holds block `i` of the range.
    pub bits: Vec<u8>,
}

impl Have {
    /// No blocks yet, of `block_size`, for a range of `count` bytes.
    pub fn new(block_size: u32, count: u32) -> Self {
        let blocks = count.div_ceil(block_size.max(1)) as usize;
        Self {
            block_size,
            bits: vec![0; blocks.div_ceil(8).min(MAX_HAVE_BYTES)],
        }
    }

    /// Marks block `i` of the range held.
    pub fn set(&mut self, i: usize) {
        if let Some(b) = self.bits.get_mut(i / 8) {
            *b |= 1 << (i % 8);
        }
    }

    /// Whether block `i` of the range is held.
    pub fn has(&self, i: usize) -> bool {
        self.bits
            .get(i / 8)
            .is_some_and(|b| b & (1 << (i % 8)) != 0)
    }

    /// Whether no block is held.
    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|&b| b == 0)
    }

    /// The held byte ranges of `offset..offset + len`, relative to
    /// `offset`, merged.
    pub fn ranges(&self, len: usize) -> Vec<(usize, usize)> {
        let bs = self.block_size as usize;
        let mut out: Vec<(usize, usize)> = Vec::new();
        for i in 0..self.bits.len() * 8 {
            if !self.has(i) {
                continue;
            }
            let (a, b) = (i * bs, ((i + 1) * bs).min(len));
            if a >= b {
                break;
            }
            match out.last_mut() {
                Some(r) if r.1 == a => r.1 = b,
                _ => out.push((a, b)),
            }
        }
        out
    }

    /// Zeros the held blocks of `data`, the range's bytes; returns how
    /// many bytes that zeroed.
    pub fn zero_in(&self, data: &mut [u8]) -> u64 {
        let mut n = 0;
        for (a, b) in self.ranges(data.len()) {
            data[a..b].fill(0);
            n += (b - a) as u64;
        }
        n
    }
}
