//! What a run clones: its settings and scenarios.

use std::time::Duration;

use anyhow::Result;
use gvfs_wanlink::LinkConfig;

use super::guest::GoldenSize;

/// `--attr-timeout` of the node and LAN proxies: golden images are
/// read-only, so they may answer GETATTR, LOOKUP and ACCESS from replies up
/// to a minute old (a kernel client's default `acregmax`).
pub const ATTR_TIMEOUT_SECS: u64 = 60;

/// Most nodes (clones in WAN-P): their addresses are 127.0.0.60 and up.
pub const MAX_NODES: usize = 64;

/// One MiB: the unit of image sizes and of the byte counts reported.
pub(super) const MIB: u64 = 1 << 20;

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
    /// Arguments for this executable to run as a storm's replay child
    /// (`clone::replay::replay_if_asked` must run in it first): none for
    /// the bench's own `main`; a test binary names the test that calls it.
    pub replay_args: Vec<String>,
    /// The neighbour's bulk file, MiB.
    pub bulk_mib: u64,
    /// What lazy restart does.
    pub restart: RestartPlan,
}

impl Settings {
    /// The full benchmark: 8 images of 256 MiB RAM and 384 MiB of disk
    /// files (half of them system files, the same on every image, 40 MiB of
    /// which the guest reads at boot beside its own 32 MiB: about half of
    /// each memory image's non-zero pages are in the others too), 8 clones
    /// per sequence, 40 ms and 50 Mbit/s.
    pub fn full() -> Self {
        Self {
            images: 8,
            clones: 8,
            size: GoldenSize {
                ram_mib: 256,
                working_set_mib: 32,
                system_mib: 40,
                system_disk_mib: 192,
                disk_files_mib: 384,
            },
            rtt: Duration::from_millis(40),
            mbit: 50,
            clone_timeout: Duration::from_secs(1800),
            scenarios: Scenario::ALL
                .into_iter()
                .filter(|&s| s != Scenario::LazyStorm4 && s != Scenario::LazyRestart)
                .collect(),
            cut_hold: Duration::from_secs(10),
            replay_args: Vec::new(),
            bulk_mib: 1024,
            restart: RestartPlan::bench(),
        }
    }

    /// A quick run that checks the pipeline end to end: 2 small images, 2
    /// clones per sequence, 10 ms and 200 Mbit/s; every scenario, copy-first
    /// and lazy, but lazy WAN-S2 dedup, and of the storms only lazy storm 4
    /// (`tests/clone.rs` counts one golden check per lazy run of its own
    /// list).
    pub fn quick() -> Self {
        Self {
            images: 2,
            clones: 2,
            size: GoldenSize {
                ram_mib: 128,
                working_set_mib: 8,
                system_mib: 8,
                system_disk_mib: 16,
                disk_files_mib: 32,
            },
            rtt: Duration::from_millis(10),
            mbit: 200,
            clone_timeout: Duration::from_secs(300),
            scenarios: Scenario::ALL
                .into_iter()
                .filter(|&s| s != Scenario::LazyWanS2Dedup)
                .filter(|s| s.storm_size().is_none_or(|n| n == 4))
                .collect(),
            cut_hold: Duration::from_secs(3),
            replay_args: Vec::new(),
            bulk_mib: 64,
            restart: RestartPlan::quick(),
        }
    }

    /// The larger guests the full benchmark also clones: one image of
    /// 2 GiB RAM (the same working set, system files and disk files), cloned 3 times
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

    /// Whether a neighbour scenario runs.
    pub(super) fn neighbour(&self) -> bool {
        self.scenarios
            .iter()
            .any(|s| matches!(s, Scenario::LazyNeighbour | Scenario::LazyNeighbourQuiet))
    }

    /// Nodes of the largest storm to run (0 without one).
    pub(super) fn storm_nodes(&self) -> usize {
        self.scenarios
            .iter()
            .filter_map(|s| s.storm_size())
            .max()
            .unwrap_or(0)
    }

    pub(super) fn link_config(&self) -> LinkConfig {
        self.link_config_at(self.mbit)
    }

