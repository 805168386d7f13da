//! The lazy clones' goals and tables, and time to responsiveness for every
//! scenario.

use crate::clone::outcome::{Floor, Goal, Outcome};
use crate::clone::report::CloneRecord;
use crate::clone::scenario::{MIB, Scenario, Settings, is_lazy_label};

use super::table::{goals_rows, mean};

/// The first record of `label` numbered `clone`.
fn find<'a>(records: &'a [CloneRecord], label: &str, clone: usize) -> Option<&'a CloneRecord> {
    records
        .iter()
        .find(|r| r.scenario == label && r.clone == clone)
}

fn mib_of(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

/// The lazy clones' goals, from the clones of one run (copy-first WAN-S1's
/// first clone is what the cold ones are held against).
pub(in crate::clone) fn lazy_goals(
    settings: &Settings,
    records: &[CloneRecord],
    floor: &Floor,
) -> Vec<Goal> {
    let secs = |label: &str, clone: usize| find(records, label, clone).map(|r| r.total_secs);
    let mean_of = |label: &str, from: usize| {
        mean(
            records
                .iter()
                .filter(|r| r.scenario == label && r.clone >= from)
                .map(|r| r.total_secs),
        )
    };
    let copy_cold = secs(Scenario::WanS1.label(), 1);
    let cold = secs(Scenario::LazyWanS1.label(), 1);
    let learned = secs(Scenario::LazyWanS1Learned.label(), 1);
    let learned_wan = find(records, Scenario::LazyWanS1Learned.label(), 1)
        .and_then(|r| r.wan_running_bytes)
        .map(mib_of);
    let warm = mean_of(Scenario::LazyWanS1.label(), 2);
    // Warm against warm, as for copy-first clones: lazy Local's first
    // clone reads the golden file from disk, the next from the page cache.
    let local = mean_of(Scenario::LazyLocal.label(), 2).or(mean_of(Scenario::LazyLocal.label(), 1));
    let parallel = records
        .iter()
        .filter(|r| r.scenario == Scenario::LazyWanPCold.label())
        .map(|r| r.total_secs)
        .reduce(f64::max);
    let storm = storm_parts(records);
    let goals = [
        (
            "lazy cold clone with a learned working set (lazy WAN-S1 learned #1) <= 1.5 s"
                .to_owned(),
            "s",
            learned,
            Some(1.5),
            1.0,
        ),
        (
            "lazy cold clone with a learned working set <= 0.2x the copy-first cold clone \
             (WAN-S1 #1)"
                .to_owned(),
            "s",
            learned,
            copy_cold,
            0.2,
        ),
        (
            "lazy cold clone of an image never cloned lazily before (lazy WAN-S1 #1) <= 0.5x \
             the copy-first cold clone"
                .to_owned(),
            "s",
            cold,
            copy_cold,
            0.5,
        ),
        (
            "WAN bytes before the learned lazy clone runs (lazy WAN-S1 learned #1) <= 25% of \
             the compressed memory image"
                .to_owned(),
            "MiB",
            learned_wan,
            Some(mib_of(floor.zstd_mem)),
            0.25,
        ),
        (
            "warm lazy clone (lazy WAN-S1 #2.., mean) <= 0.3 s".to_owned(),
            "s",
            warm,
            Some(0.3),
            1.0,
        ),
        (
            "warm lazy clone <= 1.2x lazy Local (#2.., mean)".to_owned(),
            "s",
            warm,
            local,
            1.2,
        ),
        (
            format!(
                "lazy WAN-P: {} cold clones at once <= 1.2x one lazy cold clone (lazy WAN-S1 #1)",
                settings.clones
            ),
            "s",
            parallel,
            cold,
            1.2,
        ),
        (
            "lazy storm 8: the last answer <= 1.3x (the learned answer + lazy WAN-P warm's last \
             answer - a single warm answer)"
                .to_owned(),
            "s",
            storm.last_answer(Scenario::LazyStorm8),
            storm.expected_8,
            1.3,
        ),
        (
            "lazy storm 8: the last answer <= 0.5x copy-first WAN-P cold's last answer".to_owned(),
            "s",
            storm.last_answer(Scenario::LazyStorm8),
            storm.copy_parallel,
            0.5,
        ),
        (
            "lazy storm 64: the last answer <= 1.3x lazy storm 1's".to_owned(),
            "s",
            storm.last_answer(Scenario::LazyStorm64),
            storm.last_answer(Scenario::LazyStorm1),
            1.3,
        ),
        (
            "lazy neighbour: the answer <= 1.15x lazy neighbour quiet's".to_owned(),
            "s",
            find(records, Scenario::LazyNeighbour.label(), 1).and_then(|r| r.responsive_secs),
            find(records, Scenario::LazyNeighbourQuiet.label(), 1).and_then(|r| r.responsive_secs),
            1.15,
        ),
        (
            "lazy busy learned: the answer <= 0.5x lazy busy's (a guest that never goes quiet \
             still teaches its working set)"
                .to_owned(),
            "s",
            find(records, Scenario::LazyBusyLearned.label(), 1).and_then(|r| r.responsive_secs),
            find(records, Scenario::LazyBusy.label(), 1).and_then(|r| r.responsive_secs),
            0.5,
        ),
    ];
    goals
        .into_iter()
        .map(|(name, unit, measured, against, at_most)| Goal {
            name,
            unit,
            measured,
            against,
            at_most,
            best: None,
        })
        .collect()
}

/// The goal of the copy beside the clone: it keeps 0.8x of its
/// throughput alone (as the copy alone's MiB/s over its MiB/s beside the
/// clone, at most 1.25); `rates` are the whole copy's MiB/s alone and
/// beside it.
pub(in crate::clone) fn copy_goal(rates: Option<(f64, f64)>) -> Goal {
    Goal {
        name: "lazy neighbour: the copy alone's MiB/s <= 1.25x the copy's beside the clone (it \
               keeps 0.8x of its throughput, the whole copy's)"
            .to_owned(),
        unit: "MiB/s",
        measured: rates.map(|r| r.0),
        against: rates.map(|r| r.1),
        at_most: 1.25,
        best: None,
    }
}

/// The goal of the working set crossing the WAN once in the largest storm
/// that ran (`crossed`: it, and its LAN proxy's profile and demand wire
/// bytes over the storm): no more than 1.1x what one learned clone's node
/// fetched as profile and demand (lazy WAN-S1 learned #1). The LAN's own
/// background stream, the rest of the image, crosses once too, but is not
/// the working set: how much of it crosses before the last answer depends
/// only on how long the storm takes.
pub(in crate::clone) fn storm_wan_goal(
    records: &[CloneRecord],
    crossed: Option<(Scenario, u64)>,
) -> Goal {
    Goal {
        name: format!(
            "{}: the working set crosses the WAN once: the LAN proxy's profile + demand MiB <= \
             1.1x one learned clone's (lazy WAN-S1 learned #1's node)",
            crossed.map_or("the largest lazy storm", |(s, _)| s.label())
        ),
        unit: "MiB",
        measured: crossed.map(|(_, bytes)| mib_of(bytes)),
        against: storm_parts(records).profile_and_demand.map(mib_of),
        at_most: 1.1,
        best: None,
    }
}

/// What the storms' goals are judged from.
struct StormParts<'a> {
    records: &'a [CloneRecord],
    /// The learned answer + lazy WAN-P warm's last answer - a single warm
    /// answer (lazy WAN-S1 #2.., mean).
    expected_8: Option<f64>,
    /// Copy-first WAN-P cold's last answer.
    copy_parallel: Option<f64>,
    /// Lazy WAN-S1 learned's profile and demand wire bytes.
    profile_and_demand: Option<u64>,
}

