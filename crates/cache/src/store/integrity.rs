//! Checking cached bytes against their checksums every time they are used,
//! and what happens to bytes that fail.
//!
//! Each valid sub-block's CRC32 is in its frame's tag (a partial one's covers
//! its extent). Recovery after an unclean shutdown checks them all, but bytes
//! can also rot while the proxy is stopped cleanly or running. So every use
//! of cached bytes checks the sub-blocks it touches first: a READ hit, the
//! dirty data handed to write-back or laid over upstream's bytes, and the
//! bytes a read-modify-write or a truncation keeps. CRC32 runs at several
//! GB/s, a small cost next to the read itself (docs/BENCHMARKS.md, "Checked
//! reads").
//!
//! A sub-block that fails is never served and never written upstream:
//! - **clean**: it is dropped; the READ misses and fetches it again.
//! - **dirty**: the client's bytes are gone. The write verifier changes,
//!   durably, first (clients resend what they have not committed); then the
//!   sub-block is dropped (the origin keeps its bytes) and that is synced.
//!   The bytes that failed are set aside in `DIR/quarantine/` for an
//!   operator and an error is logged.
//!
//! The no-wait READ path (on an async thread) only reads: bytes that fail
//! there are left for the blocking path to drop.

use std::ops::Range;

use crate::error::{IoContext, Result};
use crate::mask::SubBlockMask;

use super::Inner;
use super::quarantine::hex;
use super::verifier::new_verifier;

/// What checking the bytes of a READ hit found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Checked {
    /// Every sub-block matched; the bytes are in the caller's buffer.
    Good,
    /// Some failed and were dropped: a miss.
    Corrupt,
    /// (`nowait` only) the bytes are not in memory; nothing was checked.
    NotInMemory,
}

impl Inner {
    /// The bytes sub-block `sb` of frame `id` vouches for, inside the
    /// sub-block: all of it when valid, the extent when partial.
    pub(crate) fn checked_range(&self, id: usize, sb: u32) -> Option<(usize, usize)> {
        let f = &self.frames[id];
        let sbs = self.geo.sub_block_size() as usize;
        crate::format::held_span(&f.valid, &f.partial, &f.extents, sb, sbs)
    }

    /// Of the sub-blocks in `check`, those of frame `id` whose bytes do not
    /// match their CRC. `data` holds whole sub-blocks from `first` on.
    pub(crate) fn failing(
        &self,
        id: usize,
        first: u32,
        data: &[u8],
        check: SubBlockMask,
    ) -> SubBlockMask {
        let sbs = self.geo.sub_block_size() as usize;
        let mut bad = SubBlockMask::EMPTY;
        for sb in check.iter() {
            let Some((a, b)) = self.checked_range(id, sb) else {
                continue;
            };
            let Some(at) = (sb.checked_sub(first)).map(|i| i as usize * sbs) else {
                continue;
            };
            let Some(bytes) = data.get(at + a..at + b) else {
                continue;
            };
            if crc32fast::hash(bytes) != self.frames[id].crcs[sb as usize] {
                bad.insert(sb);
            }
        }
        bad
    }

    /// Reads whole sub-blocks `span` of frame `id` into `out` (resized).
    pub(crate) fn read_sub_blocks(
        &self,
        id: usize,
        span: Range<u32>,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let sbs = self.geo.sub_block_size() as usize;
        out.resize(span.len() * sbs, 0);
        let (b, pos) = self.data_pos(id, span.start);
        self.banks[b]
            .storage
            .read_at(out, pos)
            .ctx("reading cached data to check")
    }

    /// Reads `buf.len()` bytes at `offset` of frame `id`, whose sub-blocks
    /// there are all valid, into `buf`, checking every sub-block touched.
    /// Sub-blocks that fail are dropped ([`Checked::Corrupt`]; `buf` is
    /// then unspecified). With `nowait`, only bytes already in memory are
    /// read ([`Storage::read_at_nowait`]).
    pub(crate) fn read_checked(
        &mut self,
        id: usize,
        offset: u32,
        buf: &mut [u8],
        nowait: bool,
    ) -> Result<Checked> {
        let sbs = self.geo.sub_block_size();
        let span = self.geo.sub_blocks_touched(offset, buf.len() as u32);
        let (lo, hi) = (span.start * sbs, span.end * sbs);
        let (b, pos) = self.data_pos(id, span.start);
        // NFS clients read whole sub-blocks; only odd ones need the scratch.
        let aligned = offset == lo && offset as usize + buf.len() == hi as usize;
        let mut scratch = std::mem::take(&mut self.scratch);
        let bytes: &mut [u8] = if aligned {
            buf
        } else {
            scratch.resize((hi - lo) as usize, 0);
            &mut scratch[..]
        };
        let storage = &self.banks[b].storage;
        if nowait {
            if !storage.read_at_nowait(bytes, pos) {
                self.scratch = scratch;
                return Ok(Checked::NotInMemory);
            }
        } else if let Err(e) = storage.read_at(bytes, pos) {
            self.scratch = scratch;
            return Err(e).ctx("reading cached data");
        }
        let bad = self.failing(id, span.start, bytes, SubBlockMask::range(span.clone()));
        let outcome = if bad.is_empty() {
            Checked::Good
        } else if nowait {
            // Dropping means writing and syncing: not on an async thread.
            // The caller reads again from a blocking one.
            Checked::NotInMemory
        } else {
            let copy = bytes.to_vec();
            self.drop_failed(id, span.start, &copy, bad, "a read")?;
            Checked::Corrupt
        };
        if outcome == Checked::Good && !aligned {
            let at = (offset - lo) as usize;
            buf.copy_from_slice(&scratch[at..at + buf.len()]);
        }
        self.scratch = scratch;
        Ok(outcome)
    }

