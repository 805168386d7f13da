//! The progress log of a partly fetched file ([`Progress`]): `HEX.progress`
//! beside `HEX`, saying which pieces of it have been written and what their
//! bytes' CRC32s are, so that a restart keeps them and fetches only the
//! rest.
//!
//! Progress log version 1. All integers are little-endian.
//!
//! ```text
//! header, written once when the fetch starts:
//!  off   len field
//!    0     4 magic "GVFP"
//!    4     4 version (PROGRESS_VERSION, 1)
//!    8     8 the file's size
//!   16    84 upstream's attributes of the version fetched (`record.rs`'s
//!            layout); their size is the size above
//!  100     4 CRC32 (IEEE, crc32fast) of bytes 0..100
//! then records, each appended with one write(2) on an O_APPEND fd:
//!    0     4 chunk index, below ceil(size / CHUNK)
//!    4    16 mask of the chunk's 8 KiB pieces written (bit i: bytes
//!            i * PIECE.. of the chunk); not empty, within the chunk
//!   20   4*N CRC32 of each piece in the mask, lowest first (N: pieces
//!            in the mask; the file's last piece may be short)
//! 20+4N    4 CRC32 of the record's bytes before it
//! ```
//!
//! **Ordering is the durability rule.** A record is appended only after
//! its bytes were handed to the kernel (`write_all_at`), so after a process
//! death every recorded piece is in the file; pieces in flight have no
//! record and are fetched again. Nothing is synced: after a reboot a
//! recorded piece may read back as a hole or old bytes, which is why every
//! kept piece is checked against its CRC before it is served
//! (`fetch/kept.rs`).
//!
//! **Replay** stops at the first record that is short, names a chunk or
//! pieces outside the file, or fails its CRC: only a torn tail is lost, and
//! the log is cut there so that later records follow good ones. A later
//! record of a piece replaces an earlier one's CRC.
//!
//! **Bounded.** Once the log is longer than [`bound`] (twice a header and
//! one full record per chunk), [`Progress::compact`] rewrites it with one
//! record per chunk (a temporary file, then a rename). A log longer than
//! its bound plus one record is refused at load, before anything is read
//! into memory for it.
//!
//! [`Kept`] is what a resumed fetch holds of a log: the pieces kept and
//! not yet checked (`fetch/kept.rs` checks them), and those that passed.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use gvfs_ext::CHUNK;
use gvfs_nfs::layer::lock;
use gvfs_nfs::nfs3_types::nfs3::fattr3;

use crate::chunks::{chunk_count, chunk_len};
use crate::error::ProgressError;
use crate::pieces::{Mask, PIECE, all_pieces, piece_mask};
use crate::record::{ATTRS_LEN, get_attrs, put_attrs};

/// Progress log magic.
const PROGRESS_MAGIC: [u8; 4] = *b"GVFP";
/// The progress log version written.
const PROGRESS_VERSION: u32 = 1;
/// Bytes of the header.
pub(crate) const HEADER_LEN: usize = 16 + ATTRS_LEN + 4;
/// Bytes of a record before its CRCs: chunk and mask.
const RECORD_HEAD: usize = 4 + 16;
/// Bytes of the longest record: every piece of a chunk.
pub(crate) const MAX_RECORD: usize = RECORD_HEAD + 4 * Mask::BITS as usize + 4;
/// Pieces in a chunk.
const PIECES: usize = Mask::BITS as usize;

/// The length past which the log of a file of `size` bytes is compacted:
/// twice a header and one full record per chunk.
pub(crate) fn bound(size: u64) -> u64 {
    let chunks = size.div_ceil(u64::from(CHUNK));
    2 * (HEADER_LEN as u64 + chunks.saturating_mul(MAX_RECORD as u64))
}

/// The pieces of one chunk the log records, and their CRC32s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Logged {
    pub(crate) mask: Mask,
    /// By piece; only those in `mask` mean anything.
    pub(crate) crcs: [u32; PIECES],
}

impl Default for Logged {
    fn default() -> Self {
        Self {
            mask: 0,
            crcs: [0; PIECES],
        }
    }
}

/// The progress log of one partly fetched file, open for appending.
#[derive(Debug)]
pub(crate) struct Progress {
    path: PathBuf,
    file: File,
    attrs: fattr3,
    /// Bytes in the log.
    len: u64,
    /// What it records, by chunk.
    chunks: BTreeMap<usize, Logged>,
}

impl Progress {
    /// A new, empty log at `path` (replacing any) for the version of a
    /// file with upstream's attributes `attrs`.
    pub(crate) fn create(path: &Path, attrs: &fattr3) -> io::Result<Self> {
        let header = header(attrs);
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        file.write_all(&header)?;
        drop(file);
        Ok(Self {
            path: path.to_path_buf(),
            file: OpenOptions::new().append(true).open(path)?,
            attrs: attrs.clone(),
            len: HEADER_LEN as u64,
            chunks: BTreeMap::new(),
        })
    }

