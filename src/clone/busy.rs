//! A busy guest: one that never goes quiet (`gvfs.busy=N`, the kit's
//! `INIT`: 48 MiB of random data in a tmpfs, and every 0.1 s a fork, a read
//! of 1 MiB of it at random and a 256 KiB string made). Its node's learning
//! cannot end on quiet; what it learns is sent only if the learning ends
//! another way (a window, a size cap).
//!
//! "lazy busy": a fresh node over a fresh link clones the busy image cold;
//! then its node is given up to [`BUSY_PROFILE_TIMEOUT`] to send its
//! profile upstream; "lazy busy learned": another fresh node over a fresh
//! link clones it again. The notes say how the first node's learning ended,
//! from its learning counters when its proxy has them.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::bench::{Bench, node_ip, wire};
use super::guest::Watch;
use super::images::busy_image;
use super::lazy::POLL;
use super::report::CloneRecord;
use super::scenario::{Dedup, Scenario};

/// How long the busy node may take to send its profile: a learning window
/// of 20 s after the guest's first touch, and room.
pub(super) const BUSY_PROFILE_TIMEOUT: Duration = Duration::from_secs(60);

/// The learning counters a node proxy may have (`file_cache.*` in its
/// JSON stats), read by name: how its learnings ended.
const LEARN_COUNTERS: [&str; 5] = [
    "learn_closed_quiet",
    "learn_closed_time",
    "learn_closed_size",
    "profiles_too_big",
    "profiles_sent",
];

impl Bench<'_> {
    /// Lazy busy, then (when `learned`) lazy busy learned; returns their
    /// clones and notes.
    pub(super) fn run_lazy_busy(&self, learned: bool) -> Result<(Vec<CloneRecord>, Vec<String>)> {
        let image = busy_image(self.settings).context("no busy image was built")?;
        let mut records = Vec::new();
        let mut notes = Vec::new();
        let wan = self.wan()?;
        let node = self.node_with(Some(node_ip(0)), Self::gvfs_url(&wan), true, Dedup::Off)?;
        let watch = Watch {
            bytes: Some(&|| wire(&wan)),
            ..Watch::default()
        };
        let label = Scenario::LazyBusy.label();
        let t = self.lazy_clone(Some(&node), image, true, POLL, watch)?;
        t.log(label, 1, image, wire(&wan));
        records.push(t.record(label, 1, image, wire(&wan)));
        if !learned {
            return Ok((records, notes));
        }
        let start = Instant::now();
        let mut v = node.proxy.stats()?;
        while v.file_cache.counts.profiles_sent == 0 && start.elapsed() < BUSY_PROFILE_TIMEOUT {
            std::thread::sleep(POLL);
            v = node.proxy.stats()?;
        }
        let ended: Vec<String> = LEARN_COUNTERS
            .iter()
            .map(|key| {
                let n = v.json()["file_cache"].get(*key).and_then(|x| x.as_u64());
                format!("{key} {}", n.map_or("n/a".to_owned(), |n| n.to_string()))
            })
            .collect();
        notes.push(format!(
            "Lazy busy's node, {:.1} s after its clone (the guest still busy): {}.",
            start.elapsed().as_secs_f64(),
            ended.join(", ")
        ));
        drop(node);

        let wan = self.wan()?;
        let fresh = self.node_with(Some(node_ip(1)), Self::gvfs_url(&wan), true, Dedup::Off)?;
        let watch = Watch {
            bytes: Some(&|| wire(&wan)),
            ..Watch::default()
        };
        let label = Scenario::LazyBusyLearned.label();
        let t = self.lazy_clone(Some(&fresh), image, true, POLL, watch)?;
        t.log(label, 1, image, wire(&wan));
        let f = t.fetch.unwrap_or_default();
        notes.push(format!(
            "Lazy busy learned's node started {} whole-file fetches with a working-set profile \
             and fetched {} pieces first because it named them.",
            f.profile_hits, f.profile_pieces
        ));
        records.push(t.record(label, 1, image, wire(&wan)));
        Ok((records, notes))
    }
}
