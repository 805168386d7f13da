//! Rebuilding the index from a bank's tag table, one frame at a time.
//!
//! * **The newest good slot wins.** Of a frame's two tag slots the one of
//!   the higher generation that decodes is its tag. Both corrupt: whatever
//!   was durable there is lost. One torn next to a never-written slot: a
//!   first tag write was torn, nothing durable was ever there. A torn slot
//!   beside a good one is erased, so that a later clean open does not take
//!   an old torn write for rot.
//! * **Rot in a bank closed cleanly.** No tag write was in flight, so a bad
//!   slot is rot, and may have been the newer one: the other may describe
//!   a state long gone (dirty data since written back). The frame goes;
//!   what its tag calls dirty is set aside and reported lost.
//! * **Only the current tag's committed bits count** as durable: an older
//!   copy's may have been cleared by a durable `mark_clean` before the
//!   frame was reused.
//! * A tag in a frame of another set is corrupt, and of two tags for one
//!   block the more recently used is kept. In a bank to be verified, the
//!   bytes are checked against the tag ([`judge`](super::judge)).

use super::super::*;
use super::BankCheck;

/// One bank's pass over its tag table.
#[derive(Debug)]
pub(super) struct BankPass<'r> {
    /// How the bank is recovered.
    pub(super) check: BankCheck,
    /// What recovery found and repaired, counted.
    pub(super) report: &'r mut RecoveryReport,
    /// One frame's data, read when it must be looked at.
    pub(super) block_buf: Vec<u8>,
}

/// Tags read from the table at once.
const CHUNK: u64 = 1024;

impl Inner {
    /// Rebuilds the index from bank `b`'s tag table, repairing the tags as
    /// the module docs say, and counts the frames that came back dirty.
    pub(super) fn recover_bank(
        &mut self,
        b: usize,
        check: BankCheck,
        report: &mut RecoveryReport,
    ) -> Result<()> {
        let frames = self.layout.frames;
        let tag_len = self.layout.tag_len;
        let ways = self.ways() as u64;
        let sets_per_bank = self.geo.sets_per_bank();
        let mut pass = BankPass {
            check,
            report,
            block_buf: vec![0u8; self.geo.block_size() as usize],
        };
        let mut table = Vec::new();
        for chunk_start in (0..frames).step_by(CHUNK as usize) {
            let n = CHUNK.min(frames - chunk_start);
            table.resize(2 * n as usize * tag_len, 0);
            self.banks[b]
                .storage
                .read_at(&mut table, self.layout.tag_offset(chunk_start, 0))
                .ctx("reading a tag table")?;
            for (i, pair) in table.chunks_exact(2 * tag_len).enumerate() {
                let fib = chunk_start + i as u64;
                let id = ((b as u64 * sets_per_bank + fib / ways) * ways + fib % ways) as usize;
                let slots = [
                    Tag::decode(&self.layout, &pair[..tag_len]),
                    Tag::decode(&self.layout, &pair[tag_len..]),
                ];
                self.recover_frame(b, fib, id, slots, &mut pass)?;
            }
        }
        pass.report.dirty_frames_recovered =
            self.frames.iter().filter(|f| !f.dirty.is_empty()).count() as u64;
        Ok(())
    }

    /// Recovers frame `id` (frame `fib` of bank `b`) from its two tag
    /// `slots`: into the index if its newest good tag holds anything, its
    /// tag rewritten where recovery changed it.
    fn recover_frame(
        &mut self,
        b: usize,
        fib: u64,
        id: usize,
        slots: [Result<Tag, TagError>; 2],
        pass: &mut BankPass<'_>,
    ) -> Result<()> {
        let Some(newest) = self.newest_slot(id, &slots, pass.report)? else {
            return Ok(());
        };
        let other_torn = slots[usize::from(1 - newest)] == Err(TagError::Corrupt);
        if other_torn {
            self.erase_torn_slot(b, fib, 1 - newest)?;
        }
        let Ok(mut tag) = slots[usize::from(newest)].clone() else {
            return Ok(());
        };
        if other_torn && pass.check.closed_cleanly {
            return self.drop_rotten_frame(id, &tag, newest, pass);
        }
        if other_torn {
            pass.report.torn_tag_writes += 1;
        }
        let older = slots[usize::from(1 - newest)].clone().ok();
        let durable_committed = tag.committed;
        {
            let f = &mut self.frames[id];
            f.generation = tag.generation;
            f.durable_slot = newest;
        }
        if holds_nothing(&tag) {
            return Ok(());
        }
        if self.geo.set_index(&tag.fh, tag.block) as usize != id / self.ways() {
            pass.report.corrupt_tags += 1;
            return self.write_tag(id);
        }
        let changed = if pass.check.verify {
            self.verify_frame(id, &mut tag, older.as_ref(), other_torn, pass)?
        } else {
            false
        };
        tidy(&mut tag);
        if !self.settle_duplicate(id, &tag, pass.report)? {
            return Ok(());
        }
        self.clock = self.clock.max(tag.lru + 1);
        if holds_nothing(&tag) {
            return self.write_tag(id);
        }
        self.install(id, tag, durable_committed, changed, pass.report)
    }

