//! The on-disk format of a bank file (`bank-NNN.gvfs`). All integers are
//! little-endian. Format version 2.
//!
//! ```text
//! bank file
//! +---------------------------+ 0
//! | header (HEADER_REGION)    |   4096 bytes: the header's 68, and a cut
//! |                           |   mark at 2048 while one is needed
//! +---------------------------+ 4096
//! | tag table                 |   frames_per_bank x 2 slots x tag_len
//! +---------------------------+ data_offset = round_up(4096 + tags, block_size)
//! | data region               |   frames_per_bank x block_size, frame order
//! +---------------------------+
//! ```
//! Frame `f` of a bank is way `f % ways` of local set `f / ways`. Each frame
//! has two tag slots (`f * 2` and `f * 2 + 1`) written alternately: the slot
//! holding the tag made durable by the last sync is never overwritten before
//! the next sync, so a torn tag write falls back to it. The valid slot with
//! the higher generation is the current tag.
//!
//! Header:
//! ```text
//!  off len field
//!    0   8 magic "GVFSBANK"
//!    8   4 format version (FORMAT_VERSION, 2)
//!   12   4 bank index
//!   16   4 bank count
//!   20   4 ways
//!   24   4 block size
//!   28   4 sub-block size
//!   32   8 sets per bank
//!   40   8 write verifier (the same in every bank)
//!   48   8 epoch (incremented by every open)
//!   56   4 shutdown state: 1 = open (in use), 2 = closed cleanly
//!   60   4 sync state: 1 = synced, 2 = dirty writes since the last sync
//!   64   4 CRC32 of bytes 0..64
//! ```
//!
//! Tag slot (`n` = sub-blocks per block, `B` = ceil(n / 8)); an all-zero slot
//! was never written; a tag with no valid sub-block marks an emptied frame:
//! ```text
//!  off        len field
//!    0          4 magic "GVTG"
//!    4          1 file handle length (0..=64)
//!    5          3 zero
//!    8         64 file handle, zero padded
//!   72          8 block index
//!   80          8 LRU stamp
//!   88          8 generation (per frame, +1 on every tag write)
//!   96          4 n (must match the geometry)
//!  100          4 dirty end: where the last dirty write into the block ended
//!                 (bytes from the block's start, <= block size; 0 when the
//!                 block holds no dirty data), so a crash keeps the file size
//!                 the client wrote, trailing zeros included
//!  104          B valid bitmap (bit i = sub-block i)
//!  104+B        B dirty bitmap (subset of valid | partial)
//!  104+2B       B committed bitmap (subset of dirty): dirty sub-blocks whose
//!                 content was durable at the last sync
//!  104+3B       B partial bitmap (subset of dirty, disjoint from valid):
//!                 sub-blocks of which only the extent below is known, the
//!                 bytes a client wrote (the rest is upstream's, not cached)
//!  104+4B     4*n CRC32 of each valid sub-block's data, or of a partial
//!                 sub-block's extent bytes (0 otherwise)
//!  104+4B+4n  8*n extent of each partial sub-block: u32 start, u32 end
//!                 (bytes inside the sub-block, start < end <= sub-block
//!                 size; both 0 unless partial)
//!  104+4B+12n   4 CRC32 of the slot bytes before it
//! ```
//! The slot length is rounded up to a multiple of 64 bytes; padding is zero.

use crate::geometry::Geometry;
use crate::mask::SubBlockMask;

/// Bank file magic.
pub const BANK_MAGIC: [u8; 8] = *b"GVFSBANK";
/// Tag magic.
pub const TAG_MAGIC: [u8; 4] = *b"GVTG";
/// Current format version.
pub const FORMAT_VERSION: u32 = 2;
/// Bytes reserved for the header at the start of each bank.
pub const HEADER_REGION: u64 = 4096;
/// Bytes of the header actually written.
pub const HEADER_LEN: usize = 68;
/// Longest NFSv3 file handle (RFC 1813 section 2.5, `NFS3_FHSIZE`).
pub const MAX_FH_LEN: usize = 64;

const TAG_FIXED: usize = 104;

/// Shutdown state recorded in a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shutdown {
    Open = 1,
    Clean = 2,
}

/// Sync state recorded in a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SyncState {
    Synced = 1,
    DirtyUnsynced = 2,
}

