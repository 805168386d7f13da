//! A guest's page faults as a lazy clone made them, for replaying them
//! from many nodes at once ([`storm`](super::storm)).
//!
//! **Recording.** Lazy WAN-S1's node runs with `--mount-trace`: its FUSE
//! mount writes a line per read (`ino offset size start_us end_us`, times
//! since the Unix epoch; `gvfs_fuse::trace`). Its first clone notes when
//! QEMU was told to continue, when the guest was verified running and when
//! it answered ([`Marks`]). [`Trace::from_fuse`] keeps the reads of `mem`'s
//! inode from the resume on, each as an [`Entry`] whose `think` is the time
//! since the previous read ended: the waits for fetches leave, the guest's
//! own time between faults stays.
//!
//! **The file** ([`Trace::text`], `clone-trace.txt` beside the report):
//!
//! ```text
//! # gvfs clone trace: offset len think_us per line
//! before_resume_us 412000
//! running 812 35000
//! answered 1290 1200
//! 0 4096 0
//! 1310720 4096 15
//! ...
//! ```
//!
//! `running N T` says the guest was verified running `T` µs after the end
//! of entry `N - 1` (before entry `N`); `answered` likewise for its answer.
//! `before_resume_us` is how long the recorded clone took before QEMU
//! continued (copies, overlay, loading the device state): a replay starts
//! there, and its marks are counted from the clone's start.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};

/// Most entries a trace may hold (the FUSE trace stops at 4M lines).
const MAX_ENTRIES: usize = 4 << 20;

/// One read of the guest's memory image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Where in `mem`.
    pub offset: u64,
    /// How many bytes.
    pub len: u32,
    /// The guest's time since the previous read ended.
    pub think: Duration,
}

/// A point in the guest's run: after `entries` reads, and `tail` more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Mark {
    /// Reads done before it.
    pub entries: usize,
    /// Time after the last of them ended (or after the start).
    pub tail: Duration,
}

/// The instants of the recorded clone, in microseconds since the Unix
/// epoch.
#[derive(Debug, Clone, Copy)]
pub struct Marks {
    /// Its start (the first copy).
    pub start_us: u64,
    /// QEMU told to continue.
    pub resume_us: u64,
    /// The guest verified running.
    pub running_us: u64,
    /// The guest's answer.
    pub answered_us: u64,
}

/// A recorded run of a guest's reads of its memory image.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Trace {
    /// The reads, in the order they started.
    pub entries: Vec<Entry>,
    /// The guest verified running.
    pub running: Mark,
    /// Its answer.
    pub answered: Mark,
    /// The recorded clone's time before QEMU continued.
    pub before_resume: Duration,
}

