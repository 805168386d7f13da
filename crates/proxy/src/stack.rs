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
//! Which layers, with which settings, is decided once, in
//! [`crate::plan`]; [`Stack::build`] opens the upstream, makes the parts
//! the layers share (`wiring.rs`) and walks the plan bottom up. Each
//! layer above the upstream is also kept as a [`Lifecycle`] in
//! [`Stack::layers`]: write-back ([`crate::writeback`]) and exit
//! ([`crate::shutdown`]) walk that list, not the layer types.
//!
//! Front ends (the NFS/MOUNT/PORTMAP server in [`crate::front`]) serve
//! [`Stack::top`]; they know nothing of the layers under it. The extension
//! program ([`Stack::ext`]) serves compress-and-copy to proxies chained in
//! front of this one.

use std::path::Path;
use std::sync::Arc;

use gvfs_attrcache::AttrCache;
use gvfs_cache::CacheLayer;
use gvfs_filecache::{FileCache, MetaIndex};
use gvfs_meta::MetaLayer;
use gvfs_nfs::layer::Lifecycle;
use gvfs_nfs::net::client::RpcClient;
use gvfs_nfs::{CallContext, Credentials, NfsService};
use gvfs_upstream::UpstreamUrl;
use gvfs_upstream::dir::DirUpstream;
use gvfs_upstream::nfs::{NfsUpstream, UpstreamTimeouts};

use crate::config::{Config, UpstreamChoice};
use crate::error::ProxyError;
use crate::ext_server::ExtServer;
use crate::plan::{Plan, Planned};
use crate::server::TlsSide;
use crate::wiring::Wiring;

/// A proxy's layers, bottom to top. The optional ones are also kept by
/// type for what only they do (their typed stats, the extension program).
pub struct Stack {
    /// The top of the stack: what every front end serves.
    pub top: Arc<dyn NfsService>,
    /// The layers above the upstream, bottom first, for write-back and
    /// exit.
    pub layers: Vec<Arc<dyn Lifecycle>>,
    /// The upstream's RPC client, when it is reached over RPC.
    pub client: Option<RpcClient>,
    /// The gate in front of it ([`gvfs_ext::Gate`]), with the client.
    pub gate: Option<gvfs_ext::Gate>,
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
    /// Builds the layers `cfg` asks for ([`crate::plan::plan`]), bottom to
    /// top. The upstream is checked first (a dead one fails here, not at
    /// the first call).
    pub async fn build(cfg: &Config, tls: Option<&TlsSide>) -> Result<Self, ProxyError> {
        let plan = crate::plan::plan(cfg);
        Self::build_from(&plan, cfg, tls).await
    }

    async fn build_from(
        plan: &Plan<'_>,
        cfg: &Config,
        tls: Option<&TlsSide>,
    ) -> Result<Self, ProxyError> {
        let upstream = open_upstream(cfg, tls).await?;
        let wiring = Wiring::open(plan, upstream.client.as_ref()).await?;
        let mut stacked = Stacked {
            top: upstream.service,
            layers: Vec::new(),
        };
        let (mut cache, mut attrs, mut meta) = (None, None, None);
        for layer in plan.layers() {
            match layer {
                Planned::Upstream(_) => {}
                Planned::BlockCache(c) => {
                    // Opened by the wiring for every planned block cache.
                    let Some(store) = wiring.store.clone() else {
                        continue;
                    };
                    let layer =
                        CacheLayer::new(stacked.top(), store, c.layer, wiring.cache_sides());
                    cache = Some(stacked.on(layer));
                }
                Planned::AttrCache(ttl) => {
                    attrs = Some(stacked.on(AttrCache::new(stacked.top(), *ttl)));
                }
                Planned::Meta { .. } => {
                    // Made by the wiring for a planned metadata layer.
                    let Some(table) = wiring.table.clone() else {
                        continue;
                    };
                    let layer = MetaLayer::new(
                        stacked.top(),
                        table,
                        wiring.index.clone(),
                        wiring.copy_path(),
                    );
                    meta = Some(stacked.on(layer));
                }
            }
        }
        let side = meta
            .clone()
            .map(|m| m as Arc<dyn gvfs_filecache::SideFiles>);
        let ext = ExtServer::new(
            stacked.top(),
            wiring.files.clone(),
            wiring.ext_client.clone(),
            side,
            Some(wiring.profiles.clone()),
        );
        Ok(Self {
            top: stacked.top,
            layers: stacked.layers,
            client: upstream.client,
            gate: wiring.gate.clone(),
            cache,
            attrs,
            meta,
            files: wiring.files,
            ext,
            index: wiring.index,
        })
    }

