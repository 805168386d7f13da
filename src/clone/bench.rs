//! What a run shares and builds its scenarios from: the guest kit, the
//! golden images in nfs-ganesha's export with the image-server proxy in
//! front of it (and the PKI), and, per scenario, fresh WAN links and node
//! proxies ([`Node`]) with empty caches, cloned through one at a time or
//! several at once.
//!
//! The golden memory images are checked against their SHA-256 from when
//! they were built ([`Bench::check_golden`]): no clone may change them.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use gvfs_wanlink::WanLink;

use super::census::Census;
use super::guest::{self, GuestKit, MEM, Watch};
use super::images::{build_images, busy_image, image_dir, take_census, write_bulk};
use super::procedure::{Procedure, Source, Timing, clone_one};
use super::report::{CloneRecord, NodeFetch};
use super::scenario::{ATTR_TIMEOUT_SECS, Dedup, MAX_NODES, MIB, Scenario, Settings};
use crate::bench::shm_tempdir;
use crate::fuse::MountPoint;
use crate::process::run_ok;
use crate::site::{Origin, Site, Tier, node_name};
use crate::{Ganesha, Proxy, ProxyArgs};

/// A loopback address for node `n` (< [`MAX_NODES`])'s proxy (QEMU reaches
/// it on port 111).
pub(super) fn node_ip(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, 60 + u8::try_from(n.min(MAX_NODES)).unwrap_or(0))
}

/// What the run shares: the kit, the image server and its proxy, the PKI.
pub(super) struct Bench<'a> {
    pub(super) settings: &'a Settings,
    pub(super) kit: GuestKit,
    rt: tokio::runtime::Runtime,
    /// nfs-ganesha with the golden images, the image-server proxy in front
    /// of it and the PKI.
    site: Site,
    server_tls: SocketAddr,
    ca: PathBuf,
    pub(super) work: tempfile::TempDir,
    /// SHA-256 of each golden `mem` (image 1 first) when it was built.
    golden_sums: Vec<String>,
    /// The golden images' census (with two images or more).
    pub(super) census: Option<Census>,
    /// Whether `gvfs-proxy` takes `--no-dedup` (a proxy from before dedup
    /// across images does not, and has no dedup to turn off).
    pub(super) no_dedup_flag: bool,
    /// Whether `gvfs-proxy` takes `--mount-trace` (the storms need it).
    pub(super) mount_trace_flag: bool,
}

/// A compute node's (or the LAN's) proxy and its cache directory, and the
/// proxy's FUSE mount when it has one (lazy clones read through it).
pub(super) struct Node {
    pub(super) proxy: Proxy,
    /// What it was started with: the same command starts it again.
    args: ProxyArgs,
    mount: Option<MountPoint>,
    _cache: tempfile::TempDir,
    /// Where its control socket is, the same across restarts.
    _control: tempfile::TempDir,
}

/// How a node's proxy is restarted ([`Node::restart`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Restart {
    /// Killed -9, then the same command.
    Kill,
    /// SIGTERM, then the same command.
    Stop,
    /// This build's `gvfs-proxy --take-over` while it runs.
    Upgrade,
}

impl Drop for Node {
    /// A mounting proxy is stopped with SIGTERM, which unmounts; the mount
    /// point's own drop clears what a proxy that did not stop left.
    fn drop(&mut self) {
        if let Some(mount) = &self.mount {
            if let Err(e) = self.proxy.terminate() {
                eprintln!(
                    "stopping the node proxy of {}: {e:#}",
                    mount.path().display()
                );
            }
            if mount.is_mounted().unwrap_or(false) {
                eprintln!(
                    "{} was still mounted after the node proxy stopped",
                    mount.path().display()
                );
            }
        }
    }
}

impl Node {
    /// Where its FUSE mount is, when it has one.
    pub(super) fn mount_path(&self) -> Option<&std::path::Path> {
        self.mount.as_ref().map(MountPoint::path)
    }

    /// A lazy clone of `image` through its mount (the disk through its NFS
    /// listener, as copy-first clones).
    pub(super) fn lazy(&self, image: usize) -> Result<Procedure> {
        let mount = self
            .mount
            .as_ref()
            .context("a lazy clone needs a node proxy with a FUSE mount")?;
        let files = mount.path().join(image_dir(image));
        Ok(Procedure::Lazy {
            backing: Source::Local(files.clone()).backing(),
            files,
        })
    }

