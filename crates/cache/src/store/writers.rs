//! Who wrote each file's dirty data, kept beside the banks in
//! `DIR/writers`, so that dirty data recovered after a restart is written
//! back as its writer would have written it (a server that squashes root
//! refuses root's writes), not as root.
//!
//! The store keeps the writer as opaque bytes (the layer above encodes an
//! RPC credential). The file is rewritten whole by the first sync after a
//! file gets a new writer, before that sync returns: a COMMIT that makes
//! data durable makes its writer durable too. Failing to write it (a full
//! disk) is logged, retried at the next sync, and fails nothing: without a
//! record the layer writes back as the file's owner.
//!
//! ```text
//!  off  len  field (little-endian)
//!    0    8  magic "GVFSWRTR"
//!    8    4  format version (1)
//!   12    4  entry count
//!   16       entries: u8 handle length (<= 64), handle,
//!                     u16 writer length (<= MAX_WRITER_LEN), writer
//!    -    4  CRC32 of every byte before it
//! ```

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::format::MAX_FH_LEN;

const MAGIC: [u8; 8] = *b"GVFSWRTR";
const VERSION: u32 = 1;
/// Longest writer record kept (an AUTH_UNIX credential is at most 408
/// bytes with its flavor and length).
pub const MAX_WRITER_LEN: usize = 1024;
/// Files whose writer is remembered at once; when full, those without
/// dirty data are forgotten.
const MAX_ENTRIES: usize = 1 << 16;
/// Longest `writers` file read.
const MAX_FILE_LEN: u64 = (MAX_ENTRIES * (3 + MAX_FH_LEN + MAX_WRITER_LEN)) as u64 + 20;

/// The writers of files with dirty data, in memory and in `DIR/writers`.
#[derive(Debug, Default)]
pub(crate) struct Writers {
    /// Where they are kept; `None` for a store without a directory.
    path: Option<PathBuf>,
    map: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Changed since last written.
    unsaved: bool,
}

impl Writers {
    /// The writers recorded in `dir`, if any; a file that cannot be read or
    /// fails its checksum is ignored with a warning.
    pub(crate) fn load(dir: &Path) -> Writers {
        let path = dir.join("writers");
        let map = match read(&path) {
            Ok(map) => map,
            Err(e) => {
                if path.exists() {
                    tracing::warn!(
                        path = %path.display(),
                        "block cache: ignoring the record of who wrote dirty data ({e}); \
                         recovered data is written back as each file's owner"
                    );
                }
                BTreeMap::new()
            }
        };
        Writers {
            path: Some(path),
            map,
            unsaved: false,
        }
    }

    /// The writer recorded for `fh`.
    pub(crate) fn get(&self, fh: &[u8]) -> Option<&[u8]> {
        self.map.get(fh).map(Vec::as_slice)
    }

    /// Records `who` as the writer of `fh`; `has_dirty` says which files
    /// still have dirty data, for making room.
    pub(crate) fn set(&mut self, fh: &[u8], who: &[u8], has_dirty: impl Fn(&[u8]) -> bool) {
        if who.len() > MAX_WRITER_LEN || fh.len() > MAX_FH_LEN {
            return;
        }
        if self.map.get(fh).is_some_and(|w| w == who) {
            return;
        }
        if self.map.len() >= MAX_ENTRIES {
            self.map.retain(|k, _| has_dirty(k));
        }
        if self.map.len() < MAX_ENTRIES {
            self.map.insert(fh.to_vec(), who.to_vec());
            self.unsaved = true;
        }
    }

    /// Writes the record if it changed, keeping only files with dirty
    /// data. A failure is logged and retried at the next call.
    pub(crate) fn save(&mut self, has_dirty: impl Fn(&[u8]) -> bool) {
        let Some(path) = &self.path else { return };
        if !self.unsaved {
            return;
        }
        self.map.retain(|k, _| has_dirty(k));
        match write(path, &self.map) {
            Ok(()) => self.unsaved = false,
            Err(e) => tracing::warn!(
                path = %path.display(),
                "block cache: could not record who wrote dirty data ({e}); will retry; \
                 until then recovered data would be written back as each file's owner"
            ),
        }
    }
}

fn encode(map: &BTreeMap<Vec<u8>, Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(map.len() as u32).to_le_bytes());
    for (fh, who) in map {
        out.push(fh.len() as u8);
        out.extend_from_slice(fh);
        out.extend_from_slice(&(who.len() as u16).to_le_bytes());
        out.extend_from_slice(who);
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn decode(bytes: &[u8]) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, &'static str> {
    let Some((body, crc)) = bytes.split_last_chunk::<4>() else {
        return Err("too short");
    };
    if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
        return Err("checksum mismatch");
    }
    let mut r = body;
    let mut take = |n: usize| -> Result<&[u8], &'static str> {
        let (head, rest) = r.split_at_checked(n).ok_or("truncated")?;
        r = rest;
        Ok(head)
    };
    if take(8)? != MAGIC {
        return Err("bad magic");
    }
    let u32_of = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    if u32_of(take(4)?) != VERSION {
        return Err("unknown version");
    }
    let count = u32_of(take(4)?) as usize;
    if count > MAX_ENTRIES {
        return Err("too many entries");
    }
    let mut map = BTreeMap::new();
    for _ in 0..count {
        let n = take(1)?[0] as usize;
        if n > MAX_FH_LEN {
            return Err("file handle too long");
        }
        let fh = take(n)?.to_vec();
        let w = take(2)?;
        let n = u16::from_le_bytes([w[0], w[1]]) as usize;
        if n > MAX_WRITER_LEN {
            return Err("writer too long");
        }
        map.insert(fh, take(n)?.to_vec());
    }
    if !r.is_empty() {
        return Err("trailing bytes");
    }
    Ok(map)
}

fn read(path: &Path) -> std::io::Result<BTreeMap<Vec<u8>, Vec<u8>>> {
    let len = std::fs::metadata(path)?.len();
    if len > MAX_FILE_LEN {
        return Err(std::io::Error::other("file too large"));
    }
    let bytes = std::fs::read(path)?;
    decode(&bytes).map_err(std::io::Error::other)
}

fn write(path: &Path, map: &BTreeMap<Vec<u8>, Vec<u8>>) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&encode(map))?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refuse_damage() {
        let mut map = BTreeMap::new();
        map.insert(b"fh-a".to_vec(), b"who-a".to_vec());
        map.insert(vec![7; 64], vec![1; 400]);
        let bytes = encode(&map);
        assert_eq!(decode(&bytes), Ok(map));
        for cut in [0, 4, 20, bytes.len() - 1] {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = bytes.clone();
        bad[17] ^= 1;
        assert_eq!(decode(&bad), Err("checksum mismatch"));
    }

    #[test]
    fn saved_only_for_files_with_dirty_data_and_kept_across_a_load() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut w = Writers::load(dir.path());
        w.set(b"dirty", b"alice", |_| true);
        w.set(b"clean", b"bob", |_| true);
        w.save(|fh| fh == b"dirty");
        let again = Writers::load(dir.path());
        assert_eq!(again.get(b"dirty"), Some(&b"alice"[..]));
        assert_eq!(again.get(b"clean"), None);
    }
}
