//! gvfs-proxy: a user-level NFSv3 forwarding and caching proxy.
//!
//! A proxy is a stack of [`gvfs_nfs::NfsService`] layers behind an RPC
//! front end: [`front`] decodes calls and routes NFS v3, MOUNT v3 and
//! PORTMAP v2; [`server`] is its tokio edge; [`gvfs_upstream`] is what
//! sits at the bottom (a local directory or an NFSv3 server). [`run`]
//! assembles a stack from a [`config::Config`] and serves it until shutdown.

#![warn(missing_docs)]

pub mod alloc;
pub mod attrcache;
pub mod config;
pub mod control;
pub mod drc;
pub mod front;
pub mod metrics;
pub mod server;
pub mod shutdown;
pub mod writeback;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use gvfs_nfs::client::RpcClient;
use gvfs_nfs::{CallContext, Credentials, NfsService, ServiceError};
use gvfs_upstream::UpstreamUrl;
use gvfs_upstream::dir::DirUpstream;
use gvfs_upstream::nfs::{NfsUpstream, UpstreamTimeouts};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, UpstreamChoice};
use crate::front::FrontEnd;
use crate::server::{MemoryBudget, Security, ServerStats, Shared, TlsSide};

/// Why a proxy could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// The listening address could not be bound.
    #[error("cannot listen on {addr}: {cause}{hint}", hint = bind_hint(.cause))]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause (part of the message, so not also a `source`).
        cause: std::io::Error,
    },
    /// The `dir:` upstream could not be opened.
    #[error(transparent)]
    Dir(#[from] gvfs_upstream::dir::DirError),
    /// The sample directory could not be created.
    #[error("cannot create the sample directory {path}: {cause}")]
    Sample {
        /// The directory.
        path: PathBuf,
        /// The cause (part of the message, so not also a `source`).
        cause: std::io::Error,
    },
    /// The upstream did not answer or refused the export at start-up.
    #[error("upstream check failed: {0}")]
    Upstream(ServiceError),
    /// The control socket could not be set up.
    #[error(transparent)]
    Control(#[from] control::ControlError),
    /// The block cache could not be opened.
    #[error("cannot open the block cache in {dir}: {reason}")]
    Cache {
        /// The cache directory.
        dir: PathBuf,
        /// Why.
        reason: String,
    },
    /// Signal handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    /// The TLS certificate, key or CA could not be used.
    #[error(transparent)]
    Tls(#[from] gvfs_tunnel::TunnelError),
}

fn bind_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => " (the port is in use; pick another with --listen)",
        std::io::ErrorKind::PermissionDenied => {
            " (ports below 1024 need root or CAP_NET_BIND_SERVICE)"
        }
        std::io::ErrorKind::AddrNotAvailable => " (no such local address)",
        _ => "",
    }
}

/// What a started proxy tells its caller.
#[derive(Debug, Clone)]
pub struct Ready {
    /// The bound address.
    pub addr: SocketAddr,
    /// The export clients mount.
    pub export: String,
    /// The control socket.
    pub control: PathBuf,
    /// What is served, for humans.
    pub upstream: String,
    /// The block cache's directory, when there is one.
    pub cache: Option<String>,
    /// The TLS listener for gvfs:// peers, when there is one.
    pub tls_addr: Option<SocketAddr>,
    /// This node's certificate name, when TLS is configured.
    pub tls_name: Option<String>,
}

/// The bottom layer of the stack, and the RPC client when it has one.
struct Bottom {
    service: Arc<dyn NfsService>,
    client: Option<RpcClient>,
}

