use super::*;
use crate::geometry::GeometryConfig;
use crate::storage::{FaultyStorage, MemStorage};

const FH: &[u8] = b"fh-1";

pub(super) fn stored(r: Result<WriteOutcome>) {
    assert_eq!(r.expect("write"), WriteOutcome::Stored);
}

pub(super) fn geo() -> Geometry {
    crate::geometry::tiny_for_tests()
}

/// Opens a store on (clones of) `banks`, after a shutdown of kind `unclean`.
pub(super) fn open_as<S: Storage + Clone + 'static>(
    banks: &[S],
    unclean: UncleanShutdown,
) -> (BlockStore, RecoveryReport) {
    let s = banks
        .iter()
        .map(|m| Box::new(m.clone()) as Box<dyn Storage>)
        .collect();
    let options = OpenOptions {
        unclean,
        ..OpenOptions::default()
    };
    BlockStore::open(s, geo(), options).expect("open")
}

pub(super) fn open(mem: &[MemStorage]) -> (BlockStore, RecoveryReport) {
    open_as(mem, UncleanShutdown::Unknown)
}

/// Flips the bits of the byte at `pos` of `storage`.
pub(super) fn flip(storage: &dyn Storage, pos: u64) {
    let mut b = [0u8; 1];
    storage.read_at(&mut b, pos).expect("read");
    storage.write_at(&[!b[0]], pos).expect("write");
}

pub(super) fn mems() -> Vec<MemStorage> {
    vec![MemStorage::new(), MemStorage::new()]
}

#[test]
fn read_range_into_fills_hits_and_leaves_misses() {
    let (s, _) = open(&mems());
    let bs = 16384u64;
    // Block 0 whole, block 1 absent, block 2 only its first sub-block.
    stored(s.write(FH, 0, 0, &[1; 16384], WriteMode::Clean));
    stored(s.write(FH, 2, 0, &[3; 4096], WriteMode::Clean));
    let offset = bs - 100;
    let mut buf = vec![9u8; (bs + 100 + 50) as usize];
    let hits = s.read_range_into(FH, offset, &mut buf).expect("read");
    assert_eq!(hits, [true, false, true]);
    assert!(buf[..100].iter().all(|&b| b == 1));
    assert!(buf[100..100 + bs as usize].iter().all(|&b| b == 9));
    assert!(buf[100 + bs as usize..].iter().all(|&b| b == 3));
    // Past the valid sub-block of block 2: a miss, untouched.
    let mut tail = [9u8; 10];
    assert!(!s.read_into(FH, 2, 4096, &mut tail).expect("read"));
    assert_eq!(tail, [9; 10]);
}

#[test]
fn read_range_now_stops_at_the_first_block_it_cannot_read_at_once() {
    let (s, _) = open(&mems());
    let bs = 16384u64;
    stored(s.write(FH, 0, 0, &[1; 16384], WriteMode::Clean));
    stored(s.write(FH, 1, 0, &[2; 16384], WriteMode::Clean));
    stored(s.write(FH, 3, 0, &[4; 16384], WriteMode::Clean));
    let before = s.stats();
    let offset = bs - 100;
    let mut buf = vec![9u8; (3 * bs) as usize];
    // Blocks 0 and 1 are hits, block 2 is not: stop there.
    assert_eq!(s.read_range_now(FH, offset, &mut buf).expect("read"), 2);
    assert!(buf[..100].iter().all(|&b| b == 1));
    assert!(buf[100..100 + bs as usize].iter().all(|&b| b == 2));
    let after = s.stats();
    assert_eq!(after.hits - before.hits, 2);
    assert_eq!(after.misses, before.misses, "a block not read is no miss");
    // Someone else holding the store: nothing read, nothing waited for.
    assert_eq!(s.all_cached_now(FH, 0..2).expect("ask"), Some(true));
    assert_eq!(s.all_cached_now(FH, 1..4).expect("ask"), Some(false));
    let held = s.inner.lock().expect("lock");
    assert_eq!(s.read_range_now(FH, 0, &mut buf[..10]).expect("read"), 0);
    assert_eq!(s.all_cached_now(FH, 0..2).expect("ask"), None);
    drop(held);
    // A backend that cannot read without blocking declines every block.
    let faulty: Vec<Box<dyn Storage>> = mems()
        .into_iter()
        .map(|m| Box::new(FaultyStorage::new(m)) as Box<dyn Storage>)
        .collect();
    let (f, _) = BlockStore::open(faulty, geo(), OpenOptions::default()).expect("open");
    stored(f.write(FH, 0, 0, &[1; 16384], WriteMode::Clean));
    assert_eq!(f.read_range_now(FH, 0, &mut buf[..10]).expect("read"), 0);
    assert_eq!(
        f.read_range_into(FH, 0, &mut buf[..10]).expect("read"),
        [true]
    );
}

