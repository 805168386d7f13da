//! The layer stack: what a proxy serves, built from its configuration.
//!
//! Bottom to top, each layer an [`NfsService`] over the one below:
//!
//! | layer | crate | on when |
//! |---|---|---|
//! | upstream: `dir:`, `nfs://`, `gvfs://` | `gvfs_upstream` | always |
//! | block cache | `gvfs_cache` | `--cache-dir` |
//! | attribute cache | `gvfs_attrcache` | `--attr-timeout` |
//! | metadata layer (zero maps, file cache) | `gvfs_meta` | `--meta` (default with a cache) |
//!
//! Front ends (the NFS/MOUNT/PORTMAP server in [`crate::front`]) serve
//! [`Stack::top`]; they know nothing of the layers under it. The extension
//! program ([`Stack::ext`]) serves compress-and-copy to proxies chained in
//! front of this one.

use std::path::Path;
use std::sync::Arc;

use gvfs_attrcache::AttrCache;
use gvfs_cache::{CacheLayer, ZeroHint};
use gvfs_ext::{ChunkSource, ExtClient};
use gvfs_filecache::{FileCache, MetaIndex, Profiles};
use gvfs_meta::{CopyPath, MetaFiles, MetaLayer};

use crate::ext_server::ExtServer;
use gvfs_nfs::net::client::RpcClient;
use gvfs_nfs::{CallContext, Credentials, NfsService};

use crate::ProxyError;
use crate::config::{CacheSettings, Config, UpstreamChoice};
use crate::server::TlsSide;
use gvfs_upstream::UpstreamUrl;
use gvfs_upstream::dir::DirUpstream;
use gvfs_upstream::nfs::{NfsUpstream, UpstreamTimeouts};

/// A proxy's layers, bottom to top. The optional ones are kept by name
/// for what only they do (status, write-back jobs, exit).
pub struct Stack {
    /// The top of the stack: what every front end serves.
    pub top: Arc<dyn NfsService>,
    /// The upstream's RPC client, when it is reached over RPC.
    pub client: Option<RpcClient>,
    /// The block cache.
    pub cache: Option<Arc<CacheLayer>>,
    /// The attribute cache.
    pub attrs: Option<Arc<AttrCache>>,
    /// The metadata layer.
    pub meta: Option<Arc<MetaLayer>>,
    /// The file cache (whole files fetched by compress-and-copy).
    pub files: Option<Arc<FileCache>>,
    /// The extension program this proxy serves to the proxies above it.
    pub ext: Arc<ExtServer>,
    /// The metadata index (file records, profiles, held blocks), flushed
    /// at a clean stop: its lazily written records are kept.
    pub index: Option<Arc<dyn MetaIndex>>,
}