    /// The log at `path`, replayed, for a file the cache may hold (at most
    /// `max_size` bytes); a torn or bad tail is cut off.
    pub(crate) fn load(path: &Path, max_size: u64) -> Result<Self, ProgressError> {
        let mut file = OpenOptions::new().read(true).append(true).open(path)?;
        let mut head = [0u8; HEADER_LEN];
        file.read_exact(&mut head).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => ProgressError::Truncated,
            _ => ProgressError::Io(e),
        })?;
        let (size, attrs) = read_header(&head)?;
        if size > max_size {
            return Err(ProgressError::TooLarge {
                size,
                max: max_size,
            });
        }
        let max = bound(size) + MAX_RECORD as u64;
        let len = file.metadata()?.len();
        if len > max {
            return Err(ProgressError::TooLong { len, max });
        }
        let mut rest = Vec::with_capacity((len as usize).saturating_sub(HEADER_LEN));
        Read::by_ref(&mut file).take(max).read_to_end(&mut rest)?;
        let mut chunks: BTreeMap<usize, Logged> = BTreeMap::new();
        let mut used = 0;
        while let Some((idx, mask, crcs, n)) = read_record(&rest[used..], size) {
            let logged = chunks.entry(idx).or_default();
            logged.mask |= mask;
            let mut it = crcs.iter();
            for (i, crc) in logged.crcs.iter_mut().enumerate() {
                if mask & 1 << i != 0 {
                    *crc = it.next().copied().unwrap_or(0);
                }
            }
            used += n;
        }
        let len = (HEADER_LEN + used) as u64;
        if len < HEADER_LEN as u64 + rest.len() as u64 {
            tracing::info!(
                path = %path.display(),
                kept = used,
                cut = rest.len() - used,
                "file cache: a progress log's tail is torn; cut off"
            );
            file.set_len(len)?;
        }
        Ok(Self {
            path: path.to_path_buf(),
            file,
            attrs,
            len,
            chunks,
        })
    }

    /// Upstream's attributes of the version the log is of.
    pub(crate) fn attrs(&self) -> &fattr3 {
        &self.attrs
    }

    /// The file's size.
    pub(crate) fn size(&self) -> u64 {
        self.attrs.size
    }

    /// What the log records of chunk `idx`.
    pub(crate) fn logged(&self, idx: usize) -> Option<&Logged> {
        self.chunks.get(&idx)
    }

    /// The chunks the log records pieces of, and those pieces.
    pub(crate) fn masks(&self) -> impl Iterator<Item = (usize, Mask)> + '_ {
        self.chunks.iter().map(|(i, l)| (*i, l.mask))
    }

    /// Bytes of the file the log records.
    pub(crate) fn recorded_bytes(&self) -> u64 {
        let size = self.size();
        self.masks()
            .map(|(idx, mask)| mask_bytes(size, idx, mask))
            .sum()
    }

    /// Bytes in the log now.
    pub(crate) fn log_len(&self) -> u64 {
        self.len
    }

    /// Records the whole pieces of `raw`, just written at `offset` (the
    /// file's last piece may be short), compacting the log when it has
    /// grown past its bound (the entry works its CRCs out first, outside
    /// its lock: [`Noted`], [`append`](Self::append)).
    #[cfg(test)]
    pub(crate) fn note(&mut self, offset: u64, raw: &[u8]) -> io::Result<()> {
        self.append(Noted::of(self.size(), offset, raw))
    }

    /// Records `noted` (worked out for a file of this log's size), the
    /// whole pieces of a range just written, compacting the log when it
    /// has grown past its bound.
    pub(crate) fn append(&mut self, noted: Noted) -> io::Result<()> {
        let size = self.size();
        debug_assert_eq!(noted.size, size);
        let mut records: Vec<u8> = Vec::new();
        for (idx, mask, crcs) in noted.chunks {
            put_record(&mut records, idx, mask, &crcs);
            let logged = self.chunks.entry(idx).or_default();
            logged.mask |= mask;
            let pieces = (0..PIECES).filter(|i| mask & 1 << i != 0);
            for (i, crc) in pieces.zip(crcs) {
                logged.crcs[i] = crc;
            }
        }
        if records.is_empty() {
            return Ok(());
        }
        self.file.write_all(&records)?;
        self.len += records.len() as u64;
        if self.len > bound(size) {
            self.compact()?;
        }
        Ok(())
    }

    /// Rewrites the log as its header and one record per chunk: written
    /// to `HEX.progress.new`, then renamed over the log.
    pub(crate) fn compact(&mut self) -> io::Result<()> {
        let mut out = header(&self.attrs);
        for (idx, logged) in &self.chunks {
            let crcs: Vec<u32> = (0..PIECES)
                .filter(|i| logged.mask & 1 << i != 0)
                .map(|i| logged.crcs[i])
                .collect();
            put_record(&mut out, *idx, logged.mask, &crcs);
        }
        let mut tmp = self.path.as_os_str().to_owned();
        tmp.push(".new");
        let tmp = PathBuf::from(tmp);
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        file.write_all(&out)?;
        drop(file);
        std::fs::rename(&tmp, &self.path)?;
        self.file = OpenOptions::new().append(true).open(&self.path)?;
        self.len = out.len() as u64;
        Ok(())
    }
}

