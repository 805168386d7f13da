//! The small indexes the proxy keeps about files (negative lookups,
//! file-cache entries, fetched zero maps): opaque keys (file handles) to
//! opaque values, behind [`MetaIndex`], in memory or in sled.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use crate::error::IndexError;

/// A key and its value.
pub type Entry = (Vec<u8>, Vec<u8>);

/// A small key-value index. Keys and values are opaque bytes.
pub trait MetaIndex: Send + Sync {
    /// The value stored under `key`, if any.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, IndexError>;
    /// Stores `value` under `key`, replacing any previous value.
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), IndexError>;
    /// Removes `key`; removing an absent key is not an error.
    fn remove(&self, key: &[u8]) -> Result<(), IndexError>;
    /// A durability barrier: returns once every `put` and `remove` made
    /// before it would survive a crash (a no-op for an index that keeps
    /// nothing across a restart).
    fn flush(&self) -> Result<(), IndexError>;
    /// Up to `limit` entries whose keys start with `prefix` (in key order
    /// where the index keeps one).
    fn scan_prefix(&self, prefix: &[u8], limit: usize) -> Result<Vec<Entry>, IndexError>;
    /// Whether what is flushed survives a restart of the process. Data
    /// only an index entry can find again (a file cache's held writes)
    /// must not be kept on an index that does not.
    fn persistent(&self) -> bool;
}

/// An in-memory index that never holds more than `capacity` entries: a
/// `put` of a new key into a full index evicts an arbitrary other entry.
/// For caches whose entries can always be fetched again.
#[derive(Debug)]
pub struct MemIndex {
    capacity: usize,
    map: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
}

