//! The write path of the store and its dirty data: allocating frames,
//! writes (clean fills and dirty writes, sub-block by sub-block), the dirty
//! data write-back reads and marks clean, dropping, invalidation,
//! truncation, and the sync that makes dirty data committed.

use super::*;

/// What a write does to one sub-block it touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Covered whole: the data replaces it.
    Whole,
    /// Valid and partly covered: read, update, write.
    Update,
    /// A clean fill covering a partial sub-block: upstream's bytes around
    /// the extent, which is kept.
    Merge,
    /// Not cached, partly covered by a dirty write: becomes partial with
    /// this extent.
    Extent(u32, u32),
    /// Partial, and the dirty write overlaps or touches its extent: the
    /// extent grows to this.
    Grow(u32, u32),
}

impl Inner {
    pub(super) fn dirty_block(&self, id: usize) -> DirtyBlock {
        let f = &self.frames[id];
        let sbs = self.geo.sub_block_size();
        let (fh, block) = f.key.clone().unwrap_or((FileHandle::from_checked(&[]), 0));
        DirtyBlock {
            fh,
            block,
            ranges: f.dirty_ranges(sbs),
        }
    }

    /// Finds a frame for a block not cached: `Err(victim)` if the set is all
    /// dirty.
    pub(super) fn allocate(&mut self, fh: &[u8], block: u64) -> Result<Result<usize, DirtyBlock>> {
        let ways = self.ways();
        let base = self.geo.set_index(fh, block) as usize * ways;
        let id = match choose_victim(&self.frames[base..base + ways]) {
            Victim::Empty(w) => base + w,
            Victim::Clean(w) => base + w,
            Victim::CleanAfterSync(w) => {
                self.sync()?;
                base + w
            }
            Victim::AllDirty(w) => {
                self.stats.write_backs_needed += 1;
                return Ok(Err(self.dirty_block(base + w)));
            }
        };
        if let Some((old_fh, old_block)) = self.frames[id].key.take() {
            self.unindex(&old_fh, old_block);
            self.stats.evictions += 1;
        }
        self.frames[id].clear();
        let fh = FileHandle::from_checked(fh);
        self.frames[id].key = Some((fh.clone(), block));
        self.index.entry(fh).or_default().insert(block, id);
        Ok(Ok(id))
    }

    pub(super) fn unindex(&mut self, fh: &FileHandle, block: u64) {
        self.on_drop.call(fh.as_bytes(), block);
        if let Some(m) = self.index.get_mut(fh.as_bytes()) {
            m.remove(&block);
            if m.is_empty() {
                self.index.remove(fh.as_bytes());
            }
        }
    }

    /// Durably flags bank `b` as holding unsynced dirty writes (a barrier
    /// before the first such write).
    pub(super) fn flag_unsynced(&mut self, b: usize) -> Result<()> {
        if self.banks[b].header.sync == SyncState::DirtyUnsynced {
            return Ok(());
        }
        let mut h = self.banks[b].header;
        h.sync = SyncState::DirtyUnsynced;
        self.write_header(b, h)?;
        self.banks[b].storage.sync().ctx("syncing a bank header")?;
        self.banks[b].unsynced_io = false;
        Ok(())
    }