#[test]
fn partial_sub_block_rule() {
    let (s, _) = open(&mems());
    // A dirty write into part of an uncached sub-block keeps just its
    // bytes: dirty, not valid, so a read of it misses.
    stored(s.write(FH, 0, 100, &[1; 10], WriteMode::Dirty));
    assert_eq!(
        s.valid_sub_blocks(FH, 0).expect("valid"),
        SubBlockMask::EMPTY
    );
    assert_eq!(s.read(FH, 0, 100, 10).expect("read"), None);
    assert_eq!(s.stats().dirty_bytes, 10);
    let extent = |s: &BlockStore| {
        let d = s.dirty_data(FH, 0).expect("dirty").expect("some");
        assert_eq!(
            d.end,
            d.extents
                .last()
                .map_or(0, |e| e.offset + e.data.len() as u32)
        );
        d.extents
            .iter()
            .map(|e| (e.offset, e.data.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(extent(&s), [(100, vec![1; 10])]);
    // Touching and overlapping writes grow the extent; a gap is refused
    // whole.
    stored(s.write(FH, 0, 110, &[2; 5], WriteMode::Dirty));
    stored(s.write(FH, 0, 95, &[3; 6], WriteMode::Dirty));
    let mut want = vec![3u8; 6];
    want.extend([1; 9]);
    want.extend([2; 5]);
    assert_eq!(extent(&s), [(95, want.clone())]);
    let e = s
        .write(FH, 0, 200, &[4; 8000], WriteMode::Dirty)
        .expect_err("gap");
    assert!(matches!(e, Error::PartialSubBlockWrite { sub_block: 0 }));
    assert_eq!(extent(&s), [(95, want.clone())]);
    // A partial clean fill is skipped; a whole one merges around the
    // extent and makes the sub-block valid, still dirty.
    stored(s.write(FH, 0, 0, &[7; 50], WriteMode::Clean));
    assert_eq!(s.read(FH, 0, 0, 1).expect("read"), None);
    stored(s.write(FH, 0, 0, &[7; 8192], WriteMode::Clean));
    let got = s.read(FH, 0, 93, 24).expect("read").expect("hit");
    let mut expect = vec![7u8, 7];
    expect.extend(&want);
    expect.extend([7, 7]);
    assert_eq!(got, expect);
    assert_eq!(s.read(FH, 0, 4096, 1).expect("read"), Some(vec![7]));
    let ranges = &s.dirty_blocks(Some(FH)).expect("dirty")[0].ranges;
    assert_eq!((ranges.len(), &ranges[0]), (1, &(0..4096)));
    // Now a partial dirty write is a read-modify-write.
    stored(s.write(FH, 0, 100, &[5; 2], WriteMode::Dirty));
    assert_eq!(s.read(FH, 0, 99, 4).expect("read"), Some(vec![3, 5, 5, 1]));
    // A whole dirty write over a partial sub-block makes it valid.
    stored(s.write(FH, 1, 10, &[6; 10], WriteMode::Dirty));
    stored(s.write(FH, 1, 0, &[8; 4096], WriteMode::Dirty));
    assert_eq!(s.read(FH, 1, 0, 4096).expect("read"), Some(vec![8; 4096]));
    // Written back, a partial sub-block is forgotten.
    stored(s.write(FH, 2, 4096 + 7, &[9; 3], WriteMode::Dirty));
    let d = s.dirty_data(FH, 2).expect("dirty").expect("some");
    assert_eq!(d.end, 4096 + 10);
    s.mark_clean(&d).expect("clean");
    assert!(
        !s.dirty_blocks(Some(FH))
            .expect("dirty")
            .iter()
            .any(|b| b.block == 2)
    );
    assert_eq!(s.dirty_data(FH, 2).expect("dirty"), None);
    assert!(matches!(
        s.write(FH, 0, 16000, &[0; 1000], WriteMode::Clean),
        Err(Error::RangeOutsideBlock { .. })
    ));
    assert!(matches!(
        s.write(&[0; 65], 0, 0, &[0; 1], WriteMode::Clean),
        Err(Error::FileHandleTooLong(65))
    ));
}

#[test]
fn dirty_frames_are_never_evicted() {
    let (s, _) = open(&mems());
    let g = geo();
    // Three blocks of different files in one set of two ways.
    let target = g.set_index(b"a", 0);
    let mut fhs = Vec::new();
    for i in 0u32.. {
        let fh = i.to_le_bytes().to_vec();
        if g.set_index(&fh, 0) == target {
            fhs.push(fh);
            if fhs.len() == 3 {
                break;
            }
        }
    }
    for fh in &fhs[..2] {
        let w = s
            .write(fh, 0, 0, &[7; 4096], WriteMode::Dirty)
            .expect("write");
        assert_eq!(w, WriteOutcome::Stored);
    }
    let w = s
        .write(&fhs[2], 0, 0, &[8; 4096], WriteMode::Dirty)
        .expect("write");
    let WriteOutcome::NeedsWriteBack(victim) = w else {
        panic!("expected a write-back request, got {w:?}");
    };
    assert_eq!(victim.fh.as_bytes(), &fhs[0][..]);
    assert_eq!(victim.ranges, std::iter::once(0..4096).collect::<Vec<_>>());
    let d = s.dirty_data(&fhs[0], 0).expect("dirty").expect("some");
    assert_eq!(
        d.extents,
        vec![DirtyExtent {
            offset: 0,
            data: vec![7; 4096]
        }]
    );
    s.mark_clean(&d).expect("clean");
    let w = s
        .write(&fhs[2], 0, 0, &[8; 4096], WriteMode::Dirty)
        .expect("write");
    assert_eq!(w, WriteOutcome::Stored);
    assert_eq!(s.stats().evictions, 1);
    assert_eq!(s.read(&fhs[0], 0, 0, 1).expect("read"), None);
    assert_eq!(s.read(&fhs[1], 0, 0, 1).expect("read"), Some(vec![7]));
}

#[test]
fn mark_clean_keeps_rewritten_sub_blocks_dirty() {
    let (s, _) = open(&mems());
    stored(s.write(FH, 3, 0, &[1; 8192], WriteMode::Dirty));
    let d = s.dirty_data(FH, 3).expect("dirty").expect("some");
    stored(s.write(FH, 3, 4096, &[2; 4096], WriteMode::Dirty));
    s.mark_clean(&d).expect("clean");
    let left = s.dirty_blocks(Some(FH)).expect("dirty");
    assert_eq!(
        left,
        vec![DirtyBlock {
            fh: FileHandle::from_checked(FH),
            block: 3,
            ranges: std::iter::once(4096..8192).collect()
        }]
    );
    assert_eq!(s.stats().dirty_bytes, 4096);
}

#[test]
fn truncate_and_invalidate() {
    let (s, _) = open(&mems());
    for b in 0..3 {
        stored(s.write(FH, b, 0, &[9; 16384], WriteMode::Dirty));
    }
    stored(s.write(b"other", 0, 0, &[5; 4096], WriteMode::Clean));
    s.truncate(FH, 16384 + 5000).expect("truncate");
    assert_eq!(s.read(FH, 2, 0, 1).expect("read"), None);
    assert_eq!(
        s.valid_sub_blocks(FH, 1).expect("v"),
        SubBlockMask::range(0..2)
    );
    let tail = s.read(FH, 1, 4096, 4096).expect("read").expect("hit");
    assert!(tail[..904].iter().all(|&b| b == 9) && tail[904..].iter().all(|&b| b == 0));
    assert_eq!(s.invalidate(b"other", false).expect("inv"), 4096);
    assert_eq!(s.invalidate(FH, false).expect("inv"), 0, "dirty data stays");
    assert_eq!(s.invalidate(FH, true).expect("inv"), 16384 + 8192);
    assert_eq!(s.stats().frames_in_use, 0);
}

#[test]
fn warm_after_clean_close_and_verifier_kept() {
    let m = mems();
    let (s, r) = open(&m);
    assert!(r.new_cache);
    stored(s.write(FH, 1, 0, &[4; 16384], WriteMode::Dirty));
    let v = s.verifier();
    s.close().expect("close");
    let (s, r) = open(&m);
    assert!(!r.verifier_changed && r.unclean_banks == 0, "{r:?}");
    assert_eq!(s.verifier(), v);
    assert_eq!(s.read(FH, 1, 0, 16384).expect("read"), Some(vec![4; 16384]));
    assert_eq!(s.dirty_blocks(None).expect("dirty").len(), 1);
}

#[test]
fn nothing_is_written_after_a_close() {
    let m = mems();
    let (s, _) = open(&m);
    stored(s.write(FH, 1, 0, &[4; 16384], WriteMode::Dirty));
    s.close_shared().expect("close");
    // A late write (one that passed a layer's own check just before
    // the close) is refused, not written under a "clean" header.
    assert!(matches!(
        s.write(FH, 2, 0, &[5; 16384], WriteMode::Dirty),
        Err(Error::Closed)
    ));
    s.close_shared().expect("closing twice is harmless");
    drop(s);
    let (s, r) = open(&m);
    assert_eq!(r.unclean_banks, 0, "{r:?}");
    assert_eq!(s.read(FH, 2, 0, 16384).expect("read"), None);
    assert_eq!(s.read(FH, 1, 0, 16384).expect("read"), Some(vec![4; 16384]));
}

#[test]
fn partial_extents_and_dirty_end_survive_a_crash_and_truncate() {
    let m = mems();
    let (s, _) = open(&m);
    // Trailing zeros written by the client, and a partial extent.
    stored(s.write(FH, 0, 0, &[0; 4096], WriteMode::Dirty));
    stored(s.write(FH, 1, 5000, &[6; 20], WriteMode::Dirty));
    s.sync().expect("sync");
    drop(s); // crash after the sync (COMMIT): everything kept
    let (s, r) = open(&m);
    assert!(!r.verifier_changed && r.dirty_sub_blocks_lost == 0, "{r:?}");
    let d0 = s.dirty_data(FH, 0).expect("dirty").expect("some");
    assert_eq!(d0.end, 4096);
    let d1 = s.dirty_data(FH, 1).expect("dirty").expect("some");
    assert_eq!(d1.end, 5020);
    assert_eq!(d1.extents.len(), 1);
    assert_eq!(
        (d1.extents[0].offset, &d1.extents[0].data[..]),
        (5000, &[6u8; 20][..])
    );
    // Truncating into the extent clips it and the end.
    s.truncate(FH, 16384 + 5010).expect("truncate");
    let d1 = s.dirty_data(FH, 1).expect("dirty").expect("some");
    assert_eq!((d1.end, d1.extents[0].data.len()), (5010, 10));
    s.truncate(FH, 16384 + 4999).expect("truncate");
    assert_eq!(s.dirty_data(FH, 1).expect("dirty"), None);
    assert!(!s.has_file(b"other").expect("has"));
    // A torn extent that was not committed is dropped on open.
    stored(s.write(FH, 2, 100, &[1; 10], WriteMode::Dirty));
    drop(s);
    let (s, r) = open(&m);
    assert!(r.verifier_changed, "{r:?}");
    assert!(s.dirty_data(FH, 2).expect("dirty").is_some());
}

#[test]
fn unsynced_dirty_write_changes_verifier_synced_does_not() {
    let m = mems();
    let (s, _) = open(&m);
    stored(s.write(FH, 0, 0, &[1; 4096], WriteMode::Dirty));
    s.sync().expect("sync");
    let v = s.verifier();
    drop(s); // crash after sync: nothing lost
    let (s, r) = open(&m);
    assert!(!r.verifier_changed, "{r:?}");
    assert_eq!(s.verifier(), v);
    stored(s.write(FH, 0, 4096, &[1; 4096], WriteMode::Dirty));
    drop(s); // crash with an unsynced dirty write
    let (s, r) = open(&m);
    assert!(r.verifier_changed && r.unsynced_banks == 1, "{r:?}");
    assert_ne!(s.verifier(), v);
}

#[test]
fn corrupt_tags_are_dropped_and_reported() {
    let m = mems();
    let (s, _) = open(&m);
    stored(s.write(FH, 0, 0, &[1; 4096], WriteMode::Dirty));
    s.close().expect("close");
    let layout = BankLayout::new(&geo());
    // Smash both tag copies of every frame.
    for mem in &m {
        let junk = vec![0xa5; 2 * layout.frames as usize * layout.tag_len];
        mem.write_at(&junk, layout.tag_offset(0, 0)).expect("smash");
    }
    let (s, r) = open(&m);
    assert_eq!(r.corrupt_tags, 2 * layout.frames);
    assert!(r.verifier_changed);
    assert_eq!(s.stats().frames_in_use, 0);
}

#[test]
fn refuses_other_geometry_and_opens_dirs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _) = BlockStore::open_dir(dir.path(), geo(), OpenOptions::default()).expect("open");
    stored(s.write(FH, 0, 0, &[6; 4096], WriteMode::Clean));
    s.close().expect("close");
    assert!(dir.path().join("bank-001.gvfs").exists());
    let other = Geometry::new(GeometryConfig {
        capacity: 2 * 8 * 2 * 16384,
        ..GeometryConfig {
            banks: 2,
            ways: 2,
            block_size: 16384,
            sub_block_size: 4096,
            capacity: 0,
        }
    })
    .expect("valid");
    let e = BlockStore::open_dir(dir.path(), other, OpenOptions::default()).expect_err("mismatch");
    assert!(matches!(e, Error::GeometryMismatch { bank: 0, .. }));
    // Said as the options that would open it.
    let msg = e.to_string();
    assert!(
        msg.contains("made with --cache-size 256K --cache-banks 2 --cache-ways 2 --block-size 16K")
            && msg.contains("not --cache-size 512K"),
        "{msg}"
    );
    let opts = OpenOptions {
        verify_data: VerifyData::Always,
        ..OpenOptions::default()
    };
    let (s, r) = BlockStore::open_dir(dir.path(), geo(), opts).expect("reopen");
    assert_eq!(r.frames_recovered, 1);
    assert_eq!(s.read(FH, 0, 0, 2).expect("read"), Some(vec![6, 6]));
    // A second process (or store) on the same directory is refused
    // while the first has it open.
    let e = BlockStore::open_dir(dir.path(), geo(), OpenOptions::default()).expect_err("in use");
    assert!(matches!(e, Error::DirInUse { .. }), "{e}");
    drop(s);
    BlockStore::open_dir(dir.path(), geo(), OpenOptions::default()).expect("free again");
}

#[test]
fn io_error_poisons_until_reopen() {
    let f = crate::storage::FaultyStorage::new(MemStorage::new());
    let s: Vec<Box<dyn Storage>> = vec![Box::new(f.clone()), Box::new(MemStorage::new())];
    let (s, _) = BlockStore::open(s, geo(), OpenOptions::default()).expect("open");
    // Find a block in bank 0 and fail its data write.
    let b = (0..)
        .find(|&b| geo().bank_of_set(geo().set_index(FH, b)).0 == 0)
        .expect("block");
    f.fail_nth_op(0);
    assert!(matches!(
        s.write(FH, b, 0, &[1; 4096], WriteMode::Clean),
        Err(Error::Io { .. })
    ));
    assert!(matches!(s.read(FH, b, 0, 1), Err(Error::Poisoned)));
}

#[test]
fn held_bytes_are_read_whole_or_not_at_all_and_drops_are_told() {
    let (s, _) = open(&mems());
    let bs = 16384u64;
    let dropped = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let told = dropped.clone();
    s.on_drop(DropHook::new(move |fh: &[u8], block| {
        told.lock().expect("lock").push((fh.to_vec(), block));
    }))
    .expect("hook");
    stored(s.write(FH, 0, 0, &[1; 16384], WriteMode::Clean));
    stored(s.write(FH, 1, 0, &[2; 4096], WriteMode::Clean));
    let before = s.stats();
    // Across two blocks, all valid: read.
    let mut buf = vec![0u8; 200 + 4096];
    assert!(s.read_held(FH, bs - 200, &mut buf).expect("read"));
    assert!(buf[..200].iter().all(|&b| b == 1) && buf[200..].iter().all(|&b| b == 2));
    // Past block 1's valid sub-block, or a block not held: not read.
    let mut buf = vec![0u8; 200 + 4097];
    assert!(!s.read_held(FH, bs - 200, &mut buf).expect("read"));
    assert!(!s.read_held(FH, 2 * bs, &mut buf[..10]).expect("read"));
    let after = s.stats();
    assert_eq!((after.hits, after.misses), (before.hits, before.misses));
    // Every block let go is told, whatever lets it go.
    s.invalidate(FH, false).expect("invalidate");
    let mut told = dropped.lock().expect("lock").clone();
    told.sort();
    assert_eq!(told, vec![(FH.to_vec(), 0), (FH.to_vec(), 1)]);
}
