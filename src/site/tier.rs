//! One proxy of a [`Site`](crate::site::Site): the options a test gives it
//! ([`Tier`]) and the handle the site hands back ([`SiteProxy`]).

use std::fmt;
use std::net::SocketAddr;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, ensure};

use crate::fuse::MountPoint;
use crate::proxy::{Proxy, ProxyArgs};

/// Options the test passes through to a proxy as it is (`--attr-timeout`,
/// `--no-dedup`, `RUST_LOG`, ...), applied after the site's own.
type Configure = Arc<dyn Fn(ProxyArgs) -> ProxyArgs + Send + Sync>;

/// What a proxy of the site runs with, besides what the site gives every
/// proxy (its upstream, TLS when the site has a PKI): a block cache in a
/// fresh directory, a FUSE mount on a fresh mount point, where it listens,
/// and any other [`ProxyArgs`] option.
#[derive(Clone, Default)]
pub struct Tier {
    /// A cache, and its size (`None`: the proxy's default).
    pub(super) cache: Option<Option<String>>,
    pub(super) mount: bool,
    pub(super) listen: Option<SocketAddr>,
    configure: Option<Configure>,
}

impl fmt::Debug for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tier")
            .field("cache", &self.cache)
            .field("mount", &self.mount)
            .field("listen", &self.listen)
            .field("configure", &self.configure.is_some())
            .finish()
    }
}

impl Tier {
    /// A proxy with no cache, no mount, on a free port of 127.0.0.1.
    pub fn new() -> Self {
        Self::default()
    }

    /// `--cache-dir` (a fresh temporary directory the site owns) and
    /// `--cache-size size`; a cache brings the file cache and the metadata
    /// layer with it.
    pub fn cache(mut self, size: &str) -> Self {
        self.cache = Some(Some(size.to_owned()));
        self
    }

    /// `--cache-dir` (a fresh temporary directory) at the proxy's default
    /// cache size.
    pub fn cache_dir(mut self) -> Self {
        self.cache = Some(None);
        self
    }

    /// `--mount` on a fresh mount point the site owns; the proxy is ready
    /// once its export is mounted there.
    pub fn mount(mut self) -> Self {
        self.mount = true;
        self
    }

    /// `--meta`: the metadata layer without a cache.
    pub fn meta(self) -> Self {
        self.args(ProxyArgs::meta)
    }

    /// `--listen addr` instead of a free port of 127.0.0.1.
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = Some(addr);
        self
    }

    /// Any other option: `f` gets the arguments the site made and returns
    /// them with its own (called after any `args` given before).
    pub fn args(mut self, f: impl Fn(ProxyArgs) -> ProxyArgs + Send + Sync + 'static) -> Self {
        let f: Configure = match self.configure.take() {
            Some(before) => Arc::new(move |a| f(before(a))),
            None => Arc::new(f),
        };
        self.configure = Some(f);
        self
    }

    /// Starts the proxy `name` on `args` as these options say.
    pub(super) fn spawn(&self, name: &str, mut args: ProxyArgs) -> Result<SiteProxy> {
        if let Some(listen) = self.listen {
            args = args.listen(listen);
        }
        let cache = match &self.cache {
            Some(size) => {
                let dir = tempfile::Builder::new()
                    .prefix(&format!("gvfs-site-{name}-"))
                    .tempdir()?;
                args = match size {
                    Some(size) => args.cache(dir.path(), size),
                    None => args.cache_dir(dir.path()),
                };
                Some(dir)
            }
            None => None,
        };
        if let Some(configure) = &self.configure {
            args = configure(args);
        }
        let (proxy, mount) = if self.mount {
            let mnt = MountPoint::new()?;
            let proxy = crate::fuse::mounted(args.clone(), &mnt)?;
            args = args.mount(mnt.path());
            (proxy, Some(mnt))
        } else {
            (Proxy::spawn(args.clone())?, None)
        };
        let tls = proxy
            .status()?
            .listen_tls
            .map(|a| a.parse())
            .transpose()
            .with_context(|| format!("{name}'s TLS listener"))?;
        Ok(SiteProxy {
            name: name.to_owned(),
            args,
            proxy,
            tls,
            mount,
            cache,
        })
    }
}

/// A running proxy of the site: the [`Proxy`] (which it dereferences to,
/// for its address, URLs and typed [`Stats`](crate::Stats)), its name, its
/// TLS listener, its mount and its cache directory.
///
/// Dropped, a proxy with a mount is asked to stop (SIGTERM, which
/// unmounts), any other is killed; the mount point clears what is left.
#[derive(Debug)]
pub struct SiteProxy {
    name: String,
    args: ProxyArgs,
    proxy: Proxy,
    tls: Option<SocketAddr>,
    // Dropped after the proxy: see `Drop`.
    mount: Option<MountPoint>,
    cache: Option<tempfile::TempDir>,
}

impl SiteProxy {
    /// Its name in the site (and its certificate's, with a PKI):
    /// `image-server`, `lan`, `node1`, ...
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The arguments it was started with (its `--listen` and
    /// `--listen-tls` as asked: port 0 for a free one).
    pub fn args(&self) -> &ProxyArgs {
        &self.args
    }

    /// The proxy, to stop or restart it.
    pub fn proxy_mut(&mut self) -> &mut Proxy {
        &mut self.proxy
    }

    /// Kills it (-9) and starts the same command again on the same
    /// addresses: its peers reconnect.
    pub fn kill_and_restart(&mut self) -> Result<()> {
        self.proxy.kill();
        let mut args = self.args.clone();
        args.listen = self.proxy.addr();
        if let Some(tls) = self.tls {
            args = args.set_flag("--listen-tls", tls.to_string());
        }
        self.proxy = Proxy::spawn(args)?;
        if let Some(m) = &self.mount {
            ensure!(m.is_mounted()?, "{} lost its mount in a restart", self.name);
        }
        Ok(())
    }

    /// Its TLS listener (`--listen-tls`), when the site has a PKI.
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls
    }

    /// Its mount point, when it mounts its export.
    pub fn mount_point(&self) -> Option<&MountPoint> {
        self.mount.as_ref()
    }

    /// `name` under its mount point; fails without a mount.
    pub fn path(&self, name: &str) -> Result<PathBuf> {
        Ok(self
            .mount
            .as_ref()
            .with_context(|| format!("{} has no mount", self.name))?
            .path()
            .join(name))
    }

    /// Its cache directory, when it has a cache.
    pub fn cache_dir(&self) -> Option<&Path> {
        self.cache.as_ref().map(tempfile::TempDir::path)
    }
}

impl Deref for SiteProxy {
    type Target = Proxy;

    fn deref(&self) -> &Proxy {
        &self.proxy
    }
}

impl Drop for SiteProxy {
    fn drop(&mut self) {
        if let Some(mount) = &self.mount
            && self.proxy.pid().is_some()
            && let Err(e) = self.proxy.terminate()
        {
            eprintln!(
                "stopping {} (mounted on {}): {e:#}",
                self.name,
                mount.path().display()
            );
        }
    }
}
