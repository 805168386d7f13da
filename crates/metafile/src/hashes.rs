//! A file's content hashes: a fingerprint per non-zero block and a BLAKE3
//! hash per 64 KiB piece (`format.rs` has the byte layout and what they
//! are for), with what it takes to find one among them.

use crate::zeromap::ZeroMap;

/// Bytes of a piece hash (BLAKE3).
pub const HASH_LEN: usize = 32;
/// A piece's content hash.
pub type PieceHash = [u8; HASH_LEN];
/// Bytes of a block fingerprint (the start of its BLAKE3).
pub const FINGERPRINT_LEN: usize = 8;
/// A block's fingerprint.
pub type Fingerprint = [u8; FINGERPRINT_LEN];
/// The span of a piece hash.
pub const HASH_PIECE: u64 = 64 << 10;

/// A file's block fingerprints and piece hashes, with what it takes to
/// find a block's fingerprint or a piece's hash among them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockHashes {
    pub(crate) fingerprints: Vec<Fingerprint>,
    /// The hashes of the pieces that are not zero pieces, in file order.
    pub(crate) pieces: Vec<PieceHash>,
    /// Zero blocks before each zero range of the map they go with, and
    /// after the last one.
    pub(crate) zeros_before: Vec<u64>,
    /// The runs of zero pieces, half-open and sorted.
    pub(crate) zero_pieces: Vec<(u64, u64)>,
    /// Zero pieces before each run of them, and after the last one.
    pub(crate) zero_pieces_before: Vec<u64>,
    /// The hash of a zero piece, and of the last piece's zeros.
    pub(crate) zero_hash: PieceHash,
    pub(crate) last_zero_hash: PieceHash,
    /// Pieces of the file, zero pieces included.
    pub(crate) piece_count: u64,
}

impl BlockHashes {
    /// The `fingerprints` of the non-zero blocks of `zero` (blocks of
    /// `block_size` bytes), in block order, and the hashes of all the
    /// `pieces` of a file of `size` bytes (those of zero pieces are left
    /// out); `None` unless there is exactly one of each for each.
    pub fn new(
        fingerprints: Vec<Fingerprint>,
        pieces: Vec<PieceHash>,
        zero: &ZeroMap,
        block_size: u32,
        size: u64,
    ) -> Option<Self> {
        Self::from_list(fingerprints, pieces, zero, block_size, size, true)
    }

    /// As [`BlockHashes::new`], with the hashes of every piece (`all`)
    /// or of the pieces that are not zero pieces only.
    pub(crate) fn from_list(
        fingerprints: Vec<Fingerprint>,
        pieces: Vec<PieceHash>,
        zero: &ZeroMap,
        block_size: u32,
        size: u64,
        all: bool,
    ) -> Option<Self> {
        let piece_count = size.div_ceil(HASH_PIECE);
        let zero_pieces = zero_piece_runs(zero, block_size, size);
        let pieces: Vec<PieceHash> = if all {
            if pieces.len() as u64 != piece_count {
                return None;
            }
            let mut runs_left = zero_pieces.iter().peekable();
            (0u64..)
                .zip(pieces)
                .filter(|(p, _)| {
                    while runs_left.next_if(|r| r.1 <= *p).is_some() {}
                    runs_left.peek().is_none_or(|r| r.0 > *p)
                })
                .map(|(_, h)| h)
                .collect()
        } else {
            pieces
        };
        let zeros: u64 = zero_pieces.iter().map(|(a, b)| b - a).sum();
        if fingerprints.len() as u64 != zero.blocks() - zero.zero_blocks()
            || pieces.len() as u64 != piece_count - zeros
        {
            return None;
        }
        let counts_before = |ranges: &[(u64, u64)]| {
            let mut before = Vec::with_capacity(ranges.len() + 1);
            let mut n = 0;
            for &(a, b) in ranges {
                before.push(n);
                n += b - a;
            }
            before.push(n);
            before
        };
        let last_len = size - piece_count.saturating_sub(1) * HASH_PIECE;
        Some(Self {
            fingerprints,
            pieces,
            zeros_before: counts_before(zero.zero_ranges()),
            zero_pieces_before: counts_before(&zero_pieces),
            zero_pieces,
            zero_hash: piece_hash(&[0; HASH_PIECE as usize]),
            last_zero_hash: piece_hash(&vec![0; last_len as usize]),
            piece_count,
        })
    }

    /// The fingerprints, in block order.
    pub fn fingerprints(&self) -> &[Fingerprint] {
        &self.fingerprints
    }

    /// The hashes of the pieces that are not zero pieces, in file order.
    pub fn pieces(&self) -> &[PieceHash] {
        &self.pieces
    }

    /// The hash of piece `piece`.
    pub(crate) fn piece(&self, piece: u64) -> Option<&PieceHash> {
        let i = self.zero_pieces.partition_point(|r| r.1 <= piece);
        if self.zero_pieces.get(i).is_some_and(|r| r.0 <= piece) {
            return Some(if piece + 1 == self.piece_count {
                &self.last_zero_hash
            } else {
                &self.zero_hash
            });
        }
        let rank = piece - self.zero_pieces_before.get(i)?;
        self.pieces.get(usize::try_from(rank).ok()?)
    }
}

/// The runs of zero pieces of a file of `size` bytes whose blocks of
/// `block_size` bytes `zero` maps: pieces all of whose bytes lie in one
/// run of zero blocks.
pub(crate) fn zero_piece_runs(zero: &ZeroMap, block_size: u32, size: u64) -> Vec<(u64, u64)> {
    let bs = u64::from(block_size);
    let last = size.div_ceil(HASH_PIECE);
    zero.zero_ranges()
        .iter()
        .filter_map(|&(a, b)| {
            let (from, to) = (a.saturating_mul(bs), b.saturating_mul(bs));
            let first = from.div_ceil(HASH_PIECE);
            let end = if to >= size { last } else { to / HASH_PIECE };
            (first < end).then_some((first, end))
        })
        .collect()
}

/// The BLAKE3 of `bytes`: a piece's hash.
pub fn piece_hash(bytes: &[u8]) -> PieceHash {
    *blake3::hash(bytes).as_bytes()
}

/// The start of the BLAKE3 of `bytes`: a block's fingerprint.
pub fn fingerprint(bytes: &[u8]) -> Fingerprint {
    let mut f = [0u8; FINGERPRINT_LEN];
    f.copy_from_slice(&blake3::hash(bytes).as_bytes()[..FINGERPRINT_LEN]);
    f
}
