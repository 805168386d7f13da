//! The rest of a chunk that pieces of have been fetched: behind a
//! reader's pieces, a run at a time (`stream_rest`), or, once the
//! background stream claims the chunk, in one FETCH (`fetch_rest`; one
//! per part when pieces still on their way split it).

use std::sync::Arc;

use gvfs_ext::{ChunkSource, Want};
use gvfs_nfs::Credentials;

use crate::cache::FileCache;
use crate::chunks::{Chunk, Pieces};
use crate::entry::CachedFile;
use crate::error::FileCacheError;
use crate::pieces::{
    Mask, PIECE, all_pieces, cut, hashed_pieces_around, runs_of, span_bits, span_of,
};

/// Pieces in a run of the rest of a chunk fetched behind a reader's.
pub(crate) const STREAM_RUN: u32 = 64;

impl CachedFile {
    /// The rest of chunk `idx`, which a reader fetched pieces of, a run
    /// of at most [`STREAM_RUN`] pieces at a time from the reader's on,
    /// then from the chunk's start: what a reader faults on next in the
    /// chunk is queued behind no more than a run, or fetched by the reader
    /// itself (measured against the whole rest in one FETCH: never-cloned
    /// lazy clones 5.18 -> 4.82 s to running, 8.98 -> 8.91 s to their
    /// answer; runs of 32 pieces ran in 4.82 s but answered in 10.17 s).
    /// Fetched as the reader's (`want`).
    pub(crate) async fn stream_rest(
        self: &Arc<Self>,
        cache: &Arc<FileCache>,
        source: &Arc<dyn ChunkSource>,
        cred: &Credentials,
        idx: usize,
        want: &Want,
    ) -> Result<(), FileCacheError> {
        let (_, len) = self.chunk_range(idx);
        let all = all_pieces(len);
        let first = self
            .fetch
            .chunks()
            .pieces
            .get(&idx)
            .map_or(0, |p| p.fetching.trailing_zeros() / STREAM_RUN);
        let runs = Mask::BITS / STREAM_RUN;
        let mut result = Ok(());
        for i in 0..runs {
            let r = (first + i) % runs;
            let window = span_bits(r * STREAM_RUN, r * STREAM_RUN + STREAM_RUN - 1) & all;
            if window == 0 {
                continue;
            }
            let claimed = self.fetch.claim_pieces(idx, window);
            if claimed.is_empty() {
                if self.fetch.chunks().get(idx) != Some(&Chunk::Missing) {
                    break;
                }
                continue;
            }
            for claim in claimed {
                let run = self.widened(idx, claim, all);
                result = self
                    .fetch_pieces(cache, source, cred, idx, claim, run, want)
                    .await;
                if result.is_err() {
                    break;
                }
            }
            if result.is_err() {
                break;
            }
        }
        self.fetch.stop_streaming(idx);
        result
    }

    /// `run` (of chunk `idx`, whose pieces are `all`) widened, when the
    /// file has piece hashes, to the whole hashed pieces around it:
    /// checked, and open to held blocks. In a file with kept pieces, not
    /// over those kept (good, or still being checked: their bytes are
    /// not written over while read) nor others on their way: only as far
    /// out as none of them lies.
    fn widened(&self, idx: usize, run: Mask, all: Mask) -> Mask {
        if self.content.is_none() || run == 0 {
            return run;
        }
        let wide = hashed_pieces_around(run) & all;
        if self.kept.is_none() {
            return wide;
        }
        let p = self.fetch.pieces(idx);
        let free = wide & !((p.fetching | p.kept) & !run);
        let (mut first, mut last) = (run.trailing_zeros(), Mask::BITS - 1 - run.leading_zeros());
        while first > 0 && free & 1 << (first - 1) != 0 {
            first -= 1;
        }
        while last + 1 < Mask::BITS && free & 1 << (last + 1) != 0 {
            last += 1;
        }
        span_bits(first, last)
    }

    /// The pieces of chunk `idx` that are neither here nor on their way,
    /// in one FETCH of the run from the first to the last of them (the
    /// pieces between that are here already are fetched again, the same
    /// bytes of the same version: a chunk a profile left a few pieces of
    /// costs one round trip, not one per gap; but not pieces kept from
    /// before a restart, nor those fetched in an earlier round, which
    /// split the run), then waits for those on
    /// their way. Pieces on their way split the run, one FETCH per part,
    /// all at once: they are never fetched again. So does `part` (raw
    /// bytes, a multiple of the hashed piece: the source's
    /// [`ChunkSource::part`]), so that no FETCH asks for more. Pieces
    /// given back without arriving (kept ones that failed their check)
    /// are fetched then.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn fetch_rest(
        self: &Arc<Self>,
        cache: &Arc<FileCache>,
        source: &Arc<dyn ChunkSource>,
        cred: &Credentials,
        idx: usize,
        mut pieces: Pieces,
        want: &Want,
        part: u32,
    ) -> Result<(), FileCacheError> {
        let (_, len) = self.chunk_range(idx);
        let all = all_pieces(len);
        let mut rx = self.fetch.subscribe();
        // Pieces fetched here (claimed with the chunk, so not in `here`).
        let mut done: Mask = 0;
        loop {
            let ours = all & !pieces.here & !pieces.fetching & !done;
            // One FETCH per run, at once.
            let mut runs = tokio::task::JoinSet::new();
            // Not over pieces fetched here in an earlier round either.
            let parts = runs_of(span_of(ours) & !pieces.fetching & !pieces.kept & !done)
                .into_iter()
                .flat_map(|run| cut(run, part / PIECE));
            for part in parts {
                let run = span_of(part & ours);
                if run == 0 {
                    continue;
                }
                let run = self.widened(idx, run, all);
                let (me, cache, source, cred, want) = (
                    self.clone(),
                    cache.clone(),
                    source.clone(),
                    cred.clone(),
                    want.clone(),
                );
                runs.spawn(
                    async move { me.fetch_run(&cache, &source, &cred, idx, run, &want).await },
                );
            }
            while let Some(ended) = runs.join_next().await {
                ended.map_err(|e| FileCacheError::task("the rest of a chunk", e))??;
            }
            done |= ours;
            loop {
                if let Some(why) = self.failure() {
                    return Err(why);
                }
                let now = {
                    let chunks = self.fetch.chunks();
                    if chunks.get(idx).is_some_and(|c| c.here()) {
                        return Ok(());
                    }
                    chunks.pieces.get(&idx).copied().unwrap_or_default()
                };
                if (now.here | done) & all == all {
                    return Ok(());
                }
                // Given back unfetched (kept pieces that failed their
                // check; a failed fetch fails the file, seen above): ours
                // now.
                if self.kept.is_some() && all & !now.here & !now.fetching & !done != 0 {
                    pieces = now;
                    break;
                }
                rx.changed().await.map_err(|_| FileCacheError::FetchGone)?;
            }
        }
    }
}
