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
//! **Every clone** is timed to its answer to a request that reads the
//! `boot/` files from its memory (time to answer, what a user waits for;
//! the report leads with it) and to the guest verified running (the
//! paper's clone time) ([`guest::resume_clone`]).
//!
//! **Lazy storms** ([`storm`](self::storm); "lazy storm N"): lazy WAN-S1's
//! first clone is recorded by its node's FUSE mount ([`trace`]) and
//! replayed by N processes ([`replay`]) through N fresh nodes, each with
//! its own certificate, behind one fresh LAN proxy, once the image server
//! holds the learned profile: what 64 guests resuming at once would ask
//! of a site, without 64 QEMUs.
//!
//! **Dedup across images**: the golden images share what real ones do, the
//! kernel and system files (in their disks and, read at boot, in their
//! memory), each with its own working set and data ([`guest::files`]).
//! Once they are built, [`census`] counts what they share and the least
//! each WAN-S2 clone can move when its proxy copies blocks it holds in
//! other images. The "... dedup" scenarios run WAN-S1, WAN-S2, WAN-S3 and
//! lazy WAN-S2 again with the proxies' dedup on; every other scenario runs
//! its node and LAN proxies with `--no-dedup` ([`Dedup`]).
//!
//! **Where each part is**: [`run`] here runs the scenarios and judges
//! them; `bench` is the test bed they share (the image server, WAN links,
//! node proxies), `images` builds the golden images, `copy_first`, [`lazy`],
//! `storm` and [`cut`] run the scenarios ([`trace`] and [`replay`] are the
//! storm's recording and replay), `procedure` is one clone (`console` reads
//! its logs for errors), [`guest`] the VM side, `scenario` the settings
//! (and the numbers every part shares), `outcome` what a run found, and
//! `summary` and [`report`] the text and figures. Each part imports what it
//! needs from the part that defines it; nothing imports this file.

pub mod census;
mod console;
pub mod cut;
pub mod guest;
pub mod lazy;
pub mod report;
mod summary;

pub mod replay;
pub mod trace;

mod bench;
mod busy;
mod copy_first;
mod images;
mod neighbour;
mod outcome;
mod procedure;
pub mod restart;
mod scenario;
mod storm;
mod stream;

use std::time::Instant;

use anyhow::{Result, ensure};

