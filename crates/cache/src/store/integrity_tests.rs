//! Bytes that rot, bank files that vanish or are cut off: nothing wrong is
//! served or written back, and lost dirty data changes the verifier.

use std::os::unix::fs::MetadataExt;

use super::*;
use crate::storage::{FaultyStorage, FileStorage};

use super::tests::{flip, geo, mems, open, open_as, stored};

const FH: &[u8] = b"fh-rot";

/// Bank and position in the bank of sub-block `sb` of a cached block.
fn data_at(s: &BlockStore, fh: &[u8], block: u64, sb: u32) -> (usize, u64) {
    let g = s.inner.lock().expect("lock");
    let id = g.lookup(fh, block).expect("cached");
    g.data_pos(id, sb)
}

#[test]
fn rotten_clean_bytes_are_never_served_and_are_fetched_again() {
    let mem = mems();
    let (s, _) = open(&mem);
    stored(s.write(FH, 0, 0, &[7; 16384], WriteMode::Clean));
    let (b, sb1) = data_at(&s, FH, 0, 1);
    let (_, sb2) = data_at(&s, FH, 0, 2);
    let v = s.verifier();
    s.close().expect("close");
    flip(&mem[b], sb1 + 10);
    let (s, r) = open(&mem);
    assert_eq!(
        r.clean_sub_blocks_dropped, 0,
        "a clean close is not checked"
    );
    // A read of the rotten sub-block misses (any part of it)...
    assert_eq!(s.read(FH, 0, 4096 + 200, 100).expect("read"), None);
    assert_eq!(s.stats().corrupt_clean_dropped, 1);
    // ... the sound ones still hit.
    assert_eq!(s.read(FH, 0, 0, 4096).expect("read"), Some(vec![7; 4096]));
    // Bytes that rot while the store is open are not served on the no-wait
    // path either; the blocking path drops them.
    flip(&mem[b], sb2);
    let mut buf = vec![0u8; 8192];
    assert_eq!(s.read_range_now(FH, 8192, &mut buf).expect("read"), 0);
    assert_eq!(
        s.read_range_into(FH, 8192, &mut buf).expect("read"),
        [false]
    );
    assert_eq!(s.stats().corrupt_clean_dropped, 2);
    // Fetched again, they are served.
    stored(s.write(FH, 0, 0, &[7; 16384], WriteMode::Clean));
    assert_eq!(s.read(FH, 0, 0, 16384).expect("read"), Some(vec![7; 16384]));
    // Clean data lost nothing a client wrote: the verifier stays.
    assert_eq!(s.verifier(), v);
    assert_eq!(s.stats().verifier_changes, 0);
}

#[test]
fn rotten_dirty_bytes_are_never_written_back_and_change_the_verifier() {
    let mem = mems();
    let (s, _) = open(&mem);
    stored(s.write(FH, 0, 0, &[1; 8192], WriteMode::Dirty));
    stored(s.write(FH, 0, 9000, &[2; 100], WriteMode::Dirty));
    s.sync().expect("sync");
    let v = s.verifier();
    let (b, sb0) = data_at(&s, FH, 0, 0);
    let (_, sb2) = data_at(&s, FH, 0, 2);
    s.close().expect("close");
    flip(&mem[b], sb0 + 5);
    flip(&mem[b], sb2 + (9000 - 8192) + 3);
    let (s, r) = open(&mem);
    assert!(!r.verifier_changed);
    // Write-back gets only the sound sub-block; the origin keeps its bytes
    // for the others.
    let d = s.dirty_data(FH, 0).expect("dirty").expect("some left");
    let got: Vec<(u32, Vec<u8>)> = d.extents.into_iter().map(|e| (e.offset, e.data)).collect();
    assert_eq!(got, [(4096, vec![1; 4096])]);
    assert_eq!(s.stats().dirty_sub_blocks_lost, 2);
    assert_ne!(s.verifier(), v, "clients must resend");
    assert_eq!(s.stats().verifier_changes, 1);
    // The new verifier is durable.
    s.close().expect("close");
    let (s, r) = open(&mem);
    assert!(!r.verifier_changed);
    assert_ne!(s.verifier(), v);
}