    pub(super) fn write(
        &mut self,
        fh: &[u8],
        block: u64,
        offset: u32,
        data: &[u8],
        mode: WriteMode,
    ) -> Result<WriteOutcome> {
        self.check_range(offset, data.len())?;
        if data.is_empty() {
            return Ok(WriteOutcome::Stored);
        }
        let len = data.len() as u32;
        let sbs = self.geo.sub_block_size();
        let existing = self.lookup(fh, block);
        let (valid, dirty, partial) = existing
            .map(|id| {
                let f = &self.frames[id];
                (f.valid, f.dirty, f.partial)
            })
            .unwrap_or_default();
        let mut plan: Vec<(u32, Step)> = Vec::new();
        for sb in self.geo.sub_blocks_touched(offset, len) {
            let lo = offset.max(sb * sbs) - sb * sbs;
            let hi = (offset + len).min((sb + 1) * sbs) - sb * sbs;
            let full = lo == 0 && hi == sbs;
            let step = match mode {
                WriteMode::Clean if partial.contains(sb) && full => Step::Merge,
                WriteMode::Clean if dirty.contains(sb) => continue,
                WriteMode::Clean | WriteMode::Dirty if full => Step::Whole,
                _ if valid.contains(sb) => Step::Update,
                WriteMode::Clean => continue,
                WriteMode::Dirty if partial.contains(sb) => {
                    let (a, b) = existing
                        .map(|id| self.frames[id].extents[sb as usize])
                        .unwrap_or_default();
                    if lo > b || hi < a {
                        return Err(Error::PartialSubBlockWrite { sub_block: sb });
                    }
                    Step::Grow(a.min(lo), b.max(hi))
                }
                WriteMode::Dirty => Step::Extent(lo, hi),
            };
            plan.push((sb, step));
        }
        if plan.is_empty() {
            return Ok(WriteOutcome::Stored);
        }
        // The bytes a read-modify-write keeps must be sound: check them
        // first; those that fail are dropped and the write is planned again
        // without them (at most once: nothing left fails).
        if let Some(id) = existing {
            let mut kept = SubBlockMask::EMPTY;
            for &(sb, step) in &plan {
                if matches!(step, Step::Update | Step::Merge | Step::Grow(..)) {
                    kept.insert(sb);
                }
            }
            if self.check_before_use(id, kept, "a partial write")? {
                return self.write(fh, block, offset, data, mode);
            }
        }
        let id = match existing {
            Some(id) => id,
            None => match self.allocate(fh, block)? {
                Ok(id) => id,
                Err(victim) => return Ok(WriteOutcome::NeedsWriteBack(victim)),
            },
        };
        let (bank, _) = self.locate(id);
        if mode == WriteMode::Dirty {
            self.flag_unsynced(bank)?;
            self.seq += 1;
        }
        // Each run of consecutive planned sub-blocks is written with one
        // call, after the tag: see "Order of a write" in the module docs.
        let sbu = sbs as usize;
        let mut runs: Vec<(usize, u64, Vec<u8>)> = Vec::new();
        let mut i = 0;
        while i < plan.len() {
            let mut j = i + 1;
            while j < plan.len() && plan[j].0 == plan[j - 1].0 + 1 {
                j += 1;
            }
            let first = plan[i].0;
            let run_start = first * sbs;
            let mut buf = vec![0u8; (j - i) * sbu];
            let (b, pos) = self.data_pos(id, first);
            // Bytes a merge keeps: (position in `buf`, the extent's bytes).
            let mut kept: Vec<(usize, Vec<u8>)> = Vec::new();
            for &(sb, step) in &plan[i..j] {
                let at = ((sb - first) * sbs) as usize;
                if matches!(step, Step::Update | Step::Merge | Step::Grow(..)) {
                    let (_, sb_pos) = self.data_pos(id, sb);
                    self.banks[b]
                        .storage
                        .read_at(&mut buf[at..at + sbu], sb_pos)
                        .ctx("reading a sub-block to update")?;
                }
                if step == Step::Merge {
                    let (x, y) = self.frames[id].extents[sb as usize];
                    let (x, y) = (at + x as usize, at + y as usize);
                    kept.push((x, buf[x..y].to_vec()));
                }
            }
            let run_end = run_start + buf.len() as u32;
            let lo = offset.max(run_start);
            let hi = (offset + len).min(run_end);
            buf[(lo - run_start) as usize..(hi - run_start) as usize]
                .copy_from_slice(&data[(lo - offset) as usize..(hi - offset) as usize]);
            for (x, bytes) in kept {
                buf[x..x + bytes.len()].copy_from_slice(&bytes);
            }
            let seq = self.seq;
            let f = &mut self.frames[id];
            for (k, &(sb, step)) in plan[i..j].iter().enumerate() {
                let chunk = &buf[k * sbu..(k + 1) * sbu];
                let s = sb as usize;
                match step {
                    Step::Extent(x, y) | Step::Grow(x, y) => {
                        f.crcs[s] = crc32fast::hash(&chunk[x as usize..y as usize]);
                        f.partial.insert(sb);
                        f.extents[s] = (x, y);
                    }
                    Step::Whole | Step::Update | Step::Merge => {
                        f.crcs[s] = crc32fast::hash(chunk);
                        f.valid.insert(sb);
                        f.partial.remove(sb);
                        f.extents[s] = (0, 0);
                        if step == Step::Merge {
                            // Only the extent was committed, not the bytes
                            // merged around it: until a sync, the tag must
                            // not claim the whole sub-block (recovery then
                            // goes back to the extent the older tag names).
                            f.committed.remove(sb);
                        }
                    }
                }
                if mode == WriteMode::Dirty {
                    f.dirty.insert(sb);
                    f.dirty_seq[s] = seq;
                    // Rewritten since the last sync: its tag no longer
                    // claims it committed (the older tag still does), which
                    // is how recovery knows it was being rewritten.
                    f.committed.remove(sb);
                }
            }
            runs.push((b, pos, buf));
            i = j;
        }
        let now = self.tick();
        let f = &mut self.frames[id];
        f.lru = now;
        if mode == WriteMode::Dirty {
            f.dirty_end = f.dirty_end.max(offset + len);
        }
        self.write_tag(id)?;
        for (b, pos, buf) in runs {
            self.banks[b]
                .storage
                .write_at(&buf, pos)
                .ctx("writing data")?;
            self.banks[b].unsynced_io = true;
        }
        Ok(WriteOutcome::Stored)
    }