async fn build_upstream(cfg: &Config, tls: Option<&TlsSide>) -> Result<Bottom, ProxyError> {
    let timeouts = UpstreamTimeouts {
        connect: cfg.connect_timeout,
        give_up_after: cfg.upstream_timeout,
    };
    match &cfg.upstream {
        UpstreamChoice::Sample(dir) => {
            make_sample(dir).map_err(|cause| ProxyError::Sample {
                path: dir.clone(),
                cause,
            })?;
            Ok(Bottom {
                service: Arc::new(DirUpstream::open(dir)?),
                client: None,
            })
        }
        UpstreamChoice::Url(UpstreamUrl::Dir(dir)) => Ok(Bottom {
            service: Arc::new(DirUpstream::open(dir)?),
            client: None,
        }),
        UpstreamChoice::Url(url @ (UpstreamUrl::Nfs(_) | UpstreamUrl::Gvfs(_))) => {
            let up = match (url, tls) {
                (UpstreamUrl::Gvfs(u), Some(tls)) => {
                    NfsUpstream::tls(u, &tls.identity, timeouts, tls.handshake_timeout)?
                }
                (UpstreamUrl::Nfs(u), _) => NfsUpstream::new(u.clone(), timeouts),
                _ => {
                    return Err(ProxyError::Upstream(ServiceError::Local(
                        "a gvfs:// upstream needs --cert, --key and --ca".into(),
                    )));
                }
            };
            // Fail fast with a clear error rather than serve a dead upstream.
            let cx = CallContext::with_cred(Credentials::unix(0, 0));
            up.check(&cx, cfg.connect_timeout * 2)
                .await
                .map_err(ProxyError::Upstream)?;
            let client = up.client().clone();
            Ok(Bottom {
                service: Arc::new(up),
                client: Some(client),
            })
        }
    }
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

/// Runs a proxy until `shutdown` is cancelled. `on_ready` is called once the
/// listener and control socket are bound and the upstream answered.
pub async fn run(
    cfg: Config,
    shutdown: CancellationToken,
    on_ready: impl FnOnce(&Ready),
) -> Result<(), ProxyError> {
    let tls = match &cfg.tls {
        Some(t) => {
            let identity = gvfs_tunnel::TlsIdentity::load(&t.files)?;
            Some(Arc::new(TlsSide {
                identity,
                map: Arc::new(t.map.clone()),
                handshake_timeout: t.handshake_timeout,
            }))
        }
        None => None,
    };
    let bottom = build_upstream(&cfg, tls.as_deref()).await?;
    // The metadata layer's table, made first: the block cache below it
    // asks which ranges are known zeros, so read-ahead skips them.
    let meta_files = cfg.meta.then(gvfs_meta::MetaFiles::new);
    let zero_hint = meta_files.clone().map(|t| {
        Arc::new(move |fh: &[u8], off: u64, len: u64| t.known_zero(fh, off, len))
            as gvfs_cache::ZeroHint
    });
    let cache = match &cfg.cache {
        Some(c) => Some(open_cache(c, bottom.service.clone(), zero_hint).await?),
        None => None,
    };
    let mut service: Arc<dyn NfsService> = match &cache {
        Some(layer) => layer.clone(),
        None => bottom.service.clone(),
    };
    let attrs = cfg.attr_timeout.map(|ttl| {
        let layer = attrcache::AttrCache::new(service.clone(), ttl);
        service = layer.clone();
        layer
    });
    // The upstream's side of the extension program, when it is reached
    // over RPC (it may be another gvfs-proxy that compresses for us).
    let ext_client: Option<Arc<dyn gvfs_meta::ChunkSource>> = bottom
        .client
        .clone()
        .map(|c| gvfs_meta::ExtClient::new(c) as Arc<dyn gvfs_meta::ChunkSource>);
    let index = cfg.meta.then(|| open_meta_index(&cfg)).flatten();
    let files = match (&cfg.cache, cfg.meta) {
        (Some(c), true) => Some(open_file_cache(c, index.clone())?),
        _ => None,
    };
    let meta = if let Some(meta_files) = meta_files {
        let copy = match (&files, &ext_client) {
            (Some(files), Some(source)) => {
                // Ask now whether the upstream speaks the extension, so the
                // first whole-file fetch does not wait a round trip for it.
                let probe = source.clone();
                tokio::spawn(async move { probe.supported().await });
                Some(gvfs_meta::CopyPath {
                    files: files.clone(),
                    source: source.clone(),
                })
            }
            _ => None,
        };
        let layer = gvfs_meta::MetaLayer::new(service.clone(), meta_files, index, copy);
        service = layer.clone();
        Some(layer)
    } else {
        None
    };
    let listener = TcpListener::bind(cfg.listen)
        .await
        .map_err(|cause| ProxyError::Bind {
            addr: cfg.listen,
            cause,
        })?;
    let addr = listener.local_addr().map_err(|cause| ProxyError::Bind {
        addr: cfg.listen,
        cause,
    })?;
    let tls_listener = match (&tls, cfg.tls.as_ref().and_then(|t| t.listen)) {
        (Some(side), Some(at)) => {
            let l = TcpListener::bind(at)
                .await
                .map_err(|cause| ProxyError::Bind { addr: at, cause })?;
            let bound = l
                .local_addr()
                .map_err(|cause| ProxyError::Bind { addr: at, cause })?;
            Some((l, bound, side.clone()))
        }
        _ => None,
    };
    let ext_server =
        gvfs_meta::ExtServer::new(service.clone(), files.clone(), ext_client, meta.clone());
    let front = Arc::new(
        FrontEnd::new(service.clone(), cfg.export.clone(), addr.port())
            .with_ext(ext_server.clone()),
    );
    let control_path = cfg
        .control
        .clone()
        .unwrap_or_else(|| config::default_control_path(addr));
    let control_listener = control::bind(&control_path).await?;
    let stats = Arc::new(ServerStats::default());
    let budget = Arc::new(MemoryBudget::new(
        cfg.limits.buffer_memory,
        u64::from(cfg.limits.records.max_record),
    ));
    let ready = Ready {
        addr,
        export: cfg.export.clone(),
        control: control_path.clone(),
        upstream: service.describe(),
        cache: cfg.cache.as_ref().map(|c| c.dir.display().to_string()),
        tls_addr: tls_listener.as_ref().map(|(_, a, _)| *a),
        tls_name: tls.as_ref().map(|t| t.identity.name().to_string()),
    };
    let files_for_exit = files.clone();
    let jobs = Arc::new(writeback::Jobs::default());
    if let (Some(m), Some(_)) = (&meta, &files) {
        jobs.with_file_cache(m.clone());
    }
    if let Some(a) = &attrs {
        jobs.with_attr_cache(a.clone());
    }
    if let Some(layer) = &cache {
        writeback::on_signals(jobs.clone(), layer.clone()).map_err(ProxyError::Signals)?;
    }
    let status = StatusSource {
        ready: ready.clone(),
        front: front.clone(),
        server: stats.clone(),
        budget: budget.clone(),
        client: bottom.client,
        cache: cache.clone(),
        meta,
        files,
        attrs,
        ext: ext_server,
        jobs: jobs.clone(),
        started: Instant::now(),
    };
    let status = Arc::new(status);
    if let Some(addr) = cfg.metrics {
        let listener = metrics::bind(addr)
            .await
            .map_err(|cause| ProxyError::Bind { addr, cause })?;
        let source = status.clone();
        let snapshot: metrics::Snapshot = Arc::new(move || source.stats());
        tokio::spawn(metrics::serve(listener, snapshot, shutdown.clone()));
        tracing::info!(%addr, "serving Prometheus metrics at /metrics");
    }
    let control_task = tokio::spawn(control::serve(
        control_listener,
        control_path,
        move |req: &Value| status.handle(req),
        shutdown.clone(),
    ));
    tracing::info!(%addr, upstream = %ready.upstream, export = %ready.export, "serving");
    on_ready(&ready);

    let tasks = TaskTracker::new();
    let shared = Shared {
        front,
        stats,
        budget,
        shutdown: shutdown.clone(),
        tasks: tasks.clone(),
    };
    let tls_task = tls_listener.map(|(l, at, side)| {
        tracing::info!(%at, name = side.identity.name(), "accepting gvfs:// peers over TLS");
        tokio::spawn(server::serve(
            l,
            Security::Tls(side),
            cfg.limits,
            shared.clone(),
        ))
    });
    server::serve(
        listener,
        Security::Plain { starttls: tls },
        cfg.limits,
        shared,
    )
    .await;
    if let Some(t) = tls_task {
        let _ = t.await;
    }
    shutdown::drain(&tasks, cfg.drain_timeout).await;
    if let (Some(layer), Some(settings)) = (&cache, &cfg.cache) {
        let files_dirty = files_for_exit.is_some_and(|f| f.stats().dirty_files > 0);
        write_back_on_exit(layer, &jobs, settings, files_dirty).await;
    }
    shutdown.cancel();
    let _ = control_task.await;
    Ok(())
}

/// The index of file names and metadata answers: in the cache directory
/// when there is one (it survives restarts), else in memory.
fn open_meta_index(cfg: &Config) -> Option<Arc<dyn gvfs_meta::MetaIndex>> {
    if let Some(c) = &cfg.cache {
        let path = c.dir.join("meta.sled");
        match gvfs_meta::SledIndex::open(&path) {
            Ok(i) => return Some(Arc::new(i)),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "metadata index not opened; keeping it in memory")
            }
        }
    }
    Some(Arc::new(gvfs_meta::MemIndex::new(65_536)))
}

