//! The metadata file `.NAME.gvfsmeta` that sits beside `NAME` (the GVFS
//! paper, section 3.2.2): what the image server knows about a file that NFS
//! cannot say. All integers are little-endian. Format version 1; 2 when the
//! file has repeated blocks; 4 when it has block hashes (3, still read, is
//! 4 with the hashes of zero pieces too).
//!
//! ```text
//!  off   len field
//!    0     8 magic "GVFSMETA"
//!    8     4 format version (1; 2 with the repeat list; 4 (or 3) with the
//!            hash lists too)
//!   12     4 block size: a power of two, 4 KiB..=1 MiB
//!   16     8 file size in bytes when scanned
//!   24     8 file mtime, seconds since the epoch
//!   32     4 file mtime, nanoseconds (< 1e9)
//!   36     8 file ctime (change attribute), seconds since the epoch
//!   44     4 file ctime, nanoseconds (< 1e9)
//!   48     4 action flags: bit 0 COMPRESS, bit 1 REMOTE_COPY,
//!            bit 2 UNCOMPRESS, bit 3 READ_LOCALLY; other bits must be 0
//!   52     8 zstd-compressed size of the whole file (0 = unknown)
//!   60     4 R, the number of zero-map runs
//!   64   4*R zero-map runs (u32 each), see below
//! versions 2, 3 and 4:
//! 64+4R    4 P, the number of repeats (at least 1 in version 2)
//! 68+4R  20*P repeats: u64 to, u64 from, u32 len (in blocks), see below
//! versions 3 and 4:
//!   ..     4 H, the number of block fingerprints: the file's non-zero blocks
//!   ..   8*H each non-zero block's fingerprint, in block order, see below
//!   ..     4 Q, the number of piece hashes: in version 4, the 64 KiB pieces
//!            of the file that are not zero pieces (see below); in
//!            version 3, all of them (ceil(file size / 64 KiB))
//!   ..  32*Q the BLAKE3 of each of those pieces, in file order, see below
//! end-4    4 CRC32 (IEEE, crc32fast) of every byte before it
//! ```
//! The file is exactly `68 + 4R` bytes (version 1), `72 + 4R + 20P`
//! (version 2) or `80 + 4R + 20P + 8H + 32Q` (versions 3 and 4), and at most
//! [`MAX_META_LEN`]. A file is written in the oldest version that holds
//! what it says, so proxies that only know version 1 read a file with no
//! repeats and no hashes; a proxy that does not know a version refuses the
//! file and serves the image without metadata (plain NFS reads).
//!
//! The zero map covers `B = ceil(file size / block size)` blocks; block `i`
//! is zero when all its bytes are zero (the last, partial block when its
//! bytes up to end of file are). It is stored run-length encoded: run
//! lengths alternate between non-zero and zero blocks, starting with a
//! non-zero run, and add up to `B`. Only the first run may be 0 (the file
//! starts with a zero block), except that a run longer than `u32::MAX` is
//! written as `u32::MAX`, a 0-length run of the other kind, and the rest.
//! The encoding is canonical: no other run sequence decodes, so encoding a
//! decoded file gives back the same bytes. An empty file has `R = 0`.
//!
//! A repeat says that blocks `to..to+len` hold the same bytes as blocks
//! `from..from+len`, which come before them (`from + len <= to`): a whole
//! file fetch sends them as zeros and the receiver copies them from the
//! earlier blocks, which it always has first. Repeats are sorted by `to`,
//! do not overlap, and cover whole blocks inside the file.
//!
//! Hashes (version 3; the block size is then at most 64 KiB) name the
//! file's content so a proxy can copy what it holds instead of fetching
//! it (`crate::dedup`). A block's *fingerprint* is the first 8 bytes of the
//! BLAKE3 of its bytes (the last block's up to the end of the file), one
//! for every block the zero map does not call zero, in block order: it
//! finds a candidate among the blocks a proxy holds. A *piece hash* is the
//! 32-byte BLAKE3 of each 64 KiB piece of the file (the last one up to the
//! end). A *zero piece* is one all of whose blocks the zero map calls zero:
//! its hash, that of as many zero bytes, is not written (version 4; a
//! mostly empty memory image's metadata is then mostly its fingerprints),
//! and one written in version 3 is not read. Every range a proxy assembles
//! from held blocks is
//! checked against the piece hashes before a byte of it is used, so a
//! fingerprint that matches other bytes (by chance, by a damaged disk, or
//! by a peer's design) costs a fetch, never wrong bytes. Eight bytes a
//! block and 32 a piece are about a quarter of a 32-byte hash per block.

