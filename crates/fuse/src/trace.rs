//! A trace of the reads a mount answers, for replaying a guest's page
//! faults elsewhere (`gvfs-proxy --mount-trace PATH`).
//!
//! One line per read the kernel sends, written when its answer is ready:
//!
//! ```text
//! ino offset size start_unix_us end_unix_us
//! ```
//!
//! `ino` is the node id the kernel knows the file by (what `stat` shows on
//! the mount), `size` the bytes asked for, and the two times when the
//! request arrived and when its answer was ready, in microseconds since the
//! Unix epoch. Lines are whole when written (a reader may follow the file
//! as it grows). The trace stops at [`MAX_LINES`]; the reads it leaves out
//! are counted (`trace_dropped`).

use std::fs::File;
use std::io::{LineWriter, Write};
use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// Most lines a trace holds (about 200 MiB of text).
pub const MAX_LINES: u64 = 4 << 20;

/// An open trace file.
pub(crate) struct ReadTrace {
    out: Mutex<(LineWriter<File>, u64)>,
}

/// Microseconds since the Unix epoch, now.
pub(crate) fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl ReadTrace {
    /// Creates (or empties) the trace file at `path`.
    pub(crate) fn create(path: &Path) -> std::io::Result<Self> {
        Ok(Self {
            out: Mutex::new((LineWriter::new(File::create(path)?), 0)),
        })
    }

    /// Appends one read. False when the trace is full (or the file can no
    /// longer be written): the read is left out.
    pub(crate) fn note(
        &self,
        ino: u64,
        offset: u64,
        size: u32,
        start_us: u64,
        end_us: u64,
    ) -> bool {
        let mut out = gvfs_nfs::layer::lock(&self.out);
        if out.1 >= MAX_LINES {
            return false;
        }
        out.1 += 1;
        writeln!(out.0, "{ino} {offset} {size} {start_us} {end_us}").is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("gvfs-fuse-trace-{}-{name}", std::process::id()))
    }

    #[test]
    fn lines_are_whole_and_parse_back() {
        let path = scratch("lines");
        let t = ReadTrace::create(&path).expect("create");
        assert!(t.note(7, 8192, 4096, 100, 250));
        assert!(t.note(7, 0, 4096, 300, 301));
        let text = std::fs::read_to_string(&path).expect("read");
        let _ = std::fs::remove_file(&path);
        assert_eq!(text, "7 8192 4096 100 250\n7 0 4096 300 301\n");
    }

    #[test]
    fn a_full_trace_leaves_reads_out() {
        let path = scratch("full");
        let t = ReadTrace::create(&path).expect("create");
        gvfs_nfs::layer::lock(&t.out).1 = MAX_LINES - 1;
        assert!(t.note(1, 0, 1, 0, 0));
        assert!(!t.note(1, 0, 1, 0, 0));
        let _ = std::fs::remove_file(&path);
    }
}
