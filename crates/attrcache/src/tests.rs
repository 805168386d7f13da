use super::*;
use gvfs_nfs::nfs3_types::nfs3::{
    ACCESS3args, ACCESS3resok, COMMIT3args, FSSTAT3args, FSSTAT3resok, READDIRPLUS3resok,
    dirlistplus3, entryplus3,
};
use gvfs_nfs::nfs3_types::xdr_codec::List;
use gvfs_nfs::rpc::Credentials;

const LOOKUP_OBJ_SIZE: u64 = 1 << 40;
const LOOKUP_DIR_SIZE: u64 = 1 << 41;
const ACCESS_OBJ_SIZE: u64 = 1 << 42;
const LIST_DIR_SIZE: u64 = 1 << 43;
const LIST_A_SIZE: u64 = 1 << 44;
const LIST_B_SIZE: u64 = 1 << 45;

/// Answers GETATTR with the number of calls that reached it as the size,
/// LOOKUP (but of `missing`) and ACCESS with attributes of the sizes
/// above, and every other call with an error; counts what reached it.
#[derive(Default)]
struct Below {
    calls: AtomicU64,
    roots: AtomicU64,
    /// A LOOKUP of "slow" waits for this.
    slow: tokio::sync::Notify,
    /// A READDIRPLUS of "gated" waits for this, then counts here.
    gate: tokio::sync::Notify,
    /// A COMMIT waits for this.
    commit_gate: tokio::sync::Notify,
    listed: AtomicU64,
}

fn fh(b: &[u8]) -> nfs_fh3 {
    nfs_fh3 {
        data: Opaque::owned(b.to_vec()),
    }
}

fn attrs(size: u64) -> fattr3 {
    gvfs_nfs::testing::file_attrs(size, 0)
}

impl NfsService for Below {
    fn call<'a>(
        &'a self,
        _cx: &'a CallContext,
        req: NfsRequest,
    ) -> BoxFuture<'a, Result<NfsReply, ServiceError>> {
        Box::pin(async move {
            let n = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
            if let NfsRequest::Lookup(a) = &req
                && a.what.name.as_ref() == b"slow"
            {
                self.slow.notified().await;
            }
            if let NfsRequest::Commit(a) = &req
                && a.file.data.as_ref() == b"gated"
            {
                self.commit_gate.notified().await;
            }
            Ok(match req {
                NfsRequest::Lookup(a) if a.what.name.as_ref() == b"denied" => {
                    NfsReply::error(NfsProc::Lookup, nfsstat3::NFS3ERR_ACCES)
                }
                NfsRequest::Lookup(a) if a.what.name.as_ref() != b"missing" => {
                    NfsReply::Lookup(Nfs3Result::Ok(LOOKUP3resok {
                        object: fh(a.what.name.as_ref()),
                        obj_attributes: Nfs3Option::Some(attrs(LOOKUP_OBJ_SIZE)),
                        dir_attributes: Nfs3Option::Some(attrs(LOOKUP_DIR_SIZE)),
                    }))
                }
                NfsRequest::Access(a) => NfsReply::Access(Nfs3Result::Ok(ACCESS3resok {
                    obj_attributes: Nfs3Option::Some(attrs(ACCESS_OBJ_SIZE)),
                    access: a.access,
                })),
                NfsRequest::Fsstat(_) => NfsReply::Fsstat(Nfs3Result::Ok(FSSTAT3resok {
                    obj_attributes: Nfs3Option::None,
                    tbytes: 1 << 40,
                    fbytes: n,
                    abytes: n,
                    tfiles: 1 << 20,
                    ffiles: n,
                    afiles: n,
                    invarsec: 0,
                })),
                NfsRequest::Getattr(a) if a.object.data.as_ref() != b"gone" => {
                    NfsReply::Getattr(Nfs3Result::Ok(GETATTR3resok {
                        obj_attributes: attrs(n),
                    }))
                }
                // "whole" and "part" (one reply short of the end) hold
                // "..", "a" and "b" ("bare": b without its handle);
                // "locked" cannot be read.
                NfsRequest::Readdirplus(a)
                    if [&b"whole"[..], b"part", b"gated", b"bare"]
                        .contains(&a.dir.data.as_ref()) =>
                {
                    if a.dir.data.as_ref() == b"gated" {
                        self.gate.notified().await;
                        self.listed.fetch_add(1, Ordering::Relaxed);
                    }
                    let bare = a.dir.data.as_ref() == b"bare";
                    let entry = |name: &[u8], size| entryplus3 {
                        fileid: size,
                        name: filename3::from(name.to_vec()),
                        cookie: size,
                        name_attributes: Nfs3Option::Some(attrs(size)),
                        name_handle: if bare && name == b"b" {
                            Nfs3Option::None
                        } else {
                            Nfs3Option::Some(fh(name))
                        },
                    };
                    NfsReply::Readdirplus(Nfs3Result::Ok(READDIRPLUS3resok {
                        dir_attributes: Nfs3Option::Some(attrs(LIST_DIR_SIZE)),
                        cookieverf: cookieverf3::default(),
                        reply: dirlistplus3 {
                            entries: List(vec![
                                entry(b"..", 1),
                                entry(b"a", LIST_A_SIZE),
                                entry(b"b", LIST_B_SIZE),
                            ]),
                            eof: a.dir.data.as_ref() != b"part",
                        },
                    }))
                }
                other => NfsReply::error(other.proc_(), nfsstat3::NFS3ERR_NOENT),
            })
        })
    }

    fn root<'a>(&'a self, _cx: &'a CallContext) -> BoxFuture<'a, Result<nfs_fh3, ServiceError>> {
        Box::pin(async move {
            self.roots.fetch_add(1, Ordering::Relaxed);
            Ok(fh(b"root"))
        })
    }

    fn describe(&self) -> String {
        "fake".into()
    }
}

