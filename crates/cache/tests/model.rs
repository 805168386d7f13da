//! Model-based test of the block store: random sequences of client writes,
//! reads with fills, truncates, write-backs, syncs, crashes (lost, torn and
//! reordered unsynced writes) and clean restarts, on a tiny cache under
//! eviction pressure, checked against a HashMap model of upstream and of what
//! the client wrote.

use std::collections::HashMap;

use gvfs_cache::{
    BlockStore, Error, FaultyStorage, Geometry, GeometryConfig, MemStorage, OpenOptions, Storage,
    UncleanShutdown, WriteFate, WriteMode, WriteOutcome,
};
use proptest::prelude::*;

const BLOCK: u32 = 16 << 10;
const SUB: u32 = 4 << 10;
const FILES: u8 = 3;
const BLOCKS_PER_FILE: u64 = 6;
const FILE_LEN: usize = BLOCK as usize * BLOCKS_PER_FILE as usize;

fn geometry() -> Geometry {
    // 2 banks x 4 sets x 2 ways x 16 KiB = 256 KiB for 288 KiB of files.
    Geometry::new(GeometryConfig {
        capacity: 2 * 4 * 2 * u64::from(BLOCK),
        banks: 2,
        ways: 2,
        block_size: BLOCK,
        sub_block_size: SUB,
    })
    .expect("valid geometry")
}

fn fh(file: u8) -> Vec<u8> {
    let mut h = b"handle-of-file-".to_vec();
    h.push(file);
    h
}

#[derive(Debug, Clone)]
enum Op {
    Write {
        file: u8,
        offset: usize,
        len: usize,
        seed: u8,
    },
    Read {
        file: u8,
        block: u64,
    },
    Truncate {
        file: u8,
        size: usize,
    },
    WriteBackAll,
    Sync,
    Crash {
        how: CrashHow,
    },
    CloseReopen,
    InjectIoError {
        bank: usize,
        n: u64,
    },
}

#[derive(Debug, Clone, Copy)]
enum CrashHow {
    LoseAll,
    TearLast(usize),
    Random(u64),
    /// Only the process died, in the middle of its writes to `bank`: the
    /// first `keep` writes since the last sync landed, the first `torn`
    /// bytes of the next one, no later one (the other bank kept all of
    /// its). A kill stops a write only between pages; tearing anywhere is
    /// harsher, and tears the model's small tags, which straddle no page.
    Process {
        bank: usize,
        keep: usize,
        torn: usize,
    },
}

#[derive(Debug, Clone)]
enum Logged {
    Write {
        file: u8,
        offset: usize,
        data: Vec<u8>,
    },
    Truncate {
        file: u8,
        size: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..FILES, 0..FILE_LEN, 1usize..20_000, any::<u8>()).prop_map(|(file, offset, len, seed)| {
            Op::Write { file, offset, len: len.min(FILE_LEN - offset), seed }
        }),
        // Sub-block aligned writes are the common case of NFS clients.
        4 => (0..FILES, 0..(FILE_LEN / SUB as usize), 1usize..6, any::<u8>()).prop_map(|(file, sb, n, seed)| {
            let offset = sb * SUB as usize;
            Op::Write { file, offset, len: (n * SUB as usize).min(FILE_LEN - offset), seed }
        }),
        6 => (0..FILES, 0..BLOCKS_PER_FILE).prop_map(|(file, block)| Op::Read { file, block }),
        1 => (0..FILES, 0..FILE_LEN).prop_map(|(file, size)| Op::Truncate { file, size }),
        2 => Just(Op::WriteBackAll),
        2 => Just(Op::Sync),
        1 => Just(Op::Crash { how: CrashHow::LoseAll }),
        1 => (0usize..20_000).prop_map(|n| Op::Crash { how: CrashHow::TearLast(n) }),
        2 => any::<u64>().prop_map(|s| Op::Crash { how: CrashHow::Random(s) }),
        2 => (0usize..2, 0usize..40, 0usize..20_000).prop_map(|(bank, keep, torn)| {
            Op::Crash { how: CrashHow::Process { bank, keep, torn } }
        }),
        1 => Just(Op::CloseReopen),
        1 => (0usize..2, 0u64..12).prop_map(|(bank, n)| Op::InjectIoError { bank, n }),
    ]
}

