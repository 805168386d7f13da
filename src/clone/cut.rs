//! The WAN cut scenario: the link is cut for some seconds in the middle of
//! a cold clone and restored; the clone must complete and the guest must
//! see no error.
//!
//! Two cold clones of image 1, each by a fresh node proxy over a fresh link
//! (cold caches), as WAN-S1's first clone:
//!
//! 1. **Cut while the memory image crosses** ([`CutPoint::Copy`]): once a
//!    quarter of the memory image's compressed size has crossed the link,
//!    it is cut in [`CutMode::Reset`] (every connection through it reset, as
//!    when a router on the path reboots) for [`Settings::cut_hold`]. The
//!    node proxy must reconnect and go on with its whole-file fetch;
//!    `nfs-cp` on the node sees only a pause.
//! 2. **Cut as QEMU resumes** ([`CutPoint::Resume`]): right after the
//!    overlay is created the link goes [`CutMode::Blackhole`] (nothing
//!    delivered, as when a cable is pulled) for as long; QEMU's reads of the
//!    golden disk that miss the node's block cache wait for it.
//!
//! 3. **Blackhole as a lazy clone resumes** ([`CutPoint::LazyResume`], the
//!    scenario "lazy WAN cut"): a cold lazy clone ([`super::lazy`]) of
//!    image 1 by a fresh node with its FUSE mount; the link goes
//!    [`CutMode::Blackhole`] right before `cont`, when the guest is about
//!    to touch pages of the golden `mem` that have not crossed yet. Its
//!    page faults (and QEMU's disk reads) wait, as on a hard mount, and go
//!    on when the link comes back.
//!
//! A clone passes when it resumes with the right disk digest and answers
//! its request with the right memory digest (as every clone must,
//! [`guest::resume_clone`]) and neither the guest's serial console nor
//! QEMU's log holds an error ([`console_errors`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use gvfs_wanlink::{CutMode, WanLink};

use super::bench::{Bench, Node, node_ip, wire};
pub use super::console::console_errors;
use super::console::log_errors;
use super::guest::{self, CONFIG, DISK, MEM, RamMapping, STATE, Watch};
use super::images::zstd_size;
use super::lazy::POLL;
use super::procedure::Timing;
use super::report::CloneRecord;
use super::scenario::{Dedup, MIB, Scenario};

/// Where in a cold clone the link is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutPoint {
    /// While the memory image crosses, once a quarter of its compressed
    /// size has (reset).
    Copy,
    /// As QEMU starts to resume the clone (blackhole).
    Resume,
    /// A lazy clone, right before `cont` (blackhole).
    LazyResume,
}

impl CutPoint {
    /// How the table names it.
    pub fn label(self) -> &'static str {
        match self {
            CutPoint::Copy => "reset while the memory image crosses",
            CutPoint::Resume => "blackhole as QEMU resumes",
            CutPoint::LazyResume => "blackhole as a lazy clone resumes",
        }
    }

    fn mode(self) -> CutMode {
        match self {
            CutPoint::Copy => CutMode::Reset,
            CutPoint::Resume | CutPoint::LazyResume => CutMode::Blackhole,
        }
    }
}

/// One cut clone, as measured.
#[derive(Debug, Clone)]
pub struct CutRecord {
    /// Its number in the scenario.
    pub clone: usize,
    /// Where it was cut.
    pub point: CutPoint,
    /// Seconds into the clone when the link was cut (`None`: the clone was
    /// done before the cut could happen).
    pub cut_at_secs: Option<f64>,
    /// How long the link stayed cut.
    pub held_secs: f64,
    /// Bytes across the link before the cut, and in all.
    pub bytes_before: u64,
    /// Bytes across the link in all.
    pub bytes_total: u64,
    /// The whole clone, seconds.
    pub total_secs: f64,
    /// Whether the clone was still running when the link came back: the
    /// cut fell inside it.
    pub spanned: bool,
    /// Connections the node proxy opened to its upstream beyond its first.
    pub reconnects: u64,
    /// Connections the link reset.
    pub connections_reset: u64,
    /// Error lines of the guest's console and QEMU's log (must be none).
    pub errors: Vec<String>,
}

