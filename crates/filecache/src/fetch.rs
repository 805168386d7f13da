//! Fetching a whole file into the cache: started on first use (making room
//! first), chunk by chunk through the extension program (FETCH: compressed
//! chunks and repeat runs), with readers waiting for the chunks they need.

use super::*;
use dedup::Held;
use pieces::{all_pieces, chunk_len, piece_mask, span_of};

/// A range to fetch, and why.
#[derive(Debug, Clone, Copy)]
struct Ask {
    offset: u64,
    count: u32,
    urgency: Urgency,
    /// The chunk it is all of, whose frame may be kept.
    whole: Option<usize>,
}

impl CachedFile {
    /// Claims the first chunk at or after `from` that nobody fetches yet.
    pub(super) fn claim_next(&self, from: usize) -> Option<usize> {
        let mut chunks = lock(&self.chunks);
        let idx = (from..chunks.len()).find(|&i| {
            chunks[i] == Chunk::Missing && !chunks.pieces.get(&i).is_some_and(|p| p.streaming)
        })?;
        chunks[idx] = Chunk::InFlight;
        Some(idx)
    }

    /// Whether readers fetched chunks of their own lately: the background
    /// stream then keeps only [`UNDER_DEMAND`] chunks in flight, so that
    /// what the readers wait for is not queued behind it on the link.
    pub(super) fn demand_active(&self) -> bool {
        if self.demand_in_flight.load(Ordering::Acquire) > 0 {
            return true;
        }
        let last = self.last_demand_ms.load(Ordering::Acquire);
        last != 0
            && (self.born.elapsed().as_millis() as u64 + 1).saturating_sub(last) < DEMAND_HOLD_MS
    }

    pub(super) fn set(&self, idx: usize, state: Chunk) {
        let mut chunks = lock(&self.chunks);
        chunks[idx] = state;
        if state.here() {
            chunks.pieces.remove(&idx);
        }
        drop(chunks);
        self.changed.send_modify(|v| *v += 1);
    }

    /// Claims the pieces of `mask` in chunk `idx` that are neither here nor
    /// being fetched, as one run (those between them too), if the chunk is
    /// not being fetched whole.
    pub(super) fn claim_pieces(&self, idx: usize, mask: Mask) -> Option<Mask> {
        let mut chunks = lock(&self.chunks);
        if chunks.get(idx) != Some(&Chunk::Missing) {
            return None;
        }
        let p = chunks.pieces.entry(idx).or_default();
        let need = span_of(mask & !p.here & !p.fetching);
        if need == 0 {
            return None;
        }
        p.fetching |= need;
        Some(need)
    }

    /// Fetches the run of pieces `mask` (claimed) of chunk `idx`.
    pub(super) async fn fetch_pieces(
        self: &Arc<Self>,
        cache: &Arc<FileCache>,
        source: &Arc<dyn ChunkSource>,
        cred: &Credentials,
        idx: usize,
        mask: Mask,
        urgency: Urgency,
    ) -> Result<(), FileCacheError> {
        let (_, len) = self.chunk_range(idx);
        let result = self
            .fetch_run(cache, source, cred, idx, mask, urgency)
            .await;
        {
            let mut chunks = lock(&self.chunks);
            let whole = chunks.get(idx).is_some_and(|c| c.here());
            let p = chunks.pieces.entry(idx).or_default();
            p.fetching &= !mask;
            if result.is_ok() {
                p.here |= mask;
            }
            let done = p.here & all_pieces(len) == all_pieces(len);
            if whole || (done && chunks[idx] == Chunk::Missing) {
                chunks[idx] = Chunk::Present;
                chunks.pieces.remove(&idx);
            }
        }
        self.changed.send_modify(|v| *v += 1);
        if let Err(why) = &result {
            self.fail(why.clone());
        }
        result
    }