    pub(super) fn dirty_data(
        &mut self,
        fh: &[u8],
        block: u64,
        sync: bool,
    ) -> Result<Option<DirtyData>> {
        let Some(id) = self.lookup(fh, block) else {
            return Ok(None);
        };
        if self.frames[id].dirty.is_empty() {
            return Ok(None);
        }
        if sync
            && self
                .banks
                .iter()
                .any(|b| b.header.sync == SyncState::DirtyUnsynced)
        {
            self.sync()?;
        }
        // Never hand out bytes that fail their checksum: to upstream they
        // would overwrite the origin's good bytes.
        let sbs = self.geo.sub_block_size();
        let dirty = self.frames[id].dirty;
        let (Some(first), Some(last)) = (dirty.iter().next(), dirty.iter().last()) else {
            return Ok(None);
        };
        let mut bytes = Vec::new();
        self.read_sub_blocks(id, first..last + 1, &mut bytes)?;
        let bad = self.failing(id, first, &bytes, dirty);
        if !bad.is_empty() {
            let what = if sync { "write-back" } else { "a read" };
            self.drop_failed(id, first, &bytes, bad, what)?;
            if self.lookup(fh, block) != Some(id) || self.frames[id].dirty.is_empty() {
                return Ok(None);
            }
        }
        let base = first * sbs;
        let extents = self.frames[id]
            .dirty_ranges(sbs)
            .into_iter()
            .map(|r| DirtyExtent {
                offset: r.start,
                data: bytes[(r.start - base) as usize..(r.end - base) as usize].to_vec(),
            })
            .collect();
        let end = self.frames[id].dirty_end;
        let (fh, block) = self.frames[id]
            .key
            .clone()
            .unwrap_or((FileHandle::from_checked(fh), block));
        Ok(Some(DirtyData {
            fh,
            block,
            extents,
            end,
            seq: self.seq,
        }))
    }

