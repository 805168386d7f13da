//! Criterion benchmarks of the block cache's storage core (`gvfs_cache`):
//! the set index of a (file handle, block) pair, a lookup that touches no
//! data, and READ hits of 4 KiB and 64 KiB out of a [`BlockStore`] over the
//! in-memory backend and over bank files in a temporary directory (warm in
//! the page cache: this is the CPU cost of a hit, not the disk's).
//!
//! The end-to-end hit path (a 64 KiB NFS READ through a caching proxy) is
//! measured in `benches/cache.rs`, part "hit latency".
//!
//! `store/crc32` is what checking a hit's sub-blocks against their
//! checksums costs, inside `store/read_hit`.
//!
//! Run: `cargo bench --bench cache_store`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use gvfs_cache::{
    BlockStore, Geometry, GeometryConfig, MemStorage, OpenOptions, Storage, WriteMode, WriteOutcome,
};

/// Blocks filled before measuring: 1024 x 64 KiB = 64 MiB, in a 256 MiB
/// cache, so every lookup is a hit and no eviction happens.
const BLOCKS: u64 = 1024;
const BLOCK: u32 = 64 << 10;

fn geometry() -> Geometry {
    Geometry::new(GeometryConfig {
        capacity: 256 << 20,
        ..GeometryConfig::default()
    })
    .expect("valid geometry")
}

/// A 32-byte file handle, the size ganesha hands out for VFS exports is
/// similar (ours carry up to 64).
fn fh() -> Vec<u8> {
    (0u8..32).map(|i| i.wrapping_mul(37)).collect()
}

fn fill(store: &BlockStore) {
    let fh = fh();
    let data: Vec<u8> = (0..BLOCK).map(|i| (i % 251) as u8).collect();
    for b in 0..BLOCKS {
        let outcome = store
            .write(&fh, b, 0, &data, WriteMode::Clean)
            .expect("filling the cache");
        assert_eq!(outcome, WriteOutcome::Stored, "block {b} was not stored");
    }
}

fn mem_store() -> BlockStore {
    let g = geometry();
    let storages: Vec<Box<dyn Storage>> = (0..g.banks())
        .map(|_| Box::new(MemStorage::new()) as Box<dyn Storage>)
        .collect();
    let (store, _) = BlockStore::open(storages, g, OpenOptions::default()).expect("open");
    fill(&store);
    store
}

fn file_store(dir: &std::path::Path) -> BlockStore {
    let (store, _) =
        BlockStore::open_dir(dir, geometry(), OpenOptions::default()).expect("open_dir");
    fill(&store);
    store
}

fn set_index(c: &mut Criterion) {
    let g = geometry();
    let fh = fh();
    let mut block = 0u64;
    c.bench_function("geometry/set_index", |b| {
        b.iter(|| {
            block = block.wrapping_add(1);
            black_box(g.set_index(black_box(&fh), block))
        })
    });
}

fn store_ops(c: &mut Criterion) {
    let dir = tempfile::Builder::new()
        .prefix("gvfs-bench-cache-")
        .tempdir()
        .expect("tempdir");
    let stores = [("mem", mem_store()), ("file", file_store(dir.path()))];
    let fh = fh();

    let mut g = c.benchmark_group("store/lookup");
    for (name, store) in &stores {
        let mut block = 0u64;
        g.bench_function(BenchmarkId::new("valid_sub_blocks_hit", name), |b| {
            b.iter(|| {
                block = (block + 1) % BLOCKS;
                black_box(store.valid_sub_blocks(&fh, block).expect("lookup"))
            })
        });
        let mut block = BLOCKS;
        g.bench_function(BenchmarkId::new("read_miss", name), |b| {
            b.iter(|| {
                block += 1;
                black_box(store.read(&fh, block, 0, 4096).expect("read"))
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("store/read_hit");
    for len in [4u32 << 10, BLOCK] {
        g.throughput(Throughput::Bytes(u64::from(len)));
        for (name, store) in &stores {
            let mut block = 0u64;
            g.bench_function(BenchmarkId::new(name.to_string(), len), |b| {
                b.iter(|| {
                    block = (block + 1) % BLOCKS;
                    let got = store.read(&fh, block, 0, len).expect("read");
                    assert!(got.is_some(), "block {block} should be a hit");
                    black_box(got)
                })
            });
        }
    }
    g.finish();
}

/// What checking a hit adds: CRC32 (`crc32fast`, the function the store
/// checks every sub-block with) of the bytes a hit returns, measured in the
/// same run as the hits, which include it.
fn checksum(c: &mut Criterion) {
    let mut g = c.benchmark_group("store/crc32");
    for len in [4usize << 10, BLOCK as usize] {
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_function(BenchmarkId::from_parameter(len), |b| {
            b.iter(|| {
                black_box(
                    data.chunks(4096)
                        .map(crc32fast::hash)
                        .fold(0u32, |a, c| a ^ c),
                )
            })
        });
    }
    g.finish();
}

criterion_group!(benches, set_index, store_ops, checksum);

/// Runs with the proxy's allocator settings, as `gvfs-proxy` does.
fn main() {
    gvfs_proxy::alloc::tune_for_large_buffers();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
