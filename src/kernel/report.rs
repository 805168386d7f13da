//! What the guest reports, and the comparison of what it wrote with the
//! origin's directory.
//!
//! The guest writes lines to its second serial port (see `init.sh`):
//! `gvfs-kernel: step NAME ok`, `gvfs-kernel: step NAME fail WHAT`,
//! `gvfs-kernel: entry PATH KIND ...` for everything under the mount once
//! it has checked it, `gvfs-kernel: mtime PATH SECONDS` for files whose
//! mtime it set, and `gvfs-kernel: end FAILED_STEPS` last. Other lines are
//! ignored.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};

use crate::process::run_ok;

/// The prefix of every result line.
const PREFIX: &str = "gvfs-kernel: ";
/// Steps the workload ends with: a report without them is cut short.
const LAST_STEPS: [&str; 3] = ["verify-remount", "manifest", "umount-final"];

/// One file, directory or symbolic link, as the guest or the origin sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A regular file.
    File {
        /// Permission bits (`stat -c %a`).
        mode: u32,
        /// Owner.
        uid: u32,
        /// Group.
        gid: u32,
        /// Size in bytes.
        size: u64,
        /// Link count.
        nlink: u64,
        /// MD5 of its contents, in hex.
        md5: String,
    },
    /// A directory.
    Dir {
        /// Permission bits.
        mode: u32,
        /// Owner.
        uid: u32,
        /// Group.
        gid: u32,
    },
    /// A symbolic link.
    Symlink {
        /// Owner.
        uid: u32,
        /// Group.
        gid: u32,
        /// What it points to.
        target: String,
    },
}

/// Everything the guest reported.
#[derive(Debug, Clone, Default)]
pub struct GuestReport {
    /// Each step in order, with why it failed (`None`: it passed).
    pub steps: Vec<(String, Option<String>)>,
    /// What was under the mount after the remount, by path relative to it.
    pub entries: BTreeMap<String, Entry>,
    /// Modification times (seconds) of files whose mtime the guest set.
    pub mtimes: BTreeMap<String, i64>,
    /// The guest's count of failed steps, once it finished.
    pub end: Option<u32>,
    /// Lines that looked like results but did not parse.
    pub garbled: Vec<String>,
    /// The kernel's console (for error messages).
    pub console: String,
    /// Boot to power-off.
    pub elapsed: Duration,
    /// The workload set a file's mtime, so it must have reported it.
    pub set_mtime: bool,
}

impl GuestReport {
    /// Parses the result lines in `results`.
    pub fn parse(results: &str, console: String, elapsed: Duration) -> Self {
        let mut r = Self {
            console,
            elapsed,
            ..Self::default()
        };
        for line in results.lines() {
            let line = line.trim_end_matches('\r');
            let Some(rest) = line.strip_prefix(PREFIX) else {
                continue;
            };
            if !r.parse_line(rest) {
                r.garbled.push(line.to_owned());
            }
        }
        r
    }

    fn parse_line(&mut self, rest: &str) -> bool {
        let mut words = rest.split(' ');
        match words.next() {
            Some("step") => {
                let (Some(name), Some(outcome)) = (words.next(), words.next()) else {
                    return false;
                };
                let why = match outcome {
                    "ok" => None,
                    "fail" => Some(words.collect::<Vec<_>>().join(" ")),
                    _ => return false,
                };
                self.steps.push((name.to_owned(), why));
                true
            }
            Some("entry") => {
                let Some(path) = words.next().and_then(|p| p.strip_prefix("./")) else {
                    return false;
                };
                let words: Vec<&str> = words.collect();
                let Some(entry) = parse_entry(&words) else {
                    return false;
                };
                self.entries.insert(path.to_owned(), entry);
                true
            }
            Some("mtime") => {
                match (
                    words.next().and_then(|p| p.strip_prefix("./")),
                    words.next().map(str::parse),
                ) {
                    (Some(path), Some(Ok(secs))) => {
                        self.mtimes.insert(path.to_owned(), secs);
                        true
                    }
                    _ => false,
                }
            }
            Some("end") => match words.next().map(str::parse) {
                Some(Ok(n)) => {
                    self.end = Some(n);
                    true
                }
                _ => false,
            },
            _ => false,
        }
    }

