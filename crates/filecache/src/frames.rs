//! Frames: the chunks of a file held whole in the form other proxies
//! fetch them, kept by a LAN proxy beside the cached file.

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use gvfs_ext::{CHUNK, Codec};
use gvfs_metafile::ByteRepeat;
use gvfs_nfs::layer::lock;

/// A chunk in the form another proxy fetches it: the frame it arrived in,
/// or the one made here the first time another proxy asked for it.
#[derive(Debug)]
pub struct Frame {
    /// How `data` is encoded.
    pub codec: Codec,
    /// The bytes on the wire.
    pub data: Vec<u8>,
    /// Ranges sent as zeros that repeat earlier bytes, as the frame
    /// arrived with them (only callers that fill repeats get such frames).
    pub repeats: Vec<ByteRepeat>,
    /// File bytes sent as zeros because the caller holds them (FETCH_HAVE).
    pub left_out: u64,
}

/// Where a chunk's frame lies in its file's frame file.
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    at: u64,
    len: u32,
    codec: Codec,
    pub(crate) repeats: Arc<[ByteRepeat]>,
}

/// The frames of one file's chunks, kept by a LAN proxy in a file beside
/// the cached file (`NAME.frames`), so that serving the file to many client
/// proxies decompresses it once and compresses nothing. Frames are only a
/// cache: the file goes with its entry, and a restart drops it (they are
/// made again on demand). A write drops the touched chunks' frames; the
/// frame file stops growing at the file's size plus a chunk, past which
/// frames are made for each caller and not kept.
#[derive(Debug)]
pub(crate) struct FrameStore {
    pub(crate) path: PathBuf,
    file: Mutex<FrameFile>,
    end: AtomicU64,
    slots: Mutex<HashMap<usize, Slot>>,
}

/// The frame file's state. Once removed it is never opened again: a new
/// entry for the same file may have made its own at the same path.
#[derive(Debug)]
enum FrameFile {
    None,
    Open(Arc<std::fs::File>),
    Removed,
}

impl FrameStore {
    pub(crate) fn new(path: PathBuf) -> Self {
        Self {
            path,
            file: Mutex::new(FrameFile::None),
            end: AtomicU64::new(0),
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// Bytes of the frame file.
    pub(crate) fn bytes(&self) -> u64 {
        self.end.load(Ordering::Relaxed)
    }

    pub(crate) fn file(&self) -> std::io::Result<Arc<std::fs::File>> {
        let mut f = lock(&self.file);
        match &*f {
            FrameFile::Open(file) => return Ok(file.clone()),
            FrameFile::Removed => {
                return Err(std::io::Error::other("the entry was let go"));
            }
            FrameFile::None => {}
        }
        let file = Arc::new(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&self.path)?,
        );
        *f = FrameFile::Open(file.clone());
        Ok(file)
    }

    /// Appends chunk `idx`'s frame (blocking I/O), unless the file was
    /// written since `writes_seen` or the frame file is full for `size`.
    pub(crate) fn keep(
        &self,
        idx: usize,
        frame: &Frame,
        size: u64,
        writes_seen: u64,
        writes: &AtomicU64,
    ) -> std::io::Result<bool> {
        let len = frame.data.len() as u64;
        let at = self.end.fetch_add(len, Ordering::Relaxed);
        if at + len > size + u64::from(CHUNK) {
            self.end.fetch_sub(len, Ordering::Relaxed);
            return Ok(false);
        }
        self.file()?.write_all_at(&frame.data, at)?;
        let mut slots = lock(&self.slots);
        if writes.load(Ordering::Acquire) != writes_seen {
            return Ok(false);
        }
        slots.insert(
            idx,
            Slot {
                at,
                len: len as u32,
                codec: frame.codec,
                repeats: frame.repeats.clone().into(),
            },
        );
        Ok(true)
    }

    pub(crate) fn slot(&self, idx: usize) -> Option<Slot> {
        lock(&self.slots).get(&idx).cloned()
    }

    /// Reads a kept frame (blocking I/O).
    pub(crate) fn read(&self, slot: Slot) -> std::io::Result<Frame> {
        let mut data = vec![0u8; slot.len as usize];
        self.file()?.read_exact_at(&mut data, slot.at)?;
        Ok(Frame {
            codec: slot.codec,
            data,
            repeats: slot.repeats.to_vec(),
            left_out: 0,
        })
    }

    /// Drops the frames of chunks `first..=last`.
    pub(crate) fn forget(&self, first: usize, last: usize) {
        lock(&self.slots).retain(|c, _| !(first..=last).contains(c));
    }

    pub(crate) fn remove(&self) {
        let was = std::mem::replace(&mut *lock(&self.file), FrameFile::Removed);
        if matches!(was, FrameFile::Open(_)) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
