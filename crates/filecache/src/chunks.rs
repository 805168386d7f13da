//! A file's chunks: their arithmetic ([`CHUNK`]-sized, the last one
//! shorter), the state of each ([`Chunk`]) and the pieces of those not
//! whole yet ([`Pieces`]), as a file's [`FetchState`] keeps them.
//!
//! [`FetchState`]: crate::fetch::state::FetchState

use std::collections::HashMap;

use gvfs_ext::CHUNK;
use gvfs_metafile::scan::data_extent;

use crate::pieces::Mask;

/// Where a chunk of a file stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Chunk {
    /// Not here, and nobody fetches it whole (pieces of it may be here or
    /// on their way: see [`Pieces`]).
    Missing,
    /// Claimed whole by a fetch under way.
    InFlight,
    /// Here, in the local file.
    Present,
    /// All zeros by the zero map (or, for a file kept across a restart, a
    /// hole in it): a hole in the local file, read as zeros without
    /// touching it.
    Zero,
}

impl Chunk {
    /// Whether its bytes can be read.
    pub(crate) fn here(self) -> bool {
        matches!(self, Chunk::Present | Chunk::Zero)
    }
}

/// Which pieces of a chunk that is not whole yet are here, and which are
/// being fetched.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Pieces {
    pub(crate) here: Mask,
    pub(crate) fetching: Mask,
    /// Whether the rest of the chunk is being fetched behind a reader's
    /// pieces, a run at a time (the background stream leaves it).
    pub(crate) streaming: bool,
    /// Pieces kept from before a restart that passed their check (also
    /// in `here`): never fetched again as part of a longer run.
    pub(crate) kept: Mask,
}

/// The state of a file's chunks, and the pieces of those not whole yet.
#[derive(Debug)]
pub(crate) struct Chunks {
    state: Vec<Chunk>,
    pub(crate) pieces: HashMap<usize, Pieces>,
}

impl Chunks {
    pub(crate) fn new(state: Vec<Chunk>) -> Self {
        Self {
            state,
            pieces: HashMap::new(),
        }
    }
}

impl std::ops::Deref for Chunks {
    type Target = Vec<Chunk>;
    fn deref(&self) -> &Vec<Chunk> {
        &self.state
    }
}

impl std::ops::DerefMut for Chunks {
    fn deref_mut(&mut self) -> &mut Vec<Chunk> {
        &mut self.state
    }
}

/// Chunks of a file of `size` bytes.
pub(crate) fn chunk_count(size: u64) -> usize {
    usize::try_from(size.div_ceil(u64::from(CHUNK))).unwrap_or(usize::MAX)
}

/// Bytes of chunk `idx` of a file of `size` bytes.
pub(crate) fn chunk_len(size: u64, idx: usize) -> u32 {
    let start = idx as u64 * u64::from(CHUNK);
    size.saturating_sub(start).min(u64::from(CHUNK)) as u32
}

/// The first and last chunk of `offset..end` (`end > offset`).
pub(crate) fn chunks_of(offset: u64, end: u64) -> (usize, usize) {
    (
        (offset / u64::from(CHUNK)) as usize,
        ((end - 1) / u64::from(CHUNK)) as usize,
    )
}

/// The chunks of a file kept from before a restart: those wholly in holes
/// of the (sparse) file are zeros, as the zero map made them when it was
/// fetched, and are answered without reading it; the rest are data.
pub(crate) fn restored_chunks(file: &std::fs::File, size: u64) -> Vec<Chunk> {
    let mut chunks = vec![Chunk::Zero; chunk_count(size)];
    let chunk = u64::from(CHUNK);
    let mut pos = 0;
    while pos < size {
        let (start, end) = data_extent(file, pos, size);
        if start >= end {
            break;
        }
        let (first, last) = ((start / chunk) as usize, ((end - 1) / chunk) as usize);
        for c in chunks.iter_mut().take(last + 1).skip(first) {
            *c = Chunk::Present;
        }
        pos = end;
    }
    chunks
}