    /// The steps that failed.
    pub fn failed(&self) -> Vec<&(String, Option<String>)> {
        self.steps.iter().filter(|s| s.1.is_some()).collect()
    }

    /// One paragraph: steps passed, failed ones with why, whether it ended.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} steps, {} failed, {} entries, {:.1} s, {}",
            self.steps.len(),
            self.failed().len(),
            self.entries.len(),
            self.elapsed.as_secs_f64(),
            match self.end {
                Some(_) => "finished".to_owned(),
                None => "did not finish".to_owned(),
            }
        );
        for (name, why) in self.failed() {
            s.push_str(&format!(
                "\n  {name} failed: {}",
                why.as_deref().unwrap_or("")
            ));
        }
        if let Some((last, _)) = self.steps.last() {
            s.push_str(&format!("\n  last step reported: {last}"));
        }
        for g in &self.garbled {
            s.push_str(&format!("\n  unparsed: {g}"));
        }
        s
    }

    /// Fails unless every step passed and the workload ran to its end.
    pub fn ensure_passed(&self) -> Result<()> {
        let missing: Vec<&str> = LAST_STEPS
            .iter()
            .copied()
            .filter(|l| !self.steps.iter().any(|(n, _)| n == l))
            .collect();
        if self.end == Some(0)
            && self.failed().is_empty()
            && missing.is_empty()
            && self.garbled.is_empty()
            && !self.entries.is_empty()
            && (self.mtimes.is_empty() != self.set_mtime)
        {
            return Ok(());
        }
        bail!(
            "the kernel NFS client's workload did not pass: {}{}{}\nguest console (last lines):\n{}",
            self.summary(),
            if missing.is_empty() {
                String::new()
            } else {
                format!("\n  steps never reported: {}", missing.join(", "))
            },
            if self.mtimes.is_empty() == self.set_mtime {
                format!("\n  mtimes reported: {:?}", self.mtimes)
            } else {
                String::new()
            },
            tail(&self.console, 40)
        )
    }
}

/// The last `n` lines of `text`.
pub(super) fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// An entry line's words after the path: `file MODE UID GID SIZE NLINK
/// MD5`, `dir MODE UID GID` or `symlink UID GID TARGET`.
fn parse_entry(words: &[&str]) -> Option<Entry> {
    let mode = |s: &str| u32::from_str_radix(s, 8).ok();
    match words {
        ["file", m, uid, gid, size, nlink, md5] if md5.len() == 32 => Some(Entry::File {
            mode: mode(m)?,
            uid: uid.parse().ok()?,
            gid: gid.parse().ok()?,
            size: size.parse().ok()?,
            nlink: nlink.parse().ok()?,
            md5: (*md5).to_owned(),
        }),
        ["dir", m, uid, gid] => Some(Entry::Dir {
            mode: mode(m)?,
            uid: uid.parse().ok()?,
            gid: gid.parse().ok()?,
        }),
        ["symlink", uid, gid, target] => Some(Entry::Symlink {
            uid: uid.parse().ok()?,
            gid: gid.parse().ok()?,
            target: (*target).to_owned(),
        }),
        _ => None,
    }
}

