//! The layer against the in-memory server of gvfs-nfs's test kit.

use std::sync::Arc;
use std::time::Duration;

use gvfs_nfs::{CallContext, Credentials, NfsProc, NfsReply, NfsRequest, NfsService};
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::Opaque;

use super::*;
use crate::geometry::GeometryConfig;
use crate::storage::{FaultyStorage, MemStorage, Storage};
use crate::store::OpenOptions;
use gvfs_nfs::testing::{MemNfs as Fake, ROOT};

const BS: usize = 8192;

fn geometry(banks: u32, ways: u32, sets_per_bank: u64) -> Geometry {
    Geometry::new(GeometryConfig {
        capacity: u64::from(banks) * u64::from(ways) * BS as u64 * sets_per_bank,
        banks,
        ways,
        block_size: BS as u32,
        sub_block_size: 1024,
    })
    .expect("geometry")
}

type Disks = Vec<FaultyStorage<MemStorage>>;

fn open(geo: Geometry, disks: &Disks) -> BlockStore {
    let storages: Vec<Box<dyn Storage>> = disks
        .iter()
        .map(|d| Box::new(d.clone()) as Box<dyn Storage>)
        .collect();
    BlockStore::open(storages, geo, OpenOptions::default())
        .expect("open store")
        .0
}

struct Setup {
    fake: Arc<Fake>,
    layer: Arc<CacheLayer>,
    disks: Disks,
    geo: Geometry,
}

fn setup_with(geo: Geometry, config: CacheConfig) -> Setup {
    let fake = Fake::new();
    let disks: Disks = (0..geo.banks())
        .map(|_| FaultyStorage::new(MemStorage::new()))
        .collect();
    let layer = CacheLayer::new(
        fake.clone(),
        open(geo, &disks),
        config,
        SideChannels::default(),
    );
    Setup {
        fake,
        layer,
        disks,
        geo,
    }
}

fn setup(policy: WritePolicy, readahead_blocks: u32) -> Setup {
    setup_with(
        geometry(2, 4, 8),
        CacheConfig {
            policy,
            readahead_blocks,
        },
    )
}

fn cx() -> CallContext {
    CallContext::with_cred(Credentials::unix(1000, 1000))
}

fn fh3(fh: &[u8]) -> nfs_fh3 {
    nfs_fh3 {
        data: Opaque::owned(fh.to_vec()),
    }
}

/// Non-zero bytes, different per seed.
fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| ((i * 31 + usize::from(seed) * 7) % 251) as u8 + 1)
        .collect()
}

async fn read(l: &CacheLayer, fh: &[u8], offset: u64, count: u32) -> (Vec<u8>, bool, fattr3) {
    let req = NfsRequest::Read(READ3args {
        file: fh3(fh),
        offset,
        count,
    });
    match l.call(&cx(), req).await.expect("read") {
        NfsReply::Read(Nfs3Result::Ok(ok)) => {
            assert_eq!(ok.count as usize, ok.data.len());
            (ok.data.to_vec(), ok.eof, ok.file_attributes.unwrap())
        }
        other => panic!("READ failed: {other:?}"),
    }
}

async fn write(
    l: &CacheLayer,
    fh: &[u8],
    offset: u64,
    data: &[u8],
    stable: stable_how,
) -> WRITE3resok {
    let req = NfsRequest::Write(WRITE3args {
        file: fh3(fh),
        offset,
        count: data.len() as u32,
        stable,
        data: Opaque::owned(data.to_vec()),
    });
    match l.call(&cx(), req).await.expect("write") {
        NfsReply::Write(Nfs3Result::Ok(ok)) => ok,
        other => panic!("WRITE failed: {other:?}"),
    }
}

async fn getattr(l: &CacheLayer, fh: &[u8]) -> fattr3 {
    let req = NfsRequest::Getattr(GETATTR3args { object: fh3(fh) });
    match l.call(&cx(), req).await.expect("getattr") {
        NfsReply::Getattr(Nfs3Result::Ok(ok)) => ok.obj_attributes,
        other => panic!("GETATTR failed: {other:?}"),
    }
}

async fn commit(l: &CacheLayer, fh: &[u8]) -> writeverf3 {
    let req = NfsRequest::Commit(COMMIT3args {
        file: fh3(fh),
        offset: 0,
        count: 0,
    });
    match l.call(&cx(), req).await.expect("commit") {
        NfsReply::Commit(Nfs3Result::Ok(ok)) => ok.verf,
        other => panic!("COMMIT failed: {other:?}"),
    }
}

async fn setattr_size(l: &CacheLayer, fh: &[u8], size: u64) {
    let req = NfsRequest::Setattr(SETATTR3args {
        object: fh3(fh),
        new_attributes: sattr3 {
            size: Nfs3Option::Some(size),
            ..sattr3::default()
        },
        guard: Nfs3Option::None,
    });
    let reply = l.call(&cx(), req).await.expect("setattr");
    assert_eq!(reply.status(), nfsstat3::NFS3_OK);
}

