use super::*;
use crate::Stats;
use crate::clone::census::{self, Census};
use crate::clone::guest::MEM;
use crate::clone::report::NodeFetch;

fn rec(scenario: &str, clone: usize, total_secs: f64) -> CloneRecord {
    CloneRecord {
        scenario: scenario.to_owned(),
        clone,
        image: 1,
        total_secs,
        copy_secs: total_secs / 2.0,
        overlay_secs: 0.0,
        resume_secs: total_secs / 2.0,
        wan_bytes: 0,
        ..CloneRecord::default()
    }
}

fn floor(secs: f64) -> Floor {
    Floor {
        secs,
        zstd_mem: 0,
        zstd_state: 0,
        disk_read: 0,
    }
}

fn outcome(ram_mib: u64, records: Vec<CloneRecord>, floor_secs: f64) -> Outcome {
    let settings = Settings::quick();
    let goals = goals(&settings, &records, &floor(floor_secs));
    let lazy_goals = lazy_goals(&settings, &records, &floor(floor_secs));
    Outcome {
        records,
        markdown: format!("tables of {ram_mib} MiB\n"),
        client_stats: Vec::new(),
        wan_calls: Vec::new(),
        lan_stats: None,
        lazy_lan_stats: None,
        goals,
        lazy_goals,
        ram_mib,
        cuts: Vec::new(),
        notes: Vec::new(),
        profile: None,
        golden_checks: 0,
        census: None,
        dedup_goals: Vec::new(),
        dedup_notes: Vec::new(),
        restarts: None,
    }
}

fn lazy_goal<'a>(o: &'a Outcome, starts: &str) -> &'a Goal {
    o.lazy_goals
        .iter()
        .find(|g| g.name.starts_with(starts))
        .unwrap_or_else(|| panic!("no lazy goal {starts:?}"))
}

fn goal<'a>(o: &'a Outcome, starts: &str) -> &'a Goal {
    o.goals
        .iter()
        .find(|g| g.name.starts_with(starts))
        .unwrap_or_else(|| panic!("no goal {starts:?}"))
}

#[test]
fn goals_hold_warm_against_warm_and_know_the_floor_s_bound() {
    let small = outcome(
        256,
        vec![
            rec("Local", 1, 5.0),
            rec("Local", 2, 1.0),
            rec("Local", 3, 1.0),
            rec("WAN-S1", 1, 10.0),
            rec("WAN-S1", 2, 1.4),
            rec("WAN-S1", 3, 1.6),
            rec("plain NFS", 1, 50.0),
        ],
        8.0,
    );
    // Local's first clone (from disk) is not what warm clones face.
    let warm = goal(&small, "warm clone");
    assert_eq!((warm.measured, warm.against), (Some(1.5), Some(1.0)));
    assert_eq!(warm.met(), Some(true));
    // 10 s of 50 s is not 1/20, and no clone could be: the floor is 0.16.
    let plain = goal(&small, "cold first clone <= 1/20");
    assert_eq!(plain.met(), Some(false));
    assert_eq!(plain.best, Some(8.0 / 50.0));
    assert_eq!(goal(&small, "cold first clone (WAN-S1 #1)").met(), None);
    assert_eq!(goal(&small, "cold clone <= 1.5x").met(), Some(true));

    let large = outcome(
        2048,
        vec![rec("WAN-S1", 1, 10.0), rec("plain NFS", 1, 400.0)],
        8.0,
    );
    assert_eq!(goal(&large, "cold first clone <= 1/20").met(), Some(true));
    let md = report_markdown(&small, Some(&large), "cmd");
    assert!(md.contains("| goal | 256 MiB guests | best | 2048 MiB guests | best |"));
    assert!(
        md.contains("| cold first clone <= 1/20 of plain NFS | 0.200 (**not met**) | 0.160 | 0.025 (met) | 0.020 |"),
        "{md}"
    );
    let (a, b) = (
        md.find("tables of 256 MiB").unwrap_or(usize::MAX),
        md.find("tables of 2048 MiB").unwrap_or(0),
    );
    assert!(a < b, "each size's tables, in order: {md}");
    assert!(!report_markdown(&small, None, "cmd").contains("2048"));
}

