//! The state behind the store's lock: where a frame's tag and data live,
//! lookups and LRU ticks, and the hit path (reading cached bytes, checked
//! against their CRCs).

use super::integrity::Checked;
use super::*;

impl Inner {
    pub(super) fn ways(&self) -> usize {
        self.geo.ways() as usize
    }

    /// Bank and frame-in-bank of a global frame id (`set * ways + way`).
    pub(super) fn locate(&self, id: usize) -> (usize, u64) {
        let ways = self.ways();
        let (bank, local) = self.geo.bank_of_set((id / ways) as u64);
        (bank as usize, local * ways as u64 + (id % ways) as u64)
    }

    pub(super) fn data_pos(&self, id: usize, sub_block: u32) -> (usize, u64) {
        let (b, f) = self.locate(id);
        let off = self.layout.data_offset(f) + u64::from(sub_block * self.geo.sub_block_size());
        (b, off)
    }

    pub(super) fn lookup(&self, fh: &[u8], block: u64) -> Option<usize> {
        self.index.get(fh)?.get(&block).copied()
    }

    pub(super) fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    pub(super) fn check_range(&self, offset: u32, len: usize) -> Result<()> {
        let bs = self.geo.block_size();
        if u64::from(offset) + len as u64 > u64::from(bs) {
            return Err(Error::RangeOutsideBlock {
                offset,
                len,
                block_size: bs,
            });
        }
        Ok(())
    }

    pub(super) fn write_header(&mut self, b: usize, h: Header) -> Result<()> {
        self.banks[b]
            .storage
            .write_at(&h.encode(), 0)
            .ctx("writing a bank header")?;
        self.banks[b].header = h;
        self.banks[b].unsynced_io = true;
        Ok(())
    }

    pub(super) fn fsync_all(&mut self) -> Result<()> {
        for bank in self.banks.iter_mut().filter(|b| b.unsynced_io) {
            bank.storage.sync().ctx("syncing a bank")?;
            bank.unsynced_io = false;
        }
        Ok(())
    }

    /// Writes frame `id`'s tag into its scratch slot (never the durable one).
    pub(super) fn write_tag(&mut self, id: usize) -> Result<()> {
        let (b, f) = self.locate(id);
        let mut buf = vec![0u8; self.layout.tag_len];
        let frame = &mut self.frames[id];
        frame.generation += 1;
        let slot = 1 - frame.durable_slot;
        let (fh, block) = match &frame.key {
            Some((fh, block)) => (fh.as_bytes().to_vec(), *block),
            None => (Vec::new(), 0),
        };
        Tag {
            fh,
            block,
            lru: frame.lru,
            generation: frame.generation,
            dirty_end: frame.dirty_end,
            valid: frame.valid,
            dirty: frame.dirty,
            committed: frame.committed,
            partial: frame.partial,
            crcs: frame.crcs.clone(),
            extents: frame.extents.clone(),
        }
        .encode(&self.layout, &mut buf);
        frame.written_slot = Some(slot);
        let off = self.layout.tag_offset(f, slot);
        self.banks[b]
            .storage
            .write_at(&buf, off)
            .ctx("writing a tag")?;
        self.banks[b].unsynced_io = true;
        self.touched.insert(id);
        Ok(())
    }

    /// After an fsync: the slots written since become the durable ones.
    pub(super) fn promote(&mut self, ids: &BTreeSet<usize>) {
        for &id in ids {
            let f = &mut self.frames[id];
            if let Some(s) = f.written_slot.take() {
                f.durable_slot = s;
            }
        }
    }

    /// The frame holding the `len` bytes at `offset` of a cached block:
    /// `None` unless every sub-block they touch is valid. `len` must be
    /// within the block and not 0.
    pub(super) fn hit_at(&self, fh: &[u8], block: u64, offset: u32, len: usize) -> Option<usize> {
        let id = self.lookup(fh, block)?;
        let need = SubBlockMask::range(self.geo.sub_blocks_touched(offset, len as u32));
        self.frames[id].valid.contains_all(need).then_some(id)
    }

    pub(super) fn count_hit(&mut self, id: usize, len: usize) {
        let now = self.tick();
        self.frames[id].lru = now;
        self.stats.hits += 1;
        self.stats.hit_bytes += len as u64;
    }

    /// [`read_into`](Self::read_into) counting nothing, for
    /// [`BlockStore::read_held`].
    pub(super) fn read_held(
        &mut self,
        fh: &[u8],
        block: u64,
        offset: u32,
        buf: &mut [u8],
    ) -> Result<bool> {
        Ok(self.read_good(fh, block, offset, buf)?.is_some())
    }

    /// Reads `buf.len()` bytes at `offset` of a block held with every
    /// sub-block they touch valid and checked: its frame, or `None`.
    fn read_good(
        &mut self,
        fh: &[u8],
        block: u64,
        offset: u32,
        buf: &mut [u8],
    ) -> Result<Option<usize>> {
        self.check_range(offset, buf.len())?;
        let Some(id) = self.hit_at(fh, block, offset, buf.len()) else {
            return Ok(None);
        };
        Ok((self.read_checked(id, offset, buf, false)? == Checked::Good).then_some(id))
    }

    pub(super) fn read_into(
        &mut self,
        fh: &[u8],
        block: u64,
        offset: u32,
        buf: &mut [u8],
    ) -> Result<bool> {
        if buf.is_empty() {
            self.check_range(offset, 0)?;
            let hit = self.lookup(fh, block).is_some();
            if !hit {
                self.stats.misses += 1;
            }
            return Ok(hit);
        }
        let Some(id) = self.read_good(fh, block, offset, buf)? else {
            self.stats.misses += 1;
            return Ok(false);
        };
        self.count_hit(id, buf.len());
        Ok(true)
    }

    /// [`read_into`](Self::read_into) of a hit whose bytes are in memory;
    /// false (nothing counted, `buf` unspecified) otherwise.
    pub(super) fn read_into_now(
        &mut self,
        fh: &[u8],
        block: u64,
        offset: u32,
        buf: &mut [u8],
    ) -> Result<bool> {
        self.check_range(offset, buf.len())?;
        if buf.is_empty() {
            return Ok(self.lookup(fh, block).is_some());
        }
        let Some(id) = self.hit_at(fh, block, offset, buf.len()) else {
            return Ok(false);
        };
        match self.read_checked(id, offset, buf, true)? {
            Checked::Good => {}
            Checked::NotInMemory => return Ok(false),
            Checked::Corrupt => {
                self.stats.misses += 1;
                return Ok(false);
            }
        }
        self.count_hit(id, buf.len());
        Ok(true)
    }
}