impl Stack {
    /// Builds the layers `cfg` asks for, bottom to top. The upstream is
    /// checked first (a dead one fails here, not at the first call).
    pub async fn build(cfg: &Config, tls: Option<&TlsSide>) -> Result<Self, ProxyError> {
        let upstream = open_upstream(cfg, tls).await?;
        let mut top = upstream.service;
        // The metadata layer's table is made first: the block cache below
        // it asks which ranges are known zeros, so read-ahead skips them.
        let meta_files = cfg.meta.then(MetaFiles::new);
        let cache = match &cfg.cache {
            Some(c) => Some(open_cache(c, top.clone(), zero_hint(meta_files.as_ref())).await?),
            None => None,
        };
        let cache = stack_on(&mut top, cache);
        let attrs = cfg.attr_timeout.map(|ttl| AttrCache::new(top.clone(), ttl));
        let attrs = stack_on(&mut top, attrs);
        // The upstream's side of the extension program, when it is reached
        // over RPC (it may be another gvfs-proxy that compresses for us).
        let ext_client = upstream
            .client
            .clone()
            .map(|c| ExtClient::new(c) as Arc<dyn ChunkSource>);
        let index = cfg.meta.then(|| open_meta_index(cfg));
        let files = match (&cfg.cache, &index) {
            (Some(c), Some(index)) => Some(open_file_cache(c, index.clone())?),
            _ => None,
        };
        // Working-set profiles live in the same index, beside the records
        // of the files they order.
        // Without an index (no --meta) they are kept in memory: a proxy
        // next to the image server answers PROFILE_PUT whatever its options.
        let profiles = Profiles::new(
            index
                .clone()
                .unwrap_or_else(|| Arc::new(gvfs_filecache::MemIndex::new(MEMORY_PROFILES))),
        );
        if let Some(files) = &files {
            files.keep_profiles(profiles.clone());
        }
        // Held blocks by content hash, in the same index: they come and
        // go with the files that hold them.
        if let (Some(files), Some(index), Some(c)) = (&files, &index, &cfg.cache)
            && c.dedup
        {
            files.keep_blocks(gvfs_filecache::BlockIndex::new(index.clone()));
            // And the block cache's: its misses are filled from blocks
            // with the same content held in either cache.
            if let (Some(cache), Some(table)) = (&cache, &meta_files) {
                dedup_block_cache(cache, files, table);
            }
        }
        let meta = meta_files.map(|table| {
            let copy = copy_path(files.as_ref(), ext_client.as_ref());
            MetaLayer::new(top.clone(), table, index.clone(), copy)
        });
        let meta = stack_on(&mut top, meta);
        let side = meta
            .clone()
            .map(|m| m as Arc<dyn gvfs_filecache::SideFiles>);
        let ext = ExtServer::new(top.clone(), files.clone(), ext_client, side, Some(profiles));
        Ok(Self {
            top,
            client: upstream.client,
            cache,
            attrs,
            meta,
            files,
            ext,
            index,
        })
    }
}

/// One layer [`Stack::build`] would stack: its name and its settings, in
/// a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedLayer {
    /// The layer, e.g. "block cache".
    pub name: &'static str,
    /// Its settings, for humans.
    pub settings: String,
}

/// The layers [`Stack::build`] stacks for `cfg`, bottom first, without
/// opening anything (`gvfs-proxy --check`). It follows `build`'s
/// conditions: keep the two side by side.
pub fn plan(cfg: &Config) -> Vec<PlannedLayer> {
    let mut layers = vec![PlannedLayer {
        name: "upstream",
        settings: describe_upstream(cfg),
    }];
    if let Some(c) = &cfg.cache {
        let g = &c.geometry;
        let on_exit = match (c.layer.policy, c.writeback_on_exit) {
            (gvfs_cache::WritePolicy::WriteThrough, _) => String::new(),
            (_, true) => format!(
                ", written back on exit within {} s",
                c.exit_writeback_timeout.as_secs()
            ),
            (_, false) => ", dirty data kept on exit".to_owned(),
        };
        layers.push(PlannedLayer {
            name: "block cache",
            settings: format!(
                "{}: {}, {} blocks, {} banks x {} ways, read-ahead {} blocks, {}{on_exit}",
                c.dir.display(),
                human_bytes(g.capacity()),
                human_bytes(u64::from(g.block_size())),
                g.banks(),
                g.ways(),
                c.layer.readahead_blocks,
                c.layer.policy,
            ),
        });
    }
    if let Some(ttl) = cfg.attr_timeout {
        layers.push(PlannedLayer {
            name: "attribute cache",
            settings: format!("answers from replies at most {} s old", ttl.as_secs()),
        });
    }
    if cfg.meta {
        let files = match &cfg.cache {
            Some(c) => format!(
                "file cache in {} (at most {}), dedup across images {}",
                c.dir.join("files").display(),
                human_bytes(c.file_cache_size),
                if c.dedup { "on" } else { "off" }
            ),
            None => "no file cache (no cache_dir): peers' whole-file fetches are read \
                     from the upstream"
                .to_owned(),
        };
        layers.push(PlannedLayer {
            name: "metadata layer",
            settings: format!("zero maps and compress-and-copy; {files}"),
        });
    }
    layers
}