impl GuestReport {
    /// Fails, listing every difference, unless the origin directory `root`
    /// holds what the guest saw: the same entries ([`compare_trees`]) and
    /// the modification times the guest set.
    pub fn compare_origin(&self, root: &Path) -> Result<()> {
        let origin = origin_entries(root)?;
        compare_trees(&self.entries, &origin)?;
        let mut diffs = Vec::new();
        for (path, want) in &self.mtimes {
            let meta = std::fs::symlink_metadata(root.join(path))
                .with_context(|| format!("stat {path} at the origin"))?;
            if meta.mtime() != *want {
                diffs.push(format!(
                    "{path}: mtime {} at the origin, the guest set {want}",
                    meta.mtime()
                ));
            }
        }
        ensure!(diffs.is_empty(), "{}", diffs.join("\n"));
        Ok(())
    }
}

/// Everything under `root` (not `root` itself), by path relative to it,
/// with MD5s from `md5sum`.
pub fn origin_entries(root: &Path) -> Result<BTreeMap<String, Entry>> {
    let mut entries = BTreeMap::new();
    let mut files = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = e?.path();
            let rel = path
                .strip_prefix(root)
                .context("a path outside the root")?
                .to_string_lossy()
                .into_owned();
            let meta = std::fs::symlink_metadata(&path)
                .with_context(|| format!("stat {}", path.display()))?;
            let (mode, uid, gid) = (meta.mode() & 0o7777, meta.uid(), meta.gid());
            let entry = if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path)?;
                Entry::Symlink {
                    uid,
                    gid,
                    target: target.to_string_lossy().into_owned(),
                }
            } else if meta.is_dir() {
                stack.push(path.clone());
                Entry::Dir { mode, uid, gid }
            } else {
                files.push(rel.clone());
                Entry::File {
                    mode,
                    uid,
                    gid,
                    size: meta.len(),
                    nlink: meta.nlink(),
                    md5: String::new(),
                }
            };
            entries.insert(rel, entry);
        }
    }
    for chunk in files.chunks(256) {
        let out = run_ok(
            Command::new("md5sum").args(chunk).current_dir(root),
            Duration::from_secs(120),
        )?;
        for line in out.stdout_text().lines() {
            let (sum, path) = line.split_once("  ").context("md5sum's output")?;
            if let Some(Entry::File { md5, .. }) = entries.get_mut(path) {
                *md5 = sum.to_owned();
            }
        }
    }
    ensure!(
        entries
            .values()
            .all(|e| !matches!(e, Entry::File { md5, .. } if md5.is_empty())),
        "md5sum left files of {} without a checksum",
        root.display()
    );
    Ok(entries)
}

