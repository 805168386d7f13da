//! A noisy neighbour: a bulk copy and a lazy clone through one LAN proxy.
//!
//! The image server also holds `bulk.raw` (`images::write_bulk`: 64 KiB runs of
//! random bytes and of zeros, about half compressible, with its metadata).
//! Three runs, each on a fresh WAN link, a fresh LAN proxy and fresh nodes:
//!
//! 1. the copy alone: node B `nfs-cp`s `bulk.raw` to a scratch file;
//! 2. "lazy neighbour quiet": node A makes a learned lazy clone of image 1
//!    (lazy WAN-S1's node taught the image server its profile), alone;
//! 3. "lazy neighbour": the copy starts, and a while later (a quarter of
//!    the copy alone's time, at most 5 s) the clone.
//!
//! The copy's progress is node B's file-cache bytes received, sampled every
//! [`SAMPLE`]. Its throughput (the whole copy's MiB over its time) in run 3
//! is set against run 1's: the goal. Its rate over the clone's span (its
//! start to its answer and 5 s more) in both runs is noted beside it, with
//! the most it could be: whatever the clone's own WAN bytes leave of the
//! link over that span.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::bench::{Bench, Node, node_ip};
use super::images::BULK;
use super::lazy::POLL;
use super::procedure::Timing;
use super::report::CloneRecord;
use super::scenario::{Dedup, MIB, Scenario};
use crate::libnfs::{CopyClient, nfs_url};

/// How often the copy's progress is sampled.
const SAMPLE: Duration = Duration::from_millis(250);
/// The span after the clone's answer the copy's rate is taken over.
const AFTER_ANSWER: f64 = 5.0;
/// The most the clone starts after the copy.
const MAX_DELAY: Duration = Duration::from_secs(5);

/// Samples of a copy's progress: seconds since it started, bytes.
type Progress = Vec<(f64, u64)>;

/// Bytes at `t` seconds, linear between samples.
fn bytes_at(p: &Progress, t: f64) -> f64 {
    let mut last = (0.0, 0.0);
    for &(at, bytes) in p {
        if at >= t {
            let (t0, b0) = last;
            let span = (at - t0).max(1e-9);
            return b0 + (bytes as f64 - b0) * ((t - t0) / span).clamp(0.0, 1.0);
        }
        last = (at, bytes as f64);
    }
    last.1
}

/// MiB/s over `[from, to]` seconds.
fn rate(p: &Progress, from: f64, to: f64) -> f64 {
    (bytes_at(p, to) - bytes_at(p, from)) / (to - from).max(1e-9) / MIB as f64
}

/// What the neighbour runs found: the copy's throughput, MiB/s over the
/// whole copy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct CopyRates {
    /// The copy alone.
    pub(super) alone: f64,
    /// Beside the clone.
    pub(super) beside: f64,
}

/// The most of its rate over a span of `secs` the copy could keep beside
/// a clone that needs `clone_wan` WAN bytes in it, on a link of `link`
/// bytes/s that the copy alone fills: what the clone's bytes leave.
fn span_bound(secs: f64, clone_wan: u64, link: f64) -> f64 {
    (1.0 - clone_wan as f64 / (link * secs).max(1.0)).max(0.0)
}

