//! Cache geometry: how capacity is cut into banks, sets, frames, blocks and
//! sub-blocks, and which set a `(file handle, block index)` lives in.

use std::ops::Range;

use crate::error::GeometryError;

/// Smallest block size (4 KiB).
pub const MIN_BLOCK_SIZE: u32 = 4 << 10;
/// Largest block size (1 MiB).
pub const MAX_BLOCK_SIZE: u32 = 1 << 20;
/// Smallest sub-block size.
pub const MIN_SUB_BLOCK_SIZE: u32 = 512;
/// Most sub-blocks in one block (the valid/dirty bitmaps are at most 256 bits).
pub const MAX_SUB_BLOCKS: u32 = 256;
/// Most banks (bank files).
pub const MAX_BANKS: u32 = 4096;
/// Highest associativity (frames per set).
pub const MAX_WAYS: u32 = 1024;
/// Most frames in one bank; keeps tag-table offsets far from overflow.
const MAX_FRAMES_PER_BANK: u64 = 1 << 32;

/// Requested cache geometry, as it comes from the CLI or TOML; turn it into a
/// [`Geometry`] with [`Geometry::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GeometryConfig {
    /// Total data capacity in bytes; rounded down to whole sets per bank.
    pub capacity: u64,
    /// Number of banks (files).
    pub banks: u32,
    /// Associativity: frames per set.
    pub ways: u32,
    /// Block size in bytes: a power of two in 4 KiB..=1 MiB.
    pub block_size: u32,
    /// Sub-block size in bytes: the unit of the valid and dirty bits; a power
    /// of two, at least 512, at most the block size, at most 256 per block.
    pub sub_block_size: u32,
}

impl Default for GeometryConfig {
    /// 1 GiB in 16 banks, 16-way, 64 KiB blocks of 4 KiB sub-blocks.
    fn default() -> Self {
        GeometryConfig {
            capacity: 1 << 30,
            banks: 16,
            ways: 16,
            block_size: 64 << 10,
            sub_block_size: 4 << 10,
        }
    }
}

/// A validated geometry. Every value is a checked invariant: block and
/// sub-block sizes are powers of two in range, and every bank has at least
/// one set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    banks: u32,
    ways: u32,
    block_size: u32,
    sub_block_size: u32,
    sets_per_bank: u64,
}

impl Geometry {
    /// Validates `config`.
    pub fn new(config: GeometryConfig) -> Result<Geometry, GeometryError> {
        let GeometryConfig {
            capacity,
            banks,
            ways,
            block_size,
            sub_block_size,
        } = config;
        if !block_size.is_power_of_two() || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size)
        {
            return Err(GeometryError::BlockSize(block_size));
        }
        if !sub_block_size.is_power_of_two()
            || !(MIN_SUB_BLOCK_SIZE..=block_size).contains(&sub_block_size)
        {
            return Err(GeometryError::SubBlockSize {
                sub_block: sub_block_size,
                block: block_size,
            });
        }
        if block_size / sub_block_size > MAX_SUB_BLOCKS {
            return Err(GeometryError::TooManySubBlocks(block_size / sub_block_size));
        }
        if !(1..=MAX_BANKS).contains(&banks) {
            return Err(GeometryError::Banks(banks));
        }
        if !(1..=MAX_WAYS).contains(&ways) {
            return Err(GeometryError::Ways(ways));
        }
        let set_bytes_all_banks = u64::from(banks) * u64::from(ways) * u64::from(block_size);
        let sets_per_bank = capacity / set_bytes_all_banks;
        if sets_per_bank == 0 {
            return Err(GeometryError::CapacityTooSmall {
                capacity,
                minimum: set_bytes_all_banks,
            });
        }
        if sets_per_bank.saturating_mul(u64::from(ways)) > MAX_FRAMES_PER_BANK {
            return Err(GeometryError::CapacityTooLarge(capacity));
        }
        Ok(Geometry {
            banks,
            ways,
            block_size,
            sub_block_size,
            sets_per_bank,
        })
    }

    /// Builds a geometry from its exact parts (used when reading a bank header).
    pub(crate) fn from_parts(
        banks: u32,
        ways: u32,
        block_size: u32,
        sub_block_size: u32,
        sets_per_bank: u64,
    ) -> Result<Geometry, GeometryError> {
        let capacity = sets_per_bank
            .checked_mul(u64::from(banks) * u64::from(ways) * u64::from(block_size))
            .ok_or(GeometryError::CapacityTooLarge(u64::MAX))?;
        let g = Geometry::new(GeometryConfig {
            capacity,
            banks,
            ways,
            block_size,
            sub_block_size,
        })?;
        debug_assert_eq!(g.sets_per_bank, sets_per_bank);
        Ok(g)
    }

    /// Number of banks.
    pub fn banks(&self) -> u32 {
        self.banks
    }
    /// Frames per set.
    pub fn ways(&self) -> u32 {
        self.ways
    }
    /// Block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }
    /// Sub-block size in bytes.
    pub fn sub_block_size(&self) -> u32 {
        self.sub_block_size
    }
    /// Sub-blocks per block (1..=256).
    pub fn sub_blocks_per_block(&self) -> u32 {
        self.block_size / self.sub_block_size
    }
    /// Sets in one bank.
    pub fn sets_per_bank(&self) -> u64 {
        self.sets_per_bank
    }
    /// Sets in the whole cache.
    pub fn total_sets(&self) -> u64 {
        self.sets_per_bank * u64::from(self.banks)
    }
    /// Frames in one bank.
    pub fn frames_per_bank(&self) -> u64 {
        self.sets_per_bank * u64::from(self.ways)
    }
    /// Frames in the whole cache.
    pub fn total_frames(&self) -> u64 {
        self.frames_per_bank() * u64::from(self.banks)
    }
    /// Effective data capacity in bytes (the requested one rounded down).
    pub fn capacity(&self) -> u64 {
        self.total_frames() * u64::from(self.block_size)
    }

    /// The set holding block `block` of the file `fh`:
    /// `(hash(fh) + block) mod total_sets`, so consecutive blocks of a file
    /// land in consecutive sets (spatial locality, as in the GVFS paper). The
    /// hash is FNV-1a 64, fixed because set placement is part of the on-disk
    /// format.
    pub fn set_index(&self, fh: &[u8], block: u64) -> u64 {
        fnv1a64(fh).wrapping_add(block) % self.total_sets()
    }

    /// The bank a set lives in, and the set's index inside that bank.
    pub fn bank_of_set(&self, set: u64) -> (u32, u64) {
        // total_sets <= 4096 * 2^32, so the quotient fits in u32 (< banks).
        ((set / self.sets_per_bank) as u32, set % self.sets_per_bank)
    }

    /// Sub-blocks touched by the byte range `offset..offset + len` of a block
    /// (`len > 0`, range already checked to lie inside the block).
    pub(crate) fn sub_blocks_touched(&self, offset: u32, len: u32) -> Range<u32> {
        offset / self.sub_block_size..(offset + len - 1) / self.sub_block_size + 1
    }
}

