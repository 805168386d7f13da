//! An expected directory tree ([`Model`]) and [`check_tree`], which fails
//! listing every difference between it and a real tree: what a workload
//! wrote, checked through a mount and again at the origin.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};

use crate::data::compare_bytes;

/// One thing a workload leaves behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Want {
    /// A regular file.
    File {
        /// Its content.
        bytes: Vec<u8>,
        /// Its permission bits (`mode & 0o7777`).
        mode: u32,
        /// Its link count.
        nlink: u64,
    },
    /// A directory.
    Dir {
        /// Its permission bits.
        mode: u32,
    },
    /// A symbolic link.
    Symlink {
        /// Where it points.
        target: PathBuf,
    },
}

/// What a workload left, by path relative to the tree's root.
#[derive(Debug, Default)]
pub struct Model {
    /// Every entry of the tree.
    pub entries: BTreeMap<PathBuf, Want>,
    /// Files whose mtime was set (seconds).
    pub mtimes: BTreeMap<PathBuf, i64>,
    /// Pairs of hard links: the same inode.
    pub same_inode: Vec<(PathBuf, PathBuf)>,
}

impl Model {
    /// A regular file `rel` with one link.
    pub fn file(&mut self, rel: &str, bytes: Vec<u8>, mode: u32) {
        self.entries.insert(
            rel.into(),
            Want::File {
                bytes,
                mode,
                nlink: 1,
            },
        );
    }

    /// A directory `rel`.
    pub fn dir(&mut self, rel: &str, mode: u32) {
        self.entries.insert(rel.into(), Want::Dir { mode });
    }

    /// The content of file `rel`, to change as the workload changes it.
    pub fn bytes(&mut self, rel: &str) -> Result<&mut Vec<u8>> {
        match self.entries.get_mut(Path::new(rel)) {
            Some(Want::File { bytes, .. }) => Ok(bytes),
            other => bail!("the model has no file {rel} ({other:?})"),
        }
    }

    /// Sets the permission bits of file or directory `rel`.
    pub fn set_mode(&mut self, rel: &str, m: u32) -> Result<()> {
        match self.entries.get_mut(Path::new(rel)) {
            Some(Want::File { mode, .. } | Want::Dir { mode }) => {
                *mode = m;
                Ok(())
            }
            other => bail!("the model has no file or directory {rel} ({other:?})"),
        }
    }

    /// Sets the link count of file `rel`.
    pub fn set_nlink(&mut self, rel: &str, n: u64) -> Result<()> {
        match self.entries.get_mut(Path::new(rel)) {
            Some(Want::File { nlink, .. }) => {
                *nlink = n;
                Ok(())
            }
            other => bail!("the model has no file {rel} ({other:?})"),
        }
    }

    /// Moves `from` (and everything under it) to `to`.
    pub fn rename(&mut self, from: &str, to: &str) {
        let (from, to) = (Path::new(from), Path::new(to));
        let moved: Vec<PathBuf> = self
            .entries
            .keys()
            .filter(|p| p.starts_with(from))
            .cloned()
            .collect();
        for p in moved {
            if let Some(w) = self.entries.remove(&p) {
                let rest = p.strip_prefix(from).unwrap_or(Path::new(""));
                let dest = if rest.as_os_str().is_empty() {
                    to.to_path_buf()
                } else {
                    to.join(rest)
                };
                self.entries.insert(dest, w);
            }
        }
    }
}

/// Everything under `root` (not `root` itself), by relative path, with its
/// lstat.
fn walk(root: &Path) -> Result<BTreeMap<PathBuf, fs::Metadata>> {
    let mut found = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
            let path = e
                .with_context(|| format!("listing {}", dir.display()))?
                .path();
            let meta =
                fs::symlink_metadata(&path).with_context(|| format!("lstat {}", path.display()))?;
            if meta.is_dir() {
                stack.push(path.clone());
            }
            let rel = path.strip_prefix(root).context("a path outside the root")?;
            found.insert(rel.to_path_buf(), meta);
        }
    }
    Ok(found)
}

/// Fails, listing every difference, unless the tree under `root` is
/// exactly `model`: the same names and kinds; for files the same bytes,
/// size, permission bits and link count; for directories the permission
/// bits; for symbolic links the target; the mtimes set; hard links on one
/// inode.
pub fn check_tree(root: &Path, model: &Model, label: &str) -> Result<()> {
    let found = walk(root)?;
    let mut diffs = Vec::new();
    for (rel, want) in &model.entries {
        let shown = rel.display();
        let Some(meta) = found.get(rel) else {
            diffs.push(format!("{shown}: missing"));
            continue;
        };
        let path = root.join(rel);
        let perm = meta.mode() & 0o7777;
        match want {
            Want::File { bytes, mode, nlink } => {
                if !meta.is_file() {
                    diffs.push(format!(
                        "{shown}: not a regular file ({:?})",
                        meta.file_type()
                    ));
                    continue;
                }
                if meta.len() != bytes.len() as u64 {
                    diffs.push(format!(
                        "{shown}: size {}, expected {}",
                        meta.len(),
                        bytes.len()
                    ));
                }
                if perm != *mode {
                    diffs.push(format!("{shown}: mode {perm:o}, expected {mode:o}"));
                }
                if meta.nlink() != *nlink {
                    diffs.push(format!("{shown}: {} links, expected {nlink}", meta.nlink()));
                }
                match fs::read(&path) {
                    Ok(got) => {
                        if let Err(e) = compare_bytes(bytes, &got) {
                            diffs.push(format!("{shown}: {e}"));
                        }
                    }
                    Err(e) => diffs.push(format!("{shown}: reading: {e}")),
                }
            }
            Want::Dir { mode } => {
                if !meta.is_dir() {
                    diffs.push(format!("{shown}: not a directory ({:?})", meta.file_type()));
                } else if perm != *mode {
                    diffs.push(format!("{shown}: mode {perm:o}, expected {mode:o}"));
                }
            }
            Want::Symlink { target } => {
                if !meta.file_type().is_symlink() {
                    diffs.push(format!(
                        "{shown}: not a symbolic link ({:?})",
                        meta.file_type()
                    ));
                    continue;
                }
                match fs::read_link(&path) {
                    Ok(t) if t == *target => {}
                    Ok(t) => diffs.push(format!(
                        "{shown}: points to {}, expected {}",
                        t.display(),
                        target.display()
                    )),
                    Err(e) => diffs.push(format!("{shown}: readlink: {e}")),
                }
            }
        }
    }
    for (rel, meta) in &found {
        if !model.entries.contains_key(rel) {
            diffs.push(format!(
                "{}: not expected ({:?}, {} bytes)",
                rel.display(),
                meta.file_type(),
                meta.len()
            ));
        }
    }
    for (rel, secs) in &model.mtimes {
        if let Some(meta) = found.get(rel)
            && meta.mtime() != *secs
        {
            diffs.push(format!(
                "{}: mtime {}, expected {secs}",
                rel.display(),
                meta.mtime()
            ));
        }
    }
    for (a, b) in &model.same_inode {
        if let (Some(ma), Some(mb)) = (found.get(a), found.get(b))
            && (ma.ino(), ma.dev()) != (mb.ino(), mb.dev())
        {
            diffs.push(format!(
                "{} and {} are hard links but have inodes {} and {}",
                a.display(),
                b.display(),
                ma.ino(),
                mb.ino()
            ));
        }
    }
    ensure!(
        diffs.is_empty(),
        "{label} ({}): {} differences from what the workload wrote:\n{}",
        root.display(),
        diffs.len(),
        diffs.join("\n")
    );
    Ok(())
}
