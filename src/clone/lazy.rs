//! Lazy clones: resume from the golden memory image in place instead of
//! copying it first.
//!
//! **A lazy clone** copies only `vm.json` and the small `state` (plain file
//! copies from the node proxy's FUSE mount, `gvfs-proxy --mount`), making
//! the qcow2 overlay meanwhile, on the golden disk on the same mount (QEMU
//! then reads the disk as a local file, where the kernel keeps its pages,
//! not through its own NFS client), and starts QEMU with its RAM mapped
//! from the golden `mem` on the mount, private and read-only
//! ([`RamMapping::Private`]). Pages of `mem` are read through the mount,
//! so through the node proxy's file cache, when the guest first touches
//! them; the proxy goes on fetching the rest of the file in the
//! background. "lazy Local" maps the golden file in ganesha's export
//! directory the same way.
//!
//! **What is measured** per clone, beside the clone time (start to the
//! guest verified running) and time to responsiveness (to its answer,
//! [`guest::resume_clone`]): WAN bytes at both moments; for a clone new to
//! its node, when the node held the whole memory image
//! (`file_cache.files_complete` of the node proxy grew by two, `state` and
//! `mem`; polled from the clone's start, given up after
//! [`WHOLE_LOCAL_TIMEOUT`]); and the node's file-cache counters over the
//! clone ([`NodeFetch`]). A clone new to its node returns only once the
//! memory image is whole there (or the watch gave up), so the next clone's
//! bytes are its own.
//!
//! **Working-set profiles.** The node proxy of a lazy clone may record which
//! chunks of `mem` the guest touched, in order, and send that upstream once
//! the guest goes quiet; later cold clones fetch those pieces first. Lazy
//! WAN-S1 learned is a fresh node over a fresh link cloning image 1 after
//! lazy WAN-S1's node had the chance to send its profile
//! (`file_cache.profiles_sent`, waited for up to [`PROFILE_TIMEOUT`]; a
//! proxy without that counter sends none, and the wait is skipped). The
//! image-server proxy keeps profiles, so every later cold lazy clone of an
//! image that has one (lazy WAN-S2's, WAN-S3's and WAN-P's clones of image
//! 1, the lazy cut) starts from it too.
//!
//! Every lazy scenario ends with the golden `mem` of the images it cloned
//! checked against its SHA-256 from when it was built (`run`).

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};

use super::bench::{Bench, Node, at_once, node_ip, parallel_records, wire};
use super::guest::{MEM, Watch};
use super::images::image_dir;
use super::procedure::{Procedure, Source, Timing, clone_one};
use super::report::{CloneRecord, NodeFetch};
use super::scenario::{Dedup, MIB, Scenario};
use super::trace::{Marks, Trace};
use crate::Stats;

/// How often a clone's node is asked whether it holds the whole memory
/// image (one `gvfsctl stats` each time).
pub(super) const POLL: Duration = Duration::from_millis(250);
/// The same for WAN-P's nodes, which are asked all at once.
const PARALLEL_POLL: Duration = Duration::from_secs(1);
/// How long after a lazy clone's start its node may take to hold the whole
/// memory image before the watch gives up (best effort: it is reported as
/// not measured).
pub const WHOLE_LOCAL_TIMEOUT: Duration = Duration::from_secs(120);
/// How long lazy WAN-S1's node may take to send its working-set profile
/// upstream before lazy WAN-S1 learned runs anyway.
pub const PROFILE_TIMEOUT: Duration = Duration::from_secs(30);

/// `gvfsctl stats --json` of nodes' proxies after their first clone, by
/// scenario ([`Outcome::client_stats`]).
type ClientStats = Vec<(Scenario, Stats)>;

/// The counter the node proxy counts sent working-set profiles in (its
/// name in `gvfsctl stats --json`, `FileCacheCounts::profiles_sent`).
const PROFILES_SENT: &str = "file_cache.profiles_sent";

