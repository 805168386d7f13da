//! What a run clones: its settings and scenarios.

use super::*;

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

    pub(super) fn link_config(&self) -> LinkConfig {
        LinkConfig::from_rtt(self.rtt, Some(self.mbit * 1_000_000))
    }

    pub(super) fn bytes_per_sec(&self) -> f64 {
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
