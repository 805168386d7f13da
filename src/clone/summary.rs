//! The clone benchmark's verdict and text: the goals judged from a
//! run's clones, the summary printed at the end, and the Markdown report
//! and files written for docs/clone.md.

use std::path::Path;

use anyhow::{Context, Result};

use super::cut;
use super::outcome::{Floor, Goal, Outcome, fmt3};
use super::report::{self, CloneRecord};
use super::scenario::{MIB, Scenario, Settings, is_lazy_label};
use crate::Stats;
use table::{goals_rows, mean};

/// The goals, from the clones of one run.
pub(super) fn goals(settings: &Settings, records: &[CloneRecord], floor: &Floor) -> Vec<Goal> {
    let secs = |label: &str, clone: usize| {
        records
            .iter()
            .find(|r| r.scenario == label && r.clone == clone)
            .map(|r| r.total_secs)
    };
    let mean_of = |label: &str, from: usize| {
        mean(
            records
                .iter()
                .filter(|r| r.scenario == label && r.clone >= from)
                .map(|r| r.total_secs),
        )
    };
    let max_of = |label: &str| {
        records
            .iter()
            .filter(|r| r.scenario == label)
            .map(|r| r.total_secs)
            .reduce(f64::max)
    };
    let cold = secs("WAN-S1", 1);
    let full = secs("full copy", 1);
    let plain = secs("plain NFS", 1);
    let warm = mean_of("WAN-S1", 2);
    // Warm against warm: Local's first clone reads the golden image from
    // disk, its next ones from the page cache (as warm clones do from the
    // node proxy's caches).
    let local = mean_of("Local", 2).or(mean_of("Local", 1));
    let parallel = max_of("WAN-P cold");
    let best = |against: Option<f64>| against.filter(|&b| b > 0.0).map(|b| floor.secs / b);
    let goals = [
        (
            "cold first clone (WAN-S1 #1) <= 1/10 of the full copy".to_owned(),
            cold,
            full,
            0.1,
            best(full),
        ),
        (
            "cold first clone <= 1/20 of plain NFS".to_owned(),
            cold,
            plain,
            0.05,
            best(plain),
        ),
        (
            "warm clone (WAN-S1 #2.., mean) <= 1.5x Local (#2.., mean)".to_owned(),
            warm,
            local,
            1.5,
            None,
        ),
        (
            format!(
                "WAN-P: {} cold clones at once <= 1.2x one cold clone",
                settings.clones
            ),
            parallel,
            cold,
            1.2,
            None,
        ),
        (
            "cold clone <= 1.5x the floor".to_owned(),
            cold,
            Some(floor.secs),
            1.5,
            Some(1.0),
        ),
    ];
    goals
        .into_iter()
        .map(|(name, measured, against, at_most, best)| Goal {
            name,
            unit: "s",
            measured,
            against,
            at_most,
            best,
        })
        .collect()
}

