//! The working-set profiles a proxy keeps (`gvfs_ext::profile` says what
//! a profile is), in its index: sled when the proxy has a cache directory,
//! so they survive a restart.

use std::sync::Arc;

use gvfs_ext::Profile;
use gvfs_nfs::nfs3_types::nfs3::fattr3;

use crate::index::MetaIndex;

/// The profiles a proxy keeps, in its index.
pub struct Profiles {
    index: Arc<dyn MetaIndex>,
}

impl std::fmt::Debug for Profiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Profiles").finish()
    }
}

fn key(fh: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + fh.len());
    k.push(b'p');
    k.extend_from_slice(fh);
    k
}

impl Profiles {
    /// Profiles kept in `index`.
    pub fn new(index: Arc<dyn MetaIndex>) -> Arc<Self> {
        Arc::new(Self { index })
    }

    /// The profile kept for `fh` if it describes the version with
    /// attributes `a`; one that does not (the file changed), or whose
    /// record does not load, is dropped.
    pub fn get(&self, fh: &[u8], a: &fattr3) -> Option<Profile> {
        let bytes = self.index.get(&key(fh)).ok()??;
        match Profile::from_record(&bytes) {
            Some(p) if p.version().describes(a) => Some(p),
            _ => {
                let _ = self.index.remove(&key(fh));
                None
            }
        }
    }

    /// The profile kept for `fh`, whatever version it describes.
    pub fn peek(&self, fh: &[u8]) -> Option<Profile> {
        Profile::from_record(&self.index.get(&key(fh)).ok()??)
    }

    /// Keeps `p` for `fh`, replacing any other.
    pub fn put(&self, fh: &[u8], p: &Profile) {
        if let Err(e) = self.index.put(&key(fh), &p.record()) {
            tracing::debug!(error = %e, "cannot keep a working-set profile");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{MemIndex, MetaIndex};
    use gvfs_ext::CHUNK;

    fn attrs(size: u64, mtime: u32) -> fattr3 {
        gvfs_nfs::testing::file_attrs(size, mtime)
    }

    #[test]
    fn a_kept_profile_is_answered_only_for_its_version() {
        let profiles = Profiles::new(Arc::new(MemIndex::new(16)));
        let a = attrs(10 * u64::from(CHUNK), 1);
        profiles.put(b"fh", &Profile::of(&a, CHUNK, vec![2, 9]));
        assert_eq!(profiles.get(b"fh", &a).map(|p| p.parts), Some(vec![2, 9]));
        let changed = attrs(10 * u64::from(CHUNK), 2);
        assert_eq!(profiles.get(b"fh", &changed), None);
        // Dropped: not even the old version finds it now.
        assert_eq!(profiles.get(b"fh", &a), None);
    }

    #[test]
    fn a_damaged_record_is_dropped() {
        let index = Arc::new(MemIndex::new(16));
        let profiles = Profiles::new(index.clone());
        let a = attrs(4 * u64::from(CHUNK), 1);
        profiles.put(b"fh", &Profile::of(&a, CHUNK, vec![1]));
        let mut rec = index.get(&key(b"fh")).expect("get").expect("kept");
        let last = rec.len() - 5;
        rec[last] ^= 1;
        index.put(&key(b"fh"), &rec).expect("put");
        assert_eq!(profiles.get(b"fh", &a), None);
    }
}