/// Opens the file cache (whole files fetched by compress-and-copy) in
/// `settings.dir/files`.
fn open_file_cache(
    settings: &config::CacheSettings,
    index: Option<Arc<dyn gvfs_meta::MetaIndex>>,
) -> Result<Arc<gvfs_meta::FileCache>, ProxyError> {
    let dir = settings.dir.join("files");
    gvfs_meta::FileCache::open(&dir, index, settings.file_cache_size).map_err(|e| {
        ProxyError::Cache {
            dir: dir.clone(),
            reason: format!("cannot open the file cache: {e}"),
        }
    })
}

/// Opens the block cache in `settings.dir` and stacks it on `below`.
async fn open_cache(
    settings: &config::CacheSettings,
    below: Arc<dyn NfsService>,
    zero_hint: Option<gvfs_cache::ZeroHint>,
) -> Result<Arc<gvfs_cache::CacheLayer>, ProxyError> {
    let (dir, geometry) = (settings.dir.clone(), settings.geometry);
    let opened = tokio::task::spawn_blocking(move || {
        gvfs_cache::BlockStore::open_dir(&dir, geometry, gvfs_cache::OpenOptions::default())
    })
    .await;
    let cache_error = |reason: String| ProxyError::Cache {
        dir: settings.dir.clone(),
        reason,
    };
    let (store, report) = opened
        .map_err(|e| cache_error(e.to_string()))?
        .map_err(|e| cache_error(e.to_string()))?;
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
    Ok(gvfs_cache::CacheLayer::new(
        below,
        store,
        settings.layer,
        zero_hint,
    ))
}

