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
use summary::{fmt3, goals, lazy_goals, summary};
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
    /// The scenarios to run (WAN-P cold and warm run together, and so do
    /// their lazy ones; lazy WAN-S1 learned runs after lazy WAN-S1, which
    /// it needs).
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
    /// clones per sequence, 10 ms and 200 Mbit/s; every scenario, copy-first
    /// and lazy.
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
    /// Local and WAN-S1, once over plain NFS, on the same link; and lazily:
    /// Local, WAN-S1, WAN-S1 learned and WAN-P (3 nodes). Guest RAM is what
    /// plain NFS and the full copy move; a clone moves only its non-zero
    /// part, compressed, so the ratios to them depend on it.
    pub fn larger(&self) -> Self {
        Self {
            images: 1,
            clones: 3,
            size: GoldenSize {
                ram_mib: 2048,
                ..self.size
            },
            scenarios: vec![
                Scenario::Local,
                Scenario::WanS1,
                Scenario::PlainNfs,
                Scenario::LazyLocal,
                Scenario::LazyWanS1,
                Scenario::LazyWanS1Learned,
                Scenario::LazyWanPCold,
            ],
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
    /// Lazy clones ([`lazy`]) of images on local disk: each maps the golden
    /// `mem` in ganesha's export directory.
    LazyLocal,
    /// Lazy clones of one golden image, `clones` in a row by one node
    /// (through its FUSE mount): the first cold, the others warm.
    LazyWanS1,
    /// One cold lazy clone of image 1 by a fresh node over a fresh link,
    /// after lazy WAN-S1's node taught the image server which chunks of
    /// `mem` the guest touches first (its working-set profile).
    LazyWanS1Learned,
    /// Lazy clones of `clones` different images, one each, by one node.
    LazyWanS2,
    /// Lazy WAN-S2 through a LAN proxy that another node's lazy clones of
    /// the same images filled first.
    LazyWanS3,
    /// `clones` nodes (each with its own mount) behind one LAN proxy
    /// lazily clone image 1 at once, cold.
    LazyWanPCold,
    /// The same nodes do it again, warm.
    LazyWanPWarm,
    /// A cold lazy clone of image 1 with the link blackholed as QEMU
    /// resumes ([`cut`]).
    LazyWanCut,
}

impl Scenario {
    /// Every scenario, copy-first ones first.
    pub const ALL: [Scenario; 17] = [
        Scenario::Local,
        Scenario::WanS1,
        Scenario::WanS2,
        Scenario::WanS3,
        Scenario::WanPCold,
        Scenario::WanPWarm,
        Scenario::WanCut,
        Scenario::FullCopy,
        Scenario::PlainNfs,
        Scenario::LazyLocal,
        Scenario::LazyWanS1,
        Scenario::LazyWanS1Learned,
        Scenario::LazyWanS2,
        Scenario::LazyWanS3,
        Scenario::LazyWanPCold,
        Scenario::LazyWanPWarm,
        Scenario::LazyWanCut,
    ];

    /// The scenario named `name` (its label, or without "WAN-": `s1`,
    /// `p`, `full`, `plain`; a lazy one with "lazy" before: `lazy s1`,
    /// `lazy-s1`, `lazy learned`; case does not matter).
    pub fn parse(name: &str) -> Result<Self> {
        let n = name.trim().to_ascii_lowercase();
        let (lazy, n) = match n.strip_prefix("lazy") {
            Some(rest) => (true, rest.trim_start_matches([' ', '-', '_']).to_owned()),
            None => (false, n),
        };
        let n = n
            .strip_prefix("wan-")
            .or_else(|| n.strip_prefix("wan "))
            .unwrap_or(&n);
        let unknown = || {
            anyhow::anyhow!(
                "unknown scenario {name:?} (local, s1, s2, s3, p, cut, full, plain; lazy \
                 local, lazy s1, lazy learned, lazy s2, lazy s3, lazy p, lazy cut)"
            )
        };
        Ok(match (lazy, n) {
            (false, "local") => Scenario::Local,
            (false, "s1") => Scenario::WanS1,
            (false, "s2") => Scenario::WanS2,
            (false, "s3") => Scenario::WanS3,
            (false, "p" | "p cold" | "p warm") => Scenario::WanPCold,
            (false, "cut") => Scenario::WanCut,
            (false, "full" | "full copy") => Scenario::FullCopy,
            (false, "plain" | "plain nfs") => Scenario::PlainNfs,
            (true, "local") => Scenario::LazyLocal,
            (true, "s1") => Scenario::LazyWanS1,
            (true, "learned" | "s1 learned") => Scenario::LazyWanS1Learned,
            (true, "s2") => Scenario::LazyWanS2,
            (true, "s3") => Scenario::LazyWanS3,
            (true, "p" | "p cold" | "p warm") => Scenario::LazyWanPCold,
            (true, "cut") => Scenario::LazyWanCut,
            _ => return Err(unknown()),
        })
    }

    /// A comma-separated list of [`parse`](Self::parse)'s names; `lazy`
    /// alone stands for every lazy scenario, `copy` for every copy-first
    /// one.
    pub fn parse_list(list: &str) -> Result<Vec<Self>> {
        let mut out = Vec::new();
        for name in list.split(',').filter(|n| !n.trim().is_empty()) {
            match name.trim().to_ascii_lowercase().as_str() {
                "lazy" => out.extend(Self::ALL.into_iter().filter(|s| s.is_lazy())),
                "copy" | "copy-first" => out.extend(Self::ALL.into_iter().filter(|s| !s.is_lazy())),
                _ => out.push(Self::parse(name)?),
            }
        }
        Ok(out)
    }

    /// Whether its clones are lazy ([`lazy`]).
    pub fn is_lazy(self) -> bool {
        matches!(
            self,
            Scenario::LazyLocal
                | Scenario::LazyWanS1
                | Scenario::LazyWanS1Learned
                | Scenario::LazyWanS2
                | Scenario::LazyWanS3
                | Scenario::LazyWanPCold
                | Scenario::LazyWanPWarm
                | Scenario::LazyWanCut
        )
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
            Scenario::LazyLocal => "lazy Local",
            Scenario::LazyWanS1 => "lazy WAN-S1",
            Scenario::LazyWanS1Learned => "lazy WAN-S1 learned",
            Scenario::LazyWanS2 => "lazy WAN-S2",
            Scenario::LazyWanS3 => "lazy WAN-S3",
            Scenario::LazyWanPCold => "lazy WAN-P cold",
            Scenario::LazyWanPWarm => "lazy WAN-P warm",
            Scenario::LazyWanCut => "lazy WAN cut",
        }
    }
}

