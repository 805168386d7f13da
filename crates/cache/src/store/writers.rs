//! Who wrote each file's dirty data, kept beside the banks in
//! `DIR/writers`, so that dirty data recovered after a restart is written
//! back as its writer would have written it (a server that squashes root
//! refuses root's writes), not as root.
//!
//! The store keeps the writer as opaque bytes (the layer above encodes an
//! RPC credential). New writers are appended to the file by the next sync,
//! before it returns: a COMMIT that makes data durable makes its writer
//! durable too, for the cost of the few bytes a new writer adds. The file
//! is rewritten without the files that have no dirty data left when it has
//! grown well past what it needs, and once per open. Failing to write it
//! (a full disk) is logged, retried at the next sync, and fails nothing:
//! without a record the layer writes back as the file's owner.
//!
//! ```text
//!  off  len  field (little-endian)
//!    0    8  magic "GVFSWRTR"
//!    8    4  format version (2)
//!   12       records, each:
//!              u32 length of the body, u32 CRC32 of the body,
//!              body: u8 handle length (<= 64), handle,
//!                    u16 writer length (<= MAX_WRITER_LEN), writer
//! ```
//! A later record for a handle replaces an earlier one. Reading stops at
//! the first record that is short or fails its CRC (a torn append).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::format::MAX_FH_LEN;

const MAGIC: [u8; 8] = *b"GVFSWRTR";
const VERSION: u32 = 2;
const HEAD_LEN: usize = 12;
/// Longest writer record kept (an AUTH_UNIX credential is at most 408
/// bytes with its flavor and length).
pub const MAX_WRITER_LEN: usize = 1024;
/// Files whose writer is remembered at once; when full, those without
/// dirty data are forgotten.
const MAX_ENTRIES: usize = 1 << 16;
/// Files set between two prunings of a full map at least: a pruning scans
/// the whole map, so a map full of files with dirty data is not scanned
/// again at every new file (new writers then go unrecorded, and are written
/// back as the file's owner, until a pruning makes room).
const SETS_BETWEEN_PRUNINGS: usize = MAX_ENTRIES / 4;
/// The files set last, kept by a pruning even without dirty data: their
/// data may be on its way (the writer is set before the write is stored).
const FRESH_KEPT: usize = 4096;
/// Longest body of one record.
const MAX_BODY: usize = 3 + MAX_FH_LEN + MAX_WRITER_LEN;
/// Longest `writers` file read.
const MAX_FILE_LEN: u64 = 64 << 20;
/// The file is rewritten when it is longer than this and than four times
/// what its live entries need.
const COMPACT_AT: u64 = 1 << 20;

/// The writers of files with dirty data, in memory and in `DIR/writers`.
#[derive(Debug, Default)]
pub(crate) struct Writers {
    /// Where they are kept; `None` for a store without a directory.
    path: Option<PathBuf>,
    map: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Bytes the map's records take in the file.
    live: u64,
    /// Records set since the last save, to append.
    pending: Vec<(Vec<u8>, Vec<u8>)>,
    /// The last [`FRESH_KEPT`] files set, oldest first.
    fresh: VecDeque<Vec<u8>>,
    /// Files set since the last pruning (`None`: none yet).
    sets_since_pruning: Option<usize>,
    /// Bytes of the file that hold whole records (where appends go); `None`
    /// until it has been rewritten by this process.
    file_len: Option<u64>,
}

