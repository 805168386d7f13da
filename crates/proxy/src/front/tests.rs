//! The front end alone, against a fake layer below it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use gvfs_nfs::nfs3_types::nfs3::*;
use gvfs_nfs::nfs3_types::xdr_codec::Opaque;
use gvfs_nfs::rpc::{self, Credentials, ReplyError, ReplyStatus};
use gvfs_nfs::xdr::{self, XdrReader};
use gvfs_nfs::{
    BoxFuture, CallContext, Class, NfsProc, NfsReply, NfsRequest, NfsService, ServiceError, Tenant,
};
use proptest::prelude::*;

use super::{FrontEnd, Peer};

/// Answers every call with an error status, counts calls, and records the
/// credentials it saw; LOOKUP of "sub" succeeds.
#[derive(Default)]
struct Fake {
    calls: AtomicUsize,
    last_uid: std::sync::Mutex<Option<u32>>,
    last_tenant: std::sync::Mutex<Option<Tenant>>,
}

fn fh(b: &[u8]) -> nfs_fh3 {
    nfs_fh3 {
        data: Opaque::owned(b.to_vec()),
    }
}

impl NfsService for Fake {
    fn call<'a>(
        &'a self,
        cx: &'a CallContext,
        req: NfsRequest,
    ) -> BoxFuture<'a, Result<NfsReply, ServiceError>> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            *self.last_uid.lock().unwrap() = cx.cred.uid();
            *self.last_tenant.lock().unwrap() = Some(cx.tenant);
            Ok(match req {
                NfsRequest::Lookup(a) if a.what.name.0.as_ref() == b"sub" => {
                    NfsReply::Lookup(Nfs3Result::Ok(LOOKUP3resok {
                        object: fh(b"sub-handle"),
                        obj_attributes: Nfs3Option::None,
                        dir_attributes: Nfs3Option::None,
                    }))
                }
                NfsRequest::Lookup(a) if a.what.name.0.as_ref() == b"private" => {
                    NfsReply::error(NfsProc::Lookup, nfsstat3::NFS3ERR_ACCES)
                }
                NfsRequest::Getattr(_) => {
                    return Err(ServiceError::UpstreamUnavailable {
                        upstream: "fake".into(),
                        reason: "down".into(),
                    });
                }
                other => NfsReply::error(other.proc_(), nfsstat3::NFS3ERR_NOENT),
            })
        })
    }

    fn root<'a>(&'a self, _cx: &'a CallContext) -> BoxFuture<'a, Result<nfs_fh3, ServiceError>> {
        Box::pin(async { Ok(fh(b"root-handle")) })
    }

    fn describe(&self) -> String {
        "fake".into()
    }
}

fn front() -> (Arc<Fake>, FrontEnd) {
    let fake = Arc::new(Fake::default());
    (
        fake.clone(),
        FrontEnd::new(fake, "/export".into(), 2049, vec![]),
    )
}

fn call(xid: u32, prog: u32, vers: u32, proc_: u32, cred: &Credentials, args: &[u8]) -> Vec<u8> {
    let mut rec = rpc::call_record(xid, prog, vers, proc_, cred);
    rec.extend_from_slice(args);
    rpc::seal(rec)[4..].to_vec()
}

async fn results(f: &FrontEnd, msg: &[u8]) -> Result<Vec<u8>, ReplyError> {
    let peer = Peer::plain(Some("127.0.0.1:900".parse().unwrap()));
    let reply = f.handle(msg, &peer).await.expect("a reply").into_vec();
    rpc::parse_reply(&reply[4..]).map(<[u8]>::to_vec)
}

fn remove_args() -> Vec<u8> {
    let mut out = Vec::new();
    NfsRequest::Remove(REMOVE3args {
        object: diropargs3 {
            dir: fh(b"d"),
            name: filename3::from(b"victim".to_vec()),
        },
    })
    .encode(&mut out);
    out
}