    /// The WAN's shape at `mbit` Mbit/s instead.
    pub(super) fn link_config_at(&self, mbit: u64) -> LinkConfig {
        LinkConfig::from_rtt(self.rtt, Some(mbit * 1_000_000))
    }

    pub(super) fn bytes_per_sec(&self) -> f64 {
        self.mbit as f64 * 1e6 / 8.0
    }
}

/// What "lazy restart" does.
#[derive(Debug, Clone)]
pub struct RestartPlan {
    /// Guests cloned lazily through the node, all running throughout.
    pub guests: usize,
    /// Kill -9s of the node proxy while the guests are being cloned and
    /// resumed (its fetches under way), each followed by the same command.
    pub early_kills: usize,
    /// Kill -9s of the node proxy, each followed by the same command.
    pub kills: usize,
    /// SIGTERMs of the node proxy, each followed by the same command.
    pub stops: usize,
    /// Hot upgrades of the node proxy (`--take-over`).
    pub upgrades: usize,
    /// Kill -9s of the LAN proxy, each followed by the same command.
    pub lan_kills: usize,
    /// Kill -9s of the image server's proxy, likewise.
    pub server_kills: usize,
    /// The WAN's bandwidth in this scenario, Mbit/s.
    pub mbit: u64,
    /// The longest wait before a restart (each is drawn from 0.2 s to
    /// this, by `seed`).
    pub max_wait: Duration,
    /// Seeds the waits.
    pub seed: u64,
}

impl RestartPlan {
    /// The quick run's: one guest, one restart of each kind.
    pub fn quick() -> Self {
        Self {
            guests: 1,
            early_kills: 0,
            kills: 1,
            stops: 1,
            upgrades: 1,
            lan_kills: 1,
            server_kills: 1,
            mbit: 20,
            max_wait: Duration::from_secs(1),
            seed: 37,
        }
    }

    /// The benchmark's: eight guests; three kill -9s while they start, ten
    /// kill -9s, ten graceful restarts, a hot upgrade, a LAN kill and an
    /// image-server kill.
    pub fn bench() -> Self {
        Self {
            guests: 8,
            early_kills: 3,
            kills: 10,
            stops: 10,
            upgrades: 1,
            lan_kills: 1,
            server_kills: 1,
            mbit: 20,
            max_wait: Duration::from_secs(10),
            seed: 37,
        }
    }
}

/// The scenarios, in the order they run and are reported.
///
/// Every scenario but the "... dedup" ones runs its node and LAN proxies
/// with `--no-dedup`: they fetch every block of an image they do not hold
/// in that image, as before dedup across images. A "... dedup" scenario is
/// its twin ([`Scenario::twin`]) with the proxies' defaults (dedup on: a
/// block another cached image holds is copied, not fetched), on fresh
/// proxies and a fresh link of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// Images on local disk: the copies are local, the disk is a local file.
    Local,
    /// One golden image cloned `clones` times in a row by one node.
    WanS1,
    /// WAN-S1 with dedup on: what dedup costs where there is nothing to
    /// share across images.
    WanS1Dedup,
    /// `clones` different images, each cloned once by one node.
    WanS2,
    /// WAN-S2 with dedup on: each image after the first should bring only
    /// what the earlier ones do not hold ([`census`]).
    WanS2Dedup,
    /// Like WAN-S2, through a LAN proxy that another node's clones of the
    /// same images filled first.
    WanS3,
    /// WAN-S3 with dedup on, at the LAN proxy and the node.
    WanS3Dedup,
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
    /// Lazy WAN-S2 with dedup on.
    LazyWanS2Dedup,
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
    /// Lazy WAN-S1's first clone, recorded ([`trace`](super::trace)) and
    /// replayed by 1 node behind a fresh LAN proxy over a fresh link, once
    /// the image server holds the profile ([`storm`](super::storm)).
    LazyStorm1,
    /// The same, 4 nodes at once (the quick run's storm).
    LazyStorm4,
    /// 8 nodes at once.
    LazyStorm8,
    /// 32 nodes at once.
    LazyStorm32,
    /// 64 nodes at once.
    LazyStorm64,
    /// A cold lazy clone of a guest that never goes quiet (`gvfs.busy=N`:
    /// a tmpfs of random data read, forks and allocations every 0.1 s) by
    /// a fresh node over a fresh link ([`busy`](super::busy)).
    LazyBusy,
    /// The busy guest again, by another fresh node, once the first sent
    /// its working-set profile (its learning window closed).
    LazyBusyLearned,
    /// A learned lazy clone of image 1 by node A while node B copies a
    /// bulk file through the same LAN proxy ([`neighbour`](super::neighbour)).
    LazyNeighbour,
    /// The same clone with no copy beside it.
    LazyNeighbourQuiet,
    /// Lazy clones left running while their node and LAN proxies are
    /// killed and restarted ([`restart`](super::restart)).
    LazyRestart,
}