#[test]
fn wan_p_time_splits_at_the_lan_proxy_s_last_chunk() {
    let records = vec![
        rec("WAN-S1", 1, 10.0),
        rec("WAN-P cold", 1, 16.0),
        rec("WAN-P cold", 2, 20.0),
        rec("WAN-P warm", 1, 4.0),
        rec("WAN-P warm", 2, 6.0),
    ];
    let lan = Stats::from_json(serde_json::json!({"file_cache": {"fetch_micros": 8_000_000}}))
        .expect("a stats snapshot");
    let text = parallel_time(&records, &lan, 1024);
    // The slowest cold clone copied for 10 s, 8 of them fetching.
    assert!(
        text.contains("of 2 clones, 20.00 s): its copy step took 10.00 s"),
        "{text}"
    );
    assert!(text.contains("on disk); the 2.00 s after them"), "{text}");
    assert!(text.contains("1024 MiB memory images, 2 at once"), "{text}");
    assert!(text.contains("took 2.50 s (WAN-P warm, mean)"), "{text}");
    assert_eq!(parallel_time(&records[..1], &lan, 1024), "");
    // Copies that end with the last fetch kept up with the chunks.
    let lan = Stats::from_json(serde_json::json!({"file_cache": {"fetch_micros": 9_800_000}}))
        .expect("a stats snapshot");
    let text = parallel_time(&records, &lan, 256);
    assert!(text.contains("on disk): the copies kept up"), "{text}");
    assert!(!text.contains("after them"), "{text}");
}

#[test]
fn lazy_goals_hold_lazy_clones_against_copy_first_and_fixed_bounds() {
    const MB: u64 = 1 << 20;
    let mut learned = rec("lazy WAN-S1 learned", 1, 1.2);
    learned.wan_running_bytes = Some(5 * MB);
    let records = vec![
        rec("WAN-S1", 1, 8.0),
        rec("lazy Local", 1, 0.5),
        rec("lazy Local", 2, 0.2),
        rec("lazy Local", 3, 0.2),
        rec("lazy WAN-S1", 1, 3.0),
        rec("lazy WAN-S1", 2, 0.25),
        rec("lazy WAN-S1", 3, 0.35),
        learned,
        CloneRecord {
            responsive_secs: Some(3.5),
            ..rec("lazy WAN-P cold", 1, 3.3)
        },
        CloneRecord {
            responsive_secs: Some(4.1),
            ..rec("lazy WAN-P cold", 2, 3.9)
        },
    ];
    let settings = Settings::quick();
    let mut f = floor(8.0);
    f.zstd_mem = 40 * MB;
    let mut o = outcome(256, records.clone(), 8.0);
    o.lazy_goals = lazy_goals(&settings, &records, &f);
    let g = lazy_goal(&o, "lazy cold clone with a learned working set (lazy");
    assert_eq!(
        (g.measured, g.against, g.met()),
        (Some(1.2), Some(1.5), Some(true))
    );
    // 1.2 s of 8 s is 0.15.
    assert_eq!(
        lazy_goal(&o, "lazy cold clone with a learned working set <=").met(),
        Some(true)
    );
    // 3 s of 8 s is more than half.
    assert_eq!(
        lazy_goal(&o, "lazy cold clone of an image").met(),
        Some(true)
    );
    let bytes = lazy_goal(&o, "WAN bytes");
    assert_eq!(
        (bytes.unit, bytes.measured, bytes.against),
        ("MiB", Some(5.0), Some(40.0))
    );
    assert_eq!(bytes.met(), Some(true));
    // Warm: 0.3 s mean, against lazy Local's warm 0.2 s: 1.5x.
    assert_eq!(lazy_goal(&o, "warm lazy clone (lazy").met(), Some(true));
    assert_eq!(lazy_goal(&o, "warm lazy clone <= 1.2x").met(), Some(false));
    let p = lazy_goal(&o, "lazy WAN-P");
    assert_eq!((p.measured, p.against), (Some(3.9), Some(3.0)));
    assert_eq!(p.met(), Some(false));

    // A run without lazy clones judges none of them.
    let copy_only = outcome(256, vec![rec("WAN-S1", 1, 8.0)], 8.0);
    assert!(copy_only.lazy_goals.iter().all(|g| g.met().is_none()));
    assert_eq!(super::lazy::lazy_markdown(&copy_only), "");

    let md = super::lazy::lazy_markdown(&o);
    assert!(md.contains("| WAN bytes before the learned lazy clone runs (lazy WAN-S1 learned #1) <= 25% of the compressed memory image | 5.00 MiB vs 40.00 MiB | 0.125 | met |"), "{md}");
    let table = super::lazy::responsiveness_markdown(&records);
    // Time to answer first, then time to running.
    assert!(table.starts_with("Time to answer"), "{table}");
    assert!(
        table.contains("| lazy WAN-P cold | 3.80 | 3.60 | 0.20 |"),
        "{table}"
    );
}

