//! Reads of a file held whole: bytes from the local copy once their chunks
//! are there, and frames (compressed chunks) for a proxy downstream, kept
//! for reuse while the file is unchanged.

use std::borrow::Cow;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use gvfs_ext::{CHUNK, ChunkSource, Class, Have, LEVEL, Want, compress};
use gvfs_nfs::Credentials;
use gvfs_nfs::layer::lock;
use gvfs_nfs::nfs3_types::nfs3::fattr3;
use gvfs_nfs::xdr::zeros;

use crate::cache::FileCache;
use crate::chunks::{Chunk, chunks_of};
use crate::entry::CachedFile;
use crate::error::FileCacheError;
use crate::frames::Frame;
use crate::run_frames::{RunFrame, RunKey};

/// How another proxy asked for a chunk.
#[derive(Debug, Clone)]
pub struct Asked {
    /// It fills repeats itself (every FETCH but the first version's).
    pub repeats: bool,
    /// Fetch it here as this (upstream too) if it has not arrived.
    pub want: Want,
}

impl Asked {
    /// A FETCH asked this way.
    pub fn new(repeats: bool, want: Want) -> Self {
        Self { repeats, want }
    }
}

impl CachedFile {
    /// Reads `offset..offset + count` (clipped to the file), waiting for
    /// (or fetching, as `want`) the chunks it needs. Returns the bytes and
    /// whether they reach the end of the file.
    pub async fn read(
        self: &Arc<Self>,
        cache: &Arc<FileCache>,
        source: &Arc<dyn ChunkSource>,
        cred: &Credentials,
        offset: u64,
        count: u32,
        want: &Want,
    ) -> Result<(Cow<'static, [u8]>, bool), FileCacheError> {
        let size = self.size();
        let end = offset.saturating_add(u64::from(count)).min(size);
        let len = end.saturating_sub(offset);
        self.ensure(cache, source, cred, offset, len, want).await?;
        self.used();
        let pieces = self.data_pieces(offset, end);
        let data = if pieces.is_empty() {
            // Only zero chunks (most of a memory image): no file, no buffer.
            zeros(len as usize)
        } else {
            let me = self.clone();
            tokio::task::spawn_blocking(move || {
                // Holes in the file are not read, or zeroed twice.
                let mut buf = vec![0u8; len as usize];
                for (from, to) in pieces {
                    let at = (from - offset) as usize..(to - offset) as usize;
                    me.file
                        .read_exact_at(&mut buf[at], from)
                        .map_err(|e| FileCacheError::io("reading", &me.path, e))?;
                }
                Ok::<_, FileCacheError>(Cow::Owned(buf))
            })
            .await
            .map_err(|e| FileCacheError::task("a read of the file", e))??
        };
        cache.counters.hits.add(1);
        cache.counters.hit_bytes.add(len);
        Ok((data, end >= size))
    }

    /// The parts of `offset..end` outside chunks of zeros, as ranges.
    pub(crate) fn data_pieces(&self, offset: u64, end: u64) -> Vec<(u64, u64)> {
        if end <= offset {
            return Vec::new();
        }
        let (first, last) = chunks_of(offset, end);
        let chunks = self.fetch.chunks();
        let mut pieces: Vec<(u64, u64)> = Vec::new();
        for idx in first..=last {
            if chunks.get(idx) == Some(&Chunk::Zero) {
                continue;
            }
            let from = (idx as u64 * u64::from(CHUNK)).max(offset);
            let to = ((idx as u64 + 1) * u64::from(CHUNK)).min(end);
            match pieces.last_mut() {
                Some(p) if p.1 == from => p.1 = to,
                _ => pieces.push((from, to)),
            }
        }
        pieces
    }

    /// Keeps chunk `idx`'s frame in the frame file (blocking I/O); a
    /// frame that cannot be kept is only not kept.
    pub(crate) fn keep_frame(&self, idx: usize, frame: &Frame, writes_seen: u64) -> bool {
        let size = self.size();
        match self
            .frames
            .keep(idx, frame, size, writes_seen, self.versions.writes())
        {
            Ok(kept) => kept,
            Err(e) => {
                tracing::debug!(path = %self.frames.path.display(), "cannot keep a frame: {e}");
                false
            }
        }
    }