    /// Which of a frame's two `slots` holds its newest tag: the higher
    /// generation of two that decode, else the one that does. When neither
    /// does the frame stays empty (its tag rewritten if a slot was torn or
    /// corrupt) and there is none.
    fn newest_slot(
        &mut self,
        id: usize,
        slots: &[Result<Tag, TagError>; 2],
        report: &mut RecoveryReport,
    ) -> Result<Option<u8>> {
        match (&slots[0], &slots[1]) {
            (Ok(a), Ok(b)) => Ok(Some(u8::from(b.generation > a.generation))),
            (Ok(_), _) => Ok(Some(0)),
            (_, Ok(_)) => Ok(Some(1)),
            (Err(TagError::Empty), Err(TagError::Empty)) => Ok(None),
            (Err(TagError::Corrupt), Err(TagError::Corrupt)) => {
                // Both copies bad: whatever was durable here is lost.
                report.corrupt_tags += 1;
                self.frames[id].durable_slot = 0;
                self.write_tag(id)?;
                Ok(None)
            }
            // A torn first tag write next to a never-written slot: nothing
            // durable was ever here.
            _ => {
                report.torn_tag_writes += 1;
                let corrupt = u8::from(slots[1].is_err() && slots[1] != Err(TagError::Empty));
                self.frames[id].durable_slot = 1 - corrupt;
                self.write_tag(id)?;
                Ok(None)
            }
        }
    }

    /// Erases tag `slot` of frame `fib` in bank `b` (torn), so that a later
    /// clean open does not take an old torn write for rot.
    fn erase_torn_slot(&mut self, b: usize, fib: u64, slot: u8) -> Result<()> {
        let off = self.layout.tag_offset(fib, slot);
        self.banks[b]
            .storage
            .write_at(&vec![0u8; self.layout.tag_len], off)
            .ctx("erasing a torn tag")?;
        self.banks[b].unsynced_io = true;
        Ok(())
    }

    /// Drops frame `id`, whose other slot rotted in a bank closed cleanly
    /// (`tag`, in slot `newest`, may describe a state long gone): what the
    /// tag calls dirty is set aside and reported lost, and the frame is
    /// left empty.
    fn drop_rotten_frame(
        &mut self,
        id: usize,
        tag: &Tag,
        newest: u8,
        pass: &mut BankPass<'_>,
    ) -> Result<()> {
        pass.report.corrupt_tags += 1;
        if !tag.dirty.is_empty() {
            let sbs = self.geo.sub_block_size() as usize;
            let (bank, off) = self.data_pos(id, 0);
            self.banks[bank]
                .storage
                .read_at(&mut pass.block_buf, off)
                .ctx("reading frame data")?;
            for sb in tag.dirty.iter() {
                pass.report.dirty_sub_blocks_lost += 1;
                let i = sb as usize;
                let (a, b) = tag.span(sb, sbs).unwrap_or((0, sbs));
                self.set_aside(tag, sb, a, &pass.block_buf[i * sbs + a..i * sbs + b]);
            }
        }
        let f = &mut self.frames[id];
        f.generation = tag.generation;
        f.durable_slot = 1 - newest;
        self.write_tag(id)
    }

    /// Two tags for one block (cannot happen unless corrupt): keeps the
    /// more recently used, emptying the other frame. Returns whether frame
    /// `id`'s `tag` is the one kept.
    fn settle_duplicate(
        &mut self,
        id: usize,
        tag: &Tag,
        report: &mut RecoveryReport,
    ) -> Result<bool> {
        let Some(other) = self.lookup(&tag.fh, tag.block) else {
            return Ok(true);
        };
        report.corrupt_tags += 1;
        if self.frames[other].lru >= tag.lru {
            self.write_tag(id)?;
            return Ok(false);
        }
        if let Some((fh, block)) = self.frames[other].key.take() {
            self.unindex(&fh, block);
        }
        self.frames[other].clear();
        self.write_tag(other)?;
        report.frames_recovered -= 1;
        Ok(true)
    }

    /// Puts frame `id` into the index as its recovered `tag` says, with
    /// `durable_committed` the committed bits its durable tag records, and
    /// rewrites the tag if recovery `changed` it or it holds dirty data not
    /// yet committed.
    fn install(
        &mut self,
        id: usize,
        tag: Tag,
        durable_committed: SubBlockMask,
        changed: bool,
        report: &mut RecoveryReport,
    ) -> Result<()> {
        let fh = FileHandle::from_checked(&tag.fh);
        let f = &mut self.frames[id];
        f.key = Some((fh.clone(), tag.block));
        f.valid = tag.valid;
        f.dirty = tag.dirty;
        f.committed = tag.committed;
        f.partial = tag.partial;
        f.extents = tag.extents;
        f.dirty_end = tag.dirty_end;
        f.durable_committed = durable_committed;
        f.crcs = tag.crcs;
        f.lru = tag.lru;
        self.index.entry(fh).or_default().insert(tag.block, id);
        report.frames_recovered += 1;
        if changed || f.committed != f.dirty {
            self.write_tag(id)?;
        }
        Ok(())
    }
}

/// The tag holds no bytes: no valid or partial sub-block.
fn holds_nothing(tag: &Tag) -> bool {
    tag.valid.is_empty() && tag.partial.is_empty()
}

/// Zeroes the CRCs of sub-blocks the tag no longer holds, and its dirty end
/// if nothing in it is dirty.
fn tidy(tag: &mut Tag) {
    for (i, c) in tag.crcs.iter_mut().enumerate() {
        if !tag.valid.or(tag.partial).contains(i as u32) {
            *c = 0;
        }
    }
    if tag.dirty.is_empty() {
        tag.dirty_end = 0;
    }
}