impl Bench<'_> {
    /// A lazy clone of `image`: through `node`'s mount, or from the golden
    /// directory itself without a node (lazy Local). `cold` (the image is
    /// new to the node) also watches for the node holding the whole memory
    /// image, every `poll`, and returns only once it does (or the watch
    /// gave up).
    pub(super) fn lazy_clone(
        &self,
        node: Option<&Node>,
        image: usize,
        cold: bool,
        poll: Duration,
        watch: Watch<'_>,
    ) -> Result<Timing> {
        let timeout = self.settings.clone_timeout;
        let Some(node) = node else {
            let golden = self.golden(image);
            let procedure = Procedure::Lazy {
                backing: Source::Local(golden.clone()).backing(),
                files: golden,
            };
            return clone_one(&self.kit, &procedure, self.work.path(), timeout, watch);
        };
        let procedure = node.lazy(image)?;
        let before = node.proxy.stats()?;
        // `state` and `mem` are fetched whole by the file cache.
        let target = before.file_cache.counts.files_complete + 2;
        let gave_up = AtomicBool::new(false);
        let (timing, whole) = std::thread::scope(|scope| {
            let watcher = cold.then(|| scope.spawn(|| whole_local(node, target, poll, &gave_up)));
            let timing = clone_one(&self.kit, &procedure, self.work.path(), timeout, watch);
            if timing.is_err() {
                gave_up.store(true, Ordering::Relaxed);
            }
            let whole = watcher.and_then(|w| w.join().ok().flatten());
            (timing, whole)
        });
        let mut timing = timing?;
        timing.whole_local =
            whole.map(|at| at.saturating_duration_since(timing.start).as_secs_f64());
        let after = node.proxy.stats()?;
        timing.fetch = Some(NodeFetch::from_stats(&after).since(&NodeFetch::from_stats(&before)));
        Ok(timing)
    }

    /// Runs lazy Local, WAN-S2 (or its dedup twin) or WAN-S3; returns its
    /// clones, with the stats of its (measured) node's proxy after its first
    /// clone.
    pub(super) fn run_lazy(&self, scenario: Scenario) -> Result<(Vec<CloneRecord>, Option<Stats>)> {
        let s = self.settings;
        let image_of = |i: usize| (i % s.images) + 1;
        let label = scenario.label();
        let mut records = Vec::new();
        let mut first_stats = None;
        let mut record = |clone: usize, image: usize, t: Timing, wan: u64| {
            t.log(label, clone, image, wan);
            records.push(t.record(label, clone, image, wan));
        };
        let dedup = scenario.dedup();
        match scenario.twin() {
            Scenario::LazyLocal => {
                for i in 0..s.clones {
                    let t = self.lazy_clone(None, image_of(i), false, POLL, Watch::default())?;
                    record(i + 1, image_of(i), t, 0);
                }
            }
            Scenario::LazyWanS2 | Scenario::LazyWanS3 => {
                let wan = self.wan()?;
                let (_lan, node) = if scenario.twin() == Scenario::LazyWanS2 {
                    let node =
                        self.node_with(Some(node_ip(0)), Self::gvfs_url(&wan), true, dedup)?;
                    (None, node)
                } else {
                    let lan = self.node(None, Self::gvfs_url(&wan), dedup)?;
                    let warmer =
                        self.node_with(Some(node_ip(0)), lan.proxy.upstream_url(), true, dedup)?;
                    let mut seen = BTreeSet::new();
                    for i in 0..s.clones {
                        let image = image_of(i);
                        let cold = seen.insert(image);
                        self.lazy_clone(Some(&warmer), image, cold, POLL, Watch::default())?;
                    }
                    drop(warmer);
                    let node =
                        self.node_with(Some(node_ip(1)), lan.proxy.upstream_url(), true, dedup)?;
                    (Some(lan), node)
                };
                let mut seen = BTreeSet::new();
                for i in 0..s.clones {
                    let image = image_of(i);
                    let before = wire(&wan);
                    let watch = Watch {
                        bytes: Some(&|| wire(&wan) - before),
                        ..Watch::default()
                    };
                    let t = self.lazy_clone(Some(&node), image, seen.insert(image), POLL, watch)?;
                    record(i + 1, image, t, wire(&wan) - before);
                    if i == 0 {
                        first_stats = Some(node.proxy.stats()?);
                    }
                }
            }
            other => bail!("{} is not run by run_lazy", other.label()),
        }
        Ok((records, first_stats))
    }

    /// Lazy WAN-S1: one node clones image 1 `clones` times (the first cold);
    /// then, when `learned`, lazy WAN-S1 learned: once its node has sent
    /// its working-set profile upstream (or [`PROFILE_TIMEOUT`] passed), a
    /// fresh node over a fresh link clones image 1 once. Returns the clones
    /// of both, with the stats of each node after its first clone; notes in
    /// `calls` what crossed the WAN for the first two clones and the
    /// learned one, and in `profile` and `notes` what became of the
    /// profile.
    pub(super) fn run_lazy_s1(
        &self,
        learned: bool,
        record: Option<(&Path, &mut Option<Trace>)>,
        calls: &mut Vec<(String, BTreeMap<String, u64>)>,
        notes: &mut Vec<String>,
        profile: &mut Option<ProfileWait>,
    ) -> Result<(Vec<CloneRecord>, ClientStats)> {
        let mut records = Vec::new();
        let mut stats = Vec::new();
        let wan = self.wan()?;
        // The FUSE read trace of the first clone, for the storms.
        let fuse_trace = self.work.path().join("fuse-trace.txt");
        let traced = record.is_some() && self.mount_trace_flag;
        let node = self.node_as(
            Some(node_ip(0)),
            Self::gvfs_url(&wan),
            true,
            Dedup::Off,
            ("node", "2G"),
            |a| {
                if traced {
                    a.arg("--mount-trace").arg(fuse_trace.display().to_string())
                } else {
                    a
                }
            },
        )?;
        let label = Scenario::LazyWanS1.label();
        let mut record = record.filter(|_| traced);
        for i in 0..self.settings.clones {
            let before = wire(&wan);
            let calls_before = self.wan_calls()?;
            let resumed = Mutex::new(None);
            let watch = Watch {
                bytes: Some(&|| wire(&wan) - before),
                resuming: Some(&|| {
                    *resumed.lock().unwrap_or_else(PoisonError::into_inner) =
                        Some((SystemTime::now(), Instant::now()));
                }),
            };
            let t = self.lazy_clone(Some(&node), 1, i == 0, POLL, watch)?;
            if let (0, Some((path, out))) = (i, record.take()) {
                let resumed = resumed.into_inner().unwrap_or_else(PoisonError::into_inner);
                let trace = self.keep_trace(&node, &fuse_trace, &t, resumed, path)?;
                notes.push(trace_note(&trace));
                *out = Some(trace);
            }
            let bytes = wire(&wan) - before;
            t.log(label, i + 1, 1, bytes);
            records.push(t.record(label, i + 1, 1, bytes));
            if i == 0 {
                stats.push((Scenario::LazyWanS1, node.proxy.stats()?));
            }
            if i < 2 {
                let which = if i == 0 {
                    "lazy cold (lazy WAN-S1 #1)"
                } else {
                    "lazy warm (lazy WAN-S1 #2)"
                };
                calls.push((which.to_owned(), self.wan_calls_since(&calls_before)?));
            }
        }
        if !learned {
            return Ok((records, stats));
        }
        let waited = wait_for_profile(&node)?;
        eprintln!("{}", waited.note());
        notes.push(waited.note());
        *profile = Some(waited);
        let wan = self.wan()?;
        let fresh = self.node_with(Some(node_ip(1)), Self::gvfs_url(&wan), true, Dedup::Off)?;
        let label = Scenario::LazyWanS1Learned.label();
        let calls_before = self.wan_calls()?;
        let watch = Watch {
            bytes: Some(&|| wire(&wan)),
            ..Watch::default()
        };
        let t = self.lazy_clone(Some(&fresh), 1, true, POLL, watch)?;
        let bytes = wire(&wan);
        t.log(label, 1, 1, bytes);
        let f = t.fetch.unwrap_or_default();
        notes.push(format!(
            "Lazy WAN-S1 learned's fresh node started {} whole-file fetches with a working-set \
             profile (`file_cache.profile_hits`) and fetched {} pieces of 8 KiB first because \
             it named them ({:.1} MiB on the wire).",
            f.profile_hits,
            f.profile_pieces,
            f.profile_wire_bytes as f64 / MIB as f64
        ));
        records.push(t.record(label, 1, 1, bytes));
        stats.push((Scenario::LazyWanS1Learned, fresh.proxy.stats()?));
        calls.push((
            "lazy learned (lazy WAN-S1 learned #1)".to_owned(),
            self.wan_calls_since(&calls_before)?,
        ));
        Ok((records, stats))
    }

    /// Lazy WAN-P: `clones` nodes, each with its own mount, behind one LAN
    /// proxy lazily clone image 1 at once, cold, then again, warm. Returns
    /// the clones and the LAN proxy's stats.
    pub(super) fn run_lazy_parallel(&self) -> Result<(Vec<CloneRecord>, Stats)> {
        let wan = self.wan()?;
        let lan = self.node(None, Self::gvfs_url(&wan), Dedup::Off)?;
        let nodes = (0..self.settings.clones)
            .map(|i| self.node_with(Some(node_ip(i)), lan.proxy.upstream_url(), true, Dedup::Off))
            .collect::<Result<Vec<_>>>()?;
        let mut records = Vec::new();
        for (scenario, cold) in [
            (Scenario::LazyWanPCold, true),
            (Scenario::LazyWanPWarm, false),
        ] {
            let before = wire(&wan);
            let bytes = || wire(&wan) - before;
            let timings = at_once(&nodes, |node| {
                let watch = Watch {
                    bytes: Some(&bytes),
                    ..Watch::default()
                };
                self.lazy_clone(Some(node), 1, cold, PARALLEL_POLL, watch)
            })?;
            records.extend(parallel_records(scenario, &timings, wire(&wan) - before));
        }
        Ok((records, lan.proxy.stats()?))
    }
}