/// The upstream of `cfg` in a line.
fn describe_upstream(cfg: &Config) -> String {
    let waits = match cfg.upstream_timeout {
        None => "calls wait for it like a hard mount".to_owned(),
        Some(t) => format!("calls give up after {} s", t.as_secs()),
    };
    match &cfg.upstream {
        UpstreamChoice::Sample(dir) => format!(
            "dir:{} (the sample directory, made on first start)",
            dir.display()
        ),
        UpstreamChoice::Url(UpstreamUrl::Dir(dir)) => {
            format!("dir:{} (a local directory, no NFS server)", dir.display())
        }
        UpstreamChoice::Url(UpstreamUrl::Nfs(u)) => {
            let port = |p: Option<u16>| p.map_or("the portmapper's".to_owned(), |p| p.to_string());
            format!(
                "nfs://{}{} (NFSv3: NFS port {}, MOUNT port {}); {waits}",
                u.host,
                u.export,
                port(u.port),
                port(u.mount_port)
            )
        }
        UpstreamChoice::Url(UpstreamUrl::Gvfs(u)) => format!(
            "gvfs://{}:{}{} over mutually authenticated TLS 1.3, its certificate named {}; {waits}",
            u.host,
            u.port,
            u.export,
            u.server_name.as_deref().unwrap_or(&u.host)
        ),
    }
}

/// `n` bytes in the largest binary unit that divides it (`64 KiB`, `8 GiB`).
pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
    UNITS
        .iter()
        .find(|(_, shift)| n >= 1 << shift && n.trailing_zeros() >= *shift)
        .map_or(format!("{n} bytes"), |(unit, shift)| {
            format!("{} {unit}", n >> shift)
        })
}

/// Makes the block cache and the file cache find each other's blocks by
/// content hash (the table says which files have hashes).
fn dedup_block_cache(cache: &Arc<CacheLayer>, files: &Arc<FileCache>, table: &Arc<MetaFiles>) {
    let layer = Arc::downgrade(cache);
    files.read_block_cache_with(Arc::new(move |fh: &[u8], offset: u64, buf: &mut [u8]| {
        layer
            .upgrade()
            .is_some_and(|l| l.read_held(fh, offset, buf))
    }));
    cache.fill_from(Arc::new(HeldBlocks {
        files: files.clone(),
        table: table.clone(),
    }));
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

/// Working-set profiles a proxy without a metadata index keeps in memory.
const MEMORY_PROFILES: usize = 4096;

/// Puts `layer`, when there is one, on top of the stack.
fn stack_on<L: NfsService>(top: &mut Arc<dyn NfsService>, layer: Option<Arc<L>>) -> Option<Arc<L>> {
    if let Some(l) = &layer {
        *top = l.clone();
    }
    layer
}

/// The bottom of the stack, and its RPC client when it has one.
struct Upstream {
    service: Arc<dyn NfsService>,
    client: Option<RpcClient>,
}

async fn open_upstream(cfg: &Config, tls: Option<&TlsSide>) -> Result<Upstream, ProxyError> {
    let timeouts = UpstreamTimeouts {
        connect: cfg.connect_timeout,
        give_up_after: cfg.upstream_timeout,
    };
    let url = match &cfg.upstream {
        UpstreamChoice::Sample(dir) => {
            make_sample(dir).map_err(|cause| ProxyError::Sample {
                path: dir.clone(),
                cause,
            })?;
            return Ok(Upstream {
                service: Arc::new(DirUpstream::open(dir)?),
                client: None,
            });
        }
        UpstreamChoice::Url(UpstreamUrl::Dir(dir)) => {
            return Ok(Upstream {
                service: Arc::new(DirUpstream::open(dir)?),
                client: None,
            });
        }
        UpstreamChoice::Url(url) => url,
    };
    let up = match (url, tls) {
        (UpstreamUrl::Gvfs(u), Some(tls)) => {
            NfsUpstream::tls(u, &tls.identity, timeouts, tls.handshake_timeout)?
        }
        (UpstreamUrl::Nfs(u), _) => NfsUpstream::new(u.clone(), timeouts),
        _ => return Err(ProxyError::GvfsWithoutTls),
    };
    // Fail fast with a clear error rather than serve a dead upstream.
    let cx = CallContext::with_cred(Credentials::unix(0, 0));
    up.check(&cx, cfg.connect_timeout * 2)
        .await
        .map_err(ProxyError::Upstream)?;
    let client = up.client().clone();
    Ok(Upstream {
        service: Arc::new(up),
        client: Some(client),
    })
}

/// Creates the sample directory with a few files, if it does not exist.
fn make_sample(dir: &Path) -> std::io::Result<()> {
    if dir.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(dir.join("images"))?;
    std::fs::write(
        dir.join("README.txt"),
        "This directory is served by gvfs-proxy (the embedded dir: origin).\n\
         Files you copy in through NFS land here.\n",
    )?;
    // A small sparse "disk image": 64 MiB, mostly holes, a marker at 1 MiB.
    let f = std::fs::File::create(dir.join("images/sample.img"))?;
    f.set_len(64 << 20)?;
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"gvfs sample image\n", 1 << 20)?;
    Ok(())
}