/// Waits until no read-ahead or fetch is in flight.
async fn idle(l: &CacheLayer) {
    for _ in 0..500 {
        let busy = l.readahead_slots.available_permits() < MAX_READAHEAD_TASKS
            || !lock(&l.flights).is_empty();
        if !busy {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("read-ahead never finished");
}

async fn write_back(l: &CacheLayer) -> WriteBackReport {
    l.write_back(&|done, total| assert!(done <= total))
        .await
        .expect("write back")
}

#[tokio::test]
async fn read_miss_fills_then_hits() {
    let s = setup(WritePolicy::WriteBack, 0);
    let content = pattern(20_000, 1);
    let fh = s.fake.create("a", &content);
    let (d, eof, a) = read(&s.layer, &fh, 0, 8192).await;
    assert_eq!(d, content[..8192]);
    assert!(!eof);
    assert_eq!(a.size, 20_000);
    assert_eq!(s.fake.calls(NfsProc::Read), 1);
    let (d, _, _) = read(&s.layer, &fh, 100, 5000).await;
    assert_eq!(d, content[100..5100]);
    assert_eq!(s.fake.calls(NfsProc::Read), 1, "second read is a hit");
    // The tail block, cut at the end of the file.
    let (d, eof, _) = read(&s.layer, &fh, 16_384, 8192).await;
    assert_eq!(d, content[16_384..]);
    assert!(eof);
    let (d, eof, _) = read(&s.layer, &fh, 16_000, 8192).await;
    assert_eq!(d, content[16_000..]);
    assert!(eof);
    let (d, eof, _) = read(&s.layer, &fh, 20_000, 10).await;
    assert!(d.is_empty() && eof);
    // Block 1 was not cached yet.
    assert_eq!(s.fake.calls(NfsProc::Read), 3);
    let (d, _, _) = read(&s.layer, &fh, 8000, 12_000).await;
    assert_eq!(d, content[8000..]);
    assert_eq!(s.fake.calls(NfsProc::Read), 3);
    let st = s.layer.stats();
    assert_eq!((st.counts.hits, st.counts.misses), (2, 3));
    assert_eq!(st.counts.hit_bytes, 5000 + 12_000);
    assert_eq!(st.counts.fetched_bytes, 2 * 8192 + (20_000 - 16_384));
    assert!(st.counts.upstream_calls >= 3);
    assert!(st.cached_bytes > 0 && st.capacity_bytes == s.geo.capacity());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_misses_are_coalesced() {
    let s = setup(WritePolicy::WriteBack, 0);
    let content = pattern(BS, 2);
    let fh = s.fake.create("a", &content);
    getattr(&s.layer, &fh).await;
    s.fake.set_read_delay(Duration::from_millis(100));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..8u64 {
        let (l, fh) = (s.layer.clone(), fh.clone());
        set.spawn(async move { read(&l, &fh, i * 100, 1000).await.0 });
    }
    let mut n = 0;
    while let Some(r) = set.join_next().await {
        let d = r.expect("task");
        assert_eq!(d.len(), 1000);
        n += 1;
    }
    assert_eq!(n, 8);
    assert_eq!(s.fake.calls(NfsProc::Read), 1);
    assert_eq!(s.layer.stats().counts.coalesced_misses, 7);
}

#[tokio::test]
async fn sequential_reads_trigger_read_ahead() {
    let s = setup(WritePolicy::WriteBack, 4);
    let content = pattern(10 * BS, 3);
    let fh = s.fake.create("a", &content);
    read(&s.layer, &fh, 0, BS as u32).await;
    idle(&s.layer).await;
    // A read at the start of a file starts a run: one block long, so one
    // block is read ahead.
    assert_eq!(s.fake.calls(NfsProc::Read), 2, "block 1 read ahead");
    read(&s.layer, &fh, BS as u64, BS as u32).await;
    idle(&s.layer).await;
    // The run is two blocks long: as far again is read ahead.
    assert_eq!(s.fake.calls(NfsProc::Read), 2 + 2, "blocks 2..4 read ahead");
    for b in 2..6u64 {
        let (d, _, _) = read(&s.layer, &fh, b * BS as u64, BS as u32).await;
        assert_eq!(d, content[b as usize * BS..(b as usize + 1) * BS]);
        idle(&s.layer).await;
    }
    // From the fourth block on the run is as long as the window (4).
    assert_eq!(s.fake.calls(NfsProc::Read), 10, "up to block 10");
    let st = s.layer.stats();
    assert_eq!(st.counts.readahead_hits, 5);
    assert_eq!(st.counts.readahead_blocks, 9);
    // Read-ahead kept going, clipped at the end of the file.
    for b in 6..10u64 {
        read(&s.layer, &fh, b * BS as u64, BS as u32).await;
        idle(&s.layer).await;
    }
    assert_eq!(s.fake.calls(NfsProc::Read), 10);
    // A random read does not read ahead.
    let s = setup(WritePolicy::WriteBack, 4);
    let fh = s.fake.create("b", &content);
    read(&s.layer, &fh, 3 * BS as u64, 10).await;
    read(&s.layer, &fh, 7 * BS as u64, 10).await;
    idle(&s.layer).await;
    assert_eq!(s.fake.calls(NfsProc::Read), 2);
}

#[tokio::test]
async fn two_small_reads_that_touch_read_ahead_one_block_not_the_window() {
    // A disk image's tables: a read, then one just past it. The old rule
    // read the whole window (here 8 blocks) ahead of the second.
    let s = setup(WritePolicy::WriteBack, 8);
    let content = pattern(20 * BS, 4);
    let fh = s.fake.create("a", &content);
    read(&s.layer, &fh, 3 * BS as u64, 100).await;
    read(&s.layer, &fh, 3 * BS as u64 + 100, 100).await;
    idle(&s.layer).await;
    assert_eq!(s.layer.stats().counts.readahead_blocks, 1, "block 4 only");
    assert_eq!(s.fake.calls(NfsProc::Read), 2);
}

#[tokio::test]
async fn write_back_policy_caches_writes_until_write_back() {
    let s = setup(WritePolicy::WriteBack, 0);
    let fh = s.fake.create("a", b"");
    let data = pattern(20_000, 4);
    let mut verf = None;
    for (i, chunk) in data.chunks(4096).enumerate() {
        let ok = write(
            &s.layer,
            &fh,
            (i * 4096) as u64,
            chunk,
            stable_how::UNSTABLE,
        )
        .await;
        assert_eq!(ok.committed, stable_how::UNSTABLE);
        assert_eq!(ok.count as usize, chunk.len());
        assert_eq!(ok.verf.0, s.layer.store.verifier());
        assert_eq!(
            ok.file_wcc.after.unwrap().size,
            (i * 4096 + chunk.len()) as u64
        );
        verf = Some(ok.verf);
    }
    assert_eq!(s.fake.calls(NfsProc::Write), 0);
    assert!(s.fake.data(&fh).is_empty());
    assert_eq!(commit(&s.layer, &fh).await, verf.expect("written"));
    assert_eq!(s.fake.calls(NfsProc::Commit), 0);
    // The client sees its own writes.
    let a = getattr(&s.layer, &fh).await;
    assert_eq!(a.size, 20_000);
    let (d, eof, a) = read(&s.layer, &fh, 0, 32_768).await;
    assert_eq!(d, data);
    assert!(eof);
    assert_eq!(a.size, 20_000);
    assert!(s.layer.dirty_bytes() >= 20_000);

    let progress = std::sync::Mutex::new(Vec::new());
    let report = s
        .layer
        .write_back(&|done, total| progress.lock().unwrap().push((done, total)))
        .await
        .expect("write back");
    assert_eq!(s.fake.data(&fh), data, "byte-identical upstream");
    assert_eq!(report.files, 1);
    assert_eq!(report.blocks, 3);
    assert_eq!(report.bytes, 20_000);
    assert_eq!(report.rewrites, 0);
    assert_eq!(s.fake.calls(NfsProc::Write), 1, "coalesced into one WRITE");
    assert_eq!(s.fake.calls(NfsProc::Commit), 1);
    let p = progress.into_inner().unwrap();
    assert_eq!(p.last().map(|&(d, t)| d == t), Some(true));
    assert_eq!(s.layer.dirty_bytes(), 0);
    assert_eq!(getattr(&s.layer, &fh).await.size, 20_000);
    assert_eq!(write_back(&s.layer).await, WriteBackReport::default());
    assert_eq!(s.layer.stats().counts.write_back_bytes, 20_000);
}

#[tokio::test]
async fn a_link_reply_shows_the_writes_the_cache_holds() {
    let s = setup(WritePolicy::WriteBack, 0);
    let fh = s.fake.create("a", b"");
    write(&s.layer, &fh, 0, &pattern(5000, 1), stable_how::UNSTABLE).await;
    let req = NfsRequest::Link(LINK3args {
        file: fh3(&fh),
        link: diropargs3 {
            dir: fh3(b"root"),
            name: b"b".to_vec().into(),
        },
    });
    let reply = s.layer.call(&cx(), req).await.expect("link");
    let NfsReply::Link(Nfs3Result::Ok(ok)) = reply else {
        panic!("{reply:?}");
    };
    assert_eq!(ok.file_attributes.unwrap().size, 5000, "not upstream's 0");
    assert!(s.fake.data(&fh).is_empty(), "still only in the cache");
    let (d, _, _) = read(&s.layer, &fh, 0, 8192).await;
    assert_eq!(d, pattern(5000, 1), "the link kept the cached blocks");
}

#[tokio::test]
async fn write_back_keeps_several_writes_in_flight() {
    let s = setup(WritePolicy::WriteBack, 0);
    let fh = s.fake.create("a", &vec![0; 40 * BS]);
    // 20 runs that do not touch: one WRITE each.
    let mut want = vec![0; 40 * BS];
    for i in 0..20 {
        let chunk = pattern(1024, i as u8);
        let off = i * 2 * BS;
        want[off..off + 1024].copy_from_slice(&chunk);
        write(&s.layer, &fh, off as u64, &chunk, stable_how::UNSTABLE).await;
    }
    s.fake.set_write_delay(Duration::from_millis(20));
    let report = write_back(&s.layer).await;
    assert_eq!(report.bytes, 20 * 1024);
    assert_eq!(s.fake.calls(NfsProc::Write), 20);
    assert_eq!(s.fake.calls(NfsProc::Commit), 1);
    let max = s.fake.max_writes_in_flight();
    assert!((2..=8).contains(&max), "{max} WRITEs in flight");
    assert_eq!(s.fake.data(&fh), want);
    assert_eq!(s.layer.dirty_bytes(), 0);
}

#[tokio::test]
async fn file_sync_writes_are_durable_before_the_reply() {
    let s = setup(WritePolicy::WriteBack, 0);
    let fh = s.fake.create("a", b"");
    let ok = write(&s.layer, &fh, 0, &pattern(2048, 5), stable_how::FILE_SYNC).await;
    assert_eq!(ok.committed, stable_how::FILE_SYNC);
    assert!(s.disks.iter().all(|d| d.unsynced_writes() == 0));
}

#[tokio::test]
async fn partial_sub_block_writes_need_no_upstream_read() {
    let s = setup(WritePolicy::WriteBack, 0);
    let mut content = pattern(5000, 6);
    let fh = s.fake.create("a", &content);
    write(&s.layer, &fh, 1000, b"hello", stable_how::UNSTABLE).await;
    // Growing the same extent, and a tail past the end of the file.
    write(&s.layer, &fh, 1005, b", world", stable_how::UNSTABLE).await;
    write(&s.layer, &fh, 9000, b"tail", stable_how::UNSTABLE).await;
    assert_eq!(s.fake.calls(NfsProc::Read), 0);
    content[1000..1012].copy_from_slice(b"hello, world");
    let mut expect = content.clone();
    expect.resize(9000, 0);
    expect.extend_from_slice(b"tail");
    // Write-back sends just the bytes written: upstream's others stay.
    let report = write_back(&s.layer).await;
    assert_eq!(report.bytes, 12 + 4);
    assert_eq!(s.fake.calls(NfsProc::Read), 0);
    assert_eq!(s.fake.data(&fh), expect);
}

#[tokio::test]
async fn reads_merge_partial_sub_blocks_with_upstream() {
    let s = setup(WritePolicy::WriteBack, 0);
    let mut content = pattern(20_000, 6);
    let fh = s.fake.create("a", &content);
    write(&s.layer, &fh, 1000, b"hello", stable_how::UNSTABLE).await;
    content[1000..1005].copy_from_slice(b"hello");
    write(&s.layer, &fh, 25_000, b"tail", stable_how::UNSTABLE).await;
    assert_eq!(s.fake.calls(NfsProc::Read), 0);
    // A write leaving a gap inside a partial sub-block fills its block
    // first (block 2, upstream has data there).
    write(&s.layer, &fh, 17_000, b"x", stable_how::UNSTABLE).await;
    write(&s.layer, &fh, 17_010, b"y", stable_how::UNSTABLE).await;
    assert_eq!(s.fake.calls(NfsProc::Read), 1);
    content[17_000] = b'x';
    content[17_010] = b'y';
    let mut expect = content.clone();
    expect.resize(25_000, 0);
    expect.extend_from_slice(b"tail");
    // Blocks 0 and 1 are read and merged; 2 is cached; 3 is past
    // upstream's end, so zeros under the tail with no READ.
    let (d, eof, a) = read(&s.layer, &fh, 0, 65_536).await;
    assert_eq!(a.size, 25_004);
    assert!(eof);
    assert_eq!(d, expect);
    assert_eq!(s.fake.calls(NfsProc::Read), 3);
    write_back(&s.layer).await;
    assert_eq!(s.fake.data(&fh), expect);
}

#[tokio::test]
async fn eviction_writes_dirty_victims_back() {
    // One set of two frames.
    let s = setup_with(geometry(1, 2, 1), CacheConfig::default());
    let fh = s.fake.create("a", b"");
    let data = pattern(5 * BS, 7);
    for (i, chunk) in data.chunks(BS).enumerate() {
        write(&s.layer, &fh, (i * BS) as u64, chunk, stable_how::UNSTABLE).await;
    }
    let st = s.layer.stats();
    assert!(st.counts.eviction_write_backs >= 3, "{st:?}");
    assert!(s.fake.calls(NfsProc::Write) >= 3);
    let (d, _, a) = read(&s.layer, &fh, 0, (5 * BS) as u32).await;
    assert_eq!(a.size, data.len() as u64);
    assert_eq!(d, data);
    write_back(&s.layer).await;
    assert_eq!(s.fake.data(&fh), data);
}

#[tokio::test]
async fn truncate_discards_dirty_data_beyond() {
    let s = setup(WritePolicy::WriteBack, 0);
    let fh = s.fake.create("a", b"");
    let data = pattern(10_000, 8);
    write(&s.layer, &fh, 0, &data, stable_how::UNSTABLE).await;
    setattr_size(&s.layer, &fh, 3000).await;
    assert_eq!(getattr(&s.layer, &fh).await.size, 3000);
    let (d, eof, _) = read(&s.layer, &fh, 0, 10_000).await;
    assert_eq!(d, data[..3000]);
    assert!(eof);
    // Growing again reads zeros, not the old bytes.
    setattr_size(&s.layer, &fh, 5000).await;
    let (d, _, _) = read(&s.layer, &fh, 0, 10_000).await;
    assert_eq!(&d[..3000], &data[..3000]);
    assert!(d[3000..].iter().all(|&b| b == 0) && d.len() == 5000);
    write_back(&s.layer).await;
    let up = s.fake.data(&fh);
    assert_eq!(up.len(), 5000);
    assert_eq!(&up[..3000], &data[..3000]);
    assert!(up[3000..].iter().all(|&b| b == 0));
}

#[tokio::test]
async fn a_truncation_refused_upstream_keeps_the_committed_data() {
    let s = setup(WritePolicy::WriteBack, 0);
    let fh = s.fake.create("a", b"");
    let data = pattern(10_000, 8);
    write(&s.layer, &fh, 0, &data, stable_how::UNSTABLE).await;
    let verf = commit(&s.layer, &fh).await;
    s.fake.refuse_setattr();
    let req = NfsRequest::Setattr(SETATTR3args {
        object: fh3(&fh),
        new_attributes: sattr3 {
            size: Nfs3Option::Some(0),
            ..sattr3::default()
        },
        guard: Nfs3Option::None,
    });
    let reply = s.layer.call(&cx(), req).await.expect("setattr");
    assert_eq!(reply.status(), nfsstat3::NFS3ERR_ACCES);
    // The file is as it was: same size, same bytes, same verifier.
    assert_eq!(getattr(&s.layer, &fh).await.size, data.len() as u64);
    let (d, _, _) = read(&s.layer, &fh, 0, 10_000).await;
    assert_eq!(d, data);
    assert_eq!(commit(&s.layer, &fh).await, verf);
    write_back(&s.layer).await;
    assert_eq!(s.fake.data(&fh), data);
}

#[tokio::test]
async fn a_truncation_waits_for_an_evicted_block_being_written_back() {
    // One set of two frames; block 0 has two dirty runs, so writing its
    // eviction back takes two WRITEs, each slow.
    let s = setup_with(geometry(1, 2, 1), CacheConfig::default());
    let fh = s.fake.create("a", b"");
    let (head, mid) = (pattern(1024, 1), pattern(1024, 2));
    write(&s.layer, &fh, 0, &head, stable_how::UNSTABLE).await;
    write(&s.layer, &fh, 4096, &mid, stable_how::UNSTABLE).await;
    let block1 = pattern(BS, 3);
    write(&s.layer, &fh, BS as u64, &block1, stable_how::UNSTABLE).await;
    s.fake.set_write_delay(Duration::from_millis(300));
    // Block 2 needs a frame: block 0 goes upstream in two WRITEs. The
    // truncation to 2048 comes while the first is on its way.
    let block2 = pattern(BS, 4);
    let writing = {
        let (l, fh, d) = (s.layer.clone(), fh.clone(), block2.clone());
        tokio::spawn(async move { write(&l, &fh, 2 * BS as u64, &d, stable_how::UNSTABLE).await })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    setattr_size(&s.layer, &fh, 2048).await;
    writing.await.unwrap();
    s.fake.set_write_delay(Duration::ZERO);
    write_back(&s.layer).await;
    // Either order of the two calls, never bytes past the truncation
    // coming back from the older write.
    let mut truncated_last = head.clone();
    truncated_last.resize(2048, 0);
    let mut written_last = truncated_last.clone();
    written_last.resize(2 * BS, 0);
    written_last.extend_from_slice(&block2);
    let up = s.fake.data(&fh);
    assert!(
        up == truncated_last || up == written_last,
        "upstream holds {} bytes",
        up.len()
    );
}

#[tokio::test]
async fn a_fetch_older_than_a_write_back_does_not_fill_the_blocks_it_cleaned() {
    let s = setup(WritePolicy::WriteBack, 0);
    let fh = s.fake.create("a", &pattern(BS, 1));
    let mine = pattern(1024, 2);
    write(&s.layer, &fh, 0, &mine, stable_how::UNSTABLE).await;
    // A READ of the rest of the block fetches it; upstream's reply (its
    // bytes from before the write-back) arrives after the write-back.
    s.fake.set_read_late(Duration::from_millis(300));
    let reading = {
        let (l, fh) = (s.layer.clone(), fh.clone());
        tokio::spawn(async move { read(&l, &fh, 2048, 1024).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    write_back(&s.layer).await;
    reading.await.unwrap();
    s.fake.set_read_late(Duration::ZERO);
    idle(&s.layer).await;
    let (d, _, _) = read(&s.layer, &fh, 0, 1024).await;
    assert_eq!(d, mine, "the old fetch filled the written-back bytes");
}

#[tokio::test]
async fn a_write_upstream_would_refuse_is_refused_here_not_kept() {
    let s = setup(WritePolicy::WriteBack, 0);
    let original = pattern(BS, 5);
    let fh = s.fake.create("a", &original);
    s.fake.read_only_for(2000);
    let stranger = CallContext::with_cred(Credentials::unix(2000, 2000));
    let req = NfsRequest::Write(WRITE3args {
        file: fh3(&fh),
        offset: 0,
        count: 4,
        stable: stable_how::FILE_SYNC,
        data: Opaque::owned(b"evil".to_vec()),
    });
    let reply = s.layer.call(&stranger, req).await.expect("write");
    assert_eq!(reply.status(), nfsstat3::NFS3ERR_ACCES);
    // Nothing of it is served to others, or written back.
    let (d, _, _) = read(&s.layer, &fh, 0, BS as u32).await;
    assert_eq!(d, original);
    assert_eq!(s.layer.stats().dirty_bytes, 0);
    // The owner writes as before; asking once is remembered.
    write(&s.layer, &fh, 0, b"mine", stable_how::FILE_SYNC).await;
    write(&s.layer, &fh, 4, b"more", stable_how::FILE_SYNC).await;
    assert_eq!(s.fake.calls(NfsProc::Access), 2, "one per caller");
}

/// `touch -d` on a file with dirty data: the time the client set is the
/// one upstream keeps and the client sees, not the time write-back later
/// sends the data (found by the kernel client suite).
#[tokio::test]
async fn an_mtime_set_over_dirty_data_survives_write_back() {
    let s = setup(WritePolicy::WriteBack, 0);
    let fh = s.fake.create("stamped", &[0; 100]);
    write(&s.layer, &fh, 0, &[7; 4096], stable_how::UNSTABLE).await;
    commit(&s.layer, &fh).await;
    let req = NfsRequest::Setattr(SETATTR3args {
        object: fh3(&fh),
        new_attributes: sattr3 {
            mtime: set_mtime::SET_TO_CLIENT_TIME(nfstime3 {
                seconds: 1_000_000,
                nseconds: 0,
            }),
            ..sattr3::default()
        },
        guard: Nfs3Option::None,
    });
    let reply = s.layer.call(&cx(), req).await.expect("setattr");
    assert_eq!(reply.status(), nfsstat3::NFS3_OK);
    assert_eq!(getattr(&s.layer, &fh).await.mtime.seconds, 1_000_000);
    write_back(&s.layer).await;
    assert_eq!(s.fake.data(&fh), vec![7; 4096]);
    assert_eq!(getattr(&s.layer, &fh).await.mtime.seconds, 1_000_000);
    assert_eq!(
        s.fake.calls(NfsProc::Write),
        1,
        "written back once, before the SETATTR"
    );
}

#[tokio::test]
async fn verifier_change_during_write_back_resends() {
    let s = setup(WritePolicy::WriteBack, 0);
    let fh = s.fake.create("a", &pattern(100, 9));
    let data = pattern(3 * BS, 10);
    write(&s.layer, &fh, 0, &data, stable_how::UNSTABLE).await;
    s.fake.reboot_before_next_commit();
    let report = write_back(&s.layer).await;
    assert_eq!(report.rewrites, 1);
    assert_eq!(s.fake.calls(NfsProc::Commit), 2);
    assert_eq!(s.fake.data(&fh), data);
    assert_eq!(s.layer.dirty_bytes(), 0);
}

#[tokio::test]
async fn upstream_change_drops_clean_blocks() {
    let s = setup(WritePolicy::WriteBack, 0);
    let fh = s.fake.create("a", &pattern(BS, 11));
    read(&s.layer, &fh, 0, 100).await;
    read(&s.layer, &fh, 0, 100).await;
    assert_eq!(s.fake.calls(NfsProc::Read), 1);
    let new = pattern(BS / 2, 12);
    s.fake.set_data(&fh, &new);
    assert_eq!(getattr(&s.layer, &fh).await.size, new.len() as u64);
    let (d, _, _) = read(&s.layer, &fh, 0, BS as u32).await;
    assert_eq!(d, new);
    assert_eq!(s.fake.calls(NfsProc::Read), 2);
    assert_eq!(s.layer.stats().counts.invalidations, 1);
}

#[tokio::test]
async fn own_writes_do_not_invalidate() {
    let s = setup(WritePolicy::WriteThrough, 0);
    let content = pattern(2 * BS, 13);
    let fh = s.fake.create("a", &content);
    read(&s.layer, &fh, 0, (2 * BS) as u32).await;
    write(&s.layer, &fh, 0, &pattern(1024, 14), stable_how::FILE_SYNC).await;
    getattr(&s.layer, &fh).await;
    read(&s.layer, &fh, BS as u64, 100).await;
    let (d, _, _) = read(&s.layer, &fh, 0, 1024).await;
    assert_eq!(d, pattern(1024, 14));
    assert_eq!(s.fake.calls(NfsProc::Read), 2, "one per block, then hits");
    assert_eq!(s.layer.stats().counts.invalidations, 0);
}

#[tokio::test]
async fn write_through_forwards_and_caches() {
    let s = setup(WritePolicy::WriteThrough, 0);
    let fh = s.fake.create("a", b"");
    let data = pattern(3 * BS, 15);
    let ok = write(&s.layer, &fh, 0, &data, stable_how::UNSTABLE).await;
    assert_eq!(s.fake.calls(NfsProc::Write), 1);
    assert_ne!(ok.verf.0, s.layer.store.verifier(), "upstream's verifier");
    assert_eq!(s.fake.data(&fh), data);
    commit(&s.layer, &fh).await;
    assert_eq!(s.fake.calls(NfsProc::Commit), 1);
    let (d, _, _) = read(&s.layer, &fh, 0, (3 * BS) as u32).await;
    assert_eq!(d, data);
    assert_eq!(s.fake.calls(NfsProc::Read), 0, "served from the cache");
    assert_eq!(s.layer.dirty_bytes(), 0);
}

#[tokio::test]
async fn flush_empties_the_cache() {
    let s = setup(WritePolicy::WriteBack, 0);
    let fh = s.fake.create("a", &pattern(3 * BS, 16));
    let fh2 = s.fake.create("b", b"");
    read(&s.layer, &fh, 0, (3 * BS) as u32).await;
    write(&s.layer, &fh2, 0, &pattern(5000, 17), stable_how::UNSTABLE).await;
    let reads = s.fake.calls(NfsProc::Read);
    let report = s.layer.flush().await.expect("flush");
    assert_eq!(report.files, 1);
    let st = s.layer.stats();
    assert_eq!((st.cached_bytes, st.dirty_bytes), (0, 0));
    assert_eq!(s.fake.data(&fh2), pattern(5000, 17));
    read(&s.layer, &fh, 0, 10).await;
    assert_eq!(s.fake.calls(NfsProc::Read), reads + 1);
}

#[tokio::test]
async fn committed_data_survives_a_crash() {
    let s = setup(WritePolicy::WriteBack, 0);
    let fh = s.fake.create("a", &pattern(1000, 18));
    let data = pattern(2 * BS + 777, 19);
    write(&s.layer, &fh, 500, &data, stable_how::UNSTABLE).await;
    let verf = commit(&s.layer, &fh).await;
    // Not committed: may be lost.
    write(&s.layer, &fh, 100_000, b"lost", stable_how::UNSTABLE).await;
    let Setup {
        fake,
        layer,
        disks,
        geo,
    } = s;
    drop(layer);
    for d in &disks {
        d.crash().expect("crash");
    }
    let layer = CacheLayer::new(
        fake.clone(),
        open(geo, &disks),
        CacheConfig::default(),
        SideChannels::default(),
    );
    let mut expect = pattern(1000, 18);
    expect.resize(500, 0);
    expect.extend_from_slice(&data);
    // The client resends what it did not see committed; the verifier tells.
    if layer.store.verifier() == verf.0 {
        assert_eq!(getattr(&layer, &fh).await.size, expect.len() as u64);
    }
    let report = write_back(&layer).await;
    assert!(report.bytes >= data.len() as u64);
    assert_eq!(fake.data(&fh), expect);
    assert_eq!(layer.dirty_bytes(), 0);
}

#[tokio::test]
async fn clean_restart_keeps_the_cache_warm_and_dirty_data() {
    let s = setup(WritePolicy::WriteBack, 0);
    let content = pattern(2 * BS, 20);
    let fh = s.fake.create("a", &content);
    let fh2 = s.fake.create("b", b"");
    read(&s.layer, &fh, 0, (2 * BS) as u32).await;
    write(&s.layer, &fh2, 0, b"dirty", stable_how::UNSTABLE).await;
    let reads = s.fake.calls(NfsProc::Read);
    s.layer.close().expect("close");
    assert!(
        s.layer
            .call(
                &cx(),
                NfsRequest::Getattr(GETATTR3args { object: fh3(&fh) })
            )
            .await
            .is_err()
    );
    let layer = CacheLayer::new(
        s.fake.clone(),
        open(s.geo, &s.disks),
        CacheConfig::default(),
        SideChannels::default(),
    );
    let (d, _, _) = read(&layer, &fh, 0, (2 * BS) as u32).await;
    assert_eq!(d, content);
    assert_eq!(s.fake.calls(NfsProc::Read), reads, "warm after restart");
    assert_eq!(getattr(&layer, &fh2).await.size, 5);
    write_back(&layer).await;
    assert_eq!(s.fake.data(&fh2), b"dirty");
}

#[tokio::test]
async fn remove_drops_cached_and_dirty_data() {
    let s = setup(WritePolicy::WriteBack, 0);
    let fh = s.fake.create("a", b"");
    write(&s.layer, &fh, 0, &pattern(3000, 21), stable_how::UNSTABLE).await;
    let req = NfsRequest::Remove(REMOVE3args {
        object: diropargs3 {
            dir: fh3(ROOT),
            name: b"a".to_vec().into(),
        },
    });
    assert_eq!(
        s.layer.call(&cx(), req).await.expect("remove").status(),
        nfsstat3::NFS3_OK
    );
    assert!(!s.fake.exists(&fh));
    assert_eq!(s.layer.dirty_bytes(), 0);
    assert_eq!(write_back(&s.layer).await, WriteBackReport::default());
    assert_eq!(s.fake.calls(NfsProc::Write), 0);
}

#[tokio::test]
async fn write_back_of_a_file_removed_upstream_drops_its_data() {
    let s = setup(WritePolicy::WriteBack, 0);
    let fh = s.fake.create("a", b"");
    write(&s.layer, &fh, 0, &pattern(3000, 22), stable_how::UNSTABLE).await;
    // Removed behind the cache's back.
    let req = NfsRequest::Remove(REMOVE3args {
        object: diropargs3 {
            dir: fh3(ROOT),
            name: b"a".to_vec().into(),
        },
    });
    s.fake.call(&cx(), req).await.expect("remove");
    write_back(&s.layer).await;
    assert_eq!(s.layer.dirty_bytes(), 0);
}

#[test]
fn policy_parses() {
    assert_eq!("write-back".parse(), Ok(WritePolicy::WriteBack));
    assert_eq!("write-through".parse(), Ok(WritePolicy::WriteThrough));
    assert!("sometimes".parse::<WritePolicy>().is_err());
    assert_eq!(WritePolicy::WriteThrough.to_string(), "write-through");
    assert_eq!(CacheConfig::default().readahead_blocks, 32);
}

/// The layer's futures can be spawned on a multi-threaded runtime.
#[allow(dead_code)]
fn futures_are_send(l: Arc<CacheLayer>) {
    fn send<T: Send>(_: T) {}
    let cx = cx();
    send(l.write_back(&|_, _| {}));
    send(l.flush());
    send(l.call(&cx, NfsRequest::Getattr(GETATTR3args { object: fh3(b"x") })));
}

#[tokio::test]
async fn big_sequential_write_through_a_tiny_cache() {
    let geo = Geometry::new(GeometryConfig {
        capacity: 1 << 20,
        banks: 1,
        ways: 2,
        block_size: 64 << 10,
        sub_block_size: 4096,
    })
    .expect("geometry");
    let s = setup_with(geo, CacheConfig::default());
    let fh = s.fake.create("big", b"");
    let data = pattern(9 * (1 << 20) + 123, 23);
    for (i, chunk) in data.chunks(1 << 20).enumerate() {
        write(&s.layer, &fh, (i << 20) as u64, chunk, stable_how::UNSTABLE).await;
    }
    commit(&s.layer, &fh).await;
    let (d, _, _) = read(&s.layer, &fh, 0, 1 << 20).await;
    assert_eq!(d, data[..1 << 20]);
    write_back(&s.layer).await;
    assert_eq!(s.fake.data(&fh), data);
}
