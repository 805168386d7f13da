//! What a run reports: its outcome and the goals it is judged by.

use std::collections::BTreeMap;

use super::report::CloneRecord;
use super::scenario::Scenario;
use super::{census, cut, lazy};
use crate::Stats;

/// The results of a run.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Every timed clone.
    pub records: Vec<CloneRecord>,
    /// The report: parameters, tables, goals, where the time goes.
    pub markdown: String,
    /// `gvfsctl stats --json` of the first node's proxy after its first
    /// clone, per sequential WAN scenario.
    pub client_stats: Vec<(Scenario, Stats)>,
    /// Calls that crossed the WAN, by procedure, for WAN-S1's cold and warm
    /// clone.
    pub wan_calls: Vec<(String, BTreeMap<String, u64>)>,
    /// `gvfsctl stats --json` of WAN-P's LAN proxy after its clones.
    pub lan_stats: Option<Stats>,
    /// The same for lazy WAN-P's LAN proxy.
    pub lazy_lan_stats: Option<Stats>,
    /// The goals, as measured.
    pub goals: Vec<Goal>,
    /// The lazy clones' goals, as measured.
    pub lazy_goals: Vec<Goal>,
    /// The guests' RAM.
    pub ram_mib: u64,
    /// The WAN cut scenarios' clones (copy-first and lazy).
    pub cuts: Vec<cut::CutRecord>,
    /// What the run found on the way (the working-set profile's fate).
    pub notes: Vec<String>,
    /// What lazy WAN-S1's node did with the working set it learned (when
    /// lazy WAN-S1 learned ran).
    pub profile: Option<lazy::ProfileWait>,
    /// How many times the golden memory images were checked unchanged
    /// (after each lazy scenario and at the end; a change fails the run).
    pub golden_checks: usize,
    /// The golden images' census (with two images or more).
    pub census: Option<census::Census>,
    /// The goals of dedup across images, as measured.
    pub dedup_goals: Vec<Goal>,
    /// What the dedup scenarios found on the way (what filling WAN-S3's
    /// LAN proxy moved, a proxy without `--no-dedup`).
    pub dedup_notes: Vec<String>,
    /// Lazy restart's restarts and what they cost, when it ran.
    pub restarts: Option<(
        Vec<super::restart::RestartStep>,
        super::restart::RestartTotals,
    )>,
}

/// A goal of the benchmark: `measured / against <= at_most`.
#[derive(Debug, Clone)]
pub struct Goal {
    /// What the goal says.
    pub name: String,
    /// What `measured` and `against` are in: "s" (most goals) or "MiB".
    pub unit: &'static str,
    /// The time (or amount) measured, when its scenario ran.
    pub measured: Option<f64>,
    /// The time (or amount) it is held against, when its scenario ran (or
    /// a fixed bound).
    pub against: Option<f64>,
    /// The largest ratio that meets the goal.
    pub at_most: f64,
    /// The floor's ratio, when it is known: the floor held against the
    /// same time (a clone beats it only by what the floor does not count,
    /// repeated blocks sent once).
    pub best: Option<f64>,
}

impl Goal {
    /// `measured / against`, when both ran.
    pub fn ratio(&self) -> Option<f64> {
        match (self.measured, self.against) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        }
    }

    /// Whether the goal is met (`None` when its scenarios did not run).
    pub fn met(&self) -> Option<bool> {
        self.ratio().map(|r| r <= self.at_most)
    }

    /// `met`, `**not met**` or `n/a`, for tables.
    pub fn verdict(&self) -> &'static str {
        match self.met() {
            Some(true) => "met",
            Some(false) => "**not met**",
            None => "n/a",
        }
    }

    pub(super) fn ratio_text(&self) -> String {
        fmt3(self.ratio())
    }
}

/// The least time a cold clone can take on the link.
pub(super) struct Floor {
    pub(super) secs: f64,
    pub(super) zstd_mem: u64,
    pub(super) zstd_state: u64,
    pub(super) disk_read: u64,
}

/// A number to three places, or `n/a`.
pub(super) fn fmt3(x: Option<f64>) -> String {
    x.map_or("n/a".to_owned(), |x| format!("{x:.3}"))
}
