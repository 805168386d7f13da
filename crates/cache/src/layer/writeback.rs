//! Sending dirty data upstream: a whole write-back (`gvfsctl writeback`),
//! a flush, and the early write-back of one block whose frame is needed.
//!
//! A file's dirty runs are coalesced into UNSTABLE WRITEs of up to
//! [`MAX_DATA`] bytes, then one COMMIT; if the COMMIT's verifier differs
//! from a WRITE's, upstream may have lost the data (it restarted), so the
//! file's data is sent again (RFC 1813 section 3.3.7). Only then is the data
//! marked clean, so a crash at any point leaves it dirty and the next
//! write-back finishes the job. Data is clipped to the size the client
//! wrote: what a truncation cut off is never sent.
//!
//! The WRITEs of a file go out up to [`WRITES_IN_FLIGHT`] at a time; the
//! COMMIT waits for all of them.
//!
//! Ordering: a WRITE grows the file's size before its data reaches the
//! store, and the size is read after the dirty data is taken, so a
//! concurrent WRITE never has its data clipped and then marked clean.

use gvfs_nfs::layer::{Calls, WriteBackReport, lock};
use gvfs_nfs::proc::MAX_DATA;
use gvfs_nfs::{CallContext, Credentials, NfsService, ServiceError};
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::Opaque;

use super::attrs::Seen;
use super::{CacheLayer, fh3, upstream_failed};
use crate::error::{LayerError, UpstreamCall};
use crate::store::DirtyData;

/// How often one file's data is resent because upstream's verifier changed
/// before giving up.
const MAX_REWRITES: u64 = 4;

/// How many WRITEs of one file's write-back are in flight at once, so a
/// long fat link stays busy (one 1 MiB WRITE at a time leaves it idle for
/// a round trip per call).
const WRITES_IN_FLIGHT: usize = 8;

/// What upstream said to a run of WRITEs.
struct Sent {
    /// Verifiers of the WRITEs answered UNSTABLE (these need a COMMIT).
    unstable: Vec<writeverf3>,
}

/// Dirty runs of a file as `(file offset, bytes)`, neighbours merged up to
/// [`MAX_DATA`] bytes, clipped to `size`.
fn coalesce(data: &[DirtyData], block_size: u64, size: u64) -> Vec<(u64, Vec<u8>)> {
    let max = MAX_DATA as usize;
    let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
    for d in data {
        let base = d.block * block_size;
        for e in &d.extents {
            let off = base + u64::from(e.offset);
            if off >= size {
                continue;
            }
            let len = (e.data.len() as u64).min(size - off) as usize;
            let bytes = &e.data[..len];
            match runs.last_mut() {
                Some((o, buf)) if *o + buf.len() as u64 == off && buf.len() + len <= max => {
                    buf.extend_from_slice(bytes)
                }
                _ => runs.push((off, bytes.to_vec())),
            }
        }
    }
    runs
}

impl CacheLayer {
    /// Writes every dirty block upstream (coalesced WRITEs, then COMMIT per
    /// file; resent if the upstream verifier changed) and marks it clean.
    /// `progress` is called with `(bytes_done, bytes_total)` as it goes.
    pub async fn write_back(
        &self,
        progress: &(dyn Fn(u64, u64) + Send + Sync),
    ) -> Result<WriteBackReport, ServiceError> {
        let _wb = self.write_back_lock.lock().await;
        let blocks = self.store_op(|s| s.dirty_blocks(None)).await?;
        let total: u64 = blocks
            .iter()
            .flat_map(|b| b.ranges.iter())
            .map(|r| u64::from(r.end - r.start))
            .sum();
        let mut files: Vec<Vec<u8>> = Vec::new();
        for b in &blocks {
            if files.last().map(Vec::as_slice) != Some(b.fh.as_bytes()) {
                files.push(b.fh.as_bytes().to_vec());
            }
        }
        progress(0, total);
        let mut report = WriteBackReport::default();
        let mut done = 0u64;
        let mut on_bytes = |n: u64| {
            done += n;
            progress(done.min(total), total);
        };
        for fh in files {
            self.write_back_file(&fh, &mut report, &mut on_bytes)
                .await?;
        }
        // Make the clean marks durable: a crash now need not resend.
        self.store_op(|s| s.sync()).await?;
        progress(total, total);
        self.counters.write_backs.add(1);
        tracing::info!(?report, "write-back done");
        Ok(report)
    }