impl Bench<'_> {
    /// Node B's copy of `bulk.raw` (sampling `b`'s bytes received while it
    /// runs); the progress and how long it took.
    fn copy_bulk(&self, b: &Node, started: Instant) -> Result<(Progress, f64)> {
        let done = AtomicBool::new(false);
        let before = b.proxy.stats()?.file_cache.counts.raw_bytes;
        let p = &b.proxy;
        let url = nfs_url(p.ip(), p.port(), p.port(), p.export(), BULK);
        std::thread::scope(|s| {
            let sampler = s.spawn(|| {
                let mut p = Progress::new();
                while !done.load(Ordering::Relaxed) {
                    if let Ok(v) = b.proxy.stats() {
                        let got = v.file_cache.counts.raw_bytes.saturating_sub(before);
                        p.push((started.elapsed().as_secs_f64(), got));
                    }
                    std::thread::sleep(SAMPLE);
                }
                p
            });
            // nfs-cp cannot write to /dev/null: a scratch file, gone when
            // the copy is.
            let copied = tempfile::tempdir()
                .map_err(anyhow::Error::from)
                .and_then(|dir| {
                    let dst = dir.path().join(BULK);
                    let dst = dst.to_str().context("a scratch path that is not UTF-8")?;
                    CopyClient::NfsCp.copy(&url, dst, self.settings.clone_timeout)
                });
            let took = started.elapsed().as_secs_f64();
            done.store(true, Ordering::Relaxed);
            let mut p = sampler.join().unwrap_or_default();
            if let Ok(v) = b.proxy.stats() {
                p.push((took, v.file_cache.counts.raw_bytes.saturating_sub(before)));
            }
            copied.map(|()| (p, took))
        })
    }

    /// A fresh WAN, LAN proxy and the nodes named (A mounts, B copies).
    fn neighbour_site(&self, a: bool, b: bool) -> Result<(gvfs_wanlink::WanLink, Vec<Node>)> {
        let wan = self.wan()?;
        let lan = self.node(None, Self::gvfs_url(&wan), Dedup::Off)?;
        let mut nodes = vec![lan];
        if a {
            let url = nodes[0].proxy.upstream_url();
            nodes.push(self.node_with(Some(node_ip(0)), url, true, Dedup::Off)?);
        }
        if b {
            let url = nodes[0].proxy.upstream_url();
            nodes.push(self.node_with(Some(node_ip(1)), url, false, Dedup::Off)?);
        }
        Ok((wan, nodes))
    }

    /// The three neighbour runs; returns the two clones, the copy's rates
    /// and notes.
    pub(super) fn run_neighbour(&self) -> Result<(Vec<CloneRecord>, CopyRates, Vec<String>)> {
        // 1. The copy alone.
        let (_wan, nodes) = self.neighbour_site(false, true)?;
        let (alone, alone_took) = self.copy_bulk(&nodes[1], Instant::now())?;
        drop(nodes);
        let delay = MAX_DELAY.min(Duration::from_secs_f64(alone_took / 4.0));

        // 2. The clone alone.
        let (wan, nodes) = self.neighbour_site(true, false)?;
        let quiet = self.lazy_clone(Some(&nodes[1]), 1, true, POLL, Default::default())?;
        let quiet_wan = super::bench::wire(&wan);
        drop(nodes);

        // 3. Both.
        let (wan, nodes) = self.neighbour_site(true, true)?;
        let lan_before = nodes[0].proxy.stats()?;
        let started = Instant::now();
        let (copy, clone) = std::thread::scope(|s| {
            let copy = s.spawn(|| self.copy_bulk(&nodes[2], started));
            std::thread::sleep(delay);
            let clone = self.lazy_clone(Some(&nodes[1]), 1, true, POLL, Default::default());
            let copy = copy
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the copy thread panicked")));
            (copy, clone)
        });
        let ((beside, beside_took), clone): ((Progress, f64), Timing) = (copy?, clone?);
        let both_wan = super::bench::wire(&wan);
        let lan_note = lan_gate_note(&lan_before, &nodes[0].proxy.stats()?);
        drop(nodes);

        let from = delay.as_secs_f64();
        let to = from + clone.responsive + AFTER_ANSWER;
        let span = (rate(&alone, from, to), rate(&beside, from, to));
        let whole = |p: &Progress, took: f64| bytes_at(p, f64::MAX) / MIB as f64 / took.max(1e-9);
        let rates = CopyRates {
            alone: whole(&alone, alone_took),
            beside: whole(&beside, beside_took),
        };
        // Were the clone to answer within 1.15x its quiet time, with the
        // WAN bytes it took alone to its answer.
        let bound = span_bound(
            1.15 * quiet.responsive + AFTER_ANSWER,
            quiet.wan_responsive.unwrap_or(0),
            self.settings.bytes_per_sec(),
        );
        let records = vec![
            quiet.record(Scenario::LazyNeighbourQuiet.label(), 1, 1, quiet_wan),
            clone.record(Scenario::LazyNeighbour.label(), 1, 1, both_wan),
        ];
        let mut notes = vec![format!(
            "Lazy neighbour: node B copied {BULK} ({:.0} MiB) through the LAN proxy in {alone_took:.1} s \
             alone and {beside_took:.1} s with node A's learned lazy clone starting {from:.1} s \
             in ({:.2}x its throughput); over the clone's span ({from:.1} s to {to:.1} s) the \
             copy moved {:.1} MiB/s alone and {:.1} MiB/s beside the clone ({:.2}x). The clone \
             alone took {:.1} WAN MiB to its answer in {:.2} s: answering within 1.15x of that, \
             it would leave the copy at most {bound:.2}x over such a span.",
            bytes_at(&alone, f64::MAX) / MIB as f64,
            rates.beside / rates.alone.max(1e-9),
            span.0,
            span.1,
            span.1 / span.0.max(1e-9),
            quiet.wan_responsive.unwrap_or(0) as f64 / MIB as f64,
            quiet.responsive,
        )];
        notes.push(lan_note);
        Ok((records, rates, notes))
    }
}