impl Bench<'_> {
    /// The trace of `mem`'s reads in the FUSE read trace `fuse_trace` of
    /// `node`'s clone `t` (resumed at `resumed`), saved at `path`.
    fn keep_trace(
        &self,
        node: &Node,
        fuse_trace: &Path,
        t: &Timing,
        resumed: Option<(SystemTime, Instant)>,
        path: &Path,
    ) -> Result<Trace> {
        let (sys, at) = resumed.context("the traced clone did not say when it resumed")?;
        let unix = |when: Instant| {
            let t = if when >= at {
                sys + (when - at)
            } else {
                sys - (at - when)
            };
            t.duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64)
        };
        let marks = Marks {
            start_us: unix(t.start),
            resume_us: unix(at),
            running_us: unix(t.start + Duration::from_secs_f64(t.total())),
            answered_us: unix(t.start + Duration::from_secs_f64(t.responsive)),
        };
        let mem = node
            .mount_path()
            .context("the traced node has a mount")?
            .join(image_dir(1))
            .join(MEM);
        let ino = std::fs::metadata(&mem)?.ino();
        let text = std::fs::read_to_string(fuse_trace)
            .with_context(|| format!("reading {}", fuse_trace.display()))?;
        let trace = Trace::from_fuse(&text, ino, marks)?;
        ensure!(
            !trace.entries.is_empty(),
            "the FUSE trace holds no read of mem (inode {ino}) after the resume"
        );
        std::fs::write(path, trace.text())?;
        Ok(trace)
    }
}

