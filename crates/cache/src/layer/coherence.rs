//! The layer's side of coherence (see the parent module's docs):
//!
//! * Attributes upstream reports are noted; a file that changed behind our
//!   back without dirty data here loses its clean blocks.
//! * Replies show the size and mtime the client wrote (the overlay) while
//!   the file has dirty data here.
//! * A file whose dirty data was recovered from an earlier session gets
//!   back, when it is first used, the size the client wrote: where the last
//!   dirty write into its last dirty block ended, or upstream's size if
//!   larger. If upstream no longer has the file, its data is dropped.

use super::*;

impl CacheLayer {
    /// Records attributes upstream reported for `fh`, dropping its clean
    /// blocks if it changed behind our back.
    pub(super) async fn note(&self, fh: &[u8], a: &fattr3, seen: Seen) {
        let stale = self.files().observe(fh, a, seen);
        if stale {
            let key = fh.to_vec();
            let r = self
                .store_raw(move |s| {
                    if s.has_file(&key)? {
                        s.invalidate(&key, false).map(Some)
                    } else {
                        Ok(None)
                    }
                })
                .await;
            if let Ok(Some(_)) = r {
                self.counters.invalidations.add(1);
                tracing::debug!(fh = ?fh, "file changed upstream; clean blocks dropped");
            }
        }
    }

    /// [`note`](Self::note) for attributes a reply may carry.
    pub(super) async fn note_post_op(&self, fh: &[u8], a: &post_op_attr, seen: Seen) {
        if let Nfs3Option::Some(a) = a {
            self.note(fh, a, seen).await;
        }
    }

    /// Records the wcc data of our own change of `fh`.
    pub(super) async fn note_wcc(&self, fh: &[u8], wcc: &wcc_data) {
        let before = match wcc.before {
            Nfs3Option::Some(b) => Some(b),
            Nfs3Option::None => None,
        };
        self.note_post_op(fh, &wcc.after, Seen::Own(before)).await;
    }

    /// Replaces upstream attributes in a reply by what the client should
    /// see (the dirty overlay).
    pub(super) fn overlay_attrs(&self, fh: &[u8], a: &mut post_op_attr) {
        if let Nfs3Option::Some(attrs) = a {
            let files = self.files();
            if let Some(st) = files.get(fh)
                && let Some(ov) = st.overlay
            {
                attrs.size = ov.size;
                attrs.used = attrs.used.max(ov.size);
                attrs.mtime = ov.mtime;
                attrs.ctime = ov.mtime;
            }
        }
    }

    /// The attributes the client should see for `fh`, if known.
    pub(super) fn effective(&self, fh: &[u8]) -> Option<fattr3> {
        self.files().get(fh).and_then(|s| s.effective())
    }

    /// The attributes the client should see for `fh`, asking upstream if
    /// none are known; `Err(status)` if upstream refused.
    pub(super) async fn file_attrs(
        &self,
        cx: &CallContext,
        fh: &[u8],
    ) -> Result<Result<fattr3, nfsstat3>, ServiceError> {
        self.ensure_recovered(cx, fh).await?;
        if let Some(a) = self.effective(fh) {
            return Ok(Ok(a));
        }
        match self.below.getattr(cx, fh).await? {
            Nfs3Result::Ok(ok) => {
                self.note(fh, &ok.obj_attributes, Seen::Foreign).await;
                // Only regular files are remembered; others answer as is.
                Ok(Ok(self.effective(fh).unwrap_or(ok.obj_attributes)))
            }
            Nfs3Result::Err((st, _)) => Ok(Err(st)),
        }
    }

    /// For a file whose dirty data was recovered from an earlier session,
    /// rebuilds the size the client wrote (see the module docs).
    pub(super) async fn ensure_recovered(
        &self,
        cx: &CallContext,
        fh: &[u8],
    ) -> Result<(), ServiceError> {
        let (recovered, known) = {
            let files = self.files();
            let st = files.get(fh);
            (
                st.is_some_and(|s| s.recovered),
                st.and_then(|s| s.upstream.clone()),
            )
        };
        if !recovered {
            return Ok(());
        }
        let upstream_size = match known {
            Some(a) => a.size,
            None => match self.below.getattr(cx, fh).await? {
                Nfs3Result::Ok(ok) => {
                    self.note(fh, &ok.obj_attributes, Seen::Foreign).await;
                    ok.obj_attributes.size
                }
                Nfs3Result::Err((nfsstat3::NFS3ERR_STALE, _)) => {
                    tracing::error!(fh = ?fh, "file with recovered dirty data is gone upstream; dropping its data");
                    let key = fh.to_vec();
                    self.store_op(move |s| s.invalidate(&key, true)).await?;
                    self.files().remove(fh);
                    return Ok(());
                }
                Nfs3Result::Err((st, _)) => {
                    return Err(upstream_failed(UpstreamCall::RecoveredGetattr, st));
                }
            },
        };
        let key = fh.to_vec();
        let bs = self.block_size();
        let end = self
            .store_op(move |s| {
                let Some(last) = s.dirty_blocks(Some(&key))?.pop() else {
                    return Ok(0);
                };
                let Some(dd) = s.dirty_data(&key, last.block)? else {
                    return Ok(0);
                };
                Ok(recovered_end(&dd, bs))
            })
            .await?;
        let mut files = self.files();
        let seq = files.next_seq();
        let st = files.entry(fh);
        if st.recovered {
            st.recovered = false;
            st.overlay = Some(Overlay {
                size: upstream_size.max(end),
                mtime: now(),
                seq,
            });
            tracing::info!(fh = ?fh, size = upstream_size.max(end), "recovered dirty file");
        }
        Ok(())
    }
}

/// Where the dirty data of a block ends as a file offset: where the last
/// dirty write into it ended, as its tag recorded (trailing zeros
/// included), or the end of its last dirty run if the tag has no such end.
fn recovered_end(dd: &DirtyData, block_size: u64) -> u64 {
    let end = match dd.end {
        0 => dd
            .extents
            .last()
            .map_or(0, |e| u64::from(e.offset) + e.data.len() as u64),
        n => u64::from(n),
    };
    dd.block * block_size + end
}
