//! Files the file cache holds whole (compress-and-copy): READs served
//! from the local copy, WRITEs and COMMITs kept in it (held writes), their
//! write-back, and the attributes clients see of a file with local writes.

use super::*;
use gvfs_ext::{Class, Want};
use gvfs_filecache::FileCacheError;
use gvfs_nfs::layer::{Backlog, Lifecycle, Progress, WriteBackKind, WriteBackReport};

impl MetaLayer {
    /// A READ of a compress-and-copy file, from the file cache (fetching
    /// the whole file into it on first use); `None` when it cannot be, and
    /// the READ takes the block path.
    pub(super) async fn read_copy(
        &self,
        cx: &CallContext,
        fh: &[u8],
        meta: &MetaFile,
        attrs: &fattr3,
        args: &READ3args,
    ) -> Option<NfsReply> {
        let copy = self.copy.as_ref()?;
        if self.files().get(fh).is_some_and(|e| e.no_copy) || !copy.source.supported().await {
            return None;
        }
        // Most READs find the file already held (or on its way).
        let held = copy
            .files
            .get(fh)
            .filter(|f| same_version(&f.attrs(), attrs))
            .map(Ok);
        let entry = held.unwrap_or_else(|| {
            copy.files.start(
                fh,
                attrs,
                Some(meta),
                copy.source.clone(),
                &cx.cred,
                true,
                &Want::local(Class::Demand),
            )
        });
        let result = match entry {
            Ok(f) => self.read_held(cx, copy, &f, args).await,
            Err(why) => Err(why),
        };
        match result {
            Ok(reply) => Some(reply),
            Err(why) => {
                tracing::warn!(fh = ?fh, %why, "compress-and-copy failed; reading the file block by block");
                if let Some(e) = self.files().get_mut(fh) {
                    e.no_copy = true;
                }
                None
            }
        }
    }

    /// A READ served from a file held in the file cache (waiting for the
    /// chunks it needs), with the attributes clients see. Its fetches go
    /// as demand, or as bulk once the file's reader reads it in order (a
    /// copy: `CachedFile::note_read`).
    pub(super) async fn read_held(
        &self,
        cx: &CallContext,
        copy: &CopyPath,
        f: &Arc<CachedFile>,
        args: &READ3args,
    ) -> Result<NfsReply, FileCacheError> {
        let count = args.count.min(MAX_READ);
        f.touch(args.offset, u64::from(count));
        let want = Want::local(f.note_read(args.offset, u64::from(count)));
        let (data, eof) = f
            .read(
                &copy.files,
                &copy.source,
                &cx.cred,
                args.offset,
                count,
                &want,
            )
            .await?;
        self.counters.copy_reads.add(1);
        Ok(NfsReply::Read(Nfs3Result::Ok(READ3resok {
            file_attributes: Nfs3Option::Some(f.local_attrs()),
            count: data.len() as u32,
            eof,
            data: Opaque(data),
        })))
    }

    /// The file-cache entry of `fh` when it holds local writes.
    pub(super) fn held_dirty(&self, fh: &[u8]) -> Option<Arc<CachedFile>> {
        self.copy.as_ref()?.files.get(fh).filter(|f| f.is_dirty())
    }

    /// The file-cache entry of `fh` when writes to it go there: it is held
    /// whole and is the version upstream has (or already holds writes).
    pub(super) fn held_whole(&self, fh: &[u8]) -> Option<Arc<CachedFile>> {
        let copy = self.copy.as_ref()?;
        // Writes kept here must survive a restart: not with an index that
        // lives in memory only (they go upstream instead).
        if !copy.files.keeps_writes() {
            return None;
        }
        let f = copy.files.get(fh)?;
        if f.is_dirty() {
            return Some(f);
        }
        let current = self.files().get(fh).and_then(|e| e.attrs.clone())?;
        (f.complete() && same_version(&f.attrs(), &current)).then_some(f)
    }

