//! The read path: READs answered from cached blocks (dirty bytes laid
//! over fetched ones), misses fetched whole and coalesced, and read-ahead.

use super::*;

impl CacheLayer {
    pub(super) async fn read(
        &self,
        cx: &CallContext,
        args: READ3args,
    ) -> Result<NfsReply, ServiceError> {
        self.counters.reads.add(1);
        let fh = args.file.data.to_vec();
        let attrs = match self.file_attrs(cx, &fh).await? {
            Ok(a) => a,
            Err(st) => return Ok(NfsReply::error(gvfs_nfs::NfsProc::Read, st)),
        };
        if attrs.type_ != ftype3::NF3REG {
            return self.below.call(cx, NfsRequest::Read(args)).await;
        }
        let dirty_file = self.files().get(&fh).is_some_and(|s| s.overlay.is_some());
        match self
            .read_cached(cx, &fh, args.offset, args.count, attrs)
            .await
        {
            Ok(reply) => Ok(reply),
            Err(e @ ServiceError::Layer(_)) if !dirty_file => {
                tracing::warn!("block cache read failed ({e}); forwarding the READ");
                self.below.call(cx, NfsRequest::Read(args)).await
            }
            Err(e) => Err(e),
        }
    }

    pub(super) async fn read_cached(
        &self,
        cx: &CallContext,
        fh: &[u8],
        offset: u64,
        count: u32,
        attrs: fattr3,
    ) -> Result<NfsReply, ServiceError> {
        let count = u64::from(count.min(MAX_DATA));
        let size = attrs.size;
        if offset >= size || count == 0 {
            return Ok(read_reply(Some(attrs), Vec::new(), offset >= size));
        }
        let bs = self.block_size();
        let end = (offset + count).min(size);
        let first = offset / bs;
        let last = (end - 1) / bs;
        // (block, offset in block, length)
        let spans: Vec<(u64, u32, u32)> = (first..=last)
            .map(|b| {
                let lo = offset.max(b * bs);
                let hi = end.min((b + 1) * bs);
                (b, (lo - b * bs) as u32, (hi - lo) as u32)
            })
            .collect();
        // One buffer for the whole reply: hits are read straight into it,
        // here if their bytes are in memory, else with one blocking hop for
        // the rest; misses are filled in below.
        let mut data = vec![0u8; (end - offset) as usize];
        let now = self.store_now(|s| s.read_range_now(fh, offset, &mut data))?;
        let (mut data, hits) = if now == spans.len() {
            (data, vec![true; now])
        } else {
            let key = fh.to_vec();
            let from = offset.max((first + now as u64) * bs);
            self.store_op(move |s| {
                let mut hits = vec![true; now];
                hits.extend(s.read_range_into(
                    &key,
                    from,
                    &mut data[(from - offset) as usize..],
                )?);
                Ok((data, hits))
            })
            .await?
        };
        let missing: Vec<usize> = (0..spans.len()).filter(|&i| !hits[i]).collect();
        let hit = missing.is_empty();
        let mut readahead_hit = self.take_prefetched(fh, &spans, &hits);
        if !missing.is_empty() {
            let me = self.me().ok_or(LayerError::Dropped)?;
            let mut set = tokio::task::JoinSet::new();
            for &i in &missing {
                let (me, cred, key, block) = (me.clone(), cx.cred.clone(), fh.to_vec(), spans[i].0);
                set.spawn(async move { (i, me.fetch_block(cred, key, block, false).await) });
            }
            let mut fetched: Vec<(usize, Arc<Fetched>)> = Vec::new();
            while let Some(joined) = set.join_next().await {
                let (i, r) = joined.map_err(|source| LayerError::Task {
                    task: "fetch",
                    source,
                })?;
                match r {
                    Ok(f) => {
                        readahead_hit |= f.readahead;
                        fetched.push((i, f));
                    }
                    Err(FetchError::Service(e)) => return Err(e),
                    Err(FetchError::Nfs(st)) => {
                        let a = self.effective(fh);
                        return Ok(NfsReply::Read(Nfs3Result::Err((
                            st,
                            READ3resfail {
                                file_attributes: post_op(a),
                            },
                        ))));
                    }
                }
            }
            // Read back through the store, which merges dirty sub-blocks;
            // fall back to upstream's bytes with the dirty data laid over.
            let key = fh.to_vec();
            // (block, offset in block, length, position in `data`, bytes)
            let wanted: Vec<(u64, u32, usize, usize, Arc<Fetched>)> = fetched
                .into_iter()
                .map(|(i, f)| {
                    let (b, o, n) = spans[i];
                    (
                        b,
                        o,
                        n as usize,
                        (b * bs + u64::from(o) - offset) as usize,
                        f,
                    )
                })
                .collect();
            data = self
                .store_op(move |s| {
                    for (b, o, n, at, f) in wanted {
                        let dst = &mut data[at..at + n];
                        if !s.read_into(&key, b, o, dst)? {
                            compose_into(&f, s.dirty_overlay(&key, b)?.as_ref(), o, dst);
                        }
                    }
                    Ok(data)
                })
                .await?;
        }
        // Upstream may have reported a new size while we fetched.
        let attrs = self.effective(fh).unwrap_or(attrs);
        let keep = attrs.size.saturating_sub(offset).min(data.len() as u64) as usize;
        data.truncate(keep);
        let eof = offset + data.len() as u64 >= attrs.size;
        let n = data.len() as u64;
        self.counters.read_bytes.add(n);
        if hit {
            self.counters.hits.add(1);
            self.counters.hit_bytes.add(n);
        } else {
            self.counters.misses.add(1);
        }
        if readahead_hit {
            self.counters.readahead_hits.add(1);
        }
        self.maybe_read_ahead(cx, fh, offset, offset + n, attrs.size);
        Ok(read_reply(Some(attrs), data, eof))
    }

