//! A file's whole fetch: the entry made on first use (room made for it
//! first), then the background stream that fetches every chunk, a
//! working-set profile's pieces first, while readers fetch what they wait
//! for themselves; when all has arrived the file is synced and recorded.
//!
//! [`DEMAND_HOLD_MS`]: super::state::DEMAND_HOLD_MS

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use gvfs_ext::{CHUNK, ChunkSource, Class, Want};
use gvfs_metafile::MetaFile;
use gvfs_nfs::layer::lock;
use gvfs_nfs::nfs3_types::nfs3::fattr3;
use gvfs_nfs::{Credentials, same_version};

use crate::cache::FileCache;
use crate::chunks::{Chunk, chunk_count};
use crate::entry::CachedFile;
use crate::error::FileCacheError;
use crate::fetch::state::FetchState;
use crate::learn::learning::Learning;
use crate::names::{file_name, index_key, progress_path};
use crate::pieces::{Mask, PIECE};
use crate::progress::Progress;
use crate::versions::Versions;

/// Chunks one file's background fetch keeps in flight.
pub const WINDOW: usize = 8;
/// ... while readers fetch chunks of their own (and for
/// [`DEMAND_HOLD_MS`] after): one compressed chunk is about a
/// bandwidth-delay product on a WAN, so the link stays busy while a piece
/// a reader waits for is queued behind no more than that (a guest
/// faulting in an image never cloned before waits for one fault after
/// another: with 2 it took 22% longer to run; with none, the link idle
/// between faults, its later reads took longer).
pub const UNDER_DEMAND: usize = 1;
/// Runs of pieces fetched at once first, because a working-set profile
/// names them (a guest's first touches are scattered: mostly one piece
/// each, so about a bandwidth-delay product of them in flight) ...
pub const PROFILE_WINDOW: usize = 96;
/// ... and at most these bytes of them (a reader's fault the profile
/// missed is queued behind no more on the link).
pub const PROFILE_BYTES: u64 = 1 << 20;