/// Opens the block cache in `settings.dir` and stacks it on `below`.
async fn open_cache(
    settings: &CacheSettings,
    below: Arc<dyn NfsService>,
    zero_hint: Option<ZeroHint>,
) -> Result<Arc<CacheLayer>, ProxyError> {
    let (dir, geometry) = (settings.dir.clone(), settings.geometry);
    let opened = tokio::task::spawn_blocking(move || {
        gvfs_cache::BlockStore::open_dir(&dir, geometry, gvfs_cache::OpenOptions::default())
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
    Ok(CacheLayer::new(below, store, settings.layer, zero_hint))
}

/// The block cache's question to the metadata layer: is this range
/// known to be zeros?
fn zero_hint(table: Option<&Arc<MetaFiles>>) -> Option<ZeroHint> {
    let table = table?.clone();
    Some(Arc::new(move |fh: &[u8], off: u64, len: u64| {
        table.known_zero(fh, off, len)
    }))
}

/// The index of file names and metadata answers: in the cache directory
/// when there is one (it survives restarts), else in memory.
fn open_meta_index(cfg: &Config) -> Arc<dyn MetaIndex> {
    if let Some(c) = &cfg.cache {
        let path = c.dir.join("meta.sled");
        match gvfs_filecache::SledIndex::open(&path) {
            Ok(i) => return Arc::new(i),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "metadata index not opened; keeping it in memory")
            }
        }
    }
    Arc::new(gvfs_filecache::MemIndex::new(65_536))
}

/// Opens the file cache (whole files fetched by compress-and-copy) in
/// `settings.dir/files`.
fn open_file_cache(
    settings: &CacheSettings,
    index: Arc<dyn MetaIndex>,
) -> Result<Arc<FileCache>, ProxyError> {
    let dir = settings.dir.join("files");
    FileCache::open(&dir, Some(index), settings.file_cache_size).map_err(|e| ProxyError::Cache {
        what: "file cache",
        dir: dir.clone(),
        cause: e.into(),
    })
}

/// Compress-and-copy needs both a file cache to fetch into and an
/// upstream reached over RPC to fetch from.
fn copy_path(
    files: Option<&Arc<FileCache>>,
    source: Option<&Arc<dyn ChunkSource>>,
) -> Option<CopyPath> {
    let (files, source) = (files?, source?);
    // Ask now whether the upstream speaks the extension, so the first
    // whole-file fetch does not wait a round trip for it.
    let probe = source.clone();
    tokio::spawn(async move { probe.supported().await });
    Some(CopyPath {
        files: files.clone(),
        source: source.clone(),
    })
}