    /// Forgets blocks of `spans` that were read ahead and are now served
    /// from the cache; true if there was any.
    pub(super) fn take_prefetched(
        &self,
        fh: &[u8],
        spans: &[(u64, u32, u32)],
        hits: &[bool],
    ) -> bool {
        let mut p = lock(&self.prefetched);
        if p.is_empty() {
            return false;
        }
        let mut any = false;
        for (&(b, _, _), &hit) in spans.iter().zip(hits) {
            if hit {
                any |= p.remove(&(fh.to_vec(), b));
            }
        }
        any
    }

    /// Fetches block `block` of `fh` from upstream and fills it into the
    /// store clean, joining a fetch of the same block already in flight.
    pub(super) async fn fetch_block(
        self: Arc<Self>,
        cred: Credentials,
        fh: Vec<u8>,
        block: u64,
        readahead: bool,
    ) -> FetchResult {
        let key = (fh.clone(), block);
        let role = {
            let mut flights = lock(&self.flights);
            match flights.get(&key) {
                Some(rx) => Err(rx.clone()),
                None => {
                    let (tx, rx) = watch::channel(None);
                    flights.insert(key.clone(), rx);
                    Ok(tx)
                }
            }
        };
        match role {
            Err(mut rx) => {
                self.counters.coalesced_misses.add(1);
                if let Ok(v) = rx.wait_for(|v| v.is_some()).await
                    && let Some(r) = v.as_ref()
                {
                    return r.clone();
                }
                // The fetch we joined was abandoned: do it ourselves.
                self.fetch_and_fill(&cred, &fh, block, readahead).await
            }
            Ok(tx) => {
                let _flight = FlightGuard {
                    layer: &self,
                    key: Some(key),
                };
                // A fetch that ended between our miss and taking the flight
                // (read-ahead, usually) has filled the block already.
                let generation = self.files().generation(&fh);
                let r = match self.cached_block(&fh, block).await {
                    Some(data) => Ok(Arc::new(Fetched {
                        data,
                        readahead: false,
                        generation,
                    })),
                    None => self.fetch_and_fill(&cred, &fh, block, readahead).await,
                };
                tx.send_replace(Some(r.clone()));
                r
            }
        }
    }

    /// The whole of `block` of `fh` when the store holds it all.
    pub(super) async fn cached_block(&self, fh: &[u8], block: u64) -> Option<Vec<u8>> {
        let (key, bs) = (fh.to_vec(), self.block_size() as usize);
        self.store_raw(move |s| {
            let mut buf = vec![0u8; bs];
            Ok(s.read_into(&key, block, 0, &mut buf)?.then_some(buf))
        })
        .await
        .ok()
        .flatten()
    }