    /// Writes one file's dirty data upstream and makes its clean marks
    /// durable.
    pub(super) async fn write_back_one(&self, fh: &[u8]) -> Result<(), ServiceError> {
        let _wb = self.write_back_lock.lock().await;
        let mut report = WriteBackReport::default();
        self.write_back_file(fh, &mut report, &mut |_| {}).await?;
        self.store_op(|s| s.sync()).await
    }

    /// [`write_back`](Self::write_back), then drops all cached (clean)
    /// data.
    pub async fn flush(&self) -> Result<WriteBackReport, ServiceError> {
        let report = self.write_back(&|_, _| {}).await?;
        let _wb = self.write_back_lock.lock().await;
        {
            let mut files = self.files();
            files.bump_all_generations();
        }
        lock(&self.prefetched).clear();
        self.store_op(|s| s.drop_clean()).await?;
        Ok(report)
    }

    /// The credentials `fh`'s dirty data is written back with: its last
    /// writer's; for data recovered without a record of its writer, the
    /// file's owner (root squashed by a server could not write it).
    fn writer_context(&self, fh: &[u8]) -> CallContext {
        let files = self.files();
        let st = files.get(fh);
        let cred = st
            .and_then(|s| s.writer.clone())
            .or_else(|| {
                st?.upstream
                    .as_ref()
                    .map(|a| Credentials::unix(a.uid, a.gid))
            })
            .unwrap_or_else(|| Credentials::unix(0, 0));
        CallContext::with_cred(cred)
    }

    /// The size to clip `fh`'s dirty data to; `None` if the file is gone
    /// upstream (its data is then dropped).
    async fn write_back_size(
        &self,
        cx: &CallContext,
        fh: &[u8],
    ) -> Result<Option<u64>, ServiceError> {
        self.ensure_recovered(cx, fh).await?;
        if let Some(a) = self.effective(fh) {
            return Ok(Some(a.size));
        }
        match self.below.getattr(cx, fh).await? {
            Nfs3Result::Ok(ok) => {
                self.note(fh, &ok.obj_attributes, Seen::Foreign).await;
                Ok(Some(ok.obj_attributes.size))
            }
            Nfs3Result::Err((nfsstat3::NFS3ERR_STALE, _)) => {
                self.file_gone(fh).await?;
                Ok(None)
            }
            Nfs3Result::Err((st, _)) => Err(upstream_failed(UpstreamCall::WriteBackGetattr, st)),
        }
    }

    async fn file_gone(&self, fh: &[u8]) -> Result<(), ServiceError> {
        tracing::error!(fh = ?fh, "file with dirty data no longer exists upstream; dropping its data");
        self.forget_file(fh).await
    }

