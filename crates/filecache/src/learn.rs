//! Learning a file's working-set profile (`gvfs_ext::profile`) from its
//! readers, and using one to order a whole-file fetch.
//!
//! An entry started by the file's own clients (a READ here, not another
//! proxy's FETCH) notes the pieces ([`PIECE`]) its readers touch, first
//! touch first, skipping chunks of zeros (a [`Learning`], in
//! `learn/learning.rs`, which says when it closes: readers quiet for
//! [`LEARN_QUIET`], the window after the first touch passed, as many
//! pieces as a profile may hold, or ended on request with
//! [`FileCache::end_learning`] by someone who knows the guest is ready).
//! A busy guest never goes quiet: the window still closes, and what was
//! touched before it is published. What was learned is kept here and sent
//! upstream, unless the readers touched the file in file order, give or
//! take the READs the kernel's read-ahead sends at once (a copy of it,
//! even one that stalled, not a working set: a guest's faults jump
//! about), or they touched more than [`KEEP_SHARE`] of its data (most of
//! the image: fetching it first would be a copy), or it is the profile the
//! fetch started with. A profile that was known is merged with this
//! clone's order (`learn/merge.rs`: this clone's first, then what it
//! missed, bounded), so it follows the image's guests. `profile_plan`
//! ignores a kept or upstream profile over [`KEEP_SHARE`] too.

use std::sync::Arc;

use gvfs_ext::ChunkSource;
use gvfs_ext::profile::Profile;
use gvfs_nfs::Credentials;
use gvfs_nfs::layer::lock;

use crate::cache::FileCache;
use crate::chunks::{chunk_len, chunks_of};
use crate::entry::CachedFile;
use crate::pieces::{Mask, PIECE, piece_mask};
use learning::{Closed, Learning, data_bytes, over_share};
use merge::merge;

pub(crate) mod learning;
mod merge;

pub use learning::{DEFAULT_LEARN_WINDOW, KEEP_SHARE, LEARN_MAX, LEARN_QUIET, LearnSettings};

/// How often a learning is looked at.
pub(crate) const LEARN_TICK: std::time::Duration = std::time::Duration::from_millis(250);
/// The longest wait for an upstream's PROFILE_GET or PROFILE_PUT: a
/// profile only speeds things up, it is never waited out.
pub const PROFILE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl CachedFile {
    /// Notes that a reader touched `offset..offset + len`.
    pub fn touch(&self, offset: u64, len: u64) {
        let mut learning = lock(&self.learning);
        let Some(l) = learning.as_mut() else {
            return;
        };
        if len == 0 {
            return;
        }
        l.touch(offset, len, &self.fetch.chunks());
    }
}

impl FileCache {
    /// Ends the learnings under way of the files whose handle `pred`
    /// accepts, now: their profiles are published as if their window had
    /// closed (the caller knows the guest is ready). Returns how many it
    /// ended.
    pub fn end_learning(&self, pred: impl Fn(&[u8]) -> bool) -> usize {
        // `pred` may take other locks (the metadata layer's names): not
        // under the files lock.
        let entries: Vec<Arc<CachedFile>> = lock(&self.files).values().cloned().collect();
        let mut ended = 0;
        for f in entries.iter().filter(|f| pred(&f.fh)) {
            if lock(&f.learning).as_mut().is_some_and(Learning::end) {
                f.learn_end.notify_one();
                ended += 1;
            }
        }
        ended
    }