#[tokio::test]
async fn retransmitted_remove_is_answered_from_the_cache() {
    let (fake, f) = front();
    let msg = call(42, 100_003, 3, 12, &Credentials::unix(1, 1), &remove_args());
    let first = results(&f, &msg).await;
    let second = results(&f, &msg).await;
    assert_eq!(first, second);
    assert_eq!(fake.calls.load(Ordering::SeqCst), 1, "REMOVE ran twice");
    assert_eq!(f.stats().drc_hits, 1);
    // A new xid is a new call.
    let _ = results(
        &f,
        &call(43, 100_003, 3, 12, &Credentials::unix(1, 1), &remove_args()),
    )
    .await;
    assert_eq!(fake.calls.load(Ordering::SeqCst), 2);
    // Another user on the same address whose xid and arguments happen to
    // match (two processes of one client library) is not a retransmission.
    let _ = results(
        &f,
        &call(42, 100_003, 3, 12, &Credentials::unix(2, 2), &remove_args()),
    )
    .await;
    assert_eq!(fake.calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn idempotent_calls_run_every_time_with_the_callers_credentials() {
    let (fake, f) = front();
    let mut args = Vec::new();
    NfsRequest::Access(ACCESS3args {
        object: fh(b"x"),
        access: 1,
    })
    .encode(&mut args);
    let msg = call(7, 100_003, 3, 4, &Credentials::unix(1234, 5), &args);
    let _ = results(&f, &msg).await;
    let _ = results(&f, &msg).await;
    assert_eq!(fake.calls.load(Ordering::SeqCst), 2);
    assert_eq!(*fake.last_uid.lock().unwrap(), Some(1234));
}

#[tokio::test]
async fn a_layer_failure_becomes_an_nfs_error_status() {
    let (_fake, f) = front();
    let mut args = Vec::new();
    NfsRequest::Getattr(GETATTR3args { object: fh(b"x") }).encode(&mut args);
    let r = results(&f, &call(1, 100_003, 3, 1, &Credentials::None, &args))
        .await
        .unwrap();
    let reply = NfsReply::decode(gvfs_nfs::NfsProc::Getattr, &r).unwrap();
    assert_eq!(reply.status(), nfsstat3::NFS3ERR_IO);
}

fn mnt_args(path: &str) -> Vec<u8> {
    let mut a = Vec::new();
    xdr::put_opaque(&mut a, path.as_bytes());
    a
}

async fn mnt(f: &FrontEnd, path: &str) -> (u32, Vec<u8>) {
    let r = results(
        f,
        &call(9, 100_005, 3, 1, &Credentials::unix(0, 0), &mnt_args(path)),
    )
    .await
    .unwrap();
    let mut x = XdrReader::new(&r);
    let status = x.u32().unwrap();
    let handle = if status == 0 {
        x.opaque(64).unwrap().to_vec()
    } else {
        vec![]
    };
    (status, handle)
}

#[tokio::test]
async fn mount_hands_out_the_root_and_subdirectories_of_the_export_only() {
    let (_fake, f) = front();
    assert_eq!(mnt(&f, "/export").await, (0, b"root-handle".to_vec()));
    assert_eq!(mnt(&f, "/export/").await, (0, b"root-handle".to_vec()));
    assert_eq!(mnt(&f, "/export/sub").await, (0, b"sub-handle".to_vec()));
    assert_eq!(mnt(&f, "/export/missing").await.0, 2);
    // A directory the caller may not search: "access denied", not "no
    // such directory".
    assert_eq!(mnt(&f, "/export/private").await.0, 13);
    assert_eq!(mnt(&f, "/exportx").await.0, 2);
    assert_eq!(mnt(&f, "/").await.0, 2);
    // EXPORT lists the one export; DUMP lists who mounted it.
    let r = results(&f, &call(10, 100_005, 3, 5, &Credentials::None, &[]))
        .await
        .unwrap();
    let mut x = XdrReader::new(&r);
    assert_eq!(x.u32().unwrap(), 1);
    assert_eq!(x.opaque(1024).unwrap(), b"/export");
    let r = results(&f, &call(11, 100_005, 3, 2, &Credentials::None, &[]))
        .await
        .unwrap();
    let mut x = XdrReader::new(&r);
    assert_eq!(x.u32().unwrap(), 1);
    assert_eq!(x.opaque(255).unwrap(), b"127.0.0.1");
}

#[tokio::test]
async fn portmap_answers_for_its_own_programs() {
    let (_fake, f) = front();
    for (prog, vers, port) in [
        (100_003, 3, 2049),
        (100_005, 3, 2049),
        (100_000, 2, 2049),
        (100_003, 4, 0),
        (100_021, 4, 0),
    ] {
        let mut a = Vec::new();
        for v in [prog, vers, 6, 0] {
            xdr::put_u32(&mut a, v);
        }
        let r = results(&f, &call(1, 100_000, 2, 3, &Credentials::None, &a))
            .await
            .unwrap();
        assert_eq!(
            XdrReader::new(&r).u32().unwrap(),
            port,
            "GETPORT {prog} v{vers}"
        );
    }
    let r = results(&f, &call(2, 100_000, 2, 4, &Credentials::None, &[]))
        .await
        .unwrap();
    assert_eq!(r.len(), 3 * 20 + 4, "DUMP lists three mappings");
    assert_eq!(
        results(&f, &call(3, 100_000, 2, 3, &Credentials::None, &[1, 2])).await,
        Err(ReplyError::Accepted(ReplyStatus::GarbageArgs))
    );
}

proptest! {
    /// Any bytes as a call, or any bytes after a valid header of any
    /// program and procedure, get a reply or are dropped: never a panic.
    #[test]
    fn arbitrary_messages_never_panic(prog in prop::sample::select(vec![100_000u32, 100_003, 100_005, 7]),
                                      vers in 1u32..5, proc_ in 0u32..24,
                                      args in prop::collection::vec(any::<u8>(), 0..200),
                                      raw in prop::collection::vec(any::<u8>(), 0..200)) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (_fake, f) = front();
        rt.block_on(async {
            let _ = f.handle(&call(1, prog, vers, proc_, &Credentials::unix(0, 0), &args), &Peer::default()).await;
            let _ = f.handle(&raw, &Peer::default()).await;
        });
    }
}

/// Hands out 64-byte handles (the NFSv3 maximum) and checks they come back
/// byte for byte.
struct WideHandles;

impl NfsService for WideHandles {
    fn call<'a>(
        &'a self,
        _cx: &'a CallContext,
        req: NfsRequest,
    ) -> BoxFuture<'a, Result<NfsReply, ServiceError>> {
        Box::pin(async move {
            let status = match &req {
                NfsRequest::Getattr(a) if a.object.data.as_ref() == [0xA5; 64] => {
                    nfsstat3::NFS3ERR_ACCES
                }
                _ => nfsstat3::NFS3ERR_BADHANDLE,
            };
            Ok(NfsReply::error(req.proc_(), status))
        })
    }

    fn root<'a>(&'a self, _cx: &'a CallContext) -> BoxFuture<'a, Result<nfs_fh3, ServiceError>> {
        Box::pin(async { Ok(fh(&[0xA5; 64])) })
    }

    fn describe(&self) -> String {
        "wide".into()
    }
}