/// Whether a record's scenario label is a lazy one.
pub fn is_lazy_label(label: &str) -> bool {
    label.starts_with("lazy ")
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

/// How a clone gets its memory image.
#[derive(Debug, Clone)]
enum Procedure {
    /// The paper's: copy `vm.json`, `mem` and `state` from the source and
    /// map the copy of `mem` shared.
    CopyFirst(Source),
    /// Copy `vm.json` and `state` from `files` (plain file copies: a
    /// directory, or a node's FUSE mount) and map `files/mem` itself,
    /// private and read-only; the overlay's backing file is `backing`.
    Lazy { files: PathBuf, backing: String },
}

/// How long the parts of one clone took, and what crossed the WAN.
#[derive(Debug, Clone)]
struct Timing {
    /// When the clone started (its first copy).
    start: Instant,
    copy: f64,
    overlay: f64,
    /// QEMU start to the guest verified running.
    resume: f64,
    /// Start to the guest's answer to its request.
    responsive: f64,
    /// WAN bytes since the start when the guest was verified running, and
    /// when it answered (`None` without a WAN).
    wan_running: Option<u64>,
    wan_responsive: Option<u64>,
    /// Lazy clones: start to the node holding the whole memory image.
    whole_local: Option<f64>,
    /// Lazy clones: the node's file-cache counters over the clone.
    fetch: Option<NodeFetch>,
    /// Error lines of the guest's console and QEMU's log
    /// ([`cut::console_errors`]).
    errors: Vec<String>,
}

impl Timing {
    /// From a clone's instants: its start, copies done, overlay made, and
    /// its resume; `wan` when its watch read the WAN's bytes.
    fn new(start: Instant, copied: Instant, overlaid: Instant, r: &Resumed, wan: bool) -> Self {
        Self {
            start,
            copy: (copied - start).as_secs_f64(),
            overlay: (overlaid - copied).as_secs_f64(),
            resume: r.running.saturating_duration_since(overlaid).as_secs_f64(),
            responsive: r.answered.saturating_duration_since(start).as_secs_f64(),
            wan_running: wan.then_some(r.bytes_running),
            wan_responsive: wan.then_some(r.bytes_answered),
            whole_local: None,
            fetch: None,
            errors: Vec::new(),
        }
    }

    /// Start to the guest verified running: the clone time.
    fn total(&self) -> f64 {
        self.copy + self.overlay + self.resume
    }

    /// The same clone started `secs` earlier (a full copy's stream first).
    fn after(mut self, secs: f64) -> Self {
        self.copy += secs;
        self.responsive += secs;
        self
    }

    /// Its record; `wan` the bytes across the WAN for the whole clone.
    fn record(&self, scenario: &str, clone: usize, image: usize, wan: u64) -> CloneRecord {
        CloneRecord {
            scenario: scenario.to_owned(),
            clone,
            image,
            total_secs: self.total(),
            copy_secs: self.copy,
            overlay_secs: self.overlay,
            resume_secs: self.resume,
            wan_bytes: wan,
            responsive_secs: Some(self.responsive),
            wan_running_bytes: self.wan_running,
            wan_responsive_bytes: self.wan_responsive,
            whole_local_secs: self.whole_local,
            fetch: self.fetch,
        }
    }

    /// Says what the clone took on stderr.
    fn log(&self, scenario: &str, clone: usize, image: usize, wan: u64) {
        let wan_at =
            |b: Option<u64>| b.map_or("-".to_owned(), |b| format!("{:.1}", b as f64 / MIB as f64));
        eprintln!(
            "{scenario} clone {clone} (image {image}): {:.2} s (copy {:.2}, overlay {:.2}, resume {:.2}), \
             answered at {:.2} s, {:.1} MiB over the WAN ({} MiB when running, {} when answered){}",
            self.total(),
            self.copy,
            self.overlay,
            self.resume,
            self.responsive,
            wan as f64 / MIB as f64,
            wan_at(self.wan_running),
            wan_at(self.wan_responsive),
            self.whole_local.map_or(String::new(), |w| format!(
                ", memory image whole on the node at {w:.2} s"
            ))
        );
        for e in &self.errors {
            eprintln!("{scenario} clone {clone}: {e}");
        }
    }
}

/// Clones as `procedure` says into a fresh directory under `work` and
/// resumes it (watched by `watch`). Timed from the first copy.
fn clone_one(
    kit: &GuestKit,
    procedure: &Procedure,
    work: &Path,
    timeout: Duration,
    watch: Watch<'_>,
) -> Result<Timing> {
    let dir = tempfile::Builder::new()
        .prefix("clone-")
        .tempdir_in(work)
        .context("clone directory")?;
    let start = Instant::now();
    let (ram, mapping, backing) = match procedure {
        Procedure::CopyFirst(source) => {
            for name in [CONFIG, MEM, STATE] {
                source.copy(name, &dir.path().join(name), timeout)?;
            }
            (dir.path().join(MEM), RamMapping::Shared, source.backing())
        }
        Procedure::Lazy { files, backing } => {
            for name in [CONFIG, STATE] {
                std::fs::copy(files.join(name), dir.path().join(name))
                    .with_context(|| format!("copying {name} from {}", files.display()))?;
            }
            (files.join(MEM), RamMapping::Private, backing.clone())
        }
    };
    let copied = Instant::now();
    guest::create_overlay(&backing, &dir.path().join(DISK))?;
    let overlaid = Instant::now();
    let resumed = guest::resume_clone(
        kit,
        dir.path(),
        &ram,
        mapping,
        timeout.saturating_sub(start.elapsed()),
        watch,
    )?;
    let mut timing = Timing::new(start, copied, overlaid, &resumed, watch.bytes.is_some());
    timing.errors = cut::log_errors(dir.path());
    Ok(timing)
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
    /// SHA-256 of each golden `mem` (image 1 first) when it was built.
    golden_sums: Vec<String>,
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
        Ok(Procedure::Lazy {
            files: mount.path().join(image_dir(image)),
            backing: self.source(image).backing(),
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

        let mems: Vec<PathBuf> = (1..=settings.images)
            .map(|i| ganesha.export_dir().join(image_dir(i)).join(MEM))
            .collect();
        let golden_sums = sha256_of(&mems)?;

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
            golden_sums,
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
    /// upstream is `upstream` (a `gvfs://` URL gets the node certificate).
    fn node(&self, ip: Option<Ipv4Addr>, upstream: String) -> Result<Node> {
        self.node_with(ip, upstream, false)
    }

    /// [`node`](Self::node), with a FUSE mount of its export (in a fresh
    /// empty directory) when `mount` says so.
    fn node_with(&self, ip: Option<Ipv4Addr>, upstream: String, mount: bool) -> Result<Node> {
        let cache = tempfile::Builder::new().prefix("gvfs-node-").tempdir()?;
        let mount = mount.then(MountPoint::new).transpose()?;
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
        if let Some(m) = &mount {
            args = args.arg("--mount").arg(m.path().display().to_string());
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
    /// first two clones.
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
        let label = scenario.label();
        let mut record = |clone: usize, image: usize, t: Timing, wan: u64| {
            t.log(label, clone, image, wan);
            records.push(t.record(label, clone, image, wan));
        };
        match scenario {
            Scenario::Local => {
                for i in 0..n {
                    let t = self.clone(&Source::Local(self.golden(image_of(i))), None)?;
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
                    let t = self.clone(&node.source(image), Some(&|| wire(&wan) - before))?;
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
                let lan = self.node(None, Self::gvfs_url(&wan))?;
                let warmer = self.node(Some(node_ip(0)), lan.proxy.upstream_url())?;
                for i in 0..n {
                    self.clone(&warmer.source(image_of(i)), None)?;
                }
                drop(warmer);
                let node = self.node(Some(node_ip(1)), lan.proxy.upstream_url())?;
                for i in 0..n {
                    let before = wire(&wan);
                    let t = self.clone(&node.source(image_of(i)), Some(&|| wire(&wan) - before))?;
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
        let lan = self.node(None, Self::gvfs_url(&wan))?;
        let nodes = (0..self.settings.clones)
            .map(|i| self.node(Some(node_ip(i)), lan.proxy.upstream_url()))
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
                let (r, s) = bench.run(scenario, &mut calls)?;
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