impl StormParts<'_> {
    fn of(&self, s: Scenario) -> impl Iterator<Item = &CloneRecord> {
        self.records.iter().filter(move |r| r.scenario == s.label())
    }

    fn last_answer(&self, s: Scenario) -> Option<f64> {
        self.of(s)
            .filter_map(|r| r.responsive_secs)
            .reduce(f64::max)
    }
}

fn storm_parts(records: &[CloneRecord]) -> StormParts<'_> {
    let answer = |label: &str, clone: usize| find(records, label, clone)?.responsive_secs;
    let last_answer = |label: &str| {
        records
            .iter()
            .filter(|r| r.scenario == label)
            .filter_map(|r| r.responsive_secs)
            .reduce(f64::max)
    };
    let warm = mean(
        records
            .iter()
            .filter(|r| r.scenario == Scenario::LazyWanS1.label() && r.clone >= 2)
            .filter_map(|r| r.responsive_secs),
    );
    let learned = find(records, Scenario::LazyWanS1Learned.label(), 1);
    let expected_8 = match (
        answer(Scenario::LazyWanS1Learned.label(), 1),
        last_answer(Scenario::LazyWanPWarm.label()),
        warm,
    ) {
        (Some(l), Some(p), Some(w)) => Some(l + p - w),
        _ => None,
    };
    StormParts {
        records,
        expected_8,
        copy_parallel: last_answer(Scenario::WanPCold.label()),
        profile_and_demand: learned
            .and_then(|r| r.fetch)
            .map(|f| f.profile_wire_bytes + f.demand_wire_bytes),
    }
}

