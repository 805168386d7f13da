//! Small helpers the benchmarks share.

use anyhow::{Context, Result};

/// The first three fields of /proc/loadavg: other load on the machine
/// skews the figures, so the benchmarks report it.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".to_owned())
}

/// A temporary directory in `/dev/shm` (tmpfs) when there is one, so local
/// copies made by a benchmark do not time the local disk.
pub fn shm_tempdir() -> Result<tempfile::TempDir> {
    let shm = std::path::Path::new("/dev/shm");
    let b = {
        let mut b = tempfile::Builder::new();
        b.prefix("gvfs-bench-");
        b
    };
    Ok(if shm.is_dir() {
        b.tempdir_in(shm)?
    } else {
        b.tempdir()?
    })
}

/// A number from the environment variable `key`, or `default` when unset.
pub fn env_u64(key: &str, default: u64) -> Result<u64> {
    match std::env::var(key) {
        Ok(v) => v
            .trim()
            .parse()
            .with_context(|| format!("{key}={v:?} is not a number")),
        Err(_) => Ok(default),
    }
}