    /// The block at `start` of `fh` (up to the end of the file) copied
    /// from the same content held elsewhere here, when it all is.
    async fn held_copy(&self, fh: &[u8], start: u64) -> Option<Vec<u8>> {
        let held = self.held_elsewhere.clone()?;
        if !held.knows(fh) {
            return None;
        }
        let size = self.files().get(fh)?.upstream.as_ref()?.size;
        let len = self.block_size().min(size.checked_sub(start)?);
        if len == 0 {
            return None;
        }
        let key = fh.to_vec();
        tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; len as usize];
            held.read(&key, start, &mut buf).then_some(buf)
        })
        .await
        .ok()
        .flatten()
    }

    pub(super) async fn fetch_and_fill(
        &self,
        cred: &Credentials,
        fh: &[u8],
        block: u64,
        readahead: bool,
    ) -> FetchResult {
        let cx = CallContext::with_cred(cred.clone());
        let generation = self.files().generation(fh);
        let bs = self.block_size();
        let start = block * bs;
        let mut data: Vec<u8> = Vec::new();
        // A block wholly past upstream's end reads as zeros: no READ.
        let past_end = self
            .files()
            .get(fh)
            .and_then(|st| st.upstream.as_ref())
            .is_some_and(|a| a.size <= start);
        let mut eof = past_end;
        let mut copied = 0;
        if !eof && let Some(copy) = self.held_copy(fh, start).await {
            // Same content held here: no READ below.
            copied = copy.len() as u64;
            self.counters.held_fill_bytes.add(copied);
            eof = copied < bs;
            data = copy;
        }
        while !eof && (data.len() as u64) < bs {
            let want = (bs - data.len() as u64) as u32;
            match self
                .below
                .read(&cx, fh, start + data.len() as u64, want)
                .await?
            {
                Nfs3Result::Ok(ok) => {
                    self.note_post_op(fh, &ok.file_attributes, Seen::Foreign)
                        .await;
                    let got = ok.data.len().min(want as usize);
                    data.extend_from_slice(&ok.data[..got]);
                    if ok.eof || got == 0 {
                        eof = true;
                        break;
                    }
                }
                Nfs3Result::Err((st, fail)) => {
                    self.note_post_op(fh, &fail.file_attributes, Seen::Foreign)
                        .await;
                    return Err(FetchError::Nfs(st));
                }
            }
        }
        self.counters.fetched_bytes.add(data.len() as u64 - copied);
        // Past the end of the file a block reads as zeros: cache the whole
        // block so the tail sub-block and later extending writes fit.
        let mut fill = data.clone();
        if eof {
            fill.resize(bs as usize, 0);
        }
        let files = self.files.clone();
        let key = fh.to_vec();
        let filled = self
            .store_raw(move |s| {
                let still = || lock(&files).generation(&key) == generation;
                let outcome = s.write_if(&key, block, 0, &fill, WriteMode::Clean, still)?;
                Ok(outcome == Some(WriteOutcome::Stored))
            })
            .await;
        if matches!(filled, Ok(true))
            && let Some(held) = &self.held_elsewhere
        {
            held.held(fh, start, data.len() as u64);
        }
        if readahead && matches!(filled, Ok(true)) {
            let mut p = lock(&self.prefetched);
            if p.len() >= MAX_PREFETCHED {
                p.clear();
            }
            p.insert((fh.to_vec(), block));
        }
        Ok(Arc::new(Fetched {
            data,
            readahead,
            generation,
        }))
    }

    /// Starts read-ahead after a READ of `offset..end` when it continued
    /// the previous READ of the file.
    pub(super) fn maybe_read_ahead(
        &self,
        cx: &CallContext,
        fh: &[u8],
        offset: u64,
        end: u64,
        size: u64,
    ) {
        let ra = u64::from(self.config.readahead_blocks);
        let bs = self.block_size();
        let window = {
            let mut files = self.files();
            let st = files.entry(fh);
            // Reads that skip only known zeros (answered above us) are
            // still one sequential stream.
            let sequential = st.next_read == Some(offset)
                || st.next_read.is_some_and(|n| {
                    n < offset
                        && self
                            .zero_hint
                            .as_ref()
                            .is_some_and(|h| h(fh, n, offset - n))
                });
            st.next_read = Some(end);
            if !sequential {
                st.readahead_next = 0;
                st.run_start = offset;
            }
            // A read at the start of a file starts a run, as a kernel's
            // does: whoever opens a file reads its header, then what it
            // points to.
            if !(sequential || offset == 0) || ra == 0 || end == 0 {
                return;
            }
            // The window grows with the run, as a kernel's does: two small
            // reads that happen to touch (a disk image's tables) do not pull
            // a whole window across the WAN; a stream reaches it at once.
            let run = end.saturating_sub(st.run_start).div_ceil(bs).max(1);
            let from = ((end - 1) / bs + 1).max(st.readahead_next);
            let to = ((end - 1) / bs + 1 + ra.min(run)).min(size.div_ceil(bs));
            if from >= to {
                return;
            }
            (from, to)
        };
        // All there already (the usual case on a warm cache): no task and
        // no blocking hop just to find that out.
        if let Ok(Some(true)) = self.store.all_cached_now(fh, window.0..window.1) {
            self.files().entry(fh).readahead_next = window.1;
            return;
        }
        let Ok(permit) = self.readahead_slots.clone().try_acquire_owned() else {
            return;
        };
        let Some(me) = self.me() else { return };
        self.files().entry(fh).readahead_next = window.1;
        let (cred, key) = (cx.cred.clone(), fh.to_vec());
        tokio::spawn(async move {
            let _permit = permit;
            me.read_ahead(cred, key, window.0..window.1).await;
        });
    }

    pub(super) async fn read_ahead(
        self: Arc<Self>,
        cred: Credentials,
        fh: Vec<u8>,
        blocks: std::ops::Range<u64>,
    ) {
        let key = fh.clone();
        let n = self.geo.sub_blocks_per_block();
        let wanted: Vec<u64> = match self
            .store_raw(move |s| {
                let mut out = Vec::new();
                for b in blocks {
                    if s.valid_sub_blocks(&key, b)?.count() < n {
                        out.push(b);
                    }
                }
                Ok(out)
            })
            .await
        {
            Ok(w) => w,
            Err(_) => return,
        };
        let bs = self.block_size();
        let known_zero = |b: u64| self.zero_hint.as_ref().is_some_and(|h| h(&fh, b * bs, bs));
        let mut set = tokio::task::JoinSet::new();
        for b in wanted.into_iter().filter(|&b| !known_zero(b)) {
            let (me, cred, fh) = (self.clone(), cred.clone(), fh.clone());
            set.spawn(async move { me.fetch_block(cred, fh, b, true).await });
            self.counters.readahead_blocks.add(1);
        }
        while set.join_next().await.is_some() {}
    }

    // ---- WRITE and COMMIT ----
}