#[tokio::test]
async fn handles_of_any_size_up_to_64_bytes_pass_through_unchanged() {
    let f = FrontEnd::new(Arc::new(WideHandles), "/export".into(), 2049, vec![]);
    assert_eq!(mnt(&f, "/export").await, (0, vec![0xA5; 64]));
    let mut args = Vec::new();
    NfsRequest::Getattr(GETATTR3args {
        object: fh(&[0xA5; 64]),
    })
    .encode(&mut args);
    let r = results(&f, &call(1, 100_003, 3, 1, &Credentials::None, &args))
        .await
        .unwrap();
    // ACCES (not BADHANDLE) proves the layer got the very same 64 bytes.
    assert_eq!(
        NfsReply::decode(gvfs_nfs::NfsProc::Getattr, &r)
            .unwrap()
            .status(),
        nfsstat3::NFS3ERR_ACCES
    );
}

/// Claims a 16 MiB transfer size and records the READ count it was asked.
#[derive(Default)]
struct Greedy {
    read_count: std::sync::Mutex<u32>,
}

impl NfsService for Greedy {
    fn call<'a>(
        &'a self,
        _cx: &'a CallContext,
        req: NfsRequest,
    ) -> BoxFuture<'a, Result<NfsReply, ServiceError>> {
        Box::pin(async move {
            Ok(match req {
                NfsRequest::Fsinfo(_) => NfsReply::Fsinfo(Nfs3Result::Ok(FSINFO3resok {
                    obj_attributes: Nfs3Option::None,
                    rtmax: 16 << 20,
                    rtpref: 16 << 20,
                    rtmult: 4096,
                    wtmax: 16 << 20,
                    wtpref: 16 << 20,
                    wtmult: 4096,
                    dtpref: 16 << 20,
                    maxfilesize: u64::MAX,
                    time_delta: nfstime3 {
                        seconds: 0,
                        nseconds: 1,
                    },
                    properties: 0,
                })),
                NfsRequest::Read(a) => {
                    *self.read_count.lock().unwrap() = a.count;
                    NfsReply::error(gvfs_nfs::NfsProc::Read, nfsstat3::NFS3ERR_IO)
                }
                other => NfsReply::error(other.proc_(), nfsstat3::NFS3ERR_NOTSUPP),
            })
        })
    }

    fn root<'a>(&'a self, _cx: &'a CallContext) -> BoxFuture<'a, Result<nfs_fh3, ServiceError>> {
        Box::pin(async { Ok(fh(b"r")) })
    }

    fn describe(&self) -> String {
        "greedy".into()
    }
}

