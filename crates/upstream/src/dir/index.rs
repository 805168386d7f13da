//! Where inodes are: an in-memory map from inode number to one name of it
//! (parent directory inode and file name), filled by every procedure that
//! sees a directory entry.
//!
//! Links, not paths, are stored, so renaming a directory updates one entry
//! and every handle below it still resolves. Nothing here is trusted: a
//! path built from the index is opened component by component without
//! following symlinks, and what it reaches is checked against the handle's
//! inode and generation (see `resolve.rs`).

use std::collections::HashMap;
use std::sync::Mutex;

use gvfs_nfs::layer::lock;

use super::handle::FileKey;

/// Most links remembered; past this the index starts over (handles are
/// then found again by walking the export).
const MAX_LINKS: usize = 1 << 22;

/// Most inodes remembered as gone.
const MAX_GONE: usize = 1 << 12;

/// Deepest directory nesting followed from an inode up to the root.
pub(super) const MAX_DEPTH: usize = 256;

#[derive(Debug)]
struct Link {
    parent: u64,
    name: Box<[u8]>,
}

/// Inode number to name.
#[derive(Debug)]
pub(super) struct Index {
    root: u64,
    links: Mutex<HashMap<u64, Link>>,
    /// Inodes known to have been removed (inode -> generation): their
    /// handles are stale without walking the export to be sure.
    gone: Mutex<HashMap<u64, u64>>,
}

impl Index {
    /// An empty index for the export whose root is inode `root`.
    pub(super) fn new(root: u64) -> Self {
        Self {
            root,
            links: Mutex::new(HashMap::new()),
            gone: Mutex::new(HashMap::new()),
        }
    }

    /// Records that `parent` holds `ino` under `name`.
    pub(super) fn insert(&self, ino: u64, parent: u64, name: &[u8]) {
        self.insert_many(parent, std::iter::once((ino, name)));
    }

    /// Records that `parent` holds each `(ino, name)`.
    pub(super) fn insert_many<'n>(
        &self,
        parent: u64,
        entries: impl Iterator<Item = (u64, &'n [u8])>,
    ) {
        let mut gone_checked = Vec::new();
        {
            let mut links = lock(&self.links);
            for (ino, name) in entries {
                if ino == self.root {
                    continue;
                }
                if links.len() >= MAX_LINKS && !links.contains_key(&ino) {
                    links.clear();
                }
                match links.get_mut(&ino) {
                    Some(l) if l.parent == parent && *l.name == *name => {}
                    Some(l) => {
                        l.parent = parent;
                        l.name = name.into();
                    }
                    None => {
                        links.insert(
                            ino,
                            Link {
                                parent,
                                name: name.into(),
                            },
                        );
                        gone_checked.push(ino);
                    }
                }
            }
        }
        if !gone_checked.is_empty() {
            let mut gone = lock(&self.gone);
            if !gone.is_empty() {
                for ino in gone_checked {
                    gone.remove(&ino);
                }
            }
        }
    }

    /// Forgets that `parent` holds `ino` under `name` (it was removed or
    /// renamed over), if that is the name remembered.
    pub(super) fn forget(&self, ino: u64, parent: u64, name: &[u8]) {
        let mut links = lock(&self.links);
        if links
            .get(&ino)
            .is_some_and(|l| l.parent == parent && *l.name == *name)
        {
            links.remove(&ino);
        }
    }

    /// The names leading from the root to `ino`: empty for the root, `None`
    /// when the chain is unknown.
    pub(super) fn path_of(&self, ino: u64) -> Option<Vec<Box<[u8]>>> {
        let links = lock(&self.links);
        let mut path = Vec::new();
        let mut cur = ino;
        while cur != self.root {
            if path.len() >= MAX_DEPTH {
                return None;
            }
            let l = links.get(&cur)?;
            path.push(l.name.clone());
            cur = l.parent;
        }
        path.reverse();
        Some(path)
    }

    /// Remembers that the file `key` names is gone.
    pub(super) fn mark_gone(&self, key: FileKey) {
        lock(&self.links).remove(&key.ino);
        let mut gone = lock(&self.gone);
        if gone.len() >= MAX_GONE {
            gone.clear();
        }
        gone.insert(key.ino, key.generation);
    }

    /// Whether the file `key` names is known to be gone.
    pub(super) fn is_gone(&self, key: FileKey) -> bool {
        lock(&self.gone).get(&key.ino) == Some(&key.generation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(p: Option<Vec<Box<[u8]>>>) -> Option<Vec<Vec<u8>>> {
        p.map(|v| v.into_iter().map(|n| n.to_vec()).collect())
    }

    #[test]
    fn paths_follow_renames_of_ancestors() {
        let ix = Index::new(1);
        ix.insert(2, 1, b"a");
        ix.insert(3, 2, b"b");
        ix.insert(4, 3, b"f");
        assert_eq!(
            names(ix.path_of(4)),
            Some(vec![b"a".to_vec(), b"b".to_vec(), b"f".to_vec()])
        );
        ix.insert(2, 1, b"renamed");
        assert_eq!(
            names(ix.path_of(4)),
            Some(vec![b"renamed".to_vec(), b"b".to_vec(), b"f".to_vec()])
        );
        assert_eq!(names(ix.path_of(1)), Some(vec![]));
        assert_eq!(ix.path_of(99), None);
    }

    #[test]
    fn cycles_do_not_hang() {
        let ix = Index::new(1);
        ix.insert(2, 3, b"x");
        ix.insert(3, 2, b"y");
        assert_eq!(ix.path_of(2), None);
    }

    #[test]
    fn forget_only_the_named_link() {
        let ix = Index::new(1);
        ix.insert(2, 1, b"a");
        ix.forget(2, 1, b"other");
        assert!(ix.path_of(2).is_some());
        ix.forget(2, 1, b"a");
        assert!(ix.path_of(2).is_none());
    }

    #[test]
    fn gone_until_seen_again() {
        let ix = Index::new(1);
        let key = FileKey {
            ino: 7,
            generation: 9,
        };
        ix.insert(7, 1, b"f");
        ix.mark_gone(key);
        assert!(ix.is_gone(key));
        assert!(!ix.is_gone(FileKey {
            ino: 7,
            generation: 10
        }));
        ix.insert(7, 1, b"g");
        assert!(!ix.is_gone(key));
    }
}
