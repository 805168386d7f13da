//! File handles of the `dir:` upstream.
//!
//! A handle names an inode, not a path, so it survives renames, and holds
//! nothing that lives only in memory, so it survives restarts of the proxy
//! (RFC 1813 section 4.1). Byte layout (28 bytes, integers little-endian):
//!
//! ```text
//! offset size field
//!      0    3 magic "gvd"
//!      3    1 format version (1)
//!      4    8 export id: which export issued the handle
//!     12    8 inode number
//!     20    8 generation: the birth time in nanoseconds, 0 where the
//!             filesystem keeps none; tells a reused inode number apart
//! ```

use nfs3_types::nfs3::{nfs_fh3, nfsstat3};
use nfs3_types::xdr_codec::Opaque;

use super::status::Fail;

/// Length of every handle this upstream issues (RFC 1813 allows 64).
pub(super) const HANDLE_LEN: usize = 28;

const MAGIC: [u8; 3] = *b"gvd";
const VERSION: u8 = 1;

/// What a handle names: one inode, one lifetime of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct FileKey {
    /// Inode number.
    pub(super) ino: u64,
    /// Birth time in nanoseconds, or 0.
    pub(super) generation: u64,
}

/// The handle for `key` in the export `export_id`.
pub(super) fn encode(export_id: u64, key: FileKey) -> nfs_fh3 {
    let mut b = Vec::with_capacity(HANDLE_LEN);
    b.extend_from_slice(&MAGIC);
    b.push(VERSION);
    b.extend_from_slice(&export_id.to_le_bytes());
    b.extend_from_slice(&key.ino.to_le_bytes());
    b.extend_from_slice(&key.generation.to_le_bytes());
    nfs_fh3 {
        data: Opaque::owned(b),
    }
}

/// The key in `fh`: `BADHANDLE` when the bytes are not a handle of ours,
/// `STALE` when another export issued it.
pub(super) fn decode(export_id: u64, fh: &nfs_fh3) -> Result<FileKey, Fail> {
    let b: &[u8] = &fh.data;
    let bad = Fail(nfsstat3::NFS3ERR_BADHANDLE);
    if b.len() != HANDLE_LEN || b[..3] != MAGIC || b[3] != VERSION {
        return Err(bad);
    }
    let word = |at: usize| -> Result<u64, Fail> {
        let bytes: [u8; 8] = b
            .get(at..at + 8)
            .and_then(|s| s.try_into().ok())
            .ok_or(bad)?;
        Ok(u64::from_le_bytes(bytes))
    };
    if word(4)? != export_id {
        return Err(Fail(nfsstat3::NFS3ERR_STALE));
    }
    Ok(FileKey {
        ino: word(12)?,
        generation: word(20)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(export: u64, ino: u64, generation: u64) {
            let key = FileKey { ino, generation };
            let fh = encode(export, key);
            prop_assert!(fh.data.len() <= 64);
            prop_assert_eq!(decode(export, &fh), Ok(key));
            if export != 0 {
                prop_assert_eq!(decode(0, &fh), Err(Fail(nfsstat3::NFS3ERR_STALE)));
            }
        }

        #[test]
        fn garbage_is_a_bad_handle(bytes in prop::collection::vec(any::<u8>(), 0..=64)) {
            let fh = nfs_fh3 { data: Opaque::owned(bytes.clone()) };
            if bytes.len() != HANDLE_LEN || bytes[..3] != MAGIC || bytes[3] != VERSION {
                prop_assert_eq!(decode(7, &fh), Err(Fail(nfsstat3::NFS3ERR_BADHANDLE)));
            } else {
                let _ = decode(7, &fh);
            }
        }
    }
}