use crate::bench::loadavg;
use bench::Bench;
use guest::{MEM, STATE};
pub use images::run_census;
use images::zstd_size;
use outcome::Floor;
pub use outcome::{Goal, Outcome};
pub use scenario::{
    ATTR_TIMEOUT_SECS, Dedup, MAX_NODES, RestartPlan, Scenario, Settings, is_lazy_label,
};
use summary::{copy_goal, dedup_goals, goals, lazy_goals, storm_wan_goal, summary};
pub use summary::{report_markdown, write_outputs};

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
    let mut bench = Bench::start(settings)?;
    let mut records = Vec::new();
    let mut stats = Vec::new();
    let mut calls = Vec::new();
    let mut lan_stats = None;
    let mut lazy_lan_stats = None;
    let mut cuts = Vec::new();
    let mut notes = Vec::new();
    let mut dedup_notes = Vec::new();
    let mut profile = None;
    let mut golden_checks = 0;
    let wanted = |s: Scenario| settings.scenarios.contains(&s);
    // A storm replays lazy WAN-S1's first clone once its profile is sent;
    // the neighbour's clone is a learned one too.
    let storms = settings.storm_nodes() > 0;
    let learns = storms || settings.neighbour();
    let mut copy_rates = None;
    let mut trace = None;
    let mut storm_crossed = None;
    let mut restarts = None;
    for scenario in Scenario::ALL {
        // Lazy WAN-S1 learned needs lazy WAN-S1's node: they run together.
        let wanted = wanted(scenario)
            || (scenario == Scenario::LazyWanS1 && (wanted(Scenario::LazyWanS1Learned) || learns))
            || (scenario == Scenario::LazyNeighbour && wanted(Scenario::LazyNeighbourQuiet))
            || (scenario == Scenario::LazyBusy && wanted(Scenario::LazyBusyLearned));
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
            Scenario::WanPWarm
            | Scenario::LazyWanPWarm
            | Scenario::LazyWanS1Learned
            | Scenario::LazyBusyLearned
            | Scenario::LazyNeighbourQuiet => {}
            Scenario::LazyNeighbour => {
                let (r, rates, n) = bench.run_neighbour()?;
                records.extend(r);
                notes.extend(n);
                copy_rates = Some(rates);
            }
            Scenario::LazyBusy => {
                let learned = settings.scenarios.contains(&Scenario::LazyBusyLearned);
                let (r, n) = bench.run_lazy_busy(learned)?;
                records.extend(r);
                notes.extend(n);
            }
            Scenario::LazyRestart => {
                let (r, steps, totals) = bench.run_lazy_restart()?;
                records.extend(r);
                restarts = Some((steps, totals));
            }
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
                let learned = settings.scenarios.contains(&Scenario::LazyWanS1Learned) || learns;
                let record = storms.then(|| bench.work.path().join("clone-trace.txt"));
                let mut recorded = None;
                let (r, s) = bench.run_lazy_s1(
                    learned,
                    record.as_deref().map(|p| (p, &mut recorded)),
                    &mut calls,
                    &mut notes,
                    &mut profile,
                )?;
                records.extend(r);
                stats.extend(s);
                trace = record.zip(recorded);
            }
            storm if storm.storm_size().is_some() => {
                let Some((path, trace)) = &trace else {
                    notes.push(format!(
                        "{} did not run: lazy WAN-S1's first clone left no trace (a gvfs-proxy without --mount-trace).",
                        storm.label()
                    ));
                    continue;
                };
                let (r, n, crossed) = bench.run_storm(storm, trace, path)?;
                records.extend(r);
                notes.extend(n);
                // Scenario::ALL has the storms from the smallest up.
                storm_crossed = Some((storm, crossed));
            }
            lazy if lazy.is_lazy() => {
                let (r, s) = bench.run_lazy(lazy)?;
                records.extend(r);
                if let Some(s) = s {
                    stats.push((lazy, s));
                }
            }
            _ => {
                let (r, s) = bench.run(scenario, &mut calls, &mut dedup_notes)?;
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
    bench.check_golden((1..=settings.images).chain(images::busy_image(settings)))?;
    golden_checks += 1;
    let golden = bench.golden(1);
    let zstd_mem = zstd_size(&golden.join(MEM))?;
    let zstd_state = zstd_size(&golden.join(STATE))?;
    let disk_read = stats
        .iter()
        .find(|(s, _)| *s == Scenario::WanS1)
        .map_or(0, |(_, v)| v.cache.counts.fetched_bytes);
    let floor = (zstd_mem + zstd_state + disk_read) as f64 / settings.bytes_per_sec();
    let floor = Floor {
        secs: floor,
        zstd_mem,
        zstd_state,
        disk_read,
    };
    let goals = goals(settings, &records, &floor);
    let mut lazy_goals = lazy_goals(settings, &records, &floor);
    lazy_goals.push(storm_wan_goal(&records, storm_crossed));
    lazy_goals.push(copy_goal(
        copy_rates.map(|r: neighbour::CopyRates| (r.alone, r.beside)),
    ));
    let dedup_goals = dedup_goals(settings, &records, bench.census.as_ref());
    if !bench.no_dedup_flag && records.iter().any(|r| r.scenario.ends_with(" dedup")) {
        dedup_notes.push(
            "This gvfs-proxy has no `--no-dedup`: the scenarios without dedup ran the same \
             proxies as their dedup twins."
                .to_owned(),
        );
    }
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
        census: bench.census.clone(),
        dedup_goals,
        dedup_notes,
        restarts,
    };
    outcome.markdown = summary(settings, &outcome, &floor, &load);
    Ok(outcome)
}