#[test]
fn rot_found_by_a_partial_write_is_dropped_not_kept() {
    let mem = mems();
    let (s, _) = open(&mem);
    stored(s.write(FH, 0, 0, &[3; 16384], WriteMode::Clean));
    let (b, sb1) = data_at(&s, FH, 0, 1);
    flip(&mem[b], sb1 + 1000);
    // Updating part of the rotten sub-block must not bless its other bytes
    // with a new checksum: it is dropped and the write kept as an extent.
    stored(s.write(FH, 0, 4096 + 100, &[9; 10], WriteMode::Dirty));
    assert_eq!(s.read(FH, 0, 4096, 4096).expect("read"), None);
    let d = s.dirty_overlay(FH, 0).expect("overlay").expect("some");
    let got: Vec<(u32, Vec<u8>)> = d.extents.into_iter().map(|e| (e.offset, e.data)).collect();
    assert_eq!(got, [(4196, vec![9; 10])]);
    assert_eq!(s.stats().corrupt_clean_dropped, 1);
}

#[test]
fn rot_found_by_a_truncation_is_dropped_not_kept() {
    let mem = mems();
    let (s, _) = open(&mem);
    stored(s.write(FH, 0, 0, &[5; 8192], WriteMode::Dirty));
    s.sync().expect("sync");
    let v = s.verifier();
    let (b, sb1) = data_at(&s, FH, 0, 1);
    flip(&mem[b], sb1 + 10);
    s.truncate(FH, 4096 + 50).expect("truncate");
    let d = s.dirty_data(FH, 0).expect("dirty").expect("some");
    let got: Vec<(u32, Vec<u8>)> = d.extents.into_iter().map(|e| (e.offset, e.data)).collect();
    assert_eq!(got, [(0, vec![5; 4096])]);
    assert_ne!(s.verifier(), v);
}

/// A crash after a COMMIT, then bytes that rot before the restart: the
/// committed sub-block is not taken for a torn overwrite (no write was in
/// flight: the bank was synced), so its rotten bytes are not kept.
#[test]
fn rot_in_committed_data_after_a_crash_is_dropped_not_kept() {
    for unclean in [UncleanShutdown::ProcessOnly, UncleanShutdown::SystemCrash] {
        let mem = mems();
        let faulty: Vec<Box<dyn Storage>> = mem
            .iter()
            .map(|m| Box::new(FaultyStorage::new(m.clone())) as Box<dyn Storage>)
            .collect();
        let (s, _) = BlockStore::open(faulty, geo(), OpenOptions::default()).expect("open");
        stored(s.write(FH, 0, 0, &[4; 4096], WriteMode::Dirty));
        s.sync().expect("sync");
        let (b, sb0) = data_at(&s, FH, 0, 0);
        drop(s); // killed: no clean close
        flip(&mem[b], sb0 + 7);
        let (s, r) = open_as(&mem, unclean);
        assert_eq!(r.torn_committed_kept, 0, "{unclean:?}: {r:?}");
        assert_eq!(r.dirty_sub_blocks_lost, 1, "{unclean:?}: {r:?}");
        assert!(r.verifier_changed);
        assert_eq!(s.dirty_data(FH, 0).expect("dirty"), None);
        assert_eq!(s.stats().dirty_sub_blocks_lost, 1);
    }
}

/// A bank with unsynced writes (to another block) when the process died:
/// rot in a committed sub-block that no write touched since the sync is
/// rot, not a torn overwrite. After a system crash it is kept (the data
/// may have landed without its tag).
#[test]
fn rot_beside_unsynced_writes_is_told_from_a_torn_overwrite() {
    for (unclean, kept) in [
        (UncleanShutdown::ProcessOnly, false),
        (UncleanShutdown::SystemCrash, true),
    ] {
        let mem = mems();
        let (s, _) = open(&mem);
        stored(s.write(FH, 0, 0, &[4; 4096], WriteMode::Dirty));
        s.sync().expect("sync");
        let (b, sb0) = data_at(&s, FH, 0, 0);
        // An unsynced write into the same bank, another block.
        let other = (1..64)
            .find(|&blk| {
                stored(s.write(FH, blk, 0, &[6; 4096], WriteMode::Clean));
                data_at(&s, FH, blk, 0).0 == b
            })
            .expect("a block in the same bank");
        stored(s.write(FH, other, 0, &[8; 4096], WriteMode::Dirty));
        drop(s);
        flip(&mem[b], sb0 + 7);
        let (s, r) = open_as(&mem, unclean);
        assert_eq!(r.unsynced_banks, 1);
        let d = s.dirty_data(FH, 0).expect("dirty");
        assert_eq!(d.is_some(), kept, "{unclean:?}: {r:?}");
        assert_eq!(r.torn_committed_kept, u64::from(kept), "{unclean:?}: {r:?}");
    }
}