async fn size(c: &AttrCache, cx: &CallContext, f: &[u8]) -> Option<u64> {
    match c
        .call(cx, NfsRequest::Getattr(GETATTR3args { object: fh(f) }))
        .await
        .expect("call")
    {
        NfsReply::Getattr(Nfs3Result::Ok(ok)) => Some(ok.obj_attributes.size),
        _ => None,
    }
}

fn setup(ttl: Duration) -> (Arc<Below>, Arc<AttrCache>) {
    let below = Arc::new(Below::default());
    let cache = AttrCache::new(below.clone(), ttl);
    (below, cache)
}

#[tokio::test]
async fn repeated_getattr_is_answered_here_until_the_timeout() {
    let (below, c) = setup(Duration::from_millis(300));
    let cx = CallContext::with_cred(Credentials::unix(1, 1));
    assert_eq!(size(&c, &cx, b"a").await, Some(1));
    assert_eq!(size(&c, &cx, b"a").await, Some(1), "from the cache");
    assert_eq!(size(&c, &cx, b"b").await, Some(2), "another handle");
    assert_eq!(below.calls.load(Ordering::Relaxed), 2);
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(size(&c, &cx, b"a").await, Some(3), "expired: asked again");
    assert_eq!(c.stats().hits, 1);
    assert_eq!(c.stats().misses, 3);
}

#[tokio::test]
async fn errors_are_not_kept_and_callers_do_not_share_entries() {
    let (below, c) = setup(Duration::from_secs(60));
    let cx = CallContext::with_cred(Credentials::unix(1, 1));
    assert_eq!(size(&c, &cx, b"gone").await, None);
    assert_eq!(size(&c, &cx, b"gone").await, None);
    assert_eq!(
        below.calls.load(Ordering::Relaxed),
        2,
        "NOENT is not cached"
    );
    assert_eq!(size(&c, &cx, b"a").await, Some(3));
    let other = CallContext::with_cred(Credentials::unix(2, 2));
    assert_eq!(
        size(&c, &other, b"a").await,
        Some(4),
        "another user asks below"
    );
    assert_eq!(size(&c, &other, b"a").await, Some(4));
}