/// What the LAN proxy's gate did in the run with both, by class (requests
/// that waited, seconds they waited, MiB admitted), and its file cache's
/// wire bytes by class.
fn lan_gate_note(before: &crate::Stats, after: &crate::Stats) -> String {
    let at = |s: &crate::Stats, path: &[&str]| {
        path.iter()
            .fold(s.json(), |v, k| &v[*k])
            .as_u64()
            .unwrap_or(0)
    };
    let d = |path: &[&str]| at(after, path).saturating_sub(at(before, path));
    let mut parts = Vec::new();
    for class in ["demand", "profile", "background", "bulk"] {
        let gate = |k| d(&["status", "upstream_client", "gate", class, k]);
        parts.push(format!(
            "{class} {} waited {:.2} s, {:.1} MiB admitted, {:.1} MiB on the wire",
            gate("waits"),
            gate("wait_micros") as f64 / 1e6,
            gate("admitted_bytes") as f64 / MIB as f64,
            d(&["file_cache", &format!("{class}_wire_bytes")]) as f64 / MIB as f64
        ));
    }
    format!(
        "Lazy neighbour: the LAN proxy's gate and file cache over the run with both: {}.",
        parts.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_come_from_samples_linearly() {
        let p = vec![(0.0, 0), (1.0, MIB), (3.0, 5 * MIB)];
        assert!((rate(&p, 0.0, 1.0) - 1.0).abs() < 1e-9);
        assert!((rate(&p, 1.0, 3.0) - 2.0).abs() < 1e-9);
        assert!((bytes_at(&p, 2.0) - 3.0 * MIB as f64).abs() < 1e-6);
        // Past the last sample the copy is done: nothing more moves.
        assert!((rate(&p, 3.0, 10.0)).abs() < 1e-9);
    }

    #[test]
    fn the_copy_keeps_at_most_what_the_clones_bytes_leave_of_the_span() {
        // 10 s of a 4 MiB/s link: 40 MiB, of which the clone takes 10.
        assert!((span_bound(10.0, 10 * MIB, 4.0 * MIB as f64) - 0.75).abs() < 1e-9);
        assert_eq!(span_bound(1.0, 10 * MIB, 4.0 * MIB as f64), 0.0);
        assert_eq!(span_bound(0.0, 0, 0.0), 1.0);
    }
}
