//! Replaying a [`Trace`]: a process maps a node's `mem` as QEMU does
//! (`MAP_PRIVATE`, read-only, through the node's FUSE mount) and, for each
//! read of the trace, waits the guest's think time and touches one byte
//! per 4 KiB page of it (the node mounts at `--mount-readahead 0`, so each
//! page it has not read yet is a FUSE read, as the guest's fault was).
//!
//! **As a child process** ([`replay_if_asked`]): the clone bench's storm
//! starts one per node, with [`TRACE_ENV`] and [`MEM_ENV`] set. The child
//! maps `mem`, prints `storm-ready`, waits for a byte on stdin (the go, so
//! that every replay starts at once), replays, printing `storm-running
//! SECS` and `storm-answered SECS` as it passes the trace's marks (seconds
//! since the go), then `storm-done`, and exits.

use std::io::{BufRead, Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use super::trace::{Entry, Trace};

/// The trace file a child replays.
pub const TRACE_ENV: &str = "GVFS_CLONE_REPLAY_TRACE";
/// The `mem` it maps.
pub const MEM_ENV: &str = "GVFS_CLONE_REPLAY_MEM";

/// The page a touch reads one byte of.
const PAGE: u64 = 4096;

/// A file mapped private and read-only, as QEMU maps a lazy clone's RAM.
pub struct Mapped {
    ptr: *mut libc::c_void,
    len: usize,
    _file: std::fs::File,
}

// The mapping is read-only and lives as long as the value.
unsafe impl Send for Mapped {}
unsafe impl Sync for Mapped {}

impl Mapped {
    /// Maps all of `path`.
    pub fn open(path: &Path) -> Result<Self> {
        use std::os::fd::AsRawFd;
        let file =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let len = usize::try_from(file.metadata()?.len())?;
        ensure!(len > 0, "{} is empty", path.display());
        // SAFETY: a fresh read-only private mapping of an open file; the
        // pointer is checked and unmapped on drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        ensure!(
            ptr != libc::MAP_FAILED,
            "mapping {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
        Ok(Self {
            ptr,
            len,
            _file: file,
        })
    }

    /// The mapped bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes mapped readable at `ptr` until drop.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }

    /// The bytes of `e` that lie in the file.
    fn span(&self, e: &Entry) -> &[u8] {
        let len = self.len as u64;
        let from = e.offset.min(len);
        let to = e.offset.saturating_add(u64::from(e.len)).min(len);
        &self.bytes()[from as usize..to as usize]
    }

    /// Reads one byte of every 4 KiB page `e` covers.
    fn touch(&self, e: &Entry) {
        let bytes = self.bytes();
        let len = self.len as u64;
        let mut page = e.offset / PAGE * PAGE;
        let end = e.offset.saturating_add(u64::from(e.len)).min(len);
        while page < end {
            // SAFETY: `page < len`, inside the mapping.
            unsafe { std::ptr::read_volatile(bytes.as_ptr().add(page as usize)) };
            page += PAGE;
        }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, unmapped once.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// The least think time a replay sleeps at once.
const SLEEP_AT_LEAST: Duration = Duration::from_millis(1);

/// Think time not yet slept (negative when a sleep overslept).
#[derive(Default)]
struct Owed(f64);

impl Owed {
    fn add(&mut self, d: Duration) {
        self.0 += d.as_secs_f64();
    }

    /// Sleeps what is owed if it is at least `least`.
    fn pay(&mut self, least: Duration) {
        if self.0 > 0.0 && self.0 >= least.as_secs_f64() {
            let t = Instant::now();
            std::thread::sleep(Duration::from_secs_f64(self.0));
            self.0 -= t.elapsed().as_secs_f64();
        }
    }
}

/// When a replay passed the trace's marks, since its start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Replayed {
    /// The guest verified running.
    pub running: Duration,
    /// Its answer.
    pub answered: Duration,
}

/// Which mark a replay passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Passed {
    /// The guest verified running.
    Running,
    /// Its answer.
    Answered,
}

/// Replays `trace` on `map`: for each entry, the think time, then a touch
/// of each of its pages, then `check` of its bytes (the caller's, to
/// verify them); `passed` hears of each mark as it is passed.
pub fn replay(
    trace: &Trace,
    map: &Mapped,
    mut check: impl FnMut(&Entry, &[u8]) -> Result<()>,
    mut passed: impl FnMut(Passed, Duration),
) -> Result<Replayed> {
    let start = Instant::now();
    let mut marks = [
        (Passed::Running, trace.running, None),
        (Passed::Answered, trace.answered, None),
    ];
    // The guest's time since the last entry ended, and how much of it is
    // still to be slept (think times of microseconds are summed and slept
    // a millisecond or more at a time, so that sleeping's own cost does not
    // add up over thousands of reads).
    let mut idle = Duration::ZERO;
    let mut owed = Owed::default();
    for i in 0..=trace.entries.len() {
        for (which, mark, at) in &mut marks {
            if mark.entries == i && at.is_none() {
                owed.add(mark.tail.saturating_sub(idle));
                idle = idle.max(mark.tail);
                owed.pay(Duration::ZERO);
                let now = start.elapsed();
                *at = Some(now);
                passed(*which, now);
            }
        }
        let Some(e) = trace.entries.get(i) else {
            break;
        };
        owed.add(e.think.saturating_sub(idle));
        owed.pay(SLEEP_AT_LEAST);
        idle = Duration::ZERO;
        map.touch(e);
        check(e, map.span(e))?;
    }
    Ok(Replayed {
        running: marks[0].2.unwrap_or_default(),
        answered: marks[1].2.unwrap_or_default(),
    })
}

/// In a child started by the storm ([`TRACE_ENV`] set): replays and exits
/// (1 on failure, with the cause on stderr). Otherwise returns at once.
pub fn replay_if_asked() {
    let Some(trace) = std::env::var_os(TRACE_ENV) else {
        return;
    };
    let code = match child(Path::new(&trace)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("storm replay: {e:#}");
            1
        }
    };
    std::process::exit(code);
}