/// Whether a node or LAN proxy copies blocks it holds in other images
/// instead of fetching them (`gvfs-proxy`'s default; `--no-dedup` turns it
/// off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dedup {
    /// The proxy's default.
    On,
    /// `--no-dedup`.
    Off,
}

impl Scenario {
    /// Every scenario, copy-first ones first; a dedup one right after its
    /// twin.
    pub const ALL: [Scenario; 31] = [
        Scenario::Local,
        Scenario::WanS1,
        Scenario::WanS1Dedup,
        Scenario::WanS2,
        Scenario::WanS2Dedup,
        Scenario::WanS3,
        Scenario::WanS3Dedup,
        Scenario::WanPCold,
        Scenario::WanPWarm,
        Scenario::WanCut,
        Scenario::FullCopy,
        Scenario::PlainNfs,
        Scenario::LazyLocal,
        Scenario::LazyWanS1,
        Scenario::LazyWanS1Learned,
        Scenario::LazyWanS2,
        Scenario::LazyWanS2Dedup,
        Scenario::LazyWanS3,
        Scenario::LazyWanPCold,
        Scenario::LazyWanPWarm,
        Scenario::LazyWanCut,
        Scenario::LazyStorm1,
        Scenario::LazyStorm4,
        Scenario::LazyStorm8,
        Scenario::LazyStorm32,
        Scenario::LazyStorm64,
        Scenario::LazyBusy,
        Scenario::LazyBusyLearned,
        Scenario::LazyNeighbour,
        Scenario::LazyNeighbourQuiet,
        Scenario::LazyRestart,
    ];

    /// The scenario named `name` (its label, or without "WAN-": `s1`,
    /// `p`, `full`, `plain`; a lazy one with "lazy" before: `lazy s1`,
    /// `lazy-s1`, `lazy learned`; a dedup one with "dedup" after: `s2
    /// dedup`, `lazy s2 dedup`; case does not matter).
    pub fn parse(name: &str) -> Result<Self> {
        const SEPARATORS: [char; 3] = [' ', '-', '_'];
        let n = name.trim().to_ascii_lowercase();
        let (lazy, n) = match n.strip_prefix("lazy") {
            Some(rest) => (true, rest.trim_start_matches(SEPARATORS).to_owned()),
            None => (false, n),
        };
        let (dedup, n) = match n.strip_suffix("dedup") {
            Some(rest) => (true, rest.trim_end_matches(SEPARATORS).to_owned()),
            None => (false, n),
        };
        let n = n
            .strip_prefix("wan-")
            .or_else(|| n.strip_prefix("wan "))
            .unwrap_or(&n);
        let unknown = || {
            anyhow::anyhow!(
                "unknown scenario {name:?} (local, s1, s2, s3, p, cut, full, plain; lazy \
                 local, lazy s1, lazy learned, lazy s2, lazy s3, lazy p, lazy cut, lazy storm \
                 1|4|8|32|64, lazy busy, lazy busy learned, lazy neighbour, lazy restart; s1 dedup, s2 dedup, s3 dedup, lazy s2 dedup)"
            )
        };
        let scenario = match (lazy, n) {
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
            (true, "storm 1" | "storm-1" | "storm1") => Scenario::LazyStorm1,
            (true, "storm 4" | "storm-4" | "storm4") => Scenario::LazyStorm4,
            (true, "storm 8" | "storm-8" | "storm8") => Scenario::LazyStorm8,
            (true, "storm 32" | "storm-32" | "storm32") => Scenario::LazyStorm32,
            (true, "storm 64" | "storm-64" | "storm64") => Scenario::LazyStorm64,
            (true, "busy") => Scenario::LazyBusy,
            (true, "busy learned") => Scenario::LazyBusyLearned,
            (true, "neighbour") => Scenario::LazyNeighbour,
            (true, "neighbour quiet") => Scenario::LazyNeighbourQuiet,
            (true, "restart") => Scenario::LazyRestart,
            _ => return Err(unknown()),
        };
        if !dedup {
            return Ok(scenario);
        }
        Self::ALL
            .into_iter()
            .find(|s| s.is_dedup() && s.twin() == scenario)
            .ok_or_else(unknown)
    }

