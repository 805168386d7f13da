//! A learning under way: the pieces an entry's readers touch, first touch
//! first, and when it closes.
//!
//! It closes, whichever comes first:
//! - [`Closed::Quiet`]: readers touched no new piece for [`LEARN_QUIET`];
//! - [`Closed::Time`]: the window ([`LearnSettings::window`]) after the
//!   first piece noted has passed, quiet or not (a busy guest never goes
//!   quiet);
//! - [`Closed::Size`]: a new piece came when the learning already held as
//!   many as a profile may ([`MAX_PROFILE_PARTS`], and no more than
//!   [`KEEP_SHARE`] of the file's data pieces);
//! - [`Closed::Ended`]: someone who knows the guest is ready said so
//!   (`FileCache::end_learning`);
//! - [`Closed::Idle`]: nothing at all was touched for [`LEARN_MAX`].
//!
//! Once closed it notes nothing more: a profile holds only what was
//! touched before.

use std::time::Duration;

use gvfs_ext::CHUNK;
use gvfs_ext::profile::MAX_PROFILE_PARTS;
use tokio::time::Instant;

use crate::chunks::{Chunk, Chunks, chunk_len};
use crate::pieces::PIECE;

/// How long readers must touch no new piece for the learning to end.
pub const LEARN_QUIET: Duration = Duration::from_secs(3);
/// The longest a learning waits for its first piece; also the longest
/// window.
pub const LEARN_MAX: Duration = Duration::from_secs(300);
/// The window when none is configured: a guest resumed from a snapshot
/// answers within seconds, and what it touches after that comes slowly.
pub const DEFAULT_LEARN_WINDOW: Duration = Duration::from_secs(20);
/// The largest share of a file's data a profile may name (numerator,
/// denominator): one that names more is most of the image, a copy's
/// worth of bytes fetched first, and ordering them helps nobody.
pub const KEEP_SHARE: (u64, u64) = (2, 3);

/// How learnings end, given to the cache at open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LearnSettings {
    /// How long after the first piece noted a learning closes, quiet or
    /// not (`--learn-window`).
    pub window: Duration,
}

impl Default for LearnSettings {
    fn default() -> Self {
        Self {
            window: DEFAULT_LEARN_WINDOW,
        }
    }
}

/// Why a learning closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Closed {
    /// Readers touched nothing new for [`LEARN_QUIET`].
    Quiet,
    /// The window after the first piece passed.
    Time,
    /// It held as many pieces as a profile may.
    Size,
    /// Ended on request.
    Ended,
    /// Nothing was touched for [`LEARN_MAX`].
    Idle,
}

/// Bytes of a file of `size` bytes in chunks that are not zeros.
pub(crate) fn data_bytes(size: u64, chunks: &[Chunk]) -> u64 {
    chunks
        .iter()
        .enumerate()
        .filter(|(_, c)| **c != Chunk::Zero)
        .map(|(i, _)| u64::from(chunk_len(size, i)))
        .sum()
}

/// Whether `part_bytes` of a file with `data` bytes of data is over
/// [`KEEP_SHARE`].
pub(crate) fn over_share(part_bytes: u64, data: u64) -> bool {
    u128::from(part_bytes) * u128::from(KEEP_SHARE.1) > u128::from(data) * u128::from(KEEP_SHARE.0)
}

/// A learning under way.
#[derive(Debug)]
pub(crate) struct Learning {
    /// The pieces touched, first touch first.
    pub(crate) order: Vec<u32>,
    seen: Vec<bool>,
    started: Instant,
    first_touch: Option<Instant>,
    last_new: Instant,
    window: Duration,
    /// Most pieces noted.
    pub(crate) max_parts: usize,
    /// Whether `max_parts` is [`KEEP_SHARE`] of the data (not the
    /// profile format's own limit): a learning closed by size is then
    /// most of the image.
    share_caps: bool,
    closed: Option<Closed>,
    /// The profile the fetch started with.
    pub(crate) known: Vec<u32>,
}

impl Learning {
    /// A learning of a file of `size` bytes whose chunks are `chunks` (its
    /// chunks of zeros known).
    pub(crate) fn new(size: u64, chunks: &[Chunk], settings: &LearnSettings) -> Self {
        let now = Instant::now();
        let data_pieces: u64 = chunks
            .iter()
            .enumerate()
            .filter(|(_, c)| **c != Chunk::Zero)
            .map(|(i, _)| u64::from(chunk_len(size, i)).div_ceil(u64::from(PIECE)))
            .sum();
        let share =
            usize::try_from(data_pieces * KEEP_SHARE.0 / KEEP_SHARE.1).unwrap_or(usize::MAX);
        Self {
            order: Vec::new(),
            seen: vec![false; usize::try_from(size.div_ceil(u64::from(PIECE))).unwrap_or(0)],
            started: now,
            first_touch: None,
            last_new: now,
            window: settings.window,
            max_parts: share.min(MAX_PROFILE_PARTS),
            share_caps: share <= MAX_PROFILE_PARTS,
            closed: None,
            known: Vec::new(),
        }
    }

    /// Why it closed, if it has (deciding now if a deadline passed).
    pub(crate) fn closed(&mut self) -> Option<Closed> {
        if self.closed.is_some() {
            return self.closed;
        }
        let now = Instant::now();
        self.closed = match self.first_touch {
            None => (now >= self.started + LEARN_MAX).then_some(Closed::Idle),
            Some(first) => {
                // The deadline that passed first.
                let (time, quiet) = (first + self.window, self.last_new + LEARN_QUIET);
                if now < time.min(quiet) {
                    None
                } else if time <= quiet {
                    Some(Closed::Time)
                } else {
                    Some(Closed::Quiet)
                }
            }
        };
        self.closed
    }

    /// Ends it now; `false` when it had closed already.
    pub(crate) fn end(&mut self) -> bool {
        if self.closed().is_some() {
            return false;
        }
        self.closed = Some(Closed::Ended);
        true
    }

    /// Whether it closed by size at [`KEEP_SHARE`]: readers touched most
    /// of the file's data, so no profile of it is kept.
    pub(crate) fn too_big(&self) -> bool {
        self.closed == Some(Closed::Size) && self.share_caps
    }

    /// Notes that a reader touched `offset..offset + len` (`len > 0`) of a
    /// file whose chunks are `chunks`: pieces in chunks of zeros are not
    /// noted, nor anything once it closed.
    pub(crate) fn touch(&mut self, offset: u64, len: u64, chunks: &Chunks) {
        if self.closed().is_some() {
            return;
        }
        let end = offset.saturating_add(len);
        let first = offset / u64::from(PIECE);
        let last = (end - 1) / u64::from(PIECE);
        let per_chunk = u64::from(CHUNK / PIECE);
        let now = Instant::now();
        for piece in first..=last.min((self.seen.len() as u64).saturating_sub(1)) {
            let idx = piece as usize;
            let zero = chunks.get((piece / per_chunk) as usize) == Some(&Chunk::Zero);
            if zero || self.seen[idx] {
                continue;
            }
            if self.order.len() >= self.max_parts {
                self.closed = Some(Closed::Size);
                return;
            }
            self.seen[idx] = true;
            self.order.push(piece as u32);
            self.last_new = now;
            self.first_touch.get_or_insert(now);
        }
    }
}