/// The report around the tables.
pub(super) fn summary(settings: &Settings, outcome: &Outcome, floor: &Floor, load: &str) -> String {
    let Outcome {
        records,
        client_stats: stats,
        wan_calls: calls,
        goals,
        ..
    } = outcome;
    let lan = outcome.lan_stats.as_ref();
    let size = settings.size;
    let mut out = format!(
        "{} golden image{} of {} MiB RAM and {} MiB of disk files, {} MiB of them system files \
         the same on every image ({} MiB read at boot: {} MiB of system files and {} MiB of the \
         image's own), {} clones per sequence; WAN {} ms RTT, {} Mbit/s; {load}.\n\n",
        settings.images,
        if settings.images == 1 { "" } else { "s" },
        size.ram_mib,
        size.disk_files_mib,
        size.system_disk_mib,
        size.system_mib + size.working_set_mib,
        size.system_mib,
        size.working_set_mib,
        settings.clones,
        settings.rtt.as_millis(),
        settings.mbit
    );
    let (lazy_records, copy_records): (Vec<CloneRecord>, Vec<CloneRecord>) = records
        .iter()
        .cloned()
        .partition(|r| is_lazy_label(&r.scenario));
    // Time to answer leads: it is what a user of a clone waits for; time
    // to running (the paper's clone time) follows.
    out += &lazy::responsiveness_markdown(records);
    out += "\nClone time in seconds, from the first copy to the guest verified running";
    if lazy_records.is_empty() {
        out += ":\n\n";
    } else {
        out += " (copy-first clones, the paper's procedure; lazy clones below):\n\n";
    }
    if !copy_records.is_empty() || lazy_records.is_empty() {
        out += &report::records_markdown(&copy_records);
    }
    if !lazy_records.is_empty() {
        out += "\nLazy clones (`src/clone/lazy.rs`: only vm.json and the device state copied, the \
                golden memory image mapped private and read-only from the node proxy's FUSE \
                mount), the same times:\n\n";
        out += &report::records_markdown(&lazy_records);
    }

    out += "\n| goal | measured | ratio | verdict |\n|---|---|---:|---|\n";
    out += &goals_rows(goals);
    for g in goals {
        if let Some(best) = g.best.filter(|&b| b > g.at_most) {
            out += &format!(
                "\nWith these guests on this link the floor alone is {best:.3} of \"{}\"'s \
                 baseline, more than the goal allows; a clone beats the floor only by what it \
                 does not count (repeated blocks sent once).\n",
                g.name
            );
        }
    }
    out += &format!(
        "\nThe floor is (zstd -3 of the memory image {:.1} MiB + of the device state {:.2} MiB \
         + disk and config bytes the cold clone read through the block cache {:.2} MiB) / \
         bandwidth = {:.2} s.\n",
        floor.zstd_mem as f64 / MIB as f64,
        floor.zstd_state as f64 / MIB as f64,
        floor.disk_read as f64 / MIB as f64,
        floor.secs
    );
    let first = records
        .iter()
        .find(|r| r.scenario == "WAN-S1" && r.clone == 1);
    let s1 = stats.iter().find(|(s, _)| *s == Scenario::WanS1);
    if let (Some(r), Some((_, v))) = (first, s1) {
        let c = &v.file_cache.counts;
        let micros = |n: u64| n as f64 / 1e6;
        out += &format!(
            "\nWhere the time goes in the cold clone (WAN-S1 #1, {:.2} s): copying vm.json, the \
             memory image and the device state {:.2} s, in which the node proxy's whole-file \
             fetches took {:.2} s from first READ to last chunk ({:.1} MiB across the WAN) and \
             decompressing them {:.2} s of CPU; creating the overlay {:.2} s; QEMU's resume to \
             the verified tick {:.2} s (the disk blocks it reads come through the block cache).\n",
            r.total_secs,
            r.copy_secs,
            micros(c.fetch_micros),
            c.wire_bytes as f64 / MIB as f64,
            micros(c.decompress_micros),
            r.overlay_secs,
            r.resume_secs,
        );
    }
    if !stats.is_empty() {
        out += "\nThe first clone's client proxy (MiB; `gvfsctl stats --json`):\n\n\
                | scenario | file cache wire / raw | repeated blocks copied here | chunks fetched / zero | block cache fetched | zero-map bytes |\n\
                |---|---:|---:|---:|---:|---:|\n";
        for (scenario, v) in stats {
            let m = |n: u64| format!("{:.1}", n as f64 / MIB as f64);
            let c = &v.file_cache.counts;
            out += &format!(
                "| {} | {} / {} | {} | {} / {} | {} | {} |\n",
                scenario.label(),
                m(c.wire_bytes),
                m(c.raw_bytes),
                m(c.repeat_bytes),
                c.chunks_fetched,
                c.zero_chunks,
                m(v.cache.counts.fetched_bytes),
                m(v.meta.zero_bytes),
            );
        }
    }
    if let Some(v) = lan {
        out += &format!(
            "\nWAN-P's LAN proxy fetched {} chunks ({:.1} MiB) across the WAN for all the nodes \
             and answered {} FETCHes from its file cache: {} chunks handed on in the frames \
             they came in, {} compressed there.\n",
            v.file_cache.counts.chunks_fetched,
            v.file_cache.counts.wire_bytes as f64 / MIB as f64,
            v.ext.from_file_cache,
            v.file_cache.counts.frames_reused,
            v.file_cache.counts.frames_made,
        );
        out += &parallel_time(records, v, size.ram_mib);
    }
    out += &lazy::lazy_markdown(outcome);
    out += &cut::cuts_markdown(&outcome.cuts, settings.cut_hold);
    if let Some((steps, totals)) = &outcome.restarts {
        out += &super::restart::restarts_markdown(steps, totals);
    }
    if !calls.is_empty() {
        out += "\nCalls that crossed the WAN (answered by the image-server proxy; each costs at \
                least one round trip):\n\n| clone | calls |\n|---|---|\n";
        for (label, c) in calls {
            let list: Vec<String> = c.iter().map(|(k, v)| format!("{k} {v}")).collect();
            let list = if list.is_empty() {
                "none".to_owned()
            } else {
                list.join(", ")
            };
            out += &format!("| {label} | {list} |\n");
        }
    }
    out += &dedup::dedup_markdown(outcome);
    if let Some(census) = &outcome.census {
        out += &census.markdown();
    }
    out
}

/// Where WAN-P cold's time goes: the LAN proxy's fetches across the WAN,
/// then the nodes' copying after the last chunk, set against the same
/// copies with every cache warm. Empty without WAN-P's records.
fn parallel_time(records: &[CloneRecord], lan: &Stats, ram_mib: u64) -> String {
    let of = |label: &'static str| records.iter().filter(move |r| r.scenario == label);
    let Some(slowest) =
        of(Scenario::WanPCold.label()).max_by(|a, b| a.total_secs.total_cmp(&b.total_secs))
    else {
        return String::new();
    };
    let warm: Vec<f64> = of(Scenario::WanPWarm.label())
        .map(|r| r.copy_secs)
        .collect();
    let warm_copy = warm.iter().sum::<f64>() / warm.len().max(1) as f64;
    let nodes = of(Scenario::WanPCold.label()).count();
    let fetch = lan.file_cache.counts.fetch_micros as f64 / 1e6;
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let after = slowest.copy_secs - fetch;
    let rest = if after > PARALLEL_SLACK_SECS {
        format!(
            "; the {after:.2} s after them went to the nodes copying what was left of their \
             {ram_mib} MiB memory images, {nodes} at once on {cpus} CPUs"
        )
    } else {
        ": the copies kept up with the chunks as they came".to_owned()
    };
    format!(
        "\nWhere the time goes in WAN-P cold (the slowest of {nodes} clones, {:.2} s): its copy \
         step took {:.2} s; the LAN proxy's whole-file fetches across the WAN took \
         {fetch:.2} s (summed over the files, each until it was whole and on disk){rest}. With \
         every cache warm the same copies took {warm_copy:.2} s (WAN-P warm, mean).\n",
        slowest.total_secs, slowest.copy_secs,
    )
}