#[tokio::test]
async fn lookup_and_access_replies_answer_getattr_of_what_they_describe() {
    let (below, c) = setup(Duration::from_secs(60));
    let cx = CallContext::with_cred(Credentials::unix(1, 1));
    let lookup = |name: &[u8]| {
        NfsRequest::Lookup(LOOKUP3args {
            what: diropargs3 {
                dir: fh(b"dir"),
                name: filename3::from(name.to_vec()),
            },
        })
    };
    match c.call(&cx, lookup(b"f")).await.expect("lookup") {
        NfsReply::Lookup(Nfs3Result::Ok(ok)) => assert_eq!(ok.object, fh(b"f")),
        other => panic!("{other:?}"),
    }
    let asked = below.calls.load(Ordering::Relaxed);
    assert_eq!(size(&c, &cx, b"f").await, Some(LOOKUP_OBJ_SIZE));
    assert_eq!(size(&c, &cx, b"dir").await, Some(LOOKUP_DIR_SIZE));
    assert_eq!(
        below.calls.load(Ordering::Relaxed),
        asked,
        "GETATTR of the object and its directory answered from the LOOKUP"
    );
    let other = CallContext::with_cred(Credentials::unix(2, 2));
    assert_ne!(
        size(&c, &other, b"f").await,
        Some(LOOKUP_OBJ_SIZE),
        "another caller asks below"
    );

    let access = NfsRequest::Access(ACCESS3args {
        object: fh(b"g"),
        access: 1,
    });
    c.call(&cx, access).await.expect("access");
    let asked = below.calls.load(Ordering::Relaxed);
    assert_eq!(size(&c, &cx, b"g").await, Some(ACCESS_OBJ_SIZE));
    assert_eq!(below.calls.load(Ordering::Relaxed), asked);

    // A failed LOOKUP leaves nothing behind.
    c.call(&cx, lookup(b"missing")).await.expect("lookup");
    assert_ne!(size(&c, &cx, b"missing").await, Some(LOOKUP_OBJ_SIZE));
}

fn lookup_in(dir: &[u8], name: &[u8]) -> NfsRequest {
    NfsRequest::Lookup(LOOKUP3args {
        what: diropargs3 {
            dir: fh(dir),
            name: filename3::from(name.to_vec()),
        },
    })
}

