//! Criterion benchmarks of the sans-IO protocol core: record reassembly,
//! call-header parsing, and NFSv3 argument/result codecs on the hot path
//! (1 MiB READ replies and WRITE calls, GETATTR).

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use gvfs_nfs::nfs3_types::nfs3::*;
use gvfs_nfs::nfs3_types::xdr_codec::Opaque;
use gvfs_nfs::proc::{NfsProc, NfsReply, NfsRequest};
use gvfs_nfs::record::{RecordLimits, RecordReader};
use gvfs_nfs::rpc::{self, Credentials};

fn fh() -> nfs_fh3 {
    nfs_fh3 {
        data: Opaque::owned(vec![7; 32]),
    }
}

fn write_call(len: usize) -> Vec<u8> {
    let mut rec = rpc::call_record(1, 100_003, 3, 7, &Credentials::unix(1000, 1000));
    NfsRequest::Write(WRITE3args {
        file: fh(),
        offset: 0,
        count: len as u32,
        stable: stable_how::UNSTABLE,
        data: Opaque::owned(vec![0xAB; len]),
    })
    .encode(&mut rec);
    rpc::seal(rec)
}

fn records(c: &mut Criterion) {
    let mut g = c.benchmark_group("record");
    for len in [4096usize, 1 << 20] {
        let wire = write_call(len);
        g.throughput(Throughput::Bytes(wire.len() as u64));
        g.bench_with_input(
            BenchmarkId::new("reassemble_64k_reads", len),
            &wire,
            |b, wire| {
                b.iter(|| {
                    let mut r = RecordReader::new(RecordLimits::for_payload(1 << 20));
                    let mut got = 0;
                    for chunk in wire.chunks(64 * 1024) {
                        let mut chunk = chunk;
                        while !chunk.is_empty() {
                            let used = r.feed(chunk).expect("valid record");
                            chunk = &chunk[used..];
                            if let Some(rec) = r.take_record() {
                                got += rec.len();
                            }
                        }
                    }
                    got
                });
            },
        );
    }
    g.finish();
}

fn calls(c: &mut Criterion) {
    let mut g = c.benchmark_group("call");
    for len in [4096usize, 1 << 20] {
        let wire = write_call(len);
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_with_input(
            BenchmarkId::new("decode_write", len),
            &wire[4..],
            |b, msg| {
                b.iter(|| {
                    let (hdr, at) = rpc::parse_call(msg).expect("valid call");
                    NfsRequest::decode(hdr.proc_, &msg[at..]).expect("valid args")
                });
            },
        );
    }
    let mut getattr = rpc::call_record(1, 100_003, 3, 1, &Credentials::unix(0, 0));
    NfsRequest::Getattr(GETATTR3args { object: fh() }).encode(&mut getattr);
    let getattr = rpc::seal(getattr);
    g.bench_function("decode_getattr", |b| {
        b.iter(|| {
            let (hdr, at) = rpc::parse_call(&getattr[4..]).expect("valid call");
            NfsRequest::decode(hdr.proc_, &getattr[4 + at..]).expect("valid args")
        });
    });
    g.finish();
}

fn replies(c: &mut Criterion) {
    let mut g = c.benchmark_group("reply");
    let len = 1usize << 20;
    let reply = NfsReply::Read(Nfs3Result::Ok(READ3resok {
        file_attributes: Nfs3Option::None,
        count: len as u32,
        eof: false,
        data: Opaque::owned(vec![0xCD; len]),
    }));
    g.throughput(Throughput::Bytes(len as u64));
    g.bench_function("encode_read_1m", |b| {
        b.iter(|| {
            let mut out = rpc::reply_start(1, rpc::ReplyStatus::Success, len + 128);
            reply.encode(&mut out);
            rpc::seal(out)
        });
    });
    let mut results = Vec::new();
    reply.encode(&mut results);
    g.bench_function("decode_read_1m", |b| {
        b.iter(|| NfsReply::decode(NfsProc::Read, &results).expect("valid reply"));
    });
    g.finish();
}

criterion_group!(benches, records, calls, replies);

/// Runs with the proxy's allocator settings, so 1 MiB buffers behave as in
/// `gvfs-proxy` rather than each costing a fresh `mmap`.
fn main() {
    gvfs_proxy::alloc::tune_for_large_buffers();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