/// The whole pieces of a range just written and their CRC32s, by chunk:
/// what [`Progress::append`] records, worked out before its lock is taken.
#[derive(Debug)]
pub(crate) struct Noted {
    /// The file's size they were worked out for.
    pub(crate) size: u64,
    chunks: Vec<(usize, Mask, Vec<u32>)>,
}

impl Noted {
    /// The whole pieces of `raw`, written at `offset` in a file of `size`
    /// bytes (its last piece may be short), and their CRC32s.
    pub(crate) fn of(size: u64, offset: u64, raw: &[u8]) -> Self {
        let end = offset.saturating_add(raw.len() as u64).min(size);
        let piece = u64::from(PIECE);
        let mut chunks = Vec::new();
        let mut at = offset.div_ceil(piece) * piece;
        while at < end {
            let idx = (at / u64::from(CHUNK)) as usize;
            let chunk_end = ((idx as u64 + 1) * u64::from(CHUNK)).min(end);
            // The chunk's pieces `raw` holds whole, and their CRCs.
            let mut mask: Mask = 0;
            let mut crcs = Vec::new();
            while at < chunk_end {
                let to = (at + piece).min(size);
                if to > end {
                    break;
                }
                let bytes = &raw[(at - offset) as usize..(to - offset) as usize];
                mask |= 1 << ((at % u64::from(CHUNK)) / piece);
                crcs.push(crc32fast::hash(bytes));
                at = to;
            }
            if mask != 0 {
                chunks.push((idx, mask, crcs));
            }
            at = at.max(chunk_end);
        }
        Self { size, chunks }
    }
}

/// The pieces a resumed fetch kept from before the restart.
#[derive(Debug)]
pub(crate) struct Kept {
    /// Kept pieces not checked yet, with their CRC32s, by chunk.
    unchecked: Mutex<BTreeMap<usize, Logged>>,
    /// Chunks in `unchecked`: the test on every reader's path.
    pending: AtomicUsize,
    /// Kept pieces that passed their check, by chunk: fetching them again
    /// is counted (`refetched_bytes`).
    good: Mutex<HashMap<usize, Mask>>,
}

impl Kept {
    pub(crate) fn new(unchecked: BTreeMap<usize, Logged>) -> Self {
        Self {
            pending: AtomicUsize::new(unchecked.len()),
            unchecked: Mutex::new(unchecked),
            good: Mutex::new(HashMap::new()),
        }
    }

    /// Takes the unchecked chunks of `first..=last` out, for one checker.
    pub(crate) fn take(&self, first: usize, last: usize) -> Vec<(usize, Logged)> {
        if self.pending.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let mut unchecked = lock(&self.unchecked);
        let idxs: Vec<usize> = unchecked.range(first..=last).map(|(i, _)| *i).collect();
        let taken = idxs
            .into_iter()
            .filter_map(|i| unchecked.remove(&i).map(|l| (i, l)))
            .collect();
        self.pending.store(unchecked.len(), Ordering::Release);
        taken
    }

    /// The first chunk not checked yet.
    pub(crate) fn next(&self) -> Option<usize> {
        lock(&self.unchecked).keys().next().copied()
    }

    /// Notes the pieces of chunk `idx` that passed their check.
    pub(crate) fn passed(&self, idx: usize, good: Mask) {
        lock(&self.good).insert(idx, good);
    }

    /// Bytes of `offset..offset + count` (inside one chunk of a file of
    /// `size` bytes) that were kept and passed their check.
    pub(crate) fn refetched(&self, size: u64, offset: u64, count: u32) -> u64 {
        let idx = (offset / u64::from(CHUNK)) as usize;
        let Some(good) = lock(&self.good).get(&idx).copied() else {
            return 0;
        };
        let len = chunk_len(size, idx);
        let asked = piece_mask(idx, len, offset, offset + u64::from(count));
        mask_bytes(size, idx, good & asked)
    }
}