/// Fails, listing every difference, unless `origin` holds exactly what the
/// guest saw.
pub fn compare_trees(
    guest: &BTreeMap<String, Entry>,
    origin: &BTreeMap<String, Entry>,
) -> Result<()> {
    let mut diffs = Vec::new();
    for (path, want) in guest {
        match origin.get(path) {
            None => diffs.push(format!("{path}: missing at the origin (guest: {want:?})")),
            Some(got) if got != want => {
                diffs.push(format!("{path}: origin {got:?}, guest {want:?}"))
            }
            Some(_) => {}
        }
    }
    for (path, got) in origin {
        if !guest.contains_key(path) {
            diffs.push(format!("{path}: at the origin only ({got:?})"));
        }
    }
    ensure!(
        diffs.is_empty(),
        "the origin differs from what the guest wrote ({} of {} entries):\n{}",
        diffs.len(),
        guest.len(),
        diffs.join("\n")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MD5: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn result_lines_parse_and_noise_is_ignored() {
        let text = format!(
            "[    1.0] random kernel line\n\
             gvfs-kernel: step mount ok\r\n\
             gvfs-kernel: step read-big fail /mnt/big has MD5 x, expected y\n\
             gvfs-kernel: entry ./big file 644 0 0 6291456 2 {MD5}\n\
             gvfs-kernel: entry ./dir dir 755 1000 100\n\
             gvfs-kernel: entry ./big.sym symlink 0 0 big\n\
             gvfs-kernel: entry ./bad file 644\n\
             gvfs-kernel: mtime ./big 1000000000\n\
             gvfs-kernel: end 1\n"
        );
        let r = GuestReport::parse(&text, String::new(), Duration::ZERO);
        assert_eq!(r.steps.len(), 2);
        assert_eq!(
            r.steps[1].1.as_deref(),
            Some("/mnt/big has MD5 x, expected y")
        );
        assert_eq!(
            r.entries["big"],
            Entry::File {
                mode: 0o644,
                uid: 0,
                gid: 0,
                size: 6_291_456,
                nlink: 2,
                md5: MD5.into()
            }
        );
        assert_eq!(
            r.entries["dir"],
            Entry::Dir {
                mode: 0o755,
                uid: 1000,
                gid: 100
            }
        );
        assert_eq!(
            r.entries["big.sym"],
            Entry::Symlink {
                uid: 0,
                gid: 0,
                target: "big".into()
            }
        );
        assert_eq!(r.mtimes["big"], 1_000_000_000);
        assert_eq!(r.garbled.len(), 1);
        assert_eq!(r.end, Some(1));
        let err = r.ensure_passed().expect_err("a failed step fails");
        assert!(err.to_string().contains("read-big failed"), "{err}");
    }

    #[test]
    fn a_report_cut_short_does_not_pass() {
        let mut text = String::new();
        for s in LAST_STEPS {
            text.push_str(&format!("gvfs-kernel: step {s} ok\n"));
        }
        text.push_str(&format!("gvfs-kernel: entry ./f file 600 0 0 1 1 {MD5}\n"));
        let whole = format!("{text}gvfs-kernel: end 0\n");
        GuestReport::parse(&whole, String::new(), Duration::ZERO)
            .ensure_passed()
            .expect("a whole report passes");
        let mut set = GuestReport::parse(&whole, String::new(), Duration::ZERO);
        set.set_mtime = true;
        let err = set.ensure_passed().expect_err("no mtime line");
        assert!(err.to_string().contains("mtimes reported"), "{err}");
        let err = GuestReport::parse(&text, String::new(), Duration::ZERO)
            .ensure_passed()
            .expect_err("no end line");
        assert!(err.to_string().contains("did not finish"), "{err}");
        let early = "gvfs-kernel: step mount ok\ngvfs-kernel: end 0\n";
        let err = GuestReport::parse(early, String::new(), Duration::ZERO)
            .ensure_passed()
            .expect_err("steps missing");
        assert!(err.to_string().contains("never reported"), "{err}");
    }

    #[test]
    fn the_origin_is_read_and_compared() -> Result<()> {
        let d = tempfile::tempdir()?;
        std::fs::write(d.path().join("a"), b"hello\n")?;
        std::fs::hard_link(d.path().join("a"), d.path().join("b"))?;
        std::fs::create_dir(d.path().join("sub"))?;
        std::os::unix::fs::symlink("a", d.path().join("sub/l"))?;
        let origin = origin_entries(d.path())?;
        let Some(Entry::File { nlink, md5, .. }) = origin.get("a") else {
            bail!("no file a: {origin:?}");
        };
        assert_eq!(*nlink, 2);
        // md5("hello\n")
        assert_eq!(md5, "b1946ac92492d2347c6235b4d2611184");
        let Some(Entry::Symlink { target, .. }) = origin.get("sub/l") else {
            bail!("no symlink sub/l: {origin:?}");
        };
        assert_eq!(target, "a");
        compare_trees(&origin, &origin)?;
        let mut guest = origin.clone();
        guest.remove("b");
        guest.insert(
            "a".into(),
            Entry::File {
                mode: 0o644,
                uid: 0,
                gid: 0,
                size: 6,
                nlink: 2,
                md5: MD5.into(),
            },
        );
        let err = compare_trees(&guest, &origin).expect_err("differs");
        let text = err.to_string();
        assert!(text.contains("b: at the origin only"), "{text}");
        assert!(text.contains("a: origin"), "{text}");
        Ok(())
    }
}
