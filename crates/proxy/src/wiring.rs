//! The wiring: the parts the layers share besides calls, made before any
//! layer and handed to the constructors that need them. Read bottom-up:
//!
//! | part | made when | given to |
//! |---|---|---|
//! | block store (`DIR/bank-NNN.gvfs`) | a block cache is planned | the block cache; the file cache's block reader |
//! | metadata table (`MetaFiles`) | the metadata layer is planned | the metadata layer; the block cache as its `ZeroHint` |
//! | metadata index (`DIR/meta.sled`, else memory) | the metadata layer is planned | the file cache, the metadata layer, the profiles |
//! | profiles | always | the file cache, the extension program |
//! | file cache (`DIR/files`) | the metadata layer with a cache directory | the metadata layer (compress-and-copy), the extension program, the block cache's `HeldElsewhere` |
//!
//! **The circle, and why the store comes first.** With dedup on, the
//! block cache fills a miss from blocks of the same content held in the
//! file cache ([`HeldBlocks`], its `HeldElsewhere`, which also hears of
//! every block the cache stores or lets go), and the file cache's dedup
//! reads blocks the block cache holds (its `BlockReader`). Neither needs
//! the other *layer*: the file cache reads blocks from the block *store*,
//! and only the layer asks the file cache. So the store is opened first,
//! the file cache is made with a reader over the store, and then the block
//! cache layer is made over that store with [`HeldBlocks`] over the file
//! cache: each constructor gets what it needs, nothing is attached after.
//! The reader holds the store by a `Weak`: the store's drop hook leads to
//! the file cache, so a strong reference would keep both alive for ever.
//! After the store is closed at exit the reader finds nothing.

use std::sync::{Arc, Weak};

use gvfs_cache::{BlockStore, SideChannels, ZeroHint};
use gvfs_ext::{ChunkSource, ExtClient};
use gvfs_filecache::{BlockReader, FileCache, FileCacheParts, MetaIndex, Profiles};
use gvfs_meta::{CopyPath, MetaFiles};
use gvfs_nfs::net::client::RpcClient;

use crate::config::CacheSettings;
use crate::error::ProxyError;
use crate::plan::{Plan, Planned};

/// Working-set profiles a proxy without a metadata index keeps in memory.
const MEMORY_PROFILES: usize = 4096;

/// Entries of the metadata index kept in memory without a cache directory.
const MEMORY_INDEX: usize = 65_536;

/// The parts a plan's layers share, made in the order the table in the
/// module doc gives.
pub(crate) struct Wiring {
    /// The block cache's store, when a block cache is planned.
    pub(crate) store: Option<Arc<BlockStore>>,
    /// The metadata layer's table of files, when it is planned.
    pub(crate) table: Option<Arc<MetaFiles>>,
    /// The metadata index, when the metadata layer is planned.
    pub(crate) index: Option<Arc<dyn MetaIndex>>,
    /// The working-set profiles (in the index, else in memory).
    pub(crate) profiles: Arc<Profiles>,
    /// The file cache, when the metadata layer has a cache directory.
    pub(crate) files: Option<Arc<FileCache>>,
    /// The upstream's side of the extension program, when it is reached
    /// over RPC (it may be another gvfs-proxy that compresses for us).
    pub(crate) ext_client: Option<Arc<dyn ChunkSource>>,
    /// The gate in front of the upstream, the extension client's.
    pub(crate) gate: Option<gvfs_ext::Gate>,
    /// Whether the block cache and the file cache share blocks.
    dedup: bool,
}

impl Wiring {
    /// Opens the parts `plan` needs, the upstream already open (its RPC
    /// client is `client`, when it has one).
    pub(crate) async fn open(
        plan: &Plan<'_>,
        client: Option<&RpcClient>,
    ) -> Result<Self, ProxyError> {
        let mut store = None;
        for layer in plan.layers() {
            if let Planned::BlockCache(c) = layer {
                store = Some(open_store(c).await?);
            }
        }
        // Made first: the block cache below the metadata layer asks it
        // which ranges are known zeros, so read-ahead skips them.
        let table = plan.meta().then(MetaFiles::new);
        let ext = client.map(|c| ExtClient::new(c.clone()));
        let gate = ext.as_ref().map(|e| e.gate().clone());
        let ext_client = ext.map(|e| e as Arc<dyn ChunkSource>);
        let index = plan.meta().then(|| open_meta_index(plan.file_cache()));
        // Working-set profiles live in the same index, beside the records
        // of the files they order. Without an index (no --meta) they are
        // kept in memory: a proxy next to the image server answers
        // PROFILE_PUT whatever its options.
        let profiles = Profiles::new(
            index
                .clone()
                .unwrap_or_else(|| Arc::new(gvfs_filecache::MemIndex::new(MEMORY_PROFILES))),
        );
        let dedup = plan.dedup() && store.is_some();
        let files = match (plan.file_cache(), &index) {
            (Some(c), Some(index)) => {
                let mut parts = FileCacheParts {
                    profiles: Some(profiles.clone()),
                    learn: gvfs_filecache::LearnSettings {
                        window: c.learn_window,
                    },
                    ..FileCacheParts::default()
                };
                // Held blocks by content hash, in the same index: they come
                // and go with the files that hold them.
                if dedup && let Some(store) = &store {
                    parts.blocks = Some(gvfs_filecache::BlockIndex::new(index.clone()));
                    parts.block_reader = Some(block_reader(store));
                }
                Some(open_file_cache(c, index.clone(), parts)?)
            }
            _ => None,
        };
        Ok(Self {
            store,
            table,
            index,
            profiles,
            files,
            ext_client,
            gate,
            dedup,
        })
    }

