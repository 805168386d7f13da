//! A whole site on loopback, built from what a test names: an origin
//! (nfs-ganesha or a local directory), the image-server proxy in front of
//! it, an optional WAN link ([`gvfs_wanlink::WanLink`]) to the next hop, an
//! optional LAN proxy, node proxies, and an optional PKI that puts mutual
//! TLS 1.3 on every hop between proxies (`gvfs://`, `--listen-tls`).
//!
//! ```text
//!   node1 .. nodeN        Tier: cache, mount, any ProxyArgs option
//!        |                (gvfs:// with a PKI, else nfs://)
//!   lan-proxy (optional)
//!        |
//!   WAN link (optional)   delay and rate as LinkConfig takes them
//!        |
//!   image-server          --listen-tls with a PKI
//!        |
//!   origin                nfs-ganesha's export or dir:PATH
//! ```
//!
//! [`SiteBuilder::start`] starts the pieces bottom first and hands back a
//! [`Site`] with a typed handle per proxy ([`SiteProxy`]: its [`Proxy`],
//! address, TLS listener, mount, typed [`Stats`](crate::Stats)). Dropping
//! the site tears it down top first.

mod pki;
mod tier;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;

use anyhow::{Context, Result, bail};
use gvfs_wanlink::{LinkConfig, WanLink};

use crate::ganesha::Ganesha;
use crate::proxy::ProxyArgs;
pub use pki::Pki;
pub use tier::{SiteProxy, Tier};

/// What the image server serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// nfs-ganesha exporting a fresh directory (the usual image server).
    Ganesha,
    /// A fresh local directory, served by the image server as `dir:`.
    Dir,
}

/// The image server's name (its certificate's, with a PKI).
pub const IMAGE_SERVER: &str = "image-server";
/// The LAN proxy's name.
pub const LAN: &str = "lan-proxy";

/// Node `i`'s name (`node1` for 0).
pub fn node_name(i: usize) -> String {
    format!("node{}", i + 1)
}

/// What to start; see the module's documentation.
#[derive(Debug, Clone)]
pub struct SiteBuilder {
    origin: Origin,
    image_server: Tier,
    wan: Option<LinkConfig>,
    lan: Option<Tier>,
    nodes: Vec<Tier>,
    pki: bool,
}

/// A running site. Its pieces stop when it is dropped, top first.
pub struct Site {
    // Declared top first: fields drop in this order.
    nodes: Vec<SiteProxy>,
    lan: Option<SiteProxy>,
    wan: Option<WanLink>,
    rt: Option<tokio::runtime::Runtime>,
    image_server: SiteProxy,
    ganesha: Option<Ganesha>,
    dir: Option<tempfile::TempDir>,
    pki: Option<Pki>,
    /// The upstream URL of the hop the nodes talk to (the LAN proxy, or
    /// the image server across the WAN link when there is one).
    node_upstream: String,
}

impl Site {
    /// A site of an origin and its image server (no cache); add the rest
    /// with the builder's methods.
    pub fn builder(origin: Origin) -> SiteBuilder {
        SiteBuilder {
            origin,
            image_server: Tier::new(),
            wan: None,
            lan: None,
            nodes: Vec::new(),
            pki: false,
        }
    }

    /// The directory the origin serves (ganesha's export, or the local
    /// directory).
    pub fn origin_dir(&self) -> &Path {
        match (&self.ganesha, &self.dir) {
            (Some(g), _) => g.export_dir(),
            (None, Some(d)) => d.path(),
            (None, None) => Path::new("/nonexistent"),
        }
    }

    /// nfs-ganesha, with an [`Origin::Ganesha`].
    pub fn ganesha(&self) -> Option<&Ganesha> {
        self.ganesha.as_ref()
    }

    /// nfs-ganesha, to stop and restart it.
    pub fn ganesha_mut(&mut self) -> Option<&mut Ganesha> {
        self.ganesha.as_mut()
    }

    /// The image-server proxy.
    pub fn image_server(&self) -> &SiteProxy {
        &self.image_server
    }

    /// The image-server proxy, to restart it.
    pub fn image_server_mut(&mut self) -> &mut SiteProxy {
        &mut self.image_server
    }

    /// The LAN proxy; fails when the site has none.
    pub fn lan(&self) -> Result<&SiteProxy> {
        self.lan.as_ref().context("the site has no LAN proxy")
    }