struct Harness {
    storages: Vec<FaultyStorage<MemStorage>>,
    store: Option<BlockStore>,
    upstream: HashMap<u8, Vec<u8>>,
    truth: HashMap<u8, Vec<u8>>,
    /// Client operations since the last sync, resent if the verifier changes.
    log: Vec<Logged>,
    verifier: [u8; 8],
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

impl Harness {
    fn new() -> Harness {
        let storages: Vec<_> = (0..2)
            .map(|_| FaultyStorage::new(MemStorage::new()))
            .collect();
        let mut h = Harness {
            storages,
            store: None,
            upstream: (0..FILES).map(|f| (f, vec![0u8; FILE_LEN])).collect(),
            truth: (0..FILES).map(|f| (f, vec![0u8; FILE_LEN])).collect(),
            log: Vec::new(),
            verifier: [0; 8],
        };
        let report = h.open(UncleanShutdown::Unknown);
        assert!(report.new_cache);
        h.verifier = h.store().verifier();
        h
    }

    fn open(&mut self, unclean: UncleanShutdown) -> gvfs_cache::RecoveryReport {
        let boxed: Vec<Box<dyn Storage>> = self
            .storages
            .iter()
            .map(|s| Box::new(s.clone()) as Box<dyn Storage>)
            .collect();
        let options = OpenOptions {
            unclean,
            ..OpenOptions::default()
        };
        let (store, report) = BlockStore::open(boxed, geometry(), options).expect("open");
        self.store = Some(store);
        report
    }

    fn store(&self) -> &BlockStore {
        self.store.as_ref().expect("store open")
    }

    fn write_back_block(&mut self, file: u8, block: u64) {
        let store = self.store.as_ref().expect("store open");
        let Some(d) = store.dirty_data(&fh(file), block).expect("dirty_data") else {
            return;
        };
        // dirty_data synced everything first.
        self.log.clear();
        let up = self.upstream.get_mut(&file).expect("file");
        let base = (block * u64::from(BLOCK)) as usize;
        for e in &d.extents {
            let at = base + e.offset as usize;
            up[at..at + e.data.len()].copy_from_slice(&e.data);
        }
        store.mark_clean(&d).expect("mark_clean");
    }

    fn file_of(h: &[u8]) -> u8 {
        h[h.len() - 1]
    }

    fn fill_block(&mut self, file: u8, block: u64) -> WriteOutcome {
        let base = (block * u64::from(BLOCK)) as usize;
        let data = self.upstream[&file][base..base + BLOCK as usize].to_vec();
        self.store()
            .write(&fh(file), block, 0, &data, WriteMode::Clean)
            .expect("fill")
    }

    /// A client WRITE through a minimal layer: fill the block from upstream
    /// when a write would leave a gap in a partial sub-block, write back
    /// when the set is all dirty, retry.
    fn client_write(&mut self, file: u8, offset: usize, data: &[u8]) {
        let mut pos = 0;
        while pos < data.len() {
            let at = offset + pos;
            let block = (at / BLOCK as usize) as u64;
            let in_block = (at % BLOCK as usize) as u32;
            let n = (BLOCK as usize - in_block as usize).min(data.len() - pos);
            let chunk = &data[pos..pos + n];
            let mut tries = 0;
            loop {
                tries += 1;
                assert!(tries < 20, "write did not make progress");
                match self
                    .store()
                    .write(&fh(file), block, in_block, chunk, WriteMode::Dirty)
                {
                    Ok(WriteOutcome::Stored) => break,
                    Ok(WriteOutcome::NeedsWriteBack(v)) => {
                        self.write_back_block(Self::file_of(v.fh.as_bytes()), v.block)
                    }
                    Err(Error::PartialSubBlockWrite { .. }) => {
                        if let WriteOutcome::NeedsWriteBack(v) = self.fill_block(file, block) {
                            self.write_back_block(Self::file_of(v.fh.as_bytes()), v.block);
                        }
                    }
                    Err(e) => panic!("write failed: {e}"),
                }
            }
            pos += n;
        }
        self.truth.get_mut(&file).expect("file")[offset..offset + data.len()].copy_from_slice(data);
    }

    fn truncate(&mut self, file: u8, size: usize) {
        self.store()
            .truncate(&fh(file), size as u64)
            .expect("truncate");
        self.truth.get_mut(&file).expect("file")[size..].fill(0);
        self.upstream.get_mut(&file).expect("file")[size..].fill(0);
    }