/// Time to answer (responsiveness) per scenario, in order of first
/// appearance: means of the clones' times to the answer and to running, the
/// WAN bytes until then, and when their node held the whole memory image
/// (empty where not measured). Empty without records.
pub(super) fn responsiveness_markdown(records: &[CloneRecord]) -> String {
    let mut scenarios: Vec<&str> = Vec::new();
    for r in records {
        if !scenarios.contains(&r.scenario.as_str()) {
            scenarios.push(&r.scenario);
        }
    }
    if scenarios.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "Time to answer (time to responsiveness), then time to running: after the guest is \
         verified running the harness asks it to read its boot/ files (its working set, in its \
         page cache, so in the memory image) and answer with their MD5; seconds from the start \
         of the clone (mean of the clones; a storm's replays stand for clones, their answer \
         the end of the recorded trace), WAN MiB from the start until then (for WAN-P and the \
         storms, the shared link's, every node's), and, for lazy clones new to their node, \
         when the node proxy held the whole memory image:\n\n\
         | scenario | answered (s) | verified running (s) | answer after running (s) | WAN MiB to answer | WAN MiB to running | memory image whole on the node (s) |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    for name in scenarios {
        let of = || records.iter().filter(move |r| r.scenario == name);
        let secs = |x: Option<f64>| x.map_or(String::new(), |x| format!("{x:.2}"));
        let mibs = |x: Option<f64>| x.map_or(String::new(), |x| format!("{x:.1}"));
        out += &format!(
            "| {name} | {} | {} | {} | {} | {} | {} |\n",
            secs(mean(of().filter_map(|r| r.responsive_secs))),
            secs(mean(of().map(|r| r.total_secs))),
            secs(mean(
                of().filter_map(|r| r.responsive_secs.map(|a| a - r.total_secs))
            )),
            mibs(mean(
                of().filter_map(|r| r.wan_responsive_bytes.map(mib_of))
            )),
            mibs(mean(of().filter_map(|r| r.wan_running_bytes.map(mib_of)))),
            secs(mean(of().filter_map(|r| r.whole_local_secs))),
        );
    }
    out
}