    pub(super) fn mark_clean(&mut self, written: &DirtyData) -> Result<()> {
        let Some(id) = self.lookup(written.fh.as_bytes(), written.block) else {
            return Ok(());
        };
        let sbs = self.geo.sub_block_size();
        let f = &self.frames[id];
        let mut clean = SubBlockMask::EMPTY;
        for e in &written.extents {
            let end = e.offset.saturating_add(e.data.len() as u32);
            for sb in e.offset / sbs..end.div_ceil(sbs) {
                if f.dirty.contains(sb) && f.dirty_seq[sb as usize] <= written.seq {
                    clean.insert(sb);
                }
            }
        }
        if clean.is_empty() {
            return Ok(());
        }
        // A partial sub-block written back is upstream's now, and the cache
        // holds none of it beyond what it wrote: forget it.
        let forgotten = f.partial.and(clean);
        self.forget(id, forgotten, clean)?;
        if !forgotten.is_empty() {
            // The durable tag still claims the forgotten extent as committed
            // dirty data; a later write may reuse its bytes, so make the
            // forgetting durable first (once or twice per file: partial
            // sub-blocks are at the edges of writes).
            self.sync()?;
        }
        Ok(())
    }

    /// Drops `drop` sub-blocks of frame `id` (and the frame if none is left).
    pub(super) fn drop_sub_blocks(&mut self, id: usize, drop: SubBlockMask) -> Result<u64> {
        let f = &self.frames[id];
        let drop = drop.and(f.valid.or(f.partial));
        if drop.is_empty() {
            return Ok(0);
        }
        let sbs = self.geo.sub_block_size();
        let bytes: u64 = drop
            .iter()
            .map(|sb| {
                let (a, b) = f.extents[sb as usize];
                u64::from(if f.partial.contains(sb) { b - a } else { sbs })
            })
            .sum();
        self.forget(id, drop, drop)?;
        Ok(bytes)
    }

    /// Frame `id` no longer holds the bytes of `gone` and no longer has
    /// `undirty` dirty; the frame is emptied when nothing is left. Writes the
    /// tag.
    pub(super) fn forget(
        &mut self,
        id: usize,
        gone: SubBlockMask,
        undirty: SubBlockMask,
    ) -> Result<()> {
        let f = &mut self.frames[id];
        for sb in gone.iter() {
            f.crcs[sb as usize] = 0;
            f.extents[sb as usize] = (0, 0);
        }
        f.valid = f.valid.without(gone);
        f.partial = f.partial.without(gone);
        f.dirty = f.dirty.without(undirty.or(gone));
        f.committed = f.committed.and(f.dirty);
        if f.dirty.is_empty() {
            f.dirty_end = 0;
        }
        if f.holds_nothing() {
            if let Some((fh, block)) = f.key.take() {
                self.unindex(&fh, block);
            }
            self.frames[id].clear();
        }
        self.write_tag(id)
    }

    pub(super) fn invalidate(&mut self, fh: &[u8], force: bool) -> Result<u64> {
        let ids: Vec<usize> = self
            .index
            .get(fh)
            .map(|m| m.values().copied().collect())
            .unwrap_or_default();
        let mut dropped = 0;
        for id in ids {
            let f = &self.frames[id];
            let drop = if force {
                f.valid.or(f.partial)
            } else {
                f.valid.without(f.dirty)
            };
            dropped += self.drop_sub_blocks(id, drop)?;
        }
        // Always sync: an eviction not yet durable could otherwise bring
        // back a stale copy of this file's data after a crash.
        self.sync()?;
        Ok(dropped)
    }

