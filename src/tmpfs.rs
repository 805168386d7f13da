//! A small tmpfs mounted for a test or benchmark (a disk that fills up),
//! unmounted when dropped. Mounting needs root, as the tests run.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};

/// A tmpfs of a given size at a temporary directory.
#[derive(Debug)]
pub struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (as `mount -o size=` takes it: `40m`).
    pub fn mount(size: &str) -> Result<Tmpfs> {
        let dir = tempfile::tempdir()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .context("running mount (the tests run as root)")?
            .success();
        ensure!(ok, "mounting a tmpfs at {} failed", dir.path().display());
        Ok(Tmpfs(dir))
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// Writes `filler` until the tmpfs is full; returns the bytes written.
    pub fn fill(&self) -> Result<u64> {
        use std::io::Write as _;
        let mut f = std::fs::File::create(self.path().join("filler"))?;
        let chunk = vec![0x77u8; 64 << 10];
        let mut written = 0;
        loop {
            match f.write(&chunk) {
                Ok(0) => return Ok(written),
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => return Ok(written),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Frees the space [`fill`](Self::fill) took.
    pub fn unfill(&self) -> Result<()> {
        std::fs::remove_file(self.path().join("filler")).context("removing the filler")
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}