impl Writers {
    /// The writers recorded in `dir`, if any; a file that cannot be read is
    /// ignored with a warning.
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
            live: map.iter().map(|(k, v)| record_len(k, v)).sum(),
            map,
            ..Writers::default()
        }
    }

    /// Forgets the files that have no dirty data and were not set lately.
    fn prune(&mut self, has_dirty: impl Fn(&[u8]) -> bool) {
        let fresh: BTreeSet<&[u8]> = self.fresh.iter().map(Vec::as_slice).collect();
        self.map
            .retain(|k, _| has_dirty(k) || fresh.contains(k.as_slice()));
        self.live = self.map.iter().map(|(k, v)| record_len(k, v)).sum();
        self.sets_since_pruning = Some(0);
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
        if self.map.len() >= MAX_ENTRIES
            && self
                .sets_since_pruning
                .is_none_or(|n| n >= SETS_BETWEEN_PRUNINGS)
        {
            self.prune(&has_dirty);
        }
        if let Some(n) = self.sets_since_pruning.as_mut() {
            *n += 1;
        }
        if self.map.len() >= MAX_ENTRIES && !self.map.contains_key(fh) {
            return;
        }
        self.live += record_len(fh, who);
        if let Some(old) = self.map.insert(fh.to_vec(), who.to_vec()) {
            self.live -= record_len(fh, &old);
        }
        if self.fresh.len() >= FRESH_KEPT {
            self.fresh.pop_front();
        }
        self.fresh.push_back(fh.to_vec());
        if self.path.is_some() {
            if self.pending.len() >= MAX_ENTRIES {
                // Saved by rewriting the map whole instead.
                self.pending.clear();
                self.file_len = None;
            } else {
                self.pending.push((fh.to_vec(), who.to_vec()));
            }
        }
    }

    /// Makes the writers set since the last call durable: appended, or the
    /// file rewritten with only the files that have dirty data (or were set
    /// lately) when it is the first time or the file has grown. A failure
    /// is logged and retried at the next call.
    pub(crate) fn save(&mut self, has_dirty: impl Fn(&[u8]) -> bool) {
        let Some(path) = self.path.clone() else {
            return;
        };
        if self.pending.is_empty() && self.file_len.is_some() {
            return;
        }
        let written = match self.file_len {
            Some(len) if len < COMPACT_AT.max(4 * self.live) => append(&path, len, &self.pending),
            _ => {
                self.prune(has_dirty);
                rewrite(&path, &self.map)
            }
        };
        match written {
            Ok(len) => {
                self.file_len = Some(len);
                self.pending.clear();
            }
            Err(e) => tracing::warn!(
                path = %path.display(),
                "block cache: could not record who wrote dirty data ({e}); will retry; \
                 until then recovered data would be written back as each file's owner"
            ),
        }
    }
}

/// Bytes of `fh`'s record in the file.
fn record_len(fh: &[u8], who: &[u8]) -> u64 {
    (8 + 3 + fh.len() + who.len()) as u64
}

fn record(fh: &[u8], who: &[u8], out: &mut Vec<u8>) {
    let mut body = Vec::with_capacity(3 + fh.len() + who.len());
    body.push(fh.len() as u8);
    body.extend_from_slice(fh);
    body.extend_from_slice(&(who.len() as u16).to_le_bytes());
    body.extend_from_slice(who);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    out.extend_from_slice(&body);
}

fn encode(map: &BTreeMap<Vec<u8>, Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    for (fh, who) in map {
        record(fh, who, &mut out);
    }
    out
}