/// Where in the header region a bank file found cut short records how much
/// of it was there, before it is grown back to its length: the evidence
/// must outlive a start that fails (or is killed) before recovery ends.
///
/// ```text
///  off  len field
/// 2048    8 magic "GVFSCUT1"
/// 2056    8 bytes of the file that were there when the cut was found
/// 2064    4 CRC32 of bytes 2048..2064
/// ```
pub(crate) const CUT_MARK_AT: u64 = 2048;
/// Bytes of the cut mark.
pub(crate) const CUT_MARK_LEN: usize = 20;
const CUT_MAGIC: [u8; 8] = *b"GVFSCUT1";

/// The cut mark recording `sound_len` bytes.
pub(crate) fn encode_cut_mark(sound_len: u64) -> [u8; CUT_MARK_LEN] {
    let mut b = [0u8; CUT_MARK_LEN];
    b[0..8].copy_from_slice(&CUT_MAGIC);
    b[8..16].copy_from_slice(&sound_len.to_le_bytes());
    let crc = crc32fast::hash(&b[0..16]);
    b[16..20].copy_from_slice(&crc.to_le_bytes());
    b
}

/// The length a cut mark records, if `b` is one.
pub(crate) fn decode_cut_mark(b: &[u8]) -> Option<u64> {
    if b.len() < CUT_MARK_LEN || b[0..8] != CUT_MAGIC || crc32fast::hash(&b[0..16]) != u32_at(b, 16)
    {
        return None;
    }
    Some(u64_at(b, 8))
}

/// A decoded bank header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) bank: u32,
    pub(crate) banks: u32,
    pub(crate) ways: u32,
    pub(crate) block_size: u32,
    pub(crate) sub_block_size: u32,
    pub(crate) sets_per_bank: u64,
    pub(crate) verifier: [u8; 8],
    pub(crate) epoch: u64,
    pub(crate) shutdown: Shutdown,
    pub(crate) sync: SyncState,
}

/// Why a header could not be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeaderError {
    /// All zero: never written.
    Blank,
    /// Bad magic, checksum or field value.
    Corrupt,
    /// Intact, but a version this code does not read.
    Version(u32),
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

impl Header {
    pub(crate) fn new(geo: &Geometry, bank: u32, verifier: [u8; 8], epoch: u64) -> Header {
        Header {
            bank,
            banks: geo.banks(),
            ways: geo.ways(),
            block_size: geo.block_size(),
            sub_block_size: geo.sub_block_size(),
            sets_per_bank: geo.sets_per_bank(),
            verifier,
            epoch,
            shutdown: Shutdown::Open,
            sync: SyncState::Synced,
        }
    }

    pub(crate) fn matches(&self, geo: &Geometry, bank: u32) -> bool {
        self.bank == bank
            && self.banks == geo.banks()
            && self.ways == geo.ways()
            && self.block_size == geo.block_size()
            && self.sub_block_size == geo.sub_block_size()
            && self.sets_per_bank == geo.sets_per_bank()
    }

    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&BANK_MAGIC);
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.bank.to_le_bytes());
        b[16..20].copy_from_slice(&self.banks.to_le_bytes());
        b[20..24].copy_from_slice(&self.ways.to_le_bytes());
        b[24..28].copy_from_slice(&self.block_size.to_le_bytes());
        b[28..32].copy_from_slice(&self.sub_block_size.to_le_bytes());
        b[32..40].copy_from_slice(&self.sets_per_bank.to_le_bytes());
        b[40..48].copy_from_slice(&self.verifier);
        b[48..56].copy_from_slice(&self.epoch.to_le_bytes());
        b[56..60].copy_from_slice(&(self.shutdown as u32).to_le_bytes());
        b[60..64].copy_from_slice(&(self.sync as u32).to_le_bytes());
        let crc = crc32fast::hash(&b[0..64]);
        b[64..68].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Header, HeaderError> {
        if b.len() < HEADER_LEN {
            return Err(HeaderError::Corrupt);
        }
        if b[..HEADER_LEN].iter().all(|&x| x == 0) {
            return Err(HeaderError::Blank);
        }
        if b[0..8] != BANK_MAGIC || crc32fast::hash(&b[0..64]) != u32_at(b, 64) {
            return Err(HeaderError::Corrupt);
        }
        let version = u32_at(b, 8);
        if version != FORMAT_VERSION {
            return Err(HeaderError::Version(version));
        }
        let shutdown = match u32_at(b, 56) {
            1 => Shutdown::Open,
            2 => Shutdown::Clean,
            _ => return Err(HeaderError::Corrupt),
        };
        let sync = match u32_at(b, 60) {
            1 => SyncState::Synced,
            2 => SyncState::DirtyUnsynced,
            _ => return Err(HeaderError::Corrupt),
        };
        let mut verifier = [0u8; 8];
        verifier.copy_from_slice(&b[40..48]);
        Ok(Header {
            bank: u32_at(b, 12),
            banks: u32_at(b, 16),
            ways: u32_at(b, 20),
            block_size: u32_at(b, 24),
            sub_block_size: u32_at(b, 28),
            sets_per_bank: u64_at(b, 32),
            verifier,
            epoch: u64_at(b, 48),
            shutdown,
            sync,
        })
    }
}

