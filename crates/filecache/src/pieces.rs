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

/// Most pieces between two runs a claim joins (fetching them again, when
/// they are here, costs less than a round trip of its own).
pub(crate) const JOIN_GAP: u32 = 2;

/// The runs of consecutive pieces of `mask`, first to last.
pub(crate) fn runs_of(mut mask: Mask) -> Vec<Mask> {
    let mut runs = Vec::new();
    while mask != 0 {
        let a = mask.trailing_zeros();
        let len = (mask >> a).trailing_ones();
        let run = span_bits(a, a + len - 1);
        runs.push(run);
        mask &= !run;
    }
    runs
}

/// `mask` cut at every `per` pieces (windows aligned from the chunk's
/// start): the non-empty parts, first to last.
pub(crate) fn cut(mask: Mask, per: u32) -> Vec<Mask> {
    let per = per.clamp(1, Mask::BITS);
    (0..Mask::BITS.div_ceil(per))
        .map(|w| mask & span_bits(w * per, (w * per + per - 1).min(Mask::BITS - 1)))
        .filter(|&m| m != 0)
        .collect()
}

/// The runs a fetch claims for the pieces of `need` (neither here nor
/// being fetched): each run of `need`, two joined when at most
/// [`JOIN_GAP`] pieces lie between them and none of those is being
/// fetched (`fetching`), so no piece is ever fetched twice at once.
pub(crate) fn claim_runs(need: Mask, fetching: Mask) -> Vec<Mask> {
    let mut out: Vec<Mask> = Vec::new();
    for run in runs_of(need) {
        if let Some(last) = out.last_mut() {
            let end = Mask::BITS - last.leading_zeros();
            let gap = run.trailing_zeros() - end;
            let between = if gap == 0 {
                0
            } else {
                span_bits(end, run.trailing_zeros() - 1)
            };
            if gap <= JOIN_GAP && between & fetching == 0 {
                *last |= between | run;
                continue;
            }
        }
        out.push(run);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_found_and_joined_only_over_short_gaps_nobody_fetches() {
        assert_eq!(cut(0, 8), Vec::<Mask>::new());
        assert_eq!(cut(Mask::MAX, 128), vec![Mask::MAX]);
        assert_eq!(
            cut(Mask::MAX, 32),
            vec![
                span_bits(0, 31),
                span_bits(32, 63),
                span_bits(64, 95),
                span_bits(96, 127)
            ]
        );
        // Windows stay aligned from the chunk's start, whatever the mask.
        assert_eq!(
            cut(span_bits(5, 20) | span_bits(40, 41), 16),
            vec![span_bits(5, 15), span_bits(16, 20), span_bits(40, 41)]
        );
        assert_eq!(cut(span_bits(0, 9), 3).len(), 4);
        assert_eq!(runs_of(0), Vec::<Mask>::new());
        assert_eq!(runs_of(Mask::MAX), vec![Mask::MAX]);
        let m = span_bits(0, 2) | span_bits(5, 5) | span_bits(9, 12) | 1 << 127;
        assert_eq!(
            runs_of(m),
            vec![span_bits(0, 2), 1 << 5, span_bits(9, 12), 1 << 127]
        );
        // Gaps of 2 (3..=4) joined, of 3 (6..=8) not.
        assert_eq!(
            claim_runs(m, 0),
            vec![span_bits(0, 5), span_bits(9, 12), 1 << 127]
        );
        // A short gap with a piece being fetched in it stays a gap.
        assert_eq!(
            claim_runs(m, 1 << 4),
            vec![span_bits(0, 2), 1 << 5, span_bits(9, 12), 1 << 127]
        );
        for (need, fetching) in [(m, 1 << 4), (m, 0), (Mask::MAX, 0)] {
            let runs = claim_runs(need, fetching);
            let all = runs.iter().fold(0, |a, r| a | r);
            assert_eq!(all & need, need);
            assert_eq!(all & fetching, 0);
        }
    }

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
