//! The metadata file `.NAME.gvfsmeta` that sits beside `NAME` (the GVFS
//! paper, section 3.2.2): what the image server knows about a file that NFS
//! cannot say. All integers are little-endian. Format version 1, or 2 when the
//! file has repeated blocks.
//!
//! ```text
//!  off   len field
//!    0     8 magic "GVFSMETA"
//!    8     4 format version (1, or 2 with the repeat list below)
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
//! version 2 only:
//! 64+4R    4 P, the number of repeats
//! 68+4R  20*P repeats: u64 to, u64 from, u32 len (in blocks), see below
//! end-4    4 CRC32 (IEEE, crc32fast) of every byte before it
//! ```
//! The file is exactly `68 + 4R` bytes (version 1) or `72 + 4R + 20P`
//! (version 2), and at most [`MAX_META_LEN`]. A file with no repeats is
//! written as version 1, so proxies that only know version 1 read it.
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

use crate::error::MetaError;

/// Metadata file magic.
pub const META_MAGIC: [u8; 8] = *b"GVFSMETA";
/// Format version of a file without repeats.
pub const META_VERSION: u32 = 1;
/// Format version of a file with repeats.
pub const META_VERSION_REPEATS: u32 = 2;
/// The suffix of a metadata file name: `.NAME.gvfsmeta` describes `NAME`.
pub const META_SUFFIX: &str = ".gvfsmeta";
/// The largest metadata file accepted: a peer-supplied one larger than this
/// is refused before anything is allocated for it.
pub const MAX_META_LEN: usize = 1 << 20;
/// Smallest block size a metadata file may use.
pub const MIN_BLOCK_SIZE: u32 = 4 << 10;
/// Largest block size a metadata file may use.
pub const MAX_BLOCK_SIZE: u32 = 1 << 20;
/// Longest file name (Linux `NAME_MAX`); the metadata file name must fit too.
pub const MAX_NAME_LEN: usize = 255;

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

/// Which blocks of a file are all zeros: a bitmap over `blocks()` blocks,
/// kept as sorted, disjoint, non-adjacent ranges of zero blocks so that its
/// memory follows the number of runs, never the file size (a metadata file
/// can claim any size).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ZeroMap {
    blocks: u64,
    /// Half-open `[start, end)` ranges of zero blocks, sorted, with a gap of
    /// at least one non-zero block between neighbours.
    zero: Vec<(u64, u64)>,
}

impl ZeroMap {
    /// A map of `blocks` blocks, none of them zero.
    pub fn new(blocks: u64) -> Self {
        ZeroMap {
            blocks,
            zero: Vec::new(),
        }
    }

    /// Marks `block` as all zeros; a block past the end is ignored.
    pub fn set_zero(&mut self, block: u64) {
        self.set_zero_range(block, block.saturating_add(1));
    }

    /// Marks blocks `start..end` as all zeros (clipped to the map).
    pub fn set_zero_range(&mut self, start: u64, end: u64) {
        let end = end.min(self.blocks);
        if start >= end {
            return;
        }
        // Fast path: appending in order, as a scan does.
        match self.zero.last_mut() {
            None => return self.zero.push((start, end)),
            Some(last) if last.1 < start => return self.zero.push((start, end)),
            Some(last) if last.0 <= start => {
                last.1 = last.1.max(end);
                return;
            }
            Some(_) => {}
        }
        // General case: merge with every range that overlaps or touches.
        let first = self.zero.partition_point(|r| r.1 < start);
        let last = self.zero.partition_point(|r| r.0 <= end);
        let (mut s, mut e) = (start, end);
        if first < last {
            s = s.min(self.zero[first].0);
            e = e.max(self.zero[last - 1].1);
        }
        self.zero.splice(first..last, [(s, e)]);
    }

    /// Whether `block` is all zeros; `false` past the end.
    pub fn is_zero(&self, block: u64) -> bool {
        self.all_zero(block, block.saturating_add(1))
    }