/// FNV-1a, 64 bit. Stable across runs and platforms.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The tiny geometry unit tests use: 2 banks x 4 sets x 2 ways of 16 KiB
/// blocks with 4 KiB sub-blocks, small enough to force evictions.
#[cfg(test)]
pub(crate) fn tiny_for_tests() -> Geometry {
    Geometry::new(GeometryConfig {
        capacity: 2 * 4 * 2 * 16384,
        banks: 2,
        ways: 2,
        block_size: 16384,
        sub_block_size: 4096,
    })
    .expect("valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(capacity: u64, banks: u32, ways: u32, block: u32, sub: u32) -> GeometryConfig {
        GeometryConfig {
            capacity,
            banks,
            ways,
            block_size: block,
            sub_block_size: sub,
        }
    }

    #[test]
    fn default_is_valid() {
        let g = Geometry::new(GeometryConfig::default()).expect("default geometry");
        assert_eq!(g.capacity(), 1 << 30);
        assert_eq!(g.sub_blocks_per_block(), 16);
        assert_eq!(g.total_sets(), (1 << 30) / (64 << 10) / 16);
    }

    #[test]
    fn rejects_bad_values() {
        use GeometryError::*;
        let e = |c| Geometry::new(c).expect_err("must be rejected");
        assert_eq!(e(cfg(1 << 30, 1, 1, 3000, 512)), BlockSize(3000));
        assert_eq!(e(cfg(1 << 30, 1, 1, 2048, 512)), BlockSize(2048));
        assert_eq!(e(cfg(1 << 30, 1, 1, 2 << 20, 4096)), BlockSize(2 << 20));
        assert!(matches!(
            e(cfg(1 << 30, 1, 1, 8192, 256)),
            SubBlockSize { .. }
        ));
        assert!(matches!(
            e(cfg(1 << 30, 1, 1, 8192, 16384)),
            SubBlockSize { .. }
        ));
        assert_eq!(e(cfg(1 << 30, 1, 1, 1 << 20, 2048)), TooManySubBlocks(512));
        assert_eq!(e(cfg(1 << 30, 0, 1, 4096, 4096)), Banks(0));
        assert_eq!(e(cfg(1 << 30, 1, 0, 4096, 4096)), Ways(0));
        assert!(matches!(
            e(cfg(4096, 2, 1, 4096, 4096)),
            CapacityTooSmall { .. }
        ));
    }

    #[test]
    fn capacity_rounds_down() {
        let g = Geometry::new(cfg(100_000, 2, 2, 4096, 4096)).expect("valid");
        assert_eq!(g.sets_per_bank(), 100_000 / (2 * 2 * 4096));
        assert!(g.capacity() <= 100_000);
    }

    #[test]
    fn consecutive_blocks_land_in_consecutive_sets() {
        let g = Geometry::new(cfg(2 * 4 * 2 * 16384, 2, 2, 16384, 4096)).expect("valid");
        let fh = b"some handle";
        for b in 0..20u64 {
            let s0 = g.set_index(fh, b);
            let s1 = g.set_index(fh, b + 1);
            assert_eq!((s0 + 1) % g.total_sets(), s1);
            let (bank, local) = g.bank_of_set(s0);
            assert!(bank < g.banks() && local < g.sets_per_bank());
        }
    }
}