    /// The layers' names, bottom first, the upstream's included: those of
    /// the plan it was built from.
    pub fn names(&self) -> Vec<&'static str> {
        std::iter::once("upstream")
            .chain(self.layers.iter().map(|l| l.name()))
            .collect()
    }

    /// The layers above the upstream, top first: the order write-back and
    /// exit walk them in.
    pub fn top_down(&self) -> Vec<Arc<dyn Lifecycle>> {
        self.layers.iter().rev().cloned().collect()
    }
}

/// The stack while it is built: its top so far and its layers.
struct Stacked {
    top: Arc<dyn NfsService>,
    layers: Vec<Arc<dyn Lifecycle>>,
}

impl Stacked {
    fn top(&self) -> Arc<dyn NfsService> {
        self.top.clone()
    }

    /// Puts `layer` on top of the stack.
    fn on<L: NfsService + Lifecycle + 'static>(&mut self, layer: Arc<L>) -> Arc<L> {
        self.top = layer.clone();
        self.layers.push(layer.clone());
        layer
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FileConfig;

    /// `toml` with `upstream` set to a fresh directory and `cache_dir`
    /// (where it says `CACHE`) to another.
    fn config(dir: &Path, toml: &str) -> Config {
        let upstream = dir.join("origin");
        std::fs::create_dir_all(&upstream).unwrap();
        let toml = format!(
            "upstream = \"dir:{}\"\n{}",
            upstream.display(),
            toml.replace("CACHE", &dir.join("cache").display().to_string())
        );
        Config::from_file_config(FileConfig::parse(&toml).unwrap()).unwrap()
    }

    #[tokio::test]
    async fn the_built_stack_is_its_plan() {
        for (toml, layers) in [
            ("", &["upstream"][..]),
            ("attr_timeout_secs = 5", &["upstream", "attribute cache"]),
            ("meta = true", &["upstream", "metadata layer"]),
            (
                "cache_dir = \"CACHE\"\ncache_size = \"16M\"",
                &["upstream", "block cache", "metadata layer"],
            ),
            (
                "cache_dir = \"CACHE\"\ncache_size = \"16M\"\nmeta = false",
                &["upstream", "block cache"],
            ),
            (
                "cache_dir = \"CACHE\"\ncache_size = \"16M\"\nattr_timeout_secs = 5\ndedup = false",
                &[
                    "upstream",
                    "block cache",
                    "attribute cache",
                    "metadata layer",
                ],
            ),
            (
                "cache_dir = \"CACHE\"\ncache_size = \"16M\"\nattr_timeout_secs = 5",
                &[
                    "upstream",
                    "block cache",
                    "attribute cache",
                    "metadata layer",
                ],
            ),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let cfg = config(dir.path(), toml);
            let plan = crate::plan::plan(&cfg);
            let planned: Vec<&str> = plan.layers().iter().map(|l| l.name()).collect();
            assert_eq!(planned, layers, "{toml}");
            let described: Vec<&str> = plan.describe().iter().map(|l| l.name).collect();
            assert_eq!(described, layers, "{toml}");
            let stack = Stack::build(&cfg, None).await.unwrap();
            assert_eq!(stack.names(), layers, "{toml}");
            let top_down: Vec<&str> = stack.top_down().iter().map(|l| l.name()).collect();
            let mut expect = layers[1..].to_vec();
            expect.reverse();
            assert_eq!(top_down, expect, "{toml}");
            assert_eq!(stack.cache.is_some(), cfg.cache.is_some(), "{toml}");
            assert_eq!(stack.attrs.is_some(), cfg.attr_timeout.is_some(), "{toml}");
            assert_eq!(stack.meta.is_some(), cfg.meta, "{toml}");
            assert_eq!(stack.files.is_some(), plan.file_cache().is_some(), "{toml}");
            let dedup = stack.files.as_ref().is_some_and(|f| f.dedup_on());
            assert_eq!(dedup, plan.dedup(), "{toml}");
            let jobs = Arc::new(crate::writeback::Jobs::new(stack.top_down()));
            crate::shutdown::write_back_and_close(&stack, &jobs, cfg.cache.as_ref()).await;
        }
    }
}