    /// Whether every block of `start..end` is zero (and inside the map);
    /// `false` for an empty range.
    pub fn all_zero(&self, start: u64, end: u64) -> bool {
        if start >= end || end > self.blocks {
            return false;
        }
        let i = self.zero.partition_point(|r| r.1 <= start);
        self.zero
            .get(i)
            .is_some_and(|&(s, e)| s <= start && end <= e)
    }

    /// The number of blocks the map covers.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// The number of zero blocks.
    pub fn zero_blocks(&self) -> u64 {
        self.zero.iter().map(|(s, e)| e - s).sum()
    }

    /// The ranges of zero blocks, sorted.
    pub fn zero_ranges(&self) -> &[(u64, u64)] {
        &self.zero
    }

    /// Keeps only the `max` longest zero ranges (all if there are fewer).
    /// Forgetting that a block is zero is always safe: it is then read
    /// normally. Used to bound the size of a metadata file.
    pub fn keep_longest(&mut self, max: usize) {
        if self.zero.len() <= max {
            return;
        }
        let mut by_len: Vec<usize> = (0..self.zero.len()).collect();
        by_len.sort_by_key(|&i| std::cmp::Reverse(self.zero[i].1 - self.zero[i].0));
        let mut keep = vec![false; self.zero.len()];
        for &i in &by_len[..max] {
            keep[i] = true;
        }
        let mut i = 0;
        self.zero.retain(|_| {
            i += 1;
            keep[i - 1]
        });
    }

    /// The run lengths of the encoding (see the module doc).
    fn runs(&self) -> Vec<u32> {
        let mut runs = Vec::with_capacity(self.zero.len() * 2 + 1);
        let push = |runs: &mut Vec<u32>, mut len: u64| {
            while len > u64::from(u32::MAX) {
                runs.push(u32::MAX);
                runs.push(0);
                len -= u64::from(u32::MAX);
            }
            runs.push(len as u32);
        };
        let mut at = 0;
        for &(s, e) in &self.zero {
            // A non-zero run before each zero range (0 only at the start).
            push(&mut runs, s - at);
            push(&mut runs, e - s);
            at = e;
        }
        if at < self.blocks {
            push(&mut runs, self.blocks - at);
        }
        runs
    }

