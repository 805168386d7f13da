//! The extension server alone, through its program API, on the in-memory
//! NFSv3 server and a file cache in a temporary directory.

use std::sync::Arc;

use gvfs_ext::testing::FakeSource;
use gvfs_ext::{self as ext, FetchArgs, StoreArgs, profile};
use gvfs_filecache::{FileCache, FileCacheParts, MemIndex, Profiles};
use gvfs_nfs::layer::Calls;
use gvfs_nfs::nfs3_types::nfs3::{fattr3, nfsstat3};
use gvfs_nfs::rpc::{CallHeader, Credentials, ReplyStatus};
use gvfs_nfs::testing::MemNfs;
use gvfs_nfs::{CallContext, FileVersion};

use super::ExtServer;
use crate::front::program::{Answer, Call, FrontCounters, Program};

/// A file of a few chunks' worth of varied bytes.
fn image() -> Vec<u8> {
    (0..(ext::CHUNK as usize * 2 + 4096))
        .map(|i| (i / 4096) as u8 ^ (i % 251) as u8)
        .collect()
}

struct Bed {
    mem: Arc<MemNfs>,
    server: Arc<ExtServer>,
    counters: FrontCounters,
    fh: Vec<u8>,
    _dir: tempfile::TempDir,
}

/// A server over `mem` holding `image()`, with a file cache and kept
/// profiles; with `upstream`, its upstream's extension is that source.
fn bed(upstream: Option<Arc<FakeSource>>) -> Bed {
    let mem = MemNfs::new();
    let mut fh = Vec::new();
    // The source answers for mtime 7: the seventh version is the one
    // the in-memory server holds.
    for _ in 0..7 {
        fh = mem.create("image", &image());
    }
    let dir = tempfile::tempdir().unwrap();
    let files = FileCache::open(dir.path(), None, 1 << 30, FileCacheParts::default()).unwrap();
    let profiles = Profiles::new(Arc::new(MemIndex::new(64)));
    let server = ExtServer::new(
        mem.clone(),
        Some(files),
        upstream.map(|u| u as Arc<dyn ext::ChunkSource>),
        None,
        Some(profiles),
    );
    Bed {
        mem,
        server,
        counters: FrontCounters::default(),
        fh,
        _dir: dir,
    }
}

impl Bed {
    /// Calls procedure `proc_` of version `vers` with `args`.
    async fn call(&self, vers: u32, proc_: u32, args: &[u8]) -> Answer {
        let hdr = CallHeader {
            xid: 1,
            prog: ext::PROGRAM,
            vers,
            proc_,
            cred: Credentials::unix(0, 0),
            cred_flavor: gvfs_nfs::rpc::flavor::UNIX,
        };
        let cx = CallContext::with_cred(Credentials::unix(0, 0));
        let call = Call {
            hdr: &hdr,
            cx: &cx,
            peer: crate::drc::PeerId::Unknown,
            args,
            counters: &self.counters,
        };
        self.server.answer(call).await
    }

    /// The results of a call that must succeed.
    async fn results(&self, proc_: u32, args: &[u8]) -> Vec<u8> {
        match self.call(ext::VERSION, proc_, args).await {
            Answer::Results(r) => r,
            _ => panic!("procedure {proc_} was refused"),
        }
    }

    async fn attrs(&self) -> fattr3 {
        let cx = CallContext::default();
        match self.mem.getattr(&cx, &self.fh).await.unwrap() {
            gvfs_nfs::nfs3_types::nfs3::Nfs3Result::Ok(ok) => ok.obj_attributes,
            _ => panic!("no attributes"),
        }
    }

    fn fetch_args(&self, offset: u64, count: u32) -> Vec<u8> {
        let mut out = Vec::new();
        FetchArgs {
            fh: self.fh.clone(),
            offset,
            count,
            have: None,
        }
        .encode(&mut out);
        out
    }
}

fn refused(a: Answer) -> Option<ReplyStatus> {
    match a {
        Answer::Refused(st) => Some(st),
        _ => None,
    }
}

#[tokio::test]
async fn fetches_read_below_and_compressed_here_are_the_files_bytes() {
    let b = bed(None);
    let data = image();
    let res = b
        .results(ext::PROC_FETCH, &b.fetch_args(0, ext::CHUNK))
        .await;
    let ok = ext::decode_fetch_res(&res).unwrap().unwrap();
    assert!(!ok.eof);
    assert_eq!(ext::decompress(ok).unwrap(), &data[..ext::CHUNK as usize]);
    // The last chunk is short and says so.
    let last = 2 * u64::from(ext::CHUNK);
    let res = b
        .results(ext::PROC_FETCH_REPEATS, &b.fetch_args(last, ext::CHUNK))
        .await;
    let ok = ext::decode_fetch_repeats_res(&res).unwrap().unwrap();
    assert!(ok.eof && ok.repeats.is_empty());
    assert_eq!(ext::decompress(ok).unwrap(), &data[last as usize..]);
    let s = b.server.stats();
    assert_eq!((s.fetch_calls, s.compressed_here, s.errors), (2, 2, 0));
    assert_eq!(s.raw_bytes, data.len() as u64 - u64::from(ext::CHUNK));
}

