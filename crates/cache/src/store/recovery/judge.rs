//! Sub-blocks whose bytes do not match their tag on open: finding them in a
//! frame, judging them ([`judge`], the crash rules' judge) and carrying out
//! the [`Verdict`] on the tag.
//!
//! * A sub-block past the sound length of a bank file cut short is dropped
//!   whatever its bytes.
//! * Bytes that match the frame's older tag go back to it: the newest
//!   write never landed (after a system crash, never so as to make dirty
//!   data clean).
//! * A committed sub-block of an unsynced bank that the tags show was
//!   being rewritten is kept dirty and committed; after a system crash
//!   every committed sub-block of an unsynced bank is kept so.
//! * Anything else is rot and is dropped; dirty bytes dropped are set aside
//!   in the quarantine and counted lost.

use super::super::*;
use super::BankCheck;
use super::tags::BankPass;

/// What recovery does with a sub-block whose bytes do not match its tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// The newest write to it never landed: the bytes are as the frame's
    /// older tag describes them; go back to that.
    Revert,
    /// Keep the bytes, dirty and committed: a committed sub-block was being
    /// overwritten, the client resends the overwrite, the rest of its bytes
    /// are the committed ones.
    KeepTorn,
    /// Back to the committed extent the older tag names, with the bytes
    /// there now (a committed partial sub-block merged with upstream's
    /// bytes, then torn).
    CommittedExtent(u32, u32),
    /// Bytes that cannot be vouched for: dropped (clean ones are fetched
    /// again; dirty ones are lost, set aside and reported).
    Drop,
}

/// Decides what recovery does with sub-block `sb` of `tag` (the newest)
/// whose bytes `data` (the whole sub-block) do not match its CRC; `older`
/// is the frame's other tag when it names the same block, and `other_torn`
/// says the other slot failed its own checksum (a torn tag write).
///
/// Every write in place writes the tag before the data, and a dirty
/// rewrite takes the sub-block's committed bit away in that tag until the
/// next sync. So after the process alone died (the system's page cache
/// kept every write, in order, at most the last one cut short at a page),
/// a sub-block's bytes are those its newest tag describes or those from
/// before the newest write to it. The latter match the older tag when that
/// write was the first since the last sync. Otherwise the tags show a
/// rewrite since the sync (or the slot that recorded it was being written),
/// and a sub-block committed at the last sync is kept as it is: the client
/// resends its uncommitted overwrites, the rest of its bytes are the
/// committed ones. Anything else is rot. After a system crash an unsynced
/// bank's writes may have landed in any order, so a committed sub-block is
/// kept whatever its bytes: data the client committed is not given up on a
/// guess.
fn judge(
    tag: &Tag,
    older: Option<&Tag>,
    other_torn: bool,
    sb: u32,
    data: &[u8],
    check: BankCheck,
) -> Verdict {
    let i = sb as usize;
    let range_of = |t: &Tag| t.span(sb, data.len());
    if let Some(o) = older
        && let Some((a, b)) = range_of(o)
        && data
            .get(a..b)
            .is_some_and(|bytes| crc32fast::hash(bytes) == o.crcs[i])
        // After a system crash, going back must not make dirty data clean:
        // the older tag may predate a write-back of it.
        && !(check.lenient && tag.dirty.contains(sb) && !o.dirty.contains(sb))
    {
        return Verdict::Revert;
    }
    let older_committed = older.is_some_and(|o| o.committed.contains(sb));
    let committed = tag.dirty.contains(sb) && (tag.committed.contains(sb) || older_committed);
    // Kept committed: whole, unless only the older tag's extent was
    // committed (a clean fill merged around it since).
    let keep = || match older {
        Some(o)
            if !tag.committed.contains(sb)
                && o.partial.contains(sb)
                && o.committed.contains(sb)
                && !tag.partial.contains(sb) =>
        {
            let (a, b) = o.extents[i];
            Verdict::CommittedExtent(a, b)
        }
        _ => Verdict::KeepTorn,
    };
    if check.lenient {
        return if committed { keep() } else { Verdict::Drop };
    }
    let rewritten = other_torn
        || older.is_some_and(|o| {
            o.valid.contains(sb) != tag.valid.contains(sb)
                || o.partial.contains(sb) != tag.partial.contains(sb)
                || o.extents[i] != tag.extents[i]
                || o.crcs[i] != tag.crcs[i]
                || (o.committed.contains(sb) && !tag.committed.contains(sb))
        });
    if check.unsynced && committed && rewritten {
        return keep();
    }
    Verdict::Drop
}

