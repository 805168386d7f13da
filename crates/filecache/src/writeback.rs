//! Write-back of held writes: each dirty file STOREd upstream in
//! compressed chunks, guarded against a changed origin, then let go.

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use gvfs_ext::{ChunkSource, FetchError, LEVEL, StoreArgs};
use gvfs_nfs::Credentials;
use gvfs_nfs::layer::lock;
use gvfs_nfs::nfs3_types::nfs3::nfsstat3;

use crate::cache::FileCache;
use crate::entry::CachedFile;
use crate::error::FileCacheError;
use crate::names::file_name;

impl FileCache {
    /// Writes every dirty file back through `source` (STORE: compressed
    /// chunks, written durably upstream), then lets go of it: the file's
    /// metadata describes the version before the writes. Returns the file
    /// bytes written back. A file that fails (a conflict, upstream down)
    /// stays dirty and the others are still written back; the error then
    /// names the first failure and how many there were.
    pub async fn write_back(&self, source: &dyn ChunkSource) -> Result<u64, FileCacheError> {
        let mut total = 0;
        let mut failed = Vec::new();
        for f in self.dirty() {
            match self.write_back_file(source, &f).await {
                Ok(n) => total += n,
                Err(e) => failed.push(e),
            }
        }
        match failed.len() {
            0 => Ok(total),
            1 => Err(failed.swap_remove(0)),
            n => Err(FileCacheError::Several {
                first: Box::new(failed.swap_remove(0)),
                more: n - 1,
            }),
        }
    }

    /// Writes one file's dirty chunks back; see [`write_back`](Self::write_back).
    ///
    /// Each chunk is sent with STORE_GUARDED: written only if the file at
    /// the origin still has the size, mtime and ctime of the version this
    /// copy was fetched at (then of the write-back's previous chunk). A
    /// file changed there meanwhile is a conflict: nothing more is stored,
    /// the local writes stay (dirty, served to this proxy's clients), it is
    /// logged as an error and counted in `write_back_conflicts`.
    pub async fn write_back_file(
        &self,
        source: &dyn ChunkSource,
        f: &Arc<CachedFile>,
    ) -> Result<u64, FileCacheError> {
        let (snapshot, cred, mut expected) = {
            let v = f.versions.lock();
            let cred = v
                .writer
                .clone()
                .unwrap_or_else(|| Credentials::unix(v.local.uid, v.local.gid));
            (v.dirty.clone(), cred, v.upstream.clone())
        };
        let mut bytes = 0;
        let mut wire = 0;
        let mut stored = Ok(());
        for (&c, &n) in &snapshot {
            let (offset, len) = f.chunk_range(c);
            let me = f.clone();
            let read = tokio::task::spawn_blocking(move || {
                let mut raw = vec![0u8; len as usize];
                me.file.read_exact_at(&mut raw, offset)?;
                Ok::<_, std::io::Error>(StoreArgs::new(me.fh.clone(), offset, &raw, LEVEL))
            })
            .await
            .map_err(|e| FileCacheError::task("a read for write-back", e))
            .and_then(|r| r.map_err(|e| FileCacheError::io("reading", &f.path, e)));
            let mut args = match read {
                Ok(a) => a,
                Err(e) => {
                    stored = Err(e);
                    break;
                }
            };
            args.guard = Some(gvfs_nfs::FileVersion::of(&expected));
            wire += args.data.len() as u64;
            match source.store(&cred, &args).await {
                Ok(attrs) => {
                    bytes += u64::from(len);
                    // Clean now, unless written again meanwhile; the next
                    // chunk expects the file as this STORE left it.
                    let mut v = f.versions.lock();
                    if v.dirty.get(&c) == Some(&n) {
                        v.dirty.remove(&c);
                        v.durable.remove(&c);
                        v.epoch += 1;
                    }
                    v.upstream = attrs.clone();
                    expected = attrs;
                }
                Err(FetchError::Nfs(nfsstat3::NFS3ERR_NOT_SYNC)) => {
                    self.counters.write_back_conflicts.add(1);
                    tracing::error!(
                        file = %f.path.display(),
                        "file cache: write-back conflict: the file changed at the origin \
                         since this proxy fetched it; its local writes are kept here and \
                         not written over the origin's (see docs/guide/operations.md: \"write-back \
                         conflicts\")"
                    );
                    stored = Err(FileCacheError::WriteBackConflict {
                        name: file_name(&f.fh),
                        path: f.path.clone(),
                    });
                    break;
                }
                Err(FetchError::Nfs(st)) => {
                    stored = Err(FileCacheError::StoreRefused(st));
                    break;
                }
                Err(e) => {
                    stored = Err(e.into());
                    break;
                }
            }
        }
        self.counters.written_back_bytes.add(bytes);
        self.counters.written_back_wire_bytes.add(wire);
        if let Err(e) = stored {
            // What was stored is clean; the record says so.
            self.record_lazily(f);
            return Err(e);
        }
        let clean = !f.is_dirty();
        if clean {
            self.counters.written_back_files.add(1);
        }
        // Let go unless written again meanwhile (or being written now),
        // under the lock a WRITE checks it is still the entry with.
        let let_go = clean && {
            let mut files = lock(&self.files);
            let free = files.get(&f.fh).is_some_and(|g| Arc::ptr_eq(g, f)) && !f.busy();
            if free {
                files.remove(&f.fh);
                self.discard(f);
            }
            free
        };
        if !let_go {
            self.record_lazily(f);
        }
        tracing::info!(file = %f.path.display(), bytes, wire, "file cache: wrote a file back");
        Ok(bytes)
    }

    /// Writes one file back and lets it go, for a call that changes the
    /// file upstream (SETATTR): WRITEs that come meanwhile are refused
    /// ([`HeldWriteError::LetGo`]: the client sends them again, and they go
    /// upstream), and those already under way are waited for and written
    /// back too, so the file is not left holding writes the call's change
    /// does not see. On failure the entry keeps its writes and takes WRITEs
    /// again.
    pub async fn write_back_and_let_go(
        &self,
        source: &dyn ChunkSource,
        f: &Arc<CachedFile>,
    ) -> Result<u64, FileCacheError> {
        f.versions.lock().closing = true;
        let mut total = 0;
        loop {
            let unpinned = f.versions.unpinned();
            tokio::pin!(unpinned);
            // Registered before the check, so a pin dropped after it wakes us.
            unpinned.as_mut().enable();
            if f.is_dirty() {
                match self.write_back_file(source, f).await {
                    Ok(n) => total += n,
                    Err(e) => {
                        f.versions.lock().closing = false;
                        return Err(e);
                    }
                }
                continue;
            }
            if f.versions.lock().writing > 0 {
                unpinned.await;
                continue;
            }
            // Clean and idle: let go (written back, or never written).
            let mut files = lock(&self.files);
            if files.get(&f.fh).is_some_and(|g| Arc::ptr_eq(g, f)) {
                files.remove(&f.fh);
                self.discard(f);
            }
            return Ok(total);
        }
    }
}