/// Offsets inside a bank file for one geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BankLayout {
    pub(crate) sub_blocks: u32,
    pub(crate) bitmap_len: usize,
    pub(crate) tag_len: usize,
    pub(crate) block_size: u64,
    pub(crate) frames: u64,
    pub(crate) data_offset: u64,
}

impl BankLayout {
    pub(crate) fn new(geo: &Geometry) -> BankLayout {
        let n = geo.sub_blocks_per_block();
        let bitmap_len = n.div_ceil(8) as usize;
        let tag_len = (TAG_FIXED + 4 * bitmap_len + 12 * n as usize + 4).next_multiple_of(64);
        let frames = geo.frames_per_bank();
        let block_size = u64::from(geo.block_size());
        let data_offset =
            (HEADER_REGION + 2 * frames * tag_len as u64).next_multiple_of(block_size);
        BankLayout {
            sub_blocks: n,
            bitmap_len,
            tag_len,
            block_size,
            frames,
            data_offset,
        }
    }
    pub(crate) fn tag_offset(&self, frame_in_bank: u64, slot: u8) -> u64 {
        HEADER_REGION + (frame_in_bank * 2 + u64::from(slot)) * self.tag_len as u64
    }
    pub(crate) fn data_offset(&self, frame_in_bank: u64) -> u64 {
        self.data_offset + frame_in_bank * self.block_size
    }
    pub(crate) fn file_len(&self) -> u64 {
        self.data_offset + self.frames * self.block_size
    }
    #[cfg(test)]
    pub(crate) fn tag_table_len(&self) -> u64 {
        2 * self.frames * self.tag_len as u64
    }
}

/// A decoded, occupied tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tag {
    pub(crate) fh: Vec<u8>,
    pub(crate) block: u64,
    pub(crate) lru: u64,
    pub(crate) generation: u64,
    pub(crate) dirty_end: u32,
    pub(crate) valid: SubBlockMask,
    pub(crate) dirty: SubBlockMask,
    pub(crate) committed: SubBlockMask,
    pub(crate) partial: SubBlockMask,
    pub(crate) crcs: Vec<u32>,
    /// Per sub-block `(start, end)` inside it; `(0, 0)` unless partial.
    pub(crate) extents: Vec<(u32, u32)>,
}

/// The bytes inside sub-block `sb` that a frame or tag vouches for (and
/// checksums): all `sub_block_size` of them when the sub-block is valid, its
/// extent when partial, none when it holds nothing.
pub(crate) fn held_span(
    valid: &SubBlockMask,
    partial: &SubBlockMask,
    extents: &[(u32, u32)],
    sb: u32,
    sub_block_size: usize,
) -> Option<(usize, usize)> {
    if valid.contains(sb) {
        Some((0, sub_block_size))
    } else if partial.contains(sb) {
        let (a, b) = extents[sb as usize];
        Some((a as usize, b as usize))
    } else {
        None
    }
}

/// Why a tag slot holds no usable tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TagError {
    /// All zero: empty frame.
    Empty,
    /// Torn or corrupt.
    Corrupt,
}

impl Tag {
    /// The bytes of sub-block `sb` this tag vouches for ([`held_span`]).
    pub(crate) fn span(&self, sb: u32, sub_block_size: usize) -> Option<(usize, usize)> {
        held_span(
            &self.valid,
            &self.partial,
            &self.extents,
            sb,
            sub_block_size,
        )
    }

