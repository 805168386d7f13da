//! From a handle to the directory entry naming its file.
//!
//! The index gives a path of names from the root; it is opened one
//! component at a time relative to the root descriptor with `O_NOFOLLOW`
//! and `O_DIRECTORY`, so a symlink (or anything else put in the way) fails
//! the lookup rather than leading out of the export, and the entry found
//! must carry the handle's inode and generation. When the index does not
//! know the inode (after a restart) or is out of date (something was moved
//! behind the proxy's back), the export is walked depth-first, indexing
//! every entry seen, until the file turns up; a file not found is gone and
//! its handle is stale.

use std::os::fd::AsFd;

use nfs3_types::nfs3::{nfs_fh3, nfsstat3};
use rustix::fs::{Dir, FileType, Mode, OFlags, openat};

use super::attr::{Attr, stat_at, stat_fd};
use super::handle::{self, FileKey};
use super::index::MAX_DEPTH;
use super::status::Fail;
use super::{DirFd, DirNode, Export, Node};
use gvfs_nfs::layer::lock;

/// Most directory entries one walk of the export looks at.
const MAX_WALK_ENTRIES: usize = 1 << 21;

/// Deepest directory a walk descends into (one open descriptor per level).
const MAX_WALK_DEPTH: usize = 64;

const PATH_DIR: OFlags = OFlags::PATH
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

const LIST_DIR: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

