//! Dedup across images: the dedup scenarios beside their twins, held
//! against the census's floor ([`census`]), and their goals: WAN bytes of
//! WAN-S2's clones 2.. within 1.1x of the bytes new to each image, their
//! clone time correspondingly lower, and no cost to WAN-S1.

use crate::Stats;
use crate::clone::census::Census;
use crate::clone::outcome::{Goal, Outcome};
use crate::clone::report::CloneRecord;
use crate::clone::scenario::{MIB, Scenario, Settings};

use super::table::{goals_rows, mean};

fn mib_of(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

/// The records of scenario `label`.
fn of<'a>(records: &'a [CloneRecord], label: &'a str) -> impl Iterator<Item = &'a CloneRecord> {
    records.iter().filter(move |r| r.scenario == label)
}

/// The census floor of clone `r` (zstd bytes): its image's, or 0 when an
/// earlier clone of its scenario brought the image already.
fn floor_of(census: &Census, records: &[CloneRecord], r: &CloneRecord) -> Option<u64> {
    let brought = of(records, &r.scenario).any(|o| o.image == r.image && o.clone < r.clone);
    if brought {
        Some(0)
    } else {
        census.floor_zstd(r.image)
    }
}

/// A sentence on what filling WAN-S3's (or its dedup twin's, `label`) LAN
/// proxy moved across the WAN (`wan` bytes), with the LAN proxy's stats
/// after it.
pub(in crate::clone) fn lan_fill_note(label: &str, wan: u64, lan: &Stats) -> String {
    format!(
        "{label}: another node's clones filled the LAN proxy with {:.1} MiB across the WAN; the \
         LAN proxy's file cache copied {:.1} MiB from blocks it held in other images \
         (`file_cache.dedup_bytes`).",
        mib_of(wan),
        mib_of(lan.file_cache.counts.dedup_bytes)
    )
}

/// The goals of dedup across images, from the clones of one run.
pub(in crate::clone) fn dedup_goals(
    settings: &Settings,
    records: &[CloneRecord],
    census: Option<&Census>,
) -> Vec<Goal> {
    let s1 = Scenario::WanS1.label();
    let s1d = Scenario::WanS1Dedup.label();
    let s2d = Scenario::WanS2Dedup.label();
    let later: Vec<&CloneRecord> = of(records, s2d).filter(|r| r.clone >= 2).collect();
    // The clone furthest over its floor.
    let worst = census.and_then(|c| {
        later
            .iter()
            .filter_map(|r| {
                let floor = floor_of(c, records, r).filter(|&f| f > 0)?;
                Some((mib_of(r.wan_bytes), mib_of(floor)))
            })
            .max_by(|a, b| (a.0 / a.1).total_cmp(&(b.0 / b.1)))
    });
    let secs = |label: &str, clone: usize| {
        of(records, label)
            .find(|r| r.clone == clone)
            .map(|r| r.total_secs)
    };
    let warm = |label: &str| {
        mean(
            of(records, label)
                .filter(|r| r.clone >= 2)
                .map(|r| r.total_secs),
        )
    };
    // What clones 2.. should take if time followed bytes: their WAN bytes
    // on the link, plus what a clone takes with nothing to fetch (WAN-S1's
    // warm clones).
    let expected = mean(later.iter().map(|r| r.wan_bytes as f64))
        .zip(warm(s1))
        .map(|(bytes, warm)| bytes / settings.bytes_per_sec() + warm);
    let wan_all = |label: &str| {
        let mut rs = of(records, label).peekable();
        rs.peek()
            .is_some()
            .then(|| mib_of(rs.map(|r| r.wan_bytes).sum()))
    };
    let goals = [
        (
            format!(
                "WAN-S2 dedup: WAN bytes of each of {} <= 1.1x the bytes new to its image \
                 (census floor, zstd -3; the clone furthest over it)",
                match settings.clones {
                    2 => "clone 2".to_owned(),
                    n => format!("clones 2-{n}"),
                }
            ),
            "MiB",
            worst.map(|w| w.0),
            worst.map(|w| w.1),
            1.1,
        ),
        (
            "WAN-S2 dedup: clones 2.. (mean) <= 1.2x their WAN bytes' time on the link plus a \
             warm clone (WAN-S1 #2.., mean)"
                .to_owned(),
            "s",
            mean(later.iter().map(|r| r.total_secs)),
            expected,
            1.2,
        ),
        (
            "no cost to WAN-S1: WAN-S1 dedup's cold clone <= 1.1x WAN-S1's".to_owned(),
            "s",
            secs(s1d, 1),
            secs(s1, 1),
            1.1,
        ),
        (
            "no cost to WAN-S1: WAN-S1 dedup's warm clones (#2.., mean) <= 1.1x WAN-S1's"
                .to_owned(),
            "s",
            warm(s1d),
            warm(s1),
            1.1,
        ),
        (
            "no cost to WAN-S1: WAN-S1 dedup's WAN bytes (all clones) <= 1.02x WAN-S1's".to_owned(),
            "MiB",
            wan_all(s1d),
            wan_all(s1),
            1.02,
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

/// The clones of `twin` and its dedup scenario `dedup` side by side, per
/// clone, against the census floor. Empty when neither ran.
fn per_clone_table(
    records: &[CloneRecord],
    census: Option<&Census>,
    twin: Scenario,
    dedup: Scenario,
) -> String {
    let (a, b) = (twin.label(), dedup.label());
    let mut clones: Vec<(usize, usize)> = of(records, a)
        .chain(of(records, b))
        .map(|r| (r.clone, r.image))
        .collect();
    clones.sort_unstable();
    clones.dedup_by_key(|c| c.0);
    if clones.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "\n| clone | image | floor MiB (zstd) | metadata MiB | {a} WAN MiB | {b} WAN MiB | {b} / floor | {a} s | {b} s | {b}: copied from held blocks MiB |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    let cell =
        |x: Option<f64>, digits: usize| x.map_or("-".to_owned(), |x| format!("{x:.digits$}"));
    for (clone, image) in clones {
        let find = |label: &str| {
            records
                .iter()
                .find(|r| r.scenario == label && r.clone == clone)
        };
        let (ra, rb) = (find(a), find(b));
        let floor = census.and_then(|c| floor_of(c, records, ra.or(rb)?));
        let meta = census
            .filter(|_| floor.is_some_and(|f| f > 0))
            .and_then(|c| c.image(image))
            .map(|i| mib_of(i.meta_bytes()));
        let ratio = rb
            .zip(floor.filter(|&f| f > 0))
            .map(|(r, f)| r.wan_bytes as f64 / f as f64);
        out += &format!(
            "| {clone} | {image} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            cell(floor.map(mib_of), 1),
            cell(meta, 2),
            cell(ra.map(|r| mib_of(r.wan_bytes)), 1),
            cell(rb.map(|r| mib_of(r.wan_bytes)), 1),
            cell(ratio, 2),
            cell(ra.map(|r| r.total_secs), 2),
            cell(rb.map(|r| r.total_secs), 2),
            cell(rb.and_then(|r| r.fetch).map(|f| mib_of(f.dedup_bytes)), 1),
        );
    }
    out
}

/// The report's section "Dedup across images". Empty when no dedup
/// scenario ran.
pub(super) fn dedup_markdown(outcome: &Outcome) -> String {
    let records = &outcome.records;
    let ran = |s: Scenario| of(records, s.label()).next().is_some();
    if !Scenario::ALL.into_iter().any(|s| s.is_dedup() && ran(s)) {
        return String::new();
    }
    let census = outcome.census.as_ref();
    let mut out = String::from(
        "\n## Dedup across images\n\n\
         Each scenario named \"... dedup\" is its twin run again on fresh proxies and a fresh \
         link with the proxies' defaults: a node or LAN proxy that fetches a block of one image \
         whose fingerprint (from the metadata file) it holds in another cached image copies it \
         instead of fetching it, once the range it goes into matches its piece hashes. Its twin runs the node and LAN proxies with `--no-dedup`. Per \
         clone: the census floor (the compressed bytes of the memory image and device state no \
         image cloned before holds, 0 for an image brought before); the image's metadata \
         files, which cross the WAN too (an 8-byte fingerprint per non-zero 4 KiB block and a \
         32-byte BLAKE3 per 64 KiB piece not all zero of `mem` and `state`); WAN MiB and clone time of both; the dedup clone's WAN bytes over the \
         floor; and what the node's file cache copied from blocks it held in other images \
         instead of fetching them (`file_cache.dedup_bytes`, 0 from a proxy without it). The \
         disk blocks QEMU reads cross the WAN too (through the block cache; the disk's \
         metadata has no block hashes, so they are not deduplicated).\n",
    );
    out += &per_clone_table(records, census, Scenario::WanS2, Scenario::WanS2Dedup);
    let lazy = per_clone_table(
        records,
        census,
        Scenario::LazyWanS2,
        Scenario::LazyWanS2Dedup,
    );
    if !lazy.is_empty() {
        out += "\nLazy clones (WAN MiB in all: the background stream brings the rest of the \
                memory image after the guest runs):\n";
        out += &lazy;
        let hits = |s: Scenario| {
            of(records, s.label())
                .filter_map(|r| r.fetch)
                .map(|f| f.profile_hits)
                .sum::<u64>()
        };
        let (with, without) = (hits(Scenario::LazyWanS2Dedup), hits(Scenario::LazyWanS2));
        if with != without {
            out += &format!(
                "\nLazy WAN-S2 dedup runs after lazy WAN-S2, whose node taught the image server \
                 a working-set profile of the images it cloned: its clones started {with} \
                 whole-file fetches from a profile, lazy WAN-S2's {without} \
                 (`file_cache.profile_hits`), so its times are not dedup's alone.\n"
            );
        }
    }
    let pairs = [
        (Scenario::WanS1, Scenario::WanS1Dedup),
        (Scenario::WanS3, Scenario::WanS3Dedup),
    ];
    if pairs.iter().any(|&(a, b)| ran(a) || ran(b)) {
        out += "\nWAN-S1 (one image: nothing to share across images) and WAN-S3 (through a LAN \
                proxy another node filled first) with and without dedup:\n\n\
                | scenario | clone 1 s | clones 2.. mean s | WAN MiB in all | copied from held blocks MiB |\n\
                |---|---:|---:|---:|---:|\n";
        for s in pairs
            .into_iter()
            .flat_map(|(a, b)| [a, b])
            .filter(|&s| ran(s))
        {
            let label = s.label();
            let first = of(records, label).find(|r| r.clone == 1);
            out += &format!(
                "| {label} | {} | {} | {:.1} | {:.1} |\n",
                first.map_or("-".to_owned(), |r| format!("{:.2}", r.total_secs)),
                mean(
                    of(records, label)
                        .filter(|r| r.clone >= 2)
                        .map(|r| r.total_secs)
                )
                .map_or("-".to_owned(), |x| format!("{x:.2}")),
                mib_of(of(records, label).map(|r| r.wan_bytes).sum()),
                mib_of(
                    of(records, label)
                        .filter_map(|r| r.fetch)
                        .map(|f| f.dedup_bytes)
                        .sum()
                ),
            );
        }
    }
    out += "\n| goal | measured | ratio | verdict |\n|---|---|---:|---|\n";
    out += &goals_rows(&outcome.dedup_goals);
    let verdicts: Vec<Option<bool>> = outcome.dedup_goals.iter().map(Goal::met).collect();
    let verdict = if verdicts.contains(&Some(false)) {
        "**not met**"
    } else if verdicts.iter().all(|v| *v == Some(true)) {
        "**met**"
    } else {
        "not judged (not every scenario it needs ran)"
    };
    out += &format!(
        "\nThe goal (WAN bytes of WAN-S2's clones 2-N within 1.1x of the bytes unique to each \
         image, and their clone time correspondingly lower; no cost to WAN-S1): {verdict}.\n"
    );
    if let Some(c) = census {
        let n = c.images.len().max(1) as f64;
        let meta = c.images.iter().map(|i| i.meta_bytes()).sum::<u64>() as f64 / n;
        let floors: Vec<u64> = c
            .images
            .iter()
            .skip(1)
            .filter_map(|i| i.sent().new_zstd_bytes)
            .collect();
        let floor = floors.iter().sum::<u64>() as f64 / floors.len().max(1) as f64;
        if floor > 0.0 {
            out += &format!(
                "\nThe metadata files of an image are {:.0} KiB on average: {:.1}% of the mean \
                 floor of clones 2.. ({:.1} MiB). They cross the WAN for every image, with or \
                 without dedup.\n",
                meta / 1024.0,
                100.0 * meta / floor,
                floor / MIB as f64
            );
        }
    }
    for note in &outcome.dedup_notes {
        out += &format!("\n{note}\n");
    }
    out
}