use gvfs_nfs::FileVersion;

use crate::error::MetaError;
use crate::hashes::{
    BlockHashes, FINGERPRINT_LEN, Fingerprint, HASH_LEN, HASH_PIECE, PieceHash, zero_piece_runs,
};
use crate::zeromap::ZeroMap;

pub use crate::limits::*;

/// Bytes before the zero-map runs.
const FIXED_LEN: usize = 64;
/// Bytes of a metadata file with no runs (the fixed part and the CRC).
const EMPTY_LEN: usize = FIXED_LEN + 4;
/// Bytes of one repeat.
const REPEAT_LEN: usize = 20;

const COMPRESS: u32 = 1 << 0;
const REMOTE_COPY: u32 = 1 << 1;
const UNCOMPRESS: u32 = 1 << 2;
const READ_LOCALLY: u32 = 1 << 3;
const KNOWN_ACTIONS: u32 = COMPRESS | REMOTE_COPY | UNCOMPRESS | READ_LOCALLY;

/// `.NAME.gvfsmeta` for `NAME`; `None` if `NAME` is empty, `.`, `..`,
/// contains `/` or NUL, ends in [`META_SUFFIX`] (such names are reserved
/// for metadata files and never described), or the metadata name would be
/// longer than [`MAX_NAME_LEN`] bytes.
pub fn meta_name(name: &str) -> Option<String> {
    if name.is_empty()
        || name == "."
        || name == ".."
        || name.contains(['/', '\0'])
        || name.ends_with(META_SUFFIX)
        || 1 + name.len() + META_SUFFIX.len() > MAX_NAME_LEN
    {
        return None;
    }
    Some(format!(".{name}{META_SUFFIX}"))
}

/// Whether `name` is the name of a metadata file, `.NAME.gvfsmeta` for some
/// `NAME` that [`meta_name`] accepts.
pub fn is_meta_name(name: &str) -> bool {
    described_name(name).is_some()
}

/// The name a metadata file name describes: `NAME` for `.NAME.gvfsmeta`;
/// `None` if `meta` is not a metadata file name.
pub fn described_name(meta: &str) -> Option<&str> {
    let name = meta.strip_prefix('.')?.strip_suffix(META_SUFFIX)?;
    meta_name(name).is_some().then_some(name)
}

/// The actions a proxy takes on a file when it is accessed (section 3.2.2:
/// "compress", "remote copy", "uncompress", "read locally").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Actions {
    /// Fetch the whole file as a zstd stream instead of block by block.
    pub compress: bool,
    /// Copy the compressed file to the client side.
    pub remote_copy: bool,
    /// Uncompress it into the proxy's file cache.
    pub uncompress: bool,
    /// Serve reads of the file from the file cache.
    pub read_locally: bool,
}

impl Actions {
    /// The paper's compress-and-copy sequence: all four actions.
    pub const COMPRESS_AND_COPY: Actions = Actions {
        compress: true,
        remote_copy: true,
        uncompress: true,
        read_locally: true,
    };

    /// The action flags word.
    pub fn bits(self) -> u32 {
        (if self.compress { COMPRESS } else { 0 })
            | (if self.remote_copy { REMOTE_COPY } else { 0 })
            | (if self.uncompress { UNCOMPRESS } else { 0 })
            | (if self.read_locally { READ_LOCALLY } else { 0 })
    }

    /// Actions from a flags word; `None` when an unknown bit is set.
    pub fn from_bits(bits: u32) -> Option<Actions> {
        (bits & !KNOWN_ACTIONS == 0).then_some(Actions {
            compress: bits & COMPRESS != 0,
            remote_copy: bits & REMOTE_COPY != 0,
            uncompress: bits & UNCOMPRESS != 0,
            read_locally: bits & READ_LOCALLY != 0,
        })
    }

    /// Whether no action is set.
    pub fn is_empty(self) -> bool {
        self.bits() == 0
    }
}