    pub(super) fn truncate(&mut self, fh: &[u8], new_size: u64) -> Result<()> {
        let bs = u64::from(self.geo.block_size());
        let sbs = self.geo.sub_block_size();
        let n = self.geo.sub_blocks_per_block();
        let blocks: Vec<(u64, usize)> = self
            .index
            .get(fh)
            .map(|m| m.range(new_size / bs..).map(|(&b, &id)| (b, id)).collect())
            .unwrap_or_default();
        for (block, id) in blocks {
            let start = block * bs;
            if start >= new_size {
                self.drop_sub_blocks(id, SubBlockMask::range(0..n))?;
                continue;
            }
            // new_size - start < bs here, so it fits in u32.
            let cut = (new_size - start) as u32;
            let keep = cut.div_ceil(sbs);
            self.drop_sub_blocks(id, SubBlockMask::range(keep..n))?;
            let straddling = cut / sbs;
            let from = cut % sbs;
            // The bytes kept before the cut must be sound.
            if from != 0 {
                let one = SubBlockMask::range(straddling..straddling + 1);
                self.check_before_use(id, one, "a truncation")?;
                if self.lookup(fh, block) != Some(id) {
                    continue;
                }
            }
            let f = &self.frames[id];
            if from != 0 && f.partial.contains(straddling) {
                let (a, b) = f.extents[straddling as usize];
                if a >= from {
                    self.drop_sub_blocks(id, SubBlockMask::range(straddling..straddling + 1))?;
                } else if b > from {
                    let (bk, pos) = self.data_pos(id, straddling);
                    let mut buf = vec![0u8; (from - a) as usize];
                    self.banks[bk]
                        .storage
                        .read_at(&mut buf, pos + u64::from(a))
                        .ctx("reading a sub-block to truncate")?;
                    let f = &mut self.frames[id];
                    f.extents[straddling as usize] = (a, from);
                    f.crcs[straddling as usize] = crc32fast::hash(&buf);
                    self.write_tag(id)?;
                }
            } else if from != 0 && f.valid.contains(straddling) {
                let (b, pos) = self.data_pos(id, straddling);
                let mut buf = vec![0u8; sbs as usize];
                self.banks[b]
                    .storage
                    .read_at(&mut buf, pos)
                    .ctx("reading a sub-block to truncate")?;
                let from = from as usize;
                if buf[from..].iter().any(|&x| x != 0) {
                    buf[from..].fill(0);
                    // A write in place into dirty data: flagged and marked
                    // rewritten as `write` does, the tag first.
                    if self.frames[id].dirty.contains(straddling) {
                        self.flag_unsynced(b)?;
                        self.frames[id].committed.remove(straddling);
                    }
                    self.frames[id].crcs[straddling as usize] = crc32fast::hash(&buf);
                    self.write_tag(id)?;
                    self.banks[b]
                        .storage
                        .write_at(&buf, pos)
                        .ctx("zeroing a truncated sub-block")?;
                }
            }
            let f = &mut self.frames[id];
            if f.dirty_end > cut {
                f.dirty_end = cut;
                self.write_tag(id)?;
            }
        }
        // Always sync: an eviction not yet durable could otherwise bring
        // back a stale block past the new size after a crash.
        self.sync()
    }

    pub(super) fn sync(&mut self) -> Result<()> {
        self.fsync_all()?;
        let first = std::mem::take(&mut self.touched);
        self.promote(&first);
        for &id in &first {
            let f = &self.frames[id];
            if f.key.is_some() && f.committed != f.dirty {
                self.frames[id].committed = self.frames[id].dirty;
                self.write_tag(id)?;
            }
        }
        for b in 0..self.banks.len() {
            if self.banks[b].header.sync == SyncState::DirtyUnsynced {
                let mut h = self.banks[b].header;
                h.sync = SyncState::Synced;
                self.write_header(b, h)?;
            }
        }
        self.fsync_all()?;
        let second = std::mem::take(&mut self.touched);
        self.promote(&second);
        for id in first.into_iter().chain(second) {
            let f = &mut self.frames[id];
            f.durable_committed = f.committed;
        }
        let (index, frames) = (&self.index, &self.frames);
        self.writers.save(|fh| has_dirty(index, frames, fh));
        Ok(())
    }
}