impl Trace {
    /// The reads of inode `ino` in `text` (a FUSE read trace) from the
    /// resume on, with the marks of `marks`.
    pub fn from_fuse(text: &str, ino: u64, marks: Marks) -> Result<Self> {
        let mut reads = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let f: Vec<u64> = line
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .with_context(|| format!("read trace line {}: {line:?}", n + 1))?;
            let &[i, offset, size, start, end] = f.as_slice() else {
                bail!("read trace line {}: {line:?}: five numbers expected", n + 1);
            };
            if i == ino && start >= marks.resume_us && size > 0 {
                let len = u32::try_from(size).context("a read larger than 4 GiB")?;
                reads.push((start, end.max(start), offset, len));
            }
        }
        ensure!(reads.len() <= MAX_ENTRIES, "{} reads traced", reads.len());
        reads.sort_unstable_by_key(|r| r.0);
        let mut entries = Vec::with_capacity(reads.len());
        // The guest's clock: the latest end so far (reads can overlap).
        let mut ended = marks.resume_us;
        let mark_at = |at: u64, entries: &[(u64, u64, u64, u32)]| {
            let before = entries.partition_point(|r| r.0 <= at);
            let last_end = entries[..before]
                .iter()
                .map(|r| r.1)
                .max()
                .unwrap_or(marks.resume_us);
            Mark {
                entries: before,
                tail: Duration::from_micros(at.saturating_sub(last_end)),
            }
        };
        let running = mark_at(marks.running_us, &reads);
        let answered = mark_at(marks.answered_us.max(marks.running_us), &reads);
        for &(start, end, offset, len) in &reads {
            entries.push(Entry {
                offset,
                len,
                think: Duration::from_micros(start.saturating_sub(ended)),
            });
            ended = ended.max(end);
        }
        Ok(Self {
            entries,
            running,
            answered,
            before_resume: Duration::from_micros(marks.resume_us.saturating_sub(marks.start_us)),
        })
    }

    /// The trace as the text [`parse`](Self::parse) reads (the module's
    /// format).
    pub fn text(&self) -> String {
        let mut out = format!(
            "# gvfs clone trace: offset len think_us per line\nbefore_resume_us {}\nrunning {} \
             {}\nanswered {} {}\n",
            self.before_resume.as_micros(),
            self.running.entries,
            self.running.tail.as_micros(),
            self.answered.entries,
            self.answered.tail.as_micros()
        );
        for e in &self.entries {
            out += &format!("{} {} {}\n", e.offset, e.len, e.think.as_micros());
        }
        out
    }

    /// Reads [`text`](Self::text)'s format.
    pub fn parse(text: &str) -> Result<Self> {
        let mut t = Trace::default();
        for (n, line) in text.lines().enumerate() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            let num = |i: usize| -> Result<u64> {
                words
                    .get(i)
                    .context("too few fields")?
                    .parse()
                    .with_context(|| format!("clone trace line {}: {line:?}", n + 1))
            };
            match words.first().copied() {
                Some("before_resume_us") => t.before_resume = Duration::from_micros(num(1)?),
                Some(which @ ("running" | "answered")) => {
                    let mark = Mark {
                        entries: usize::try_from(num(1)?)?,
                        tail: Duration::from_micros(num(2)?),
                    };
                    if which == "running" {
                        t.running = mark;
                    } else {
                        t.answered = mark;
                    }
                }
                _ => {
                    ensure!(
                        t.entries.len() < MAX_ENTRIES,
                        "clone trace: too many entries"
                    );
                    t.entries.push(Entry {
                        offset: num(0)?,
                        len: u32::try_from(num(1)?)?,
                        think: Duration::from_micros(num(2)?),
                    });
                }
            }
        }
        ensure!(
            t.running.entries <= t.entries.len() && t.answered.entries <= t.entries.len(),
            "clone trace: a mark past its last entry"
        );
        Ok(t)
    }

    /// Bytes the reads ask for, in all.
    pub fn bytes(&self) -> u64 {
        self.entries.iter().map(|e| u64::from(e.len)).sum()
    }

    /// The guest's own time (think times and the marks' tails) until its
    /// answer: what a replay with every byte local would take.
    pub fn think_to_answer(&self) -> Duration {
        self.entries[..self.answered.entries]
            .iter()
            .map(|e| e.think)
            .sum::<Duration>()
            + self.answered.tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fuse_trace_becomes_think_times_and_marks() {
        // Inode 9 is mem; 4 is another file. Times in µs.
        let text = "4 0 4096 50 60\n\
                    9 8192 4096 90 95\n\
                    9 0 4096 100 400\n\
                    9 4096 4096 410 420\n\
                    9 16384 8192 500 900\n";
        let marks = Marks {
            start_us: 0,
            resume_us: 100,
            running_us: 450,
            answered_us: 1000,
        };
        let t = Trace::from_fuse(text, 9, marks).expect("trace");
        // The read before the resume is left out; the wait of the first
        // (300 µs) is not think time.
        assert_eq!(
            t.entries,
            vec![
                Entry {
                    offset: 0,
                    len: 4096,
                    think: Duration::ZERO
                },
                Entry {
                    offset: 4096,
                    len: 4096,
                    think: Duration::from_micros(10)
                },
                Entry {
                    offset: 16384,
                    len: 8192,
                    think: Duration::from_micros(80)
                },
            ]
        );
        assert_eq!(
            t.running,
            Mark {
                entries: 2,
                tail: Duration::from_micros(30)
            }
        );
        assert_eq!(
            t.answered,
            Mark {
                entries: 3,
                tail: Duration::from_micros(100)
            }
        );
        assert_eq!(t.before_resume, Duration::from_micros(100));
        assert_eq!(Trace::parse(&t.text()).expect("parse"), t);
        assert_eq!(t.bytes(), 16384);
        assert_eq!(t.think_to_answer(), Duration::from_micros(190));
    }

    #[test]
    fn bad_lines_are_refused() {
        let marks = Marks {
            start_us: 0,
            resume_us: 0,
            running_us: 0,
            answered_us: 0,
        };
        assert!(Trace::from_fuse("1 2 3\n", 1, marks).is_err());
        assert!(Trace::from_fuse("1 2 x 4 5\n", 1, marks).is_err());
        assert!(Trace::parse("running 5 0\n0 4096 0\n").is_err());
    }
}