    /// Writes one file's dirty data upstream and marks it clean.
    pub(super) async fn write_back_file(
        &self,
        fh: &[u8],
        report: &mut WriteBackReport,
        on_bytes: &mut (dyn FnMut(u64) + Send),
    ) -> Result<(), ServiceError> {
        let _file = self.file_locks.lock(fh).await;
        // Recovered data's file is looked up first, for its owner.
        self.ensure_recovered(&self.writer_context(fh), fh).await?;
        let cx = self.writer_context(fh);
        let start_seq = self.files().get(fh).and_then(|s| s.overlay).map(|o| o.seq);
        let bs = self.block_size();
        let mut rewrites = 0;
        loop {
            let key = fh.to_vec();
            let data: Vec<DirtyData> = self
                .store_op(move |s| {
                    let mut out = Vec::new();
                    for b in s.dirty_blocks(Some(&key))? {
                        if let Some(d) = s.dirty_data(&key, b.block)? {
                            out.push(d);
                        }
                    }
                    Ok(out)
                })
                .await?;
            if data.is_empty() {
                break;
            }
            let Some(size) = self.write_back_size(&cx, fh).await? else {
                return Ok(());
            };
            let runs = coalesce(&data, bs, size);
            let bytes: u64 = runs.iter().map(|(_, b)| b.len() as u64).sum();
            let verfs = match self.write_runs(&cx, fh, runs, on_bytes).await? {
                Ok(verfs) => verfs,
                Err((_, nfsstat3::NFS3ERR_STALE)) => return self.file_gone(fh).await,
                Err((off, st)) => {
                    let call = UpstreamCall::WriteBackWrite { offset: off };
                    return Err(upstream_failed(call, st));
                }
            };
            report.bytes += bytes;
            self.counters.write_back_bytes.add(bytes);
            if !verfs.is_empty() {
                match self.up_commit(&cx, fh).await? {
                    Ok(v) if verfs.iter().all(|w| *w == v) => {}
                    Ok(_) => {
                        report.rewrites += 1;
                        rewrites += 1;
                        tracing::warn!(fh = ?fh, "upstream write verifier changed; resending");
                        if rewrites > MAX_REWRITES {
                            return Err(LayerError::VerifierKeepsChanging.into());
                        }
                        continue;
                    }
                    Err(nfsstat3::NFS3ERR_STALE) => return self.file_gone(fh).await,
                    Err(st) => {
                        return Err(upstream_failed(UpstreamCall::WriteBackCommit, st));
                    }
                }
            }
            report.blocks += data.len() as u64;
            report.files += 1;
            // Fetches begun before these WRITEs may hold upstream's older
            // bytes: they must not fill the blocks once clean.
            self.files().bump_generation(fh);
            self.store_op(move |s| data.iter().try_for_each(|d| s.mark_clean(d)))
                .await?;
            break;
        }
        // Back to upstream's attributes once nothing is dirty and the
        // client did not write meanwhile.
        let key = fh.to_vec();
        let dirty = self
            .store_op(move |s| Ok(!s.dirty_blocks(Some(&key))?.is_empty()))
            .await?;
        if !dirty {
            let mut files = self.files();
            let st = files.entry(fh);
            if st.overlay.map(|o| o.seq) == start_seq {
                st.overlay = None;
            }
        }
        Ok(())
    }

    /// Writes one dirty block upstream (stable) and marks it clean, to free
    /// its frame for another block.
    pub(super) async fn write_back_victim(
        &self,
        fh: &[u8],
        block: u64,
    ) -> Result<(), ServiceError> {
        let _file = self.file_locks.lock(fh).await;
        let cx = self.writer_context(fh);
        let key = fh.to_vec();
        let Some(dd) = self.store_op(move |s| s.dirty_data(&key, block)).await? else {
            return Ok(());
        };
        let Some(size) = self.write_back_size(&cx, fh).await? else {
            return Ok(());
        };
        let runs = coalesce(std::slice::from_ref(&dd), self.block_size(), size);
        let mut verfs = Vec::new();
        for (off, buf) in &runs {
            match self
                .up_write(&cx, fh, *off, buf, stable_how::FILE_SYNC)
                .await?
            {
                Ok(sent) => verfs.extend(sent.unstable),
                Err(nfsstat3::NFS3ERR_STALE) => return self.file_gone(fh).await,
                Err(st) => {
                    return Err(upstream_failed(UpstreamCall::EvictionWrite, st));
                }
            }
            self.counters.write_back_bytes.add(buf.len() as u64);
        }
        if !verfs.is_empty() {
            match self.up_commit(&cx, fh).await? {
                Ok(v) if verfs.iter().all(|w| *w == v) => {}
                Ok(_) => {
                    return Err(LayerError::RestartedDuringEviction.into());
                }
                Err(st) => {
                    return Err(upstream_failed(UpstreamCall::EvictionCommit, st));
                }
            }
        }
        self.files().bump_generation(fh);
        self.store_op(move |s| s.mark_clean(&dd)).await?;
        self.counters.eviction_write_backs.add(1);
        Ok(())
    }

