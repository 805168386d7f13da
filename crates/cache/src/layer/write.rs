//! The write path: WRITEs kept as dirty blocks (write-back) or sent
//! upstream first (write-through), the write-permission check, and making
//! room in a full set.

use super::*;

impl CacheLayer {
    pub(super) async fn write(
        &self,
        cx: &CallContext,
        args: WRITE3args<'static>,
    ) -> Result<NfsReply, ServiceError> {
        self.counters.writes.add(1);
        let n = (args.count as usize).min(args.data.len());
        self.counters.write_bytes.add(n as u64);
        match self.config.policy {
            WritePolicy::WriteBack => self.write_cached(cx, args).await,
            WritePolicy::WriteThrough => self.write_through(cx, args).await,
        }
    }

    pub(super) async fn write_cached(
        &self,
        cx: &CallContext,
        args: WRITE3args<'static>,
    ) -> Result<NfsReply, ServiceError> {
        let fh = args.file.data.to_vec();
        let attrs = match self.file_attrs(cx, &fh).await? {
            Ok(a) => a,
            Err(st) => return Ok(NfsReply::error(gvfs_nfs::NfsProc::Write, st)),
        };
        if attrs.type_ != ftype3::NF3REG {
            return self.below.call(cx, NfsRequest::Write(args)).await;
        }
        let n = (args.count as usize).min(args.data.len());
        let data = &args.data[..n];
        let end = args.offset.saturating_add(n as u64);
        // Upstream would check this caller's right to write when the WRITE
        // reached it; kept here, it is checked first: by the file's mode
        // (no round trip, so writes go on during an outage), and when the
        // mode says no, by asking upstream (an ACL may say yes).
        let current = self
            .files()
            .get(&fh)
            .and_then(|s| s.overlay)
            .map_or(attrs.size, |o| o.size);
        let target = WriteTarget {
            fh: &fh,
            uid: attrs.uid,
            gid: attrs.gid,
            mode: attrs.mode,
            extends: end > current,
        };
        if let Err(st) = self.write_checks.may_write(&self.below, cx, target).await? {
            return Ok(NfsReply::error(gvfs_nfs::NfsProc::Write, st));
        }
        // The size grows before the data lands, so a concurrent write-back
        // never clips data it has taken (see writeback.rs).
        let new_writer = {
            let mut files = self.files();
            let seq = files.next_seq();
            let st = files.entry(&fh);
            let size = st.overlay.map_or(attrs.size, |o| o.size).max(end);
            st.overlay = Some(Overlay {
                size,
                mtime: now(),
                seq,
            });
            let new = st.writer.as_ref() != Some(&cx.cred);
            st.writer = Some(cx.cred.clone());
            new
        };
        // The verifier before the data lands: should dirty data be lost
        // meanwhile, the verifier this WRITE returns is not the new one.
        let verf = writeverf3(self.store.verifier());
        let bs = self.block_size();
        let mut pos = 0usize;
        while pos < n {
            let off = args.offset + pos as u64;
            let block = off / bs;
            let in_block = (off % bs) as u32;
            let len = ((bs - u64::from(in_block)) as usize).min(n - pos);
            self.store_dirty(cx, &fh, block, in_block, data[pos..pos + len].to_vec())
                .await?;
            pos += len;
        }
        if new_writer {
            // Recorded once the file has dirty data (so it is kept), made
            // durable with the store's next sync (a COMMIT): data recovered
            // after a crash is written back as its writer.
            let (key, mut who) = (fh.clone(), Vec::new());
            cx.cred.encode(&mut who);
            self.store_op(move |s| s.set_writer(&key, &who)).await?;
        }
        let committed = if args.stable == stable_how::UNSTABLE {
            stable_how::UNSTABLE
        } else {
            self.store_op(|s| s.sync()).await?;
            stable_how::FILE_SYNC
        };
        let after = self.effective(&fh);
        Ok(NfsReply::Write(Nfs3Result::Ok(WRITE3resok {
            file_wcc: wcc_data {
                before: Nfs3Option::Some(wcc_of(&attrs)),
                after: post_op(after),
            },
            count: n as u32,
            committed,
            verf,
        })))
    }