    /// Restarts its proxy as `how` says, on the same address: its
    /// clients (guests on its mount, nodes behind a LAN proxy) see a stall.
    pub(super) fn restart(&mut self, how: Restart) -> Result<()> {
        self.args.listen = self.proxy.addr();
        match how {
            Restart::Kill => {
                self.proxy.kill();
                self.proxy = Proxy::spawn(self.args.clone())?;
            }
            Restart::Stop => {
                let status = self.proxy.terminate()?;
                ensure!(
                    status.success(),
                    "the proxy stopped with {status}; output:\n{}",
                    self.proxy.output()
                );
                self.proxy = Proxy::spawn(self.args.clone())?;
            }
            Restart::Upgrade => {
                // This build replaces whatever binary ran.
                self.args.binary = None;
                let next = Proxy::spawn(self.args.clone().arg("--take-over"))?;
                let status = self.proxy.wait_exit(Duration::from_secs(60))?;
                ensure!(
                    status.success(),
                    "the replaced proxy exited with {status}; output:\n{}",
                    self.proxy.output()
                );
                self.proxy = next;
            }
        }
        if let Some(m) = &self.mount {
            ensure!(
                m.is_mounted()?,
                "{} is not mounted after a restart",
                m.path().display()
            );
        }
        Ok(())
    }

    /// The NFS source of `image` through this node's proxy.
    pub(super) fn source(&self, image: usize) -> Source {
        Source::Nfs {
            host: self.proxy.ip(),
            nfs_port: self.proxy.port(),
            mount_port: self.proxy.port(),
            export: self.proxy.export().to_owned(),
            dir: image_dir(image),
        }
    }
}

impl<'a> Bench<'a> {
    /// Prepares the kit, starts nfs-ganesha with the golden images built in
    /// its export (and counted), and the image-server proxy in front of it.
    pub(super) fn start(settings: &'a Settings) -> Result<Self> {
        let kit = GuestKit::prepare(&guest::kit_dir()).context("preparing the guest kit")?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        // nfs-ganesha with the golden images built in its export (and
        // counted) before the image-server proxy starts; nodes reach it
        // over TLS with the certificate `node`, mapped to its own identity,
        // and so do a storm's nodes, each with its own (`node1`..).
        let mut census = None;
        let storm_nodes = settings.storm_nodes();
        let site = Site::builder(Origin::Ganesha)
            .pki()
            .image_server(Tier::new().args(move |a| {
                (0..storm_nodes)
                    .fold(a.map_peer("node", "pass"), |a, i| {
                        a.map_peer(&node_name(i), "pass")
                    })
                    .env("RUST_LOG", "warn")
            }))
            .start_with(|export| {
                build_images(&kit, export, settings)?;
                if settings.neighbour() {
                    write_bulk(export, settings.bulk_mib)?;
                }
                census = take_census(export, settings)?;
                Ok(())
            })?;
        let pki = site.pki().context("the site has a PKI")?;
        pki.issue("node")?;
        for i in 0..storm_nodes {
            pki.issue(&node_name(i))?;
        }
        let ca = pki.ca_dir().to_path_buf();
        let server_tls = site
            .image_server()
            .tls_addr()
            .context("the image-server proxy has no listen_tls")?;
        let no_dedup_flag = proxy_takes("--no-dedup")?;
        if !no_dedup_flag {
            eprintln!("gvfs-proxy has no --no-dedup: every scenario runs its proxies as they are");
        }

        let mems: Vec<PathBuf> = (1..=settings.images)
            .chain(busy_image(settings))
            .map(|i| site.origin_dir().join(image_dir(i)).join(MEM))
            .collect();
        let golden_sums = sha256_of(&mems)?;

        Ok(Self {
            settings,
            kit,
            rt,
            site,
            server_tls,
            ca,
            work: shm_tempdir()?,
            golden_sums,
            census,
            no_dedup_flag,
            mount_trace_flag: proxy_takes("--mount-trace")?,
        })
    }

    /// Fails unless the golden `mem` of each of `images` at the origin is
    /// still what it was when it was built.
    pub(super) fn check_golden(&self, images: impl IntoIterator<Item = usize>) -> Result<()> {
        let mut images: Vec<usize> = images.into_iter().collect();
        images.sort_unstable();
        images.dedup();
        let paths: Vec<PathBuf> = images.iter().map(|&i| self.golden(i).join(MEM)).collect();
        for ((image, now), path) in images.iter().zip(sha256_of(&paths)?).zip(&paths) {
            let was = self
                .golden_sums
                .get(image - 1)
                .with_context(|| format!("no golden image {image}"))?;
            ensure!(
                &now == was,
                "the golden memory image {} changed: SHA-256 {now}, {was} when it was built",
                path.display()
            );
        }
        Ok(())
    }

    /// A WAN link listening on `listen` to `target`, as the settings shape it.
    pub(super) fn link(&self, target: SocketAddr, listen: SocketAddr) -> Result<WanLink> {
        Ok(self
            .rt
            .block_on(WanLink::start(listen, target, self.settings.link_config()))?)
    }