    /// Sends `runs` as UNSTABLE WRITEs, up to [`WRITES_IN_FLIGHT`] at once,
    /// calling `on_bytes` as each completes. The verifiers of the WRITEs
    /// upstream answered UNSTABLE, or the offset and status of a failed one
    /// (the WRITEs still in flight are then abandoned).
    async fn write_runs(
        &self,
        cx: &CallContext,
        fh: &[u8],
        runs: Vec<(u64, Vec<u8>)>,
        on_bytes: &mut (dyn FnMut(u64) + Send),
    ) -> Result<Result<Vec<writeverf3>, (u64, nfsstat3)>, ServiceError> {
        let me = self.me().ok_or(LayerError::Dropped)?;
        let mut verfs = Vec::new();
        let mut set = tokio::task::JoinSet::new();
        let mut runs = runs.into_iter();
        loop {
            while set.len() < WRITES_IN_FLIGHT
                && let Some((off, buf)) = runs.next()
            {
                let (me, cx, fh) = (me.clone(), cx.clone(), fh.to_vec());
                set.spawn(async move {
                    let r = me.up_write(&cx, &fh, off, &buf, stable_how::UNSTABLE).await;
                    (off, buf.len() as u64, r)
                });
            }
            let Some(joined) = set.join_next().await else {
                break;
            };
            let (off, len, r) = joined.map_err(|source| LayerError::Task {
                task: "write-back",
                source,
            })?;
            match r? {
                Ok(sent) => verfs.extend(sent.unstable),
                Err(st) => return Ok(Err((off, st))),
            }
            on_bytes(len);
        }
        Ok(Ok(verfs))
    }

    /// WRITEs `data` at `offset`, continuing after short writes.
    async fn up_write(
        &self,
        cx: &CallContext,
        fh: &[u8],
        offset: u64,
        data: &[u8],
        stable: stable_how,
    ) -> Result<Result<Sent, nfsstat3>, ServiceError> {
        let mut sent = Sent {
            unstable: Vec::new(),
        };
        let mut pos = 0usize;
        while pos < data.len() {
            let args = WRITE3args {
                file: fh3(fh),
                offset: offset + pos as u64,
                count: (data.len() - pos) as u32,
                stable,
                data: Opaque::owned(data[pos..].to_vec()),
            };
            match self.below.write(cx, args).await? {
                Nfs3Result::Ok(ok) => {
                    self.note_wcc(fh, &ok.file_wcc).await;
                    if ok.count == 0 {
                        return Err(ServiceError::UpstreamProtocol {
                            upstream: self.below.describe(),
                            reason: "WRITE accepted no bytes".into(),
                        });
                    }
                    if ok.committed == stable_how::UNSTABLE {
                        sent.unstable.push(ok.verf);
                    }
                    pos += (ok.count as usize).min(data.len() - pos);
                }
                Nfs3Result::Err((st, fail)) => {
                    self.note_wcc(fh, &fail.file_wcc).await;
                    return Ok(Err(st));
                }
            }
        }
        Ok(Ok(sent))
    }

    async fn up_commit(
        &self,
        cx: &CallContext,
        fh: &[u8],
    ) -> Result<Result<writeverf3, nfsstat3>, ServiceError> {
        match self.below.commit(cx, fh).await? {
            Nfs3Result::Ok(ok) => {
                self.note_wcc(fh, &ok.file_wcc).await;
                Ok(Ok(ok.verf))
            }
            Nfs3Result::Err((st, _)) => Ok(Err(st)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::DirtyExtent;

    fn dd(block: u64, extents: &[(u32, usize)]) -> DirtyData {
        DirtyData {
            fh: crate::set::FileHandle::from_checked(b"f"),
            block,
            extents: extents
                .iter()
                .map(|&(offset, len)| DirtyExtent {
                    offset,
                    data: vec![1; len],
                })
                .collect(),
            end: 0,
            seq: 0,
        }
    }

    #[test]
    fn coalesces_neighbours_and_clips_to_size() {
        let data = [dd(0, &[(0, 1024), (3072, 1024)]), dd(1, &[(0, 2048)])];
        let runs = coalesce(&data, 4096, 5000);
        let shape: Vec<(u64, usize)> = runs.iter().map(|(o, b)| (*o, b.len())).collect();
        assert_eq!(shape, vec![(0, 1024), (3072, 1928)]);
    }

    #[test]
    fn runs_stop_at_max_data() {
        let bs = 1u64 << 20;
        let data = [dd(0, &[(0, bs as usize)]), dd(1, &[(0, 10)])];
        let runs = coalesce(&data, bs, u64::MAX);
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[1].0, bs);
    }
}
