//! A profile learned here merged with the one the fetch started with.
//!
//! This clone's order goes first: it is what a guest resumed from this
//! image touched last, in the order it touched it. What the known profile
//! named that this clone did not touch follows, in its order, up to a
//! quarter more than this clone's own pieces, or to seven eighths of the
//! known profile, whichever is more: what later guests no longer touch
//! drifts back and falls off, so a profile follows the image's guests and
//! does not grow with each one, and one clone that learned little (its
//! window closed while it was stalled: a cut link, a busy host) takes at
//! most an eighth off. Each hop keeps the profile last put (the last PUT
//! wins), so the merge is done once, here.

use std::collections::HashSet;

/// `order` (this clone's pieces, each once), then the pieces of `known`
/// not in it, at most `cap`, and at most 5/4 of `order`'s length or 7/8 of
/// `known`'s, whichever is more, in all.
pub(crate) fn merge(known: &[u32], order: &[u32], cap: usize) -> Vec<u32> {
    let limit = cap.min((order.len().saturating_mul(5) / 4).max(known.len().saturating_mul(7) / 8));
    let ours: HashSet<u32> = order.iter().copied().collect();
    order
        .iter()
        .copied()
        .chain(known.iter().copied().filter(|p| !ours.contains(p)))
        .take(limit)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_clones_order_goes_first_and_the_rest_is_bounded() {
        let known = vec![1, 2, 3, 4, 5, 6, 7, 8];
        // This clone touched 8 first, then 20, 21, 22: then what it did
        // not touch, up to 7/8 of the known profile (7 in all; 5/4 of its
        // own would be 5).
        assert_eq!(
            merge(&known, &[8, 20, 21, 22], 100),
            vec![8, 20, 21, 22, 1, 2, 3]
        );
        // The cap holds over everything, this clone's order included.
        assert_eq!(merge(&known, &[8, 20, 21, 22], 3), vec![8, 20, 21]);
        // Nothing known: this clone's order.
        assert_eq!(merge(&[], &[5, 3], 100), vec![5, 3]);
        // The same set in the same order: the same profile (not sent).
        assert_eq!(merge(&known, &known, 100), known);
    }

    #[test]
    fn a_clone_that_learned_little_takes_an_eighth_off_at_most() {
        // A known profile of 5,440 pieces; a clone stalled by a cut link
        // learned 129 before its window closed.
        let known: Vec<u32> = (0..5440).collect();
        let little: Vec<u32> = (10_000..10_129).collect();
        let merged = merge(&known, &little, 1 << 16);
        assert_eq!(merged.len(), 5440 * 7 / 8);
        assert_eq!(merged[..129], little[..]);
        assert_eq!(merged[129..], known[..5440 * 7 / 8 - 129]);
    }

    #[test]
    fn a_piece_no_longer_touched_falls_off_after_two_merges() {
        // The first guest touched a0..a7; the next two touch other pieces.
        let a: Vec<u32> = (0..8).collect();
        let b: Vec<u32> = (100..108).collect();
        let c: Vec<u32> = (200..208).collect();
        let once = merge(&a, &b, 1000);
        assert_eq!(once[..8], b[..]);
        assert_eq!(once[8..], [0, 1]);
        let twice = merge(&once, &c, 1000);
        assert_eq!(twice[..8], c[..]);
        assert_eq!(twice[8..], [100, 101]);
        assert!(!twice.contains(&0), "{twice:?}");
        // Pieces every guest touches stay, first; a clone that touched
        // fewer takes at most an eighth off (8 of 10).
        let again = merge(&twice, &[200, 300, 201, 301], 1000);
        assert_eq!(again, vec![200, 300, 201, 301, 202, 203, 204, 205]);
    }
}
