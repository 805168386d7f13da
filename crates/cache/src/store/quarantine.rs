//! Where dirty bytes that failed their checksum are set aside for an
//! operator (`DIR/quarantine/`), within a budget.

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Most bytes [`Quarantine`] keeps; failed bytes beyond it are only logged.
const QUARANTINE_BUDGET: u64 = 64 << 20;

/// Where dirty bytes that failed their checksum are set aside.
#[derive(Debug)]
pub(crate) struct Quarantine {
    dir: PathBuf,
    /// Bytes still allowed in `dir`.
    left: u64,
}

impl Quarantine {
    /// The quarantine of a cache directory: `DIR/quarantine`, created when
    /// first needed.
    pub(crate) fn in_dir(cache_dir: &Path) -> Quarantine {
        let dir = cache_dir.join("quarantine");
        let used: u64 = std::fs::read_dir(&dir)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok()?.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0);
        Quarantine {
            dir,
            left: QUARANTINE_BUDGET.saturating_sub(used),
        }
    }

    /// Writes `bytes`, once at `file_offset` of the file `fh`, to
    /// `FHHEX-OFFSET-NANOS.bin`; returns the path, or `None` if the budget
    /// is spent or the write failed (a full disk must not stop the cache).
    pub(crate) fn keep(&mut self, fh: &[u8], file_offset: u64, bytes: &[u8]) -> Option<PathBuf> {
        let len = bytes.len() as u64;
        if len > self.left {
            return None;
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let path = self
            .dir
            .join(format!("{}-{file_offset}-{nanos}.bin", hex(fh)));
        let written = std::fs::create_dir_all(&self.dir).and_then(|()| {
            let mut f = std::fs::File::create_new(&path)?;
            f.write_all(bytes)?;
            f.sync_data()
        });
        match written {
            Ok(()) => {
                self.left -= len;
                Some(path)
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), "could not set failed bytes aside: {e}");
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }
}

/// A file handle as hex, for logs.
pub(crate) fn hex(fh: &[u8]) -> String {
    fh.iter().map(|b| format!("{b:02x}")).collect()
}