impl FileCache {
    /// The entry for this version of the file, starting its fetch from
    /// `source` when there is none. `zero` (the file's valid metadata)
    /// spares fetching chunks of zeros. Fails when the file cannot be held
    /// (over the budget, local I/O).
    ///
    /// With `learn` (the file's own clients read it here, rather than
    /// other proxies fetching it) the order in which readers first touch
    /// its chunks is learned as its working-set profile (`learn.rs`).
    ///
    /// `first` is what the first request wants: its tenant owns the
    /// entry (the background stream fetches for it), and a bulk one makes
    /// the background stream bulk until a request of a higher class
    /// comes.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        self: &Arc<Self>,
        fh: &[u8],
        attrs: &fattr3,
        zero: Option<&MetaFile>,
        source: Arc<dyn ChunkSource>,
        cred: &Credentials,
        learn: bool,
        first: &Want,
    ) -> Result<Arc<CachedFile>, FileCacheError> {
        let mut files = lock(&self.files);
        let mut resumed = None;
        if let Some(f) = files.get(fh) {
            if f.dormant {
                // Kept partial at open: resumed if it is of this version.
                if same_version(&f.attrs(), attrs) {
                    resumed = self.resume(f, zero, learn, first);
                }
            } else if f.busy() || (f.failure().is_none() && same_version(&f.attrs(), attrs)) {
                if !f.complete() {
                    self.counters.coalesced_fetches.add(1);
                }
                return Ok(f.clone());
            }
            if resumed.is_none() {
                let old = files.remove(fh);
                if let Some(old) = old {
                    self.discard(&old);
                }
            }
        }
        let entry = match resumed {
            Some(entry) => entry,
            None => self.fresh(&mut files, fh, attrs, zero, learn, first)?,
        };
        files.insert(fh.to_vec(), entry.clone());
        drop(files);
        if entry.kept.is_some() {
            tokio::spawn(self.clone().check_all_kept(entry.clone()));
        }
        if learn {
            tokio::spawn(
                self.clone()
                    .learn(entry.clone(), source.clone(), cred.clone()),
            );
        }
        tokio::spawn(self.clone().fetch_all(entry.clone(), source, cred.clone()));
        Ok(entry)
    }

    /// A new entry for this version of the file, its local file and
    /// progress log made (empty), room made for it first.
    fn fresh(
        &self,
        files: &mut HashMap<Vec<u8>, Arc<CachedFile>>,
        fh: &[u8],
        attrs: &fattr3,
        zero: Option<&MetaFile>,
        learn: bool,
        first: &Want,
    ) -> Result<Arc<CachedFile>, FileCacheError> {
        self.make_room(files, attrs.size)?;
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
        // Without an index nothing is kept across a restart: no log.
        let progress = self.index.as_ref().and_then(|_| {
            Progress::create(&progress_path(&path), attrs)
                .inspect_err(|e| {
                    tracing::warn!(file = %path.display(), "file cache: cannot make a progress log: {e}");
                })
                .ok()
        });
        let n = chunk_count(attrs.size);
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
        let content = zero
            .filter(|m| m.hashes.is_some() && m.file_size == attrs.size)
            .map(|m| Arc::new(m.clone()));
        let learning = learn.then(|| Learning::new(attrs.size, &chunks, &self.learn));
        let entry = CachedFile::new(
            fh,
            path,
            file,
            Versions::new(attrs.clone()),
            FetchState::new(chunks, first.tenant, first.class),
            learning,
            content,
        );
        Ok(Arc::new(entry.with_progress(progress)))
    }

    /// The background fetch of a whole file: first the chunks of its
    /// working-set profile, if one is known ([`PROFILE_WINDOW`] in
    /// flight), then the rest in file order, going on from the chunk after
    /// a reader's latest fetch ([`WINDOW`] in flight, or [`UNDER_DEMAND`]
    /// while readers fetch chunks of their own), then what that passed
    /// over, and what is given back until the file is whole (it never
    /// stops while a chunk can still be claimed); then sync and record it.
    pub(crate) async fn fetch_all(
        self: Arc<Self>,
        entry: Arc<CachedFile>,
        source: Arc<dyn ChunkSource>,
        cred: Credentials,
    ) {
        let started = Instant::now();
        let plan = self.profile_plan(&entry, &source, &cred).await;
        entry.fetch.set_profiled(!plan.is_empty());
        tracing::debug!(
            file = %entry.path.display(),
            runs = plan.len(),
            since_ms = entry.fetch.since_born_ms(),
            "file cache: whole-file fetch starts"
        );
        let mut set = tokio::task::JoinSet::new();
        let (mut planned, mut next, mut followed) = (0, 0, 0);
        // Runs of the plan claimed and not yet started, last first.
        let mut claimed: Vec<(usize, Mask)> = Vec::new();
        let profile = Want::new(Class::Profile, entry.fetch.owner);
        // Bytes of profile pieces in flight.
        let mut profile_bytes = 0;
        let mut rx = entry.fetch.subscribe();
        loop {
            let mut exhausted = false;
            loop {
                let profiling = planned < plan.len() || !claimed.is_empty();
                let window = if profiling {
                    PROFILE_WINDOW
                } else if entry.fetch.demand_active() {
                    UNDER_DEMAND
                } else {
                    WINDOW
                };
                // The rests of chunks readers fetch behind their pieces
                // take the background's place on the link.
                let behind = entry.fetch.behind();
                if set.len() + behind >= window
                    || (profiling && !set.is_empty() && profile_bytes >= PROFILE_BYTES)
                    || entry.failure().is_some()
                {
                    break;
                }
                // The plan's next part, claimed as runs (several when
                // pieces others fetch split it), taken one at a time.
                while claimed.is_empty() && planned < plan.len() {
                    let (idx, mask) = plan[planned];
                    let runs = entry.fetch.claim_pieces(idx, mask);
                    claimed.extend(runs.into_iter().rev().map(|r| (idx, r)));
                    planned += 1;
                }
                // Where a reader faulted last, then on from there;
                // what that passed over, from the start when at the end.
                let follow = entry.fetch.follow();
                if follow != followed {
                    (followed, next) = (follow, follow - 1);
                }
                let (idx, pieces) = match claimed.pop() {
                    Some((idx, run)) => (idx, Some(run)),
                    None => match entry
                        .fetch
                        .claim_next(next)
                        .or_else(|| entry.fetch.claim_next(0))
                    {
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
                        let want = profile.clone();
                        let n = mask.count_ones();
                        self.counters.profile_pieces.add(u64::from(n));
                        let bytes = u64::from(n * PIECE);
                        profile_bytes += bytes;
                        set.spawn(async move {
                            let _ = entry
                                .fetch_pieces(&cache, &source, &cred, idx, mask, mask, &want)
                                .await;
                            bytes
                        });
                    }
                    None => {
                        // As bulk behind a sequential reader, else as
                        // background: decided chunk by chunk.
                        let want = Want::new(entry.fetch.stream_class(), entry.fetch.owner);
                        set.spawn(async move {
                            let _ = entry.fetch_chunk(&cache, &source, &cred, idx, &want).await;
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
            if let Some(done) = set.join_next().await {
                profile_bytes -= done.unwrap_or(0).min(profile_bytes);
                continue;
            }
            // Nothing left to claim: chunks that readers fetch themselves
            // may still be arriving. Until the file is whole (or failed),
            // back to claiming after every change: pieces given back (kept
            // ones that failed their check, behind a rest that passed
            // them) make a chunk claimable again, and nobody else owns it.
            if entry.failure().is_some() || entry.complete() {
                break;
            }
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
        // Its progress log goes only once its record is written (and
        // durable): else a restart keeps the file by its log instead.
        if self.record_lazily(&entry) {
            self.settle_progress(&entry).await;
        }
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
