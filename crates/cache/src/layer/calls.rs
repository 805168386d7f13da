//! The calls around the data: COMMIT, SETATTR (size changes reach the
//! cached blocks), REMOVE and RENAME (a file's blocks go with it), CREATE,
//! GETATTR and ACCESS (attributes with local writes laid over), and the
//! calls forwarded as they are.

use super::*;

impl CacheLayer {
    pub(super) async fn commit(
        &self,
        cx: &CallContext,
        args: COMMIT3args,
    ) -> Result<NfsReply, ServiceError> {
        self.counters.commits.add(1);
        if self.config.policy == WritePolicy::WriteThrough {
            let fh = args.file.data.to_vec();
            let reply = self.below.call(cx, NfsRequest::Commit(args)).await?;
            if let NfsReply::Commit(Nfs3Result::Ok(ok)) = &reply {
                self.note_wcc(&fh, &ok.file_wcc).await;
            }
            return Ok(reply);
        }
        let fh = args.file.data.to_vec();
        self.store_op(|s| s.sync()).await?;
        Ok(NfsReply::Commit(Nfs3Result::Ok(COMMIT3resok {
            file_wcc: wcc_data {
                before: Nfs3Option::None,
                after: post_op(self.effective(&fh)),
            },
            verf: writeverf3(self.store.verifier()),
        })))
    }

    // ---- metadata ----

    pub(super) async fn setattr(
        &self,
        cx: &CallContext,
        args: SETATTR3args,
    ) -> Result<NfsReply, ServiceError> {
        let fh = args.object.data.to_vec();
        // A time the client sets must be the file's last change upstream:
        // its dirty data goes there first (as a kernel client flushes
        // before such a SETATTR), or write-back would stamp the file later
        // and the client's mtime (`touch -d`, `cp -p`, tar) would be lost.
        let sets_mtime = !matches!(args.new_attributes.mtime, set_mtime::DONT_CHANGE);
        if sets_mtime && self.files().get(&fh).is_some_and(|s| s.pinned()) {
            self.write_back_one(&fh).await?;
        }
        let new_size = match args.new_attributes.size {
            Nfs3Option::Some(s) => Some(s),
            Nfs3Option::None => None,
        };
        let Some(size) = new_size else {
            let mut reply = self.below.call(cx, NfsRequest::Setattr(args)).await?;
            self.note_setattr(&fh, &mut reply).await;
            return Ok(reply);
        };
        // No write-back may be sending data past the new size meanwhile.
        let _wb = self.write_back_lock.lock().await;
        let _file = self.file_locks.lock(&fh).await;
        self.ensure_recovered(cx, &fh).await?;
        let mut reply = self.below.call(cx, NfsRequest::Setattr(args)).await?;
        if reply.status() == nfsstat3::NFS3_OK {
            // Only now: dirty data past the size is the client's, kept
            // (and written back) if upstream refuses the truncation.
            self.truncate_cached(&fh, size).await?;
            let mut files = self.files();
            let seq = files.next_seq();
            if let Some(ov) = &mut files.entry(&fh).overlay {
                ov.size = size;
                ov.mtime = now();
                ov.seq = seq;
            }
        }
        self.note_setattr(&fh, &mut reply).await;
        Ok(reply)
    }

    pub(super) async fn truncate_cached(&self, fh: &[u8], size: u64) -> Result<(), ServiceError> {
        self.files().bump_generation(fh);
        let key = fh.to_vec();
        self.store_op(move |s| {
            if s.has_file(&key)? {
                s.truncate(&key, size)?;
            }
            Ok(())
        })
        .await
    }

    pub(super) async fn note_setattr(&self, fh: &[u8], reply: &mut NfsReply) {
        if let NfsReply::Setattr(r) = reply {
            let wcc = match r {
                Nfs3Result::Ok(ok) => &mut ok.obj_wcc,
                Nfs3Result::Err((_, fail)) => &mut fail.obj_wcc,
            };
            self.note_wcc(fh, wcc).await;
            self.overlay_attrs(fh, &mut wcc.after);
        }
    }

    /// Drops everything cached of a file that no longer exists upstream.
    pub(super) async fn forget_file(&self, fh: &[u8]) -> Result<(), ServiceError> {
        self.files().remove(fh);
        let key = fh.to_vec();
        self.store_op(move |s| {
            if s.has_file(&key)? {
                s.invalidate(&key, true)?;
            }
            Ok(())
        })
        .await
    }

    /// The handle of `dir/name` if the cache may hold data of it.
    pub(super) async fn doomed_target(
        &self,
        cx: &CallContext,
        dir: &nfs_fh3,
        name: &filename3<'_>,
    ) -> Result<Option<(Vec<u8>, Option<fattr3>)>, ServiceError> {
        let anything = self.store_op(|s| Ok(s.cached_files()? > 0)).await?;
        if !anything {
            return Ok(None);
        }
        self.up_lookup(cx, dir, name).await
    }

    pub(super) async fn remove(
        &self,
        cx: &CallContext,
        args: REMOVE3args<'static>,
    ) -> Result<NfsReply, ServiceError> {
        let target = self
            .doomed_target(cx, &args.object.dir, &args.object.name)
            .await?;
        let reply = self.below.call(cx, NfsRequest::Remove(args)).await?;
        if reply.status() == nfsstat3::NFS3_OK
            && let Some((fh, attrs)) = target
            && attrs.is_none_or(|a| a.nlink <= 1 && a.type_ == ftype3::NF3REG)
        {
            self.forget_file(&fh).await?;
        }
        Ok(reply)
    }

