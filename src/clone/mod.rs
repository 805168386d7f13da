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

pub mod cut;
pub mod guest;
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
use crate::libnfs::{CopyClient, nfs_url};
use crate::proxy::{gvfsctl_local, site_ca, stat};
use crate::{Ganesha, Proxy, ProxyArgs};
use guest::{CONFIG, DISK, FILES, GoldenSize, GuestKit, MEM, RamMapping, STATE, Watch};
use report::CloneRecord;
use summary::{fmt3, goals, summary};
pub use summary::{report_markdown, write_outputs};

mod stream;
use stream::{FileServer, fetch_stream};

mod outcome;
pub use outcome::{Goal, Outcome};

const MIB: u64 = 1 << 20;

/// `--attr-timeout` of the node and LAN proxies: golden images are
/// read-only, so they may answer GETATTR, LOOKUP and ACCESS from replies up
/// to a minute old (a kernel client's default `acregmax`).
pub const ATTR_TIMEOUT_SECS: u64 = 60;

/// What to run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Different golden images (seeds 1..=images).
    pub images: usize,
    /// Clones per sequence (and nodes in WAN-P).
    pub clones: usize,
    /// Size of each golden image.
    pub size: GoldenSize,
    /// Round-trip time of the emulated WAN.
    pub rtt: Duration,
    /// Its bandwidth, Mbit/s.
    pub mbit: u64,
    /// Longest a single clone may take before the run fails.
    pub clone_timeout: Duration,
    /// The scenarios to run (WAN-P cold and warm run together).
    pub scenarios: Vec<Scenario>,
    /// How long the WAN cut scenario keeps the link cut.
    pub cut_hold: Duration,
}

impl Settings {
    /// The full benchmark: 8 images of 256 MiB RAM and 384 MiB of disk
    /// files, 8 clones per sequence, 40 ms and 50 Mbit/s.
    pub fn full() -> Self {
        Self {
            images: 8,
            clones: 8,
            size: GoldenSize {
                ram_mib: 256,
                working_set_mib: 32,
                disk_files_mib: 384,
            },
            rtt: Duration::from_millis(40),
            mbit: 50,
            clone_timeout: Duration::from_secs(1800),
            scenarios: Scenario::ALL.to_vec(),
            cut_hold: Duration::from_secs(10),
        }
    }

    /// A quick run that checks the pipeline end to end: 2 small images, 2
    /// clones per sequence, 10 ms and 200 Mbit/s.
    pub fn quick() -> Self {
        Self {
            images: 2,
            clones: 2,
            size: GoldenSize {
                ram_mib: 128,
                working_set_mib: 8,
                disk_files_mib: 32,
            },
            rtt: Duration::from_millis(10),
            mbit: 200,
            clone_timeout: Duration::from_secs(300),
            scenarios: Scenario::ALL.to_vec(),
            cut_hold: Duration::from_secs(3),
        }
    }

    /// The larger guests the full benchmark also clones: one image of
    /// 2 GiB RAM (the same 32 MiB working set and disk files), cloned 3 times
    /// Local and WAN-S1, once over plain NFS, on the same link. Guest RAM is
    /// what plain NFS and the full copy move; a clone moves only its
    /// non-zero part, compressed, so the ratios to them depend on it.
    pub fn larger(&self) -> Self {
        Self {
            images: 1,
            clones: 3,
            size: GoldenSize {
                ram_mib: 2048,
                ..self.size
            },
            scenarios: vec![Scenario::Local, Scenario::WanS1, Scenario::PlainNfs],
            ..self.clone()
        }
    }

    fn link_config(&self) -> LinkConfig {
        LinkConfig::from_rtt(self.rtt, Some(self.mbit * 1_000_000))
    }

    fn bytes_per_sec(&self) -> f64 {
        self.mbit as f64 * 1e6 / 8.0
    }
}

/// The scenarios, in the order they run and are reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// Images on local disk: the copies are local, the disk is a local file.
    Local,
    /// One golden image cloned `clones` times in a row by one node.
    WanS1,
    /// `clones` different images, each cloned once by one node.
    WanS2,
    /// Like WAN-S2, through a LAN proxy that another node's clones of the
    /// same images filled first.
    WanS3,
    /// `clones` nodes behind one LAN proxy clone the same image at once,
    /// with every cache cold.
    WanPCold,
    /// The same nodes clone it again at once, with their caches warm.
    WanPWarm,
    /// Cold clones of one image with the link cut for a while in the
    /// middle ([`cut`]).
    WanCut,
    /// Baseline: copy every file of the image across the WAN as one TCP
    /// stream each (like scp), then resume from the local copies.
    FullCopy,
    /// Baseline: the copies and QEMU's disk straight from the image server
    /// over NFS across the WAN, no proxy.
    PlainNfs,
}

