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
use gvfs_meta::{
    ChunkSource, CopyPath, ExtClient, ExtServer, FileCache, MetaFiles, MetaIndex, MetaLayer,
    Profiles,
};
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
                .unwrap_or_else(|| Arc::new(gvfs_meta::MemIndex::new(MEMORY_PROFILES))),
        );
        if let Some(files) = &files {
            files.keep_profiles(profiles.clone());
        }
        // Held blocks by content hash, in the same index: they come and
        // go with the files that hold them.
        if let (Some(files), Some(index), Some(c)) = (&files, &index, &cfg.cache)
            && c.dedup
        {
            files.keep_blocks(gvfs_meta::dedup::BlockIndex::new(index.clone()));
        }
        let meta = meta_files.map(|table| {
            let copy = copy_path(files.as_ref(), ext_client.as_ref());
            MetaLayer::new(top.clone(), table, index.clone(), copy)
        });
        let meta = stack_on(&mut top, meta);
        let ext = ExtServer::new(
            top.clone(),
            files.clone(),
            ext_client,
            meta.clone(),
            Some(profiles),
        );
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
        match gvfs_meta::SledIndex::open(&path) {
            Ok(i) => return Arc::new(i),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "metadata index not opened; keeping it in memory")
            }
        }
    }
    Arc::new(gvfs_meta::MemIndex::new(65_536))
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