    /// A comma-separated list of [`parse`](Self::parse)'s names; `lazy`
    /// alone stands for every lazy scenario, `copy` for every copy-first
    /// one, `dedup` for every dedup one.
    pub fn parse_list(list: &str) -> Result<Vec<Self>> {
        let mut out = Vec::new();
        for name in list.split(',').filter(|n| !n.trim().is_empty()) {
            match name.trim().to_ascii_lowercase().as_str() {
                "lazy" => out.extend(Self::ALL.into_iter().filter(|s| s.is_lazy())),
                "copy" | "copy-first" => out.extend(Self::ALL.into_iter().filter(|s| !s.is_lazy())),
                "dedup" => out.extend(Self::ALL.into_iter().filter(|s| s.is_dedup())),
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
                | Scenario::LazyWanS2Dedup
                | Scenario::LazyWanS3
                | Scenario::LazyWanPCold
                | Scenario::LazyWanPWarm
                | Scenario::LazyWanCut
                | Scenario::LazyBusy
                | Scenario::LazyBusyLearned
                | Scenario::LazyNeighbour
                | Scenario::LazyNeighbourQuiet
                | Scenario::LazyRestart
        ) || self.storm_size().is_some()
    }

    /// A storm's nodes.
    pub fn storm_size(self) -> Option<usize> {
        match self {
            Scenario::LazyStorm1 => Some(1),
            Scenario::LazyStorm4 => Some(4),
            Scenario::LazyStorm8 => Some(8),
            Scenario::LazyStorm32 => Some(32),
            Scenario::LazyStorm64 => Some(64),
            _ => None,
        }
    }

    /// Whether its proxies run with dedup on (the "... dedup" ones).
    pub fn is_dedup(self) -> bool {
        self.twin() != self
    }

    /// What its node and LAN proxies are told about dedup.
    pub fn dedup(self) -> Dedup {
        if self.is_dedup() {
            Dedup::On
        } else {
            Dedup::Off
        }
    }

    /// The same scenario with dedup off: a dedup scenario's twin, which it
    /// runs as; any other scenario itself.
    pub fn twin(self) -> Scenario {
        match self {
            Scenario::WanS1Dedup => Scenario::WanS1,
            Scenario::WanS2Dedup => Scenario::WanS2,
            Scenario::WanS3Dedup => Scenario::WanS3,
            Scenario::LazyWanS2Dedup => Scenario::LazyWanS2,
            other => other,
        }
    }

    /// The name tables and the chart use.
    pub fn label(self) -> &'static str {
        match self {
            Scenario::Local => "Local",
            Scenario::WanS1 => "WAN-S1",
            Scenario::WanS1Dedup => "WAN-S1 dedup",
            Scenario::WanS2 => "WAN-S2",
            Scenario::WanS2Dedup => "WAN-S2 dedup",
            Scenario::WanS3 => "WAN-S3",
            Scenario::WanS3Dedup => "WAN-S3 dedup",
            Scenario::WanPCold => "WAN-P cold",
            Scenario::WanPWarm => "WAN-P warm",
            Scenario::WanCut => "WAN cut",
            Scenario::FullCopy => "full copy",
            Scenario::PlainNfs => "plain NFS",
            Scenario::LazyLocal => "lazy Local",
            Scenario::LazyWanS1 => "lazy WAN-S1",
            Scenario::LazyWanS1Learned => "lazy WAN-S1 learned",
            Scenario::LazyWanS2 => "lazy WAN-S2",
            Scenario::LazyWanS2Dedup => "lazy WAN-S2 dedup",
            Scenario::LazyWanS3 => "lazy WAN-S3",
            Scenario::LazyWanPCold => "lazy WAN-P cold",
            Scenario::LazyWanPWarm => "lazy WAN-P warm",
            Scenario::LazyWanCut => "lazy WAN cut",
            Scenario::LazyStorm1 => "lazy storm 1",
            Scenario::LazyStorm4 => "lazy storm 4",
            Scenario::LazyStorm8 => "lazy storm 8",
            Scenario::LazyStorm32 => "lazy storm 32",
            Scenario::LazyStorm64 => "lazy storm 64",
            Scenario::LazyBusy => "lazy busy",
            Scenario::LazyBusyLearned => "lazy busy learned",
            Scenario::LazyNeighbour => "lazy neighbour",
            Scenario::LazyNeighbourQuiet => "lazy neighbour quiet",
            Scenario::LazyRestart => "lazy restart",
        }
    }
}