    /// The pieces to fetch first for `entry`, as runs within a chunk: the
    /// profile kept here for its version, else the one its upstream knows
    /// (kept here then). One over [`KEEP_SHARE`] of the file's data is not
    /// used.
    pub(crate) async fn profile_plan(
        &self,
        entry: &Arc<CachedFile>,
        source: &Arc<dyn ChunkSource>,
        cred: &Credentials,
    ) -> Vec<(usize, Mask)> {
        let attrs = entry.attrs();
        let data = data_bytes(attrs.size, &entry.fetch.chunks());
        let usable = |p: &Profile| {
            let over = over_share(p.bytes(), data);
            if over {
                tracing::debug!(
                    bytes = p.bytes(),
                    data,
                    "a working-set profile names most of the file: not used"
                );
            }
            !over
        };
        let kept = self
            .profiles
            .as_ref()
            .and_then(|p| p.get(&entry.fh, &attrs));
        let profile = match kept {
            Some(p) => Some(p).filter(usable),
            None => {
                let asked =
                    tokio::time::timeout(PROFILE_WAIT, source.get_profile(cred, &entry.fh)).await;
                match asked {
                    Ok(Ok(Some(p))) if p.version().describes(&attrs) && usable(&p) => {
                        if let Some(profiles) = self.profiles.as_ref() {
                            profiles.put(&entry.fh, &p);
                        }
                        Some(p)
                    }
                    Ok(Ok(_)) => None,
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "no working-set profile from upstream");
                        None
                    }
                    Err(_) => {
                        tracing::debug!("upstream did not answer PROFILE_GET in time");
                        None
                    }
                }
            }
        };
        let Some(p) = profile else {
            return Vec::new();
        };
        self.counters.profile_hits.add(1);
        if let Some(l) = lock(&entry.learning).as_mut() {
            // Known in the unit learned here, to extend it.
            if p.unit == PIECE {
                l.known = p.parts.clone();
            }
        }
        let size = entry.size();
        let mut plan: Vec<(usize, Mask)> = Vec::new();
        for (from, to) in p.ranges() {
            if to <= from {
                continue;
            }
            let (first, last) = chunks_of(from, to);
            for idx in first..=last {
                let mask = piece_mask(idx, chunk_len(size, idx), from, to);
                match plan.last_mut() {
                    // The next part of the same chunk joins its run.
                    Some((i, m)) if *i == idx && (*m << 1 | *m) & mask != 0 => *m |= mask,
                    _ if mask != 0 => plan.push((idx, mask)),
                    _ => {}
                }
            }
        }
        plan
    }

    /// Learns `entry`'s working set until the learning closes, then
    /// publishes it.
    pub(crate) async fn learn(
        self: Arc<Self>,
        entry: Arc<CachedFile>,
        source: Arc<dyn ChunkSource>,
        cred: Credentials,
    ) {
        let closed = loop {
            tokio::select! {
                () = tokio::time::sleep(LEARN_TICK) => {}
                () = entry.learn_end.notified() => {}
            }
            if entry.failure().is_some() || !self.holds(&entry) {
                *lock(&entry.learning) = None;
                return;
            }
            match lock(&entry.learning).as_mut().map(Learning::closed) {
                None => return,
                Some(Some(closed)) => break closed,
                Some(None) => {}
            }
        };
        let Some(l) = lock(&entry.learning).take() else {
            return;
        };
        let c = &self.counters;
        match closed {
            Closed::Quiet => c.learn_closed_quiet.add(1),
            Closed::Time => c.learn_closed_time.add(1),
            Closed::Size => c.learn_closed_size.add(1),
            Closed::Ended => c.learn_ended_early.add(1),
            Closed::Idle => {}
        }
        self.publish(&entry, l, closed, &source, &cred).await;
    }

    /// Keeps what `l` learned and sends it upstream, unless it is nothing,
    /// a copy, most of the file, or what was known.
    async fn publish(
        &self,
        entry: &CachedFile,
        l: Learning,
        closed: Closed,
        source: &Arc<dyn ChunkSource>,
        cred: &Credentials,
    ) {
        let c = &self.counters;
        if l.order.is_empty() {
            c.learned_nothing.add(1);
            return;
        }
        if copied(&l.order) {
            c.profiles_discarded.add(1);
            tracing::debug!(
                touched = l.order.len(),
                "not a working set: the readers read the file in order (a copy)"
            );
            return;
        }
        if l.too_big() {
            c.profiles_too_big.add(1);
            tracing::info!(
                file = %entry.path.display(),
                touched = l.order.len(),
                "file cache: readers touched most of the file: no working-set profile kept"
            );
            return;
        }
        let parts = merge(&l.known, &l.order, l.max_parts);
        if parts == l.known {
            c.profiles_unchanged.add(1);
            return;
        }
        let profile = Profile::of(&entry.attrs(), PIECE, parts);
        if let Some(profiles) = self.profiles.as_ref() {
            profiles.put(&entry.fh, &profile);
        }
        let sent =
            tokio::time::timeout(PROFILE_WAIT, source.put_profile(cred, &entry.fh, &profile)).await;
        match sent {
            Ok(Ok(())) => {
                c.profiles_sent.add(1);
                tracing::info!(
                    file = %entry.path.display(),
                    parts = profile.parts.len(),
                    bytes = profile.bytes(),
                    closed = ?closed,
                    "file cache: learned a working set and sent it upstream"
                );
            }
            Ok(Err(e)) => {
                c.profiles_refused.add(1);
                tracing::info!(error = %e, "upstream did not keep a working-set profile");
            }
            Err(_) => {
                c.profiles_refused.add(1);
                tracing::info!("upstream did not answer PROFILE_PUT in time");
            }
        }
    }
}

/// How far behind the furthest piece touched so far a copy's next piece
/// may be: the kernel's read-ahead sends a reader's READs several at once,
/// and they run (and are noted) in any order (8 MiB of pieces).
const COPY_SLACK: u32 = (8 << 20) / PIECE;

/// Whether pieces were first touched in file order, give or take
/// [`COPY_SLACK`]: a reader copying the file. A guest's faults jump back
/// further than that.
fn copied(order: &[u32]) -> bool {
    let mut furthest = 0;
    order.len() >= 2
        && order.iter().all(|&p| {
            let ok = p.saturating_add(COPY_SLACK) >= furthest;
            furthest = furthest.max(p);
            ok
        })
}

#[cfg(test)]
mod copy_tests {
    use super::*;

    #[test]
    fn a_copy_is_read_in_file_order_give_or_take_its_read_ahead() {
        // In pieces of 64 KiB's bytes.
        let at = |kib: &[u32]| {
            kib.iter()
                .map(|k| k * 64 * 1024 / PIECE)
                .collect::<Vec<_>>()
        };
        // Concurrent READs of a sequential reader, noted out of order.
        assert!(copied(&at(&[0, 16, 48, 32, 64, 96, 80, 112])));
        assert!(copied(&(0..500).collect::<Vec<u32>>()));
        // A guest's faults jump back further.
        assert!(!copied(&at(&[480, 112, 656, 192])));
        assert!(!copied(&at(&[0, 16, 400, 32])));
        // One piece tells nothing.
        assert!(!copied(&[7]));
    }
}