/// What the recorded trace holds, for the report.
fn trace_note(t: &Trace) -> String {
    format!(
        "The storms replay lazy WAN-S1's first clone as its node's FUSE mount traced it          (`--mount-trace`; `src/clone/trace.rs`): {} reads of `mem` ({:.1} MiB) from the          resume on, {} of them before the guest was verified running and {} before its          answer; {:.2} s of the guest's own time to the answer, {:.2} s before the resume          (not replayed: added to each replay's marks).",
        t.entries.len(),
        t.bytes() as f64 / MIB as f64,
        t.running.entries,
        t.answered.entries,
        t.think_to_answer().as_secs_f64(),
        t.before_resume.as_secs_f64()
    )
}

/// Polls `node`'s `file_cache.files_complete` every `poll` until it reaches
/// `target`; returns when it did, or `None` once `gave_up` is set or after
/// [`WHOLE_LOCAL_TIMEOUT`].
fn whole_local(node: &Node, target: u64, poll: Duration, gave_up: &AtomicBool) -> Option<Instant> {
    let deadline = Instant::now() + WHOLE_LOCAL_TIMEOUT;
    let mut complete = 0;
    loop {
        if gave_up.load(Ordering::Relaxed) {
            return None;
        }
        if let Ok(v) = node.proxy.stats() {
            complete = v.file_cache.counts.files_complete;
            if complete >= target {
                return Some(Instant::now());
            }
        }
        if Instant::now() >= deadline {
            eprintln!(
                "the node did not hold the whole memory image within {WHOLE_LOCAL_TIMEOUT:?} \
                 (file_cache.files_complete {complete}, waiting for {target})"
            );
            return None;
        }
        std::thread::sleep(poll);
    }
}