    /// Node `i` (from 0); fails when there is no such node.
    pub fn node(&self, i: usize) -> Result<&SiteProxy> {
        self.nodes
            .get(i)
            .with_context(|| format!("the site has {} node(s), not {}", self.nodes.len(), i + 1))
    }

    /// Node `i`, to stop or restart its proxy.
    pub fn node_mut(&mut self, i: usize) -> Result<&mut SiteProxy> {
        let n = self.nodes.len();
        self.nodes
            .get_mut(i)
            .with_context(|| format!("the site has {n} node(s), not {}", i + 1))
    }

    /// The nodes, in the order they started.
    pub fn nodes(&self) -> &[SiteProxy] {
        &self.nodes
    }

    /// Every proxy, bottom first: image server, LAN proxy, nodes.
    pub fn proxies(&self) -> impl Iterator<Item = &SiteProxy> {
        std::iter::once(&self.image_server)
            .chain(&self.lan)
            .chain(&self.nodes)
    }

    /// The WAN link; fails when the site has none.
    pub fn wan(&self) -> Result<&WanLink> {
        self.wan.as_ref().context("the site has no WAN link")
    }

    /// The upstream URL the nodes are given: the LAN proxy's, else the
    /// image server's (across the WAN link when there is one); `gvfs://`
    /// with a PKI.
    pub fn node_upstream(&self) -> &str {
        &self.node_upstream
    }

    /// The PKI, when the site has one.
    pub fn pki(&self) -> Option<&Pki> {
        self.pki.as_ref()
    }

    /// Starts one more node (named `node<N+1>`) with `tier`, as the
    /// builder's nodes are started; returns it. With a PKI, the hop below
    /// maps only the nodes named at build time to their own identity
    /// (`--map-peer NAME=pass`): a node added later is squashed unless
    /// that hop's [`Tier::args`] maps it.
    pub fn add_node(&mut self, tier: Tier) -> Result<&SiteProxy> {
        let name = node_name(self.nodes.len());
        let mut args = ProxyArgs::new(self.node_upstream.clone());
        if let Some(pki) = &self.pki {
            pki.issue(&name)?;
            args = args.tls(pki.ca_dir(), &name);
        }
        let node = tier
            .spawn(&name, args)
            .with_context(|| format!("starting {name}"))?;
        self.nodes.push(node);
        self.nodes.last().context("the node just added")
    }

    /// Every proxy, top first: the nodes (last started first), the LAN
    /// proxy, the image server.
    pub fn proxies_top_first_mut(&mut self) -> impl Iterator<Item = &mut SiteProxy> {
        self.nodes
            .iter_mut()
            .rev()
            .chain(self.lan.iter_mut())
            .chain(std::iter::once(&mut self.image_server))
    }

