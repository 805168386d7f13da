//! Files and tools `gvfsctl vm` shares: sparse copies of memory images,
//! `qemu-img` runs, sizes for people.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};

/// `n` bytes as KiB, MiB or GiB.
pub(super) fn human(n: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)];
    for (unit, size) in UNITS {
        if n >= size {
            return format!("{:.1}{unit}", n as f64 / size as f64);
        }
    }
    format!("{n}B")
}

/// Copies `from` to `to`, leaving holes where `from` has runs of zeros
/// (a memory image is mostly zeros).
pub(super) fn copy_sparse(from: &Path, to: &Path) -> anyhow::Result<()> {
    use std::io::{Read, Seek, SeekFrom, Write};
    const CHUNK: usize = 1 << 20;
    let mut src =
        std::fs::File::open(from).with_context(|| format!("opening {}", from.display()))?;
    let len = src.metadata()?.len();
    let mut dst =
        std::fs::File::create(to).with_context(|| format!("creating {}", to.display()))?;
    let mut buf = vec![0u8; CHUNK];
    let mut at = 0u64;
    while at < len {
        let n = src.read(&mut buf)?;
        if n == 0 {
            bail!("{} ended at {at} of {len} bytes", from.display());
        }
        if buf[..n].iter().all(|&b| b == 0) {
            dst.seek(SeekFrom::Current(n as i64))?;
        } else {
            dst.write_all(&buf[..n])?;
        }
        at += n as u64;
    }
    dst.set_len(len)?;
    dst.sync_all()?;
    Ok(())
}

/// Runs a tool to completion; fails with its output, and `what` (what it
/// is and how to install it) when it cannot start.
pub(super) fn run_tool(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!(
            "{what}: {}{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    Ok(())
}