#[tokio::test]
async fn transfer_sizes_are_capped_at_what_the_proxy_carries() {
    let greedy = Arc::new(Greedy::default());
    let f = FrontEnd::new(greedy.clone(), "/export".into(), 2049, vec![]);
    let mut args = Vec::new();
    NfsRequest::Fsinfo(FSINFO3args { fsroot: fh(b"r") }).encode(&mut args);
    let r = results(&f, &call(1, 100_003, 3, 19, &Credentials::None, &args))
        .await
        .unwrap();
    let NfsReply::Fsinfo(Nfs3Result::Ok(ok)) =
        NfsReply::decode(gvfs_nfs::NfsProc::Fsinfo, &r).unwrap()
    else {
        panic!("FSINFO failed")
    };
    assert_eq!(
        (ok.rtmax, ok.wtmax, ok.rtpref, ok.wtpref),
        (1 << 20, 1 << 20, 1 << 20, 1 << 20)
    );
    let mut args = Vec::new();
    NfsRequest::Read(READ3args {
        file: fh(b"f"),
        offset: 0,
        count: 8 << 20,
    })
    .encode(&mut args);
    let _ = results(&f, &call(2, 100_003, 3, 6, &Credentials::None, &args)).await;
    assert_eq!(*greedy.read_count.lock().unwrap(), 1 << 20);
}