    /// A WRITE into a file held whole: kept in the file cache until
    /// `gvfsctl writeback`.
    pub(super) async fn write_held(
        &self,
        cx: &CallContext,
        f: &Arc<CachedFile>,
        args: WRITE3args<'_>,
    ) -> Result<NfsReply, ServiceError> {
        let copy = self.copy.as_ref().ok_or(FileCacheError::NoFileCache)?;
        let sync = !matches!(args.stable, stable_how::UNSTABLE);
        let count = args.count.min(args.data.len() as u32);
        let mut data = args.data.into_owned();
        data.truncate(count as usize);
        let offset = args.offset;
        // A refusal says how the file stands here.
        let refused = |status| {
            NfsReply::Write(Nfs3Result::Err((
                status,
                WRITE3resfail {
                    file_wcc: wcc_data {
                        before: Nfs3Option::None,
                        after: Nfs3Option::Some(f.local_attrs()),
                    },
                },
            )))
        };
        if let Err(st) = self
            .may_write(cx, f, offset.saturating_add(u64::from(count)))
            .await
        {
            return Ok(refused(st));
        }
        let (before, after) = match f.write(&copy.files, &cx.cred, offset, data, sync).await {
            Ok(attrs) => attrs,
            Err(e) => {
                tracing::warn!(error = %e, "write to a file held whole not kept");
                // Let go before or during the write: nothing was kept, and
                // the client's retry goes upstream.
                return Ok(refused(match e {
                    HeldWriteError::NotHeld | HeldWriteError::LetGo => nfsstat3::NFS3ERR_JUKEBOX,
                    other => other.nfsstat(),
                }));
            }
        };
        self.counters.copy_writes.add(1);
        Ok(NfsReply::Write(Nfs3Result::Ok(WRITE3resok {
            file_wcc: wcc(&before, &after),
            count,
            committed: if sync {
                stable_how::FILE_SYNC
            } else {
                stable_how::UNSTABLE
            },
            verf: copy.files.verifier(),
        })))
    }

    /// Whether this caller may write the held file (up to `end`): by the
    /// file's mode, else by ACCESS with its credentials through the layers
    /// below (an ACL may allow it).
    pub(super) async fn may_write(
        &self,
        cx: &CallContext,
        f: &CachedFile,
        end: u64,
    ) -> Result<(), nfsstat3> {
        let local = f.local_attrs();
        let target = WriteTarget {
            fh: f.fh(),
            uid: local.uid,
            gid: local.gid,
            mode: local.mode,
            extends: end > local.size,
        };
        match self.write_checks.may_write(&*self.inner, cx, target).await {
            Ok(r) => r,
            Err(e) => Err(e.nfsstat()),
        }
    }

    /// A COMMIT of a file holding local writes: synced in the file cache.
    pub(super) async fn commit_held(&self, f: &Arc<CachedFile>) -> Result<NfsReply, ServiceError> {
        let copy = self.copy.as_ref().ok_or(FileCacheError::NoFileCache)?;
        let before = f.local_attrs();
        let after = match f.commit(&copy.files).await {
            Ok(a) => a,
            Err(e) => {
                // A full disk is the client's to hear of (NFS3ERR_NOSPC):
                // it keeps its uncommitted writes and sends them again.
                tracing::warn!(error = %e, "COMMIT of a file held whole failed");
                return Ok(NfsReply::Commit(Nfs3Result::Err((
                    e.nfsstat(),
                    COMMIT3resfail {
                        file_wcc: wcc_data {
                            before: Nfs3Option::None,
                            after: Nfs3Option::Some(f.local_attrs()),
                        },
                    },
                ))));
            }
        };
        Ok(NfsReply::Commit(Nfs3Result::Ok(COMMIT3resok {
            file_wcc: wcc(&before, &after),
            verf: copy.files.verifier(),
        })))
    }