/// Whether a record's scenario label is a lazy one.
pub fn is_lazy_label(label: &str) -> bool {
    label.starts_with("lazy ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedup_scenarios_parse_and_run_as_their_twins_with_dedup_on() {
        for (name, scenario, twin) in [
            ("s1 dedup", Scenario::WanS1Dedup, Scenario::WanS1),
            ("WAN-S2 dedup", Scenario::WanS2Dedup, Scenario::WanS2),
            ("s2-dedup", Scenario::WanS2Dedup, Scenario::WanS2),
            ("wan s3 dedup", Scenario::WanS3Dedup, Scenario::WanS3),
            (
                "lazy s2 dedup",
                Scenario::LazyWanS2Dedup,
                Scenario::LazyWanS2,
            ),
            (
                "Lazy-WAN-S2-Dedup",
                Scenario::LazyWanS2Dedup,
                Scenario::LazyWanS2,
            ),
        ] {
            let s = Scenario::parse(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(s, scenario, "{name}");
            assert_eq!((s.twin(), s.dedup(), s.is_dedup()), (twin, Dedup::On, true));
            assert_eq!((twin.dedup(), twin.is_dedup()), (Dedup::Off, false));
            assert_eq!(s.is_lazy(), twin.is_lazy());
        }
        let labels: Vec<&str> = Scenario::ALL
            .into_iter()
            .filter(|s| s.is_dedup())
            .map(Scenario::label)
            .collect();
        assert_eq!(
            labels,
            [
                "WAN-S1 dedup",
                "WAN-S2 dedup",
                "WAN-S3 dedup",
                "lazy WAN-S2 dedup"
            ]
        );
        // Only these have a dedup twin.
        for name in [
            "local dedup",
            "p dedup",
            "lazy s3 dedup",
            "lazy learned dedup",
            "dedup",
        ] {
            assert!(Scenario::parse(name).is_err(), "{name}");
        }
        // A dedup scenario comes right after its twin.
        for (i, s) in Scenario::ALL.into_iter().enumerate() {
            if s.is_dedup() {
                assert_eq!(Scenario::ALL[i - 1], s.twin(), "{}", s.label());
            }
        }
        assert_eq!(
            Scenario::parse_list("s2, dedup").expect("list"),
            [
                Scenario::WanS2,
                Scenario::WanS1Dedup,
                Scenario::WanS2Dedup,
                Scenario::WanS3Dedup,
                Scenario::LazyWanS2Dedup
            ]
        );
    }
}
