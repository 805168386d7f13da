//! Crashes, faults and rot in the middle of operations (found in a review):
//! a kill that tears a tag write, a rewrite back to the committed bytes, a
//! power loss after a drop or inside a truncation, a start refused for
//! space, rot in a tag slot of a bank closed cleanly, the writers record,
//! I/O errors while dropping, every bank file deleted.

use super::*;
use crate::format::HEADER_REGION;
use crate::storage::{FaultyStorage, MemStorage, WriteFate};

use super::tests::{flip, geo, mems, open_as, stored};

const FH: &[u8] = b"fh-review";

fn faulty(mem: &[MemStorage]) -> Vec<FaultyStorage<MemStorage>> {
    mem.iter().map(|m| FaultyStorage::new(m.clone())).collect()
}

fn bank_of(s: &BlockStore, fh: &[u8], block: u64) -> usize {
    let g = s.inner.lock().expect("lock");
    let id = g.lookup(fh, block).expect("cached");
    g.locate(id).0
}

/// The bytes of sub-block 0 of block 0 the store would write back.
fn sb0_written_back(s: &BlockStore) -> Option<Vec<u8>> {
    let d = s.dirty_data(FH, 0).expect("dirty")?;
    d.extents
        .into_iter()
        .find(|e| e.offset == 0)
        .map(|e| e.data[..4096.min(e.data.len())].to_vec())
}

/// kill -9 while a tag write spanning a page boundary is in progress: the
/// kernel stops a pwrite between pages when a fatal signal is pending, so
/// the tag lands torn (a 64 KiB-block geometry has 320-byte tags, one in
/// ~13 straddles a page; 1 MiB blocks, 3328 bytes). The scratch slot held
/// an earlier tag whose data had landed (a partial update of a committed
/// sub-block); recovery sees only the durable tag, `older = None`, so
/// `rewritten` is false and the committed sub-block is dropped. The client
/// resends its 100 uncommitted bytes; the 3996 committed bytes are gone.
#[test]
fn kill_tearing_a_tag_write_loses_committed_bytes() {
    let f = faulty(&mems());
    let (s, _) = open_as(&f, UncleanShutdown::ProcessOnly);
    stored(s.write(FH, 0, 0, &[1; 4096], WriteMode::Dirty));
    s.sync().expect("COMMIT");
    let b = bank_of(&s, FH, 0);
    // UNSTABLE write into the committed sub-block: tag, then data, both land.
    stored(s.write(FH, 0, 0, &[2; 100], WriteMode::Dirty));
    // Another UNSTABLE write into the same block: its tag write is torn.
    stored(s.write(FH, 0, 8192, &[3; 4096], WriteMode::Dirty));
    assert_eq!(f[b].unsynced_writes(), 4, "tag, data, tag, data");
    drop(s);
    f[b].crash_with(|i, len| match i {
        0 | 1 => WriteFate::Kept,
        2 => WriteFate::Torn(len / 2),
        _ => WriteFate::Lost,
    })
    .expect("crash");
    let (s, r) = open_as(&f, UncleanShutdown::ProcessOnly);
    assert!(r.verifier_changed);
    let got = sb0_written_back(&s).expect("committed sub-block kept");
    assert!(
        got[100..].iter().all(|&x| x == 1),
        "committed bytes lost: {r:?}"
    );
}

/// Same loss without any torn write: the last UNSTABLE write puts the
/// first 100 bytes back as they were at the COMMIT, so the newest tag's CRC
/// equals the durable tag's and `rewritten` is false (ABA). Its data never
/// landed (kill between tag and data); the bytes on disk are those of the
/// previous UNSTABLE write, matching neither tag: dropped as rot.
#[test]
fn rewriting_the_committed_bytes_back_then_kill_loses_committed_bytes() {
    let f = faulty(&mems());
    let (s, _) = open_as(&f, UncleanShutdown::ProcessOnly);
    stored(s.write(FH, 0, 0, &[1; 4096], WriteMode::Dirty));
    s.sync().expect("COMMIT");
    let b = bank_of(&s, FH, 0);
    stored(s.write(FH, 0, 0, &[2; 100], WriteMode::Dirty));
    stored(s.write(FH, 0, 0, &[1; 100], WriteMode::Dirty));
    assert_eq!(f[b].unsynced_writes(), 4);
    drop(s);
    // Killed after the last tag write, before its data write.
    f[b].crash_with(|i, _| {
        if i < 3 {
            WriteFate::Kept
        } else {
            WriteFate::Lost
        }
    })
    .expect("crash");
    let (s, r) = open_as(&f, UncleanShutdown::ProcessOnly);
    assert!(r.verifier_changed);
    let got = sb0_written_back(&s).expect("committed sub-block kept");
    assert!(
        got[100..].iter().all(|&x| x == 1),
        "committed bytes lost: {r:?}"
    );
}