#[tokio::test]
async fn fetches_go_through_the_file_cache_when_upstream_speaks() {
    let source = FakeSource::new(image(), true);
    let b = bed(Some(source.clone()));
    let res = b
        .results(ext::PROC_FETCH_REPEATS, &b.fetch_args(0, ext::CHUNK))
        .await;
    let ok = ext::decode_fetch_repeats_res(&res).unwrap().unwrap();
    assert_eq!(
        ext::decompress(ok).unwrap(),
        &image()[..ext::CHUNK as usize]
    );
    let s = b.server.stats();
    assert_eq!((s.fetch_calls, s.from_file_cache, s.errors), (1, 1, 0));
    assert!(source.calls.load(std::sync::atomic::Ordering::Relaxed) >= 1);
}

#[tokio::test]
async fn a_fetch_of_a_handle_nobody_has_fails_with_its_status() {
    let b = bed(None);
    let mut args = Vec::new();
    FetchArgs {
        fh: b"no-such-file".to_vec(),
        offset: 0,
        count: 4096,
        have: None,
    }
    .encode(&mut args);
    let res = b.results(ext::PROC_FETCH, &args).await;
    assert!(ext::decode_fetch_res(&res).unwrap().is_err());
    assert_eq!(b.server.stats().errors, 1);
}

#[tokio::test]
async fn hello_answers_the_capabilities_both_speak() {
    let b = bed(None);
    let mut args = Vec::new();
    gvfs_nfs::xdr::put_u32(&mut args, ext::Caps::ALL.0);
    let res = b.results(ext::PROC_HELLO, &args).await;
    let mut r = gvfs_nfs::xdr::XdrReader::new(&res);
    assert_eq!(r.u32().unwrap(), ext::hello_answer(ext::Caps::ALL.0));
    assert_eq!(b.server.stats().hello_calls, 1);
    // A HELLO with a word too many is garbage.
    args.extend_from_slice(&[0; 4]);
    assert_eq!(
        refused(b.call(ext::VERSION, ext::PROC_HELLO, &args).await),
        Some(ReplyStatus::GarbageArgs)
    );
}

#[tokio::test]
async fn a_store_is_written_below_unless_its_guard_is_stale() {
    let b = bed(None);
    let before = b.attrs().await;
    let chunk = vec![0xab_u8; 4096];
    let mut store = StoreArgs::new(b.fh.clone(), 8192, &chunk, 3);
    // A guard naming another version: refused, nothing written.
    let mut stale = FileVersion::of(&before);
    stale.size += 1;
    store.guard = Some(stale);
    let mut args = Vec::new();
    store.encode(&mut args);
    let res = b.results(ext::PROC_STORE_GUARDED, &args).await;
    assert_eq!(
        ext::decode_store_res(&res).unwrap().unwrap_err(),
        nfsstat3::NFS3ERR_NOT_SYNC
    );
    assert_eq!(b.mem.data(&b.fh), image());
    // The right guard: written, and the answer is the new version.
    store.guard = Some(FileVersion::of(&before));
    let mut args = Vec::new();
    store.encode(&mut args);
    let res = b.results(ext::PROC_STORE_GUARDED, &args).await;
    let after = ext::decode_store_res(&res).unwrap().unwrap();
    assert!(FileVersion::of(&after).describes(&b.attrs().await));
    assert_eq!(&b.mem.data(&b.fh)[8192..8192 + 4096], &chunk[..]);
    let s = b.server.stats();
    assert_eq!((s.store_calls, s.stored_raw_bytes, s.errors), (2, 4096, 1));
}

#[tokio::test]
async fn profiles_are_kept_for_the_files_version_and_answered() {
    let source = FakeSource::new(image(), true);
    let b = bed(Some(source.clone()));
    let attrs = b.attrs().await;
    let p = profile::Profile::of(&attrs, 8192, vec![3, 1, 2]);
    let mut args = Vec::new();
    profile::encode_put(&mut args, &b.fh, &p);
    let res = b.results(ext::PROC_PROFILE_PUT, &args).await;
    let mut r = gvfs_nfs::xdr::XdrReader::new(&res);
    assert_eq!(r.u32().unwrap(), nfsstat3::NFS3_OK as u32);
    // Passed on to the upstream's extension too.
    assert_eq!(source.put.lock().unwrap().len(), 1);
    let mut get = Vec::new();
    gvfs_nfs::xdr::put_opaque(&mut get, &b.fh);
    let res = b.results(ext::PROC_PROFILE_GET, &get).await;
    assert_eq!(profile::decode_get_res(&res).unwrap(), Some(p));
    let s = b.server.stats();
    assert_eq!((s.profiles_stored, s.profiles_served), (1, 1));
    // A profile of another version is refused as stale.
    let mut other = attrs.clone();
    other.size += 1;
    let mut args = Vec::new();
    profile::encode_put(
        &mut args,
        &b.fh,
        &profile::Profile::of(&other, 8192, vec![0]),
    );
    let res = b.results(ext::PROC_PROFILE_PUT, &args).await;
    let mut r = gvfs_nfs::xdr::XdrReader::new(&res);
    assert_eq!(r.u32().unwrap(), nfsstat3::NFS3ERR_STALE as u32);
}