    /// Kills the image-server proxy (-9) and starts it again on the same
    /// addresses.
    pub(super) fn restart_image_server(&mut self) -> Result<()> {
        self.site.image_server_mut().kill_and_restart()
    }

    /// A fresh WAN link to the image-server proxy's TLS port.
    pub(super) fn wan(&self) -> Result<WanLink> {
        self.link(self.server_tls, SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
    }

    /// [`wan`](Self::wan), shaped as `config` says.
    pub(super) fn link_with(&self, config: gvfs_wanlink::LinkConfig) -> Result<WanLink> {
        let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        Ok(self
            .rt
            .block_on(WanLink::start(listen, self.server_tls, config))?)
    }

    /// A fresh proxy with empty caches, on `ip:111` when given, whose
    /// upstream is `upstream` (a `gvfs://` URL gets the node certificate),
    /// with dedup across images as `dedup` says.
    pub(super) fn node(
        &self,
        ip: Option<Ipv4Addr>,
        upstream: String,
        dedup: Dedup,
    ) -> Result<Node> {
        self.node_with(ip, upstream, false, dedup)
    }

    /// [`node`](Self::node), with a FUSE mount of its export (in a fresh
    /// empty directory) when `mount` says so.
    pub(super) fn node_with(
        &self,
        ip: Option<Ipv4Addr>,
        upstream: String,
        mount: bool,
        dedup: Dedup,
    ) -> Result<Node> {
        self.node_as(ip, upstream, mount, dedup, ("node", "2G"), |a| a)
    }

    /// [`node_with`](Self::node_with), with certificate `cert` (for a
    /// `gvfs://` upstream), a cache of `cache_size` and `more` options.
    pub(super) fn node_as(
        &self,
        ip: Option<Ipv4Addr>,
        upstream: String,
        mount: bool,
        dedup: Dedup,
        (cert, cache_size): (&str, &str),
        more: impl FnOnce(ProxyArgs) -> ProxyArgs,
    ) -> Result<Node> {
        let cache = tempfile::Builder::new().prefix("gvfs-node-").tempdir()?;
        let control = tempfile::Builder::new().prefix("gvfs-ctl-").tempdir()?;
        let mount = mount.then(MountPoint::new).transpose()?;
        let mut args = ProxyArgs::new(upstream.clone())
            .control(control.path().join("control.sock"))
            .cache(cache.path(), cache_size)
            .attr_timeout(ATTR_TIMEOUT_SECS)
            .env("RUST_LOG", "warn");
        if let Some(ip) = ip {
            args = args.listen(SocketAddr::from((ip, 111)));
        }
        if upstream.starts_with("gvfs://") {
            args = args.tls(&self.ca, cert);
        }
        if let Some(m) = &mount {
            // No read-ahead: a guest's page fault asks for its page, and
            // the node fetches the 8 KiB piece around it.
            args = args.mount(m.path()).mount_readahead("0");
        }
        if dedup == Dedup::Off && self.no_dedup_flag {
            args = args.no_dedup();
        }
        let args = more(args);
        let node = Node {
            proxy: Proxy::spawn(args.clone())?,
            args,
            mount,
            _cache: cache,
            _control: control,
        };
        if let Some(m) = &node.mount {
            ensure!(
                m.is_mounted()?,
                "{} is not mounted after the node proxy said it was ready; output:\n{}",
                m.path().display(),
                node.proxy.output()
            );
        }
        Ok(node)
    }

    /// A LAN proxy (certificate `node` towards the image server) whose TLS
    /// listener takes `peers`, each mapped to its own identity; returns it
    /// and the `gvfs://` URL nodes reach it at.
    pub(super) fn lan_tls(&self, link: &WanLink, peers: &[String]) -> Result<(Node, String)> {
        let upstream = Self::gvfs_url(link);
        let lan = self.node_as(None, upstream, false, Dedup::Off, ("node", "2G"), |a| {
            peers.iter().fold(
                a.listen_tls(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))),
                |a, p| a.map_peer(p, "pass"),
            )
        })?;
        let tls: SocketAddr = lan
            .proxy
            .status()?
            .listen_tls
            .context("the LAN proxy has no TLS listener")?
            .parse()
            .context("the LAN proxy's TLS listener")?;
        Ok((lan, format!("gvfs://{tls}/export?name=node")))
    }

    /// The upstream URL of a proxy that reaches the image server through
    /// `link`.
    pub(super) fn gvfs_url(link: &WanLink) -> String {
        format!("gvfs://{}/export?name=image-server", link.local_addr())
    }

    /// A copy-first clone from `source`; `wan` reads the WAN's bytes since
    /// the clone's start, when there is a WAN.
    pub(super) fn clone(
        &self,
        source: &Source,
        wan: Option<&(dyn Fn() -> u64 + Sync)>,
    ) -> Result<Timing> {
        clone_one(
            &self.kit,
            &Procedure::CopyFirst(source.clone()),
            self.work.path(),
            self.settings.clone_timeout,
            Watch {
                bytes: wan,
                ..Watch::default()
            },
        )
    }

    /// A copy-first clone of `image` through `node`, with the node's
    /// file-cache counters over it; `wan` reads the WAN's bytes since the
    /// clone's start.
    pub(super) fn clone_through(
        &self,
        node: &Node,
        image: usize,
        wan: &(dyn Fn() -> u64 + Sync),
    ) -> Result<Timing> {
        let before = NodeFetch::from_stats(&node.proxy.stats()?);
        let mut t = self.clone(&node.source(image), Some(wan))?;
        let after = NodeFetch::from_stats(&node.proxy.stats()?);
        t.fetch = Some(after.since(&before));
        Ok(t)
    }

    /// Calls the image-server proxy has answered, by procedure (`MOUNT`
    /// and the gvfs extension program's `ext` included): what crossed the
    /// WAN.
    pub(super) fn wan_calls(&self) -> Result<BTreeMap<String, u64>> {
        let st = self.site.image_server().status()?;
        let mut calls = st.nfs_calls;
        calls.insert("MOUNT".into(), st.front.mount_calls);
        calls.insert("ext".into(), st.front.ext_calls);
        Ok(calls)
    }

    /// The WAN calls answered since `before` ([`wan_calls`](Self::wan_calls)),
    /// the procedures with none left out.
    pub(super) fn wan_calls_since(
        &self,
        before: &BTreeMap<String, u64>,
    ) -> Result<BTreeMap<String, u64>> {
        Ok(self
            .wan_calls()?
            .into_iter()
            .map(|(k, v)| {
                let was = before.get(&k).copied().unwrap_or(0);
                (k, v.saturating_sub(was))
            })
            .filter(|(_, v)| *v > 0)
            .collect())
    }

    /// The directory of golden image `image` in ganesha's export.
    pub(super) fn golden(&self, image: usize) -> PathBuf {
        self.site.origin_dir().join(image_dir(image))
    }

    /// nfs-ganesha, the origin.
    pub(super) fn ganesha(&self) -> Result<&Ganesha> {
        self.site
            .ganesha()
            .context("the site's origin is not nfs-ganesha")
    }
}