    /// `offset..offset + count` for another proxy's FETCH (fetched here
    /// as it asked, `asked.want`, if it has not arrived: a profile's run
    /// as its pieces, not their chunk), as a frame: the
    /// one kept for that chunk (one with repeats only when the caller fills
    /// them, `repeats`), or compressed now (and kept, when it is a whole
    /// chunk and none is). Returns the frame, the file bytes it holds,
    /// whether they reach the end of the file, and the attributes of the
    /// version they belong to: upstream's, or once clients wrote here the
    /// local ones (so the caller's version check sees the difference).
    /// Fails when a WRITE ran at the same time: the bytes might belong to
    /// neither version. With `have` (FETCH_HAVE), the blocks the caller
    /// holds of a range that is not a whole chunk are sent as zeros, in a
    /// frame made for it alone.
    #[allow(clippy::too_many_arguments)]
    pub async fn read_frame(
        self: &Arc<Self>,
        cache: &Arc<FileCache>,
        source: &Arc<dyn ChunkSource>,
        cred: &Credentials,
        offset: u64,
        count: u32,
        asked: Asked,
        have: Option<&Have>,
    ) -> Result<(Frame, u32, bool, fattr3), FileCacheError> {
        let (seen, attrs) = self.stamp().ok_or(FileCacheError::WrittenDuringFetch)?;
        self.fetch.note_class(asked.want.class);
        // A whole chunk goes in its frame (kept, or made and kept now),
        // held blocks and all: the caller places its own over them, and a
        // proxy that keeps frames serves its site, where the bytes cost
        // less than making a frame for each caller would. (The proxy next
        // to the image server keeps none, and leaves held blocks out.)
        let have = have.filter(|h| !h.is_empty() && !self.is_whole(offset, count));
        let (frame, len, eof) = match have {
            Some(have) => {
                self.frame_leaving(cache, source, cred, offset, count, &asked.want, have)
                    .await?
            }
            None => {
                self.frame_of(cache, source, cred, offset, count, asked)
                    .await?
            }
        };
        match self.stamp() {
            Some((now, _)) if now == seen => Ok((frame, len, eof, attrs)),
            _ => Err(FileCacheError::WrittenDuringFetch),
        }
    }

    pub(crate) async fn frame_of(
        self: &Arc<Self>,
        cache: &Arc<FileCache>,
        source: &Arc<dyn ChunkSource>,
        cred: &Credentials,
        offset: u64,
        count: u32,
        asked: Asked,
    ) -> Result<(Frame, u32, bool), FileCacheError> {
        let Asked { repeats, want } = asked;
        let idx = usize::try_from(offset / u64::from(CHUNK)).unwrap_or(usize::MAX);
        let (start, len) = self.chunk_range(idx);
        let whole = len > 0 && offset == start && count >= len;
        if whole {
            self.ensure(cache, source, cred, offset, u64::from(len), &want)
                .await?;
            if let Some(slot) = self
                .frames
                .slot(idx)
                .filter(|s| repeats || s.repeats.is_empty())
            {
                let me = self.clone();
                let kept = tokio::task::spawn_blocking(move || me.frames.read(slot))
                    .await
                    .map_err(|e| FileCacheError::task("a read of a frame", e))?;
                match kept {
                    Ok(frame) => {
                        self.used();
                        cache.counters.frames_reused.add(1);
                        cache.counters.hits.add(1);
                        cache.counters.hit_bytes.add(u64::from(len));
                        let eof = start + u64::from(len) >= self.size();
                        return Ok((frame, len, eof));
                    }
                    Err(e) => {
                        tracing::debug!(path = %self.frames.path.display(), "cannot read a frame: {e}");
                        self.frames.forget(idx, idx);
                    }
                }
            }
        }
        let writes = self.versions.writes_seen();
        // A run (not a whole chunk) another proxy asked for before.
        let run = (!whole && cache.keep_frames.load(Ordering::Relaxed)).then_some(RunKey {
            entry: self.serial,
            version: writes,
            offset,
            count,
        });
        if let Some(kept) = run.and_then(|k| cache.run_frames.get(&k)) {
            self.used();
            cache.counters.run_frames_reused.add(1);
            let frame = Frame {
                codec: kept.codec,
                data: kept.data.clone(),
                repeats: Vec::new(),
                left_out: 0,
            };
            return Ok((frame, kept.raw_len, kept.eof));
        }
        let (raw, eof) = self.read(cache, source, cred, offset, count, &want).await?;
        let raw_len = raw.len() as u32;
        let keep = whole && raw_len == len && self.frames.slot(idx).is_none();
        let me = self.clone();
        let (frame, kept) = tokio::task::spawn_blocking(move || {
            let (codec, data) = compress(&raw, LEVEL);
            let frame = Frame {
                codec,
                data,
                repeats: Vec::new(),
                left_out: 0,
            };
            let kept = keep && me.keep_frame(idx, &frame, writes);
            (frame, kept)
        })
        .await
        .map_err(|e| FileCacheError::task("compressing a chunk", e))?;
        if kept {
            cache.counters.frames_made.add(1);
        }
        // Kept only if no write came while it was read and made.
        if let Some(key) = run.filter(|_| self.versions.writes_seen() == writes) {
            let kept = RunFrame {
                codec: frame.codec,
                data: frame.data.clone(),
                raw_len,
                eof,
            };
            cache.run_frames.put(key, Arc::new(kept));
        }
        Ok((frame, raw_len, eof))
    }