/// Cuts `wan` in `mode` when `due` says so (polled every few milliseconds)
/// and restores it `hold` later, unless `done` is set first. Returns when
/// it cut (seconds after `start`) and the bytes across the link then.
fn cut_when(
    wan: &WanLink,
    mode: CutMode,
    hold: Duration,
    start: Instant,
    done: &AtomicBool,
    due: impl Fn(u64) -> bool,
) -> Option<(f64, u64)> {
    loop {
        if done.load(Ordering::Relaxed) {
            return None;
        }
        let bytes = wire(wan);
        if due(bytes) {
            wan.cut_with(mode);
            let at = start.elapsed().as_secs_f64();
            std::thread::sleep(hold);
            wan.restore();
            return Some((at, bytes));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

impl Bench<'_> {
    /// The WAN cut scenario: two cold clones of image 1, cut as
    /// [`CutPoint`] says. Returns them as clone records and as cut records.
    pub(super) fn run_cut(&self) -> Result<(Vec<CloneRecord>, Vec<CutRecord>)> {
        let golden = self.golden(1);
        // A quarter of what the memory image costs on the wire.
        let threshold = zstd_size(&golden.join(MEM))? / 4;
        let hold = self.settings.cut_hold;
        let mut records = Vec::new();
        let mut cuts = Vec::new();
        for (i, point) in [CutPoint::Copy, CutPoint::Resume].into_iter().enumerate() {
            let wan = self.wan()?;
            let node = self.node(Some(node_ip(0)), Self::gvfs_url(&wan), Dedup::Off)?;
            let source = node.source(1);
            let dir = tempfile::Builder::new()
                .prefix("clone-cut-")
                .tempdir_in(self.work.path())?;
            let timeout = self.settings.clone_timeout;
            let done = AtomicBool::new(false);
            let start = Instant::now();
            let (timing, cut) = std::thread::scope(|scope| {
                let cutter = scope.spawn(|| match point {
                    CutPoint::Copy => {
                        cut_when(&wan, point.mode(), hold, start, &done, |b| b >= threshold)
                    }
                    CutPoint::Resume | CutPoint::LazyResume => None,
                });
                let run = (|| -> Result<(Timing, Option<(f64, u64)>)> {
                    for name in [CONFIG, MEM, STATE] {
                        source.copy(name, &dir.path().join(name), timeout)?;
                    }
                    let copied = Instant::now();
                    guest::create_overlay(&source.backing(), &dir.path().join(DISK))?;
                    let overlaid = Instant::now();
                    let resume_cut = scope.spawn(|| match point {
                        CutPoint::Resume => {
                            cut_when(&wan, point.mode(), hold, start, &done, |_| true)
                        }
                        CutPoint::Copy | CutPoint::LazyResume => None,
                    });
                    let resumed = guest::resume_clone(
                        &self.kit,
                        dir.path(),
                        &dir.path().join(MEM),
                        RamMapping::Shared,
                        timeout.saturating_sub(start.elapsed()),
                        Watch {
                            bytes: Some(&|| wire(&wan)),
                            ..Watch::default()
                        },
                    )?;
                    let timing = Timing::new(start, copied, overlaid, &resumed, true);
                    let cut = resume_cut
                        .join()
                        .map_err(|_| anyhow::anyhow!("the cutting thread panicked"))?;
                    Ok((timing, cut))
                })();
                done.store(true, Ordering::Relaxed);
                let copy_cut = cutter
                    .join()
                    .map_err(|_| anyhow::anyhow!("the cutting thread panicked"))?;
                let (timing, resume_cut) = run?;
                Ok::<_, anyhow::Error>((timing, copy_cut.or(resume_cut)))
            })?;
            let mut timing = timing;
            timing.errors = log_errors(dir.path());
            let rec = cut_record(i + 1, point, &timing, cut, hold, &wan, &node)?;
            records.push(timing.record(Scenario::WanCut.label(), i + 1, 1, rec.bytes_total));
            cuts.push(rec);
        }
        Ok((records, cuts))
    }

    /// The lazy WAN cut ([`CutPoint::LazyResume`]): a cold lazy clone of
    /// image 1 by a fresh node over a fresh link, blackholed right before
    /// `cont` for [`Settings::cut_hold`].
    pub(super) fn run_lazy_cut(&self) -> Result<(Vec<CloneRecord>, Vec<CutRecord>)> {
        let point = CutPoint::LazyResume;
        let hold = self.settings.cut_hold;
        let wan = self.wan()?;
        let node = self.node_with(Some(node_ip(0)), Self::gvfs_url(&wan), true, Dedup::Off)?;
        let resuming = AtomicBool::new(false);
        let done = AtomicBool::new(false);
        let start = Instant::now();
        let (timing, cut) = std::thread::scope(|scope| {
            let cutter = scope.spawn(|| {
                cut_when(&wan, point.mode(), hold, start, &done, |_| {
                    resuming.load(Ordering::Relaxed)
                })
            });
            let timing = self.lazy_clone(
                Some(&node),
                1,
                true,
                POLL,
                Watch {
                    bytes: Some(&|| wire(&wan)),
                    resuming: Some(&|| resuming.store(true, Ordering::Relaxed)),
                },
            );
            done.store(true, Ordering::Relaxed);
            let cut = cutter
                .join()
                .map_err(|_| anyhow::anyhow!("the cutting thread panicked"))?;
            Ok::<_, anyhow::Error>((timing?, cut))
        })?;
        // When the cut came, from the clone's own start.
        let early = timing.start.saturating_duration_since(start).as_secs_f64();
        let cut = cut.map(|(at, b)| (at - early, b));
        let rec = cut_record(1, point, &timing, cut, hold, &wan, &node)?;
        let label = Scenario::LazyWanCut.label();
        let wan_bytes = rec.bytes_total;
        timing.log(label, 1, 1, wan_bytes);
        Ok((vec![timing.record(label, 1, 1, wan_bytes)], vec![rec]))
    }
}

/// The record of cut clone number `clone`: it took `timing`, the link was
/// cut (at seconds into the clone, bytes across before) as `cut` says for
/// `hold`; the node's reconnects and the link's resets from their counters.
fn cut_record(
    clone: usize,
    point: CutPoint,
    timing: &Timing,
    cut: Option<(f64, u64)>,
    hold: Duration,
    wan: &WanLink,
    node: &Node,
) -> Result<CutRecord> {
    let total = wire(wan);
    let connects = node
        .proxy
        .status()?
        .upstream_client
        .map_or(0, |u| u.connects);
    let cut_at = cut.map(|(at, _)| at);
    let rec = CutRecord {
        clone,
        point,
        cut_at_secs: cut_at,
        held_secs: if cut.is_some() {
            hold.as_secs_f64()
        } else {
            0.0
        },
        bytes_before: cut.map_or(total, |(_, b)| b),
        bytes_total: total,
        total_secs: timing.total(),
        spanned: cut_at.is_some_and(|at| at + hold.as_secs_f64() < timing.total()),
        reconnects: connects.saturating_sub(1),
        connections_reset: wan.stats().connections_reset,
        errors: timing.errors.clone(),
    };
    eprintln!(
        "{} clone {} ({}): {:.2} s, cut at {} for {:.0} s, {:.1} of {:.1} MiB across before it, {} reconnects, {} error lines",
        if point == CutPoint::LazyResume {
            Scenario::LazyWanCut.label()
        } else {
            Scenario::WanCut.label()
        },
        rec.clone,
        point.label(),
        rec.total_secs,
        cut_at.map_or("-".to_owned(), |a| format!("{a:.2} s")),
        rec.held_secs,
        rec.bytes_before as f64 / MIB as f64,
        rec.bytes_total as f64 / MIB as f64,
        rec.reconnects,
        rec.errors.len()
    );
    Ok(rec)
}

/// The WAN cut scenario's table, in Markdown (empty without cuts).
pub fn cuts_markdown(cuts: &[CutRecord], hold: Duration) -> String {
    if cuts.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "\nWAN cut: the link cut for {:.0} s in the middle of a cold clone of image 1 (fresh \
         node proxy, fresh link), then restored:\n\n\
         | clone | cut | cut at s | WAN MiB before the cut / in all | clone s | cut inside the clone | node reconnects | links reset | guest and QEMU error lines |\n\
         |---|---|---:|---:|---:|---|---:|---:|---:|\n",
        hold.as_secs_f64()
    );
    for c in cuts {
        out += &format!(
            "| {} | {} | {} | {:.1} / {:.1} | {:.2} | {} | {} | {} | {} |\n",
            c.clone,
            c.point.label(),
            c.cut_at_secs.map_or("-".to_owned(), |a| format!("{a:.2}")),
            c.bytes_before as f64 / MIB as f64,
            c.bytes_total as f64 / MIB as f64,
            c.total_secs,
            if c.spanned { "yes" } else { "no" },
            c.reconnects,
            c.connections_reset,
            c.errors.len()
        );
    }
    for c in cuts {
        for e in c.errors.iter().take(5) {
            out += &format!("\n- clone {}: `{e}`", c.clone);
        }
    }
    out
}