/// Dirty bytes found rotten while running are dropped, quarantined, the
/// verifier changes. `change_verifier` fsyncs the emptying tag but never
/// promotes its slot, so the next tag write of the frame goes to the same
/// slot; a power loss tearing that write leaves only the durable tag from
/// before the drop, which (lenient rules) brings the rotten bytes back as
/// committed dirty data, to be written upstream.
#[test]
fn bytes_dropped_as_rot_come_back_after_a_power_loss_and_are_written_back() {
    let mem = mems();
    let f = faulty(&mem);
    let (s, _) = open_as(&f, UncleanShutdown::SystemCrash);
    // Two committed sub-blocks, so the frame outlives the drop of one.
    stored(s.write(FH, 0, 0, &[1; 8192], WriteMode::Dirty));
    s.sync().expect("COMMIT");
    let b = bank_of(&s, FH, 0);
    let pos = {
        let g = s.inner.lock().expect("lock");
        let id = g.lookup(FH, 0).expect("cached");
        g.data_pos(id, 0).1
    };
    flip(&mem[b], pos + 7);
    f[b].sync().expect("the rot is on disk");
    // A READ finds the rot: dropped, verifier changed.
    assert_eq!(s.read(FH, 0, 0, 4096).expect("read"), None);
    assert_eq!(s.stats().dirty_sub_blocks_lost, 1);
    // An UNSTABLE write into another sub-block of the same block.
    stored(s.write(FH, 0, 8192, &[3; 4096], WriteMode::Dirty));
    assert_eq!(f[b].unsynced_writes(), 2, "tag, data");
    drop(s);
    f[b].crash_with(|i, len| {
        if i == 0 {
            WriteFate::Torn(len / 2)
        } else {
            WriteFate::Lost
        }
    })
    .expect("power loss");
    let (s, r) = open_as(&f, UncleanShutdown::SystemCrash);
    let back = sb0_written_back(&s);
    assert!(
        back.is_none(),
        "rotten bytes dropped while running are written back after a power loss: {r:?}"
    );
}

/// A storage whose `allocate` fails with ENOSPC (a disk still full).
#[derive(Debug)]
struct Full(MemStorage);

impl Storage for Full {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, data: &[u8], offset: u64) -> std::io::Result<()> {
        self.0.write_at(data, offset)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.0.sync()
    }
    fn len(&self) -> std::io::Result<u64> {
        self.0.len()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
    fn allocate(&self, _len: u64) -> std::io::Result<()> {
        Err(std::io::Error::from_raw_os_error(
            rustix::io::Errno::NOSPC.raw_os_error(),
        ))
    }
}

/// A bank file cut short (a copy stopped by a full disk), then a start
/// refused because the disk is still full: `open_with` already grew the
/// file to its layout length (sparse), and nothing undoes it, so the next
/// start cannot see the cut: tags past it read as empty, the dirty data
/// they described vanishes, nothing is reported, the verifier stays.
#[test]
fn a_start_refused_for_space_erases_the_evidence_of_a_cut_bank() {
    let mem = mems();
    let (s, _) = BlockStore::open(
        mem.iter()
            .map(|m| Box::new(m.clone()) as Box<dyn Storage>)
            .collect(),
        geo(),
        OpenOptions::default(),
    )
    .expect("open");
    stored(s.write(FH, 0, 0, &[9; 4096], WriteMode::Dirty));
    s.sync().expect("COMMIT");
    let b = bank_of(&s, FH, 0);
    let v = s.verifier();
    s.close().expect("close");
    // Cut right after the header: the tag table is gone.
    mem[b].set_len(HEADER_REGION).expect("cut");
    let full: Vec<Box<dyn Storage>> = mem
        .iter()
        .map(|m| Box::new(Full(m.clone())) as Box<dyn Storage>)
        .collect();
    let e = BlockStore::open(full, geo(), OpenOptions::default()).expect_err("no room");
    assert!(matches!(e, Error::NoSpaceForBanks { .. }), "{e}");
    // Room made; started again.
    let (s, r) = BlockStore::open(
        mem.iter()
            .map(|m| Box::new(m.clone()) as Box<dyn Storage>)
            .collect(),
        geo(),
        OpenOptions::default(),
    )
    .expect("open");
    assert!(
        s.dirty_data(FH, 0).expect("dirty").is_none(),
        "the data is gone"
    );
    assert_eq!(r.banks_truncated, 1, "the cut is not reported: {r:?}");
    assert_ne!(s.verifier(), v, "lost dirty data, verifier kept");
}

