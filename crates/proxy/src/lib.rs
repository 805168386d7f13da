//! gvfs-proxy: a user-level NFSv3 forwarding and caching proxy.
//!
//! A proxy is a stack of [`gvfs_nfs::NfsService`] layers behind an RPC
//! front end: [`front`] decodes calls and routes NFS v3, MOUNT v3 and
//! PORTMAP v2; [`server`] is its tokio edge; [`gvfs_upstream`] is what
//! sits at the bottom (a local directory or an NFSv3 server). [`run`]
//! assembles a stack from a [`config::Config`] and serves it until shutdown.

#![warn(missing_docs)]

pub mod alloc;
pub mod check;
pub mod config;
pub mod control;
pub mod drc;
mod error;
pub mod exit;
pub mod ext_server;
mod ext_server_class;
pub mod front;
pub mod handover;
pub mod logs;
pub mod metrics;
pub mod notify;
pub mod plan;
pub mod qmp;
mod ready;
pub mod server;
pub mod shutdown;
pub mod stack;
pub mod status;
mod wiring;
pub mod writeback;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde_json::Value;
use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::front::FrontEnd;
use crate::server::{MemoryBudget, Security, ServerStats, Shared, TlsSide};
use crate::stack::Stack;
use crate::status::StatusSource;

pub use crate::error::ProxyError;
pub use crate::ready::Ready;

/// How long the kernel keeps a FUSE mount's names and attributes when the
/// proxy has no attribute cache (`--attr-timeout`): about what an NFS
/// mount's shortest attribute cache is.
const KERNEL_ATTR_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs a proxy until `shutdown` is cancelled: builds the stack, binds the
/// listeners, serves. `on_ready` is called once the upstream answered and
/// every listener is bound.
pub async fn run(
    cfg: Config,
    shutdown: CancellationToken,
    on_ready: impl FnOnce(&Ready),
) -> Result<(), ProxyError> {
    let tls = match &cfg.tls {
        Some(t) => Some(Arc::new(TlsSide {
            identity: gvfs_tunnel::TlsIdentity::load(&t.files)?,
            map: Arc::new(t.map.clone()),
            handshake_timeout: t.handshake_timeout,
        })),
        None => None,
    };
    let stack = Stack::build(&cfg, tls.as_deref()).await?;
    let listeners = Listeners::bind(&cfg, tls).await?;
    serve(&cfg, listeners, stack, shutdown, on_ready).await
}

/// The sockets a proxy answers on.
pub struct Listeners {
    /// NFS clients, unless `--listen none`.
    nfs: Option<(TcpListener, SocketAddr)>,
    /// NFS from gvfs:// peers over TLS, and this node's TLS side (also
    /// for STARTTLS on the plain listener).
    tls: Option<Arc<TlsSide>>,
    tls_listener: Option<(TcpListener, SocketAddr)>,
    control: UnixListener,
    control_path: PathBuf,
    metrics: Option<(TcpListener, SocketAddr)>,
}

impl Listeners {
    /// Binds what `cfg` asks for.
    pub async fn bind(cfg: &Config, tls: Option<Arc<TlsSide>>) -> Result<Self, ProxyError> {
        let nfs = match cfg.listen {
            Some(at) => Some(bind_tcp(at).await?),
            None => None,
        };
        let tls_listener = match (&tls, cfg.tls.as_ref().and_then(|t| t.listen)) {
            (Some(_), Some(at)) => Some(bind_tcp(at).await?),
            _ => None,
        };
        let control_path = config::control_path(
            cfg,
            nfs.as_ref().map(|(_, a)| *a),
            tls_listener.as_ref().map(|(_, a)| *a),
        );
        let control = control::bind(&control_path).await?;
        let metrics = match cfg.metrics {
            Some(at) => Some(bind_tcp(at).await?),
            None => None,
        };
        Ok(Self {
            nfs,
            tls,
            tls_listener,
            control,
            control_path,
            metrics,
        })
    }
}

async fn bind_tcp(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), ProxyError> {
    let bind_error = |cause| ProxyError::Bind { addr, cause };
    let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
    let bound = listener.local_addr().map_err(bind_error)?;
    Ok((listener, bound))
}