/// What lazy WAN-S1's node did with the working set it learned, by the time
/// lazy WAN-S1 learned started.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProfileWait {
    /// Whether its stats have [`PROFILES_SENT`] at all (a proxy without it
    /// learns no profiles).
    pub counted: bool,
    /// Profiles it had sent upstream.
    pub sent: u64,
    /// Learned read orders it had discarded as copies of the whole file
    /// (`file_cache.profiles_discarded`; `state`, read whole, is one).
    pub discarded: u64,
    /// Whole-file fetches it had started with a profile learned elsewhere
    /// (`file_cache.profile_hits`).
    pub hits: u64,
    /// How long it was waited for, seconds.
    pub waited_secs: f64,
}

impl ProfileWait {
    /// A sentence for the report.
    pub fn note(&self) -> String {
        if !self.counted {
            return format!(
                "The node proxy's stats have no `{PROFILES_SENT}`: it sends no working-set \
                 profiles, and lazy WAN-S1 learned ran without one."
            );
        }
        if self.sent >= 1 {
            return format!(
                "Lazy WAN-S1's node had sent its working-set profile upstream ({PROFILES_SENT} \
                 {}) {:.1} s after its last clone.",
                self.sent, self.waited_secs
            );
        }
        format!(
            "Lazy WAN-S1's node had sent no working-set profile {:.0} s after its last clone \
             ({PROFILES_SENT} 0; it had discarded {} learned read orders as copies, \
             file_cache.profiles_discarded, and started {} whole-file fetches with a profile \
             learned elsewhere); lazy WAN-S1 learned ran without one of its own.",
            self.waited_secs, self.discarded, self.hits
        )
    }
}

/// Waits until `node` has sent a working-set profile upstream
/// ([`PROFILES_SENT`] at least 1), at most [`PROFILE_TIMEOUT`]; a proxy
/// whose stats have no such counter sends none, and is not waited for.
/// Never fails on the profile itself: lazy WAN-S1 learned runs either way.
fn wait_for_profile(node: &Node) -> Result<ProfileWait> {
    let start = Instant::now();
    loop {
        let v = node.proxy.stats()?;
        // Whether the proxy counts profiles at all: a build from before
        // them (scripts/ab.sh runs old ones) has no such key in its JSON,
        // where the typed counter would read 0.
        let counted = v.json()["file_cache"].get("profiles_sent").is_some();
        let c = &v.file_cache.counts;
        let wait = ProfileWait {
            counted,
            sent: c.profiles_sent,
            discarded: c.profiles_discarded,
            hits: c.profile_hits,
            waited_secs: start.elapsed().as_secs_f64(),
        };
        if !counted || wait.sent >= 1 || start.elapsed() >= PROFILE_TIMEOUT {
            return Ok(wait);
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clone::scenario::is_lazy_label;

    #[test]
    fn lazy_scenarios_parse_by_label_and_short_name() {
        for s in Scenario::ALL {
            if s != Scenario::WanPWarm && s != Scenario::LazyWanPWarm {
                assert_eq!(Scenario::parse(s.label()).ok(), Some(s), "{}", s.label());
            }
            assert_eq!(s.is_lazy(), is_lazy_label(s.label()), "{}", s.label());
        }
        assert_eq!(
            Scenario::parse("lazy s1").expect("lazy s1"),
            Scenario::LazyWanS1
        );
        assert_eq!(
            Scenario::parse("Lazy-WAN-S2").expect("lazy s2"),
            Scenario::LazyWanS2
        );
        assert_eq!(
            Scenario::parse("lazy learned").expect("learned"),
            Scenario::LazyWanS1Learned
        );
        assert_eq!(Scenario::parse("s1").expect("s1"), Scenario::WanS1);
        assert!(Scenario::parse("lazy full").is_err());
        assert!(Scenario::parse("learned").is_err());
        let all = Scenario::parse_list("local, lazy").expect("list");
        assert_eq!(all[0], Scenario::Local);
        assert_eq!(all.len(), 1 + 19);
        assert!(all[1..].iter().all(|s| s.is_lazy()));
        assert_eq!(
            Scenario::parse_list("copy").expect("copy").len(),
            Scenario::ALL.len() - 19
        );
    }
}