/// Copying that ends within this of the LAN proxy's last fetch kept up
/// with the chunks (the fetch time includes each file's final fsync).
const PARALLEL_SLACK_SECS: f64 = 0.5;

/// The whole report: `outcome`'s, then `larger`'s (the same benchmark with
/// larger guests, when it ran) with a table of the goals at both sizes
/// first; `command` is what produced it.
pub fn report_markdown(outcome: &Outcome, larger: Option<&Outcome>, command: &str) -> String {
    let mut md = format!(
        "# VM clone times\n\nMade by `{command}` (the code: `src/clone/`, `benches/clone.rs`).\n\n\
         ![clone time per clone for each scenario](clone.png)\n\n"
    );
    if let Some(larger) = larger {
        let mut scenarios: Vec<&str> = Vec::new();
        for r in &larger.records {
            if !scenarios.contains(&r.scenario.as_str()) {
                scenarios.push(&r.scenario);
            }
        }
        md += &format!(
            "The goals with guests of {} MiB RAM (all scenarios) and of {} MiB ({}; below), as \
             ratio and verdict; \"best\" is the floor's ratio, which a clone beats only by \
             sending repeated blocks once:\n\n\
             | goal | {} MiB guests | best | {} MiB guests | best |\n|---|---|---:|---|---:|\n",
            outcome.ram_mib,
            larger.ram_mib,
            scenarios.join(", "),
            outcome.ram_mib,
            larger.ram_mib
        );
        for (a, b) in outcome.goals.iter().zip(&larger.goals) {
            let cell = |g: &Goal| format!("{} ({})", g.ratio_text(), g.verdict());
            let best = |g: &Goal| fmt3(g.best);
            md += &format!(
                "| {} | {} | {} | {} | {} |\n",
                a.name,
                cell(a),
                best(a),
                cell(b),
                best(b)
            );
        }
        if !outcome.lazy_goals.is_empty() {
            md += &format!(
                "\nThe lazy clones' goals with guests of {} MiB RAM and of {} MiB:\n\n\
                 | goal | {} MiB guests | {} MiB guests |\n|---|---|---|\n",
                outcome.ram_mib, larger.ram_mib, outcome.ram_mib, larger.ram_mib
            );
            for (a, b) in outcome.lazy_goals.iter().zip(&larger.lazy_goals) {
                let cell = |g: &Goal| format!("{} ({})", g.ratio_text(), g.verdict());
                md += &format!("| {} | {} | {} |\n", a.name, cell(a), cell(b));
            }
        }
        md += &format!("\n## Guests of {} MiB RAM\n\n", outcome.ram_mib);
    }
    md += &outcome.markdown;
    if let Some(larger) = larger {
        md += &format!(
            "\n## Guests of {} MiB RAM\n\nIn the CSV as scenarios named \"... ({} MiB)\".\n\n{}",
            larger.ram_mib, larger.ram_mib, larger.markdown
        );
    }
    md
}

/// Writes `clone.md` ([`report_markdown`]), `clone.csv` (every clone;
/// `larger`'s scenarios named with their RAM), `clone-census.csv`
/// (`outcome`'s census, when it has one) and `clone.png` (`outcome`'s
/// clones) into `dir`.
pub fn write_outputs(
    outcome: &Outcome,
    larger: Option<&Outcome>,
    dir: &Path,
    command: &str,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(
        dir.join("clone.md"),
        report_markdown(outcome, larger, command),
    )?;
    let mut records = outcome.records.clone();
    if let Some(larger) = larger {
        records.extend(larger.records.iter().map(|r| CloneRecord {
            scenario: format!("{} ({} MiB)", r.scenario, larger.ram_mib),
            ..r.clone()
        }));
    }
    std::fs::write(dir.join("clone.csv"), report::records_csv(&records))?;
    if let Some(census) = &outcome.census {
        std::fs::write(dir.join("clone-census.csv"), census.csv())?;
    }
    report::write_chart(
        &outcome.records,
        "VM clone time per clone (seconds, log scale)",
        &dir.join("clone.png"),
    )
}

mod dedup;
mod lazy;
mod table;
pub(super) use dedup::{dedup_goals, lan_fill_note};
pub(super) use lazy::{copy_goal, lazy_goals, storm_wan_goal};

#[cfg(test)]
mod tests;