    /// Every sub-block reads back as the model says: from the cache on a
    /// hit, from upstream on a miss.
    fn check_visible(&self) {
        for file in 0..FILES {
            for block in 0..BLOCKS_PER_FILE {
                for sb in 0..BLOCK / SUB {
                    let at = (block * u64::from(BLOCK)) as usize + (sb * SUB) as usize;
                    let want = &self.truth[&file][at..at + SUB as usize];
                    match self
                        .store()
                        .read(&fh(file), block, sb * SUB, SUB)
                        .expect("read")
                    {
                        Some(got) => assert!(
                            got == want,
                            "cache hit differs: file {file} block {block} sub-block {sb}"
                        ),
                        None => {
                            // What a reader sees: upstream's bytes with the
                            // dirty bytes of partial sub-blocks laid over.
                            let mut got = self.upstream[&file][at..at + SUB as usize].to_vec();
                            let lo = sb * SUB;
                            let overlay = self
                                .store()
                                .dirty_overlay(&fh(file), block)
                                .expect("dirty_overlay");
                            for e in overlay.iter().flat_map(|d| &d.extents) {
                                let end = e.offset + e.data.len() as u32;
                                let (a, b) = (e.offset.max(lo), end.min(lo + SUB));
                                if a < b {
                                    got[(a - lo) as usize..(b - lo) as usize].copy_from_slice(
                                        &e.data[(a - e.offset) as usize..(b - e.offset) as usize],
                                    );
                                }
                            }
                            assert!(
                                got == want,
                                "miss, and upstream + dirty differs: file {file} block {block} sub-block {sb}"
                            )
                        }
                    }
                }
            }
        }
    }

    fn valid_map(&self) -> Vec<gvfs_cache::SubBlockMask> {
        let mut out = Vec::new();
        for file in 0..FILES {
            for block in 0..BLOCKS_PER_FILE {
                out.push(
                    self.store()
                        .valid_sub_blocks(&fh(file), block)
                        .expect("valid"),
                );
            }
        }
        out
    }

