//! Waiting for bytes: a reader (or another proxy's FETCH) waits until
//! the range it needs has arrived, fetching what nobody fetches yet, each
//! fetch in a task of its own; a range's repeats wait for their sources.

use std::sync::Arc;
use std::time::Instant;

use gvfs_ext::{ChunkSource, Class, Want};
use gvfs_nfs::{BoxFuture, Credentials};

use super::state::Planned;
use crate::cache::FileCache;
use crate::chunks::{Chunk, chunks_of};
use crate::entry::CachedFile;
use crate::error::FileCacheError;

impl CachedFile {
    /// Waits until the data chunks under `from..end` (the source of a
    /// repeat, before the chunk that waits) have arrived, fetching those
    /// nobody fetches yet. A chunk of zeros there contradicts the repeat
    /// that points at it.
    pub(crate) fn wait_for<'a>(
        self: &'a Arc<Self>,
        cache: &'a Arc<FileCache>,
        source: &'a Arc<dyn ChunkSource>,
        cred: &'a Credentials,
        from: u64,
        end: u64,
        want: &'a Want,
    ) -> BoxFuture<'a, Result<(), FileCacheError>> {
        Box::pin(async move {
            if end <= from {
                return Ok(());
            }
            let (first, last) = chunks_of(from, end);
            {
                let chunks = self.fetch.chunks();
                let span = chunks
                    .get(first..=last)
                    .ok_or(FileCacheError::RepeatPastEnd)?;
                if span.contains(&Chunk::Zero) {
                    return Err(FileCacheError::RepeatFromZeros { from });
                }
            }
            self.ensure(cache, source, cred, from, end - from, want)
                .await
        })
    }

    /// Waits until `offset..offset + len` has arrived, fetching what
    /// nobody fetches yet (as `want`, upstream too): a reader (`Demand`)
    /// or a profile's run fetches the pieces its range covers, others
    /// whole chunks. A reader's wait counts as a fault when its bytes were
    /// not here. Kept pieces of its chunks not checked yet are checked
    /// first (`kept.rs`).
    pub(crate) async fn ensure(
        self: &Arc<Self>,
        cache: &Arc<FileCache>,
        source: &Arc<dyn ChunkSource>,
        cred: &Credentials,
        offset: u64,
        len: u64,
        want: &Want,
    ) -> Result<(), FileCacheError> {
        if len == 0 {
            return Ok(());
        }
        let end = offset + len;
        // Pieces kept from before a restart are checked before use.
        let (first, last) = chunks_of(offset, end);
        self.check_kept(cache, first, last).await?;
        let waited = Instant::now();
        let mut faulted = false;
        let mut rx = self.fetch.subscribe();
        loop {
            if let Some(why) = self.failure() {
                return Err(why);
            }
            let (fetch, waiting) = self.fetch.plan(offset, end, self.size(), want.class);
            if fetch.is_empty() && !waiting {
                break;
            }
            let demand = want.class == Class::Demand;
            if demand && !faulted {
                faulted = true;
                cache.counters.faults_waited.add(1);
            }
            // What it waits for may be queued at a lower class.
            self.fetch.raise(offset, end, want.class);
            if fetch.is_empty() {
                rx.changed().await.map_err(|_| FileCacheError::FetchGone)?;
                continue;
            }
            // Each in a task of its own: readers waiting for these bytes
            // (and the background fetch, which has passed them) must not
            // depend on this one, whose client may go away mid-fetch.
            let mut tasks = Vec::with_capacity(fetch.len());
            for Planned { idx, pieces, wait } in fetch {
                // The rest of a chunk behind a reader's pieces is a guess
                // at what it reads next, not a wait: it goes as the
                // background stream does, below any reader's demand.
                let want = if wait {
                    want.clone()
                } else {
                    Want::new(want.class.min(self.fetch.stream_class()), want.tenant)
                };
                let (me, cache, source, cred) =
                    (self.clone(), cache.clone(), source.clone(), cred.clone());
                if demand {
                    self.fetch.demand_started();
                }
                if !wait {
                    self.fetch.behind_started();
                }
                let task = tokio::spawn(async move {
                    let r = match pieces {
                        Some(run) => {
                            me.fetch_pieces(&cache, &source, &cred, idx, run, run, &want)
                                .await
                        }
                        None if !wait => me.stream_rest(&cache, &source, &cred, idx, &want).await,
                        None => me.fetch_chunk(&cache, &source, &cred, idx, &want).await,
                    };
                    if demand {
                        me.fetch.demand_ended();
                    }
                    if !wait {
                        me.fetch.behind_ended();
                    }
                    r
                });
                // A failure of one not waited for fails the entry.
                if wait {
                    tasks.push(task);
                }
            }
            for t in tasks {
                t.await
                    .map_err(|e| FileCacheError::task("a chunk's fetch", e))??;
            }
        }
        if faulted {
            cache
                .counters
                .fault_wait_micros
                .add(waited.elapsed().as_micros() as u64);
            tracing::debug!(
                offset,
                len,
                since_ms = self.fetch.since_born_ms(),
                waited_us = waited.elapsed().as_micros() as u64,
                "file cache: a reader waited for its bytes"
            );
        }
        Ok(())
    }
}
