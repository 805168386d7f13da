//! The soak benchmark: 16 clients for 10 minutes through a caching chain
//! (LAN proxy with a write-back block cache, TLS 1.3, image-server proxy,
//! nfs-ganesha), every byte read checked, the origin compared with what
//! was written after the final write-back, CPU and RSS of each proxy over
//! time. The harness is `gvfs_testbed::soak`; see its docs for the topology and the
//! mix of operations.
//!
//! Run: `cargo build --release --workspace --bins && cargo bench --bench
//! soak`. Environment: `GVFS_SOAK_SECS` (600), `GVFS_SOAK_CLIENTS` (16),
//! `GVFS_SOAK_LIBNFS` (4 of them libnfs clients), `GVFS_SOAK_SAMPLE_SECS`
//! (10), `GVFS_SOAK_CACHE` (`64M`), `GVFS_SOAK_IMAGE_SERVER_BIN` (another
//! `gvfs-proxy` binary for the image server, to compare two builds),
//! `GVFS_SOAK_LAN_ARGS` (further arguments of the LAN proxy, split at
//! spaces, e.g. `--attr-timeout 60`).
//! Without `--bench` (under `cargo test --benches`) it does the quick run of
//! `tests/soak.rs`. It fails (after printing the report) if any operation
//! failed, any wrong byte was served or any byte was lost.

use std::time::Duration;

use anyhow::{Result, bail};
use gvfs_testbed::bench::env_u64;
use gvfs_testbed::soak::{self, Settings};

fn main() -> Result<()> {
    let bench = std::env::args().any(|a| a == "--bench");
    let mut s = if bench {
        Settings::full()
    } else {
        Settings::quick()
    };
    s.duration = Duration::from_secs(env_u64("GVFS_SOAK_SECS", s.duration.as_secs())?);
    s.clients = env_u64("GVFS_SOAK_CLIENTS", s.clients as u64)? as usize;
    s.libnfs_clients = env_u64("GVFS_SOAK_LIBNFS", s.libnfs_clients as u64)? as usize;
    s.sample_every =
        Duration::from_secs(env_u64("GVFS_SOAK_SAMPLE_SECS", s.sample_every.as_secs())?);
    if let Ok(size) = std::env::var("GVFS_SOAK_CACHE") {
        s.cache_size = size;
    }
    if let Ok(args) = std::env::var("GVFS_SOAK_LAN_ARGS") {
        s.lan_args = args.split_whitespace().map(str::to_owned).collect();
    }
    if let Some(bin) = std::env::var_os("GVFS_SOAK_IMAGE_SERVER_BIN") {
        s.image_server_binary = Some(bin.into());
    }
    let outcome = soak::run(&s)?;
    println!(
        "\n{}",
        soak::report_markdown(&outcome, "cargo bench --bench soak")
    );
    let problems = outcome.problems();
    if !problems.is_empty() {
        bail!("the soak found problems:\n{}", problems.join("\n"));
    }
    Ok(())
}
