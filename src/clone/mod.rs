//! The clone benchmark: an unmodified VMM (QEMU) clones and resumes VMs
//! whose golden images live on a far image server, through gvfs, as in
//! section 4.3 of the GVFS paper (Figure 6, Table 1).
//!
//! **A clone** copies the golden image's config, memory image and device
//! state into a fresh local directory, creates a local qcow2 overlay whose
//! backing file is the golden disk reached over NFS (`nfs://` through a
//! client proxy listening on 127.0.0.N:111), starts QEMU with `-incoming`,
//! `cont`s it and waits until the guest's serial counter continues from the
//! golden one's with the right disk digest ([`guest::resume_clone`]). It is
//! timed from the first copy to that line.
//!
//! **Topology**: nfs-ganesha holds the golden images; the image-server
//! proxy in front of it accepts TLS peers; a [`WanLink`] (40 ms RTT,
//! 50 Mbit/s by default, shared by every connection across it) carries the
//! tunnel; a client proxy per compute node (each on its own loopback
//! address, all on this machine) has a block cache and a file cache, and
//! uses the metadata files made by `gvfsctl meta gen` (compress-and-copy for
//! `mem` and `state`, a zero map for the disk) and an attribute cache
//! ([`ATTR_TIMEOUT_SECS`]). A LAN proxy, when there is one, sits between the
//! nodes and the WAN.
//!
//! **Scenarios** (names from the paper): see [`Scenario`]. Each WAN scenario
//! gets a fresh link (its byte counters are the scenario's) and fresh
//! proxies (cold caches). One more is not the paper's: [`cut`], the link
//! cut for some seconds in the middle of a cold clone.
//!
//! **Lazy clones** ([`lazy`]; the scenarios named "lazy ..."): the same
//! scenarios with a clone that copies only `vm.json` and `state` and maps
//! the golden `mem` itself, privately and read-only, from the node proxy's
//! FUSE mount (`gvfs-proxy --mount`): pages cross when the guest touches
//! them. The copy-first clone above stays the paper's procedure and the
//! baseline.
//!
//! **Every clone** is timed to the guest verified running (the clone time)
//! and to its answer to a request that reads the `boot/` files from its
//! memory (time to responsiveness, [`guest::resume_clone`]).
//!
//! **Dedup across images**: the golden images share what real ones do, the
//! kernel and system files (in their disks and, read at boot, in their
//! memory), each with its own working set and data ([`guest::files`]).
//! Once they are built, [`census`] counts what they share and the least
//! each WAN-S2 clone can move when its proxy copies blocks it holds in
//! other images. The "... dedup" scenarios run WAN-S1, WAN-S2, WAN-S3 and
//! lazy WAN-S2 again with the proxies' dedup on; every other scenario runs
//! its node and LAN proxies with `--no-dedup` ([`Dedup`]).

pub mod census;
pub mod cut;
pub mod guest;
pub mod lazy;
pub mod report;
mod summary;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use gvfs_wanlink::{LinkConfig, WanLink};

use crate::bench::{loadavg, shm_tempdir};
use crate::fuse::MountPoint;
use crate::libnfs::{CopyClient, nfs_url};
use crate::process::run_ok;
use crate::proxy::{gvfsctl_local, site_ca, stat};
use crate::{Ganesha, Proxy, ProxyArgs};
use guest::{CONFIG, DISK, FILES, GoldenSize, GuestKit, MEM, RamMapping, Resumed, STATE, Watch};
use report::{CloneRecord, NodeFetch};
use summary::{dedup_goals, fmt3, goals, lan_fill_note, lazy_goals, summary};
pub use summary::{report_markdown, write_outputs};

mod stream;
use stream::{FileServer, fetch_stream};

mod outcome;
mod procedure;
mod scenario;
use census::Census;
pub use outcome::{Goal, Outcome};
use procedure::{Procedure, Source, Timing, clone_one};
pub use scenario::{Dedup, Scenario, Settings, is_lazy_label};

const MIB: u64 = 1 << 20;

/// `--attr-timeout` of the node and LAN proxies: golden images are
/// read-only, so they may answer GETATTR, LOOKUP and ACCESS from replies up
/// to a minute old (a kernel client's default `acregmax`).
pub const ATTR_TIMEOUT_SECS: u64 = 60;

/// Most nodes (clones in WAN-P): their addresses are 127.0.0.60 and up.
pub const MAX_NODES: usize = 64;

