//! Learning a file's working-set profile (`crate::profile`) from its
//! readers, and using one to order a whole-file fetch.
//!
//! An entry started by the file's own clients (a READ here, not another
//! proxy's FETCH) notes the chunks its readers touch, first touch first,
//! skipping chunks of zeros. The learning ends once no new chunk has been
//! touched for [`LEARN_QUIET`] (the guest of a lazy clone has resumed and
//! answered; what it touches from then on comes slowly), or after
//! [`LEARN_MAX`]. What was learned is kept here and sent upstream, unless
//! it covers nearly every data chunk (a copy of the file, not a working
//! set) or adds nothing to the profile the fetch started with. A profile
//! that was known is extended, never reordered: what a later guest touched
//! that the profile missed goes at its end.

use super::*;
use crate::profile::{MAX_PROFILE_CHUNKS, Profile};
use tokio::time::Instant;

/// How long readers must touch no new chunk for the learning to end.
pub const LEARN_QUIET: std::time::Duration = std::time::Duration::from_secs(3);
/// The longest a learning lasts.
pub(super) const LEARN_MAX: std::time::Duration = std::time::Duration::from_secs(300);
/// How often a learning is looked at.
const LEARN_TICK: std::time::Duration = std::time::Duration::from_millis(250);
/// The longest wait for an upstream's PROFILE_GET or PROFILE_PUT: a
/// profile only speeds things up, it is never waited out.
pub const PROFILE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A learning under way.
#[derive(Debug)]
pub(super) struct Learning {
    order: Vec<u32>,
    seen: Vec<bool>,
    started: Instant,
    last_new: Instant,
    /// The profile the fetch started with.
    known: Vec<u32>,
}

impl Learning {
    pub(super) fn new(chunks: usize) -> Self {
        let now = Instant::now();
        Self {
            order: Vec::new(),
            seen: vec![false; chunks],
            started: now,
            last_new: now,
            known: Vec::new(),
        }
    }

    fn done(&self) -> bool {
        (!self.order.is_empty() && self.last_new.elapsed() >= LEARN_QUIET)
            || self.started.elapsed() >= LEARN_MAX
    }
}

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
        let (first, last) = chunks_of(offset, offset.saturating_add(len));
        let chunks = lock(&self.chunks);
        for idx in first..=last.min(chunks.len().saturating_sub(1)) {
            if chunks[idx] == Chunk::Zero || l.seen[idx] || l.order.len() >= MAX_PROFILE_CHUNKS {
                continue;
            }
            l.seen[idx] = true;
            l.order.push(idx as u32);
            l.last_new = Instant::now();
        }
    }

    fn data_chunks(&self) -> usize {
        lock(&self.chunks)
            .iter()
            .filter(|c| **c != Chunk::Zero)
            .count()
    }
}

impl FileCache {
    /// The chunks to fetch first for `entry`: the profile kept here for
    /// its version, else the one its upstream knows (kept here then).
    pub(super) async fn profile_plan(
        &self,
        entry: &Arc<CachedFile>,
        source: &Arc<dyn ChunkSource>,
        cred: &Credentials,
    ) -> Vec<usize> {
        let attrs = entry.attrs();
        let kept = self.profiles.get().and_then(|p| p.get(&entry.fh, &attrs));
        let profile = match kept {
            Some(p) => Some(p),
            None => {
                let asked =
                    tokio::time::timeout(PROFILE_WAIT, source.get_profile(cred, &entry.fh)).await;
                match asked {
                    Ok(Ok(Some(p))) if p.describes(&attrs) => {
                        if let Some(profiles) = self.profiles.get() {
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
            l.known = p.chunks.clone();
        }
        let n = lock(&entry.chunks).len();
        p.chunks
            .iter()
            .map(|&c| c as usize)
            .filter(|&c| c < n)
            .collect()
    }

    /// Learns `entry`'s working set until its readers go quiet, then keeps
    /// it and sends it upstream.
    pub(super) async fn learn(
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
        let data = entry.data_chunks();
        if l.order.is_empty() {
            return;
        }
        if l.order.len() * 10 >= data * 9 {
            self.counters.profiles_discarded.add(1);
            tracing::debug!(
                touched = l.order.len(),
                data,
                "not a working set: the readers touched nearly the whole file"
            );
            return;
        }
        let mut chunks = l.known.clone();
        let known: std::collections::HashSet<u32> = chunks.iter().copied().collect();
        chunks.extend(l.order.iter().filter(|c| !known.contains(c)));
        if chunks.len() == l.known.len() {
            return;
        }
        chunks.truncate(MAX_PROFILE_CHUNKS);
        let profile = Profile::of(&entry.attrs(), chunks);
        if let Some(profiles) = self.profiles.get() {
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
                    chunks = profile.chunks.len(),
                    bytes = profile.bytes(),
                    "file cache: learned a working set and sent it upstream"
                );
            }
            Ok(Err(e)) => tracing::info!(error = %e, "upstream did not keep a working-set profile"),
            Err(_) => tracing::info!("upstream did not answer PROFILE_PUT in time"),
        }
    }
}
