//! The dedup part of a [`FileCache`]: the block index, the thread that
//! writes to it, and what reads the block cache. Given at open by a proxy
//! with dedup on; empty otherwise.
//!
//! [`FileCache`]: crate::FileCache

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use gvfs_metafile::hashes::Fingerprint;

use crate::block_index::BlockIndex;

/// The dedup part of a file cache.
#[derive(Default)]
pub(crate) struct Dedup {
    /// Where held blocks are found by content hash (with dedup on).
    pub(crate) blocks: Option<BlockIndex>,
    /// Writes to it, in the background.
    pub(crate) indexer: Option<Indexer>,
    pub(crate) indexed: Arc<IndexerCounts>,
    /// Dedup of files read block by block (through the block cache).
    pub(crate) block_path: BlockPath,
}

impl Dedup {
    /// Dedup over `blocks` (none without), finding blocks in the block
    /// cache too with `reader`. Off, with a warning, if the indexer thread
    /// cannot start.
    pub(crate) fn new(blocks: Option<BlockIndex>, reader: Option<BlockReader>) -> Self {
        let indexed = Arc::<IndexerCounts>::default();
        let (blocks, indexer) = match blocks {
            Some(blocks) => match Indexer::start(blocks.clone(), indexed.clone()) {
                Ok(indexer) => (Some(blocks), Some(indexer)),
                Err(e) => {
                    tracing::warn!(error = %e, "dedup off: cannot start the block indexer");
                    (None, None)
                }
            },
            None => (None, None),
        };
        Self {
            blocks,
            indexer,
            indexed,
            block_path: BlockPath {
                reader,
                by_file: Mutex::default(),
            },
        }
    }
}

/// Ranges waiting for the indexer; past this a range is not noted (its
/// blocks are fetched, not copied, by the next image that shares them).
const INDEX_QUEUE: usize = 4096;

/// What the indexer thread does, in order.
pub(crate) enum Job {
    /// Note a range's blocks.
    Note {
        fh: Vec<u8>,
        range: u64,
        blocks: Vec<(u64, Fingerprint)>,
    },
    /// Drop a file's blocks.
    Forget(Vec<u8>),
    /// Drop the blocks of one range of a file.
    ForgetRange(Vec<u8>, u64),
}

/// The index's writes (sled's, which cost more than the rest of dedup) on
/// a thread of their own at the lowest CPU priority: nothing waits for
/// them, so they use what clients leave idle. One queue keeps a file's
/// notes before its forgetting.
pub(crate) struct Indexer {
    jobs: std::sync::mpsc::SyncSender<Job>,
}

impl Indexer {
    pub(crate) fn start(index: BlockIndex, counters: Arc<IndexerCounts>) -> std::io::Result<Self> {
        let (jobs, rx) = std::sync::mpsc::sync_channel::<Job>(INDEX_QUEUE);
        std::thread::Builder::new()
            .name("gvfs-dedup-index".into())
            .spawn(move || {
                let me = rustix::thread::gettid();
                if let Err(e) = rustix::process::setpriority_process(Some(me), 19) {
                    tracing::debug!(error = %e, "dedup: the indexer keeps its priority");
                }
                // Blocks (noted, forgotten) by a job.
                let run = |job| {
                    let done = match job {
                        Job::Note { fh, range, blocks } => index
                            .note(&fh, range, &blocks)
                            .map(|()| (blocks.len() as u64, 0)),
                        Job::Forget(fh) => index.forget_file(&fh).map(|n| (0, n)),
                        Job::ForgetRange(fh, range) => {
                            index.forget_range(&fh, range).map(|n| (0, n))
                        }
                    };
                    done.unwrap_or_else(|e| {
                        tracing::warn!(error = %e, "dedup: the block index was not updated");
                        (0, 0)
                    })
                };
                // Each time the queue runs dry, what it did is made durable
                // (the thread outlives the last handle of the index, so
                // sled's flush at its drop would not come), then counted.
                while let Ok(job) = rx.recv() {
                    let (mut noted, mut forgotten) = run(job);
                    while let Ok(job) = rx.try_recv() {
                        let (n, f) = run(job);
                        noted += n;
                        forgotten += f;
                    }
                    if let Err(e) = index.flush() {
                        tracing::warn!(error = %e, "dedup: the block index was not flushed");
                    }
                    counters.noted.fetch_add(noted, Ordering::Relaxed);
                    counters.forgotten.fetch_add(forgotten, Ordering::Relaxed);
                }
            })?;
        Ok(Self { jobs })
    }

    pub(crate) fn send(&self, job: Job, counters: &IndexerCounts) {
        if self.jobs.try_send(job).is_err() {
            counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// What the indexer did (read into the file cache's stats).
#[derive(Debug, Default)]
pub(crate) struct IndexerCounts {
    pub(crate) noted: AtomicU64,
    pub(crate) forgotten: AtomicU64,
    pub(crate) dropped: AtomicU64,
}

/// Reads a block of the block cache: `(file handle, offset, buffer)` ->
/// whether it holds all of those bytes (checked), without fetching.
pub type BlockReader = Arc<dyn Fn(&[u8], u64, &mut [u8]) -> bool + Send + Sync>;

/// Files read through the block cache a proxy deduplicates too.
#[derive(Default)]
pub(crate) struct BlockPath {
    /// Reads the block cache, where their blocks are held.
    pub(crate) reader: Option<BlockReader>,
    /// Bytes copied from held blocks instead of fetched, per file (at most
    /// [`MAX_BLOCK_PATH_FILES`] files).
    pub(crate) by_file: Mutex<HashMap<Vec<u8>, u64>>,
}

/// Files whose dedup bytes through the block cache are counted one by one.
pub(crate) const MAX_BLOCK_PATH_FILES: usize = 4096;