#[test]
fn a_missing_bank_file_changes_the_verifier_and_is_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _) = BlockStore::open_dir(dir.path(), geo(), OpenOptions::default()).expect("open");
    for blk in 0..8 {
        stored(s.write(FH, blk, 0, &[blk as u8; 4096], WriteMode::Dirty));
    }
    s.sync().expect("sync");
    let v = s.verifier();
    s.close().expect("close");
    std::fs::remove_file(dir.path().join("bank-001.gvfs")).expect("rm");
    let (s, r) = BlockStore::open_dir(dir.path(), geo(), OpenOptions::default()).expect("open");
    assert_eq!((r.banks_created, r.banks_lost), (1, 1), "{r:?}");
    assert!(r.verifier_changed, "{r:?}");
    assert_ne!(s.verifier(), v);
    assert_eq!(s.stats().banks_lost, 1);
    assert_eq!(s.stats().verifier_changes, 1);
}

#[test]
fn a_bank_file_cut_short_loses_what_was_past_the_cut() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _) = BlockStore::open_dir(dir.path(), geo(), OpenOptions::default()).expect("open");
    stored(s.write(FH, 0, 0, &[9; 16384], WriteMode::Dirty));
    s.sync().expect("sync");
    let v = s.verifier();
    let (b, sb2) = data_at(&s, FH, 0, 2);
    s.close().expect("close");
    // Cut in the middle of sub-block 2: 0 and 1 survive whole.
    let path = dir.path().join(format!("bank-{b:03}.gvfs"));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open bank");
    file.set_len(sb2 + 100).expect("truncate");
    drop(file);
    let (s, r) = BlockStore::open_dir(dir.path(), geo(), OpenOptions::default()).expect("open");
    assert_eq!(r.banks_truncated, 1, "{r:?}");
    assert_eq!(r.dirty_sub_blocks_lost, 2, "{r:?}");
    assert!(r.verifier_changed);
    assert_ne!(s.verifier(), v);
    let d = s.dirty_data(FH, 0).expect("dirty").expect("some");
    let got: Vec<(u32, Vec<u8>)> = d.extents.into_iter().map(|e| (e.offset, e.data)).collect();
    assert_eq!(got, [(0, vec![9; 8192])], "no zeros from past the cut");
}

#[test]
fn dirty_bytes_that_fail_are_set_aside_in_the_quarantine() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _) = BlockStore::open_dir(dir.path(), geo(), OpenOptions::default()).expect("open");
    stored(s.write(FH, 1, 0, &[0x42; 4096], WriteMode::Dirty));
    s.sync().expect("sync");
    let (b, sb0) = data_at(&s, FH, 1, 0);
    s.close().expect("close");
    let bank = FileStorage::open(&dir.path().join(format!("bank-{b:03}.gvfs"))).expect("bank");
    flip(&bank, sb0);
    let (s, _) = BlockStore::open_dir(dir.path(), geo(), OpenOptions::default()).expect("open");
    assert_eq!(s.dirty_data(FH, 1).expect("dirty"), None);
    let kept: Vec<_> = std::fs::read_dir(dir.path().join("quarantine"))
        .expect("quarantine")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    let name = kept[0]
        .file_name()
        .expect("name")
        .to_string_lossy()
        .to_string();
    assert!(name.starts_with("66682d726f74-16384-"), "{name}");
    let bytes = std::fs::read(&kept[0]).expect("read");
    assert_eq!(bytes.len(), 4096);
    assert_eq!(bytes[0], !0x42);
    assert!(bytes[1..].iter().all(|&x| x == 0x42));
}

#[test]
fn bank_files_have_their_space_reserved() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _) = BlockStore::open_dir(dir.path(), geo(), OpenOptions::default()).expect("open");
    drop(s);
    for b in 0..2 {
        let m = std::fs::metadata(dir.path().join(format!("bank-{b:03}.gvfs"))).expect("stat");
        assert!(
            m.blocks() * 512 >= m.len(),
            "bank {b}: {} of {} bytes allocated",
            m.blocks() * 512,
            m.len()
        );
    }
}
