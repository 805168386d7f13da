//! A bitmap of the (at most 256) sub-blocks of one block.

use std::ops::Range;

/// One bit per sub-block; bit `i` is sub-block `i` of the block.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SubBlockMask([u64; 4]);

impl SubBlockMask {
    /// No sub-block.
    pub const EMPTY: SubBlockMask = SubBlockMask([0; 4]);

    /// The sub-blocks in `range` (indices must be below 256).
    pub fn range(range: Range<u32>) -> SubBlockMask {
        let (start, end) = (range.start.min(256), range.end.min(256));
        if start >= end {
            return SubBlockMask::EMPTY;
        }
        SubBlockMask(std::array::from_fn(|w| {
            let (lo, hi) = (w as u32 * 64, w as u32 * 64 + 64);
            let (a, b) = (start.clamp(lo, hi) - lo, end.clamp(lo, hi) - lo);
            match b - a {
                0 => 0,
                64 => u64::MAX,
                n => ((1u64 << n) - 1) << a,
            }
        }))
    }
    /// Whether sub-block `i` is in the set.
    pub fn contains(&self, i: u32) -> bool {
        i < 256 && self.0[(i / 64) as usize] & (1 << (i % 64)) != 0
    }
    /// Adds sub-block `i` (ignored if `i >= 256`).
    pub fn insert(&mut self, i: u32) {
        if i < 256 {
            self.0[(i / 64) as usize] |= 1 << (i % 64);
        }
    }
    /// Removes sub-block `i`.
    pub fn remove(&mut self, i: u32) {
        if i < 256 {
            self.0[(i / 64) as usize] &= !(1 << (i % 64));
        }
    }
    /// Whether no sub-block is set.
    pub fn is_empty(&self) -> bool {
        self.0 == [0; 4]
    }
    /// Number of sub-blocks set.
    pub fn count(&self) -> u32 {
        self.0.iter().map(|w| w.count_ones()).sum()
    }
    /// Intersection.
    pub fn and(self, o: SubBlockMask) -> SubBlockMask {
        SubBlockMask(std::array::from_fn(|i| self.0[i] & o.0[i]))
    }
    /// Union.
    pub fn or(self, o: SubBlockMask) -> SubBlockMask {
        SubBlockMask(std::array::from_fn(|i| self.0[i] | o.0[i]))
    }
    /// `self` without the sub-blocks of `o`.
    pub fn without(self, o: SubBlockMask) -> SubBlockMask {
        SubBlockMask(std::array::from_fn(|i| self.0[i] & !o.0[i]))
    }
    /// Whether every sub-block of `o` is in `self`.
    pub fn contains_all(&self, o: SubBlockMask) -> bool {
        o.without(*self).is_empty()
    }
    /// Indices set, ascending (one step per bit set: this runs on every
    /// cache hit).
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().enumerate().flat_map(|(w, &word)| {
            let mut bits = word;
            std::iter::from_fn(move || {
                if bits == 0 {
                    return None;
                }
                let i = bits.trailing_zeros();
                bits &= bits - 1;
                Some(w as u32 * 64 + i)
            })
        })
    }
    /// Maximal runs of consecutive set sub-blocks, ascending.
    pub fn runs(&self) -> Vec<Range<u32>> {
        let mut out: Vec<Range<u32>> = Vec::new();
        for i in self.iter() {
            match out.last_mut() {
                Some(r) if r.end == i => r.end = i + 1,
                _ => out.push(i..i + 1),
            }
        }
        out
    }
    /// Little-endian bitmap of `bytes` bytes (bit `i` in byte `i / 8`).
    pub(crate) fn to_bytes(self, out: &mut [u8]) {
        for (i, b) in out.iter_mut().enumerate() {
            *b = (self.0[i / 8] >> ((i % 8) * 8)) as u8;
        }
    }
    /// Parses a bitmap written by `to_bytes`; `None` if a bit at or beyond
    /// `n` (the sub-blocks per block) is set.
    pub(crate) fn from_bytes(bytes: &[u8], n: u32) -> Option<SubBlockMask> {
        let mut m = SubBlockMask::EMPTY;
        for (i, &b) in bytes.iter().enumerate().take(32) {
            m.0[i / 8] |= u64::from(b) << ((i % 8) * 8);
        }
        if bytes.len() > 32 && bytes[32..].iter().any(|&b| b != 0) {
            return None;
        }
        if !SubBlockMask::range(0..n.min(256)).contains_all(m) {
            return None;
        }
        Some(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn runs_coalesce() {
        let mut m = SubBlockMask::range(2..5);
        m.insert(7);
        m.insert(255);
        assert_eq!(m.runs(), vec![2..5, 7..8, 255..256]);
        assert_eq!(m.count(), 5);
    }

    proptest! {
        #[test]
        fn iter_and_range_agree_with_contains(
            bits in proptest::collection::vec(0u32..256, 0..40),
            a in 0u32..260,
            b in 0u32..260,
        ) {
            let mut m = SubBlockMask::EMPTY;
            for i in &bits { m.insert(*i); }
            let want: Vec<u32> = (0..256).filter(|&i| m.contains(i)).collect();
            prop_assert_eq!(m.iter().collect::<Vec<_>>(), want);
            let r = SubBlockMask::range(a..b);
            let want: Vec<u32> = (a.min(256)..b.min(256)).collect();
            prop_assert_eq!(r.iter().collect::<Vec<_>>(), want);
        }

        #[test]
        fn bytes_round_trip(bits in proptest::collection::vec(0u32..40, 0..20)) {
            let mut m = SubBlockMask::EMPTY;
            for b in &bits { m.insert(*b); }
            let mut buf = [0u8; 5];
            m.to_bytes(&mut buf);
            prop_assert_eq!(SubBlockMask::from_bytes(&buf, 40), Some(m));
            let out_of_range = bits.iter().any(|&b| b >= 20);
            prop_assert_eq!(SubBlockMask::from_bytes(&buf, 20).is_none(), out_of_range);
        }
    }
}
