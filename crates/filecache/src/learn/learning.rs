//! A learning under way: the pieces an entry's readers touch, first touch
//! first, and when to stop noting them.

use gvfs_ext::CHUNK;
use gvfs_ext::profile::MAX_PROFILE_PARTS;
use tokio::time::Instant;

use crate::chunks::{Chunk, Chunks};
use crate::pieces::PIECE;

/// How long readers must touch no new piece for the learning to end.
pub const LEARN_QUIET: std::time::Duration = std::time::Duration::from_secs(3);
/// The longest a learning lasts.
pub(crate) const LEARN_MAX: std::time::Duration = std::time::Duration::from_secs(300);

/// A learning under way.
#[derive(Debug)]
pub(crate) struct Learning {
    /// The pieces touched, first touch first.
    pub(crate) order: Vec<u32>,
    seen: Vec<bool>,
    started: Instant,
    last_new: Instant,
    /// The profile the fetch started with.
    pub(crate) known: Vec<u32>,
}

impl Learning {
    /// A learning of a file of `size` bytes.
    pub(crate) fn new(size: u64) -> Self {
        let now = Instant::now();
        Self {
            order: Vec::new(),
            seen: vec![false; usize::try_from(size.div_ceil(u64::from(PIECE))).unwrap_or(0)],
            started: now,
            last_new: now,
            known: Vec::new(),
        }
    }

    /// Whether it is over: readers went quiet, or it lasted long enough.
    pub(crate) fn done(&self) -> bool {
        (!self.order.is_empty() && self.last_new.elapsed() >= LEARN_QUIET)
            || self.started.elapsed() >= LEARN_MAX
    }

    /// Notes that a reader touched `offset..offset + len` (`len > 0`) of a
    /// file whose chunks are `chunks`: pieces in chunks of zeros are not
    /// noted.
    pub(crate) fn touch(&mut self, offset: u64, len: u64, chunks: &Chunks) {
        let end = offset.saturating_add(len);
        let first = offset / u64::from(PIECE);
        let last = (end - 1) / u64::from(PIECE);
        let per_chunk = u64::from(CHUNK / PIECE);
        for piece in first..=last.min((self.seen.len() as u64).saturating_sub(1)) {
            let idx = piece as usize;
            let zero = chunks.get((piece / per_chunk) as usize) == Some(&Chunk::Zero);
            if zero || self.seen[idx] || self.order.len() >= MAX_PROFILE_PARTS {
                continue;
            }
            self.seen[idx] = true;
            self.order.push(piece as u32);
            self.last_new = Instant::now();
        }
    }
}