#[tokio::test]
async fn mknod_of_a_regular_file_is_badtype_here_and_goes_no_further() {
    let (fake, f) = front();
    // diropargs3, then the union's discriminant NF3REG (1) with no body:
    // valid XDR, but not a type MKNOD makes.
    let mut args = Vec::new();
    NfsRequest::Lookup(LOOKUP3args {
        what: diropargs3 {
            dir: fh(b"d"),
            name: filename3::from(b"n".to_vec()),
        },
    })
    .encode(&mut args);
    args.extend_from_slice(&1u32.to_be_bytes());
    let msg = call(9, 100_003, 3, 11, &Credentials::unix(1, 1), &args);
    let res = results(&f, &msg).await.expect("an NFS reply");
    let mut r = XdrReader::new(&res);
    assert_eq!(r.u32().unwrap(), nfsstat3::NFS3ERR_BADTYPE as u32);
    assert_eq!(fake.calls.load(Ordering::SeqCst), 0);
}

#[test]
fn reply_size_hints_follow_the_counts_calls_ask_for() {
    use super::{NFS_PROGRAM, SMALL_REPLY};
    use gvfs_nfs::proc::MAX_DATA;
    let cred = Credentials::unix(1000, 1000);
    let fake: Arc<dyn NfsService> = Arc::new(Fake::default());
    let ext = crate::ext_server::ExtServer::new(fake.clone(), None, None, None, None);
    let f = FrontEnd::new(fake, "/export".into(), 2049, vec![ext]);
    let reply_size_hint = |msg: &[u8]| f.reply_size_hint(msg);
    let encoded = |req: NfsRequest| {
        let mut args = Vec::new();
        req.encode(&mut args);
        call(1, NFS_PROGRAM, 3, req.proc_() as u32, &cred, &args)
    };
    let read = |count| {
        encoded(NfsRequest::Read(READ3args {
            file: fh(b"some-handle"),
            offset: 7,
            count,
        }))
    };
    assert_eq!(reply_size_hint(&read(4096)), 4096 + SMALL_REPLY);
    // Clamped as the call itself is.
    assert_eq!(
        reply_size_hint(&read(u32::MAX)),
        MAX_DATA as usize + SMALL_REPLY
    );
    let plus = encoded(NfsRequest::Readdirplus(READDIRPLUS3args {
        dir: fh(b"d"),
        cookie: 0,
        cookieverf: cookieverf3::default(),
        dircount: 512,
        maxcount: 32_768,
    }));
    assert_eq!(reply_size_hint(&plus), 32_768 + SMALL_REPLY);
    let getattr = encoded(NfsRequest::Getattr(GETATTR3args { object: fh(b"f") }));
    assert_eq!(reply_size_hint(&getattr), SMALL_REPLY);
    // Garbage, or a READ cut short, costs the small amount.
    assert_eq!(reply_size_hint(b"nonsense"), SMALL_REPLY);
    let cut = read(4096);
    assert_eq!(reply_size_hint(&cut[..cut.len() - 4]), SMALL_REPLY);
    // Every kind of FETCH may answer with a whole chunk; the other
    // extension calls are small.
    use gvfs_ext as ext;
    let chunk = (ext::CHUNK + ext::MAX_FRAME_SLACK) as usize + SMALL_REPLY;
    for p in [
        ext::PROC_FETCH,
        ext::PROC_FETCH_REPEATS,
        ext::PROC_FETCH_DEMAND,
        ext::PROC_FETCH_HAVE,
    ] {
        assert_eq!(
            reply_size_hint(&call(2, ext::PROGRAM, 1, p, &cred, &[])),
            chunk
        );
    }
    let get = call(3, ext::PROGRAM, 1, ext::PROC_PROFILE_GET, &cred, &[]);
    assert_eq!(reply_size_hint(&get), SMALL_REPLY);
}