    /// The map from run lengths, checked to be canonical and to cover
    /// exactly `blocks` blocks.
    fn from_runs(blocks: u64, runs: &[u32]) -> Result<ZeroMap, MetaError> {
        let mut map = ZeroMap::new(blocks);
        let mut at: u64 = 0;
        for (i, &run) in runs.iter().enumerate() {
            if run == 0 && i > 0 && !(runs[i - 1] == u32::MAX && i + 1 < runs.len()) {
                return Err(MetaError::Invalid(format!("zero-map run {i} is empty")));
            }
            if blocks == 0 {
                return Err(MetaError::Invalid(
                    "zero map of an empty file has runs".into(),
                ));
            }
            let end = at
                .checked_add(u64::from(run))
                .filter(|&end| end <= blocks)
                .ok_or_else(|| {
                    MetaError::Invalid(format!("zero-map runs exceed the file's {blocks} blocks"))
                })?;
            if i % 2 == 1 {
                map.set_zero_range(at, end);
            }
            at = end;
        }
        if at != blocks {
            return Err(MetaError::Invalid(format!(
                "zero-map runs cover {at} of the file's {blocks} blocks"
            )));
        }
        Ok(map)
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
        let version = if self.repeats.is_empty() {
            META_VERSION
        } else {
            META_VERSION_REPEATS
        };
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
        if !self.repeats.is_empty() {
            out.extend_from_slice(&(self.repeats.len() as u32).to_le_bytes());
            for r in &self.repeats {
                out.extend_from_slice(&r.to.to_le_bytes());
                out.extend_from_slice(&r.from.to_le_bytes());
                out.extend_from_slice(&r.len.to_le_bytes());
            }
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// About how much memory the decoded metadata takes.
    pub fn memory_len(&self) -> usize {
        std::mem::size_of::<MetaFile>()
            + std::mem::size_of::<(u64, u64)>() * self.zero.zero.len()
            + std::mem::size_of::<Repeat>() * self.repeats.len()
    }

    /// The length [`MetaFile::encode`] would return, without encoding.
    pub fn encoded_len(&self) -> usize {
        let repeats = match self.repeats.len() {
            0 => 0,
            n => 4 + REPEAT_LEN * n,
        };
        EMPTY_LEN + 4 * self.zero.runs().len() + repeats
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
        if version != META_VERSION && version != META_VERSION_REPEATS {
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
        let mut repeat_count = 0;
        if version == META_VERSION_REPEATS {
            if bytes.len() < runs_end + 4 {
                return Err(MetaError::Truncated);
            }
            let mut p = [0u8; 4];
            p.copy_from_slice(&bytes[runs_end..runs_end + 4]);
            repeat_count = u32::from_le_bytes(p) as usize;
            if repeat_count == 0 {
                return Err(MetaError::Invalid(
                    "version 2 with no repeats (written as version 1)".into(),
                ));
            }
            total = runs_end + 4 + REPEAT_LEN * repeat_count + 4;
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
        };
        // Check the block size before using it to count blocks.
        meta.validate_header()?;
        meta.zero = ZeroMap::from_runs(meta.blocks(), &runs)?;
        if repeat_count > 0 {
            // The length check above bounds the count by the input's size.
            meta.repeats = body[runs_end + 4..]
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
        meta.validate()?;
        Ok(meta)
    }

    fn validate_header(&self) -> Result<(), MetaError> {
        let mut probe = self.clone();
        probe.zero = ZeroMap::new(self.blocks());
        probe.repeats.clear();
        probe.validate()
    }

    /// Whether the metadata still describes a file with these attributes:
    /// size and mtime must match exactly, and ctime too when `strict_ctime`
    /// (a copy that preserves mtimes, `rsync -t` or `cp -p`, changes ctime).
    pub fn matches(
        &self,
        size: u64,
        mtime: (u64, u32),
        ctime: (u64, u32),
        strict_ctime: bool,
    ) -> bool {
        self.file_size == size && self.mtime == mtime && (!strict_ctime || self.ctime == ctime)
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
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> MetaFile {
        let mut zero = ZeroMap::new(10);
        zero.set_zero(0);
        zero.set_zero_range(3, 6);
        zero.set_zero(9);
        MetaFile {
            block_size: 4096,
            file_size: 9 * 4096 + 100,
            mtime: (1_700_000_000, 123_456_789),
            ctime: (1_700_000_001, 5),
            actions: Actions::COMPRESS_AND_COPY,
            compressed_size: 777,
            zero,
            repeats: Vec::new(),
        }
    }

    /// A ZeroMap from a bool-per-block model.
    fn from_bits(bits: &[bool]) -> ZeroMap {
        let mut m = ZeroMap::new(bits.len() as u64);
        for (i, &z) in bits.iter().enumerate() {
            if z {
                m.set_zero(i as u64);
            }
        }
        m
    }

    fn arb_meta() -> impl Strategy<Value = MetaFile> {
        (
            12u32..=20,
            prop::collection::vec(any::<bool>(), 0..300),
            any::<u64>(),
            (any::<u64>(), 0u32..1_000_000_000),
            (any::<u64>(), 0u32..1_000_000_000),
            0u32..16,
            any::<u64>(),
        )
            .prop_flat_map(|(shift, bits, seed, mtime, ctime, acts, csize)| {
                let bs = 1u32 << shift;
                let blocks = bits.len() as u64;
                // Any size whose block count is `blocks`.
                let size = if blocks == 0 {
                    0
                } else {
                    (blocks - 1) * u64::from(bs) + 1 + seed % u64::from(bs)
                };
                Just(MetaFile {
                    block_size: bs,
                    file_size: size,
                    mtime,
                    ctime,
                    actions: Actions::from_bits(acts).unwrap_or_default(),
                    compressed_size: csize,
                    zero: from_bits(&bits),
                    repeats: Vec::new(),
                })
            })
    }

    #[test]
    fn repeats_round_trip_as_version_2_and_clip_to_ranges() {
        let mut m = sample();
        assert_eq!(
            m.encode()[8..12],
            META_VERSION.to_le_bytes(),
            "no repeats: version 1"
        );
        m.repeats = vec![
            Repeat {
                to: 2,
                from: 1,
                len: 1,
            },
            Repeat {
                to: 6,
                from: 1,
                len: 2,
            },
        ];
        m.validate().unwrap_or_else(|e| panic!("{e}"));
        let b = m.encode();
        assert_eq!(b.len(), m.encoded_len());
        assert_eq!(b[8..12], META_VERSION_REPEATS.to_le_bytes());
        assert_eq!(MetaFile::decode(&b).unwrap_or_else(|e| panic!("{e}")), m);
        assert_eq!(m.repeat_bytes(), 3 * 4096);
        // Blocks 6..8 repeat 1..3: the bytes 7*4096-100.. of them, clipped.
        assert_eq!(
            m.repeats_in(7 * 4096 - 100, 1000),
            vec![ByteRepeat {
                to: 7 * 4096 - 100,
                from: 2 * 4096 - 100,
                len: 1000
            }]
        );
        assert_eq!(
            m.repeats_in(0, 9 * 4096),
            vec![
                ByteRepeat {
                    to: 2 * 4096,
                    from: 4096,
                    len: 4096
                },
                ByteRepeat {
                    to: 6 * 4096,
                    from: 4096,
                    len: 8192
                },
            ]
        );
        assert!(m.repeats_in(3 * 4096, 3 * 4096).is_empty());
        for cut in 0..b.len() {
            assert!(MetaFile::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn bad_repeats_are_refused() {
        let bad = [
            // Empty; source not before; overlapping itself; past the last
            // whole block (block 9 is partial); out of order.
            vec![Repeat {
                to: 2,
                from: 1,
                len: 0,
            }],
            vec![Repeat {
                to: 2,
                from: 2,
                len: 1,
            }],
            vec![Repeat {
                to: 2,
                from: 1,
                len: 2,
            }],
            vec![Repeat {
                to: 8,
                from: 1,
                len: 2,
            }],
            vec![
                Repeat {
                    to: 6,
                    from: 1,
                    len: 1,
                },
                Repeat {
                    to: 2,
                    from: 1,
                    len: 1,
                },
            ],
            vec![Repeat {
                to: u64::MAX,
                from: 1,
                len: 1,
            }],
        ];
        for repeats in bad {
            let mut m = sample();
            m.repeats = repeats.clone();
            assert!(m.validate().is_err(), "{repeats:?}");
            assert!(MetaFile::decode(&m.encode()).is_err(), "{repeats:?}");
        }
        // Version 2 announcing no repeats is not canonical.
        let mut b = sample().encode();
        b[8..12].copy_from_slice(&META_VERSION_REPEATS.to_le_bytes());
        let crc_at = b.len() - 4;
        b.truncate(crc_at);
        b.extend_from_slice(&0u32.to_le_bytes());
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        assert!(matches!(MetaFile::decode(&b), Err(MetaError::Invalid(_))));
    }

    proptest! {
        #[test]
        fn round_trip(m in arb_meta()) {
            let bytes = m.encode();
            prop_assert_eq!(bytes.len(), m.encoded_len());
            let back = MetaFile::decode(&bytes).expect("decodes");
            prop_assert_eq!(&back, &m);
            prop_assert_eq!(back.encode(), bytes);
        }

        #[test]
        fn decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = MetaFile::decode(&bytes);
        }

        #[test]
        fn decode_never_panics_with_valid_magic(
            mut bytes in prop::collection::vec(any::<u8>(), 0..512),
            version_ok in any::<bool>(),
            fix_crc in any::<bool>(),
        ) {
            // Random bodies behind a right magic and version, sometimes with
            // a right CRC too, so the field checks are reached.
            let mut input = META_MAGIC.to_vec();
            if version_ok {
                input.extend_from_slice(&META_VERSION.to_le_bytes());
            }
            input.append(&mut bytes);
            if fix_crc && input.len() >= 4 {
                let n = input.len() - 4;
                let crc = crc32fast::hash(&input[..n]);
                input[n..].copy_from_slice(&crc.to_le_bytes());
            }
            if let Ok(m) = MetaFile::decode(&input) {
                prop_assert!(m.validate().is_ok());
                prop_assert_eq!(m.encode(), input);
            }
        }

        #[test]
        fn zero_map_matches_a_model(
            bits in prop::collection::vec(any::<bool>(), 0..400),
            order in any::<u64>(),
        ) {
            // Set the zero blocks in a scrambled order: the general merge
            // path must agree with the in-order one.
            let mut idx: Vec<usize> = (0..bits.len()).filter(|&i| bits[i]).collect();
            let n = idx.len().max(1);
            idx.rotate_left((order as usize) % n);
            if order & 1 == 1 { idx.reverse(); }
            let mut m = ZeroMap::new(bits.len() as u64);
            for i in idx { m.set_zero(i as u64); }
            prop_assert_eq!(&m, &from_bits(&bits));
            for (i, &z) in bits.iter().enumerate() {
                prop_assert_eq!(m.is_zero(i as u64), z);
            }
            prop_assert!(!m.is_zero(bits.len() as u64));
            prop_assert_eq!(m.zero_blocks(), bits.iter().filter(|&&z| z).count() as u64);
            // Exact for random maps: the runs are the bitmap's runs.
            let transitions = bits.windows(2).filter(|w| w[0] != w[1]).count();
            let expect_runs = if bits.is_empty() { 0 }
                else { transitions + 1 + usize::from(bits[0]) };
            prop_assert_eq!(m.runs().len(), expect_runs);
        }

        #[test]
        fn range_is_zero_matches_bytes(
            bits in prop::collection::vec(any::<bool>(), 1..40),
            tail in 1u64..=4096,
            offset in 0u64..45 * 4096,
            len in 0u64..5 * 4096,
        ) {
            let mut m = sample();
            m.file_size = (bits.len() as u64 - 1) * 4096 + tail;
            m.zero = from_bits(&bits);
            let end = offset + len;
            let model = len > 0 && end <= m.file_size
                && (offset / 4096..end.div_ceil(4096)).all(|b| bits[b as usize]);
            prop_assert_eq!(m.range_is_zero(offset, len), model);
        }
    }

    #[test]
    fn every_bit_flip_and_truncation_is_detected() {
        let mut metas = vec![sample()];
        let mut empty = sample();
        empty.file_size = 0;
        empty.zero = ZeroMap::new(0);
        metas.push(empty);
        for m in metas {
            let bytes = m.encode();
            for bit in 0..bytes.len() * 8 {
                let mut b = bytes.clone();
                b[bit / 8] ^= 1 << (bit % 8);
                assert!(MetaFile::decode(&b).is_err(), "flip of bit {bit} accepted");
            }
            for len in 0..bytes.len() {
                assert!(
                    MetaFile::decode(&bytes[..len]).is_err(),
                    "truncation to {len} accepted"
                );
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(MetaFile::decode(&longer).is_err());
        }
    }

    #[test]
    fn decode_errors_name_the_cause() {
        let bytes = sample().encode();
        assert_eq!(MetaFile::decode(&bytes[..20]), Err(MetaError::Truncated));
        assert_eq!(MetaFile::decode(b"GVFSMET"), Err(MetaError::Truncated));
        assert_eq!(MetaFile::decode(b"GVFSBANKxxxx"), Err(MetaError::BadMagic));
        let mut v3 = bytes.clone();
        v3[8] = 3;
        assert_eq!(MetaFile::decode(&v3), Err(MetaError::Version(3)));
        let mut flip = bytes.clone();
        flip[20] ^= 1;
        assert_eq!(MetaFile::decode(&flip), Err(MetaError::Checksum));
        let big = vec![0u8; MAX_META_LEN + 1];
        assert_eq!(
            MetaFile::decode(&big),
            Err(MetaError::TooLarge(MAX_META_LEN as u64 + 1))
        );
    }

    /// Re-signs `bytes` after a deliberate change, so field checks are hit.
    fn resign(mut bytes: Vec<u8>) -> Vec<u8> {
        let n = bytes.len() - 4;
        let crc = crc32fast::hash(&bytes[..n]);
        bytes[n..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    #[test]
    fn invalid_fields_are_refused_even_with_a_good_checksum() {
        let good = sample().encode();
        let cases: Vec<(usize, Vec<u8>)> = vec![
            (12, 3000u32.to_le_bytes().to_vec()),      // block size not 2^n
            (12, 2048u32.to_le_bytes().to_vec()),      // block size too small
            (12, (2u32 << 20).to_le_bytes().to_vec()), // block size too big
            (32, 1_000_000_000u32.to_le_bytes().to_vec()), // mtime ns
            (44, u32::MAX.to_le_bytes().to_vec()),     // ctime ns
            (48, 16u32.to_le_bytes().to_vec()),        // unknown action bit
            (16, (4096u64 * 20).to_le_bytes().to_vec()), // size vs runs
            (64, 1u32.to_le_bytes().to_vec()),         // first run changed
        ];
        for (off, field) in cases {
            let mut b = good.clone();
            b[off..off + field.len()].copy_from_slice(&field);
            let err = MetaFile::decode(&resign(b)).expect_err("accepted");
            assert!(matches!(err, MetaError::Invalid(_)), "{off}: {err:?}");
        }
        // An empty non-first run, even though the total is right.
        let mut m = sample();
        m.zero = ZeroMap::new(10);
        let mut b = m.encode();
        b.truncate(b.len() - 4);
        b[60..64].copy_from_slice(&3u32.to_le_bytes());
        b.truncate(64);
        for run in [5u32, 0, 5] {
            b.extend_from_slice(&run.to_le_bytes());
        }
        b.extend_from_slice(&[0; 4]);
        assert!(matches!(
            MetaFile::decode(&resign(b)),
            Err(MetaError::Invalid(_))
        ));
        // A split marker (u32::MAX, 0) with nothing after it.
        let mut m = sample();
        m.file_size = u64::from(u32::MAX) * 4096;
        m.zero = ZeroMap::new(u64::from(u32::MAX));
        let mut b = m.encode();
        b.truncate(60);
        b.extend_from_slice(&2u32.to_le_bytes());
        for run in [u32::MAX, 0] {
            b.extend_from_slice(&run.to_le_bytes());
        }
        b.extend_from_slice(&[0; 4]);
        assert!(matches!(
            MetaFile::decode(&resign(b)),
            Err(MetaError::Invalid(_))
        ));
    }

    #[test]
    fn range_is_zero_stops_at_end_of_file() {
        let mut m = sample();
        m.file_size = 2 * 4096 + 100;
        m.zero = ZeroMap::new(3);
        m.zero.set_zero_range(0, 3);
        assert!(m.range_is_zero(0, m.file_size));
        assert!(m.range_is_zero(m.file_size - 10, 10));
        assert!(!m.range_is_zero(m.file_size - 10, 11));
        assert!(!m.range_is_zero(m.file_size, 1));
        assert!(!m.range_is_zero(0, 0));
        assert!(!m.range_is_zero(u64::MAX, 1));
        assert!(!m.range_is_zero(1, u64::MAX));
    }

    #[test]
    fn long_runs_split_and_round_trip() {
        let blocks = 3 * u64::from(u32::MAX) + 7;
        let mut zero = ZeroMap::new(blocks);
        zero.set_zero_range(1, 2 * u64::from(u32::MAX) + 5);
        let m = MetaFile {
            block_size: 4096,
            file_size: blocks * 4096,
            mtime: (0, 0),
            ctime: (0, 0),
            actions: Actions::default(),
            compressed_size: 0,
            zero,
            repeats: Vec::new(),
        };
        let runs = m.zero.runs();
        assert_eq!(runs, vec![1, u32::MAX, 0, u32::MAX, 0, 4, u32::MAX, 0, 2]);
        assert_eq!(MetaFile::decode(&m.encode()), Ok(m));
    }

    #[test]
    fn sparse_image_map_is_small() {
        // A 256 MiB image in 4 KiB blocks, ~60% zero in long runs.
        let blocks = (256u64 << 20) / 4096;
        let mut zero = ZeroMap::new(blocks);
        let mut at = 0;
        let mut i = 0u64;
        while at < blocks {
            let data = 200 + (i * 7919) % 1500;
            let zeros = 300 + (i * 104_729) % 2300;
            zero.set_zero_range(at + data, at + data + zeros);
            at += data + zeros;
            i += 1;
        }
        let frac = zero.zero_blocks() as f64 / blocks as f64;
        assert!((0.5..0.7).contains(&frac), "{frac}");
        let m = MetaFile {
            block_size: 4096,
            file_size: 256 << 20,
            mtime: (1, 2),
            ctime: (3, 4),
            actions: Actions::default(),
            compressed_size: 0,
            zero,
            repeats: Vec::new(),
        };
        let len = m.encode().len();
        assert!(len <= 400, "{len} bytes");
        // Exact, not lossy.
        assert_eq!(MetaFile::decode(&m.encode()), Ok(m));
    }

    #[test]
    fn keep_longest_only_forgets() {
        let mut m = ZeroMap::new(100);
        for (s, e) in [(0, 1), (10, 30), (40, 42), (50, 51), (60, 99)] {
            m.set_zero_range(s, e);
        }
        let before = m.clone();
        m.keep_longest(2);
        assert_eq!(m.zero_ranges(), &[(10, 30), (60, 99)]);
        for b in 0..100 {
            assert!(!m.is_zero(b) || before.is_zero(b));
        }
    }

    #[test]
    fn matches_checks_size_mtime_and_optionally_ctime() {
        let m = sample();
        assert!(m.matches(m.file_size, m.mtime, m.ctime, true));
        assert!(m.matches(m.file_size, m.mtime, (9, 9), false));
        assert!(!m.matches(m.file_size, m.mtime, (9, 9), true));
        assert!(!m.matches(m.file_size + 1, m.mtime, m.ctime, false));
        assert!(!m.matches(m.file_size, (m.mtime.0, m.mtime.1 + 1), m.ctime, false));
    }

    #[test]
    fn meta_names() {
        assert_eq!(meta_name("mem.vmss").as_deref(), Some(".mem.vmss.gvfsmeta"));
        assert_eq!(meta_name(".hidden").as_deref(), Some("..hidden.gvfsmeta"));
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a\0b",
            ".x.gvfsmeta",
            "x.gvfsmeta",
            ".gvfsmeta",
        ] {
            assert_eq!(meta_name(bad), None, "{bad:?}");
        }
        let longest = "n".repeat(MAX_NAME_LEN - 1 - META_SUFFIX.len());
        assert_eq!(meta_name(&longest).map(|n| n.len()), Some(MAX_NAME_LEN));
        assert_eq!(meta_name(&format!("{longest}n")), None);
        assert!(is_meta_name(".mem.vmss.gvfsmeta"));
        assert!(is_meta_name("..hidden.gvfsmeta"));
        assert_eq!(described_name(".mem.vmss.gvfsmeta"), Some("mem.vmss"));
        for not in [
            ".gvfsmeta",
            "..gvfsmeta",
            "x.gvfsmeta",
            ".x.gvfsmeta.gvfsmeta",
            "mem",
        ] {
            assert!(!is_meta_name(not), "{not:?}");
        }
        // Every name meta_name gives is a metadata name describing its input.
        for name in ["a", "mem.vmss", ".a", "...", &longest] {
            let m = meta_name(name).expect("valid");
            assert_eq!(described_name(&m), Some(name));
        }
    }

    #[test]
    fn actions_bits() {
        for bits in 0..16 {
            assert_eq!(Actions::from_bits(bits).map(Actions::bits), Some(bits));
        }
        assert_eq!(Actions::from_bits(1 << 4), None);
        assert_eq!(Actions::COMPRESS_AND_COPY.bits(), 15);
    }
}