/// Serves `stack` on `listeners` until `shutdown` is cancelled, then
/// drains the calls in flight and writes back what the settings ask.
pub async fn serve(
    cfg: &Config,
    listeners: Listeners,
    stack: Stack,
    shutdown: CancellationToken,
    on_ready: impl FnOnce(&Ready),
) -> Result<(), ProxyError> {
    let Listeners {
        nfs,
        tls,
        tls_listener,
        control: control_listener,
        control_path,
        metrics,
    } = listeners;
    let stack = Arc::new(stack);
    let addr = nfs.as_ref().map(|(_, a)| *a);
    let front = Arc::new(FrontEnd::new(
        stack.top.clone(),
        cfg.export.clone(),
        addr.map_or(0, |a| a.port()),
        vec![stack.ext.clone()],
    ));
    let stats = Arc::new(ServerStats::default());
    let budget = Arc::new(MemoryBudget::new(
        cfg.limits.buffer_memory,
        u64::from(cfg.limits.records.max_record),
    ));
    let ready = Ready {
        addr,
        export: cfg.export.clone(),
        control: control_path.clone(),
        upstream: stack.top.describe(),
        cache: cfg.cache.as_ref().map(|c| c.dir.display().to_string()),
        tls_addr: tls_listener.as_ref().map(|(_, a)| *a),
        tls_name: tls.as_ref().map(|t| t.identity.name().to_string()),
        mount: cfg.mount.clone(),
    };
    // The FUSE front end: live before the proxy says it is ready.
    let mount = match &cfg.mount {
        Some(dir) => {
            let opts = gvfs_fuse::MountOptions {
                dir: dir.clone(),
                attr_timeout: cfg.attr_timeout.unwrap_or(KERNEL_ATTR_TIMEOUT),
                source: format!("gvfs:{}", stack.top.describe()),
                read_ahead: cfg.mount_readahead,
                trace: cfg.mount_trace.clone(),
                // With --mount-keep none nothing outlives the process, so
                // nothing is kept for a successor either.
                state_dir: cfg.mount_keep.then(|| match &cfg.cache {
                    Some(c) => c.dir.join("fuse"),
                    None => config::default_state_dir_for_mount(dir),
                }),
                // Under systemd with a file descriptor store, the store
                // holds the connection, and no keeper runs.
                fd_store: cfg.mount_keep && gvfs_fuse::fdstore::offered(),
                stored: cfg.mount_stored.clone(),
                keeper: match std::env::current_exe() {
                    Ok(exe) if cfg.mount_keep => Some(exe),
                    Ok(_) => None,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot find this binary to run the mount's keeper: the mount ends with this process");
                        None
                    }
                },
            };
            Some(Arc::new(
                gvfs_fuse::Mount::start(stack.top.clone(), &opts).await?,
            ))
        }
        None => None,
    };
    // Write-back jobs walk the layers top first.
    let jobs = Arc::new(writeback::Jobs::new(stack.top_down()));
    if stack.cache.is_some() {
        writeback::on_signals(jobs.clone()).map_err(ProxyError::Signals)?;
    }
    let handing_over = Arc::new(AtomicBool::new(false));
    let status = Arc::new(StatusSource {
        ready: ready.clone(),
        front: front.clone(),
        server: stats.clone(),
        budget: budget.clone(),
        stack: stack.clone(),
        jobs: jobs.clone(),
        mount: mount.clone(),
        started: Instant::now(),
        shutdown: shutdown.clone(),
        handing_over: handing_over.clone(),
    });
    if let Some((listener, at)) = metrics {
        let source = status.clone();
        let snapshot: metrics::Snapshot = Arc::new(move || serde_json::json!(source.stats()));
        tokio::spawn(metrics::serve(listener, snapshot, shutdown.clone()));
        tracing::info!(%at, "serving Prometheus metrics at /metrics");
    }
    let control_task = tokio::spawn(control::serve(
        control_listener,
        control_path,
        move |req: &Value| status.handle(req),
        shutdown.clone(),
    ));
    tracing::info!(addr = ?addr, upstream = %ready.upstream, export = %ready.export, "serving");
    on_ready(&ready);

    let tasks = TaskTracker::new();
    let shared = Shared {
        front,
        stats,
        budget,
        shutdown: shutdown.clone(),
        tasks: tasks.clone(),
    };
    let tls_task = match (tls_listener, &tls) {
        (Some((l, at)), Some(side)) => {
            tracing::info!(%at, name = side.identity.name(), "accepting gvfs:// peers over TLS");
            Some(tokio::spawn(server::serve(
                l,
                Security::Tls(side.clone()),
                cfg.limits,
                shared.clone(),
            )))
        }
        _ => None,
    };
    match nfs {
        Some((nfs, _)) => {
            server::serve(nfs, Security::Plain { starttls: tls }, cfg.limits, shared).await;
        }
        None => shutdown.cancelled().await,
    }
    if let Some(t) = tls_task {
        let _ = t.await;
    }
    shutdown::drain(&tasks, cfg.drain_timeout).await;
    let paused = match &mount {
        Some(m) => m.stop(cfg.drain_timeout).await == gvfs_fuse::Stopped::Paused,
        None => false,
    };
    if paused || handing_over.load(Ordering::Relaxed) {
        // The next proxy owns the cache and its dirty data: no exit
        // write-back to hold the paused guests up.
        shutdown::close(&stack).await;
        shutdown.cancel();
        let _ = control_task.await;
        if !paused {
            tracing::info!("handed over: the next proxy serves from here on");
            return Ok(());
        }
        tracing::info!(
            "the mount is paused, not ended: start the same command again to go on; \
             `gvfsctl unmount` ends it"
        );
        // No destructor may run now: a FUSE reply dropped unanswered
        // would answer EIO to a paused guest.
        // SAFETY: _exit ends the process at once; nothing runs after it.
        unsafe { libc::_exit(0) };
    }
    shutdown::write_back_and_close(&stack, &jobs, cfg.cache.as_ref()).await;
    shutdown.cancel();
    let _ = control_task.await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gvfs_upstream::dir::DirUpstream;

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
            server: config::ServerSection {
                listen: Some("127.0.0.1:0".into()),
                upstream: Some(format!("nfs://127.0.0.1:{nfs}/export?mountport={mount}")),
                control: Some(dir.path().join("c.sock")),
                connect_timeout_secs: Some(1),
                ..config::ServerSection::default()
            },
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
