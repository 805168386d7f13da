//! Sequential readers: a file's reader that goes through it in file order
//! (a copy of an image, a VM reading another image start to end) is bulk,
//! not demand. Its READs are fetched as `Class::Bulk`, and so is the
//! file's background stream, so that they fill what other work leaves of
//! the link rather than go before it.
//!
//! A reader is sequential after [`BULK_READS`] READs in order covering at
//! least [`BULK_BYTES`], of [`BULK_MEAN_READ`] or more on average. "In
//! order" allows [`SEQ_BACK`] behind the furthest byte read so far (the
//! kernel's read-ahead sends a reader's READs several at once, and they
//! arrive in any order) and [`SEQ_SLACK`] past it. A READ further off ends
//! the run, and the reader is demand again (the stream goes back to
//! background). A guest's page faults are not a copy even where they walk
//! through its memory in order: they are a page or a few at a time (the
//! mean READ size tells them apart), and where they jump about within a
//! region most land behind its furthest byte. The entry's side of it
//! (`CachedFile::note_read`) is in `read.rs`.

/// READs in order before a reader is taken for sequential.
pub const BULK_READS: u32 = 32;
/// Bytes those READs must cover.
pub const BULK_BYTES: u64 = 8 << 20;
/// How far past the furthest byte read so far a READ may start and still
/// be in order.
pub const SEQ_SLACK: u64 = 8 << 20;
/// How far behind it.
pub const SEQ_BACK: u64 = 4 << 20;
/// The least mean READ size of a sequential reader.
pub const BULK_MEAN_READ: u64 = 64 << 10;

/// The run of in-order READs a file's readers are in.
#[derive(Debug, Default)]
pub(crate) struct SeqReads {
    /// Where the run starts (its lowest offset).
    start: u64,
    /// The furthest byte it read, plus one.
    furthest: u64,
    /// READs in it.
    in_order: u32,
    /// Bytes those READs asked for.
    bytes: u64,
}

impl SeqReads {
    /// Notes a READ of `offset..offset + len`.
    pub(crate) fn read(&mut self, offset: u64, len: u64) {
        let end = offset.saturating_add(len);
        let near = offset.saturating_add(SEQ_BACK) >= self.furthest
            && offset <= self.furthest.saturating_add(SEQ_SLACK);
        if self.in_order == 0 || !near {
            *self = SeqReads {
                start: offset,
                furthest: end,
                in_order: 1,
                bytes: len,
            };
            return;
        }
        self.start = self.start.min(offset);
        self.furthest = self.furthest.max(end);
        self.in_order = self.in_order.saturating_add(1);
        self.bytes = self.bytes.saturating_add(len);
    }

    /// Whether the reader is sequential.
    pub(crate) fn bulk(&self) -> bool {
        self.in_order >= BULK_READS
            && self.furthest - self.start >= BULK_BYTES
            && self.bytes / u64::from(self.in_order) >= BULK_MEAN_READ
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1 << 10;

    #[test]
    fn a_reader_in_file_order_is_sequential_after_enough_reads() {
        let mut s = SeqReads::default();
        // 128 KiB READs, pairs arriving swapped (read-ahead).
        for i in 0..BULK_READS as u64 {
            assert!(!s.bulk(), "after {i} reads");
            let at = (64 << 20) + (i ^ 1) * 256 * KIB;
            s.read(at, 256 * KIB);
        }
        assert!(s.bulk());
        // A jump far back ends the run.
        s.read(0, 4 * KIB);
        assert!(!s.bulk());
    }

    #[test]
    fn scattered_or_small_reads_are_not() {
        let mut s = SeqReads::default();
        // A guest's faults: pages all over a 1 GiB image.
        for i in 0..200u64 {
            s.read((i * 7919 % 1024) << 20, 4 * KIB);
        }
        assert!(!s.bulk());
        // Many READs in order, but of 4 KiB: under BULK_BYTES.
        let mut s = SeqReads::default();
        for i in 0..BULK_READS as u64 * 2 {
            s.read(i * 4 * KIB, 4 * KIB);
        }
        assert!(!s.bulk());
    }

    #[test]
    fn a_guest_walking_its_memory_or_jumping_about_a_region_is_not() {
        // Page faults in order through 32 MiB: a page at a time.
        let mut s = SeqReads::default();
        for i in 0..8192u64 {
            s.read(i * 4 * KIB, 4 * KIB);
        }
        assert!(!s.bulk());
        // READs of 256 KiB all over a 12 MiB region, many times over.
        let mut s = SeqReads::default();
        let mut x = 7u64;
        for _ in 0..2000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            s.read(
                (x >> 33) % (12 << 20) / (256 * KIB) * (256 * KIB),
                256 * KIB,
            );
            assert!(!s.bulk());
        }
    }
}