    /// Stores dirty data in one block: fills a partly covered sub-block
    /// from upstream first, or writes a victim back to free a frame.
    pub(super) async fn store_dirty(
        &self,
        cx: &CallContext,
        fh: &[u8],
        block: u64,
        offset: u32,
        data: Vec<u8>,
    ) -> Result<(), ServiceError> {
        let data = Arc::new(data);
        for _ in 0..MAX_STORE_ATTEMPTS {
            let (key, d) = (fh.to_vec(), data.clone());
            match self
                .store_raw(move |s| s.write(&key, block, offset, &d, WriteMode::Dirty))
                .await
            {
                Ok(WriteOutcome::Stored) => return Ok(()),
                Ok(WriteOutcome::NeedsWriteBack(victim)) => {
                    self.write_back_victim(victim.fh.as_bytes(), victim.block)
                        .await?;
                }
                Err(Error::PartialSubBlockWrite { .. }) => {
                    let me = self.me().ok_or(LayerError::Dropped)?;
                    match me
                        .fetch_block(cx.cred.clone(), fh.to_vec(), block, false)
                        .await
                    {
                        Ok(f) => self.fill_making_room(fh, block, &f).await?,
                        Err(FetchError::Service(e)) => return Err(e),
                        Err(FetchError::Nfs(st)) => {
                            let call = UpstreamCall::FillForPartialWrite { block };
                            return Err(upstream_failed(call, st));
                        }
                    }
                }
                Err(e) => return Err(local(e)),
            }
        }
        Err(LayerError::NoRoom {
            block,
            attempts: MAX_STORE_ATTEMPTS,
        }
        .into())
    }

    /// Fills a fetched block clean, writing a dirty victim back first if
    /// its set is full (a read miss just drops such a fill; a partial
    /// write needs it).
    pub(super) async fn fill_making_room(
        &self,
        fh: &[u8],
        block: u64,
        f: &Fetched,
    ) -> Result<(), ServiceError> {
        // Shorter than a block only at the end of the file: zeros past it.
        let mut fill = f.data.clone();
        fill.resize(self.geo.block_size() as usize, 0);
        let fill = Arc::new(fill);
        for _ in 0..MAX_STORE_ATTEMPTS {
            let (key, d, files, generation) =
                (fh.to_vec(), fill.clone(), self.files.clone(), f.generation);
            match self
                .store_op(move |s| {
                    let still = || lock(&files).generation(&key) == generation;
                    s.write_if(&key, block, 0, &d, WriteMode::Clean, still)
                })
                .await?
            {
                // Stale (truncated, written back or dropped meanwhile):
                // the caller fetches again.
                None | Some(WriteOutcome::Stored) => return Ok(()),
                Some(WriteOutcome::NeedsWriteBack(victim)) => {
                    self.write_back_victim(victim.fh.as_bytes(), victim.block)
                        .await?
                }
            }
        }
        Ok(())
    }

    pub(super) async fn write_through(
        &self,
        cx: &CallContext,
        args: WRITE3args<'static>,
    ) -> Result<NfsReply, ServiceError> {
        let fh = args.file.data.to_vec();
        // Dirty data left by an earlier write-back session would later
        // overwrite this write: send it first.
        let pending = self
            .files()
            .get(&fh)
            .is_some_and(|s| s.overlay.is_some() || s.recovered);
        if pending {
            let _wb = self.write_back_lock.lock().await;
            let mut report = WriteBackReport::default();
            self.write_back_file(&fh, &mut report, &mut |_| {}).await?;
        }
        self.files().bump_generation(&fh);
        let n = (args.count as usize).min(args.data.len());
        let data = args.data[..n].to_vec();
        let offset = args.offset;
        let res = self.below.write(cx, args).await?;
        let written = match &res {
            Nfs3Result::Ok(ok) => {
                self.note_wcc(&fh, &ok.file_wcc).await;
                (ok.count as usize).min(n)
            }
            Nfs3Result::Err((_, fail)) => {
                self.note_wcc(&fh, &fail.file_wcc).await;
                return Ok(NfsReply::Write(res));
            }
        };
        let bs = self.block_size();
        let key = fh.clone();
        let r = self
            .store_raw(move |s| {
                let mut pos = 0usize;
                while pos < written {
                    let off = offset + pos as u64;
                    let in_block = (off % bs) as u32;
                    let len = ((bs - u64::from(in_block)) as usize).min(written - pos);
                    let _ = s.write(
                        &key,
                        off / bs,
                        in_block,
                        &data[pos..pos + len],
                        WriteMode::Clean,
                    )?;
                    pos += len;
                }
                Ok(())
            })
            .await;
        if let Err(e) = r {
            // The data is upstream; make sure no stale copy is served.
            tracing::warn!("block cache: caching written data failed: {e}");
            let key = fh.clone();
            self.store_op(move |s| s.invalidate(&key, false)).await?;
        }
        Ok(NfsReply::Write(res))
    }
}