/// On exit: unless configured not to, write dirty data back within the
/// deadline; whatever is left stays dirty in the cache for the next start.
async fn write_back_on_exit(
    layer: &Arc<gvfs_cache::CacheLayer>,
    jobs: &Arc<writeback::Jobs>,
    settings: &config::CacheSettings,
    files_dirty: bool,
) {
    let deadline = settings.exit_writeback_timeout;
    if settings.writeback_on_exit && (layer.dirty_bytes() > 0 || files_dirty) {
        let _ = jobs.wait(deadline).await;
        let _ = jobs.start(layer, writeback::JobKind::WriteBack);
        if !jobs.wait(deadline).await {
            tracing::warn!(
                dirty_bytes = layer.dirty_bytes(),
                "write-back on exit did not finish in {deadline:?}; the rest stays in the cache"
            );
        }
    }
    if let Err(e) = layer.close() {
        tracing::error!(error = %e, "closing the block cache");
    }
}

/// Answers control requests from live counters.
struct StatusSource {
    ready: Ready,
    front: Arc<FrontEnd>,
    server: Arc<ServerStats>,
    budget: Arc<MemoryBudget>,
    client: Option<RpcClient>,
    cache: Option<Arc<gvfs_cache::CacheLayer>>,
    meta: Option<Arc<gvfs_meta::MetaLayer>>,
    files: Option<Arc<gvfs_meta::FileCache>>,
    attrs: Option<Arc<attrcache::AttrCache>>,
    ext: Arc<gvfs_meta::ExtServer>,
    jobs: Arc<writeback::Jobs>,
    started: Instant,
}

impl StatusSource {
    fn handle(&self, req: &Value) -> Result<Value, String> {
        let cache = || {
            self.cache.as_ref().ok_or_else(|| {
                "this proxy has no block cache (start it with --cache-dir)".to_string()
            })
        };
        match req["cmd"].as_str() {
            Some("status") => Ok(self.status()),
            Some("stats") => Ok(self.stats()),
            Some("writeback") => Ok(self.jobs.start(cache()?, writeback::JobKind::WriteBack)),
            Some("flush") => Ok(self.jobs.start(cache()?, writeback::JobKind::Flush)),
            Some(other) => Err(format!(
                "unknown command {other:?}; this proxy knows: status, stats, writeback, flush"
            )),
            None => Err("request has no \"cmd\"".into()),
        }
    }

    /// Everything: status, cache counters, the write-back job.
    fn stats(&self) -> Value {
        json!({
            "status": self.status(),
            "cache": self.cache.as_ref().map(|c| json!(c.stats())),
            "meta": self.meta.as_ref().map(|m| json!(m.stats())),
            "file_cache": self.files.as_ref().map(|f| json!(f.stats())),
            "attr_cache": self.attrs.as_ref().map(|a| {
                let s = a.stats();
                let g = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
                json!({
                    "hits": g(&s.hits),
                    "misses": g(&s.misses),
                    "listings": g(&s.listings),
                    "invalidations": g(&s.invalidations),
                })
            }),
            "ext": json!(self.ext.stats()),
            "writeback": self.jobs.state(),
        })
    }