#[test]
fn each_procedure_has_the_class_its_program_gives() {
    use gvfs_ext as ext;
    let cred = Credentials::unix(1000, 1000);
    let fake: Arc<dyn NfsService> = Arc::new(Fake::default());
    let server = crate::ext_server::ExtServer::new(fake.clone(), None, None, None, None);
    let f = FrontEnd::new(fake, "/export".into(), 2049, vec![server]);
    // Every NFS, MOUNT and PORTMAP procedure: a reader waits for it.
    for p in 0..=21 {
        let msg = call(1, super::NFS_PROGRAM, 3, p, &cred, &[]);
        assert_eq!(f.call_class(&msg), Class::Demand, "NFS procedure {p}");
    }
    for (prog, vers) in [(super::MOUNT_PROGRAM, 3), (100_000, 2), (7, 1)] {
        let msg = call(1, prog, vers, 1, &cred, &[]);
        assert_eq!(f.call_class(&msg), Class::Demand, "program {prog}");
    }
    assert_eq!(f.call_class(b"nonsense"), Class::Demand);
    // The extension program's, in both versions.
    let fetch_then = |word: u32| {
        let mut a = Vec::new();
        xdr::put_opaque(&mut a, b"handle");
        xdr::put_u64(&mut a, 0);
        xdr::put_u32(&mut a, 1 << 20);
        xdr::put_u32(&mut a, word);
        a
    };
    let class = |vers, p, args: &[u8]| f.call_class(&call(2, ext::PROGRAM, vers, p, &cred, args));
    for vers in [ext::VERSION_1, ext::VERSION] {
        for p in [
            ext::PROC_FETCH,
            ext::PROC_FETCH_REPEATS,
            ext::PROC_STORE,
            ext::PROC_STORE_GUARDED,
        ] {
            assert_eq!(class(vers, p, &fetch_then(0)), Class::Background, "{p}");
        }
        for p in [
            ext::PROC_NULL,
            ext::PROC_FETCH_DEMAND,
            ext::PROC_PROFILE_PUT,
            ext::PROC_PROFILE_GET,
        ] {
            assert_eq!(class(vers, p, &fetch_then(0)), Class::Demand, "{p}");
        }
        let have = ext::PROC_FETCH_HAVE;
        assert_eq!(class(vers, have, &fetch_then(1)), Class::Demand);
        assert_eq!(class(vers, have, &fetch_then(0)), Class::Background);
    }
    // FETCH_CLASS carries its class.
    for c in Class::ALL {
        assert_eq!(class(ext::VERSION, 10, &fetch_then(c.wire())), c);
    }
}

#[tokio::test]
async fn the_tenant_is_the_certificate_name_across_connections_else_the_connection() {
    let (fake, f) = front();
    let mut args = Vec::new();
    NfsRequest::Getattr(GETATTR3args { object: fh(b"x") }).encode(&mut args);
    let msg = call(1, 100_003, 3, 1, &Credentials::unix(1, 1), &args);
    let tenant_of = |peer: Peer| {
        let (f, fake, msg) = (&f, &fake, &msg);
        async move {
            f.handle(msg, &peer).await.expect("a reply");
            fake.last_tenant.lock().unwrap().take().expect("no call")
        }
    };
    let addr = |port| Some(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    let named = |name: &str, conn, port| Peer {
        addr: addr(port),
        name: Some(Arc::from(name)),
        map: None,
        conn,
    };
    // One certificate on two connections (from two ports) is one tenant.
    let a1 = tenant_of(named("node1", 1, 900)).await;
    let a2 = tenant_of(named("node1", 2, 901)).await;
    assert_eq!(a1, a2);
    assert_eq!(a1, named("node1", 7, 1).tenant());
    let b = tenant_of(named("node2", 1, 900)).await;
    assert_ne!(a1, b, "two certificates, one tenant");
    // Without a certificate: the connection, whatever the address.
    let plain = |conn, port| Peer {
        conn,
        ..Peer::plain(addr(port))
    };
    let p1 = tenant_of(plain(1, 900)).await;
    let p2 = tenant_of(plain(2, 900)).await;
    assert_eq!((p1, p2), (Tenant(1), Tenant(2)));
    assert!(![p1, p2].contains(&a1) && a1 != Tenant::LOCAL);
}