/// A loopback address for node `n` (< [`MAX_NODES`])'s proxy (QEMU reaches
/// it on port 111).
fn node_ip(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, 60 + u8::try_from(n.min(MAX_NODES)).unwrap_or(0))
}

/// The address plain NFS reaches the image server at through the WAN.
const PLAIN_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 58);

/// What the run shares: the kit, the image server and its proxy, the PKI.
struct Bench<'a> {
    settings: &'a Settings,
    kit: GuestKit,
    rt: tokio::runtime::Runtime,
    ganesha: Ganesha,
    _server: Proxy,
    server_tls: SocketAddr,
    ca: PathBuf,
    work: tempfile::TempDir,
    _pki: tempfile::TempDir,
    /// SHA-256 of each golden `mem` (image 1 first) when it was built.
    golden_sums: Vec<String>,
    /// The golden images' census (with two images or more).
    census: Option<Census>,
    /// Whether `gvfs-proxy` takes `--no-dedup` (a proxy from before dedup
    /// across images does not, and has no dedup to turn off).
    no_dedup_flag: bool,
}

/// A compute node's (or the LAN's) proxy and its cache directory, and the
/// proxy's FUSE mount when it has one (lazy clones read through it).
struct Node {
    proxy: Proxy,
    mount: Option<MountPoint>,
    _cache: tempfile::TempDir,
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
    /// A lazy clone of `image` through its mount (the disk through its NFS
    /// listener, as copy-first clones).
    fn lazy(&self, image: usize) -> Result<Procedure> {
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

    fn source(&self, image: usize) -> Source {
        Source::Nfs {
            host: self.proxy.ip(),
            nfs_port: self.proxy.port(),
            mount_port: self.proxy.port(),
            export: self.proxy.export().to_owned(),
            dir: image_dir(image),
        }
    }
}

fn image_dir(image: usize) -> String {
    format!("vm{image}")
}

/// Builds the golden images of `settings` in `root` (`vm1`, `vm2`, ...),
/// each with its metadata files (compress-and-copy with block hashes for
/// `mem` and `state`, a zero map for the disk).
fn build_images(kit: &GuestKit, root: &Path, settings: &Settings) -> Result<()> {
    for image in 1..=settings.images {
        let dir = root.join(image_dir(image));
        let t = Instant::now();
        guest::build_golden(kit, &dir, image as u64, settings.size)
            .with_context(|| format!("building golden image {image}"))?;
        for (file, compress) in [(MEM, true), (STATE, true), (DISK, false)] {
            let p = dir.join(file).display().to_string();
            let mut args = vec!["meta", "gen", p.as_str()];
            if compress {
                args.push("--compress");
            }
            gvfsctl_local(&args)?;
        }
        eprintln!(
            "golden image {image}: built in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// The images in the order WAN-S2 clones them (image 1 first), then any it
/// does not clone.
fn clone_order(settings: &Settings) -> Vec<usize> {
    let mut order: Vec<usize> = (0..settings.clones)
        .map(|i| (i % settings.images) + 1)
        .collect();
    order.extend(1..=settings.images);
    let mut seen = std::collections::BTreeSet::new();
    order.retain(|&i| seen.insert(i));
    order
}

/// The census of the golden images in `root` ([`census`]), when there are
/// two or more to share anything.
fn take_census(root: &Path, settings: &Settings) -> Result<Option<Census>> {
    if settings.images < 2 {
        return Ok(None);
    }
    let images: Vec<(usize, PathBuf)> = clone_order(settings)
        .into_iter()
        .map(|i| (i, root.join(image_dir(i))))
        .collect();
    let census = Census::take(&images).context("the census of the golden images")?;
    eprintln!("census of the golden images: {:.1} s", census.secs);
    Ok(Some(census))
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

/// Builds the golden images of `settings` (in a temporary directory, no
/// NFS server, no proxy) and counts them ([`census`]); runs no scenario.
pub fn run_census(settings: &Settings) -> Result<Census> {
    ensure!(
        settings.images >= 2,
        "a census needs two images or more, to share anything"
    );
    let kit = GuestKit::prepare(&guest::kit_dir()).context("preparing the guest kit")?;
    let root = tempfile::Builder::new()
        .prefix("gvfs-census-")
        .tempdir()
        .context("a directory for the golden images")?;
    build_images(&kit, root.path(), settings)?;
    take_census(root.path(), settings)?.context("no census")
}

impl<'a> Bench<'a> {
    fn start(settings: &'a Settings) -> Result<Self> {
        let kit = GuestKit::prepare(&guest::kit_dir()).context("preparing the guest kit")?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let ganesha = Ganesha::start().context("starting nfs-ganesha")?;
        build_images(&kit, ganesha.export_dir(), settings)?;
        let census = take_census(ganesha.export_dir(), settings)?;
        let no_dedup_flag = proxy_takes("--no-dedup")?;
        if !no_dedup_flag {
            eprintln!("gvfs-proxy has no --no-dedup: every scenario runs its proxies as they are");
        }

        let mems: Vec<PathBuf> = (1..=settings.images)
            .map(|i| ganesha.export_dir().join(image_dir(i)).join(MEM))
            .collect();
        let golden_sums = sha256_of(&mems)?;

        let pki = tempfile::Builder::new().prefix("gvfs-pki-").tempdir()?;
        let ca = site_ca(pki.path(), &["image-server", "node"])?;
        let server = Proxy::spawn(
            ProxyArgs::new(ganesha.upstream_url())
                .tls(&ca, "image-server")
                .listen_tls(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
                .map_peer("node", "pass")
                .env("RUST_LOG", "warn"),
        )?;
        let server_tls = server.status()?["listen_tls"]
            .as_str()
            .context("the image-server proxy has no listen_tls")?
            .parse()?;
        Ok(Self {
            settings,
            kit,
            rt,
            ganesha,
            _server: server,
            server_tls,
            ca,
            work: shm_tempdir()?,
            _pki: pki,
            golden_sums,
            census,
            no_dedup_flag,
        })
    }

    /// Fails unless the golden `mem` of each of `images` at the origin is
    /// still what it was when it was built.
    fn check_golden(&self, images: impl IntoIterator<Item = usize>) -> Result<()> {
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

    fn link(&self, target: SocketAddr, listen: SocketAddr) -> Result<WanLink> {
        Ok(self
            .rt
            .block_on(WanLink::start(listen, target, self.settings.link_config()))?)
    }

    /// A fresh WAN link to the image-server proxy's TLS port.
    fn wan(&self) -> Result<WanLink> {
        self.link(self.server_tls, SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
    }

    /// A fresh proxy with empty caches, on `ip:111` when given, whose
    /// upstream is `upstream` (a `gvfs://` URL gets the node certificate),
    /// with dedup across images as `dedup` says.
    fn node(&self, ip: Option<Ipv4Addr>, upstream: String, dedup: Dedup) -> Result<Node> {
        self.node_with(ip, upstream, false, dedup)
    }

    /// [`node`](Self::node), with a FUSE mount of its export (in a fresh
    /// empty directory) when `mount` says so.
    fn node_with(
        &self,
        ip: Option<Ipv4Addr>,
        upstream: String,
        mount: bool,
        dedup: Dedup,
    ) -> Result<Node> {
        let cache = tempfile::Builder::new().prefix("gvfs-node-").tempdir()?;
        let mount = mount.then(MountPoint::new).transpose()?;
        let mut args = ProxyArgs::new(upstream.clone())
            .cache(cache.path(), "2G")
            .attr_timeout(ATTR_TIMEOUT_SECS)
            .env("RUST_LOG", "warn");
        if let Some(ip) = ip {
            args = args.listen(SocketAddr::from((ip, 111)));
        }
        if upstream.starts_with("gvfs://") {
            args = args.tls(&self.ca, "node");
        }
        if let Some(m) = &mount {
            // No read-ahead: a guest's page fault asks for its page, and
            // the node fetches the 8 KiB piece around it.
            args = args.mount(m.path()).mount_readahead("0");
        }
        if dedup == Dedup::Off && self.no_dedup_flag {
            args = args.no_dedup();
        }
        let node = Node {
            proxy: Proxy::spawn(args)?,
            mount,
            _cache: cache,
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

    fn gvfs_url(link: &WanLink) -> String {
        format!("gvfs://{}/export?name=image-server", link.local_addr())
    }

    /// A copy-first clone from `source`; `wan` reads the WAN's bytes since
    /// the clone's start, when there is a WAN.
    fn clone(&self, source: &Source, wan: Option<&(dyn Fn() -> u64 + Sync)>) -> Result<Timing> {
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
    fn clone_through(
        &self,
        node: &Node,
        image: usize,
        wan: &(dyn Fn() -> u64 + Sync),
    ) -> Result<Timing> {
        let before = NodeFetch::from_stats(&node.proxy.cache_stats_all()?);
        let mut t = self.clone(&node.source(image), Some(wan))?;
        let after = NodeFetch::from_stats(&node.proxy.cache_stats_all()?);
        t.fetch = Some(after.since(&before));
        Ok(t)
    }

    /// Calls the image-server proxy has answered, by procedure (`MOUNT`
    /// and the gvfs extension program's `ext` included): what crossed the
    /// WAN.
    fn wan_calls(&self) -> Result<BTreeMap<String, u64>> {
        let st = self._server.status()?;
        let mut calls: BTreeMap<String, u64> = st["nfs_calls"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
                    .collect()
            })
            .unwrap_or_default();
        calls.insert("MOUNT".into(), stat(&st, "mount_calls"));
        calls.insert("ext".into(), stat(&st, "ext_calls"));
        Ok(calls)
    }

    fn golden(&self, image: usize) -> PathBuf {
        self.ganesha.export_dir().join(image_dir(image))
    }

    /// Runs copy-first `scenario`; returns its clones in order, with the
    /// stats of the first node's proxy after its first clone (for the
    /// report). WAN-S1 also notes in `calls` what crossed the WAN for its
    /// first two clones; WAN-S3 (and its dedup twin) notes in `notes` what
    /// filling its LAN proxy moved across the WAN.
    fn run(
        &self,
        scenario: Scenario,
        calls: &mut Vec<(String, BTreeMap<String, u64>)>,
        notes: &mut Vec<String>,
    ) -> Result<(Vec<CloneRecord>, Option<serde_json::Value>)> {
        let s = self.settings;
        let n = s.clones;
        let image_of = |i: usize| (i % s.images) + 1;
        let mut records = Vec::new();
        let mut first_stats = None;
        let label = scenario.label();
        let mut record = |clone: usize, image: usize, t: Timing, wan: u64| {
            t.log(label, clone, image, wan);
            records.push(t.record(label, clone, image, wan));
        };
        let dedup = scenario.dedup();
        match scenario.twin() {
            Scenario::Local => {
                for i in 0..n {
                    let t = self.clone(&Source::Local(self.golden(image_of(i))), None)?;
                    record(i + 1, image_of(i), t, 0);
                }
            }
            Scenario::WanS1 | Scenario::WanS2 => {
                let wan = self.wan()?;
                let node = self.node(Some(node_ip(0)), Self::gvfs_url(&wan), dedup)?;
                for i in 0..n {
                    let image = if scenario.twin() == Scenario::WanS1 {
                        1
                    } else {
                        image_of(i)
                    };
                    let before = wire(&wan);
                    let calls_before = self.wan_calls()?;
                    let t = self.clone_through(&node, image, &|| wire(&wan) - before)?;
                    record(i + 1, image, t, wire(&wan) - before);
                    if i == 0 {
                        first_stats = Some(node.proxy.cache_stats_all()?);
                    }
                    if scenario == Scenario::WanS1 && i < 2 {
                        let label = if i == 0 {
                            "cold (WAN-S1 #1)"
                        } else {
                            "warm (WAN-S1 #2)"
                        };
                        calls.push((label.to_owned(), self.wan_calls_since(&calls_before)?));
                    }
                }
            }
            Scenario::WanS3 => {
                let wan = self.wan()?;
                let lan = self.node(None, Self::gvfs_url(&wan), dedup)?;
                let warmer = self.node(Some(node_ip(0)), lan.proxy.upstream_url(), dedup)?;
                for i in 0..n {
                    self.clone(&warmer.source(image_of(i)), None)?;
                }
                drop(warmer);
                notes.push(lan_fill_note(
                    label,
                    wire(&wan),
                    &lan.proxy.cache_stats_all()?,
                ));
                let node = self.node(Some(node_ip(1)), lan.proxy.upstream_url(), dedup)?;
                for i in 0..n {
                    let before = wire(&wan);
                    let t = self.clone_through(&node, image_of(i), &|| wire(&wan) - before)?;
                    record(i + 1, image_of(i), t, wire(&wan) - before);
                    if i == 0 {
                        first_stats = Some(node.proxy.cache_stats_all()?);
                    }
                }
            }
            Scenario::WanPCold | Scenario::WanPWarm => {
                bail!("WAN-P runs through run_parallel")
            }
            Scenario::WanCut => bail!("WAN cut runs through run_cut"),
            Scenario::FullCopy => {
                let files = FileServer::start(self.golden(1))?;
                let wan = self.link(files.addr, SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
                let local = tempfile::Builder::new()
                    .prefix("full-copy-")
                    .tempdir_in(self.work.path())?;
                let t = Instant::now();
                for name in FILES {
                    fetch_stream(wan.local_addr(), name, &local.path().join(name))?;
                }
                let copy = t.elapsed().as_secs_f64();
                let timing = self
                    .clone(
                        &Source::Local(local.path().to_path_buf()),
                        Some(&|| wire(&wan)),
                    )?
                    .after(copy);
                record(1, 1, timing, wire(&wan));
            }
            Scenario::PlainNfs => {
                let g = &self.ganesha;
                let portmap = SocketAddr::from((Ipv4Addr::LOCALHOST, 111));
                let links = [
                    self.link(portmap, SocketAddr::from((PLAIN_IP, 111)))?,
                    self.link(g.nfs_addr(), SocketAddr::from((PLAIN_IP, g.nfs_port())))?,
                    self.link(
                        SocketAddr::new(g.ip(), g.mount_port()),
                        SocketAddr::from((PLAIN_IP, g.mount_port())),
                    )?,
                ];
                let source = Source::Nfs {
                    host: IpAddr::V4(PLAIN_IP),
                    nfs_port: g.nfs_port(),
                    mount_port: g.mount_port(),
                    export: "/export".to_owned(),
                    dir: image_dir(1),
                };
                let all = || links.iter().map(wire).sum::<u64>();
                let t = self.clone(&source, Some(&all))?;
                record(1, 1, t, all());
            }
            lazy => bail!("{} runs through run_lazy", lazy.label()),
        }
        Ok((records, first_stats))
    }

    /// The WAN calls answered since `before` ([`wan_calls`](Self::wan_calls)),
    /// the procedures with none left out.
    fn wan_calls_since(&self, before: &BTreeMap<String, u64>) -> Result<BTreeMap<String, u64>> {
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

    /// WAN-P: `clones` nodes behind one LAN proxy clone image 1 at once,
    /// cold, then again, warm. Returns the clones and the LAN proxy's stats.
    fn run_parallel(&self) -> Result<(Vec<CloneRecord>, serde_json::Value)> {
        let wan = self.wan()?;
        let lan = self.node(None, Self::gvfs_url(&wan), Dedup::Off)?;
        let nodes = (0..self.settings.clones)
            .map(|i| self.node(Some(node_ip(i)), lan.proxy.upstream_url(), Dedup::Off))
            .collect::<Result<Vec<_>>>()?;
        let mut records = Vec::new();
        for scenario in [Scenario::WanPCold, Scenario::WanPWarm] {
            let before = wire(&wan);
            let bytes = || wire(&wan) - before;
            let timings = at_once(&nodes, |node| self.clone(&node.source(1), Some(&bytes)))?;
            records.extend(parallel_records(scenario, &timings, wire(&wan) - before));
        }
        Ok((records, lan.proxy.cache_stats_all()?))
    }
}

/// Runs `clone` for each of `nodes` at once, each on its own thread;
/// returns their timings in the order of `nodes`.
fn at_once(nodes: &[Node], clone: impl Fn(&Node) -> Result<Timing> + Sync) -> Result<Vec<Timing>> {
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
fn parallel_records(scenario: Scenario, timings: &[Timing], wan: u64) -> Vec<CloneRecord> {
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
fn wire(link: &WanLink) -> u64 {
    let s = link.stats();
    s.upstream_bytes + s.downstream_bytes
}

/// Runs every scenario with `settings`.
pub fn run(settings: &Settings) -> Result<Outcome> {
    ensure!(
        settings.images >= 1 && settings.clones >= 1 && settings.mbit > 0,
        "images, clones and bandwidth must be at least 1"
    );
    ensure!(
        settings.clones <= MAX_NODES,
        "at most {MAX_NODES} clones per sequence (each WAN-P node takes a loopback address)"
    );
    let load_start = loadavg();
    let started = Instant::now();
    let bench = Bench::start(settings)?;
    let mut records = Vec::new();
    let mut stats = Vec::new();
    let mut calls = Vec::new();
    let mut lan_stats = None;
    let mut lazy_lan_stats = None;
    let mut cuts = Vec::new();
    let mut notes = Vec::new();
    let mut dedup_notes = Vec::new();
    let mut profile = None;
    let mut golden_checks = 0;
    let wanted = |s: Scenario| settings.scenarios.contains(&s);
    for scenario in Scenario::ALL {
        // Lazy WAN-S1 learned needs lazy WAN-S1's node: they run together.
        let wanted = wanted(scenario)
            || (scenario == Scenario::LazyWanS1 && wanted(Scenario::LazyWanS1Learned));
        if !wanted {
            continue;
        }
        let from = records.len();
        match scenario {
            Scenario::WanPCold => {
                let (r, lan) = bench.run_parallel()?;
                records.extend(r);
                lan_stats = Some(lan);
            }
            Scenario::WanPWarm | Scenario::LazyWanPWarm | Scenario::LazyWanS1Learned => {}
            Scenario::WanCut => {
                let (r, c) = bench.run_cut()?;
                records.extend(r);
                cuts.extend(c);
            }
            Scenario::LazyWanPCold => {
                let (r, lan) = bench.run_lazy_parallel()?;
                records.extend(r);
                lazy_lan_stats = Some(lan);
            }
            Scenario::LazyWanCut => {
                let (r, c) = bench.run_lazy_cut()?;
                records.extend(r);
                cuts.extend(c);
            }
            Scenario::LazyWanS1 => {
                let learned = settings.scenarios.contains(&Scenario::LazyWanS1Learned);
                let (r, s) = bench.run_lazy_s1(learned, &mut calls, &mut notes, &mut profile)?;
                records.extend(r);
                stats.extend(s);
            }
            lazy if lazy.is_lazy() => {
                let (r, s) = bench.run_lazy(lazy)?;
                records.extend(r);
                if let Some(s) = s {
                    stats.push((lazy, s));
                }
            }
            _ => {
                let (r, s) = bench.run(scenario, &mut calls, &mut dedup_notes)?;
                records.extend(r);
                if let Some(s) = s {
                    stats.push((scenario, s));
                }
            }
        }
        if scenario.is_lazy() && records.len() > from {
            bench.check_golden(records[from..].iter().map(|r| r.image))?;
            golden_checks += 1;
        }
    }
    bench.check_golden(1..=settings.images)?;
    golden_checks += 1;
    let golden = bench.golden(1);
    let zstd_mem = zstd_size(&golden.join(MEM))?;
    let zstd_state = zstd_size(&golden.join(STATE))?;
    let disk_read = stats
        .iter()
        .find(|(s, _)| *s == Scenario::WanS1)
        .map_or(0, |(_, v)| stat(v, "cache.fetched_bytes"));
    let floor = (zstd_mem + zstd_state + disk_read) as f64 / settings.bytes_per_sec();
    let floor = Floor {
        secs: floor,
        zstd_mem,
        zstd_state,
        disk_read,
    };
    let goals = goals(settings, &records, &floor);
    let lazy_goals = lazy_goals(settings, &records, &floor);
    let dedup_goals = dedup_goals(settings, &records, bench.census.as_ref());
    if !bench.no_dedup_flag && records.iter().any(|r| r.scenario.ends_with(" dedup")) {
        dedup_notes.push(
            "This gvfs-proxy has no `--no-dedup`: the scenarios without dedup ran the same \
             proxies as their dedup twins."
                .to_owned(),
        );
    }
    let load = format!(
        "load average {load_start} at the start, {} at the end; {:.0} s in all",
        loadavg(),
        started.elapsed().as_secs_f64()
    );
    let mut outcome = Outcome {
        records,
        markdown: String::new(),
        client_stats: stats,
        wan_calls: calls,
        lan_stats,
        lazy_lan_stats,
        goals,
        lazy_goals,
        ram_mib: settings.size.ram_mib,
        cuts,
        notes,
        profile,
        golden_checks,
        census: bench.census.clone(),
        dedup_goals,
        dedup_notes,
    };
    outcome.markdown = summary(settings, &outcome, &floor, &load);
    Ok(outcome)
}

/// The least time a cold clone can take on the link.
struct Floor {
    secs: f64,
    zstd_mem: u64,
    zstd_state: u64,
    disk_read: u64,
}

/// The size of `path` compressed as one zstd stream at level 3.
fn zstd_size(path: &Path) -> Result<u64> {
    struct Count(u64);
    impl Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut count = Count(0);
    zstd::stream::copy_encode(f, &mut count, 3).context("zstd")?;
    Ok(count.0)
}