    fn crash_and_reopen(&mut self, how: CrashHow) {
        self.store = None;
        for (i, s) in self.storages.iter().enumerate() {
            match how {
                CrashHow::LoseAll => s.crash(),
                CrashHow::TearLast(n) => s.crash_tearing_last(n),
                CrashHow::Random(seed) => {
                    let mut st = seed.wrapping_add(i as u64) | 1;
                    s.crash_with(|_, len| match xorshift(&mut st) % 3 {
                        0 => WriteFate::Lost,
                        1 => WriteFate::Kept,
                        _ => WriteFate::Torn(xorshift(&mut st) as usize % (len + 1)),
                    })
                }
                CrashHow::Process { bank, keep, torn } => s.crash_with(|w, len| {
                    if i != bank || w < keep {
                        WriteFate::Kept
                    } else if w == keep {
                        WriteFate::Torn(torn % (len + 1))
                    } else {
                        WriteFate::Lost
                    }
                }),
            }
            .expect("crash");
        }
        let unclean = match how {
            CrashHow::Process { .. } => UncleanShutdown::ProcessOnly,
            _ => UncleanShutdown::SystemCrash,
        };
        let report = self.open(unclean);
        let v = self.store().verifier();
        assert_eq!(report.verifier_changed, v != self.verifier, "{report:?}");
        if v == self.verifier {
            // Nothing acknowledged may have been lost.
            self.check_visible();
        } else {
            // The client sees a new verifier and resends everything it
            // wrote since its last successful COMMIT.
            self.verifier = v;
            let log = std::mem::take(&mut self.log);
            for l in &log {
                match l {
                    Logged::Write { file, offset, data } => self.client_write(*file, *offset, data),
                    Logged::Truncate { file, size } => self.truncate(*file, *size),
                }
            }
            self.log = log;
            self.check_visible();
        }
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Write {
                file,
                offset,
                len,
                seed,
            } => {
                if len == 0 {
                    return;
                }
                let data: Vec<u8> = (0..len)
                    .map(|i| seed.wrapping_add((i / 7) as u8).max(1))
                    .collect();
                self.client_write(file, offset, &data);
                self.log.push(Logged::Write { file, offset, data });
            }
            Op::Read { file, block } => {
                let got = self.store().read(&fh(file), block, 0, BLOCK).expect("read");
                if got.is_none() && self.fill_block(file, block) == WriteOutcome::Stored {
                    let got = self.store().read(&fh(file), block, 0, BLOCK).expect("read");
                    assert!(got.is_some(), "a filled block must hit");
                }
            }
            Op::Truncate { file, size } => {
                self.truncate(file, size);
                self.log.push(Logged::Truncate { file, size });
            }
            Op::WriteBackAll => {
                let dirty = self.store().dirty_blocks(None).expect("dirty_blocks");
                let mut prev = None;
                for d in dirty {
                    let key = (d.fh.clone(), d.block);
                    assert!(prev.as_ref() < Some(&key), "dirty_blocks out of order");
                    prev = Some(key);
                    self.write_back_block(Self::file_of(d.fh.as_bytes()), d.block);
                }
                assert_eq!(self.store().stats().dirty_bytes, 0);
                assert_eq!(
                    self.upstream, self.truth,
                    "write-back did not reproduce the files"
                );
            }
            Op::Sync => {
                self.store().sync().expect("sync");
                self.log.clear();
            }
            Op::Crash { how } => self.crash_and_reopen(how),
            Op::CloseReopen => {
                let before = self.valid_map();
                self.store.take().expect("store").close().expect("close");
                self.log.clear();
                let report = self.open(UncleanShutdown::Unknown);
                assert!(!report.verifier_changed, "{report:?}");
                assert_eq!(report.unclean_banks, 0);
                assert_eq!(self.store().verifier(), self.verifier);
                assert_eq!(
                    self.valid_map(),
                    before,
                    "cache not warm after a clean restart"
                );
            }
            Op::InjectIoError { bank, n } => {
                // An injected I/O error: whatever operation hits it fails or
                // poisons the store; the proxy would crash-restart. Here the
                // next op that fails is turned into a crash.
                self.storages[bank].fail_nth_op(n);
                let r = self.store().sync();
                if r.is_err() {
                    self.crash_and_reopen(CrashHow::LoseAll);
                } else {
                    self.log.clear();
                    // Disarm what the sync did not reach.
                    self.storages[bank].fail_nth_op(u64::MAX - 1_000_000);
                }
            }
        }
        self.check_visible();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn block_store_matches_model(ops in proptest::collection::vec(op(), 1..60)) {
        let mut h = Harness::new();
        for op in &ops {
            h.apply(op);
        }
        // Finally everything written back reproduces the files.
        h.apply(&Op::WriteBackAll);
    }
}

/// A torn tag write after a sync must not lose the committed dirty data the
/// tag's previous version described (found by the model test).
#[test]
fn torn_tag_after_sync_keeps_committed_data() {
    let mut h = Harness::new();
    h.apply(&Op::Write {
        file: 2,
        offset: 26591,
        len: 6178,
        seed: 0,
    });
    h.apply(&Op::Sync);
    h.apply(&Op::Write {
        file: 2,
        offset: 15457,
        len: 928,
        seed: 0,
    });
    h.apply(&Op::Crash {
        how: CrashHow::Random(16162790620507039315),
    });
    for bank in 0..2 {
        for tear in [0, 1, 64, 112, 127, 4000] {
            h.apply(&Op::Write {
                file: 2,
                offset: 16384 + bank * 100,
                len: 9000,
                seed: tear as u8,
            });
            h.apply(&Op::Sync);
            h.apply(&Op::Write {
                file: 2,
                offset: 15457,
                len: 928,
                seed: 3,
            });
            h.apply(&Op::Crash {
                how: CrashHow::TearLast(tear),
            });
        }
    }
    h.apply(&Op::WriteBackAll);
}

/// An eviction not yet durable must not bring back a stale block after a
/// truncate and a crash (found by the model test).
#[test]
fn truncate_after_unsynced_eviction_stays_truncated() {
    let mut h = Harness::new();
    h.apply(&Op::Write {
        file: 2,
        offset: 0,
        len: 1,
        seed: 0,
    });
    h.apply(&Op::Write {
        file: 1,
        offset: 81920,
        len: 8192,
        seed: 0,
    });
    h.apply(&Op::WriteBackAll);
    h.apply(&Op::Read { file: 0, block: 2 });
    h.apply(&Op::Truncate { file: 1, size: 0 });
    h.apply(&Op::Crash {
        how: CrashHow::Random(9998583433095150704),
    });
    h.apply(&Op::WriteBackAll);
}

/// A sub-block committed as a partial extent, then written whole and
/// committed again, keeps all of its committed bytes when a later update of
/// it is torn in a crash: recovery must not go back to the older tag's
/// extent (found by the model test).
#[test]
fn torn_update_of_a_sub_block_committed_whole_keeps_it_whole() {
    let mut h = Harness::new();
    for op in [
        Op::Write {
            file: 0,
            offset: 82752,
            len: 3265,
            seed: 0,
        },
        Op::CloseReopen,
        Op::Write {
            file: 0,
            offset: 67881,
            len: 18136,
            seed: 0,
        },
        Op::Crash {
            how: CrashHow::Random(3833852267494932641),
        },
        Op::Sync,
        Op::Write {
            file: 0,
            offset: 57344,
            len: 12288,
            seed: 0,
        },
        Op::Write {
            file: 2,
            offset: 65536,
            len: 1,
            seed: 0,
        },
        Op::Write {
            file: 0,
            offset: 68168,
            len: 13753,
            seed: 0,
        },
        Op::Crash {
            how: CrashHow::Random(1345269632902742003),
        },
        Op::WriteBackAll,
    ] {
        h.apply(&op);
    }
}
