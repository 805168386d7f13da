//! The copy-first scenarios, the paper's procedure: Local, WAN-S1, WAN-S2
//! and WAN-S3 (and their dedup twins), full copy and plain NFS one clone
//! after another, and WAN-P's clones at once behind one LAN proxy.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Instant;

use anyhow::{Result, bail};

use super::bench::{Bench, at_once, node_ip, parallel_records, wire};
use super::guest::FILES;
use super::images::image_dir;
use super::procedure::{Source, Timing};
use super::report::CloneRecord;
use super::scenario::{Dedup, Scenario};
use super::stream::{FileServer, fetch_stream};
use super::summary::lan_fill_note;
use crate::Stats;

/// The address plain NFS reaches the image server at through the WAN.
const PLAIN_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 58);

impl Bench<'_> {
    /// Runs copy-first `scenario`; returns its clones in order, with the
    /// stats of the first node's proxy after its first clone (for the
    /// report). WAN-S1 also notes in `calls` what crossed the WAN for its
    /// first two clones; WAN-S3 (and its dedup twin) notes in `notes` what
    /// filling its LAN proxy moved across the WAN.
    pub(super) fn run(
        &self,
        scenario: Scenario,
        calls: &mut Vec<(String, BTreeMap<String, u64>)>,
        notes: &mut Vec<String>,
    ) -> Result<(Vec<CloneRecord>, Option<Stats>)> {
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
                        first_stats = Some(node.proxy.stats()?);
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
                notes.push(lan_fill_note(label, wire(&wan), &lan.proxy.stats()?));
                let node = self.node(Some(node_ip(1)), lan.proxy.upstream_url(), dedup)?;
                for i in 0..n {
                    let before = wire(&wan);
                    let t = self.clone_through(&node, image_of(i), &|| wire(&wan) - before)?;
                    record(i + 1, image_of(i), t, wire(&wan) - before);
                    if i == 0 {
                        first_stats = Some(node.proxy.stats()?);
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
                let g = self.ganesha()?;
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

    /// WAN-P: `clones` nodes behind one LAN proxy clone image 1 at once,
    /// cold, then again, warm. Returns the clones and the LAN proxy's stats.
    pub(super) fn run_parallel(&self) -> Result<(Vec<CloneRecord>, Stats)> {
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
        Ok((records, lan.proxy.stats()?))
    }
}