    pub(crate) fn encode(&self, layout: &BankLayout, out: &mut [u8]) {
        let n = layout.sub_blocks as usize;
        let bl = layout.bitmap_len;
        out.fill(0);
        out[0..4].copy_from_slice(&TAG_MAGIC);
        let fh_len = self.fh.len().min(MAX_FH_LEN);
        out[4] = fh_len as u8;
        out[8..8 + fh_len].copy_from_slice(&self.fh[..fh_len]);
        out[72..80].copy_from_slice(&self.block.to_le_bytes());
        out[80..88].copy_from_slice(&self.lru.to_le_bytes());
        out[88..96].copy_from_slice(&self.generation.to_le_bytes());
        out[96..100].copy_from_slice(&(n as u32).to_le_bytes());
        out[100..104].copy_from_slice(&self.dirty_end.to_le_bytes());
        let f = TAG_FIXED;
        self.valid.to_bytes(&mut out[f..f + bl]);
        self.dirty.to_bytes(&mut out[f + bl..f + 2 * bl]);
        self.committed.to_bytes(&mut out[f + 2 * bl..f + 3 * bl]);
        self.partial.to_bytes(&mut out[f + 3 * bl..f + 4 * bl]);
        let crc_off = f + 4 * bl;
        let ext_off = crc_off + 4 * n;
        for i in 0..n {
            let c = self.crcs.get(i).copied().unwrap_or(0);
            out[crc_off + 4 * i..crc_off + 4 * i + 4].copy_from_slice(&c.to_le_bytes());
            let (lo, hi) = self.extents.get(i).copied().unwrap_or((0, 0));
            out[ext_off + 8 * i..ext_off + 8 * i + 4].copy_from_slice(&lo.to_le_bytes());
            out[ext_off + 8 * i + 4..ext_off + 8 * i + 8].copy_from_slice(&hi.to_le_bytes());
        }
        let end = ext_off + 8 * n;
        let crc = crc32fast::hash(&out[..end]);
        out[end..end + 4].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decodes and checks a slot; every length and bitmap is validated
    /// against `layout` before use.
    pub(crate) fn decode(layout: &BankLayout, b: &[u8]) -> Result<Tag, TagError> {
        if b.len() != layout.tag_len {
            return Err(TagError::Corrupt);
        }
        if b.iter().all(|&x| x == 0) {
            return Err(TagError::Empty);
        }
        let n = layout.sub_blocks as usize;
        let bl = layout.bitmap_len;
        let f = TAG_FIXED;
        let crc_off = f + 4 * bl;
        let ext_off = crc_off + 4 * n;
        let end = ext_off + 8 * n;
        if b[0..4] != TAG_MAGIC || crc32fast::hash(&b[..end]) != u32_at(b, end) {
            return Err(TagError::Corrupt);
        }
        let fh_len = usize::from(b[4]);
        if fh_len > MAX_FH_LEN
            || b[5..8] != [0; 3]
            || b[8 + fh_len..72].iter().any(|&x| x != 0)
            || u32_at(b, 96) as usize != n
            || u64::from(u32_at(b, 100)) > layout.block_size
            || b[end + 4..].iter().any(|&x| x != 0)
        {
            return Err(TagError::Corrupt);
        }
        let n32 = layout.sub_blocks;
        let valid = SubBlockMask::from_bytes(&b[f..f + bl], n32).ok_or(TagError::Corrupt)?;
        let dirty =
            SubBlockMask::from_bytes(&b[f + bl..f + 2 * bl], n32).ok_or(TagError::Corrupt)?;
        let committed =
            SubBlockMask::from_bytes(&b[f + 2 * bl..f + 3 * bl], n32).ok_or(TagError::Corrupt)?;
        let partial =
            SubBlockMask::from_bytes(&b[f + 3 * bl..crc_off], n32).ok_or(TagError::Corrupt)?;
        if !valid.or(partial).contains_all(dirty)
            || !dirty.contains_all(committed)
            || !dirty.contains_all(partial)
            || !valid.and(partial).is_empty()
        {
            return Err(TagError::Corrupt);
        }
        let sbs = (layout.block_size / u64::from(n32)) as u32;
        let crcs: Vec<u32> = (0..n).map(|i| u32_at(b, crc_off + 4 * i)).collect();
        let mut extents = Vec::with_capacity(n);
        for i in 0..n {
            let e = (u32_at(b, ext_off + 8 * i), u32_at(b, ext_off + 8 * i + 4));
            let ok = if partial.contains(i as u32) {
                e.0 < e.1 && e.1 <= sbs
            } else {
                e == (0, 0)
            };
            if !ok {
                return Err(TagError::Corrupt);
            }
            extents.push(e);
        }
        Ok(Tag {
            fh: b[8..8 + fh_len].to_vec(),
            block: u64_at(b, 72),
            lru: u64_at(b, 80),
            generation: u64_at(b, 88),
            dirty_end: u32_at(b, 100),
            valid,
            dirty,
            committed,
            partial,
            crcs,
            extents,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::GeometryConfig;
    use proptest::prelude::*;

    fn geo() -> Geometry {
        crate::geometry::tiny_for_tests()
    }

    #[test]
    fn layout_is_block_aligned() {
        let l = BankLayout::new(&geo());
        assert_eq!(l.tag_len, 192);
        assert_eq!(l.tag_offset(3, 1), HEADER_REGION + 7 * 192);
        assert_eq!(l.data_offset % 16384, 0);
        assert!(l.data_offset >= HEADER_REGION + l.tag_table_len());
        assert_eq!(l.file_len(), l.data_offset + 8 * 16384);
        let g = Geometry::new(GeometryConfig {
            capacity: 1 << 30,
            banks: 1,
            ways: 4,
            block_size: 1 << 20,
            sub_block_size: 4096,
        })
        .expect("valid");
        let l = BankLayout::new(&g);
        assert_eq!(l.tag_len % 64, 0);
        assert!(l.tag_len >= TAG_FIXED + 4 * 32 + 12 * 256 + 4);
    }

    #[test]
    fn header_round_trip_and_corruption() {
        let g = geo();
        let mut h = Header::new(&g, 1, *b"verifier", 7);
        h.sync = SyncState::DirtyUnsynced;
        let b = h.encode();
        assert_eq!(Header::decode(&b), Ok(h));
        assert!(h.matches(&g, 1) && !h.matches(&g, 0));
        assert_eq!(Header::decode(&[0u8; HEADER_LEN]), Err(HeaderError::Blank));
        for i in 0..HEADER_LEN {
            let mut c = b;
            c[i] ^= 0x40;
            assert!(Header::decode(&c).is_err(), "flip at {i} undetected");
        }
    }

    fn arb_tag() -> impl Strategy<Value = Tag> {
        (
            proptest::collection::vec(any::<u8>(), 0..=64),
            (any::<u64>(), any::<u64>(), 0u32..=16384),
            any::<u64>(),
            (0u8..16, 0u8..16),
            any::<u8>(),
            any::<u8>(),
            proptest::collection::vec(any::<u32>(), 4),
            proptest::collection::vec((0u32..4095, 1u32..4096), 4),
        )
            .prop_map(
                |(fh, (block, generation, dirty_end), lru, (v, p), d, c, mut crcs, ext)| {
                    let valid = mask4(v);
                    let partial = mask4(p).without(valid);
                    let dirty = mask4(d).and(valid).or(partial);
                    let committed = mask4(c).and(dirty);
                    let mut extents = vec![(0, 0); 4];
                    for (i, crc) in crcs.iter_mut().enumerate() {
                        let i32 = i as u32;
                        if partial.contains(i32) {
                            let (a, len) = ext[i];
                            extents[i] = (a, (a + len).min(4096).max(a + 1));
                        } else if !valid.contains(i32) {
                            *crc = 0;
                        }
                    }
                    Tag {
                        fh,
                        block,
                        lru,
                        generation,
                        dirty_end,
                        valid,
                        dirty,
                        committed,
                        partial,
                        crcs,
                        extents,
                    }
                },
            )
    }

    fn mask4(bits: u8) -> SubBlockMask {
        let mut m = SubBlockMask::EMPTY;
        for i in 0..4 {
            if bits & (1 << i) != 0 {
                m.insert(i);
            }
        }
        m
    }

    fn l_len() -> usize {
        BankLayout::new(&geo()).tag_len
    }

    proptest! {
        #[test]
        fn tag_round_trip(tag in arb_tag()) {
            let l = BankLayout::new(&geo());
            let mut buf = vec![0u8; l.tag_len];
            tag.encode(&l, &mut buf);
            prop_assert_eq!(Tag::decode(&l, &buf), Ok(tag));
        }

        #[test]
        fn tag_corruption_detected(tag in arb_tag(), at in 0usize..l_len(), bit in 0u8..8) {
            let l = BankLayout::new(&geo());
            let mut buf = vec![0u8; l.tag_len];
            tag.encode(&l, &mut buf);
            buf[at] ^= 1 << bit;
            prop_assert!(Tag::decode(&l, &buf).is_err());
        }

        #[test]
        fn torn_tag_detected(tag in arb_tag(), keep in 0usize..l_len()) {
            let l = BankLayout::new(&geo());
            let mut new = vec![0u8; l.tag_len];
            tag.encode(&l, &mut new);
            let mut torn = vec![0u8; l.tag_len];
            torn[..keep].copy_from_slice(&new[..keep]);
            let r = Tag::decode(&l, &torn);
            prop_assert!(r.is_err() || r == Ok(tag));
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 192)) {
            let l = BankLayout::new(&geo());
            let _ = Tag::decode(&l, &bytes);
            let _ = Header::decode(&bytes);
        }
    }
}
