//! Fetching one range of a file, the unit every fetch comes down to: a
//! run of pieces, a whole chunk, or the rest of one. A range's blocks held
//! here already are copied, not fetched (`dedup/`); the FETCH answer is
//! checked against the version fetched, its repeats filled (their sources
//! before the range waited for first), checked against the piece hashes,
//! written into the local file and then recorded in its progress log; a
//! whole chunk's frame is kept for other proxies. Each fetch ends by telling the [`FetchState`] what
//! arrived.
//!
//! [`FetchState`]: super::state::FetchState

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use gvfs_ext::{CHUNK, ChunkSource, Class, FetchArgs, Want, decompress};
use gvfs_metafile::ByteRepeat;
use gvfs_nfs::{Credentials, same_version};

use crate::cache::FileCache;
use crate::chunks::Chunk;
use crate::dedup::file::Held;
use crate::entry::CachedFile;
use crate::error::FileCacheError;
use crate::frames::Frame;
use crate::pieces::{Mask, PIECE, all_pieces};

/// A range to fetch, and why.
#[derive(Debug, Clone, Copy)]
struct Ask<'a> {
    offset: u64,
    count: u32,
    want: &'a Want,
    /// The chunk it is all of, whose frame may be kept.
    whole: Option<usize>,
}

impl CachedFile {
    /// Fetches the run of pieces `run` of chunk `idx`, which holds the
    /// pieces `claimed` (claimed; the rest of the run, if any, is here
    /// already or another's).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn fetch_pieces(
        self: &Arc<Self>,
        cache: &Arc<FileCache>,
        source: &Arc<dyn ChunkSource>,
        cred: &Credentials,
        idx: usize,
        claimed: Mask,
        run: Mask,
        want: &Want,
    ) -> Result<(), FileCacheError> {
        let (_, len) = self.chunk_range(idx);
        let result = self.fetch_run(cache, source, cred, idx, run, want).await;
        // The failure first: whoever its ending wakes sees the file failed,
        // not pieces given back to fetch again.
        if let Err(why) = &result {
            self.fail(why.clone());
        }
        self.fetch
            .pieces_ended(idx, len, claimed, run, result.is_ok());
        result
    }

    /// Fetches chunk `idx` (already claimed) and writes it into the file:
    /// whole, in one frame (kept for other proxies), or, when readers
    /// fetched pieces of it or the source wants background and bulk
    /// chunks in parts ([`ChunkSource::part`]: demand is about on a slow
    /// link), the pieces still missing, a part a FETCH.
    pub(crate) async fn fetch_chunk(
        self: &Arc<Self>,
        cache: &Arc<FileCache>,
        source: &Arc<dyn ChunkSource>,
        cred: &Credentials,
        idx: usize,
        want: &Want,
    ) -> Result<(), FileCacheError> {
        let (offset, count) = self.chunk_range(idx);
        let pieces = self.fetch.pieces(idx);
        let part = match want.class {
            Class::Background | Class::Bulk => source.part(want.class),
            Class::Profile | Class::Demand => CHUNK,
        };
        let whole = pieces.here | pieces.fetching == 0;
        let result = if whole && part >= count {
            self.fetch_range(cache, source, cred, offset, count, want, Some(idx))
                .await
        } else {
            if whole {
                cache.counters.parted_chunks.inc();
            }
            self.fetch_rest(cache, source, cred, idx, pieces, want, part)
                .await
        };
        match result {
            Ok(()) => {
                self.fetch.set(idx, Chunk::Present);
                Ok(())
            }
            Err(why) => {
                self.fetch.set(idx, Chunk::Missing);
                self.fail(why.clone());
                Err(why)
            }
        }
    }

    /// Fetches the pieces of chunk `idx` from the first of `run` to the
    /// last (nothing when it is empty); all of them in one frame, kept as
    /// a whole chunk's is.
    pub(crate) async fn fetch_run(
        self: &Arc<Self>,
        cache: &Arc<FileCache>,
        source: &Arc<dyn ChunkSource>,
        cred: &Credentials,
        idx: usize,
        run: Mask,
        want: &Want,
    ) -> Result<(), FileCacheError> {
        let (start, len) = self.chunk_range(idx);
        let from = start + u64::from(run.trailing_zeros() * PIECE);
        let to = (start + u64::from((Mask::BITS - run.leading_zeros()) * PIECE))
            .min(start + u64::from(len));
        if run == 0 || to <= from {
            return Ok(());
        }
        let whole = (run == all_pieces(len)).then_some(idx);
        self.fetch_range(cache, source, cred, from, (to - from) as u32, want, whole)
            .await
    }

    /// Fetches `offset..offset + count` (inside one chunk) and writes it
    /// into the file; the frame of a whole chunk (`whole`) is kept for
    /// other proxies when this proxy keeps frames.
    #[allow(clippy::too_many_arguments)]
    async fn fetch_range(
        self: &Arc<Self>,
        cache: &Arc<FileCache>,
        source: &Arc<dyn ChunkSource>,
        cred: &Credentials,
        offset: u64,
        count: u32,
        want: &Want,
        whole: Option<usize>,
    ) -> Result<(), FileCacheError> {
        let mut held = self.find_held(cache, offset, count).await?;
        let mut suspect = None;
        if let Some(all) = held.take_if(|h| h.all) {
            if self.copy_held(cache, &all, offset, count).await? {
                return Ok(());
            }
            suspect = Some(all);
        }
        let held = held.filter(|h| !h.blocks.is_empty());
        // Under a ticket a reader waiting for this chunk can raise.
        let idx = usize::try_from(offset / u64::from(CHUNK)).unwrap_or(usize::MAX);
        let bytes = offset..offset.saturating_add(u64::from(count));
        let (want, _ticket) = self.fetch.ticket(idx, bytes, want);
        let asked = Ask {
            offset,
            count,
            want: &want,
            whole,
        };
        if let Some(wrong) = self
            .fetch_into(cache, source, cred, asked, held, suspect)
            .await?
        {
            // Some held block was not what its fingerprint promised: the
            // whole range again, and the wrong ones found by comparing.
            self.fetch_into(cache, source, cred, asked, None, Some(wrong))
                .await?;
        }
        Ok(())
    }

    /// Fetches a range (leaving out the `held` blocks, placed from here),
    /// checks it against the piece hashes and writes it. Returns the held
    /// blocks, unwritten, when the range they went into failed its hashes;
    /// with `suspect` (blocks that did), drops those the fetched bytes
    /// show wrong from the index.
    async fn fetch_into(
        self: &Arc<Self>,
        cache: &Arc<FileCache>,
        source: &Arc<dyn ChunkSource>,
        cred: &Credentials,
        asked: Ask<'_>,
        held: Option<Held>,
        suspect: Option<Held>,
    ) -> Result<Option<Held>, FileCacheError> {
        let Ask {
            offset,
            count,
            want,
            whole,
        } = asked;
        let writes = self.versions.writes_seen();
        let args = FetchArgs {
            fh: self.fh.clone(),
            offset,
            count,
            have: held.as_ref().map(|h| h.have.clone()),
        };
        let ok = source.fetch(cred, &args, want).await?;
        if !same_version(&ok.attrs, &self.attrs()) {
            return Err(FileCacheError::ChangedUpstream);
        }
        if ok.raw_len != count {
            return Err(FileCacheError::ShortChunk {
                offset,
                got: ok.raw_len,
                expected: count,
            });
        }
        let wire = ok.data.len() as u64;
        ok.check_repeats(offset)?;
        let mut ok = ok;
        let repeats = std::mem::take(&mut ok.repeats);
        // Their sources before this range must be here first: earlier
        // bytes, which never wait for later ones (fetched now if nobody
        // fetches them yet, as urgently as this range).
        for r in repeats.iter().filter(|r| r.from < offset) {
            let end = (r.from + u64::from(r.len)).min(offset);
            self.wait_for(cache, source, cred, r.from, end, want)
                .await?;
        }
        let repeated: u64 = repeats.iter().map(|r| u64::from(r.len)).sum();
        // A frame with held blocks left out is not the chunk's.
        let keep = whole.filter(|_| cache.keep_frames.load(Ordering::Relaxed) && held.is_none());
        let (me, c) = (self.clone(), cache.clone());
        let done = tokio::task::spawn_blocking(move || {
            // Kept with its repeats: handed on only to callers that
            // fill them.
            let frame = keep.map(|idx| {
                (
                    idx,
                    Frame {
                        codec: ok.codec,
                        data: ok.data.clone(),
                        repeats: repeats.clone(),
                        left_out: 0,
                    },
                )
            });
            let t = Instant::now();
            let mut raw = decompress(ok)?;
            let spent = t.elapsed().as_micros() as u64;
            if let Some(held) = &held {
                held.place(&mut raw);
            }
            me.fill_repeats(&mut raw, offset, &repeats)?;
            let checked = me.check_pieces(&c, offset, &raw);
            let dedup = held.as_ref().map_or(0, Held::bytes);
            if let Some(held) = held.filter(|_| checked.is_some_and(|bad| bad > 0)) {
                return Ok(Err(held));
            }
            if let Some(suspect) = &suspect {
                me.drop_wrong(&c, suspect, &raw);
            }
            me.file
                .write_all_at(&raw, offset)
                .map_err(|e| FileCacheError::io("writing", &me.path, e))?;
            // Handed to the kernel: now it may be recorded.
            me.note_progress(offset, &raw);
            if let Some((idx, frame)) = frame {
                me.keep_frame(idx, &frame, writes);
            }
            if checked == Some(0) {
                me.note_blocks(&c, offset, &raw);
            }
            Ok::<_, FileCacheError>(Ok((spent, dedup)))
        })
        .await
        .map_err(|e| FileCacheError::task("decompressing a chunk", e))??;
        cache.counters.chunks_fetched.add(1);
        cache.counters.wire_bytes.add(wire);
        // By the class it was asked as (a reader may have raised it since:
        // a stream's chunk is still the stream's bytes).
        match want.class {
            Class::Demand => cache.counters.demand_wire_bytes.add(wire),
            Class::Profile => cache.counters.profile_wire_bytes.add(wire),
            Class::Background => cache.counters.background_wire_bytes.add(wire),
            Class::Bulk => cache.counters.bulk_wire_bytes.add(wire),
        }
        let (spent, dedup) = match done {
            Ok(done) => done,
            Err(held) => return Ok(Some(held)),
        };
        cache.counters.decompress_micros.add(spent);
        cache.counters.repeat_bytes.add(repeated);
        cache.counters.raw_bytes.add(u64::from(count));
        self.count_refetched(cache, offset, count);
        self.count_dedup(cache, dedup);
        Ok(None)
    }

    /// The blocks of the range held here already (dedup), when the file
    /// has hashes and dedup is on.
    async fn find_held(
        self: &Arc<Self>,
        cache: &Arc<FileCache>,
        offset: u64,
        count: u32,
    ) -> Result<Option<Held>, FileCacheError> {
        if self.content.is_none() || cache.dedup.blocks.as_ref().is_none() {
            return Ok(None);
        }
        let (me, c) = (self.clone(), cache.clone());
        tokio::task::spawn_blocking(move || me.held_blocks(&c, offset, count))
            .await
            .map_err(|e| FileCacheError::task("looking for held blocks", e))
    }

    /// Writes a range whose every non-zero block is held here, if it
    /// passes its piece hashes: nothing is fetched. `false` if it does not
    /// (nothing written).
    async fn copy_held(
        self: &Arc<Self>,
        cache: &Arc<FileCache>,
        held: &Held,
        offset: u64,
        count: u32,
    ) -> Result<bool, FileCacheError> {
        let mut raw = vec![0u8; count as usize];
        held.place(&mut raw);
        let (me, c) = (self.clone(), cache.clone());
        let copied = tokio::task::spawn_blocking(move || {
            if me.check_pieces(&c, offset, &raw) != Some(0) {
                return Ok(false);
            }
            me.file
                .write_all_at(&raw, offset)
                .map_err(|e| FileCacheError::io("writing", &me.path, e))?;
            me.note_progress(offset, &raw);
            me.note_blocks(&c, offset, &raw);
            Ok::<_, FileCacheError>(true)
        })
        .await
        .map_err(|e| FileCacheError::task("copying held blocks", e))??;
        if copied {
            cache.counters.dedup_fetches_saved.add(1);
            self.count_dedup(cache, held.bytes());
        }
        Ok(copied)
    }

    fn count_dedup(&self, cache: &FileCache, bytes: u64) {
        cache.counters.dedup_bytes.add(bytes);
        self.dedup_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Copies each repeat's source into `raw`, the chunk at `offset` (blocking
    /// I/O): bytes before the chunk from the file, the rest from `raw`.
    pub(crate) fn fill_repeats(
        &self,
        raw: &mut [u8],
        offset: u64,
        repeats: &[ByteRepeat],
    ) -> Result<(), FileCacheError> {
        for r in repeats {
            let to = (r.to - offset) as usize;
            let len = r.len as usize;
            let before = offset.saturating_sub(r.from).min(u64::from(r.len)) as usize;
            if before > 0 {
                self.file
                    .read_exact_at(&mut raw[to..to + before], r.from)
                    .map_err(|e| FileCacheError::io("reading", &self.path, e))?;
            }
            if before < len {
                let from = (r.from + before as u64 - offset) as usize;
                raw.copy_within(from..from + (len - before), to + before);
            }
        }
        Ok(())
    }
}
