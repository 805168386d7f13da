//! Which blocks of a file are all zeros (a metadata file's zero map),
//! decoded from and encoded to its run-length form (`format.rs` has the
//! byte layout).

use crate::error::MetaError;

/// Which blocks of a file are all zeros: a bitmap over `blocks()` blocks,
/// kept as sorted, disjoint, non-adjacent ranges of zero blocks so that its
/// memory follows the number of runs, never the file size (a metadata file
/// can claim any size).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ZeroMap {
    pub(crate) blocks: u64,
    /// Half-open `[start, end)` ranges of zero blocks, sorted, with a gap of
    /// at least one non-zero block between neighbours.
    pub(crate) zero: Vec<(u64, u64)>,
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
    pub(crate) fn runs(&self) -> Vec<u32> {
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
    pub(crate) fn from_runs(blocks: u64, runs: &[u32]) -> Result<ZeroMap, MetaError> {
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