/// A census whose image `i` (1-based, cloned in order) has a floor of
/// `floors[i - 1]` MiB compressed and 64 KiB of metadata.
fn census_with_floors(floors: &[u64]) -> Census {
    const MB: u64 = 1 << 20;
    let images = floors
        .iter()
        .enumerate()
        .map(|(i, &mib)| census::ImageCensus {
            image: i + 1,
            files: vec![census::FileCensus {
                name: MEM.to_owned(),
                nonzero_blocks: 100,
                new_zstd_bytes: Some(mib * MB),
                meta_bytes: Some(64 << 10),
                ..census::FileCensus::default()
            }],
        })
        .collect();
    Census { images, secs: 0.1 }
}

fn wan_rec(scenario: &str, clone: usize, image: usize, secs: f64, wan_mib: u64) -> CloneRecord {
    CloneRecord {
        image,
        wan_bytes: wan_mib << 20,
        ..rec(scenario, clone, secs)
    }
}

#[test]
fn dedup_goals_hold_clones_against_the_census_floor_and_wan_s1() {
    let census = census_with_floors(&[40, 10, 20]);
    let mut records = vec![
        wan_rec("WAN-S1", 1, 1, 8.0, 42),
        wan_rec("WAN-S1", 2, 1, 0.4, 0),
        wan_rec("WAN-S1", 3, 1, 0.6, 0),
        wan_rec("WAN-S1 dedup", 1, 1, 8.4, 42),
        wan_rec("WAN-S1 dedup", 2, 1, 0.5, 0),
        wan_rec("WAN-S1 dedup", 3, 1, 0.5, 0),
        wan_rec("WAN-S2", 1, 1, 8.0, 42),
        wan_rec("WAN-S2", 2, 2, 8.0, 42),
        wan_rec("WAN-S2", 3, 3, 8.0, 42),
        wan_rec("WAN-S2", 4, 1, 0.5, 0),
        wan_rec("WAN-S2 dedup", 1, 1, 8.0, 42),
        wan_rec("WAN-S2 dedup", 2, 2, 2.5, 11),
        wan_rec("WAN-S2 dedup", 3, 3, 4.0, 23),
        wan_rec("WAN-S2 dedup", 4, 1, 0.5, 0),
    ];
    records[11].fetch = Some(NodeFetch {
        dedup_bytes: 30 << 20,
        ..NodeFetch::default()
    });
    let settings = Settings::quick();
    let goals = dedup_goals(&settings, &records, Some(&census));
    let find = |starts: &str| {
        goals
            .iter()
            .find(|g| g.name.starts_with(starts))
            .unwrap_or_else(|| panic!("no goal {starts:?}"))
    };
    // Clone 3 is furthest over its floor (23 of 20; clone 2: 11 of 10);
    // clone 4 brought nothing new.
    let bytes = find("WAN-S2 dedup: WAN bytes");
    assert_eq!((bytes.measured, bytes.against), (Some(23.0), Some(20.0)));
    assert_eq!(bytes.met(), Some(false));
    // Clones 2-4: 34/3 MiB on average on the link, plus a warm clone.
    let time = find("WAN-S2 dedup: clones 2..");
    let link = (34.0 * (1 << 20) as f64 / 3.0) / settings.bytes_per_sec();
    assert_eq!(time.measured, Some(7.0 / 3.0));
    let against = time.against.expect("against");
    assert!((against - (link + 0.5)).abs() < 1e-9, "{against}");
    assert_eq!(
        find("no cost to WAN-S1: WAN-S1 dedup's cold").met(),
        Some(true)
    );
    let warm = find("no cost to WAN-S1: WAN-S1 dedup's warm");
    assert_eq!((warm.measured, warm.against), (Some(0.5), Some(0.5)));
    assert_eq!(
        find("no cost to WAN-S1: WAN-S1 dedup's WAN").met(),
        Some(true)
    );
    // Without the census the floor goal is not judged.
    assert_eq!(dedup_goals(&settings, &records, None)[0].met(), None);

    let mut o = outcome(256, records, 8.0);
    o.census = Some(census);
    o.dedup_goals = goals;
    o.dedup_notes.push("filled the LAN proxy".to_owned());
    let md = dedup::dedup_markdown(&o);
    assert!(md.contains("## Dedup across images"), "{md}");
    assert!(
        md.contains("| 2 | 2 | 10.0 | 0.06 | 42.0 | 11.0 | 1.10 | 8.00 | 2.50 | 30.0 |"),
        "{md}"
    );
    // An image brought before has a floor of 0 and no ratio.
    assert!(
        md.contains("| 4 | 1 | 0.0 | - | 0.0 | 0.0 | - | 0.50 | 0.50 | - |"),
        "{md}"
    );
    assert!(
        md.contains("| WAN-S1 dedup | 8.40 | 0.50 | 42.0 | 0.0 |"),
        "{md}"
    );
    assert!(md.contains("no cost to WAN-S1): **not met**."), "{md}");
    assert!(md.contains("filled the LAN proxy"), "{md}");
    assert!(
        md.contains("The metadata files of an image are 64 KiB on average"),
        "{md}"
    );
    // A run without dedup scenarios has no such section.
    let plain = outcome(256, vec![rec("WAN-S2", 1, 8.0)], 8.0);
    assert_eq!(dedup::dedup_markdown(&plain), "");
}