    fn status(&self) -> Value {
        let f = self.front.stats();
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let calls: serde_json::Map<String, Value> = f
            .nfs_calls
            .iter()
            .enumerate()
            .filter(|(_, c)| load(c) > 0)
            .map(|(i, c)| (front::proc_name(i).to_string(), json!(load(c))))
            .collect();
        let upstream_client = self.client.as_ref().map(|c| {
            let s = c.stats();
            json!({
                "server": c.server(),
                "calls": load(&s.calls),
                "retransmits": load(&s.retransmits),
                "connects": load(&s.connects),
            })
        });
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "pid": std::process::id(),
            "listen": self.ready.addr.to_string(),
            "listen_tls": self.ready.tls_addr.map(|a| a.to_string()),
            "tls_name": self.ready.tls_name,
            "export": self.ready.export,
            "upstream": self.ready.upstream,
            "uptime_secs": self.started.elapsed().as_secs(),
            "connections": {
                "open": load(&self.server.open),
                "accepted": load(&self.server.accepted),
                "closed_oversized": load(&self.server.oversized),
                "tls_accepted": load(&self.server.tls_accepted),
                "tls_refused": load(&self.server.tls_refused),
                "starttls": load(&self.server.starttls),
                "pending": load(&self.server.pending),
                "evicted_pending": load(&self.server.evicted_pending),
                "evicted_idle": load(&self.server.evicted_idle),
                "slot_waits": load(&self.server.slot_waits),
                "timed_out": load(&self.server.timed_out),
            },
            "buffers": {
                "budget_bytes": self.budget.limit(),
                "held_bytes": self.budget.used(),
                "peak_bytes": self.budget.peak(),
                "throttled": self.budget.throttled(),
            },
            "nfs_calls": calls,
            "mount_calls": load(&f.mount_calls),
            "portmap_calls": load(&f.portmap_calls),
            "read_bytes": load(&f.read_bytes),
            "write_bytes": load(&f.write_bytes),
            "rpc_errors": load(&f.rpc_errors),
            "service_errors": load(&f.service_errors),
            "drc_hits": load(&f.drc_hits),
            "ext_calls": load(&f.ext_calls),
            "upstream_client": upstream_client,
            "cache": self.cache.as_ref().map(|c| json!({"dirty_bytes": c.dirty_bytes()})),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error as `main` prints it: the message and every `source`.
    fn as_main_prints(e: ProxyError) -> String {
        format!("{:#}", anyhow::Error::from(e))
    }

    fn assert_once(text: &str, part: &str) {
        assert_eq!(
            text.matches(part).count(),
            1,
            "{part:?} not once in {text:?}"
        );
    }

    #[tokio::test]
    async fn start_up_errors_say_each_thing_once() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nonexistent");
        let e = as_main_prints(DirUpstream::open(&missing).unwrap_err().into());
        assert_once(&e, "cannot open dir: upstream");
        assert_once(&e, "os error 2");

        let files = gvfs_tunnel::TlsFiles {
            cert: dir.path().join("node.pem"),
            key: dir.path().join("node-key.pem"),
            ca: dir.path().join("noca.pem"),
        };
        let e = as_main_prints(gvfs_tunnel::TlsIdentity::load(&files).unwrap_err().into());
        assert_once(&e, "no such file");

        let in_use = dir.path().join("c.sock");
        let _live = control::bind(&in_use).await.unwrap();
        let e = as_main_prints(control::bind(&in_use).await.unwrap_err().into());
        assert_once(
            &e,
            "is in use by another running proxy; pass --control PATH",
        );

        let bad = dir.path().join("file");
        std::fs::write(&bad, b"").unwrap();
        let e = as_main_prints(control::bind(&bad.join("x.sock")).await.unwrap_err().into());
        assert_once(&e, "cannot create control socket");
        assert_once(&e, "os error");

        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap();
        let cause = TcpListener::bind(addr).await.unwrap_err();
        let e = as_main_prints(ProxyError::Bind { addr, cause });
        assert_once(&e, "Address already in use");
        assert_once(&e, "pick another with --listen");
    }

    /// A closed port on loopback: bound, then let go.
    async fn closed_port() -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap().port()
    }

    #[tokio::test]
    async fn unreachable_upstream_at_start_up_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let (nfs, mount) = (closed_port().await, closed_port().await);
        let cfg = Config::from_file_config(config::FileConfig {
            listen: Some("127.0.0.1:0".into()),
            upstream: Some(format!("nfs://127.0.0.1:{nfs}/export?mountport={mount}")),
            control: Some(dir.path().join("c.sock")),
            connect_timeout_secs: Some(1),
            ..config::FileConfig::default()
        })
        .unwrap();
        let e = run(cfg, CancellationToken::new(), |_| panic!("started"))
            .await
            .unwrap_err();
        let e = as_main_prints(e);
        assert!(e.starts_with("upstream check failed: "), "{e}");
        assert!(e.contains(&format!("127.0.0.1:{mount}")), "{e}");
        assert!(e.contains("refused"), "{e}");
    }
}
