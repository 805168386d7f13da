//! Frames of runs, kept in memory for the next proxy that asks: a range
//! that is not a whole chunk (a working-set profile's run of pieces) is
//! compressed for the proxy that asks for it, and N nodes behind a LAN
//! proxy resuming the same image ask for the same runs. Compressing each
//! run again for each node was most of a LAN proxy's CPU in a storm of
//! clones (`docs/BENCHMARKS.md`), so the frames made are kept here, up to
//! [`RUN_FRAMES_BYTES`], the least recently used leaving first.
//!
//! A frame is found by its entry's serial number (a new entry of the same
//! file never meets an old one's frames), the entry's writes seen when its
//! bytes were read (a write makes every older frame unreachable), and the
//! range. Like whole chunks' frames, these are only kept on proxies that
//! serve other proxies from their file cache.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use gvfs_ext::Codec;
use gvfs_nfs::layer::lock;

/// The most bytes of run frames kept.
pub(crate) const RUN_FRAMES_BYTES: u64 = 64 << 20;

/// What a kept run frame is found by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct RunKey {
    /// The entry's serial number.
    pub(crate) entry: u64,
    /// The entry's writes seen when the bytes were read.
    pub(crate) version: u64,
    pub(crate) offset: u64,
    pub(crate) count: u32,
}

/// A run's frame as it was made: the wire bytes, the file bytes they hold,
/// and whether those reach the end of the file.
#[derive(Debug)]
pub(crate) struct RunFrame {
    pub(crate) codec: Codec,
    pub(crate) data: Vec<u8>,
    pub(crate) raw_len: u32,
    pub(crate) eof: bool,
}

/// Run frames, by key, bounded by bytes.
#[derive(Debug)]
pub(crate) struct RunFrames {
    max: u64,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Each frame and when it was last used.
    frames: HashMap<RunKey, (Arc<RunFrame>, u64)>,
    /// The keys by last use, oldest first.
    order: BTreeMap<u64, RunKey>,
    tick: u64,
    bytes: u64,
}

impl RunFrames {
    /// Up to `max` bytes of frames.
    pub(crate) fn new(max: u64) -> Self {
        Self {
            max,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The frame of `key`, if kept.
    pub(crate) fn get(&self, key: &RunKey) -> Option<Arc<RunFrame>> {
        let mut g = lock(&self.inner);
        let inner = &mut *g;
        inner.tick += 1;
        let tick = inner.tick;
        let (frame, used) = inner.frames.get_mut(key)?;
        inner.order.remove(used);
        *used = tick;
        inner.order.insert(tick, *key);
        Some(frame.clone())
    }

    /// Keeps `frame` as `key`'s, letting the least recently used go to
    /// stay within the bound. A frame over a sixteenth of it is not kept.
    pub(crate) fn put(&self, key: RunKey, frame: Arc<RunFrame>) {
        let len = frame.data.len() as u64;
        if len > self.max / 16 {
            return;
        }
        let mut g = lock(&self.inner);
        let inner = &mut *g;
        inner.tick += 1;
        let tick = inner.tick;
        if let Some((old, used)) = inner.frames.insert(key, (frame, tick)) {
            inner.order.remove(&used);
            inner.bytes -= old.data.len() as u64;
        }
        inner.order.insert(tick, key);
        inner.bytes += len;
        while inner.bytes > self.max {
            let Some((_, oldest)) = inner.order.pop_first() else {
                break;
            };
            if let Some((gone, _)) = inner.frames.remove(&oldest) {
                inner.bytes -= gone.data.len() as u64;
            }
        }
    }

    /// Bytes of frames kept.
    pub(crate) fn bytes(&self) -> u64 {
        lock(&self.inner).bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(offset: u64) -> RunKey {
        RunKey {
            entry: 1,
            version: 0,
            offset,
            count: 8192,
        }
    }

    fn frame(len: usize) -> Arc<RunFrame> {
        Arc::new(RunFrame {
            codec: Codec::Zstd,
            data: vec![7; len],
            raw_len: 8192,
            eof: false,
        })
    }

    #[test]
    fn the_least_recently_used_leave_first_within_the_bound() {
        let frames = RunFrames::new(64 << 10);
        for i in 0..16 {
            frames.put(key(i * 8192), frame(4096));
        }
        assert_eq!(frames.bytes(), 64 << 10);
        // Using the first makes the second the oldest.
        assert!(frames.get(&key(0)).is_some());
        frames.put(key(1 << 30), frame(4096));
        assert_eq!(frames.bytes(), 64 << 10);
        assert!(frames.get(&key(0)).is_some());
        assert!(frames.get(&key(8192)).is_none());
        assert!(frames.get(&key(1 << 30)).is_some());
        // Another version, entry or range is another frame.
        assert!(
            frames
                .get(&RunKey {
                    version: 1,
                    ..key(0)
                })
                .is_none()
        );
        assert!(frames.get(&RunKey { entry: 2, ..key(0) }).is_none());
        assert!(
            frames
                .get(&RunKey {
                    count: 4096,
                    ..key(0)
                })
                .is_none()
        );
        // Replacing a frame counts its bytes once; one too large is not kept.
        frames.put(key(0), frame(2048));
        assert_eq!(frames.bytes(), (64 << 10) - 2048);
        frames.put(key(3 << 30), frame(8192));
        assert!(frames.get(&key(3 << 30)).is_none());
    }
}
