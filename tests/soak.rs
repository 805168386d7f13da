//! The soak benchmark's quick mode, end to end: 16 clients (four of them
//! libnfs `nfs-cat`/`nfs-cp`/`nfs-ls` processes) create, write, read,
//! truncate, list and remove files for 15 s through a LAN proxy with a write-back block cache
//! smaller than their files, chained over TLS to an image-server proxy in
//! front of nfs-ganesha. Every byte read must be right, no call may fail,
//! and after the write-back the origin must hold exactly what the clients
//! wrote. Its figures are the benchmark's (`cargo bench --bench soak`).

use anyhow::{Context, Result, ensure};
use gvfs_testbed::soak::{self, PROCESSES, Settings};

#[test]
fn sixteen_clients_through_a_caching_chain_lose_nothing_and_read_only_right_bytes() -> Result<()> {
    let outcome = soak::run(&Settings::quick())?;
    let report = soak::report_markdown(&outcome, "cargo test --test soak");
    println!("{report}");
    let problems = outcome.problems();
    ensure!(problems.is_empty(), "{}\n{report}", problems.join("\n"));
    let t = &outcome.tally;
    // Every kind of operation ran, and the origin had data to compare.
    for op in [
        "READ",
        "READ shared",
        "WRITE",
        "COMMIT",
        "CREATE + WRITE",
        "REMOVE",
        "SETATTR size",
        "GETATTR",
        "nfs-cat",
        "nfs-cat shared",
        "nfs-cp",
        "READDIRPLUS",
        "nfs-ls",
    ] {
        ensure!(t.ops.get(op).copied().unwrap_or(0) > 0, "no {op}\n{report}");
    }
    ensure!(t.bytes_read > 0 && t.bytes_written > 0, "{report}");
    ensure!(
        outcome.files_checked > 0 && outcome.bytes_expected > 0,
        "{report}"
    );
    // The LAN proxy's cache was too small for the working set: it evicted.
    let lan = outcome
        .lan_stats
        .as_ref()
        .context("the LAN proxy gave no stats")?;
    ensure!(
        lan.cache.evictions + lan.cache.counts.eviction_write_backs > 0,
        "no evictions: {lan}"
    );
    // Resources were sampled for every process of the chain.
    for (i, name) in PROCESSES.iter().enumerate() {
        let p = outcome.proc_summary(i);
        ensure!(
            p.is_some_and(|p| p.rss_max > 0.0),
            "no samples of the {name}"
        );
    }
    Ok(())
}