/// A decoded metadata file: what a file looked like when it was scanned, its
/// zero blocks and the actions to take on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaFile {
    /// Block size of the zero map, a power of two in
    /// [`MIN_BLOCK_SIZE`]..=[`MAX_BLOCK_SIZE`].
    pub block_size: u32,
    /// The file's size when scanned.
    pub file_size: u64,
    /// The file's mtime when scanned: seconds, nanoseconds.
    pub mtime: (u64, u32),
    /// The file's ctime (change attribute) when scanned: seconds, nanoseconds.
    pub ctime: (u64, u32),
    /// What to do with the file when it is accessed.
    pub actions: Actions,
    /// The zstd-compressed size of the whole file, 0 when unknown.
    pub compressed_size: u64,
    /// Which blocks are all zeros; covers [`MetaFile::blocks`] blocks.
    pub zero: ZeroMap,
    /// Runs of blocks that repeat earlier blocks, sorted by `to`.
    pub repeats: Vec<Repeat>,
    /// Fingerprints of the non-zero blocks and hashes of the pieces
    /// (version 3), if recorded.
    pub hashes: Option<std::sync::Arc<BlockHashes>>,
}

/// Blocks `to..to + len` hold the same bytes as `from..from + len`
/// (`from + len <= to`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repeat {
    /// The first repeated block.
    pub to: u64,
    /// The first block it repeats.
    pub from: u64,
    /// How many blocks, at least 1.
    pub len: u32,
}

/// A repeat inside one byte range of the file: bytes `to..to + len` are
/// the same as `from..from + len` (`from + len <= to`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRepeat {
    /// Where the repeated bytes start.
    pub to: u64,
    /// Where the bytes they repeat start.
    pub from: u64,
    /// How many bytes.
    pub len: u32,
}

/// The number of blocks of `block_size` bytes a file of `file_size` bytes
/// has (the last may be partial).
pub fn block_count(file_size: u64, block_size: u32) -> u64 {
    file_size.div_ceil(u64::from(block_size.max(1)))
}

impl MetaFile {
    /// The number of blocks of the file, the last possibly partial.
    pub fn blocks(&self) -> u64 {
        block_count(self.file_size, self.block_size)
    }