    /// Writes back every file holding local writes (`gvfsctl writeback`):
    /// compressed chunks, sent with the extension's STORE. Returns the
    /// file bytes written back.
    pub async fn write_back(&self) -> Result<u64, ServiceError> {
        let Some(copy) = &self.copy else {
            return Ok(0);
        };
        let known: Vec<Vec<u8>> = self.files().keys().cloned().collect();
        let held: Vec<Vec<u8>> = known
            .into_iter()
            .filter(|fh| copy.files.get(fh).is_some_and(|f| f.is_dirty()))
            .collect();
        let written = copy.files.write_back(copy.source.as_ref()).await;
        // Upstream holds another version now, and the file cache lets the
        // written files go: their metadata and attributes describe the old
        // one (a zero map would answer the client's writes as zeros). Look
        // both up again on the next READ.
        let mut files = self.files();
        for fh in &held {
            if let Some(e) = files.get_mut(fh) {
                e.known = Known::Unknown;
                e.attrs = None;
                e.no_copy = false;
            }
        }
        drop(files);
        written.map_err(ServiceError::from)
    }

    /// File bytes the file cache has written back since start.
    pub fn written_back_bytes(&self) -> u64 {
        self.copy
            .as_ref()
            .map_or(0, |c| c.files.stats().counts.written_back_bytes)
    }

    /// Gives the attributes of files holding local writes (their size and
    /// times here, not upstream's) wherever a reply carries them: the
    /// call's own file (GETATTR, ACCESS), the file a LOOKUP found, each
    /// entry of a READDIRPLUS.
    pub(super) fn patch_held(&self, reply: &mut NfsReply, subject: Option<Vec<u8>>) {
        match reply {
            NfsReply::Lookup(Nfs3Result::Ok(ok)) => {
                if let (Some(f), Nfs3Option::Some(a)) =
                    (self.held_dirty(&ok.object.data), &mut ok.obj_attributes)
                {
                    *a = f.local_attrs();
                }
            }
            NfsReply::Readdirplus(Nfs3Result::Ok(ok)) => {
                for e in ok.reply.entries.0.iter_mut() {
                    if let (Nfs3Option::Some(h), Nfs3Option::Some(a)) =
                        (&e.name_handle, &mut e.name_attributes)
                        && let Some(f) = self.held_dirty(&h.data)
                    {
                        *a = f.local_attrs();
                    }
                }
            }
            _ => {
                if let Some(f) = subject.and_then(|fh| self.held_dirty(&fh)) {
                    patch_attrs(reply, &f.local_attrs());
                }
            }
        }
    }
}

pub(super) fn wcc(before: &fattr3, after: &fattr3) -> wcc_data {
    wcc_data {
        before: Nfs3Option::Some(wcc_attr {
            size: before.size,
            mtime: before.mtime,
            ctime: before.ctime,
        }),
        after: Nfs3Option::Some(after.clone()),
    }
}

/// Puts the attributes clients see of a file with local writes into a
/// reply about it.
pub(super) fn patch_attrs(reply: &mut NfsReply, local: &fattr3) {
    let slot = match reply {
        NfsReply::Getattr(Nfs3Result::Ok(ok)) => {
            ok.obj_attributes = local.clone();
            return;
        }
        NfsReply::Access(Nfs3Result::Ok(ok)) => &mut ok.obj_attributes,
        _ => return,
    };
    if let Nfs3Option::Some(a) = slot {
        *a = local.clone();
    }
}

/// The metadata layer's part in write-back: files held whole with local
/// writes are written back (a flush too: written files are let go), and it
/// says how many are dirty and how many bytes went.
impl Lifecycle for MetaLayer {
    fn name(&self) -> &'static str {
        "metadata layer"
    }

    fn write_back<'a>(
        &'a self,
        _kind: WriteBackKind,
        _progress: Progress<'a>,
    ) -> Option<gvfs_nfs::BoxFuture<'a, Result<WriteBackReport, ServiceError>>> {
        // What it sent shows in `file_bytes_written_back`, not as blocks.
        Some(Box::pin(async move {
            MetaLayer::write_back(self).await?;
            Ok(WriteBackReport::default())
        }))
    }

    fn backlog(&self) -> Backlog {
        Backlog {
            dirty_files: self
                .copy
                .as_ref()
                .map_or(0, |c| c.files.stats().dirty_files),
            file_bytes_written_back: self.written_back_bytes(),
            ..Backlog::default()
        }
    }
}