impl Scenario {
    /// Every scenario.
    pub const ALL: [Scenario; 9] = [
        Scenario::Local,
        Scenario::WanS1,
        Scenario::WanS2,
        Scenario::WanS3,
        Scenario::WanPCold,
        Scenario::WanPWarm,
        Scenario::WanCut,
        Scenario::FullCopy,
        Scenario::PlainNfs,
    ];

    /// The scenario named `name` (its label, or without "WAN-": `s1`,
    /// `p`, `full`, `plain`; case does not matter).
    pub fn parse(name: &str) -> Result<Self> {
        let n = name.trim().to_ascii_lowercase();
        let n = n.strip_prefix("wan-").unwrap_or(&n);
        Ok(match n {
            "local" => Scenario::Local,
            "s1" => Scenario::WanS1,
            "s2" => Scenario::WanS2,
            "s3" => Scenario::WanS3,
            "p" | "p cold" | "p warm" => Scenario::WanPCold,
            "cut" => Scenario::WanCut,
            "full" | "full copy" => Scenario::FullCopy,
            "plain" | "plain nfs" => Scenario::PlainNfs,
            _ => bail!("unknown scenario {name:?} (local, s1, s2, s3, p, cut, full, plain)"),
        })
    }

    /// The name tables and the chart use.
    pub fn label(self) -> &'static str {
        match self {
            Scenario::Local => "Local",
            Scenario::WanS1 => "WAN-S1",
            Scenario::WanS2 => "WAN-S2",
            Scenario::WanS3 => "WAN-S3",
            Scenario::WanPCold => "WAN-P cold",
            Scenario::WanPWarm => "WAN-P warm",
            Scenario::WanCut => "WAN cut",
            Scenario::FullCopy => "full copy",
            Scenario::PlainNfs => "plain NFS",
        }
    }
}

/// Where a clone's files come from.
#[derive(Debug, Clone)]
enum Source {
    /// A local directory; the golden disk is used in place as the backing file.
    Local(PathBuf),
    /// Over NFS: `nfs-cp` copies from `host` (with these ports), and QEMU's
    /// `nfs://host/...` finds the server through PORTMAP on `host:111`.
    Nfs {
        host: IpAddr,
        nfs_port: u16,
        mount_port: u16,
        export: String,
        dir: String,
    },
}

impl Source {
    fn copy(&self, name: &str, to: &Path, timeout: Duration) -> Result<()> {
        match self {
            Source::Local(dir) => {
                std::fs::copy(dir.join(name), to)
                    .with_context(|| format!("copying {name} from {}", dir.display()))?;
            }
            Source::Nfs { .. } => {
                CopyClient::NfsCp.copy(&self.url(name), &to.display().to_string(), timeout)?;
            }
        }
        Ok(())
    }

    fn url(&self, name: &str) -> String {
        match self {
            Source::Local(dir) => dir.join(name).display().to_string(),
            Source::Nfs {
                host,
                nfs_port,
                mount_port,
                export,
                dir,
            } => nfs_url(
                *host,
                *nfs_port,
                *mount_port,
                export,
                &format!("{dir}/{name}"),
            ),
        }
    }

    /// The golden disk as QEMU names it.
    fn backing(&self) -> String {
        match self {
            Source::Local(dir) => dir.join(DISK).display().to_string(),
            Source::Nfs {
                host, export, dir, ..
            } => format!("nfs://{host}{export}/{dir}/{DISK}"),
        }
    }
}

/// How long the parts of one clone took.
#[derive(Debug, Clone, Copy, Default)]
struct Timing {
    copy: f64,
    overlay: f64,
    resume: f64,
}

impl Timing {
    fn total(&self) -> f64 {
        self.copy + self.overlay + self.resume
    }
}