    /// What the block cache is given besides the layer below: the zero
    /// hint, and with dedup the blocks held in the file cache.
    pub(crate) fn cache_sides(&self) -> SideChannels {
        let held = match (&self.files, &self.table) {
            (Some(files), Some(table)) if self.dedup => Some(Arc::new(HeldBlocks {
                files: files.clone(),
                table: table.clone(),
            })
                as Arc<dyn gvfs_cache::HeldElsewhere>),
            _ => None,
        };
        SideChannels {
            zero_hint: zero_hint(self.table.as_ref()),
            held_elsewhere: held,
        }
    }

    /// Compress-and-copy needs both a file cache to fetch into and an
    /// upstream reached over RPC to fetch from.
    pub(crate) fn copy_path(&self) -> Option<CopyPath> {
        let (files, source) = (self.files.as_ref()?, self.ext_client.as_ref()?);
        // Ask now whether the upstream speaks the extension, so the first
        // whole-file fetch does not wait a round trip for it.
        let probe = source.clone();
        tokio::spawn(async move { probe.supported().await });
        Some(CopyPath {
            files: files.clone(),
            source: source.clone(),
        })
    }
}

/// The file cache's reader of the block cache's blocks: those the store
/// holds all of, checked, counting nothing.
fn block_reader(store: &Arc<BlockStore>) -> BlockReader {
    let store: Weak<BlockStore> = Arc::downgrade(store);
    Arc::new(move |fh: &[u8], offset: u64, buf: &mut [u8]| {
        store
            .upgrade()
            .is_some_and(|s| matches!(s.read_held(fh, offset, buf), Ok(true)))
    })
}

/// The block cache's [`gvfs_cache::HeldElsewhere`]: the blocks the file
/// cache's index finds, for files whose metadata has content hashes.
struct HeldBlocks {
    files: Arc<FileCache>,
    table: Arc<MetaFiles>,
}

impl gvfs_cache::HeldElsewhere for HeldBlocks {
    fn knows(&self, fh: &[u8]) -> bool {
        self.table.has_content(fh)
    }

    fn read(&self, fh: &[u8], offset: u64, buf: &mut [u8]) -> bool {
        self.table
            .content(fh)
            .is_some_and(|meta| self.files.fill_from_held(fh, &meta, offset, buf))
    }

    fn held(&self, fh: &[u8], offset: u64, len: u64) {
        if let Some(meta) = self.table.content(fh) {
            self.files.note_held(fh, &meta, offset, len);
        }
    }

    fn dropped(&self, fh: &[u8], offset: u64) {
        if self.table.has_content(fh) {
            self.files.forget_held(fh, offset);
        }
    }
}

/// The block cache's question to the metadata layer: is this range
/// known to be zeros?
fn zero_hint(table: Option<&Arc<MetaFiles>>) -> Option<ZeroHint> {
    let table = table?.clone();
    Some(Arc::new(move |fh: &[u8], off: u64, len: u64| {
        table.known_zero(fh, off, len)
    }))
}

/// Opens the block cache's store in `settings.dir`, logging what its
/// recovery found.
async fn open_store(settings: &CacheSettings) -> Result<Arc<BlockStore>, ProxyError> {
    let (dir, geometry) = (settings.dir.clone(), settings.geometry);
    let opened = tokio::task::spawn_blocking(move || {
        BlockStore::open_dir(&dir, geometry, gvfs_cache::OpenOptions::default())
    })
    .await;
    let cache_error = |cause: Box<dyn std::error::Error + Send + Sync>| ProxyError::Cache {
        what: "block cache",
        dir: settings.dir.clone(),
        cause,
    };
    let (store, report) = opened
        .map_err(|e| cache_error(e.into()))?
        .map_err(|e| cache_error(e.into()))?;
    if report.dirty_sub_blocks_lost > 0 || report.banks_lost > 0 || report.banks_truncated > 0 {
        tracing::error!(
            ?report,
            "the block cache lost dirty data (a crash, bytes that failed their checksum, or a \
             bank file missing or cut short); its write verifier changed so clients resend \
             what they have not committed"
        );
    } else {
        tracing::info!(?report, "block cache opened");
    }
    Ok(Arc::new(store))
}

/// The index of file names and metadata answers: in the cache directory
/// when there is one (it survives restarts), else in memory.
fn open_meta_index(cache: Option<&CacheSettings>) -> Arc<dyn MetaIndex> {
    if let Some(c) = cache {
        let path = c.dir.join("meta.sled");
        match gvfs_filecache::SledIndex::open(&path) {
            Ok(i) => return Arc::new(i),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "metadata index not opened; keeping it in memory")
            }
        }
    }
    Arc::new(gvfs_filecache::MemIndex::new(MEMORY_INDEX))
}

/// Opens the file cache (whole files fetched by compress-and-copy) in
/// `settings.dir/files`, with `parts`.
fn open_file_cache(
    settings: &CacheSettings,
    index: Arc<dyn MetaIndex>,
    parts: FileCacheParts,
) -> Result<Arc<FileCache>, ProxyError> {
    let dir = settings.dir.join("files");
    FileCache::open(&dir, Some(index), settings.file_cache_size, parts).map_err(|e| {
        ProxyError::Cache {
            what: "file cache",
            dir: dir.clone(),
            cause: e.into(),
        }
    })
}