    /// Whether `offset..offset + count` is a whole chunk.
    fn is_whole(&self, offset: u64, count: u32) -> bool {
        let idx = usize::try_from(offset / u64::from(CHUNK)).unwrap_or(usize::MAX);
        let (start, len) = self.chunk_range(idx);
        len > 0 && offset == start && count >= len
    }

    /// `offset..offset + count` as a frame with the blocks `have` names
    /// left as zeros; not kept (it is this caller's alone).
    #[allow(clippy::too_many_arguments)]
    async fn frame_leaving(
        self: &Arc<Self>,
        cache: &Arc<FileCache>,
        source: &Arc<dyn ChunkSource>,
        cred: &Credentials,
        offset: u64,
        count: u32,
        want: &Want,
        have: &Have,
    ) -> Result<(Frame, u32, bool), FileCacheError> {
        let (raw, eof) = self.read(cache, source, cred, offset, count, want).await?;
        let raw_len = raw.len() as u32;
        let have = have.clone();
        let frame = tokio::task::spawn_blocking(move || {
            let mut raw = raw.into_owned();
            let left_out = have.zero_in(&mut raw);
            let (codec, data) = compress(&raw, LEVEL);
            Frame {
                codec,
                data,
                repeats: Vec::new(),
                left_out,
            }
        })
        .await
        .map_err(|e| FileCacheError::task("compressing a chunk", e))?;
        Ok((frame, raw_len, eof))
    }
}

impl CachedFile {
    /// Notes a reader's READ of `offset..offset + len` (this proxy's own
    /// clients); returns the class it is fetched as ([`reader_class`]).
    /// The background stream follows: bulk behind a sequential reader,
    /// else background.
    ///
    /// [`reader_class`]: CachedFile::reader_class
    pub fn note_read(&self, offset: u64, len: u64) -> Class {
        let mut seq = lock(&self.fetch.seq);
        let was = seq.bulk();
        seq.read(offset, len);
        let bulk = seq.bulk();
        drop(seq);
        if bulk && !was {
            self.fetch.set_bulk();
        } else if was && !bulk {
            self.fetch.note_class(Class::Demand);
        }
        if bulk { Class::Bulk } else { Class::Demand }
    }

    /// The class this proxy's readers' fetches go as: [`Class::Bulk`]
    /// while they read in file order, else [`Class::Demand`].
    pub fn reader_class(&self) -> Class {
        if lock(&self.fetch.seq).bulk() {
            Class::Bulk
        } else {
            Class::Demand
        }
    }
}
