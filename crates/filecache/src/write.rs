//! Writes into a file held whole (held writes): kept in the local copy,
//! made durable by COMMIT, written back later by `gvfsctl writeback`.

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use gvfs_nfs::Credentials;
use gvfs_nfs::nfs3_types::nfs3::{fattr3, nfstime3};

use crate::cache::FileCache;
use crate::chunks::{Chunk, chunk_count, chunks_of};
use crate::entry::CachedFile;
use crate::error::{FileCacheError, HeldWriteError};

/// The time now, as NFS says it: a held write's mtime and ctime.
fn now_time() -> nfstime3 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    nfstime3 {
        seconds: d.as_secs() as u32,
        nseconds: d.subsec_nanos(),
    }
}

impl CachedFile {
    /// A client's WRITE into a file held whole: written here, marked dirty
    /// (written back by `gvfsctl writeback`), synced when `sync`. Returns
    /// the attributes clients saw before and see after.
    ///
    /// Crash safety: the chunks a write touches are marked dirty before
    /// its bytes land (so nothing lets the entry go meanwhile), and unless
    /// a durable record already lists them, a record listing them is made
    /// durable first: a crash never leaves changed bytes under a record
    /// that calls them upstream's. A `sync` write is acknowledged only once
    /// the file is synced and its record (size, times) is durable.
    pub async fn write(
        self: &Arc<Self>,
        cache: &FileCache,
        cred: &Credentials,
        offset: u64,
        data: Vec<u8>,
        sync: bool,
    ) -> Result<(fattr3, fattr3), HeldWriteError> {
        if !self.complete() || self.failure().is_some() {
            return Err(HeldWriteError::NotHeld);
        }
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or(HeldWriteError::TooLarge {
                end: u64::MAX,
                max: cache.max_bytes,
            })?;
        // The chunk table grows with the file: a client's offset is capped
        // by the cache's budget before anything is allocated for it.
        if end > cache.max_bytes {
            return Err(HeldWriteError::TooLarge {
                end,
                max: cache.max_bytes,
            });
        }
        if end <= offset {
            // A WRITE of no bytes changes nothing, not even the size
            // (RFC 1813, section 3.3.7).
            let now = self.local_attrs();
            return Ok((now.clone(), now));
        }
        let (first, last) = chunks_of(offset, end);
        // Refused while the entry is being let go (a SETATTR writes it
        // back first): the client's retry goes upstream.
        let (pin, recorded) = self
            .versions
            .pin_write(first, last, end)
            .ok_or(HeldWriteError::LetGo)?;
        self.used();
        if !recorded && !cache.record_durably(self).await? {
            return Err(HeldWriteError::LetGo);
        }
        {
            let mut chunks = self.fetch.chunks();
            for c in chunks.iter_mut().take(last + 1).skip(first) {
                if *c == Chunk::Zero {
                    *c = Chunk::Present;
                }
            }
        }
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            me.file.write_all_at(&data, offset)?;
            if sync { me.file.sync_data() } else { Ok(()) }
        })
        .await
        .map_err(|e| FileCacheError::task("a held write", e))?
        .map_err(|e| FileCacheError::io("writing", &self.path, e))?;
        self.frames.forget(first, last);
        let (before, after, recorded) = {
            let mut v = self.versions.lock();
            // Numbered again now the bytes are here: a write-back that read
            // the chunk before they landed leaves it dirty.
            let n = self.versions.count_write();
            let before = v.local.clone();
            if end > v.local.size {
                v.local.size = end;
                v.local.used = end;
            }
            let t = now_time();
            v.local.mtime = t;
            v.local.ctime = t;
            for c in first..=last {
                v.dirty.insert(c, n);
            }
            v.writer = Some(cred.clone());
            let recorded = (first..=last).all(|c| v.durable.contains(&c));
            (before, v.local.clone(), recorded)
        };
        drop(pin);
        {
            let mut chunks = self.fetch.chunks();
            let want = chunk_count(after.size);
            if chunks.len() < want {
                chunks.resize(want, Chunk::Present);
            }
        }
        let kept = if sync || !recorded {
            cache.record_durably(self).await?
        } else {
            cache.holds(self)
        };
        if !kept {
            return Err(HeldWriteError::LetGo);
        }
        Ok((before, after))
    }

    /// A client's COMMIT: the file synced and its dirty chunks recorded
    /// durably, so they survive a crash, before it is acknowledged.
    pub async fn commit(self: &Arc<Self>, cache: &FileCache) -> Result<fattr3, HeldWriteError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.file.sync_all())
            .await
            .map_err(|e| FileCacheError::task("a sync", e))?
            .map_err(|e| FileCacheError::io("syncing", &self.path, e))?;
        // An entry let go held no writes any more: they were written back,
        // durably, upstream.
        cache.record_durably(self).await?;
        Ok(self.local_attrs())
    }
}
