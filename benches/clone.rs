//! The clone benchmark (the GVFS paper's section 4.3, Figure 6, Table 1)
//! with QEMU: golden images on nfs-ganesha behind an emulated WAN, cloned
//! and resumed in every scenario through gvfs, and the two baselines (full
//! copy, plain NFS); then the same scenarios with lazy clones (the golden
//! memory image mapped from the node proxy's FUSE mount instead of copied).
//! The harness is `gvfs_testbed::clone`; see its docs for what a clone is and the
//! topology.
//!
//! Run: `cargo build --release --workspace --bins && cargo bench --bench
//! clone`. It writes `docs/clone.md`, `docs/clone.csv`,
//! `docs/clone-census.csv` (the census of the golden images) and
//! `docs/clone.png` (or into `GVFS_CLONE_OUT`). Environment:
//! `GVFS_CLONE_IMAGES` (8), `GVFS_CLONE_CLONES` (8), `GVFS_CLONE_RAM_MIB`
//! (256), `GVFS_CLONE_DISK_MIB` (384), `GVFS_CLONE_SYSTEM_MIB` (40: system
//! files, the same on every image, that the guest reads at boot),
//! `GVFS_BENCH_RTT_MS` (40), `GVFS_BENCH_MBIT` (50), `GVFS_CLONE_SCENARIOS`
//! (all: `local,s1,s2,s3,p,cut,full,plain`, the lazy ones, `lazy local,lazy
//! s1,lazy learned,lazy s2,lazy s3,lazy p,lazy cut`, the storms, `lazy storm
//! 1,lazy storm 8,lazy storm 32,lazy storm 64` (and `lazy storm 4`, the quick
//! run's), `lazy busy,lazy busy learned,lazy neighbour,lazy neighbour
//! quiet`, `lazy restart` (only when named: guests left running while
//! their node and LAN proxies restart; `GVFS_RESTART_GUESTS` (8),
//! `GVFS_RESTART_KILLS` (10), `GVFS_RESTART_EARLY_KILLS` (3, while the
//! guests start), `GVFS_RESTART_STOPS` (10),
//! `GVFS_RESTART_MAX_WAIT_SECS` (10), and `GVFS_PREV_BIN`, an older
//! `gvfs-proxy` the node runs until the hot upgrade), and the dedup ones, `s1
//! dedup,s2 dedup,s3 dedup,lazy s2 dedup`; `lazy` alone is every lazy one,
//! `copy` every copy-first one, `dedup` every dedup one; `census` alone
//! builds the golden images and counts them, runs no clone, and writes only
//! `clone-census.csv`),
//! `GVFS_CLONE_CUT_SECS` (10: how long the WAN cut scenario keeps the link
//! cut),
//! `GVFS_CLONE_LARGER_RAM_MIB` (2048 when all scenarios run, else 0: the
//! RAM of the larger guests also cloned, `Settings::larger`, copy-first and
//! lazy; 0 skips them).
//! Without `--bench` (under `cargo test --benches`) it does the quick run of
//! `tests/clone.rs` and writes into a temporary directory.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use gvfs_testbed::bench::env_u64;
use gvfs_testbed::clone::{self, Scenario, Settings};

fn main() -> Result<()> {
    // A storm's replay child: replays and exits.
    clone::replay::replay_if_asked();
    let bench = std::env::args().any(|a| a == "--bench");
    let mut s = if bench {
        Settings::full()
    } else {
        Settings::quick()
    };
    s.images = env_u64("GVFS_CLONE_IMAGES", s.images as u64)? as usize;
    s.clones = env_u64("GVFS_CLONE_CLONES", s.clones as u64)? as usize;
    s.size.ram_mib = env_u64("GVFS_CLONE_RAM_MIB", s.size.ram_mib)?;
    s.size.disk_files_mib = env_u64("GVFS_CLONE_DISK_MIB", s.size.disk_files_mib)?;
    s.size.system_mib = env_u64("GVFS_CLONE_SYSTEM_MIB", s.size.system_mib)?;
    // The disk's system files fit beside the working set, and hold at
    // least those read at boot.
    s.size.system_disk_mib = s
        .size
        .system_disk_mib
        .min(s.size.disk_files_mib.saturating_sub(s.size.working_set_mib))
        .max(s.size.system_mib);
    s.rtt = Duration::from_millis(env_u64("GVFS_BENCH_RTT_MS", s.rtt.as_millis() as u64)?);
    s.mbit = env_u64("GVFS_BENCH_MBIT", s.mbit)?;
    s.cut_hold = Duration::from_secs(env_u64("GVFS_CLONE_CUT_SECS", s.cut_hold.as_secs())?);
    let r = &mut s.restart;
    r.guests = env_u64("GVFS_RESTART_GUESTS", r.guests as u64)? as usize;
    r.kills = env_u64("GVFS_RESTART_KILLS", r.kills as u64)? as usize;
    r.early_kills = env_u64("GVFS_RESTART_EARLY_KILLS", r.early_kills as u64)? as usize;
    r.stops = env_u64("GVFS_RESTART_STOPS", r.stops as u64)? as usize;
    r.max_wait = Duration::from_secs(env_u64("GVFS_RESTART_MAX_WAIT_SECS", r.max_wait.as_secs())?);
    let only_some = std::env::var_os("GVFS_CLONE_SCENARIOS").is_some();
    let list = std::env::var("GVFS_CLONE_SCENARIOS").unwrap_or_default();
    let census_only = list.trim().eq_ignore_ascii_case("census");
    if only_some && !census_only {
        s.scenarios = Scenario::parse_list(&list)?;
    }

    let scratch = tempfile::tempdir()?;
    let out = match std::env::var_os("GVFS_CLONE_OUT") {
        Some(dir) => PathBuf::from(dir),
        None if bench => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs"),
        None => scratch.path().to_path_buf(),
    };
    if census_only {
        let census = clone::run_census(&s)?;
        std::fs::create_dir_all(&out)?;
        std::fs::write(out.join("clone-census.csv"), census.csv())?;
        println!(
            "{}
written to {}",
            census.markdown(),
            out.display()
        );
        return Ok(());
    }
    // With guests of the default size, the full run also clones larger
    // ones (Settings::larger), unless only some scenarios were asked for.
    let larger_mib = env_u64(
        "GVFS_CLONE_LARGER_RAM_MIB",
        if bench && !only_some { 2048 } else { 0 },
    )?;
    let outcome = clone::run(&s)?;
    let larger = match larger_mib {
        0 => None,
        mib => {
            let mut l = s.larger();
            l.size.ram_mib = mib;
            Some(clone::run(&l)?)
        }
    };
    let command = "cargo bench --bench clone";
    clone::write_outputs(&outcome, larger.as_ref(), &out, command)?;
    println!(
        "\n{}\nwritten to {}",
        clone::report_markdown(&outcome, larger.as_ref(), command),
        out.display()
    );
    Ok(())
}