/// Removes a block fetch from the in-flight map when its leader finishes
/// (or is dropped).
struct FlightGuard<'a> {
    layer: &'a CacheLayer,
    key: Option<BlockKey>,
}

impl Drop for FlightGuard<'_> {
    fn drop(&mut self) {
        if let Some(k) = self.key.take() {
            lock(&self.layer.flights).remove(&k);
        }
    }
}

pub(super) fn read_reply(attrs: Option<fattr3>, data: Vec<u8>, eof: bool) -> NfsReply {
    NfsReply::Read(Nfs3Result::Ok(READ3resok {
        file_attributes: post_op(attrs),
        count: data.len() as u32,
        eof,
        data: Opaque::owned(data),
    }))
}

/// Fills `out` with the `out.len()` bytes at `offset` of a block:
/// upstream's bytes (zeros past its end) with the cache's dirty bytes laid
/// over them.
pub(super) fn compose_into(f: &Fetched, dirty: Option<&DirtyData>, offset: u32, out: &mut [u8]) {
    let (lo, hi) = (offset as usize, offset as usize + out.len());
    let have = f.data.len().min(hi);
    if have > lo {
        out[..have - lo].copy_from_slice(&f.data[lo..have]);
        out[have - lo..].fill(0);
    } else {
        out.fill(0);
    }
    for e in dirty.map(|d| d.extents.as_slice()).unwrap_or_default() {
        let (elo, ehi) = (e.offset as usize, e.offset as usize + e.data.len());
        let (a, b) = (elo.max(lo), ehi.min(hi));
        if a < b {
            out[a - lo..b - lo].copy_from_slice(&e.data[a - elo..b - elo]);
        }
    }
}