fn child(trace: &Path) -> Result<()> {
    let mem = std::env::var_os(MEM_ENV).context("GVFS_CLONE_REPLAY_MEM is not set")?;
    let trace = Trace::parse(&std::fs::read_to_string(trace)?)?;
    let map = Mapped::open(Path::new(&mem))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "storm-ready")?;
    out.flush()?;
    let mut go = [0u8; 1];
    ensure!(
        std::io::stdin().read(&mut go)? == 1,
        "no go from the storm (stdin closed)"
    );
    replay(
        &trace,
        &map,
        |_, _| Ok(()),
        |which, at| {
            let name = match which {
                Passed::Running => "running",
                Passed::Answered => "answered",
            };
            let _ = writeln!(out, "storm-{name} {:.6}", at.as_secs_f64());
            let _ = out.flush();
        },
    )?;
    writeln!(out, "storm-done")?;
    out.flush()?;
    Ok(())
}

/// A line a replay child printed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ChildLine {
    /// Mapped, waiting for the go.
    Ready,
    /// Passed a mark, seconds after the go.
    Passed(Passed, f64),
    /// Finished.
    Done,
}

/// Reads a child's line (other lines, a test harness's, are `None`).
pub fn child_line(line: &str) -> Option<ChildLine> {
    let mut words = line.split_whitespace();
    let secs = |w: Option<&str>| w.and_then(|s| s.parse::<f64>().ok());
    match words.next()? {
        "storm-ready" => Some(ChildLine::Ready),
        "storm-done" => Some(ChildLine::Done),
        "storm-running" => Some(ChildLine::Passed(Passed::Running, secs(words.next())?)),
        "storm-answered" => Some(ChildLine::Passed(Passed::Answered, secs(words.next())?)),
        _ => None,
    }
}

/// Reads `from` line by line until it ends, giving each child line to `f`.
pub(super) fn read_child(from: impl Read, mut f: impl FnMut(ChildLine)) {
    for line in std::io::BufReader::new(from).lines() {
        let Ok(line) = line else { break };
        if let Some(l) = child_line(&line) {
            f(l);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clone::trace::Mark;

    #[test]
    fn a_replay_touches_every_page_and_passes_the_marks_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("mem");
        let data: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).expect("write");
        let map = Mapped::open(&path).expect("map");
        let e = |offset, len| Entry {
            offset,
            len,
            think: Duration::from_millis(1),
        };
        let trace = Trace {
            entries: vec![e(0, 4096), e(8192, 8192), e(60 * 1024, 8192)],
            running: Mark {
                entries: 1,
                tail: Duration::ZERO,
            },
            answered: Mark {
                entries: 3,
                tail: Duration::from_millis(2),
            },
            before_resume: Duration::ZERO,
        };
        let mut seen = Vec::new();
        let mut passed = Vec::new();
        let r = replay(
            &trace,
            &map,
            |e, bytes| {
                let want = &data[e.offset as usize..(e.offset as usize + bytes.len())];
                ensure!(bytes == want, "bytes at {}", e.offset);
                seen.push(bytes.len());
                Ok(())
            },
            |w, _| passed.push(w),
        )
        .expect("replay");
        // The last entry runs past the end of the file: only its part in it.
        assert_eq!(seen, vec![4096, 8192, 4096]);
        assert_eq!(passed, vec![Passed::Running, Passed::Answered]);
        // Oversleeping is paid back by later sleeps, so only the total is
        // sure: three think times and the answer's tail, 5 ms.
        assert!(r.running < r.answered, "{r:?}");
        assert!(r.answered >= Duration::from_micros(4_900), "{r:?}");
        assert_eq!(
            child_line("storm-answered 1.5"),
            Some(ChildLine::Passed(Passed::Answered, 1.5))
        );
        assert_eq!(child_line("running 1 test"), None);
    }
}