    /// Stops every proxy with SIGTERM, top first (nodes, LAN proxy, image
    /// server); fails naming each that did not exit 0.
    pub fn stop(&mut self) -> Result<()> {
        let mut failed = Vec::new();
        for p in self.proxies_top_first_mut() {
            if p.pid().is_none() {
                continue;
            }
            let name = p.name().to_owned();
            match p.proxy_mut().terminate() {
                Ok(status) if status.success() => {}
                Ok(status) => failed.push(format!("{name} exited {status}")),
                Err(e) => failed.push(format!("{name}: {e:#}")),
            }
        }
        if !failed.is_empty() {
            bail!("stopping the site: {}", failed.join("; "));
        }
        Ok(())
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        self.nodes.clear();
        self.lan = None;
        self.wan = None;
        // The link's tasks ran on this runtime; it may be dropped inside
        // an async test, where only a background shutdown is allowed.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl SiteBuilder {
    /// The image-server proxy's options.
    pub fn image_server(mut self, tier: Tier) -> Self {
        self.image_server = tier;
        self
    }

    /// A WAN link between the image server and the next hop (the LAN
    /// proxy, else the nodes).
    pub fn wan(mut self, link: LinkConfig) -> Self {
        self.wan = Some(link);
        self
    }

    /// A LAN proxy between the image server (or the WAN link) and the
    /// nodes.
    pub fn lan(mut self, tier: Tier) -> Self {
        self.lan = Some(tier);
        self
    }

    /// One more node proxy, named `node<N>` in the order given.
    pub fn node(mut self, tier: Tier) -> Self {
        self.nodes.push(tier);
        self
    }

    /// `n` more node proxies, each with `tier`.
    pub fn nodes(mut self, n: usize, tier: Tier) -> Self {
        self.nodes.extend(std::iter::repeat_n(tier, n));
        self
    }

    /// A site CA (`gvfsctl ca`) and a certificate per proxy: every hop
    /// between proxies is mutual TLS 1.3 (`--listen-tls` below,
    /// `gvfs://HOST:PORT/export?name=BELOW` above), and each proxy maps
    /// the peers the site starts above it to their own identity
    /// (`--map-peer NAME=pass`).
    pub fn pki(mut self) -> Self {
        self.pki = true;
        self
    }

    /// Starts the site, bottom first.
    pub fn start(self) -> Result<Site> {
        self.start_with(|_| Ok(()))
    }

    /// Starts the origin, runs `prepare` on the directory it serves (to
    /// put images there before any proxy looks), then the rest.
    pub fn start_with(self, prepare: impl FnOnce(&Path) -> Result<()>) -> Result<Site> {
        let (ganesha, dir, origin_url) = match self.origin {
            Origin::Ganesha => {
                let g = Ganesha::start().context("starting nfs-ganesha")?;
                let url = g.upstream_url();
                (Some(g), None, url)
            }
            Origin::Dir => {
                let d = tempfile::Builder::new()
                    .prefix("gvfs-site-origin-")
                    .tempdir()?;
                let url = format!("dir:{}", d.path().display());
                (None, Some(d), url)
            }
        };
        let origin_dir = ganesha
            .as_ref()
            .map(|g| g.export_dir().to_path_buf())
            .or_else(|| dir.as_ref().map(|d| d.path().to_path_buf()))
            .context("the origin has a directory")?;
        prepare(&origin_dir).context("preparing the origin")?;

        let node_names: Vec<String> = (0..self.nodes.len()).map(node_name).collect();
        let pki = if self.pki {
            let mut names = vec![IMAGE_SERVER];
            if self.lan.is_some() {
                names.push(LAN);
            }
            names.extend(node_names.iter().map(String::as_str));
            Some(Pki::new(&names)?)
        } else {
            None
        };
        // The peers of the image server: the LAN proxy, else the nodes.
        let server_peers = match &self.lan {
            Some(_) => vec![LAN.to_owned()],
            None => node_names.clone(),
        };
        let tls_hop = |args: ProxyArgs, name: &str, peers: &[String]| match &pki {
            Some(pki) => peers.iter().fold(
                args.tls(pki.ca_dir(), name)
                    .listen_tls(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))),
                |a, p| a.map_peer(p, "pass"),
            ),
            None => args,
        };

        let image_server = self
            .image_server
            .spawn(
                IMAGE_SERVER,
                tls_hop(ProxyArgs::new(origin_url), IMAGE_SERVER, &server_peers),
            )
            .context("starting the image-server proxy")?;
        let server_addr = match &pki {
            Some(_) => image_server
                .tls_addr()
                .context("the image server has no TLS listener")?,
            None => image_server.addr(),
        };
        let (rt, wan) = match self.wan {
            Some(config) => {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()?;
                // On a thread of its own: the caller may be an async test,
                // inside which no runtime can block.
                let link = std::thread::scope(|s| {
                    s.spawn(|| {
                        rt.block_on(WanLink::start(
                            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
                            server_addr,
                            config,
                        ))
                    })
                    .join()
                })
                .map_err(|_| anyhow::anyhow!("starting the WAN link panicked"))?
                .context("starting the WAN link")?;
                (Some(rt), Some(link))
            }
            None => (None, None),
        };
        let below = wan.as_ref().map_or(server_addr, WanLink::local_addr);
        let url_of = |at: SocketAddr, p: &SiteProxy| match &pki {
            Some(_) => format!("gvfs://{at}/export?name={}", p.name()),
            None => p.upstream_url_at(at),
        };
        let mut node_upstream = url_of(below, &image_server);
        let lan = match &self.lan {
            Some(tier) => {
                let args = tls_hop(ProxyArgs::new(node_upstream.clone()), LAN, &node_names);
                let lan = tier.spawn(LAN, args).context("starting the LAN proxy")?;
                let at = match &pki {
                    Some(_) => lan
                        .tls_addr()
                        .context("the LAN proxy has no TLS listener")?,
                    None => lan.addr(),
                };
                node_upstream = url_of(at, &lan);
                Some(lan)
            }
            None => None,
        };
        let mut site = Site {
            nodes: Vec::new(),
            lan,
            wan,
            rt,
            image_server,
            ganesha,
            dir,
            pki,
            node_upstream,
        };
        for tier in self.nodes {
            site.add_node(tier)?;
        }
        Ok(site)
    }
}
