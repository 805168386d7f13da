//! Pieces of a chunk as masks ([`Mask`]: bit `i` is bytes
//! `i * PIECE..` of the chunk): what a read touches, runs of them, and the
//! hashed pieces around a run.

use gvfs_ext::CHUNK;

/// The unit readers' own fetches and profiles go by: a page fault of a
/// lazy clone whose image has a working-set profile fetches the pieces its
/// read covers, not its whole chunk, and a profile names pieces. Two of a
/// guest's 4 KiB pages: a resuming guest touches about one page in each
/// of the 64 KiB around it, so a larger piece multiplies the bytes it
/// waits for.
pub const PIECE: u32 = 8 << 10;

/// A set of the pieces of one chunk (bit `i`: bytes `i * PIECE..` of it).
pub(crate) type Mask = u128;
const _: () = assert!(CHUNK / PIECE == Mask::BITS);

/// Pieces `a..=b` as a mask.
pub(crate) fn span_bits(a: u32, b: u32) -> Mask {
    let upto = if b + 1 >= Mask::BITS {
        Mask::MAX
    } else {
        (1 << (b + 1)) - 1
    };
    upto & !((1 << a) - 1)
}

/// Every piece of a chunk of `len` bytes.
pub(crate) fn all_pieces(len: u32) -> Mask {
    if len == 0 {
        0
    } else {
        span_bits(0, (len - 1) / PIECE)
    }
}

/// The pieces of chunk `idx` (of `len` bytes) that `offset..end` touches.
pub(crate) fn piece_mask(idx: usize, len: u32, offset: u64, end: u64) -> Mask {
    let start = idx as u64 * u64::from(CHUNK);
    let lo = offset.max(start) - start;
    let hi = end.min(start + u64::from(len)).saturating_sub(start);
    if hi <= lo {
        return 0;
    }
    span_bits(
        (lo / u64::from(PIECE)) as u32,
        ((hi - 1) / u64::from(PIECE)) as u32,
    )
}

/// The pieces of the metadata's hashed pieces (`HASH_PIECE`) that
/// `run` touches.
pub(crate) fn hashed_pieces_around(run: Mask) -> Mask {
    if run == 0 {
        return 0;
    }
    let per = (gvfs_metafile::hashes::HASH_PIECE / u64::from(PIECE)) as u32;
    let first = run.trailing_zeros() / per * per;
    let last = (Mask::BITS - 1 - run.leading_zeros()) / per * per + per - 1;
    span_bits(first, last.min(Mask::BITS - 1))
}

/// The one run of pieces holding every piece of `mask`.
pub(crate) fn span_of(mask: Mask) -> Mask {
    if mask == 0 {
        0
    } else {
        span_bits(mask.trailing_zeros(), Mask::BITS - 1 - mask.leading_zeros())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_widens_to_the_hashed_pieces_it_touches() {
        assert_eq!(hashed_pieces_around(0), 0);
        // Pieces 2..=126 of 8 KiB: hashed pieces 0..=15 (all 128).
        assert_eq!(hashed_pieces_around(span_bits(2, 126)), Mask::MAX);
        // Piece 9 alone: its hashed piece, pieces 8..=15.
        assert_eq!(hashed_pieces_around(1 << 9), span_bits(8, 15));
        assert_eq!(hashed_pieces_around(span_bits(16, 23)), span_bits(16, 23));
    }
}