    /// Fetches chunk `idx` (already claimed) and writes it into the file:
    /// whole, in one frame (kept for other proxies), or, when readers
    /// fetched pieces of it, the pieces still missing.
    pub(super) async fn fetch_chunk(
        self: &Arc<Self>,
        cache: &Arc<FileCache>,
        source: &Arc<dyn ChunkSource>,
        cred: &Credentials,
        idx: usize,
        urgency: Urgency,
    ) -> Result<(), FileCacheError> {
        let (offset, count) = self.chunk_range(idx);
        let pieces = lock(&self.chunks)
            .pieces
            .get(&idx)
            .copied()
            .unwrap_or_default();
        let result = if pieces.here | pieces.fetching == 0 {
            self.fetch_range(cache, source, cred, offset, count, urgency, Some(idx))
                .await
        } else {
            self.fetch_rest(cache, source, cred, idx, pieces, urgency)
                .await
        };
        match result {
            Ok(()) => {
                self.set(idx, Chunk::Present);
                Ok(())
            }
            Err(why) => {
                self.set(idx, Chunk::Missing);
                self.fail(why.clone());
                Err(why)
            }
        }
    }

    /// Fetches the pieces of chunk `idx` from the first of `run` to the
    /// last (nothing when it is empty); all of them in one frame, kept as
    /// a whole chunk's is.
    pub(super) async fn fetch_run(
        self: &Arc<Self>,
        cache: &Arc<FileCache>,
        source: &Arc<dyn ChunkSource>,
        cred: &Credentials,
        idx: usize,
        run: Mask,
        urgency: Urgency,
    ) -> Result<(), FileCacheError> {
        let (start, len) = self.chunk_range(idx);
        let from = start + u64::from(run.trailing_zeros() * PIECE);
        let to = (start + u64::from((Mask::BITS - run.leading_zeros()) * PIECE))
            .min(start + u64::from(len));
        if run == 0 || to <= from {
            return Ok(());
        }
        let whole = (run == all_pieces(len)).then_some(idx);
        self.fetch_range(
            cache,
            source,
            cred,
            from,
            (to - from) as u32,
            urgency,
            whole,
        )
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
        urgency: Urgency,
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
        let asked = Ask {
            offset,
            count,
            urgency,
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
        asked: Ask,
        held: Option<Held>,
        suspect: Option<Held>,
    ) -> Result<Option<Held>, FileCacheError> {
        let Ask {
            offset,
            count,
            urgency,
            whole,
        } = asked;
        let writes = self.writes.load(Ordering::Acquire);
        let args = FetchArgs {
            fh: self.fh.clone(),
            offset,
            count,
            have: held.as_ref().map(|h| h.have.clone()),
        };
        let ok = source.fetch(cred, &args, urgency).await?;
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
            self.wait_for(cache, source, cred, r.from, end, urgency)
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
        match urgency {
            Urgency::Demand => cache.counters.demand_wire_bytes.add(wire),
            Urgency::Profile => cache.counters.profile_wire_bytes.add(wire),
            Urgency::Background => cache.counters.background_wire_bytes.add(wire),
        }
        let (spent, dedup) = match done {
            Ok(done) => done,
            Err(held) => return Ok(Some(held)),
        };
        cache.counters.decompress_micros.add(spent);
        cache.counters.repeat_bytes.add(repeated);
        cache.counters.raw_bytes.add(u64::from(count));
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
        if self.content.is_none() || cache.blocks.get().is_none() {
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

    /// Waits until the data chunks under `from..end` (the source of a
    /// repeat, before the chunk that waits) have arrived, fetching those
    /// nobody fetches yet. A chunk of zeros there contradicts the repeat
    /// that points at it.
    pub(super) fn wait_for<'a>(
        self: &'a Arc<Self>,
        cache: &'a Arc<FileCache>,
        source: &'a Arc<dyn ChunkSource>,
        cred: &'a Credentials,
        from: u64,
        end: u64,
        urgency: Urgency,
    ) -> BoxFuture<'a, Result<(), FileCacheError>> {
        Box::pin(async move {
            if end <= from {
                return Ok(());
            }
            let (first, last) = chunks_of(from, end);
            {
                let chunks = lock(&self.chunks);
                let span = chunks
                    .get(first..=last)
                    .ok_or(FileCacheError::RepeatPastEnd)?;
                if span.contains(&Chunk::Zero) {
                    return Err(FileCacheError::RepeatFromZeros { from });
                }
            }
            self.ensure(cache, source, cred, from, end - from, urgency)
                .await
        })
    }

    /// Copies each repeat's source into `raw`, the chunk at `offset` (blocking
    /// I/O): bytes before the chunk from the file, the rest from `raw`.
    pub(super) fn fill_repeats(
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

    /// Waits until `offset..offset + len` has arrived, fetching what
    /// nobody fetches yet (with `urgency`): a reader (`Demand`) fetches the
    /// pieces its range covers, others whole chunks. A reader's wait counts
    /// as a fault when its bytes were not here.
    pub(super) async fn ensure(
        self: &Arc<Self>,
        cache: &Arc<FileCache>,
        source: &Arc<dyn ChunkSource>,
        cred: &Credentials,
        offset: u64,
        len: u64,
        urgency: Urgency,
    ) -> Result<(), FileCacheError> {
        if len == 0 {
            return Ok(());
        }
        let end = offset + len;
        let waited = Instant::now();
        let mut faulted = false;
        let mut rx = self.changed.subscribe();
        loop {
            if let Some(why) = self.failure() {
                return Err(why);
            }
            let (fetch, waiting) = self.plan_range(offset, end, urgency);
            if fetch.is_empty() && !waiting {
                break;
            }
            if urgency == Urgency::Demand && !faulted {
                faulted = true;
                cache.counters.faults_waited.add(1);
            }
            if fetch.is_empty() {
                rx.changed().await.map_err(|_| FileCacheError::FetchGone)?;
                continue;
            }
            // Each in a task of its own: readers waiting for these bytes
            // (and the background fetch, which has passed them) must not
            // depend on this one, whose client may go away mid-fetch.
            let mut tasks = Vec::with_capacity(fetch.len());
            for Planned { idx, pieces, wait } in fetch {
                let (me, cache, source, cred) =
                    (self.clone(), cache.clone(), source.clone(), cred.clone());
                let demand = urgency == Urgency::Demand;
                if demand {
                    self.demand_in_flight.fetch_add(1, Ordering::AcqRel);
                }
                if !wait {
                    self.behind_in_flight.fetch_add(1, Ordering::AcqRel);
                }
                let task = tokio::spawn(async move {
                    let r = match pieces {
                        Some(mask) => {
                            me.fetch_pieces(&cache, &source, &cred, idx, mask, urgency)
                                .await
                        }
                        None if !wait => me.stream_rest(&cache, &source, &cred, idx).await,
                        None => me.fetch_chunk(&cache, &source, &cred, idx, urgency).await,
                    };
                    if demand {
                        me.last_demand_ms
                            .store(me.born.elapsed().as_millis() as u64 + 1, Ordering::Release);
                        me.demand_in_flight.fetch_sub(1, Ordering::AcqRel);
                    }
                    if !wait {
                        me.behind_in_flight.fetch_sub(1, Ordering::AcqRel);
                        me.changed.send_modify(|v| *v += 1);
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
                since_ms = self.born.elapsed().as_millis() as u64,
                waited_us = waited.elapsed().as_micros() as u64,
                "file cache: a reader waited for its bytes"
            );
        }
        Ok(())
    }

    /// What `offset..end` still needs: fetches to start, claimed here
    /// (a chunk's pieces for a reader, else one whole chunk), and whether
    /// some of it is on its way.
    fn plan_range(&self, offset: u64, end: u64, urgency: Urgency) -> (Vec<Planned>, bool) {
        let size = self.size();
        let (first, last) = chunks_of(offset, end);
        let mut fetch: Vec<Planned> = Vec::new();
        let mut waiting = false;
        let mut chunks = lock(&self.chunks);
        let last = last.min(chunks.len().saturating_sub(1));
        for idx in first..=last {
            let state = chunks[idx];
            if state.here() {
                continue;
            }
            let len = chunk_len(size, idx);
            let want = piece_mask(idx, len, offset, end);
            let p = chunks.pieces.get(&idx).copied().unwrap_or_default();
            if p.here & want == want {
                continue;
            }
            waiting = true;
            // A reader fetches the pieces it needs. A reader of a file
            // with no working-set profile (an image never cloned here)
            // faults all over it: the rest of the chunk comes right behind
            // its pieces (not waited for), so its next faults nearby find
            // their bytes here, and the background stream goes on after
            // it. With a profile, the profile brings the rest.
            let demand = urgency == Urgency::Demand;
            let pieces = urgency == Urgency::Profile || demand;
            let rest = demand && !self.profiled.load(Ordering::Acquire);
            if demand {
                self.follow.store(idx + 2, Ordering::Release);
            }
            let whole_planned = fetch.iter().any(|f| f.pieces.is_none());
            match state {
                Chunk::Missing if pieces => {
                    let need = span_of(want & !p.here & !p.fetching);
                    if need != 0 {
                        chunks.pieces.entry(idx).or_default().fetching |= need;
                        fetch.push(Planned::waited(idx, Some(need)));
                    }
                    let p = chunks.pieces.entry(idx).or_default();
                    if rest && !p.streaming {
                        p.streaming = true;
                        fetch.push(Planned {
                            idx,
                            pieces: None,
                            wait: false,
                        });
                    }
                }
                Chunk::Missing if !whole_planned => {
                    chunks[idx] = Chunk::InFlight;
                    fetch.push(Planned::waited(idx, None));
                }
                _ => {}
            }
        }
        (fetch, waiting)
    }
}

/// A fetch a reader's wait starts.
struct Planned {
    idx: usize,
    /// The pieces, claimed; `None`: the chunk (claimed whole).
    pieces: Option<Mask>,
    /// Whether the reader waits for it to end, not only for its bytes.
    wait: bool,
}

impl Planned {
    fn waited(idx: usize, pieces: Option<Mask>) -> Self {
        Planned {
            idx,
            pieces,
            wait: true,
        }
    }
}

impl FileCache {
    /// The entry for this version of the file, starting its fetch from
    /// `source` when there is none. `zero` (the file's valid metadata)
    /// spares fetching chunks of zeros. Fails when the file cannot be held
    /// (over the budget, local I/O).
    ///
    /// With `learn` (the file's own clients read it here, rather than
    /// other proxies fetching it) the order in which readers first touch
    /// its chunks is learned as its working-set profile (`learn.rs`).
    pub fn start(
        self: &Arc<Self>,
        fh: &[u8],
        attrs: &fattr3,
        zero: Option<&MetaFile>,
        source: Arc<dyn ChunkSource>,
        cred: &Credentials,
        learn: bool,
    ) -> Result<Arc<CachedFile>, FileCacheError> {
        let mut files = lock(&self.files);
        if let Some(f) = files.get(fh) {
            if f.busy() || (f.failure().is_none() && same_version(&f.attrs(), attrs)) {
                if !f.complete() {
                    self.counters.coalesced_fetches.add(1);
                }
                return Ok(f.clone());
            }
            let old = files.remove(fh);
            if let Some(old) = old {
                self.discard(&old);
            }
        }
        self.make_room(&mut files, attrs.size)?;
        // A record left of an earlier entry (let go without a flush since)
        // must not survive a crash to describe the half-fetched file about
        // to be made at its path.
        if let Some(index) = &self.index {
            index
                .remove(&index_key(fh))
                .and_then(|()| index.flush())
                .map_err(|source| FileCacheError::Index {
                    op: "clearing the record of a file",
                    source,
                })?;
        }
        let path = self.dir.join(file_name(fh));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .and_then(|f| f.set_len(attrs.size).map(|()| f))
            .map_err(|e| FileCacheError::io("creating", &path, e))?;
        let n = CachedFile::chunk_count(attrs.size);
        let mut chunks = vec![Chunk::Missing; n];
        let mut zeros = 0;
        if let Some(m) = zero {
            for (i, c) in chunks.iter_mut().enumerate() {
                let start = i as u64 * u64::from(CHUNK);
                let len = (attrs.size - start).min(u64::from(CHUNK));
                if m.range_is_zero(start, len) {
                    *c = Chunk::Zero;
                    zeros += 1;
                }
            }
        }
        self.counters.zero_chunks.add(zeros);
        self.counters.files_fetched.add(1);
        let entry = Arc::new(CachedFile {
            fh: fh.to_vec(),
            versions: Mutex::new(Versions::new(attrs.clone())),
            writes: AtomicU64::new(0),
            frames: FrameStore::new(frames_path(&path)),
            path,
            file,
            chunks: Mutex::new(Chunks::new(chunks)),
            changed: watch::channel(0).0,
            failed: Mutex::new(None),
            last_used: AtomicU64::new(now_secs()),
            unpinned: tokio::sync::Notify::new(),
            born: Instant::now(),
            last_demand_ms: AtomicU64::new(0),
            demand_in_flight: AtomicUsize::new(0),
            behind_in_flight: AtomicUsize::new(0),
            follow: AtomicUsize::new(0),
            profiled: AtomicBool::new(false),
            learning: Mutex::new(learn.then(|| Learning::new(attrs.size))),
            content: zero
                .filter(|m| m.hashes.is_some() && m.file_size == attrs.size)
                .map(|m| Arc::new(m.clone())),
            dedup_bytes: AtomicU64::new(0),
        });
        files.insert(fh.to_vec(), entry.clone());
        drop(files);
        if learn {
            tokio::spawn(
                self.clone()
                    .learn(entry.clone(), source.clone(), cred.clone()),
            );
        }
        tokio::spawn(self.clone().fetch_all(entry.clone(), source, cred.clone()));
        Ok(entry)
    }

    /// Evicts finished or failed files, least recently used first, until
    /// `size` more bytes fit.
    pub(super) fn make_room(
        &self,
        files: &mut HashMap<Vec<u8>, Arc<CachedFile>>,
        size: u64,
    ) -> Result<(), FileCacheError> {
        if size > self.max_bytes {
            return Err(FileCacheError::TooLarge {
                size,
                max: self.max_bytes,
            });
        }
        loop {
            let held: u64 = files.values().map(|f| f.size() + f.frames.bytes()).sum();
            if held + size <= self.max_bytes {
                return Ok(());
            }
            let victim = files
                .values()
                .filter(|f| !f.busy() && (f.complete() || f.failure().is_some()))
                .min_by_key(|f| f.last_used.load(Ordering::Relaxed))
                .map(|f| f.fh.clone());
            let Some(fh) = victim else {
                return Err(FileCacheError::Full);
            };
            if let Some(f) = files.remove(&fh) {
                self.discard(&f);
                self.counters.evicted.add(1);
            }
        }
    }

    /// The background fetch of a whole file: first the chunks of its
    /// working-set profile, if one is known ([`PROFILE_WINDOW`] in
    /// flight), then the rest in file order, going on from the chunk after
    /// a reader's latest fetch ([`WINDOW`] in flight, or [`UNDER_DEMAND`]
    /// while readers fetch chunks of their own), then what that passed
    /// over; then sync and record it.
    pub(super) async fn fetch_all(
        self: Arc<Self>,
        entry: Arc<CachedFile>,
        source: Arc<dyn ChunkSource>,
        cred: Credentials,
    ) {
        let started = Instant::now();
        let plan = self.profile_plan(&entry, &source, &cred).await;
        entry.profiled.store(!plan.is_empty(), Ordering::Release);
        tracing::debug!(
            file = %entry.path.display(),
            runs = plan.len(),
            since_ms = entry.born.elapsed().as_millis() as u64,
            "file cache: whole-file fetch starts"
        );
        let mut set = tokio::task::JoinSet::new();
        let (mut planned, mut next, mut followed) = (0, 0, 0);
        // Bytes of profile pieces in flight.
        let mut profile_bytes = 0;
        let mut rx = entry.changed.subscribe();
        loop {
            let mut exhausted = false;
            loop {
                let window = if planned < plan.len() {
                    PROFILE_WINDOW
                } else if entry.demand_active() {
                    UNDER_DEMAND
                } else {
                    WINDOW
                };
                // The rests of chunks readers fetch behind their pieces
                // take the background's place on the link.
                let behind = entry.behind_in_flight.load(Ordering::Acquire);
                if set.len() + behind >= window
                    || (planned < plan.len() && !set.is_empty() && profile_bytes >= PROFILE_BYTES)
                    || entry.failure().is_some()
                {
                    break;
                }
                let mut claimed = None;
                while claimed.is_none() && planned < plan.len() {
                    let (idx, mask) = plan[planned];
                    claimed = entry.claim_pieces(idx, mask).map(|need| (idx, Some(need)));
                    planned += 1;
                }
                // Where a reader faulted last, then on from there;
                // what that passed over, from the start when at the end.
                let follow = entry.follow.load(Ordering::Acquire);
                if follow != followed {
                    (followed, next) = (follow, follow - 1);
                }
                let (idx, pieces) = match claimed {
                    Some(c) => c,
                    None => match entry.claim_next(next).or_else(|| entry.claim_next(0)) {
                        Some(idx) => {
                            next = idx + 1;
                            (idx, None)
                        }
                        None => {
                            exhausted = true;
                            break;
                        }
                    },
                };
                let (cache, entry, source, cred) =
                    (self.clone(), entry.clone(), source.clone(), cred.clone());
                match pieces {
                    Some(mask) => {
                        let n = mask.count_ones();
                        self.counters.profile_pieces.add(u64::from(n));
                        let bytes = u64::from(n * PIECE);
                        profile_bytes += bytes;
                        set.spawn(async move {
                            let _ = entry
                                .fetch_pieces(&cache, &source, &cred, idx, mask, Urgency::Profile)
                                .await;
                            bytes
                        });
                    }
                    None => {
                        set.spawn(async move {
                            let _ = entry
                                .fetch_chunk(&cache, &source, &cred, idx, Urgency::Background)
                                .await;
                            0
                        });
                    }
                }
            }
            if set.is_empty() && !exhausted && entry.failure().is_none() {
                // Held back by readers' fetches: on when something arrives.
                if rx.changed().await.is_err() {
                    break;
                }
                continue;
            }
            match set.join_next().await {
                Some(done) => profile_bytes -= done.unwrap_or(0).min(profile_bytes),
                None => break,
            }
        }
        // Chunks that readers fetched themselves may still be arriving.
        let mut rx = entry.changed.subscribe();
        while entry.failure().is_none() && !entry.complete() {
            if rx.changed().await.is_err() {
                break;
            }
        }
        if let Some(why) = entry.failure() {
            self.counters.files_failed.add(1);
            tracing::debug!(%why, "file fetch failed");
            let mut files = lock(&self.files);
            if files.get(&entry.fh).is_some_and(|f| Arc::ptr_eq(f, &entry)) {
                files.remove(&entry.fh);
                self.discard(&entry);
            }
            return;
        }
        let e = entry.clone();
        let synced = match tokio::task::spawn_blocking(move || e.file.sync_all()).await {
            Ok(r) => r.map_err(|e| FileCacheError::io("syncing the fetched file", &entry.path, e)),
            Err(e) => Err(FileCacheError::task("syncing the fetched file", e)),
        };
        if let Err(why) = synced {
            entry.fail(why);
            return;
        }
        // Only if still the entry: one let go meanwhile must leave no
        // record to describe the file a newer entry makes at its path.
        self.record_lazily(&entry);
        self.counters.files_complete.add(1);
        self.counters
            .fetch_micros
            .add(started.elapsed().as_micros() as u64);
        tracing::info!(
            file = %entry.path.display(),
            bytes = entry.size(),
            secs = started.elapsed().as_secs_f64(),
            "file cache: fetched a whole file"
        );
    }
}
