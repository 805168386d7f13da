//! Learning a file's working-set profile (`gvfs_ext::profile`) from its
//! readers, and using one to order a whole-file fetch.
//!
//! An entry started by the file's own clients (a READ here, not another
//! proxy's FETCH) notes the pieces ([`PIECE`]) its readers touch, first
//! touch first, skipping chunks of zeros (a [`Learning`], in
//! `learn/learning.rs`). The learning ends once no new chunk has been
//! touched for [`LEARN_QUIET`] (the guest of a lazy clone has resumed and
//! answered; what it touches from then on comes slowly), or after
//! [`LEARN_MAX`]. What was learned is kept here and sent upstream, unless
//! the readers touched the file in file order, give or take the READs the
//! kernel's read-ahead sends at once (a copy of it, even one that stalled,
//! not a working set: a guest's faults jump about), or it adds nothing to
//! the profile the fetch started with. A profile that was known is
//! extended, never reordered: what a later guest touched that the profile
//! missed goes at its end.
//!
//! [`LEARN_MAX`]: learning::LEARN_MAX

use std::sync::Arc;

use gvfs_ext::ChunkSource;
use gvfs_ext::profile::{MAX_PROFILE_PARTS, Profile};
use gvfs_nfs::Credentials;
use gvfs_nfs::layer::lock;

use crate::cache::FileCache;
use crate::chunks::{chunk_len, chunks_of};
use crate::entry::CachedFile;
use crate::pieces::{Mask, PIECE, piece_mask};
use learning::Learning;

pub(crate) mod learning;

pub use learning::LEARN_QUIET;

/// How often a learning is looked at.
const LEARN_TICK: std::time::Duration = std::time::Duration::from_millis(250);
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
    /// The pieces to fetch first for `entry`, as runs within a chunk: the
    /// profile kept here for its version, else the one its upstream knows
    /// (kept here then).
    pub(crate) async fn profile_plan(
        &self,
        entry: &Arc<CachedFile>,
        source: &Arc<dyn ChunkSource>,
        cred: &Credentials,
    ) -> Vec<(usize, Mask)> {
        let attrs = entry.attrs();
        let kept = self
            .profiles
            .as_ref()
            .and_then(|p| p.get(&entry.fh, &attrs));
        let profile = match kept {
            Some(p) => Some(p),
            None => {
                let asked =
                    tokio::time::timeout(PROFILE_WAIT, source.get_profile(cred, &entry.fh)).await;
                match asked {
                    Ok(Ok(Some(p))) if p.version().describes(&attrs) => {
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

    /// Learns `entry`'s working set until its readers go quiet, then keeps
    /// it and sends it upstream.
    pub(crate) async fn learn(
        self: Arc<Self>,
        entry: Arc<CachedFile>,
        source: Arc<dyn ChunkSource>,
        cred: Credentials,
    ) {
        loop {
            tokio::time::sleep(LEARN_TICK).await;
            if entry.failure().is_some() || !self.holds(&entry) {
                *lock(&entry.learning) = None;
                return;
            }
            if lock(&entry.learning).as_ref().is_none_or(Learning::done) {
                break;
            }
        }
        let Some(l) = lock(&entry.learning).take() else {
            return;
        };
        if l.order.is_empty() {
            return;
        }
        if copied(&l.order) {
            self.counters.profiles_discarded.add(1);
            tracing::debug!(
                touched = l.order.len(),
                "not a working set: the readers read the file in order (a copy)"
            );
            return;
        }
        let mut chunks = l.known.clone();
        let known: std::collections::HashSet<u32> = chunks.iter().copied().collect();
        chunks.extend(l.order.iter().filter(|c| !known.contains(c)));
        if chunks.len() == l.known.len() {
            return;
        }
        chunks.truncate(MAX_PROFILE_PARTS);
        let profile = Profile::of(&entry.attrs(), PIECE, chunks);
        if let Some(profiles) = self.profiles.as_ref() {
            profiles.put(&entry.fh, &profile);
        }
        let sent =
            tokio::time::timeout(PROFILE_WAIT, source.put_profile(&cred, &entry.fh, &profile))
                .await;
        match sent {
            Ok(Ok(())) => {
                self.counters.profiles_sent.add(1);
                tracing::info!(
                    file = %entry.path.display(),
                    parts = profile.parts.len(),
                    bytes = profile.bytes(),
                    "file cache: learned a working set and sent it upstream"
                );
            }
            Ok(Err(e)) => tracing::info!(error = %e, "upstream did not keep a working-set profile"),
            Err(_) => tracing::info!("upstream did not answer PROFILE_PUT in time"),
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