/// Clones from `source` into a fresh directory under `work` and resumes it.
fn clone_one(kit: &GuestKit, source: &Source, work: &Path, timeout: Duration) -> Result<Timing> {
    let dir = tempfile::Builder::new()
        .prefix("clone-")
        .tempdir_in(work)
        .context("clone directory")?;
    let start = Instant::now();
    for name in [CONFIG, MEM, STATE] {
        source.copy(name, &dir.path().join(name), timeout)?;
    }
    let copied = Instant::now();
    guest::create_overlay(&source.backing(), &dir.path().join(DISK))?;
    let overlaid = Instant::now();
    let resumed = guest::resume_clone(
        kit,
        dir.path(),
        &dir.path().join(MEM),
        RamMapping::Shared,
        timeout.saturating_sub(start.elapsed()),
        Watch::default(),
    )?;
    Ok(Timing {
        copy: (copied - start).as_secs_f64(),
        overlay: (overlaid - copied).as_secs_f64(),
        resume: resumed
            .running
            .saturating_duration_since(overlaid)
            .as_secs_f64(),
    })
}

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
}

/// A compute node's (or the LAN's) proxy and its cache directory.
struct Node {
    proxy: Proxy,
    _cache: tempfile::TempDir,
}

impl Node {
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

impl<'a> Bench<'a> {
    fn start(settings: &'a Settings) -> Result<Self> {
        let kit = GuestKit::prepare(&guest::kit_dir()).context("preparing the guest kit")?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let ganesha = Ganesha::start().context("starting nfs-ganesha")?;
        for image in 1..=settings.images {
            let dir = ganesha.export_dir().join(image_dir(image));
            let t = Instant::now();
            guest::build_golden(&kit, &dir, image as u64, settings.size)
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

        let pki = tempfile::Builder::new().prefix("gvfs-pki-").tempdir()?;
        let ca = site_ca(pki.path(), &["image-server", "node"])?;
        let server = Proxy::spawn(
            ProxyArgs::new(ganesha.upstream_url())
                .tls(&ca, "image-server")
                .arg("--listen-tls")
                .arg("127.0.0.1:0")
                .arg("--map-peer")
                .arg("node=pass")
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
        })
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
    /// upstream is `upstream` (a `gvfs://` URL gets the node certificate).
    fn node(&self, ip: Option<Ipv4Addr>, upstream: String) -> Result<Node> {
        let cache = tempfile::Builder::new().prefix("gvfs-node-").tempdir()?;
        let mut args = ProxyArgs::new(upstream.clone())
            .arg("--cache-dir")
            .arg(cache.path().display().to_string())
            .arg("--cache-size")
            .arg("2G")
            .arg("--attr-timeout")
            .arg(ATTR_TIMEOUT_SECS.to_string())
            .env("RUST_LOG", "warn");
        if let Some(ip) = ip {
            args = args.listen(SocketAddr::from((ip, 111)));
        }
        if upstream.starts_with("gvfs://") {
            args = args.tls(&self.ca, "node");
        }
        Ok(Node {
            proxy: Proxy::spawn(args)?,
            _cache: cache,
        })
    }

    fn gvfs_url(link: &WanLink) -> String {
        format!("gvfs://{}/export?name=image-server", link.local_addr())
    }

    fn clone(&self, source: &Source) -> Result<Timing> {
        clone_one(
            &self.kit,
            source,
            self.work.path(),
            self.settings.clone_timeout,
        )
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

    /// Runs `scenario`; returns its clones in order, with the stats of the
    /// first node's proxy after its first clone (for the report). WAN-S1
    /// also notes in `calls` what crossed the WAN for its first two clones.
    fn run(
        &self,
        scenario: Scenario,
        calls: &mut Vec<(String, BTreeMap<String, u64>)>,
    ) -> Result<(Vec<CloneRecord>, Option<serde_json::Value>)> {
        let s = self.settings;
        let n = s.clones;
        let image_of = |i: usize| (i % s.images) + 1;
        let mut records = Vec::new();
        let mut first_stats = None;
        let mut record = |clone: usize, image: usize, t: Timing, wan: u64| {
            eprintln!(
                "{} clone {clone} (image {image}): {:.2} s (copy {:.2}, overlay {:.2}, resume {:.2}), {:.1} MiB over the WAN",
                scenario.label(),
                t.total(),
                t.copy,
                t.overlay,
                t.resume,
                wan as f64 / MIB as f64
            );
            records.push(CloneRecord {
                scenario: scenario.label().to_owned(),
                clone,
                image,
                total_secs: t.total(),
                copy_secs: t.copy,
                overlay_secs: t.overlay,
                resume_secs: t.resume,
                wan_bytes: wan,
            });
        };
        match scenario {
            Scenario::Local => {
                for i in 0..n {
                    let t = self.clone(&Source::Local(self.golden(image_of(i))))?;
                    record(i + 1, image_of(i), t, 0);
                }
            }
            Scenario::WanS1 | Scenario::WanS2 => {
                let wan = self.wan()?;
                let node = self.node(Some(node_ip(0)), Self::gvfs_url(&wan))?;
                for i in 0..n {
                    let image = if scenario == Scenario::WanS1 {
                        1
                    } else {
                        image_of(i)
                    };
                    let before = wire(&wan);
                    let calls_before = self.wan_calls()?;
                    let t = self.clone(&node.source(image))?;
                    record(i + 1, image, t, wire(&wan) - before);
                    if i == 0 {
                        first_stats = Some(node.proxy.cache_stats_all()?);
                    }
                    if scenario == Scenario::WanS1 && i < 2 {
                        let after = self.wan_calls()?;
                        let diff = after
                            .into_iter()
                            .map(|(k, v)| {
                                let was = calls_before.get(&k).copied().unwrap_or(0);
                                (k, v.saturating_sub(was))
                            })
                            .filter(|(_, v)| *v > 0)
                            .collect();
                        let label = if i == 0 {
                            "cold (WAN-S1 #1)"
                        } else {
                            "warm (WAN-S1 #2)"
                        };
                        calls.push((label.to_owned(), diff));
                    }
                }
            }
            Scenario::WanS3 => {
                let wan = self.wan()?;
                let lan = self.node(None, Self::gvfs_url(&wan))?;
                let warmer = self.node(Some(node_ip(0)), lan.proxy.upstream_url())?;
                for i in 0..n {
                    self.clone(&warmer.source(image_of(i)))?;
                }
                drop(warmer);
                let node = self.node(Some(node_ip(1)), lan.proxy.upstream_url())?;
                for i in 0..n {
                    let before = wire(&wan);
                    let t = self.clone(&node.source(image_of(i)))?;
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
                let mut timing = self.clone(&Source::Local(local.path().to_path_buf()))?;
                timing.copy += copy;
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
                let t = self.clone(&source)?;
                record(1, 1, t, links.iter().map(wire).sum());
            }
        }
        Ok((records, first_stats))
    }

    /// WAN-P: `clones` nodes behind one LAN proxy clone image 1 at once,
    /// cold, then again, warm. Returns the clones and the LAN proxy's stats.
    fn run_parallel(&self) -> Result<(Vec<CloneRecord>, serde_json::Value)> {
        let wan = self.wan()?;
        let lan = self.node(None, Self::gvfs_url(&wan))?;
        let nodes = (0..self.settings.clones)
            .map(|i| self.node(Some(node_ip(i)), lan.proxy.upstream_url()))
            .collect::<Result<Vec<_>>>()?;
        let mut records = Vec::new();
        for scenario in [Scenario::WanPCold, Scenario::WanPWarm] {
            let before = wire(&wan);
            let timings = std::thread::scope(|scope| {
                let handles: Vec<_> = nodes
                    .iter()
                    .map(|node| scope.spawn(|| self.clone(&node.source(1))))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err(anyhow::anyhow!("a clone thread panicked")))
                    })
                    .collect::<Result<Vec<_>>>()
            })?;
            let per_clone = (wire(&wan) - before) / timings.len().max(1) as u64;
            for (i, t) in timings.iter().enumerate() {
                records.push(CloneRecord {
                    scenario: scenario.label().to_owned(),
                    clone: i + 1,
                    image: 1,
                    total_secs: t.total(),
                    copy_secs: t.copy,
                    overlay_secs: t.overlay,
                    resume_secs: t.resume,
                    wan_bytes: per_clone,
                });
            }
            let slowest = timings.iter().map(Timing::total).fold(0.0, f64::max);
            eprintln!(
                "{}: {} clones at once, the last done after {slowest:.2} s",
                scenario.label(),
                timings.len()
            );
        }
        Ok((records, lan.proxy.cache_stats_all()?))
    }
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
    let mut cuts = Vec::new();
    for scenario in Scenario::ALL {
        if !settings.scenarios.contains(&scenario) {
            continue;
        }
        match scenario {
            Scenario::WanPCold => {
                let (r, lan) = bench.run_parallel()?;
                records.extend(r);
                lan_stats = Some(lan);
            }
            Scenario::WanPWarm => {}
            Scenario::WanCut => {
                let (r, c) = bench.run_cut()?;
                records.extend(r);
                cuts = c;
            }
            _ => {
                let (r, s) = bench.run(scenario, &mut calls)?;
                records.extend(r);
                if let Some(s) = s {
                    stats.push((scenario, s));
                }
            }
        }
    }
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
        goals,
        ram_mib: settings.size.ram_mib,
        cuts,
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