    /// Checks the sub-blocks in `check` of frame `id` (valid or partial) and
    /// drops those that fail, before their bytes are used (`what`, for the
    /// log). Returns whether any failed.
    pub(crate) fn check_before_use(
        &mut self,
        id: usize,
        check: SubBlockMask,
        what: &'static str,
    ) -> Result<bool> {
        let (Some(first), Some(last)) = (check.iter().next(), check.iter().last()) else {
            return Ok(false);
        };
        let mut scratch = std::mem::take(&mut self.scratch);
        let read = self.read_sub_blocks(id, first..last + 1, &mut scratch);
        let outcome = read.and_then(|()| {
            let bad = self.failing(id, first, &scratch, check);
            if bad.is_empty() {
                return Ok(false);
            }
            self.drop_failed(id, first, &scratch, bad, what)?;
            Ok(true)
        });
        self.scratch = scratch;
        outcome
    }

    /// Drops sub-blocks `bad` of frame `id`, whose bytes (in `data`, whole
    /// sub-blocks from `first`) failed their checksum when `what` used
    /// them. Dirty ones are set aside and change the write verifier.
    pub(crate) fn drop_failed(
        &mut self,
        id: usize,
        first: u32,
        data: &[u8],
        bad: SubBlockMask,
        what: &'static str,
    ) -> Result<()> {
        let Some((fh, block)) = self.frames[id].key.clone() else {
            return Ok(());
        };
        let sbs = self.geo.sub_block_size();
        let dirty = bad.and(self.frames[id].dirty);
        let clean = bad.without(dirty);
        let block_start = block * u64::from(self.geo.block_size());
        for sb in dirty.iter() {
            let (a, b) = self.checked_range(id, sb).unwrap_or((0, 0));
            let at = (sb - first) as usize * sbs as usize;
            let bytes = data.get(at + a..at + b).unwrap_or(&[]);
            let file_offset = block_start + u64::from(sb * sbs) + a as u64;
            let kept = self
                .quarantine
                .as_mut()
                .and_then(|q| q.keep(fh.as_bytes(), file_offset, bytes));
            tracing::error!(
                fh = %hex(fh.as_bytes()),
                file_offset,
                len = bytes.len(),
                set_aside = kept.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
                "block cache: dirty data failed its checksum on {what}; it is dropped, not \
                 written back (the origin keeps its bytes), and the write verifier changes \
                 so clients resend what they have not committed"
            );
        }
        if !clean.is_empty() {
            tracing::warn!(
                fh = %hex(fh.as_bytes()),
                block,
                sub_blocks = clean.count(),
                "block cache: cached data failed its checksum on {what}; dropped, to be fetched again"
            );
        }
        self.stats.corrupt_clean_dropped += u64::from(clean.count());
        self.stats.dirty_sub_blocks_lost += u64::from(dirty.count());
        if dirty.is_empty() {
            // Should this not become durable, the bytes fail again.
            return self.forget(id, bad, bad);
        }
        // The new verifier first: once the sub-block is forgotten nothing
        // would tell a later open that data was lost. Then a sync, so the
        // forgetting is durable and its tag slot is never overwritten by a
        // write a power loss could tear (the older slot would bring the
        // bytes back).
        self.change_verifier()?;
        self.forget(id, bad, bad)?;
        self.sync()
    }

    /// Gives the cache a new write verifier, durably, so that clients
    /// holding the old one resend their uncommitted writes (RFC 1813
    /// section 3.3.7): for dirty data lost while running.
    pub(crate) fn change_verifier(&mut self) -> Result<()> {
        let old: Vec<[u8; 8]> = self.banks.iter().map(|b| b.header.verifier).collect();
        let v = new_verifier(&old);
        for b in 0..self.banks.len() {
            let mut h = self.banks[b].header;
            h.verifier = v;
            self.write_header(b, h)?;
        }
        self.fsync_all()?;
        self.stats.verifier_changes += 1;
        Ok(())
    }
}