impl Export {
    /// The entry `fh` names.
    pub(super) fn find(&self, fh: &nfs_fh3) -> Result<Node<'_>, Fail> {
        let key = handle::decode(self.export_id, fh)?;
        self.find_key(key)
    }

    /// The entry naming `key`: from the index, else by walking the export.
    pub(super) fn find_key(&self, key: FileKey) -> Result<Node<'_>, Fail> {
        let stale = Fail(nfsstat3::NFS3ERR_STALE);
        if key.ino == self.root.ino {
            if key.generation != self.root.generation {
                return Err(stale);
            }
            let attr = stat_fd(self.root_fd.as_fd())?;
            return Ok(Node {
                dir: DirFd::Borrowed(self.root_fd.as_fd()),
                name: b".".to_vec(),
                attr,
            });
        }
        if let Some(node) = self.locate(key) {
            return Ok(node);
        }
        if self.index.is_gone(key) {
            return Err(stale);
        }
        let _walking = lock(&self.walk);
        tracing::debug!(
            ino = key.ino,
            "dir upstream: handle not indexed, walking the export"
        );
        // Another call may have walked (and indexed the file) meanwhile.
        if let Some(node) = self.locate(key) {
            return Ok(node);
        }
        if self.search(key)
            && let Some(node) = self.locate(key)
        {
            return Ok(node);
        }
        self.index.mark_gone(key);
        Err(stale)
    }

    /// The directory `fh` names, opened. On failure, the attributes of
    /// what `fh` names, when it was found.
    pub(super) fn find_dir(&self, fh: &nfs_fh3) -> Result<DirNode<'_>, (Fail, Option<Attr>)> {
        let node = self.find(fh).map_err(|f| (f, None))?;
        self.open_dir(node)
    }

    /// Opens the directory `node` names.
    pub(super) fn open_dir<'a>(
        &'a self,
        node: Node<'a>,
    ) -> Result<DirNode<'a>, (Fail, Option<Attr>)> {
        if !node.attr.is_dir() {
            return Err((Fail(nfsstat3::NFS3ERR_NOTDIR), Some(node.attr)));
        }
        if node.attr.ino == self.root.ino {
            return Ok(DirNode {
                fd: DirFd::Borrowed(self.root_fd.as_fd()),
                attr: node.attr,
            });
        }
        let fail = |f: Fail| (f, Some(node.attr));
        let fd = openat(
            node.dir.as_fd(),
            node.name.as_slice(),
            PATH_DIR,
            Mode::empty(),
        )
        .map_err(|e| fail(e.into()))?;
        let attr = stat_fd(fd.as_fd()).map_err(|e| fail(e.into()))?;
        if attr.key() != node.attr.key() {
            return Err(fail(Fail(nfsstat3::NFS3ERR_STALE)));
        }
        Ok(DirNode {
            fd: DirFd::Owned(fd),
            attr,
        })
    }

    /// The entry naming `key` if the index knows a path to it that still
    /// leads there.
    fn locate(&self, key: FileKey) -> Option<Node<'_>> {
        let path = self.index.path_of(key.ino)?;
        let (name, parents) = path.split_last()?;
        let mut dir = DirFd::Borrowed(self.root_fd.as_fd());
        for component in parents {
            let fd = openat(dir.as_fd(), &**component, PATH_DIR, Mode::empty()).ok()?;
            dir = DirFd::Owned(fd);
        }
        let attr = stat_at(dir.as_fd(), name).ok()?;
        if attr.key() != key {
            return None;
        }
        Some(Node {
            dir,
            name: name.to_vec(),
            attr,
        })
    }

    /// Walks the export depth-first, indexing what it sees, until it finds
    /// `key`. Bounded in entries and depth; unreadable directories are
    /// skipped.
    fn search(&self, key: FileKey) -> bool {
        let Ok(fd) = openat(self.root_fd.as_fd(), c".", LIST_DIR, Mode::empty()) else {
            return false;
        };
        let Ok(root) = Dir::new(fd) else {
            return false;
        };
        let mut stack: Vec<(u64, Dir)> = vec![(self.root.ino, root)];
        let mut seen = 0usize;
        let max_depth = MAX_WALK_DEPTH.min(MAX_DEPTH);
        loop {
            let room = stack.len() < max_depth;
            let Some((dir_ino, dir)) = stack.last_mut() else {
                break;
            };
            let dir_ino = *dir_ino;
            let entry = match dir.read() {
                Some(Ok(e)) => e,
                Some(Err(_)) | None => {
                    stack.pop();
                    continue;
                }
            };
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            seen += 1;
            if seen > MAX_WALK_ENTRIES {
                return false;
            }
            let ino = entry.ino();
            self.index.insert(ino, dir_ino, name);
            let Ok(parent) = dir.fd() else {
                continue;
            };
            if ino == key.ino && stat_at(parent, name).is_ok_and(|a| a.key() == key) {
                return true;
            }
            let is_dir = match entry.file_type() {
                FileType::Directory => true,
                FileType::Unknown => stat_at(parent, name).is_ok_and(|a| a.is_dir()),
                _ => false,
            };
            if is_dir && room {
                let child = openat(parent, name, LIST_DIR, Mode::empty())
                    .ok()
                    .and_then(|fd| Dir::new(fd).ok());
                if let Some(child) = child {
                    stack.push((ino, child));
                }
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use nfs3_types::nfs3::*;
    use nfs3_types::xdr_codec::Opaque;
    use tempfile::TempDir;

    use crate::dir::testing::{Fixture, root};

    #[tokio::test]
    async fn handles_survive_restart_and_renames() {
        let f = Fixture::new().await;
        let (a, _) = f.mkdir(&root(), &f.root, "a").await.unwrap();
        let (b, _) = f.mkdir(&root(), &a, "b").await.unwrap();
        let file = f.file_with(&b, "f", b"payload").await;

        // Rename of an ancestor through NFS.
        f.rename(&f.root, "a", &f.root, "a2").await.unwrap();
        assert_eq!(f.read(&root(), &file, 0, 100).await.unwrap().0, b"payload");
        assert_eq!(f.getattr(&b).await.unwrap().type_, ftype3::NF3DIR);

        // A new instance on the same directory, after a rename behind its back.
        std::fs::rename(f.tmp.path().join("a2"), f.tmp.path().join("a3")).unwrap();
        let g = Fixture::open(f.tmp.path(), TempDir::new().unwrap()).await;
        assert_eq!(g.root, f.root, "the root handle is stable");
        assert_eq!(g.read(&root(), &file, 0, 100).await.unwrap().0, b"payload");
        assert_eq!(g.getattr(&a).await.unwrap().type_, ftype3::NF3DIR);
        let (found, _) = g.lookup(&root(), &b, "f").await.unwrap();
        assert_eq!(found, file);
        // The first instance finds it too, though its index is out of date.
        std::fs::rename(f.tmp.path().join("a3"), f.tmp.path().join("a4")).unwrap();
        assert_eq!(f.getattr(&file).await.unwrap().size, 7);
        let (dotdot, _) = f.lookup(&root(), &b, "..").await.unwrap();
        assert_eq!(dotdot, a);
    }

    #[tokio::test]
    async fn stale_and_bad_handles() {
        let f = Fixture::new().await;
        let fh = f.create_file(&f.root, "f").await;
        f.write(&root(), &fh, 0, b"x", stable_how::UNSTABLE)
            .await
            .unwrap();
        let (d, _) = f.mkdir(&root(), &f.root, "d").await.unwrap();
        f.remove(&root(), &f.root, "f").await.unwrap();
        assert_eq!(f.getattr(&fh).await.unwrap_err(), nfsstat3::NFS3ERR_STALE);
        assert_eq!(
            f.read(&root(), &fh, 0, 1).await.unwrap_err(),
            nfsstat3::NFS3ERR_STALE
        );
        assert_eq!(
            f.remove(&root(), &f.root, "f").await.unwrap_err(),
            nfsstat3::NFS3ERR_NOENT
        );

        // Removed behind the proxy's back, seen by a fresh instance.
        std::fs::remove_dir(f.tmp.path().join("d")).unwrap();
        let fresh = Fixture::open(f.tmp.path(), TempDir::new().unwrap()).await;
        assert_eq!(
            fresh.getattr(&d).await.unwrap_err(),
            nfsstat3::NFS3ERR_STALE
        );
        assert_eq!(f.getattr(&d).await.unwrap_err(), nfsstat3::NFS3ERR_STALE);

        for bad in [vec![], vec![1, 2, 3], vec![0; 64]] {
            let fh = nfs_fh3 {
                data: Opaque::owned(bad),
            };
            assert_eq!(
                f.getattr(&fh).await.unwrap_err(),
                nfsstat3::NFS3ERR_BADHANDLE
            );
        }
        // A handle of another export is stale.
        let other = Fixture::new().await;
        let theirs = other.create_file(&other.root, "f").await;
        assert_eq!(
            f.getattr(&theirs).await.unwrap_err(),
            nfsstat3::NFS3ERR_STALE
        );
    }
}