/// A record of `scenario` answered at `answer` seconds.
fn answered(scenario: &str, clone: usize, answer: f64) -> CloneRecord {
    CloneRecord {
        responsive_secs: Some(answer),
        ..rec(scenario, clone, answer / 2.0)
    }
}

#[test]
fn storm_busy_and_neighbour_goals_judge_the_answers() {
    const MB: u64 = 1 << 20;
    let mut learned = answered("lazy WAN-S1 learned", 1, 1.0);
    learned.fetch = Some(NodeFetch {
        profile_wire_bytes: 3 * MB,
        demand_wire_bytes: MB,
        ..NodeFetch::default()
    });
    let storm64 = answered("lazy storm 64", 1, 1.3);
    let records = vec![
        answered("lazy WAN-S1", 1, 2.0),
        answered("lazy WAN-S1", 2, 0.5),
        learned,
        answered("lazy WAN-P warm", 1, 0.6),
        answered("lazy WAN-P warm", 2, 0.9),
        answered("WAN-P cold", 1, 10.0),
        answered("lazy storm 1", 1, 1.1),
        answered("lazy storm 8", 1, 1.5),
        answered("lazy storm 8", 2, 1.8),
        storm64,
        answered("lazy busy", 1, 8.0),
        answered("lazy busy learned", 1, 4.5),
        answered("lazy neighbour quiet", 1, 2.0),
        answered("lazy neighbour", 1, 2.2),
    ];
    let o = outcome(256, records, 8.0);
    // 1.8 s against 1.0 + 0.9 - 0.5 = 1.4 s.
    let g = lazy_goal(&o, "lazy storm 8: the last answer <= 1.3x");
    assert_eq!(g.measured, Some(1.8));
    assert!((g.against.expect("against") - 1.4).abs() < 1e-9);
    assert_eq!(g.met(), Some(true));
    let g = lazy_goal(&o, "lazy storm 8: the last answer <= 0.5x");
    assert_eq!((g.against, g.met()), (Some(10.0), Some(true)));
    let g = lazy_goal(&o, "lazy storm 64");
    assert_eq!(
        (g.measured, g.against, g.met()),
        (Some(1.3), Some(1.1), Some(true))
    );
    // The largest storm's LAN fetched 4.5 MiB of profile and demand,
    // against 1.1 x (3 + 1) MiB; 4.25 MiB is within it.
    let crossed = |bytes| super::storm_wan_goal(&o.records, Some((Scenario::LazyStorm64, bytes)));
    let g = crossed(4 * MB + MB / 2);
    assert!(
        g.name.starts_with("lazy storm 64: the working set"),
        "{}",
        g.name
    );
    assert_eq!(
        (g.measured, g.against, g.met()),
        (Some(4.5), Some(4.0), Some(false))
    );
    assert_eq!(crossed(4 * MB + MB / 4).met(), Some(true));
    assert_eq!(super::storm_wan_goal(&o.records, None).met(), None);
    let g = lazy_goal(&o, "lazy busy learned");
    assert_eq!(
        (g.measured, g.against, g.met()),
        (Some(4.5), Some(8.0), Some(false))
    );
    let g = lazy_goal(&o, "lazy neighbour: the answer");
    assert_eq!(g.met(), Some(true));
    // Without storms, none of theirs is judged.
    let none = outcome(256, vec![answered("lazy WAN-S1", 1, 2.0)], 8.0);
    assert!(
        none.lazy_goals
            .iter()
            .filter(|g| g.name.contains("storm"))
            .all(|g| g.met().is_none())
    );
    assert_eq!(super::copy_goal(Some((10.0, 9.0))).met(), Some(true));
    assert_eq!(super::copy_goal(Some((10.0, 7.0))).met(), Some(false));
}