impl Inner {
    /// Checks every sub-block frame `id`'s `tag` holds against its CRC (and
    /// the sound length of its bank file), and carries out the verdict on
    /// each that fails; `older` and `other_torn` are the frame's other slot
    /// as [`judge`] takes them. Returns whether any sub-block failed (the
    /// tag changed).
    pub(super) fn verify_frame(
        &mut self,
        id: usize,
        tag: &mut Tag,
        older: Option<&Tag>,
        other_torn: bool,
        pass: &mut BankPass<'_>,
    ) -> Result<bool> {
        let sbs = self.geo.sub_block_size() as usize;
        let (bank, off) = self.data_pos(id, 0);
        self.banks[bank]
            .storage
            .read_at(&mut pass.block_buf, off)
            .ctx("reading frame data")?;
        let same = older.filter(|o| o.fh == tag.fh && o.block == tag.block);
        let mut changed = false;
        for sb in tag.valid.or(tag.partial).iter().collect::<Vec<_>>() {
            let i = sb as usize;
            let (a, b) = tag.span(sb, sbs).unwrap_or((0, sbs));
            let crc = crc32fast::hash(&pass.block_buf[i * sbs + a..i * sbs + b]);
            let (_, at) = self.data_pos(id, sb);
            let beyond = at + sbs as u64 > pass.check.sound_len;
            if crc == tag.crcs[i] && !beyond {
                continue;
            }
            changed = true;
            let data = &pass.block_buf[i * sbs..(i + 1) * sbs];
            let verdict = if beyond {
                Verdict::Drop
            } else {
                judge(tag, same, other_torn, sb, data, pass.check)
            };
            let report = &mut *pass.report;
            match verdict {
                Verdict::Revert => {
                    let Some(o) = same else { continue };
                    report.unlanded_writes_reverted += 1;
                    revert(tag, o, sb);
                }
                Verdict::KeepTorn => {
                    report.torn_committed_kept += 1;
                    keep_torn(tag, sb, crc);
                }
                Verdict::CommittedExtent(a, b) => {
                    report.torn_committed_kept += 1;
                    keep_committed_extent(tag, sb, (a, b), data);
                }
                Verdict::Drop => self.drop_sub_block(tag, sb, a, &data[a..b], report),
            }
        }
        Ok(changed)
    }

    /// Drops sub-block `sb` from `tag`; if it was dirty, its `bytes` (from
    /// `a` in the sub-block) are set aside and counted lost.
    fn drop_sub_block(
        &mut self,
        tag: &mut Tag,
        sb: u32,
        a: usize,
        bytes: &[u8],
        report: &mut RecoveryReport,
    ) {
        if tag.dirty.contains(sb) {
            report.dirty_sub_blocks_lost += 1;
            let kept = self.set_aside(tag, sb, a, bytes);
            tracing::error!(
                block = tag.block,
                sub_block = sb,
                set_aside = kept.map(|p| p.display().to_string()).unwrap_or_default(),
                "block cache: dirty data failed its checksum; it is dropped, not written back"
            );
        } else {
            report.clean_sub_blocks_dropped += 1;
        }
        let i = sb as usize;
        tag.valid.remove(sb);
        tag.dirty.remove(sb);
        tag.committed.remove(sb);
        tag.partial.remove(sb);
        tag.extents[i] = (0, 0);
    }

    /// Sets aside in the quarantine (if the store has one) dirty `bytes` of
    /// `tag`'s block, from byte `a` of sub-block `sb`; where they went.
    pub(super) fn set_aside(
        &mut self,
        tag: &Tag,
        sb: u32,
        a: usize,
        bytes: &[u8],
    ) -> Option<std::path::PathBuf> {
        let sbs = self.geo.sub_block_size() as usize;
        let offset = tag.block * u64::from(self.geo.block_size()) + (sb as usize * sbs + a) as u64;
        self.quarantine
            .as_mut()
            .and_then(|q| q.keep(&tag.fh, offset, bytes))
    }
}

/// Takes sub-block `sb` of `tag` back to the state `older` describes.
fn revert(tag: &mut Tag, older: &Tag, sb: u32) {
    let i = sb as usize;
    for (mask, from) in [
        (&mut tag.valid, older.valid),
        (&mut tag.partial, older.partial),
        (&mut tag.dirty, older.dirty),
        (&mut tag.committed, older.committed),
    ] {
        if from.contains(sb) {
            mask.insert(sb);
        } else {
            mask.remove(sb);
        }
    }
    tag.extents[i] = older.extents[i];
    tag.crcs[i] = older.crcs[i];
}

/// Keeps sub-block `sb` of `tag` whole, dirty and committed, with the bytes
/// there now (whose CRC is `crc`).
fn keep_torn(tag: &mut Tag, sb: u32, crc: u32) {
    tracing::warn!(
        block = tag.block,
        sub_block = sb,
        "block cache: a committed sub-block was being overwritten when the proxy stopped; \
         its bytes are kept for the client to resend the overwrite"
    );
    tag.crcs[sb as usize] = crc;
    tag.dirty.insert(sb);
    tag.committed.insert(sb);
}

/// Takes sub-block `sb` of `tag` back to the committed extent `(a, b)`,
/// dirty and committed, with the bytes there now in `data` (the whole
/// sub-block).
fn keep_committed_extent(tag: &mut Tag, sb: u32, (a, b): (u32, u32), data: &[u8]) {
    let i = sb as usize;
    tag.valid.remove(sb);
    tag.partial.insert(sb);
    tag.dirty.insert(sb);
    tag.committed.insert(sb);
    tag.extents[i] = (a, b);
    tag.crcs[i] = crc32fast::hash(&data[a as usize..b as usize]);
}