/// A bank closed cleanly whose newer tag slot rots: recovery counts it
/// (corrupt_tags) but falls back to the older slot, which can describe
/// dirty data already written back (and marked clean, durably). That data
/// is written upstream again, over whatever changed there since.
#[test]
fn rot_in_the_newer_tag_slot_of_a_clean_bank_resurrects_written_back_data() {
    let mem = mems();
    let (s, _) = BlockStore::open(
        mem.iter()
            .map(|m| Box::new(m.clone()) as Box<dyn Storage>)
            .collect(),
        geo(),
        OpenOptions::default(),
    )
    .expect("open");
    stored(s.write(FH, 0, 0, &[9; 4096], WriteMode::Dirty));
    s.sync().expect("COMMIT");
    let d = s.dirty_data(FH, 0).expect("dirty").expect("some");
    s.mark_clean(&d).expect("written back");
    s.sync().expect("durable");
    let (b, tag_pos) = {
        let g = s.inner.lock().expect("lock");
        let id = g.lookup(FH, 0).expect("cached");
        let (b, fib) = g.locate(id);
        (b, g.layout.tag_offset(fib, g.frames[id].durable_slot))
    };
    s.close().expect("close");
    flip(&mem[b], tag_pos + 80);
    let (s, r) = BlockStore::open(
        mem.iter()
            .map(|m| Box::new(m.clone()) as Box<dyn Storage>)
            .collect(),
        geo(),
        OpenOptions::default(),
    )
    .expect("open");
    assert_eq!(r.corrupt_tags, 1);
    assert!(
        s.dirty_data(FH, 0).expect("dirty").is_none(),
        "data written back and marked clean is dirty again: {r:?}"
    );
}

/// `Writers::save` forgets files with no dirty data yet. The layer records
/// a new writer (one store call), then stores the data (another); a sync
/// by any other COMMIT in between drops the record, and since the layer
/// only records a writer when it changes, it is never recorded again:
/// recovered data is written back as the file's owner.
#[test]
fn a_sync_between_set_writer_and_the_write_loses_the_writer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _) = BlockStore::open_dir(dir.path(), geo(), OpenOptions::default()).expect("open");
    s.set_writer(FH, b"alice").expect("set_writer");
    s.sync().expect("someone else's COMMIT");
    stored(s.write(FH, 0, 0, &[1; 4096], WriteMode::Dirty));
    s.sync().expect("alice's COMMIT");
    drop(s); // kill -9
    let (s, _) = BlockStore::open_dir(dir.path(), geo(), OpenOptions::default()).expect("open");
    assert!(s.dirty_data(FH, 0).expect("dirty").is_some());
    assert_eq!(
        s.writer(FH).as_deref(),
        Some(&b"alice"[..]),
        "writer forgotten"
    );
}

/// A faulty storage that reads "without waiting" (as a page-cache hit).
#[derive(Debug)]
struct NowaitFaulty(FaultyStorage<MemStorage>);