impl MemIndex {
    /// An empty index of at most `capacity` entries (at least 1).
    pub fn new(capacity: usize) -> Self {
        MemIndex {
            capacity: capacity.max(1),
            map: Mutex::new(HashMap::new()),
        }
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Vec<u8>, Vec<u8>>> {
        // Every critical section leaves the map consistent: a panic in
        // another thread cannot have left it half-updated.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl MetaIndex for MemIndex {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, IndexError> {
        Ok(self.lock().get(key).cloned())
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), IndexError> {
        let mut map = self.lock();
        if !map.contains_key(key)
            && map.len() >= self.capacity
            && let Some(victim) = map.keys().next().cloned()
        {
            map.remove(&victim);
        }
        map.insert(key.to_vec(), value.to_vec());
        Ok(())
    }

    fn remove(&self, key: &[u8]) -> Result<(), IndexError> {
        self.lock().remove(key);
        Ok(())
    }

    fn flush(&self) -> Result<(), IndexError> {
        Ok(())
    }

    fn scan_prefix(&self, prefix: &[u8], limit: usize) -> Result<Vec<Entry>, IndexError> {
        Ok(self
            .lock()
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn persistent(&self) -> bool {
        false
    }
}

/// A persistent index in a sled database (sled 0.34). One process can have
/// a database open once; [`SledIndex::tree`] gives further named indexes
/// in the same database.
#[derive(Debug, Clone)]
pub struct SledIndex {
    db: sled::Db,
    tree: sled::Tree,
}

impl SledIndex {
    /// Opens (creating if missing) the database in directory `dir`.
    pub fn open(dir: &Path) -> Result<Self, IndexError> {
        // sled's background thread lets go of the directory's lock a moment
        // after the last handle of an earlier open in this process is
        // dropped: wait for it, a little.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        let db = loop {
            match sled::open(dir) {
                Err(sled::Error::Io(e))
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.to_string().contains("could not acquire lock") =>
                {
                    if std::time::Instant::now() >= deadline {
                        return Err(sled::Error::Io(e).into());
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                r => break r?,
            }
        };
        let tree = (*db).clone();
        Ok(SledIndex { db, tree })
    }

    /// Another index named `name` in the same database.
    pub fn tree(&self, name: &str) -> Result<Self, IndexError> {
        Ok(SledIndex {
            db: self.db.clone(),
            tree: self.db.open_tree(name)?,
        })
    }
}

impl MetaIndex for SledIndex {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, IndexError> {
        Ok(self.tree.get(key)?.map(|v| v.to_vec()))
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), IndexError> {
        self.tree.insert(key, value)?;
        Ok(())
    }

    fn remove(&self, key: &[u8]) -> Result<(), IndexError> {
        self.tree.remove(key)?;
        Ok(())
    }

    /// Writes everything put so far, in every tree of the database, to
    /// disk and syncs it (sled does so on its own only every half second,
    /// and when the last handle is dropped).
    fn flush(&self) -> Result<(), IndexError> {
        self.db.flush()?;
        Ok(())
    }

    fn scan_prefix(&self, prefix: &[u8], limit: usize) -> Result<Vec<Entry>, IndexError> {
        self.tree
            .scan_prefix(prefix)
            .take(limit)
            .map(|r| {
                let (k, v) = r?;
                Ok((k.to_vec(), v.to_vec()))
            })
            .collect()
    }

    fn persistent(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same put/get/remove sequence against any index and a model.
    fn exercise(index: &dyn MetaIndex) {
        let mut model = HashMap::new();
        for i in 0u32..200 {
            let key = (i % 37).to_le_bytes();
            match i % 5 {
                0..=2 => {
                    let value = i.to_be_bytes().repeat((i % 4) as usize);
                    index.put(&key, &value).expect("put");
                    model.insert(key, value);
                }
                3 => {
                    index.remove(&key).expect("remove");
                    model.remove(&key);
                }
                _ => {}
            }
            for k in 0u32..37 {
                let k = k.to_le_bytes();
                assert_eq!(index.get(&k).expect("get"), model.get(&k).cloned());
            }
        }
        let mut listed = index.scan_prefix(&[3, 0], 100).expect("scan");
        listed.sort();
        let mut want: Vec<_> = model
            .iter()
            .filter(|(k, _)| k.starts_with(&[3, 0]))
            .map(|(k, v)| (k.to_vec(), v.clone()))
            .collect();
        want.sort();
        assert_eq!(listed, want);
        assert!(index.scan_prefix(&[], 2).expect("scan").len() <= 2);
        index.remove(b"absent").expect("remove absent");
        index.put(b"", b"empty key").expect("put");
        assert_eq!(
            index.get(b"").expect("get").as_deref(),
            Some(&b"empty key"[..])
        );
    }

    #[test]
    fn mem_index_behaves_like_a_map() {
        exercise(&MemIndex::new(1000));
    }

    #[test]
    fn mem_index_is_bounded() {
        let index = MemIndex::new(10);
        for i in 0u32..100 {
            index.put(&i.to_le_bytes(), b"v").expect("put");
            assert!(index.len() <= 10);
            // The newest entry is never the one evicted.
            assert!(index.get(&i.to_le_bytes()).expect("get").is_some());
        }
        assert_eq!(index.len(), 10);
        // Replacing an existing key in a full index evicts nothing.
        let present: Vec<u32> = (0u32..100)
            .filter(|i| index.get(&i.to_le_bytes()).ok().flatten().is_some())
            .collect();
        index.put(&present[0].to_le_bytes(), b"w").expect("put");
        for i in &present {
            assert!(index.get(&i.to_le_bytes()).expect("get").is_some());
        }
    }

    #[test]
    fn sled_index_behaves_like_a_map() {
        let dir = tempfile::tempdir().expect("tempdir");
        exercise(&SledIndex::open(dir.path()).expect("open"));
    }

    #[test]
    fn sled_index_persists_across_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let index = SledIndex::open(dir.path()).expect("open");
            let negative = index.tree("negative").expect("tree");
            index.put(b"fh-1", b"meta").expect("put");
            index.put(b"fh-2", b"gone").expect("put");
            index.remove(b"fh-2").expect("remove");
            negative.put(b"fh-1", b"none").expect("put");
            index.flush().expect("flush");
        }
        let index = SledIndex::open(dir.path()).expect("reopen");
        assert_eq!(
            index.get(b"fh-1").expect("get").as_deref(),
            Some(&b"meta"[..])
        );
        assert_eq!(index.get(b"fh-2").expect("get"), None);
        let negative = index.tree("negative").expect("tree");
        assert_eq!(
            negative.get(b"fh-1").expect("get").as_deref(),
            Some(&b"none"[..])
        );
        // Trees are separate key spaces.
        assert_eq!(negative.get(b"fh-2").expect("get"), None);
        assert_eq!(
            index
                .tree("other")
                .expect("tree")
                .get(b"fh-1")
                .expect("get"),
            None
        );
    }
}