    /// Checks what [`MetaFile::decode`] checks of the fields: the block size,
    /// the nanoseconds, and that the zero map covers the file's blocks.
    pub fn validate(&self) -> Result<(), MetaError> {
        let bs = self.block_size;
        if !bs.is_power_of_two() || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&bs) {
            return Err(MetaError::Invalid(format!(
                "block size {bs} is not a power of two in {MIN_BLOCK_SIZE}..={MAX_BLOCK_SIZE}"
            )));
        }
        for (what, (_, ns)) in [("mtime", self.mtime), ("ctime", self.ctime)] {
            if ns >= 1_000_000_000 {
                return Err(MetaError::Invalid(format!(
                    "{what} nanoseconds {ns} >= 1e9"
                )));
            }
        }
        if self.zero.blocks() != self.blocks() {
            return Err(MetaError::Invalid(format!(
                "zero map covers {} blocks, the file has {}",
                self.zero.blocks(),
                self.blocks()
            )));
        }
        if let Some(h) = &self.hashes {
            let data = self.blocks() - self.zero.zero_blocks();
            let zero_pieces = zero_piece_runs(&self.zero, bs, self.file_size);
            let zeros: u64 = zero_pieces.iter().map(|(a, b)| b - a).sum();
            if h.fingerprints.len() as u64 != data
                || h.pieces.len() as u64 + zeros != self.file_size.div_ceil(HASH_PIECE)
                || h.zero_pieces != zero_pieces
                || h.zeros_before.len() != self.zero.zero_ranges().len() + 1
            {
                return Err(MetaError::Invalid(format!(
                    "{} block fingerprints for {data} non-zero blocks, or {} piece hashes \
                     for the {} pieces that are not zero of a file of {} bytes",
                    h.fingerprints.len(),
                    h.pieces.len(),
                    self.file_size.div_ceil(HASH_PIECE) - zeros,
                    self.file_size
                )));
            }
            if u64::from(bs) > HASH_PIECE {
                return Err(MetaError::Invalid(format!(
                    "hashes with {bs}-byte blocks (at most {HASH_PIECE})"
                )));
            }
        }
        let whole_blocks = self.file_size / u64::from(bs);
        let mut next_to = 0u64;
        for r in &self.repeats {
            let len = u64::from(r.len);
            let bad = len == 0
                || r.to < next_to
                || r.from.checked_add(len).is_none_or(|e| e > r.to)
                || r.to.checked_add(len).is_none_or(|e| e > whole_blocks);
            if bad {
                return Err(MetaError::Invalid(format!(
                    "repeat of blocks {}+{} from {} is out of order, empty, not before \
                     them, or past the file's last whole block",
                    r.to, r.len, r.from
                )));
            }
            next_to = r.to + len;
        }
        Ok(())
    }

    /// The repeats that fall in `offset..offset + len`, in bytes, clipped
    /// to it, in file order.
    pub fn repeats_in(&self, offset: u64, len: u64) -> Vec<ByteRepeat> {
        let bs = u64::from(self.block_size);
        let end = offset.saturating_add(len);
        let first = self
            .repeats
            .partition_point(|r| (r.to + u64::from(r.len)) * bs <= offset);
        let mut out = Vec::new();
        for r in &self.repeats[first..] {
            let (to, to_end) = (r.to * bs, (r.to + u64::from(r.len)) * bs);
            if to >= end {
                break;
            }
            let (a, b) = (to.max(offset), to_end.min(end));
            if a < b {
                out.push(ByteRepeat {
                    to: a,
                    from: r.from * bs + (a - to),
                    len: (b - a) as u32,
                });
            }
        }
        out
    }

    /// Bytes the repeats cover.
    pub fn repeat_bytes(&self) -> u64 {
        let bs = u64::from(self.block_size);
        self.repeats.iter().map(|r| u64::from(r.len) * bs).sum()
    }

    /// The bytes of the metadata file. It writes the fields as they are; a
    /// `MetaFile` that fails [`MetaFile::validate`] encodes to bytes that
    /// [`MetaFile::decode`] refuses.
    pub fn encode(&self) -> Vec<u8> {
        let runs = self.zero.runs();
        let mut out = Vec::with_capacity(self.encoded_len());
        out.extend_from_slice(&META_MAGIC);
        let version = self.version();
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&self.block_size.to_le_bytes());
        out.extend_from_slice(&self.file_size.to_le_bytes());
        out.extend_from_slice(&self.mtime.0.to_le_bytes());
        out.extend_from_slice(&self.mtime.1.to_le_bytes());
        out.extend_from_slice(&self.ctime.0.to_le_bytes());
        out.extend_from_slice(&self.ctime.1.to_le_bytes());
        out.extend_from_slice(&self.actions.bits().to_le_bytes());
        out.extend_from_slice(&self.compressed_size.to_le_bytes());
        out.extend_from_slice(&(runs.len() as u32).to_le_bytes());
        debug_assert_eq!(out.len(), FIXED_LEN);
        for run in runs {
            out.extend_from_slice(&run.to_le_bytes());
        }
        if version >= META_VERSION_REPEATS {
            out.extend_from_slice(&(self.repeats.len() as u32).to_le_bytes());
            for r in &self.repeats {
                out.extend_from_slice(&r.to.to_le_bytes());
                out.extend_from_slice(&r.from.to_le_bytes());
                out.extend_from_slice(&r.len.to_le_bytes());
            }
        }
        if let Some(h) = &self.hashes {
            out.extend_from_slice(&(h.fingerprints.len() as u32).to_le_bytes());
            for f in &h.fingerprints {
                out.extend_from_slice(f);
            }
            out.extend_from_slice(&(h.pieces.len() as u32).to_le_bytes());
            for p in &h.pieces {
                out.extend_from_slice(p);
            }
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// The format version [`MetaFile::encode`] writes: the oldest that
    /// holds what the file says.
    pub fn version(&self) -> u32 {
        if self.hashes.is_some() {
            META_VERSION_HASHES
        } else if !self.repeats.is_empty() {
            META_VERSION_REPEATS
        } else {
            META_VERSION
        }
    }

    /// About how much memory the decoded metadata takes.
    pub fn memory_len(&self) -> usize {
        std::mem::size_of::<MetaFile>()
            + std::mem::size_of::<(u64, u64)>() * self.zero.zero.len()
            + std::mem::size_of::<Repeat>() * self.repeats.len()
            + self.hashes.as_ref().map_or(0, |h| {
                FINGERPRINT_LEN * h.fingerprints.len()
                    + HASH_LEN * h.pieces.len()
                    + 8 * h.zeros_before.len()
            })
    }

    /// The length [`MetaFile::encode`] would return, without encoding.
    pub fn encoded_len(&self) -> usize {
        let repeats = match (self.version(), self.repeats.len()) {
            (META_VERSION, _) => 0,
            (_, n) => 4 + REPEAT_LEN * n,
        };
        let hashes = self.hashes.as_ref().map_or(0, |h| {
            8 + FINGERPRINT_LEN * h.fingerprints.len() + HASH_LEN * h.pieces.len()
        });
        EMPTY_LEN + 4 * self.zero.runs().len() + repeats + hashes
    }

    /// The fingerprint of block `block`, if the file has hashes and the
    /// block is not zero.
    pub fn block_fingerprint(&self, block: u64) -> Option<&Fingerprint> {
        let h = self.hashes.as_deref()?;
        if block >= self.blocks() || self.zero.is_zero(block) {
            return None;
        }
        let ranges = self.zero.zero_ranges();
        let i = ranges.partition_point(|r| r.1 <= block);
        let rank = block - h.zeros_before.get(i)?;
        h.fingerprints.get(usize::try_from(rank).ok()?)
    }

    /// The hash of piece `piece` (bytes `piece * HASH_PIECE..`), if the
    /// file has hashes (a zero piece's too).
    pub fn piece_hash(&self, piece: u64) -> Option<&PieceHash> {
        self.hashes.as_deref()?.piece(piece)
    }

    /// Decodes and checks a metadata file. Every length is checked against
    /// the input before allocating; never panics.
    pub fn decode(bytes: &[u8]) -> Result<MetaFile, MetaError> {
        if bytes.len() > MAX_META_LEN {
            return Err(MetaError::TooLarge(bytes.len() as u64));
        }
        let magic_len = bytes.len().min(META_MAGIC.len());
        if bytes[..magic_len] != META_MAGIC[..magic_len] {
            return Err(MetaError::BadMagic);
        }
        let mut r = Reader { bytes, at: 8 };
        let version = r.u32()?;
        if !(META_VERSION..=META_VERSION_HASHES).contains(&version) {
            return Err(MetaError::Version(version));
        }
        let block_size = r.u32()?;
        let file_size = r.u64()?;
        let mtime = (r.u64()?, r.u32()?);
        let ctime = (r.u64()?, r.u32()?);
        let bits = r.u32()?;
        let compressed_size = r.u64()?;
        let run_count = r.u32()? as usize;
        // run_count <= 2^32 and MAX_META_LEN bounds the input: no overflow.
        let runs_end = FIXED_LEN + 4 * run_count;
        let mut total = runs_end + 4;
        let u32_at = |at: usize| -> Result<usize, MetaError> {
            let b = bytes.get(at..at + 4).ok_or(MetaError::Truncated)?;
            Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        };
        let mut repeat_count = 0;
        let mut hashes_at = None;
        if version >= META_VERSION_REPEATS {
            repeat_count = u32_at(runs_end)?;
            if repeat_count == 0 && version == META_VERSION_REPEATS {
                return Err(MetaError::Invalid(
                    "version 2 with no repeats (written as version 1)".into(),
                ));
            }
            total = runs_end + 4 + REPEAT_LEN * repeat_count + 4;
        }
        if version >= META_VERSION_ALL_HASHES {
            let at = total - 4;
            let blocks = u32_at(at)?;
            let pieces_at = at + 4 + FINGERPRINT_LEN * blocks;
            let pieces = u32_at(pieces_at)?;
            hashes_at = Some((at + 4, blocks, pieces_at + 4, pieces));
            total = pieces_at + 4 + HASH_LEN * pieces + 4;
        }
        if bytes.len() < total {
            return Err(MetaError::Truncated);
        }
        if bytes.len() > total {
            return Err(MetaError::Invalid(format!(
                "{} bytes after the checksum",
                bytes.len() - total
            )));
        }
        let body = &bytes[..total - 4];
        let mut crc = [0u8; 4];
        crc.copy_from_slice(&bytes[total - 4..]);
        if crc32fast::hash(body) != u32::from_le_bytes(crc) {
            return Err(MetaError::Checksum);
        }
        let actions = Actions::from_bits(bits)
            .ok_or_else(|| MetaError::Invalid(format!("unknown action bits {bits:#x}")))?;
        let runs: Vec<u32> = body[FIXED_LEN..runs_end]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let mut meta = MetaFile {
            block_size,
            file_size,
            mtime,
            ctime,
            actions,
            compressed_size,
            zero: ZeroMap::new(0),
            repeats: Vec::new(),
            hashes: None,
        };
        // Check the block size before using it to count blocks.
        meta.validate_header()?;
        meta.zero = ZeroMap::from_runs(meta.blocks(), &runs)?;
        if repeat_count > 0 {
            // The length check above bounds the count by the input's size.
            meta.repeats = body[runs_end + 4..runs_end + 4 + REPEAT_LEN * repeat_count]
                .chunks_exact(REPEAT_LEN)
                .map(|c| {
                    let u64_at = |i: usize| {
                        let mut b = [0u8; 8];
                        b.copy_from_slice(&c[i..i + 8]);
                        u64::from_le_bytes(b)
                    };
                    Repeat {
                        to: u64_at(0),
                        from: u64_at(8),
                        len: u32::from_le_bytes([c[16], c[17], c[18], c[19]]),
                    }
                })
                .collect();
        }
        if let Some((at, blocks, pieces_at, pieces)) = hashes_at {
            let fingerprints = body[at..at + FINGERPRINT_LEN * blocks]
                .chunks_exact(FINGERPRINT_LEN)
                .map(|c| {
                    let mut f = [0u8; FINGERPRINT_LEN];
                    f.copy_from_slice(c);
                    f
                })
                .collect();
            let piece_list = body[pieces_at..pieces_at + HASH_LEN * pieces]
                .chunks_exact(HASH_LEN)
                .map(|c| {
                    let mut h = [0u8; HASH_LEN];
                    h.copy_from_slice(c);
                    h
                })
                .collect();
            let (zero, bs, size) = (&meta.zero, meta.block_size, meta.file_size);
            let all = version == META_VERSION_ALL_HASHES;
            let hashes = BlockHashes::from_list(fingerprints, piece_list, zero, bs, size, all);
            let hashes = hashes.ok_or_else(|| {
                MetaError::Invalid(format!(
                    "{blocks} block fingerprints for {} non-zero blocks, or {pieces} piece \
                     hashes in version {version} for a file of {} pieces, {} of them zero",
                    meta.blocks() - meta.zero.zero_blocks(),
                    size.div_ceil(HASH_PIECE),
                    zero_piece_runs(zero, bs, size)
                        .iter()
                        .map(|(a, b)| b - a)
                        .sum::<u64>()
                ))
            })?;
            meta.hashes = Some(std::sync::Arc::new(hashes));
        }
        meta.validate()?;
        Ok(meta)
    }

    fn validate_header(&self) -> Result<(), MetaError> {
        let mut probe = self.clone();
        probe.zero = ZeroMap::new(self.blocks());
        probe.repeats.clear();
        probe.hashes = None;
        probe.validate()
    }

    /// The version of the file it describes (as it was scanned): the
    /// metadata holds for that version only.
    pub fn file_version(&self) -> FileVersion {
        FileVersion {
            size: self.file_size,
            mtime: self.mtime,
            ctime: self.ctime,
        }
    }

    /// Whether every byte of `offset..offset + len` lies in zero blocks and
    /// inside the file; `false` for an empty range.
    pub fn range_is_zero(&self, offset: u64, len: u64) -> bool {
        let Some(end) = offset.checked_add(len) else {
            return false;
        };
        if len == 0 || end > self.file_size || self.block_size == 0 {
            return false;
        }
        let bs = u64::from(self.block_size);
        self.zero.all_zero(offset / bs, end.div_ceil(bs))
    }
}

/// Little-endian reads that fail with [`MetaError::Truncated`] at the end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], MetaError> {
        let b = self
            .bytes
            .get(self.at..self.at + N)
            .ok_or(MetaError::Truncated)?;
        self.at += N;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, MetaError> {
        self.take().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, MetaError> {
        self.take().map(u64::from_le_bytes)
    }
}

#[cfg(test)]
mod tests;