/// The status and, when found, the object and its size.
async fn look(c: &AttrCache, cx: &CallContext, dir: &[u8], name: &[u8]) -> (nfsstat3, u64) {
    match c.call(cx, lookup_in(dir, name)).await.expect("lookup") {
        NfsReply::Lookup(Nfs3Result::Ok(ok)) => {
            let size = match ok.obj_attributes {
                Nfs3Option::Some(a) => a.size,
                Nfs3Option::None => 0,
            };
            assert_eq!(ok.object, fh(name));
            (nfsstat3::NFS3_OK, size)
        }
        NfsReply::Lookup(Nfs3Result::Err((st, _))) => (st, 0),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_listing_with_a_name_but_no_handle_does_not_say_names_are_absent() {
    let (below, c) = setup(Duration::from_secs(60));
    let cx = CallContext::with_cred(Credentials::unix(1, 1));
    look(&c, &cx, b"bare", b"a").await;
    let before = below.calls.load(Ordering::Relaxed);
    // "b" was listed without a handle: asked below, found.
    assert_eq!(look(&c, &cx, b"bare", b"b").await.0, nfsstat3::NFS3_OK);
    assert_eq!(below.calls.load(Ordering::Relaxed), before + 1);
}

#[tokio::test]
async fn a_reply_fetched_while_a_change_was_on_its_way_is_not_kept() {
    let (below, c) = setup(Duration::from_secs(60));
    let cx = CallContext::with_cred(Credentials::unix(1, 1));
    let commit = {
        let (c, cx) = (c.clone(), cx.clone());
        tokio::spawn(async move {
            let req = NfsRequest::Commit(COMMIT3args {
                file: fh(b"gated"),
                offset: 0,
                count: 0,
            });
            c.call(&cx, req).await.expect("commit");
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    // Asked while the change is upstream: may describe the file before.
    let during = size(&c, &cx, b"f").await;
    below.commit_gate.notify_one();
    commit.await.unwrap();
    let after = size(&c, &cx, b"f").await;
    assert_ne!(after, during, "the reply from during the change was kept");
}

#[tokio::test]
async fn a_first_lookup_reads_the_directory_for_the_names_after_it() {
    let (below, c) = setup(Duration::from_secs(60));
    let cx = CallContext::with_cred(Credentials::unix(1, 1));
    let calls = || below.calls.load(Ordering::Relaxed);
    // The first LOOKUP goes below with a READDIRPLUS of its directory.
    assert_eq!(
        look(&c, &cx, b"whole", b"a").await,
        (nfsstat3::NFS3_OK, LOOKUP_OBJ_SIZE)
    );
    assert_eq!(calls(), 2);
    assert_eq!(c.stats().listings, 1);
    // The other names, their attributes and names not there: here.
    assert_eq!(
        look(&c, &cx, b"whole", b"b").await,
        (nfsstat3::NFS3_OK, LIST_B_SIZE)
    );
    assert_eq!(size(&c, &cx, b"b").await, Some(LIST_B_SIZE));
    assert_eq!(
        look(&c, &cx, b"whole", b"c").await.0,
        nfsstat3::NFS3ERR_NOENT
    );
    assert_eq!(calls(), 2, "answered from the listing");
    // ".." is looked up for real.
    look(&c, &cx, b"whole", b"..").await;
    assert_eq!(calls(), 3);
    // Another caller reads it for itself.
    let other = CallContext::with_cred(Credentials::unix(2, 2));
    look(&c, &other, b"whole", b"b").await;
    assert_eq!(calls(), 5);

    // A listing short of the end: names not in it are asked below,
    // and the directory is not read again within the timeout.
    look(&c, &cx, b"part", b"a").await;
    assert_eq!(calls(), 7);
    look(&c, &cx, b"part", b"b").await;
    assert_eq!(calls(), 7);
    assert_eq!(look(&c, &cx, b"part", b"c").await.0, nfsstat3::NFS3_OK);
    assert_eq!(calls(), 8);

    // A LOOKUP that fails otherwise (here: the name "missing" in a
    // directory that cannot be read) keeps nothing.
    look(&c, &cx, b"locked", b"missing").await;
    look(&c, &cx, b"locked", b"b").await;
    assert_eq!(calls(), 11, "one READDIRPLUS, two LOOKUPs");

    // Nor does a LOOKUP refused (the caller may read the directory
    // but not search it).
    let third = CallContext::with_cred(Credentials::unix(3, 3));
    assert_eq!(
        look(&c, &third, b"whole", b"denied").await.0,
        nfsstat3::NFS3ERR_ACCES
    );
    // (Its READDIRPLUS is called off, so it may not reach below.)
    tokio::time::sleep(Duration::from_millis(20)).await;
    let before = calls();
    look(&c, &third, b"whole", b"b").await;
    assert_eq!(calls(), before + 1, "b asked below");

    // A changing call forgets listings with everything else.
    let commit = NfsRequest::Commit(COMMIT3args {
        file: fh(b"a"),
        offset: 0,
        count: 0,
    });
    c.call(&cx, commit).await.expect("commit");
    let before = calls();
    assert_eq!(
        look(&c, &cx, b"whole", b"c").await.0,
        nfsstat3::NFS3_OK,
        "asked below again"
    );
    assert_eq!(calls(), before + 2);
}

#[tokio::test]
async fn a_slow_listing_does_not_hold_up_its_lookup_and_is_kept_when_it_comes() {
    let (below, c) = setup(Duration::from_secs(60));
    let cx = CallContext::with_cred(Credentials::unix(1, 1));
    let calls = || below.calls.load(Ordering::Relaxed);
    // The READDIRPLUS hangs; the LOOKUP is answered all the same (the
    // bound only turns a hang into a failure).
    let found = tokio::time::timeout(Duration::from_secs(10), look(&c, &cx, b"gated", b"a"))
        .await
        .expect("the LOOKUP waited for its directory's listing");
    assert_eq!(found.0, nfsstat3::NFS3_OK);
    look(&c, &cx, b"gated", b"b").await;
    assert_eq!(calls(), 3, "b asked below while the listing is out");
    // When it comes, it is kept.
    below.gate.notify_one();
    while below.listed.load(Ordering::Relaxed) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for _ in 0..500 {
        if look(&c, &cx, b"gated", b"zzz").await.0 == nfsstat3::NFS3ERR_NOENT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let before = calls();
    assert_eq!(
        look(&c, &cx, b"gated", b"zzz").await.0,
        nfsstat3::NFS3ERR_NOENT
    );
    assert_eq!(calls(), before, "answered from the listing");
}

#[tokio::test]
async fn a_listing_that_comes_back_after_the_cache_was_emptied_for_room_is_not_kept() {
    let (below, c) = setup(Duration::from_secs(60));
    let cx = CallContext::with_cred(Credentials::unix(1, 1));
    let calls = || below.calls.load(Ordering::Relaxed);
    look(&c, &cx, b"gated", b"a").await;
    // The cache fills up and is emptied while the listing is out.
    for i in 0..MAX_ENTRIES as u32 {
        size(&c, &cx, &i.to_be_bytes()).await;
    }
    below.gate.notify_one();
    while below.listed.load(Ordering::Relaxed) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = calls();
    look(&c, &cx, b"gated", b"b").await;
    assert!(calls() > before, "b answered from a listing from before");
}

#[tokio::test]
async fn a_reply_on_its_way_while_the_cache_empties_is_not_kept() {
    let (below, c) = setup(Duration::from_secs(60));
    let cx = CallContext::with_cred(Credentials::unix(1, 1));
    let calls = || below.calls.load(Ordering::Relaxed);
    let asked = {
        let (c, cx) = (c.clone(), cx.clone());
        tokio::spawn(async move { look(&c, &cx, b"d", b"slow").await })
    };
    while calls() < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // A write through the proxy while that LOOKUP (and the directory's
    // READDIRPLUS) are below.
    let commit = NfsRequest::Commit(COMMIT3args {
        file: fh(b"slow"),
        offset: 0,
        count: 0,
    });
    c.call(&cx, commit).await.expect("commit");
    below.slow.notify_one();
    assert_eq!(asked.await.expect("task").0, nfsstat3::NFS3_OK);
    let before = calls();
    below.slow.notify_one();
    look(&c, &cx, b"d", b"slow").await;
    assert_eq!(
        calls(),
        before + 2,
        "the reply from before the write was kept"
    );
}

#[tokio::test]
async fn a_changing_call_empties_it_and_null_and_root_stay_local() {
    let (below, c) = setup(Duration::from_secs(60));
    let cx = CallContext::with_cred(Credentials::unix(1, 1));
    assert_eq!(size(&c, &cx, b"a").await, Some(1));
    let commit = NfsRequest::Commit(COMMIT3args {
        file: fh(b"a"),
        offset: 0,
        count: 0,
    });
    c.call(&cx, commit).await.expect("commit");
    assert_eq!(
        size(&c, &cx, b"a").await,
        Some(3),
        "asked again after COMMIT"
    );
    assert_eq!(c.stats().invalidations, 1);

    let before = below.calls.load(Ordering::Relaxed);
    let null = NfsRequest::decode(0, &[]).expect("NULL");
    assert!(matches!(c.call(&cx, null).await, Ok(NfsReply::Null(_))));
    assert_eq!(
        below.calls.load(Ordering::Relaxed),
        before,
        "NULL stays here"
    );
    for _ in 0..3 {
        assert_eq!(c.root(&cx).await.expect("root"), fh(b"root"));
    }
    assert_eq!(below.roots.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn fsstat_is_answered_here_until_something_changes() {
    // A VM monitor asks for the file system's sizes whenever it opens its
    // memory file (to tell huge pages apart): a round trip across a WAN.
    let (below, c) = setup(Duration::from_secs(60));
    let cx = CallContext::with_cred(Credentials::unix(1, 1));
    let free = |c: Arc<AttrCache>, cx: CallContext| async move {
        let req = NfsRequest::Fsstat(FSSTAT3args { fsroot: fh(b"a") });
        match c.call(&cx, req).await.expect("call") {
            NfsReply::Fsstat(Nfs3Result::Ok(ok)) => ok.fbytes,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(free(c.clone(), cx.clone()).await, 1);
    assert_eq!(free(c.clone(), cx.clone()).await, 1, "from the cache");
    assert_eq!(below.calls.load(Ordering::Relaxed), 1);
    let commit = NfsRequest::Commit(COMMIT3args {
        file: fh(b"a"),
        offset: 0,
        count: 0,
    });
    c.call(&cx, commit).await.expect("commit");
    assert_eq!(free(c.clone(), cx).await, 3, "asked again after COMMIT");
}