impl Storage for NowaitFaulty {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn read_at_nowait(&self, buf: &mut [u8], offset: u64) -> bool {
        self.0.read_at(buf, offset).is_ok()
    }
    fn write_at(&self, data: &[u8], offset: u64) -> std::io::Result<()> {
        self.0.write_at(data, offset)
    }
    fn sync(&self) -> std::io::Result<()> {
        self.0.sync()
    }
    fn len(&self) -> std::io::Result<u64> {
        self.0.len()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
}

/// The no-wait READ path (an async thread) only reads: rotten dirty bytes
/// found there are not served and not dropped (dropping writes, syncs and
/// changes the verifier); the blocking path that takes over drops them and
/// changes the verifier, and an I/O error on the way poisons the store.
#[test]
fn the_nowait_read_leaves_rotten_dirty_bytes_to_the_blocking_path() {
    let mem = mems();
    let f = faulty(&mem);
    let boxed: Vec<Box<dyn Storage>> = f
        .iter()
        .map(|x| Box::new(NowaitFaulty(x.clone())) as Box<dyn Storage>)
        .collect();
    let (s, _) = BlockStore::open(boxed, geo(), OpenOptions::default()).expect("open");
    stored(s.write(FH, 0, 0, &[1; 8192], WriteMode::Dirty));
    s.sync().expect("COMMIT");
    let v = s.verifier();
    let (b, pos) = {
        let g = s.inner.lock().expect("lock");
        let id = g.lookup(FH, 0).expect("cached");
        g.data_pos(id, 0)
    };
    flip(&mem[b], pos + 7);
    let unsynced = f[b].unsynced_writes();
    let mut buf = vec![0u8; 4096];
    assert_eq!(s.read_range_now(FH, 0, &mut buf).expect("read"), 0);
    assert_eq!(f[b].unsynced_writes(), unsynced, "nothing written");
    assert_eq!(s.verifier(), v);
    // The blocking path: dropped, and the verifier changed first.
    assert_eq!(s.read_range_into(FH, 0, &mut buf).expect("read"), [false]);
    assert_ne!(s.verifier(), v);
    let d = s.dirty_data(FH, 0).expect("dirty").expect("sb1 left");
    assert_eq!(d.extents.len(), 1);
    assert_eq!(d.extents[0].offset, 4096, "sub-block 0 was dropped");
}

/// An I/O error while rotten dirty bytes are dropped (the disk that rots is
/// the disk that fails) poisons the store; after the restart the loss is
/// still signalled: the verifier changes before the sub-block is forgotten.
#[test]
fn an_io_error_while_dropping_dirty_data_loses_it_silently_across_a_restart() {
    let mem = mems();
    let f = faulty(&mem);
    let (s, _) = open_as(&f, UncleanShutdown::ProcessOnly);
    stored(s.write(FH, 0, 0, &[1; 8192], WriteMode::Dirty));
    s.sync().expect("COMMIT");
    let v = s.verifier();
    let (b, pos) = {
        let g = s.inner.lock().expect("lock");
        let id = g.lookup(FH, 0).expect("cached");
        g.data_pos(id, 0)
    };
    flip(&mem[b], pos + 7);
    // Ops on bank 0 from now: [read, tag write,] header write.
    f[0].fail_nth_op(if b == 0 { 2 } else { 0 });
    assert!(s.read(FH, 0, 0, 4096).is_err(), "the injected fault");
    assert!(matches!(s.sync(), Err(Error::Poisoned)));
    drop(s); // the proxy restarts (the system kept every write)
    let (s, r) = open_as(&f, UncleanShutdown::ProcessOnly);
    let d = s.dirty_data(FH, 0).expect("dirty").expect("sb1 left");
    assert_eq!(d.extents[0].offset, 4096, "sub-block 0 was dropped");
    assert!(
        r.verifier_changed && s.verifier() != v,
        "dirty data lost, verifier unchanged: {r:?}"
    );
}

/// `truncate` zeroes the tail of a committed dirty sub-block in place
/// without flagging the bank "dirty writes since the last sync" first (only
/// `write` in Dirty mode calls `flag_unsynced`). A power loss before the
/// truncation's closing sync that lands the zeroing but not its tag leaves
/// a bank whose header says "synced": recovery is not lenient, the bytes
/// match neither tag, and the committed bytes before the cut are dropped.
#[test]
fn power_loss_during_a_truncation_loses_committed_bytes_before_the_cut() {
    let mem = mems();
    let f = faulty(&mem);
    let (s, _) = open_as(&f, UncleanShutdown::SystemCrash);
    stored(s.write(FH, 0, 0, &[5; 8192], WriteMode::Dirty));
    s.sync().expect("COMMIT");
    let b = bank_of(&s, FH, 0);
    // The truncation's ops on its bank: check read, read, the header's
    // "unsynced" flag and its sync, tag, data, tag, then its sync: the
    // power goes before that sync.
    f[b].fail_nth_op(7);
    assert!(
        s.truncate(FH, 4096 + 50).is_err(),
        "power lost before the sync"
    );
    assert_eq!(f[b].unsynced_writes(), 3, "tag, zeroing, dirty_end tag");
    drop(s);
    f[b].crash_with(|i, _| {
        if i == 1 {
            WriteFate::Kept
        } else {
            WriteFate::Lost
        }
    })
    .expect("power loss");
    let (s, r) = open_as(&f, UncleanShutdown::SystemCrash);
    let d = s.dirty_data(FH, 0).expect("dirty").expect("some");
    let end = d
        .extents
        .last()
        .map_or(0, |e| e.offset as usize + e.data.len());
    assert!(
        end >= 4096 + 50,
        "committed bytes before the cut lost: {r:?}"
    );
}

/// Every bank file deleted (or the only one, with `--cache-banks 1`) while
/// `DIR/writers`, `DIR/boot-id` and the quarantine show a cache was there:
/// taken for a new cache, so nothing is reported (banks_lost 0,
/// verifier_changed false, stats.verifier_changes 0), though its dirty data,
/// committed data included, is gone.
#[test]
fn all_bank_files_deleted_is_not_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (s, _) = BlockStore::open_dir(dir.path(), geo(), OpenOptions::default()).expect("open");
    s.set_writer(FH, b"alice").expect("writer");
    stored(s.write(FH, 0, 0, &[1; 4096], WriteMode::Dirty));
    s.sync().expect("COMMIT");
    s.close().expect("close");
    for b in 0..2 {
        std::fs::remove_file(dir.path().join(format!("bank-{b:03}.gvfs"))).expect("rm");
    }
    let (_s, r) = BlockStore::open_dir(dir.path(), geo(), OpenOptions::default()).expect("open");
    assert_eq!(r.banks_lost, 2, "not reported: {r:?}");
    assert!(r.verifier_changed, "{r:?}");
}