/// Runs `clone` for each of `nodes` at once, each on its own thread;
/// returns what each returned (its timing), in the order of `nodes`.
pub(super) fn at_once<N: Sync, T: Send>(
    nodes: &[N],
    clone: impl Fn(&N) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = nodes
            .iter()
            .map(|node| scope.spawn(|| clone(node)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a clone thread panicked")))
            })
            .collect::<Result<Vec<_>>>()
    })
}

/// The records of clones run at once in `scenario`, which moved `wan`
/// bytes across the WAN in all (each is given an equal share).
pub(super) fn parallel_records(
    scenario: Scenario,
    timings: &[Timing],
    wan: u64,
) -> Vec<CloneRecord> {
    let per_clone = wan / timings.len().max(1) as u64;
    let records = timings
        .iter()
        .enumerate()
        .map(|(i, t)| t.record(scenario.label(), i + 1, 1, per_clone))
        .collect();
    let slowest = timings.iter().map(Timing::total).fold(0.0, f64::max);
    let answered = timings.iter().map(|t| t.responsive).fold(0.0, f64::max);
    eprintln!(
        "{}: {} clones at once, the last verified running after {slowest:.2} s and answering \
         after {answered:.2} s, {:.1} MiB over the WAN",
        scenario.label(),
        timings.len(),
        wan as f64 / MIB as f64
    );
    records
}

/// Whether `gvfs-proxy --help` lists `flag`.
fn proxy_takes(flag: &str) -> Result<bool> {
    let out = run_ok(
        std::process::Command::new(crate::proxy::proxy_binary()?).arg("--help"),
        Duration::from_secs(30),
    )?;
    Ok(out
        .stdout_text()
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .any(|word| word == flag))
}

/// SHA-256 digests of `paths`, in order (`sha256sum`).
fn sha256_of(paths: &[PathBuf]) -> Result<Vec<String>> {
    if paths.is_empty() {
        return Ok(Vec::new());
    }
    let out = run_ok(
        std::process::Command::new("sha256sum").args(paths),
        Duration::from_secs(600),
    )?;
    let sums: Vec<String> = out
        .stdout_text()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    ensure!(
        sums.len() == paths.len(),
        "sha256sum gave {} digests for {} files",
        sums.len(),
        paths.len()
    );
    Ok(sums)
}

/// Bytes through `link`, both ways.
pub(super) fn wire(link: &WanLink) -> u64 {
    let s = link.stats();
    s.upstream_bytes + s.downstream_bytes
}
