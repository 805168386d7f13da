//! Open regular files, kept between calls so that a stream of READs and
//! WRITEs costs one `pread`/`pwrite` each, not an open and a close.

use std::collections::HashMap;
use std::fs::File;
use std::sync::{Arc, Mutex};

use super::handle::FileKey;
use gvfs_nfs::layer::lock;

/// A bounded map from file to open descriptor, evicting the least recently
/// used. Descriptors are shared (`Arc`), so one evicted while a call uses
/// it closes when that call is done.
#[derive(Debug)]
pub(super) struct OpenFiles {
    capacity: usize,
    slots: Mutex<Slots>,
}

#[derive(Debug, Default)]
struct Slots {
    map: HashMap<FileKey, Slot>,
    clock: u64,
}

#[derive(Debug)]
struct Slot {
    file: Arc<File>,
    writable: bool,
    used: u64,
}

impl OpenFiles {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            slots: Mutex::new(Slots::default()),
        }
    }

    /// The open file for `key`, if one is cached that allows writing when
    /// `write` is asked for.
    pub(super) fn get(&self, key: FileKey, write: bool) -> Option<Arc<File>> {
        let mut s = lock(&self.slots);
        s.clock += 1;
        let now = s.clock;
        let slot = s.map.get_mut(&key)?;
        if write && !slot.writable {
            return None;
        }
        slot.used = now;
        Some(Arc::clone(&slot.file))
    }

    /// Caches `file` for `key`, replacing any older descriptor.
    pub(super) fn insert(&self, key: FileKey, file: Arc<File>, writable: bool) {
        let mut s = lock(&self.slots);
        s.clock += 1;
        let used = s.clock;
        if s.map.len() >= self.capacity && !s.map.contains_key(&key) {
            let oldest = s.map.iter().min_by_key(|(_, v)| v.used).map(|(k, _)| *k);
            if let Some(k) = oldest {
                s.map.remove(&k);
            }
        }
        s.map.insert(
            key,
            Slot {
                file,
                writable,
                used,
            },
        );
    }

    /// Drops the descriptor for `key` (its file was removed).
    pub(super) fn remove(&self, key: FileKey) {
        lock(&self.slots).map.remove(&key);
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        lock(&self.slots).map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ino: u64) -> FileKey {
        FileKey { ino, generation: 0 }
    }

    #[test]
    fn evicts_the_least_recently_used() {
        let files = OpenFiles::new(2);
        let f = || Arc::new(tempfile::tempfile().expect("tempfile"));
        files.insert(key(1), f(), true);
        files.insert(key(2), f(), false);
        assert!(files.get(key(1), true).is_some());
        assert!(
            files.get(key(2), true).is_none(),
            "read-only slot refuses writers"
        );
        files.insert(key(3), f(), true);
        assert_eq!(files.len(), 2);
        assert!(
            files.get(key(2), false).is_none(),
            "2 was least recently used"
        );
        assert!(files.get(key(1), false).is_some());
        files.remove(key(1));
        assert!(files.get(key(1), false).is_none());
    }
}
