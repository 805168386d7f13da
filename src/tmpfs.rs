//! A small tmpfs mounted for a test or benchmark (a disk that fills up),
//! unmounted when dropped. Mounting needs root, as the tests run.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};

/// A tmpfs of a given size, mounted at a temporary directory or one given.
#[derive(Debug)]
pub struct Tmpfs {
    dir: PathBuf,
    _temp: Option<tempfile::TempDir>,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (as `mount -o size=` takes it: `40m`) at a
    /// new temporary directory.
    pub fn mount(size: &str) -> Result<Tmpfs> {
        let temp = tempfile::tempdir()?;
        let mut t = Tmpfs::mount_at(temp.path(), size)?;
        t._temp = Some(temp);
        Ok(t)
    }

    /// Mounts a tmpfs of `size` at `dir` (created if need be).
    pub fn mount_at(dir: &Path, size: &str) -> Result<Tmpfs> {
        std::fs::create_dir_all(dir)?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .context("running mount")?;
        ensure!(
            out.status.success(),
            "mount -t tmpfs on {} failed (the tests run as root): {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(Tmpfs {
            dir: dir.to_path_buf(),
            _temp: None,
        })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.dir
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
        // Lazily: a process still holding a file there must not keep it.
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}