    pub(super) async fn rename(
        &self,
        cx: &CallContext,
        args: RENAME3args<'static, 'static>,
    ) -> Result<NfsReply, ServiceError> {
        let target = self.doomed_target(cx, &args.to.dir, &args.to.name).await?;
        let source = match &target {
            Some(_) => self.up_lookup(cx, &args.from.dir, &args.from.name).await?,
            None => None,
        };
        let reply = self.below.call(cx, NfsRequest::Rename(args)).await?;
        if reply.status() == nfsstat3::NFS3_OK
            && let Some((fh, attrs)) = target
            && source.is_none_or(|(s, _)| s != fh)
            && attrs.is_none_or(|a| a.nlink <= 1 && a.type_ == ftype3::NF3REG)
        {
            self.forget_file(&fh).await?;
        }
        Ok(reply)
    }

    pub(super) async fn forward(
        &self,
        cx: &CallContext,
        req: NfsRequest,
    ) -> Result<NfsReply, ServiceError> {
        // A LINK's reply carries the linked file's attributes: upstream's,
        // which do not know the writes this cache still holds.
        let linked = match &req {
            NfsRequest::Link(a) => Some(a.file.data.to_vec()),
            _ => None,
        };
        let mut reply = self.below.call(cx, req).await?;
        match &mut reply {
            NfsReply::Link(r) => {
                let attrs = match r {
                    Nfs3Result::Ok(ok) => &mut ok.file_attributes,
                    Nfs3Result::Err((_, fail)) => &mut fail.file_attributes,
                };
                if let Some(fh) = &linked {
                    // Our own change (the link count and ctime): not a
                    // reason to drop the file's cached blocks.
                    self.note_post_op(fh, attrs, Seen::Own(None)).await;
                    self.overlay_attrs(fh, attrs);
                }
            }
            NfsReply::Lookup(Nfs3Result::Ok(ok)) => {
                let fh = ok.object.data.to_vec();
                self.note_post_op(&fh, &ok.obj_attributes, Seen::Foreign)
                    .await;
                self.ensure_recovered(cx, &fh).await?;
                self.overlay_attrs(&fh, &mut ok.obj_attributes);
            }
            NfsReply::Readdirplus(Nfs3Result::Ok(ok)) => {
                for e in ok.reply.entries.0.iter_mut() {
                    if let Nfs3Option::Some(h) = &e.name_handle {
                        let fh = h.data.to_vec();
                        self.note_post_op(&fh, &e.name_attributes, Seen::Foreign)
                            .await;
                        self.overlay_attrs(&fh, &mut e.name_attributes);
                    }
                }
            }
            _ => {}
        }
        Ok(reply)
    }

    pub(super) async fn getattr(
        &self,
        cx: &CallContext,
        args: GETATTR3args,
    ) -> Result<NfsReply, ServiceError> {
        let fh = args.object.data.to_vec();
        let mut reply = self.below.call(cx, NfsRequest::Getattr(args)).await?;
        if let NfsReply::Getattr(Nfs3Result::Ok(ok)) = &mut reply {
            self.note(&fh, &ok.obj_attributes, Seen::Foreign).await;
            self.ensure_recovered(cx, &fh).await?;
            let mut a = Nfs3Option::Some(ok.obj_attributes.clone());
            self.overlay_attrs(&fh, &mut a);
            if let Nfs3Option::Some(a) = a {
                ok.obj_attributes = a;
            }
        }
        Ok(reply)
    }

    pub(super) async fn access(
        &self,
        cx: &CallContext,
        args: ACCESS3args,
    ) -> Result<NfsReply, ServiceError> {
        let fh = args.object.data.to_vec();
        let mut reply = self.below.call(cx, NfsRequest::Access(args)).await?;
        if let NfsReply::Access(Nfs3Result::Ok(ok)) = &mut reply {
            self.note_post_op(&fh, &ok.obj_attributes, Seen::Foreign)
                .await;
            self.overlay_attrs(&fh, &mut ok.obj_attributes);
        }
        Ok(reply)
    }

    pub(super) async fn create(
        &self,
        cx: &CallContext,
        args: CREATE3args<'static>,
    ) -> Result<NfsReply, ServiceError> {
        // CREATE UNCHECKED with a size truncates an existing file.
        let truncating = match &args.how {
            createhow3::UNCHECKED(s) => match s.size {
                Nfs3Option::Some(n) => Some(n),
                Nfs3Option::None => None,
            },
            _ => None,
        };
        let mut reply = self.below.call(cx, NfsRequest::Create(args)).await?;
        if let NfsReply::Create(Nfs3Result::Ok(ok)) = &mut reply
            && let Nfs3Option::Some(h) = &ok.obj
        {
            let fh = h.data.to_vec();
            if let Some(size) = truncating {
                let _wb = self.write_back_lock.lock().await;
                let _file = self.file_locks.lock(&fh).await;
                self.truncate_cached(&fh, size).await?;
                let mut files = self.files();
                if let Some(ov) = &mut files.entry(&fh).overlay {
                    ov.size = size;
                }
            }
            self.note_post_op(&fh, &ok.obj_attributes, Seen::Foreign)
                .await;
            self.overlay_attrs(&fh, &mut ok.obj_attributes);
        }
        Ok(reply)
    }
}