/// The pieces of `mask` (of chunk `idx` of `file`, `size` bytes) whose
/// bytes match the CRC32s `logged` records (blocking I/O). A piece the
/// log does not record fails.
pub(crate) fn check_pieces(
    file: &File,
    size: u64,
    idx: usize,
    mask: Mask,
    logged: &Logged,
) -> io::Result<Mask> {
    let len = chunk_len(size, idx);
    let mask = mask & all_pieces(len) & logged.mask;
    if mask == 0 {
        return Ok(0);
    }
    let start = idx as u64 * u64::from(CHUNK);
    let first = mask.trailing_zeros();
    let last = Mask::BITS - 1 - mask.leading_zeros();
    let from = u64::from(first * PIECE);
    let to = (u64::from((last + 1) * PIECE)).min(u64::from(len));
    let mut buf = vec![0u8; (to - from) as usize];
    file.read_exact_at(&mut buf, start + from)?;
    let mut good = 0;
    for i in first..=last {
        if mask & 1 << i == 0 {
            continue;
        }
        let a = (u64::from(i * PIECE) - from) as usize;
        let b = (a + PIECE as usize).min(buf.len());
        if crc32fast::hash(&buf[a..b]) == logged.crcs[i as usize] {
            good |= 1 << i;
        }
    }
    Ok(good)
}

/// Bytes of the pieces `mask` of chunk `idx` of a file of `size` bytes.
pub(crate) fn mask_bytes(size: u64, idx: usize, mask: Mask) -> u64 {
    let len = chunk_len(size, idx);
    let mask = mask & all_pieces(len);
    let mut bytes = u64::from(mask.count_ones()) * u64::from(PIECE);
    let last = all_pieces(len).leading_zeros();
    if !len.is_multiple_of(PIECE) && mask & 1 << (Mask::BITS - 1 - last) != 0 {
        bytes -= u64::from(PIECE - len % PIECE);
    }
    bytes
}

fn header(attrs: &fattr3) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN);
    out.extend_from_slice(&PROGRESS_MAGIC);
    out.extend_from_slice(&PROGRESS_VERSION.to_le_bytes());
    out.extend_from_slice(&attrs.size.to_le_bytes());
    put_attrs(&mut out, attrs);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The size and attributes a header gives.
fn read_header(head: &[u8; HEADER_LEN]) -> Result<(u64, fattr3), ProgressError> {
    let (body, crc) = head.split_at(HEADER_LEN - 4);
    if body[..4] != PROGRESS_MAGIC {
        return Err(ProgressError::BadMagic);
    }
    let word = |at: usize| u32::from_le_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]]);
    let version = word(4);
    if version != PROGRESS_VERSION {
        return Err(ProgressError::Version(version));
    }
    if crc32fast::hash(body).to_le_bytes() != crc {
        return Err(ProgressError::Checksum);
    }
    let size = u64::from(word(8)) | u64::from(word(12)) << 32;
    let attrs = get_attrs(&body[16..])?;
    if attrs.size != size {
        return Err(ProgressError::SizeMismatch {
            size,
            attrs: attrs.size,
        });
    }
    Ok((size, attrs))
}

fn put_record(out: &mut Vec<u8>, idx: usize, mask: Mask, crcs: &[u32]) {
    let start = out.len();
    out.extend_from_slice(&(idx as u32).to_le_bytes());
    out.extend_from_slice(&mask.to_le_bytes());
    for crc in crcs {
        out.extend_from_slice(&crc.to_le_bytes());
    }
    let crc = crc32fast::hash(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// The record at the start of `bytes` of a file of `size` bytes, if it is
/// whole, fits the file and passes its CRC: its chunk, pieces, their CRCs
/// and its length.
fn read_record(bytes: &[u8], size: u64) -> Option<(usize, Mask, Vec<u32>, usize)> {
    let (head, rest) = bytes.split_first_chunk::<RECORD_HEAD>()?;
    let (idx, mask) = head.split_first_chunk::<4>()?;
    let idx = u32::from_le_bytes(*idx) as usize;
    let mask = Mask::from_le_bytes(mask.try_into().ok()?);
    if idx >= chunk_count(size) || mask == 0 || mask & !all_pieces(chunk_len(size, idx)) != 0 {
        return None;
    }
    let n = mask.count_ones() as usize;
    let body = rest.get(..4 * n + 4)?;
    let (crcs, crc) = body.split_at(4 * n);
    let len = RECORD_HEAD + 4 * n;
    if crc32fast::hash(&bytes[..len]).to_le_bytes() != crc {
        return None;
    }
    let crcs = crcs
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Some((idx, mask, crcs, len + 4))
}

#[cfg(test)]
mod tests;