/// The records of `bytes` up to the first damaged one.
fn decode(bytes: &[u8]) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, &'static str> {
    if bytes.len() < HEAD_LEN || bytes[0..8] != MAGIC {
        return Err("bad magic");
    }
    if bytes[8..12] != VERSION.to_le_bytes() {
        return Err("unknown version");
    }
    let mut map = BTreeMap::new();
    let mut r = &bytes[HEAD_LEN..];
    while let Some((head, rest)) = r.split_first_chunk::<8>() {
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        if len > MAX_BODY {
            break;
        }
        let Some((body, rest)) = rest.split_at_checked(len) else {
            break;
        };
        if crc32fast::hash(body) != crc {
            break;
        }
        let Some((&n, b)) = body.split_first() else {
            break;
        };
        let n = n as usize;
        if n > MAX_FH_LEN || b.len() < n + 2 {
            break;
        }
        let (fh, b) = b.split_at(n);
        let w = u16::from_le_bytes([b[0], b[1]]) as usize;
        if w > MAX_WRITER_LEN || b.len() != 2 + w {
            break;
        }
        map.insert(fh.to_vec(), b[2..].to_vec());
        if map.len() > MAX_ENTRIES {
            return Err("too many entries");
        }
        r = rest;
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

/// Writes `map` whole to a new file and renames it over `path`; the new
/// length.
fn rewrite(path: &Path, map: &BTreeMap<Vec<u8>, Vec<u8>>) -> std::io::Result<u64> {
    let tmp = path.with_extension("tmp");
    let bytes = encode(map);
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(bytes.len() as u64)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Appends `records` at `len` (cutting off whatever a torn append left
/// there); the new length.
fn append(path: &Path, len: u64, records: &[(Vec<u8>, Vec<u8>)]) -> std::io::Result<u64> {
    let mut bytes = Vec::new();
    for (fh, who) in records {
        record(fh, who, &mut bytes);
    }
    let f = std::fs::OpenOptions::new().write(true).open(path)?;
    let written =
        std::os::unix::fs::FileExt::write_all_at(&f, &bytes, len).and_then(|()| f.sync_data());
    if written.is_err() {
        // Nothing half-written may stay for a later append to follow.
        let _ = f.set_len(len);
    }
    written?;
    Ok(len + bytes.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_a_torn_tail_is_cut_off() {
        let mut map = BTreeMap::new();
        map.insert(b"fh-a".to_vec(), b"who-a".to_vec());
        map.insert(vec![7; 64], vec![1; 400]);
        let bytes = encode(&map);
        assert_eq!(decode(&bytes), Ok(map.clone()));
        // A torn last record: the ones before it stay. (The 64-byte handle
        // sorts first: its record is 8 + 3 + 64 + 400 bytes.)
        let first = HEAD_LEN + 8 + 3 + 64 + 400;
        for cut in [first, first + 1, bytes.len() - 1] {
            let got = decode(&bytes[..cut]).expect("decodes");
            assert_eq!(got.len(), 1, "cut at {cut}");
        }
        let mut bad = bytes.clone();
        bad[HEAD_LEN + 9] ^= 1;
        assert_eq!(decode(&bad).map(|m| m.len()), Ok(0));
        assert!(decode(&bytes[..4]).is_err());
    }

    #[test]
    fn appended_then_rewritten_without_files_that_have_no_dirty_data() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut w = Writers::load(dir.path());
        w.set(b"dirty", b"alice", |_| true);
        w.set(b"clean", b"bob", |_| true);
        // The first save rewrites, keeping what was set lately.
        w.save(|fh| fh == b"dirty");
        w.set(b"later", b"carol", |_| true);
        w.save(|fh| fh == b"dirty");
        let again = Writers::load(dir.path());
        assert_eq!(again.get(b"dirty"), Some(&b"alice"[..]));
        assert_eq!(again.get(b"clean"), Some(&b"bob"[..]));
        assert_eq!(again.get(b"later"), Some(&b"carol"[..]));
        // A new process rewrites once: files without dirty data go.
        let mut w = again;
        w.save(|fh| fh == b"dirty");
        let last = Writers::load(dir.path());
        assert_eq!(last.get(b"dirty"), Some(&b"alice"[..]));
        assert_eq!(last.get(b"clean"), None);
        assert_eq!(last.get(b"later"), None);
    }

    #[test]
    fn a_commit_per_new_file_appends_a_record_each() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut w = Writers::load(dir.path());
        w.save(|_| true);
        let path = dir.path().join("writers");
        let mut written = 0u64;
        for n in 0..2000u32 {
            let before = std::fs::metadata(&path).expect("stat").len();
            w.set(format!("file-{n:08}").as_bytes(), &[7; 48], |_| true);
            w.save(|_| true);
            written += std::fs::metadata(&path).expect("stat").len() - before;
        }
        // About one record a file (8 + 3 + 13 + 48 = 72 bytes), not the
        // whole file each time.
        assert!(written < 2000 * 100, "{written} bytes for 2000 files");
    }

    fn file(n: usize) -> Vec<u8> {
        format!("file-{n:08}").into_bytes()
    }

    fn live_of(w: &Writers) -> u64 {
        w.map.iter().map(|(k, v)| record_len(k, v)).sum()
    }

    /// Every file written lately used to be kept from pruning, so once
    /// 65,536 files had been written since the last rewrite no new writer
    /// was recorded, and each new file scanned the whole map in vain.
    #[test]
    fn a_full_map_of_files_written_back_makes_room_for_new_writers() {
        let mut w = Writers::default();
        for n in 0..MAX_ENTRIES {
            w.set(&file(n), b"alice", |_| false);
        }
        assert_eq!(w.map.len(), MAX_ENTRIES);
        for n in MAX_ENTRIES..MAX_ENTRIES + 10 {
            w.set(&file(n), b"bob", |_| false);
            assert_eq!(w.get(&file(n)), Some(&b"bob"[..]), "file {n} unrecorded");
        }
        // The files set last are kept even without dirty data yet.
        assert_eq!(w.get(&file(MAX_ENTRIES - 1)), Some(&b"alice"[..]));
        assert_eq!(w.get(&file(0)), None);
        assert_eq!(w.live, live_of(&w));
    }

    /// A map full of files that all have dirty data cannot make room; it is
    /// scanned again only after many new files, not at each one.
    #[test]
    fn a_full_map_of_dirty_files_is_not_scanned_at_every_new_file() {
        let mut w = Writers::default();
        let calls = std::cell::Cell::new(0u64);
        let dirty = |_: &[u8]| {
            calls.set(calls.get() + 1);
            true
        };
        let extra = 2 * SETS_BETWEEN_PRUNINGS;
        for n in 0..MAX_ENTRIES + extra {
            w.set(&file(n), b"alice", dirty);
            assert!(
                calls.get() <= 3 * MAX_ENTRIES as u64,
                "{} scans of the map after {n} files",
                calls.get()
            );
        }
        assert_eq!(w.map.len(), MAX_ENTRIES);
        assert_eq!(w.get(&file(MAX_ENTRIES + extra - 1)), None, "no room");
        // A writer for a file already in the map is still replaced.
        w.set(&file(0), b"carol", dirty);
        assert_eq!(w.get(&file(0)), Some(&b"carol"[..]));
        assert_eq!(w.live, live_of(&w));
    }
}