/// The lazy clones' part of the report: their goals, where the bytes of
/// their first clones went, what became of the working-set profile, the
/// check of the golden images, and lazy WAN-P's LAN proxy. Empty without
/// lazy clones.
pub(super) fn lazy_markdown(outcome: &Outcome) -> String {
    let lazy: Vec<&CloneRecord> = outcome
        .records
        .iter()
        .filter(|r| is_lazy_label(&r.scenario))
        .collect();
    if lazy.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "\nThe lazy clones' goals:\n\n| goal | measured | ratio | verdict |\n|---|---|---:|---|\n",
    );
    out += &goals_rows(&outcome.lazy_goals);

    let shown: Vec<&&CloneRecord> = lazy
        .iter()
        .filter(|r| {
            r.fetch.is_some()
                && (r.clone == 1 || (r.scenario == Scenario::LazyWanS1.label() && r.clone == 2))
        })
        .collect();
    if !shown.is_empty() {
        out += "\nWhere the bytes went in the lazy clones through a node (the first of each \
                scenario, and lazy WAN-S1's first warm one): seconds from the clone's start; WAN \
                MiB from its start; the node proxy's file cache over the clone (until the memory \
                image was whole there, for a clone new to the node): MiB received for bytes a \
                read was waiting for, for 8 KiB pieces a working-set profile named, by the \
                background stream, and in all; reads that waited and their waits summed; \
                whole-file fetches that started with a profile and the pieces it named; MiB \
                the node's FUSE mount read for the guest's page faults:\n\n\
                | clone | running s | answered s | memory image whole s | WAN MiB to running / to answer / in all | file cache MiB on demand / profile / background / all | reads waited (s waited) | profile hits (pieces) | FUSE MiB read |\n\
                |---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
        for r in shown {
            let f = r.fetch.unwrap_or_default();
            let mibs = |x: Option<u64>| x.map_or("-".to_owned(), |x| format!("{:.1}", mib_of(x)));
            out += &format!(
                "| {} #{} | {:.2} | {} | {} | {} / {} / {:.1} | {:.1} / {:.1} / {:.1} / {:.1} | {} ({:.2}) | {} ({}) | {:.1} |\n",
                r.scenario,
                r.clone,
                r.total_secs,
                r.responsive_secs
                    .map_or(String::new(), |x| format!("{x:.2}")),
                r.whole_local_secs
                    .map_or(String::new(), |x| format!("{x:.2}")),
                mibs(r.wan_running_bytes),
                mibs(r.wan_responsive_bytes),
                mib_of(r.wan_bytes),
                mib_of(f.demand_wire_bytes),
                mib_of(f.profile_wire_bytes),
                mib_of(f.background_wire_bytes),
                mib_of(f.wire_bytes),
                f.faults_waited,
                f.fault_wait_micros as f64 / 1e6,
                f.profile_hits,
                f.profile_pieces,
                mib_of(f.mount_read_bytes),
            );
        }
        out += "\nHow a lazy clone's QEMU runs: under `gvfsctl no-huge-pages`, which makes \
                its `MADV_HUGEPAGE` advice on guest RAM a no-op (a seccomp filter; QEMU is \
                unchanged), with the node's mount at `--mount-readahead 0`. With that advice \
                Linux reads a privately mapped file 4 MiB at a time at the first fault in each \
                2 MiB block (that block and the next), whatever the mount's read-ahead \
                (checked on Linux 6.18, also with transparent huge pages set to never and with \
                `PR_SET_THP_DISABLE`), so a resumed guest's scattered faults pulled most of its \
                memory image; without it a fault reads its 4 KiB page. The node then fetches, \
                as demand, the 8 KiB piece around it when the image has a working-set profile \
                (which brings the rest of what the guest touches: its pieces in the order the \
                guest first touched them, up to 96 or 1 MiB of them in flight), and its whole 1 MiB chunk \
                when it has none (a guest never cloned before faults all over its memory, one \
                fault at a time, each a WAN round trip behind the background stream on the \
                same link: a chunk saves the faults near it). What bounds a lazy clone of an \
                image never cloned before is those faults; what bounds a learned one is the \
                bytes of its working set.\n";
    }
    for note in &outcome.notes {
        out += &format!("\n{note}\n");
    }
    if let Some(f) = find(&outcome.records, Scenario::LazyWanS1.label(), 1)
        .and_then(|r| r.fetch)
        .filter(|f| f.profile_hits > 0)
    {
        out += &format!(
            "\nLazy WAN-S1's first clone started from a working-set profile of {} pieces that \
             an earlier scenario's node had taught the image server: it is not a clone of an \
             image never cloned before.\n",
            f.profile_pieces
        );
    }
    if outcome.golden_checks > 0 {
        out += &format!(
            "\nThe golden memory images at the origin were unchanged (SHA-256 against their \
             digests when they were built) at each of {} checks: after each lazy scenario and \
             at the end.\n",
            outcome.golden_checks
        );
    }
    if let Some(v) = &outcome.lazy_lan_stats {
        out += &format!(
            "\nLazy WAN-P's LAN proxy fetched {} chunks ({:.1} MiB) across the WAN for all the \
             nodes and answered {} FETCHes from its file cache: {} chunks handed on in the \
             frames they came in, {} compressed there.\n",
            v.file_cache.counts.chunks_fetched,
            mib_of(v.file_cache.counts.wire_bytes),
            v.ext.from_file_cache,
            v.file_cache.counts.frames_reused,
            v.file_cache.counts.frames_made,
        );
    }
    out
}