#[tokio::test]
async fn bad_arguments_and_unknown_procedures_are_refused() {
    let b = bed(None);
    // FETCH arguments cut short, a STORE longer than a chunk, garbage
    // profiles: GARBAGE_ARGS.
    let cut = b.fetch_args(0, 4096);
    let mut long = Vec::new();
    gvfs_nfs::xdr::put_opaque(&mut long, &b.fh);
    gvfs_nfs::xdr::put_u64(&mut long, 0);
    gvfs_nfs::xdr::put_u32(&mut long, ext::CHUNK + 1);
    for (proc_, args) in [
        (ext::PROC_FETCH, &cut[..cut.len() - 4]),
        (ext::PROC_FETCH_HAVE, &cut[..]),
        (ext::PROC_STORE, &long[..]),
        (ext::PROC_PROFILE_PUT, &[0xff; 8][..]),
        (ext::PROC_PROFILE_GET, &[][..]),
    ] {
        assert_eq!(
            refused(b.call(ext::VERSION, proc_, args).await),
            Some(ReplyStatus::GarbageArgs),
            "procedure {proc_}"
        );
    }
    // A procedure past the version's last: PROC_UNAVAIL (HELLO and
    // FETCH_CLASS are version 2's).
    assert_eq!(
        refused(b.call(ext::VERSION, ext::PROC_FETCH_CLASS + 1, &[]).await),
        Some(ReplyStatus::ProcUnavail)
    );
    assert_eq!(
        refused(b.call(ext::VERSION_1, ext::PROC_HELLO, &[]).await),
        Some(ReplyStatus::ProcUnavail)
    );
    // NULL answers nothing, in both versions.
    for v in [ext::VERSION_1, ext::VERSION] {
        assert!(matches!(
            b.call(v, ext::PROC_NULL, &[]).await,
            Answer::Results(r) if r.is_empty()
        ));
    }
    assert_eq!(b.server.stats().fetch_calls, 0);
}

/// FETCH_CLASS's arguments for `count` bytes at `offset` of the bed's
/// file, asked as `class` (its number on the wire).
fn class_args(b: &Bed, offset: u64, count: u32, class: u32) -> Vec<u8> {
    let mut out = b.fetch_args(offset, count);
    gvfs_nfs::xdr::put_u32(&mut out, class);
    gvfs_nfs::xdr::put_u32(&mut out, 0);
    out
}

/// A node's profile run reaches a LAN proxy as FETCH_CLASS(Profile): the
/// LAN fetches those pieces upstream, as a profile's, not the chunk they
/// are in (which, with every node of a site asking, sent whole chunks
/// across the WAN before any guest answered).
#[tokio::test]
async fn a_profile_run_is_fetched_upstream_as_its_pieces_not_its_chunk() {
    use gvfs_ext::Class;
    let source = FakeSource::new(image(), true);
    let b = bed(Some(source.clone()));
    let (at, len) = (u64::from(ext::CHUNK) + (16 << 10), 16 << 10);
    let res = b
        .results(
            ext::PROC_FETCH_CLASS,
            &class_args(&b, at, len, Class::Profile.wire()),
        )
        .await;
    let ok = ext::decode_fetch_repeats_res(&res).unwrap().unwrap();
    let want = &image()[at as usize..at as usize + len as usize];
    assert_eq!(ext::decompress(ok).unwrap(), want);
    let fetched = source.fetched.lock().unwrap().clone();
    // The first fetch of those bytes upstream is the run, as a profile's
    // (the file's background stream may fetch the rest of the chunk
    // later, around them).
    let end = at + u64::from(len);
    let first = fetched
        .iter()
        .find(|(o, n, _)| *o < end && o + u64::from(*n) > at);
    assert_eq!(first, Some(&(at, len, Class::Profile)), "{fetched:?}");
    let s = b.server.stats();
    assert_eq!(
        (s.class_calls_profile, s.class_calls_demand, s.demand_calls),
        (1, 0, 0)
    );
    // A class past demand is no class.
    assert_eq!(
        refused(
            b.call(
                ext::VERSION,
                ext::PROC_FETCH_CLASS,
                &class_args(&b, 0, len, 4)
            )
            .await
        ),
        Some(ReplyStatus::GarbageArgs)
    );
    // Version 1 has no FETCH_CLASS.
    assert_eq!(
        refused(
            b.call(
                ext::VERSION_1,
                ext::PROC_FETCH_CLASS,
                &class_args(&b, 0, len, 3)
            )
            .await
        ),
        Some(ReplyStatus::ProcUnavail)
    );
}
